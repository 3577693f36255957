"""xDiT's (xfuser's) parallel configurations and diffusers' ``ContextParallelConfig``, as
layouts of a captured torch program that AoiZora's evidence, placement and Q2 can price.

A configuration is a product of degrees (``XDiTConfig``): CFG parallel (the conditional and
unconditional halves of the batch), PipeFusion (patch-pipelined layer stages), ring and Ulysses
sequence parallel (USP) and tensor parallel. xDiT's rank order is
``RankGenerator(tp, sp, pp, cfg, dp, "tp-sp-pp-cfg-dp")``: tp varies fastest (adjacent ranks),
then sp, pp, cfg, dp; inside sp, yunchang's ``set_seq_parallel_pg(..., use_ulysses_low=True)``
puts the Ulysses groups on consecutive ranks and strides the ring groups. So xDiT's ranks are
the row-major flattening of the mesh (dp, cfg, pp, ring, ulysses, tp) (axes of size 1 left
out), and with ``CUDA_VISIBLE_DEVICES`` unset rank r runs on GPU r: xDiT's device order is the
identity over that mesh (``XDiTConfig.mesh_axes``; ``default_order``).

``xdit_layout(ir, config)`` lays the program out as xDiT runs it (``pipefusion`` 1):
- activations: the batch on ``cfg``; the video token sequence on (ring, ulysses), ring major
  (the sequence chunk of sp rank u + U r); the text stream replicated over sp;
- joint-attention models (HunyuanVideo, CogVideoX: the text tokens concatenated to the video
  tokens before attention, ``joint_parts`` = (T text, V video tokens) from the ``concat`` ops
  whose result is the joint sequence J = T + V): xDiT splits the video-only tensors (a dim of
  length V) over (ring, ulysses) too, wherever they are, and the text-only ones (length T)
  inside the blocks of the joint attentions when the SP degree divides T (xDiT keeps the text
  whole otherwise); the joint tensors (length J) as before. DTensor holds a joint tensor as
  even chunks of the concatenation, where xDiT's rank holds its text chunk and its video chunk:
  the concat and the split back are resharded by DTensor (priced in the evidence);
- attention: heads on (ulysses, tp) -- the all-to-all from sequence to heads is Ulysses --,
  the query sequence on ring with keys and values gathered over the ring (xDiT passes them in
  a ring; the torch runtime gathers them: the same bytes per device, without the ring's overlap
  with compute, noted in ``Layout.name``);
- tensor parallel (Megatron style, as xDiT's TP): q, k, v and the FFN's first projection split by
  columns (output features), the attention output and the FFN's second projection by rows,
  their partial sums reduced over tp.

``diffusers_cp_layout`` is diffusers' ``ContextParallelConfig(ring_degree, ulysses_degree)``:
its mesh is (ring, ulysses) with Ulysses fastest, the same layout as xDiT's USP without CFG or
TP. PipeFusion cannot be a layout of one program (each stage runs a slice of the layers);
``aoizora.torch_compare`` prices it from its stage's evidence.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from aoizora.formulation.layout import AttentionLayout, Layout

AXES = ("dp", "cfg", "pp", "ring", "ulysses", "tp")   # major -> minor (xDiT's rank order)
COLWISE = ("to_q", "to_k", "to_v", "ffn.net.0.proj")  # diffusers' attention / FeedForward names
ROWWISE = ("to_out.0", "ffn.net.2")


@dataclasses.dataclass(frozen=True)
class XDiTConfig:
    """Degrees of one xDiT configuration; their product is the device count."""

    cfg: int = 1
    pipefusion: int = 1
    ring: int = 1
    ulysses: int = 1
    tp: int = 1
    dp: int = 1

    @property
    def devices(self) -> int:
        return self.cfg * self.pipefusion * self.ring * self.ulysses * self.tp * self.dp

    @property
    def name(self) -> str:
        parts = [f"{k}{getattr(self, k)}" for k in ("cfg", "pipefusion", "ulysses", "ring", "tp",
                                                     "dp") if getattr(self, k) > 1]
        return "xdit:" + ("x".join(parts) or "single")

    @property
    def mesh_axes(self) -> dict[str, int]:
        """The mesh in xDiT's rank order (module docstring); one axis of 1 when all are 1."""
        sizes = {"dp": self.dp, "cfg": self.cfg, "pp": self.pipefusion, "ring": self.ring,
                 "ulysses": self.ulysses, "tp": self.tp}
        return {a: sizes[a] for a in AXES if sizes[a] > 1} or {"tp": 1}

    def flags(self) -> list[str]:
        """xfuser's command-line flags for this configuration."""
        out = [f"--ulysses_degree {self.ulysses}", f"--ring_degree {self.ring}",
               f"--pipefusion_parallel_degree {self.pipefusion}",
               f"--tensor_parallel_degree {self.tp}", f"--data_parallel_degree {self.dp}"]
        return out + (["--use_cfg_parallel"] if self.cfg == 2 else [])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def xdit_configs(devices: int, *, heads: int, seq: int, batch: int, layers: int,
                 pipefusion: bool = True) -> list[XDiTConfig]:
    """Every valid xDiT configuration on ``devices`` GPUs, in a fixed order: cfg 2 only with
    batch a multiple of 2 (the CFG pair), ulysses x tp dividing the heads, ring x ulysses the
    sequence, pipefusion the layers (and only when ``pipefusion``); dp 1 (one video)."""
    out = []
    for cfg in (1, 2):
        for pp in _divisors(devices):
            for ring in _divisors(devices):
                for uly in _divisors(devices):
                    for tp in _divisors(devices):
                        c = XDiTConfig(cfg, pp, ring, uly, tp)
                        if c.devices != devices or batch % cfg or heads % (uly * tp):
                            continue
                        if seq % (ring * uly) or layers % pp or (pp > 1 and not pipefusion):
                            continue
                        out.append(c)
    return out


def _role(path: str) -> str:
    """"col" / "row" for a diffusers linear's module path (its TP split), else ""."""
    if any(path.endswith(p) for p in COLWISE):
        return "col"
    return "row" if any(path.endswith(p) for p in ROWWISE) else ""


def _axes(*names: str, sizes: dict[str, int]) -> Any:
    got = tuple(n for n in names if sizes.get(n, 1) > 1)
    return None if not got else (got[0] if len(got) == 1 else got)


def video_seq(ir) -> int:
    """The video token count: the longest query sequence of a self-attention (keys as long)."""
    best = 0
    for n in ir.by_kind("attention"):
        b, h, s, t, d = n.params["shape"]
        if s == t:
            best = max(best, s)
    return best


def self_attention_layers(ir) -> int:
    """The layers PipeFusion splits into stages: the attentions over the video tokens (a Wan
    block has one beside its cross-attention; a CogVideoX or HunyuanVideo block one joint
    attention; HunyuanVideo's text refiner none)."""
    seq = video_seq(ir)
    return max(1, sum(1 for n in ir.by_kind("attention") if n.params["shape"][2] == seq))


def joint_parts(ir) -> tuple[int, int] | None:
    """(T, V): the text and video token counts of a joint-attention model -- the two parts of a
    ``concat`` whose result has the joint sequence ``video_seq(ir)`` along its axis (the smaller
    is the text) --, or None (no such concat: e.g. Wan's text is cross-attended, not joined)."""
    joint = video_seq(ir)
    for n in ir.by_kind("concat"):
        ops = [ir.tensors[o].shape for o in n.operands]
        ax = n.params.get("axis")
        if len(ops) != 2 or ax is None or not n.results:
            continue
        out = ir.tensors[n.results[0]].shape
        if len(out) > ax and out[ax] == joint and all(len(o) > ax for o in ops):
            a, b = sorted(o[ax] for o in ops)
            if a > 0 and a + b == joint:
                return a, b
    return None


def _joint_blocks(ir) -> tuple[str, ...]:
    """The module paths of the blocks that hold a joint attention (its module's parent)."""
    joint = video_seq(ir)
    return tuple(sorted({n.name_stack.rpartition(".")[0] for n in ir.by_kind("attention")
                         if n.params["shape"][2] == joint and n.name_stack}))


def _split_lengths(ir, sp: int) -> tuple[set[int], set[int]]:
    """(lengths split everywhere, lengths split only inside joint blocks) over SP degree sp
    (module docstring)."""
    joint = video_seq(ir)
    parts = joint_parts(ir)
    if parts is None or sp == 1:
        return {joint}, set()
    text, video = parts
    return {joint} | ({video} if video % sp == 0 else set()), \
        ({text} if text % sp == 0 else set())


def _activation_spec(shape, batch: int, seq: "int | set[int]", sizes, last=None) -> tuple:
    seqs = {seq} if isinstance(seq, int) else set(seq)
    spec = [None] * len(shape)
    if shape and shape[0] == batch:
        spec[0] = _axes("cfg", sizes=sizes)
    for d in range(1, len(shape) - 1):
        if shape[d] in seqs:
            spec[d] = _axes("ring", "ulysses", sizes=sizes)
            break
    if last is not None and len(shape) > 1:
        spec[-1] = last
    return tuple(spec)


def xdit_layout(ir, config: XDiTConfig, *, batch: int | None = None, name: str = "") -> Layout:
    """The layout of ``config`` on a captured program's IR (module docstring).

    Raises:
        ValueError: ``config.pipefusion`` > 1 (not a layout: see the module docstring)."""
    if config.pipefusion > 1:
        raise ValueError("PipeFusion is not a layout of one program; price it with "
                         "aoizora.torch_compare.pipefusion_row")
    sizes = config.mesh_axes
    everywhere, in_joint = _split_lengths(ir, config.ring * config.ulysses)
    blocks = _joint_blocks(ir) if in_joint else ()
    user = [t for t in ir.inputs if ir.tensors[t].path.startswith("inputs/")]
    batch = batch or (ir.tensors[user[0]].shape[0] if user else 1)
    tp = _axes("tp", sizes=sizes)
    in_specs = []
    for tid in ir.inputs:
        t = ir.tensors[tid]
        mod, _, leaf = t.path.rpartition(".")
        role = _role(mod)
        if role == "col" and leaf in ("weight", "bias"):
            in_specs.append((tp,) + (None,) * (len(t.shape) - 1))
        elif role == "row" and leaf == "weight":
            in_specs.append((None, tp))
        elif tid in user and t.shape and t.shape[0] == batch:
            in_specs.append((_axes("cfg", sizes=sizes),) + (None,) * (len(t.shape) - 1))
        else:
            in_specs.append(tuple(None for _ in t.shape))
    node_specs, attention = {}, {}
    for n in ir.nodes:
        out = ir.tensors[n.results[0]].shape if n.results else []
        if n.kind == "dot":
            last = tp if _role(n.name_stack) == "col" else None
            inside = any(n.name_stack == b or n.name_stack.startswith(b + ".") for b in blocks)
            seqs = everywhere | (in_joint if inside else set())
            node_specs[n.key] = _activation_spec(out, batch, seqs, sizes, last)
        elif n.kind == "attention":
            al = AttentionLayout(batch=tuple(a for a in ("cfg",) if sizes.get(a, 1) > 1),
                                 heads=tuple(a for a in ("ulysses", "tp") if sizes.get(a, 1) > 1),
                                 seq=tuple(a for a in ("ring",) if sizes.get(a, 1) > 1))
            attention[n.key] = al
            node_specs[n.key] = (_axes(*al.batch, sizes=sizes), _axes(*al.heads, sizes=sizes),
                                 _axes(*al.seq, sizes=sizes), None)
    ring = " (ring priced as gathered keys)" if config.ring > 1 else ""
    return Layout(mesh_axes=dict(sizes), in_specs=in_specs, node_specs=node_specs,
                  attention=attention, name=(name or config.name) + ring)


def diffusers_cp_layout(ir, ring_degree: int, ulysses_degree: int) -> Layout:
    """diffusers' ``ContextParallelConfig(ring_degree=, ulysses_degree=)`` (module docstring)."""
    cfg = XDiTConfig(ring=ring_degree, ulysses=ulysses_degree)
    return xdit_layout(ir, cfg, name=f"diffusers:cp ring{ring_degree}xulysses{ulysses_degree}")


def default_order(config: XDiTConfig) -> list[int]:
    """xDiT's device order: rank r on GPU r, over ``config.mesh_axes`` (module docstring)."""
    return list(range(math.prod(config.mesh_axes.values())))
