"""The blocks of an attention backward's splash kernels, chosen by the kernel model: what
maxdiffusion sets by hand in ``flash_block_sizes`` (block_q_dkv, block_kv_dkv,
block_kv_dkv_compute, block_q_dq, block_kv_dq) and whether to fuse dq into the dk/dv kernel.

``node_backward_tiles(shape, al, mesh_axes, chip)`` for one ``attention_bwd`` node laid out as
``al`` (keys gathered, queries split over its seq axes, ``kernels.attention_backward``):

    per shard: lead = B / n_b * H / n_h,  Lq = roundup(ceil(S / n_s), 128),  Lkv = roundup(T, 128)
    for the dk/dv blocks (bq, bkv, bkvc): Lq' = roundup(Lq, bq), Lkv' = roundup(Lkv, bkv) (the
    realizer pads to them; the dq blocks divide them, so nothing pads further)
    unfused = dkv_seconds(Lq', Lkv'; bq, bkv, bkvc) + min_{bq2 | Lq', bkv2 | Lkv'} dq_seconds(bq2, bkv2)
    fused   = dkv_seconds(Lq', Lkv'; bq, bkv, bkvc; fused) + reduce_s
    reduce_s = (Lkv' / bkv + 1) * lead * Lq' * D * e / hbm_Bps   (XLA sums the n_kv partial dq
                                                                 blocks: read all, write one)
    pad_s   = 2 e lead D (4 Lq' [Lq' > Lq] + 2 Lkv' [Lkv' > Lkv]) / hbm_Bps   (q, out, do, dq
              and k, v copied once more, read and written)
    cost = min over the candidates of (unfused or fused) + pad_s

(``formulation.splash_backward_model``) over bq in {128 * 2^i <= Lq} u {roundup(Lq / m, 128) :
m = 1..8}, bkv likewise for Lkv with m = 1..16, bkvc a multiple of 128 dividing bkv and at most
2048, each kernel's scoped VMEM within the chip's limit x ``vmem_fraction`` and its mask
metadata within SMEM. Ties go to less VMEM, then unfused, then the blocks by name (deterministic).
None when nothing fits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from aoizora.formulation.kernel_model import KernelChip, SplashShape, block_candidates, round_up
from aoizora.formulation.layout import AttentionLayout
from aoizora.formulation.splash_backward_model import (dkv_seconds, dkv_vmem_bytes, dq_seconds,
                                                       dq_vmem_bytes)
from aoizora.kernels.attention_kernels import SPLASH_SMEM_BUDGET, splash_metadata_bytes

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


def _best_dq(sh: SplashShape, chip: KernelChip, frac: float):
    """(seconds, vmem, bq, bkv) of the best dq blocks dividing ``sh``'s lengths, or None."""
    best = None
    for bq in _divisors(sh.lq):
        for bkv in _divisors(sh.lkv):
            vmem = dq_vmem_bytes(sh, bq, bkv)
            if _fits(sh, bq, bkv, vmem, chip, frac):
                key = (dq_seconds(sh, bq, bkv, chip), vmem, bq, bkv)
                best = key if best is None or key < best else best
    return best


def _options(base: SplashShape, chip: KernelChip, frac: float):
    """Every feasible (seconds, vmem, fused, tiles) at the shard ``base`` (module docstring)."""
    d, e = base.head_dim, base.dtype_bytes
    dq_cache: dict = {}
    for bq in block_candidates(base.lq, 128, 8):
        for bkv in block_candidates(base.lkv, 128, 16):
            sh = SplashShape(base.lead, round_up(base.lq, bq), round_up(base.lkv, bkv), d, e)
            pad = 2.0 * e * sh.lead * d * (4 * sh.lq * (sh.lq > base.lq)
                                             + 2 * sh.lkv * (sh.lkv > base.lkv)) / chip.hbm_Bps
            reduce = (sh.lkv // bkv + 1) * sh.lead * sh.lq * d * e / chip.hbm_Bps
            key = (sh.lq, sh.lkv)
            if key not in dq_cache:
                dq_cache[key] = _best_dq(sh, chip, frac)
            dq = dq_cache[key]
            for bkvc in (c for c in _divisors(bkv) if c <= MAX_COMPUTE_BLOCK):
                for fused in (False, True):
                    vmem = dkv_vmem_bytes(sh, bq, bkv, bkvc, fused)
                    if not _fits(sh, bq, bkv, vmem, chip, frac) or (not fused and dq is None):
                        continue
                    t = dkv_seconds(sh, bq, bkv, bkvc, chip, fused) + pad
                    tiles = dict(block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkvc,
                                 use_fused_bwd_kernel=fused)
                    if fused:
                        yield t + reduce, vmem, 1, tiles
                    else:
                        yield t + dq[0], max(vmem, dq[1]), 0, dict(
                            tiles, block_q_dq=dq[2], block_kv_dq=dq[3])


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
    base = SplashShape(shape.batch // n_b * (shape.heads // n_h),
                       round_up(-(-shape.q_len // n_s), 128), round_up(shape.kv_len, 128),
                       shape.head_dim, shape.dtype_bytes)
    best = min(_options(base, chip, vmem_fraction),
               key=lambda o: (o[0], o[1], o[2], sorted(o[3].items())), default=None)
    return None if best is None else BackwardChoice(best[3], best[0], best[1])
