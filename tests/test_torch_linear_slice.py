"""A linear whose input is whole on a mesh axis but whose output the layout splits there slices
its input (or its weight, for a split of the output features) first -- a local slice, no
collective -- and computes 1/n of the output, instead of the whole output sliced afterwards
(``LayoutRunner._slice_first``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from aoizora.extract.frontends.torch.capture import capture  # noqa: E402
from aoizora.extract.frontends.torch.comm_evidence import CollectiveLog, IssuedCompute  # noqa: E402
from aoizora.formulation.layout import Layout  # noqa: E402
from aoizora.runtime.torch_evidence import fake_mesh, fake_world, meta_inputs  # noqa: E402
from aoizora.runtime.torch_layout import LayoutRunner  # noqa: E402

B, S, D, F, N = 2, 64, 32, 96, 4


def _program():
    with torch.device("meta"):
        model = torch.nn.Linear(D, F, bias=False).to(torch.bfloat16)
        x = torch.randn(B, S, D, dtype=torch.bfloat16)
    return capture(model, (x,))


def _run(out_spec):
    ep = _program()
    dot = next(n.name for n in ep.graph.nodes if n.op == "call_function"
               and "linear" in str(n.target))
    layout = Layout({"x": N}, [None, None], node_specs={dot: out_spec})
    trace: list = []
    with fake_world(N):
        runner = LayoutRunner(ep, layout, fake_mesh({"x": N}), device="meta", trace=trace)
        with CollectiveLog(trace):
            out = runner.run(*meta_inputs(ep))
    dots = [t for t in trace if isinstance(t, IssuedCompute) and t.kind == "dot"]
    comms = [t for t in trace if not isinstance(t, IssuedCompute)]
    return out[0], dots, comms


@pytest.mark.parametrize("spec,local", [((None, "x", None), (B, S // N, F)),
                                        ((None, None, "x"), (B, S, F // N))])
def test_whole_input_split_output_computes_one_nth_with_no_collective(spec, local):
    out, dots, comms = _run(spec)
    assert tuple(out._local_tensor.shape) == local and tuple(out.shape) == (B, S, F)
    assert len(dots) == 1 and dots[0].flops == 2.0 * B * S * F * D / N
    assert comms == []


def test_whole_output_is_computed_whole():
    out, dots, comms = _run((None, None, None))
    assert tuple(out._local_tensor.shape) == (B, S, F) and dots[0].flops == 2.0 * B * S * F * D
    assert comms == []
