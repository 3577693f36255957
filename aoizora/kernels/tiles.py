"""Splash attention tiles and libtpu options for a layout: what practitioners tune by hand.

``choose_tiles(layout, ir, target)`` gives every attention node of ``ir`` the splash tiles
(block_q, block_kv, block_kv_compute) the kernel model prices fastest at the node's per-shard
shapes under ``layout``:

    per shard (n_b, n_h, n_s = sizes of the layout's batch, heads, seq axes; ring: r = n_s,
    gather: r = 1):
        lead = B / n_b * H / n_h
        Lq(bq)  = roundup(S, n_s * bq) / n_s          (the wrapper pads S to n_s * bq)
        Lkv(bkv) = roundup(T, r * bkv) / r
    cost(bq, bkv, bkvc) = r * splash_seconds(lead, Lq(bq), Lkv(bkv), D; bq, bkv, bkvc)
                          + pad_s(bq, bkv)
    (r kernel calls per ring; ``formulation.kernel_model``), where a tile that makes the wrapper
    pad a tensor the program did not pad pays its copy (XLA materializes the padded array):
        pad_s = 2 e lead D (Lq [S % (n_s bq) != 0] + 2 Lkv [T % (r bkv) != 0]) / hbm_Bps
    (read and written once; [.] is 1 when true), over the candidates

        bq   in {128 * 2^i <= Lq} u {roundup(ceil(S / n_s) / m, 8) : m = 1..8}
        bkv  in {128 * 2^i <= Lkv} u {roundup(ceil(T / r) / m, 128) : m = 1..16}
        bkvc in {multiples of 128 dividing bkv, at most 2048}

    that fit: scoped VMEM (``kernel_model.splash_vmem_bytes``) within the chip's scoped limit
    times ``vmem_fraction``, and the mask metadata within SMEM
    (``kernels.attention_kernels.splash_metadata_bytes``). Ties go to less VMEM, then to smaller
    tiles (deterministic).

Attention backward nodes (a training step's) get their kernels' blocks from the same kernel
model the same way (``aoizora.kernels.backward_tiles``: dk/dv and dq blocks, or one fused kernel).

The compiler decides feasibility: with ``check`` (a callable that compiles a layout and raises
``extract.aot_compile.CompileError``), a compile that overflows VMEM or SMEM makes the choice
again with ``vmem_fraction`` x 0.75 (at most ``retries`` times); if none compiles, the layout
comes back without tiles (the automatic choice). Other compile errors propagate.

The planner uses the kernel model's tiles twice: a seed's refinement carries them instead of the
seed's (``kernel_tiled``, ``aoizora.planning.seeds``), and its best candidate is tiled again before the
verifying compile (``aoizora.planning.plan_assembly._tile``); either is kept when its compile fits and Q2
prices it lower.

``choose_compiler_options(layout, price)`` prices the layout under libtpu's defaults and under
the options of a practitioner's recipe (``RECIPE_OPTIONS``, maxdiffusion's Wan 2.1 recipe) with
``price`` (Q2 of a compile with ``layout.compiler_options``) and keeps the cheaper.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from aoizora.kernels.backward_tiles import node_backward_tiles
from aoizora.extract.aot_compile import CompileError
from aoizora.extract.targets import Target
from aoizora.formulation.attention_tiles import (MAX_BKV_COMPUTE, AttentionShape, TileChoice,
                                                 best_tiles)
from aoizora.formulation.kernel_model import KernelChip, kernel_chip
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.kernels.recipes import MAXDIFFUSION_OPTIONS

# maxdiffusion's Wan 2.1 generation recipe (``kernels.recipes``)
RECIPE_OPTIONS: dict[str, bool] = dict(MAXDIFFUSION_OPTIONS)


def attention_shapes(ir, kind: str = "attention") -> dict[str, AttentionShape]:
    """Attention node key -> its global shapes, from a ``extract.program_ir.ProgramIR``;
    ``kind`` "attention_bwd": the attention backward nodes' (q, k their first operands)."""
    out = {}
    for n in ir.by_kind(kind):
        q, k = (ir.tensors[t] for t in n.operands[:2])
        e = max(q.bytes // max(math.prod(q.shape), 1), 1)
        if "shape" in n.params:   # found in the program: its canonical [B, H, S, T, D]
            b, h, sq, skv, d = (int(v) for v in n.params["shape"])
            out[n.key] = AttentionShape(b, h, sq, skv, d, e)
            continue
        out[n.key] = AttentionShape(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], e)
    return out


def _size(mesh_axes: dict[str, int], axes: tuple[str, ...]) -> int:
    return math.prod(mesh_axes[a] for a in axes)


def node_tiles(shape: AttentionShape, al: AttentionLayout, mesh_axes: dict[str, int],
               chip: KernelChip, vmem_fraction: float = 1.0,
               residuals: bool = False) -> TileChoice | None:
    """The fastest feasible tiles of one node under ``al`` (module docstring); None if none.
    The chooser is ``formulation.attention_tiles.best_tiles``, the one Q1 prices with;
    ``residuals``: the node's forward keeps its log-sum-exp for a backward."""
    n_b, n_h, n_s = (_size(mesh_axes, a) for a in (al.batch, al.heads, al.seq))
    return best_tiles(shape, n_b, n_h, n_s, al.kv == "ring", chip, vmem_fraction, residuals)


def tiled_layout(layout: Layout, shapes: dict[str, AttentionShape], target: Target,
                 vmem_fraction: float = 1.0, backward: dict[str, AttentionShape] | None = None
                 ) -> tuple[Layout, dict[str, Any]]:
    """``layout`` with every node of ``shapes`` given its ``node_tiles`` and every attention
    backward node of ``backward`` its ``backward_tiles.node_backward_tiles`` (a node with no
    feasible tiles keeps the automatic choice). Splash tiles are TPU kernel blocks: on another
    hardware family the layout comes back unchanged."""
    tgt = target
    if tgt.family != "tpu":
        return layout, {}
    # the same chip numbers Q2's network carries (``extract.network.Network.from_target``)
    chip = kernel_chip(tgt.chip.generation, tgt.chip.device_peak_flops,
                       tgt.chip.device_hbm_bandwidth_Bps,
                       tgt.chip.clock_hz)
    attention = dict(layout.attention)
    chosen: dict[str, Any] = {}
    for key, shape in sorted(shapes.items()):
        al = layout.attention_for(key)
        c = node_tiles(shape, al, layout.mesh_axes, chip, vmem_fraction,
                       residuals=key in (backward or {}))
        if c is None:
            continue
        chosen[key] = c
        attention[key] = al.with_tiles(block_q=c.block_q, block_kv=c.block_kv,
                                       block_kv_compute=c.block_kv_compute)
    for key, shape in sorted((backward or {}).items()):
        al = attention.get(key) or layout.attention_for(key)
        b = node_backward_tiles(shape, al, layout.mesh_axes, chip, vmem_fraction)
        if b is not None:
            chosen[key] = b
            attention[key] = al.with_tiles(**b.tiles)
    return dataclasses.replace(layout, attention=attention), chosen


def laid_out_shapes(layout: Layout, ir) -> tuple[dict[str, AttentionShape],
                                                 dict[str, AttentionShape]]:
    """(attention, attention backward) node shapes of ``ir`` that ``layout`` lays out."""
    def mine(kind):
        return {k: v for k, v in attention_shapes(ir, kind).items()
                if k in layout.attention or "*" in layout.attention}
    return mine("attention"), mine("attention_bwd")


def untiled(layout: Layout) -> Layout:
    """``layout`` with no attention tiles, forward or backward (the automatic ones)."""
    return dataclasses.replace(layout, attention={
        k: AttentionLayout(a.batch, a.heads, a.seq, a.kv) for k, a in layout.attention.items()})


def kernel_tiled(layout: Layout, ir, target: Target, vmem_fraction: float = 1.0) -> Layout:
    """``layout`` with the kernel model's tiles, not its own (a seed's: its authors'), on every
    attention and attention backward node of ``ir`` it lays out, within ``vmem_fraction`` of the
    scoped VMEM; no compile (the caller's compile is the verdict: on a VMEM or SMEM overflow,
    ask again with the fraction times ``VMEM_BACKOFF``, as ``choose_tiles`` does)."""
    shapes, backward = laid_out_shapes(layout, ir)
    return tiled_layout(untiled(layout), shapes, target, vmem_fraction, backward=backward)[0]


def overflows_on_chip(reason: str) -> bool:
    """Whether a compile error says a kernel overflowed VMEM or SMEM (retry with smaller tiles)."""
    return "VMEM" in reason or "SMEM" in reason


VMEM_RETRIES = 3       # a tile choice that overflows on chip is made again this many times,
VMEM_BACKOFF = 0.75    # each time within this factor of the previous VMEM fraction


def smaller_tile_choices(make: Callable[[float], Any], first: Any, *, start: float = 1.0,
                         retries: int = VMEM_RETRIES,
                         attention: Callable[[Any], Any] = lambda x: x.attention):
    """After ``first`` overflowed on chip: ``(fraction, make(fraction))`` for fraction =
    ``start * VMEM_BACKOFF**k``, k = 1 .. ``retries``, skipping a choice whose tiles
    (``attention(choice)``) are those of the choice before it (its compile would overflow
    again). ``make``: fraction -> a tiled layout (or anything ``attention`` reads one from).
    The one retry rule of ``choose_tiles``, the tuned experts and the planner's candidates."""
    fraction, last = start, attention(first)
    for _ in range(retries):
        fraction *= VMEM_BACKOFF
        choice = make(fraction)
        if attention(choice) != last:
            last = attention(choice)
            yield fraction, choice


def choose_tiles(layout: Layout, ir_or_shapes: Any, target: Target, *,
                 check: Callable[[Layout], Any] | None = None, retries: int = VMEM_RETRIES,
                 backward: dict[str, AttentionShape] | None = None) -> Layout:
    """``layout`` with kernel-model tiles on every attention node (module docstring).

    ir_or_shapes: a ``ProgramIR`` (its attention and attention backward nodes) or ``{node key:
    AttentionShape}`` (with ``backward``: the backward nodes'). check: compiles a layout,
    raising ``CompileError`` (e.g. ``lambda L: compile_layout(fn, args, tgt, L, order)``)."""
    if isinstance(ir_or_shapes, dict):
        shapes = ir_or_shapes
    else:
        shapes = attention_shapes(ir_or_shapes)
        backward = attention_shapes(ir_or_shapes, "attention_bwd")
    def make(fraction: float) -> Layout:
        return tiled_layout(layout, shapes, target, fraction, backward)[0]

    first = make(1.0)
    if check is None:
        return first
    for _, tiled in [(1.0, first), *smaller_tile_choices(make, first, retries=retries)]:
        try:
            check(tiled)
            return tiled
        except CompileError as e:
            if not overflows_on_chip(str(e)):
                raise
    return layout


def choose_compiler_options(layout: Layout, price: Callable[[Layout], float],
                            options: dict[str, Any] | None = None) -> tuple[Layout, dict]:
    """The cheaper of ``layout`` under libtpu's defaults and under ``options`` (default
    ``RECIPE_OPTIONS``) by ``price`` (seconds, e.g. Q2's step_s of the layout compiled with
    its ``compiler_options``). Returns (layout, {"default_s", "recipe_s"})."""
    opts = dict(RECIPE_OPTIONS if options is None else options)
    plain = dataclasses.replace(layout, compiler_options={})
    tuned = dataclasses.replace(layout, compiler_options=opts)
    a, b = float(price(plain)), float(price(tuned))
    return (tuned if b < a else plain), {"default_s": a, "recipe_s": b}
