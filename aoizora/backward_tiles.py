"""The blocks of an attention backward's splash kernels, chosen by the kernel model: what
maxdiffusion sets by hand in ``flash_block_sizes`` (block_q_dkv, block_kv_dkv,
block_kv_dkv_compute, block_q_dq, block_kv_dq) and whether to fuse dq into the dk/dv kernel.

``node_backward_tiles(shape, al, mesh_axes, chip)`` for one ``attention_bwd`` node laid out as
``al`` (keys gathered, queries split over its seq axes, ``models.attention_backward``):

    per shard: lead = B / n_b * H / n_h; Lq, Lkv = the lengths ``padded_lengths`` gives the
    backward (the layout's forward tiles, ``grad``), Lq per shard
    unfused = min_{bq, bkv, bkvc} dkv_seconds(bq, bkv, bkvc) + min_{bq', bkv'} dq_seconds(bq', bkv')
    fused   = min_{bq, bkv, bkvc} dkv_seconds(bq, bkv, bkvc; fused) + reduce_s(bkv)
    reduce_s(bkv) = (Lkv / bkv + 1) * lead * Lq * D * e / hbm_Bps   (XLA sums the n_kv partial
                                                                     dq blocks: read all, write one)
    cost = min(unfused, fused)

(``formulation.splash_backward_model``) over blocks that are multiples of 128 dividing the
per-shard lengths (no extra padding), bkvc dividing bkv and at most 2048, each kernel's scoped
VMEM within the chip's limit x ``vmem_fraction`` and its mask metadata within SMEM. Ties go to
less VMEM, then smaller blocks, then unfused (deterministic). None when nothing fits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from aoizora.formulation.kernel_model import KernelChip, SplashShape
from aoizora.formulation.layout import AttentionLayout
from aoizora.formulation.splash_backward_model import (dkv_seconds, dkv_vmem_bytes, dq_seconds,
                                                       dq_vmem_bytes)
from aoizora.models.attention_kernels import (SPLASH_SMEM_BUDGET, padded_lengths,
                                              splash_metadata_bytes)

MAX_COMPUTE_BLOCK = 2048


@dataclasses.dataclass(frozen=True)
class BackwardChoice:
    tiles: dict[str, Any]     # AttentionLayout.BACKWARD_TILE_FIELDS -> value
    seconds: float            # kernel-model seconds of the node's backward kernels per run
    vmem_bytes: int           # the larger kernel's scoped VMEM


def _divisors(length: int) -> list[int]:
    """Multiples of 128 dividing ``length``."""
    return [b for b in range(128, length + 1, 128) if length % b == 0]


def _fits(sh: SplashShape, bq: int, bkv: int, vmem: int, chip: KernelChip, frac: float) -> bool:
    return (vmem <= chip.scoped_vmem_bytes * frac
            and splash_metadata_bytes(sh.lq, sh.lkv, bq, bkv) <= SPLASH_SMEM_BUDGET)


def _best_dkv(sh: SplashShape, chip: KernelChip, frac: float, fused: bool):
    best = None
    for bq in _divisors(sh.lq):
        for bkv in _divisors(sh.lkv):
            for bkvc in (c for c in _divisors(bkv) if c <= MAX_COMPUTE_BLOCK):
                vmem = dkv_vmem_bytes(sh, bq, bkv, bkvc, fused)
                if not _fits(sh, bq, bkv, vmem, chip, frac):
                    continue
                t = dkv_seconds(sh, bq, bkv, bkvc, chip, fused)
                if fused:
                    t += (sh.lkv // bkv + 1) * sh.lead * sh.lq * sh.head_dim * sh.dtype_bytes \
                        / chip.hbm_Bps
                key = (t, vmem, bq, bkv, bkvc)
                best = key if best is None or key < best else best
    return best


def _best_dq(sh: SplashShape, chip: KernelChip, frac: float):
    best = None
    for bq in _divisors(sh.lq):
        for bkv in _divisors(sh.lkv):
            vmem = dq_vmem_bytes(sh, bq, bkv)
            if _fits(sh, bq, bkv, vmem, chip, frac):
                key = (dq_seconds(sh, bq, bkv, chip), vmem, bq, bkv)
                best = key if best is None or key < best else best
    return best


def node_backward_tiles(shape: Any, al: AttentionLayout, mesh_axes: dict[str, int],
                        chip: KernelChip, vmem_fraction: float = 1.0) -> BackwardChoice | None:
    """The fastest feasible backward blocks of one node (module docstring); None if none, or
    when the head dim is not a multiple of 128 (the model counts whole MXU tiles; and libtpu
    for v5p failed the small Wan model's step, head dim 32, with a bitcast error in the kernel
    model's backward blocks). ``shape``: its global ``tiles.AttentionShape``."""
    if shape.head_dim % 128:
        return None
    n_b, n_h, n_s = (math.prod(mesh_axes[a] for a in axes) for axes in (al.batch, al.heads,
                                                                         al.seq))
    sq_p, skv_p, _, _ = padded_lengths(shape.q_len, shape.kv_len, n_s, kv="gather",
                                       impl="splash", block_q=al.block_q, block_kv=al.block_kv,
                                       grad=True)
    sh = SplashShape(shape.batch // n_b * (shape.heads // n_h), sq_p // n_s, skv_p,
                     shape.head_dim, shape.dtype_bytes)
    dkv, dq = _best_dkv(sh, chip, vmem_fraction, False), _best_dq(sh, chip, vmem_fraction)
    fused = _best_dkv(sh, chip, vmem_fraction, True)
    options = []
    if dkv and dq:
        options.append((dkv[0] + dq[0], max(dkv[1], dq[1]), 0, dict(
            block_q_dkv=dkv[2], block_kv_dkv=dkv[3], block_kv_dkv_compute=dkv[4],
            block_q_dq=dq[2], block_kv_dq=dq[3], use_fused_bwd_kernel=False)))
    if fused:
        options.append((fused[0], fused[1], 1, dict(
            block_q_dkv=fused[2], block_kv_dkv=fused[3], block_kv_dkv_compute=fused[4],
            use_fused_bwd_kernel=True)))
    if not options:
        return None
    t, vmem, _, tiles = min(options, key=lambda o: o[:3])
    return BackwardChoice(tiles, t, vmem)
