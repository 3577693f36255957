"""The splash tiles an attention strategy would run with, and their kernel-model seconds: one
chooser for Q1 (the sharding ILP prices every attention strategy at its per-shard shape with the
tiles it would get) and for the planner (``aoizora.tiles`` gives the realized layout the same
tiles), so candidates are compared at the tiles they run, not at automatic ones.

    per shard (n_b, n_h, n_s = sizes of the strategy's batch, heads, seq axes; ring: r = n_s,
    gather: r = 1):
        lead = B / n_b * H / n_h
        Lq(bq)  = roundup(S, n_s * bq) / n_s          (the wrapper pads S to n_s * bq)
        Lkv(bkv) = roundup(T, r * bkv) / r
    cost(bq, bkv, bkvc) = r * splash_seconds(lead, Lq(bq), Lkv(bkv), D; bq, bkv, bkvc)
                          + pad_s(bq, bkv) + relayout_s
    pad_s = 2 e lead D (Lq [S % (n_s bq) != 0] + 2 Lkv [T % (r bkv) != 0]) / hbm_Bps
    (a tile that makes the wrapper pad a tensor the program did not pad pays the copy)
    relayout_s = 2 e lead D (2 ceil(S / n_s) + 2 ceil(T / r)) / hbm_Bps   if D % LANES != 0
               = 0                                                      otherwise
    (the kernel reads q, k, v and writes its output [.., S, D] with D in the vector lanes; a
    projection writes [.., S, H * D], and that is the same bytes in HBM only when D fills whole
    128-lane tiles. Otherwise each of q, k, v and the output crosses one relayout copy, read and
    written once: on STDiT3 (D = 72) the compiled program has them, on Wan 2.1 (D = 128) not,
    ``benchmarks/results/lab_notes.md``), over

        bq   in {128 * 2^i <= Lq} u {roundup(ceil(S / n_s) / m, 8) : m = 1..8}
        bkv  in {128 * 2^i <= Lkv} u {roundup(ceil(T / r) / m, 128) : m = 1..16}
        bkvc in {multiples of 128 dividing bkv, at most 2048}

that fit: scoped VMEM (``kernel_model.splash_vmem_bytes``) within the chip's scoped limit times
``vmem_fraction``, and the mask metadata within SMEM (``splash_metadata_bytes``). Ties go to less
VMEM, then to smaller tiles (deterministic). ``kernel_model`` is the source of every constant.
This module has no jax import (formulation layer).
"""

from __future__ import annotations

import dataclasses
import functools

from aoizora.formulation.kernel_model import (AttentionShape, KernelChip, KernelModelError, SplashShape,
                                              block_candidates, kernel_chip, round_up,
                                              splash_seconds, splash_vmem_bytes)

MAX_BKV_COMPUTE = 2048
# The splash kernel's mask metadata (``block_mask`` int8 and ``data_next``, int8/int16/int32 by
# its largest value) is scalar-prefetched into SMEM, one entry per (query block, key block), the
# key-block axis padded to 128 (the compiler's limit on v5e: benchmarks/results/lab_notes.md).
SPLASH_SMEM_BYTES = 1 << 20
SPLASH_SMEM_BUDGET = SPLASH_SMEM_BYTES - (64 << 10)     # room for the kernel's other scalars


def splash_metadata_bytes(lq: int, lkv: int, bq: int, bkv: int) -> int:
    """Bytes of SMEM the splash kernel's mask metadata takes for per-shard lengths lq x lkv."""
    q_blocks, kv_blocks = -(-lq // bq), -(-lkv // bkv)
    index_bytes = 1 if kv_blocks <= 128 else 2 if kv_blocks <= 1 << 15 else 4
    return q_blocks * round_up(kv_blocks, 128) * (1 + index_bytes)


@dataclasses.dataclass(frozen=True)
class TileChoice:
    block_q: int
    block_kv: int
    block_kv_compute: int
    seconds: float           # kernel-model seconds of the node's kernel calls per run
    vmem_bytes: int


def chip_of(generation: str, peak_flops: float, hbm_Bps: float, clock_hz: float
            ) -> KernelChip | None:
    """The kernel model's chip, or None when it has none for these numbers (then the caller
    prices attention another way)."""
    try:
        return kernel_chip(generation, peak_flops, hbm_Bps, clock_hz)
    except KernelModelError:
        return None


LANES = 128    # a TPU vector register's lanes: the minor dim of an array in HBM is tiled by them


def _pad_seconds(shape: AttentionShape, lead: int, lq: int, lkv: int, chip: KernelChip) -> float:
    return 2.0 * shape.dtype_bytes * lead * shape.head_dim * (lq + 2 * lkv) / chip.hbm_Bps


def relayout_seconds(shape: AttentionShape, n_b: int, n_h: int, n_s: int, ring: bool,
                     chip: KernelChip) -> float:
    """``relayout_s`` (module docstring): seconds per call of the copies that bring q, k, v into
    the kernel's [.., S, D] layout and its output back, on one shard; 0 when D fills whole lanes."""
    if shape.head_dim % LANES == 0:
        return 0.0
    r = n_s if ring else 1
    lead = shape.batch // n_b * (shape.heads // n_h)
    lq, lkv = -(-shape.q_len // n_s), -(-shape.kv_len // r)
    return 2.0 * shape.dtype_bytes * lead * shape.head_dim * (2 * lq + 2 * lkv) / chip.hbm_Bps


def wrapper_seconds(shape: AttentionShape, n_b: int, n_h: int, n_s: int, ring: bool,
                    block_q: int, block_kv: int, chip: KernelChip) -> float:
    """``pad_s(block_q, block_kv) + relayout_s`` (module docstring): seconds per call the
    program spends around the kernels of one shard at these tiles."""
    r = n_s if ring else 1
    lead = shape.batch // n_b * (shape.heads // n_h)
    lq = round_up(shape.q_len, n_s * block_q) // n_s
    lkv = round_up(shape.kv_len, r * block_kv) // r
    pad = _pad_seconds(shape, lead, lq if shape.q_len % (n_s * block_q) else 0,
                       lkv if shape.kv_len % (r * block_kv) else 0, chip)
    return pad + relayout_seconds(shape, n_b, n_h, n_s, ring, chip)


@functools.lru_cache(maxsize=4096)
def best_tiles(shape: AttentionShape, n_b: int, n_h: int, n_s: int, ring: bool,
               chip: KernelChip, vmem_fraction: float = 1.0,
               residuals: bool = False) -> TileChoice | None:
    """The fastest feasible tiles of one attention node split (n_b, n_h, n_s) ways, keys/values
    gathered or in a ring (module docstring); None if no tile fits. The kernel keeps its
    log-sum-exp (``splash_vmem_bytes``' residuals) in a ring, or when ``residuals`` (a training
    step's forward)."""
    r = n_s if ring else 1
    lead = shape.batch // n_b * (shape.heads // n_h)
    lq0, lkv0 = -(-shape.q_len // n_s), -(-shape.kv_len // r)
    best = None
    for bq in block_candidates(lq0, 8, 8):
        lq = round_up(shape.q_len, n_s * bq) // n_s
        for bkv in block_candidates(lkv0, 128, 16):
            lkv = round_up(shape.kv_len, r * bkv) // r
            if splash_metadata_bytes(lq, lkv, bq, bkv) > SPLASH_SMEM_BUDGET:
                continue
            sh = SplashShape(lead, lq, lkv, shape.head_dim, shape.dtype_bytes)
            around = wrapper_seconds(shape, n_b, n_h, n_s, ring, bq, bkv, chip)
            for bkvc in range(128, min(bkv, MAX_BKV_COMPUTE) + 1, 128):
                if bkv % bkvc:
                    continue
                vmem = splash_vmem_bytes(sh, bq, bkv, bkvc, residuals=ring or residuals)
                if vmem > chip.scoped_vmem_bytes * vmem_fraction:
                    continue
                t = r * splash_seconds(sh, bq, bkv, bkvc, chip) + around
                key = (t, vmem, bq, bkv, bkvc)
                if best is None or key < best[0]:
                    best = (key, TileChoice(bq, bkv, bkvc, t, vmem))
    return best[1] if best else None
