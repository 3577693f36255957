"""The per-device memory of a torch layout (``LayoutRunner.peak_live_bytes``) against a count
by hand on a small SwiGLU transformer: local shards only, a view adds nothing, a buffer lives
until its last reader (``getitem`` and the capture's checks included), so the peak is one
block's working set whatever the depth, and a layout splitting the tokens n ways needs 1/n."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aoizora.extract.frontends.torch.capture import capture  # noqa: E402
from aoizora.formulation.layout import Layout  # noqa: E402
from aoizora.runtime.torch_evidence import fake_mesh, fake_world, meta_inputs  # noqa: E402
from aoizora.runtime.torch_layout import LayoutRunner  # noqa: E402

B, S, D, F = 2, 64, 32, 96          # batch, tokens, width, SwiGLU hidden
BF16 = 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(D, 2 * F, bias=False)
        self.down = torch.nn.Linear(F, D, bias=False)

    def forward(self, x):
        a, g = self.up(x).chunk(2, dim=-1)          # split + getitem: views of one [.., 2F]
        return x + self.down(a * torch.nn.functional.silu(g.float()).to(x.dtype))


class Net(torch.nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def _peak(depth: int, n: int) -> tuple[int, int]:
    with torch.device("meta"):
        model = Net(depth).to(torch.bfloat16)
        x = torch.randn(B, S, D, dtype=torch.bfloat16)
    ep = capture(model, (x,))
    nparams = len(ep.graph_signature.input_specs) - 1
    layout = Layout({"x": n}, [None] * nparams + [(None, "x", None)])
    with fake_world(n):
        runner = LayoutRunner(ep, layout, fake_mesh({"x": n}), device="meta")
        runner.run(*meta_inputs(ep))
    return runner.peak_live_bytes, runner.argument_bytes


def by_hand(n: int) -> int:
    """A block after the first (its input x is an activation), in bytes per token of the local
    shard. Live at silu: x [D] and up's output [2F] in bfloat16 (a and g are views of it, one
    buffer), g's float32 copy [F] and silu's float32 output [F]: 2(D + 2F) + 4F + 4F. The cast
    back (2(D + 2F) + 4F + 2F: the float32 copy of g died after silu) and a * s
    (2(D + 2F + F + F)) need less. Weights are arguments, not counted here."""
    tokens = B * S // n
    return tokens * max(BF16 * (D + 2 * F) + 4 * F + 4 * F,
                        BF16 * (D + 2 * F) + 4 * F + BF16 * F,
                        BF16 * (D + 2 * F + F + F))


def test_peak_is_one_block_by_hand_whatever_the_depth():
    for depth in (2, 6):
        peak, args = _peak(depth, 1)
        assert peak == pytest.approx(by_hand(1), rel=0.02), (depth, peak, by_hand(1))
        assert args == depth * BF16 * 3 * D * F + B * S * D * BF16


def test_a_layout_splitting_tokens_n_ways_needs_1_over_n():
    replicated, _ = _peak(4, 1)
    split, _ = _peak(4, 4)
    assert split == pytest.approx(by_hand(4), rel=0.02)
    assert split < replicated and split == pytest.approx(replicated / 4, rel=0.02)
