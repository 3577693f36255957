"""Seconds of the Pallas splash-attention BACKWARD kernels on one TPU core, from their per-shard
shapes and blocks: what Q2 prices the ``splash_mha_dq`` / ``splash_mha_dkv`` custom-calls with
(the compiler gives them no cycle estimate, and their own cost estimate counts a fraction of
their FLOPs) and what the tile chooser ranks backward blocks with. A PREDICTION, not a
measurement; the same schedule assumptions as the forward's model (``kernel_model``).

The kernels (``jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel`` of jax
0.10.2, ``_flash_attention_dq_kernel`` and ``_flash_attention_dkv_kernel``, no mask sparsity),
lead = batch x heads of the shard, D head dim, e bytes per element, lengths padded to blocks:

dq kernel, blocks (bq, bkv), grid ``lead x n_q x n_kv`` (keys innermost). Per step it loads one
key and one value block, recomputes the scores and runs three matmuls (q k^T, do v^T, ds k):

    mxu_dq  = 6 * bq * bkv_m * D_m / peak_flops
    vpu_dq  = (DQ_SCORE_OPS * bq * bkv + bq * D) / (VREG_ELEMS * clock_hz)
    dma_dq  = (2 * bkv * D * e + (3 * bq * D * e + 2 * ROW_BLOCK * bq * 4) / n_kv) / hbm_Bps
              (k, v per step; q, do in and dq out, and the lse / di rows, once per query block)

dk/dv kernel, blocks (bq, bkv, bkvc), grid ``n_kv x lead x n_q`` (queries innermost), each step
``bkv / bkvc`` inner iterations of four matmuls (k q^T, p^T do, v do^T, ds^T q); with
``fused`` (``use_fused_bwd_kernel``) a fifth (ds k, this step's share of dq), whose [bq, D]
block is written every step and summed over the n_kv key blocks afterwards (an XLA reduce the
compiler prices itself):

    mxu_dkv = (8 + 2 fused) * bq * bkvc_m * D_m * (bkv / bkvc) / peak_flops
    vpu_dkv = (bkv / bkvc) * (DKV_SCORE_OPS * bq * bkvc + 2 * 2 * bkvc * D + fused * bq * D)
              / (VREG_ELEMS * clock_hz)      (dk, dv scratch: load-add-store per inner step)
    dma_dkv = (2 * bq * D * e + 2 * ROW_BLOCK * bq * 4 + fused * bq * D * e
               + 4 * bkv * D * e / n_q) / hbm_Bps
              (q, do and the lse / di rows per step; k, v in and dk, dv out once per key block)

    t_step = max(mxu, vpu, dma) + STEP_OVERHEAD_S;   t_call = lead * n_q * n_kv * t_step + dma

Both kernels' grids mark every dimension "arbitrary" (jax 0.10.2), so Mosaic runs them on one
TensorCore: on a device of C cores (``kernel_model.CORES_PER_DEVICE``: a v5p megacore) ``peak_flops``
above is one core's, the device's divided by C; that core streams at the device's HBM bandwidth.

Scoped VMEM (bytes), the pre-filter the tile chooser applies (the compiler decides):

    vmem_dq  = 2 * (3 * bq * D * e + 2 * bkv * D * e + 2 * ROW_BLOCK * bq * 4) + bq * D * 4
               + SCORE_ARRAYS * bq * bkv * 4
    vmem_dkv = 2 * (2 * bq * D * e + 4 * bkv * D * e + 2 * ROW_BLOCK * bq * 4 + fused bq D e)
               + 2 * bkv * D * 4 + fused * bq * D * 4 + SCORE_ARRAYS * bq * bkvc * 4

Constants: ``DQ_SCORE_OPS`` / ``DKV_SCORE_OPS`` counted in the kernel bodies named above (per
score element: the mask's compare and select, subtract lse, exp, subtract di, multiply by p,
cast ds to bf16; the dk/dv kernel also casts p for p^T do), ``ROW_BLOCK`` the sublane rows the
lse / di blocks take (their blocks are [8, bq] f32 in the compiled kernel's operands),
``SCORE_ARRAYS`` the f32 score-sized arrays live at once (p, dp, ds: an assumption). The chip
numbers and ``STEP_OVERHEAD_S`` are ``kernel_model``'s. No constant was fitted to a result this
project reports. This module has no jax import.
"""

from __future__ import annotations

from aoizora.formulation.kernel_model import (VREG_ELEMS, KernelChip, KernelModelError,
                                              SplashShape, round_up)

DQ_SCORE_OPS = 7
DKV_SCORE_OPS = 8
ROW_BLOCK = 8
SCORE_ARRAYS = 3


def _check(shape: SplashShape, *blocks: int) -> None:
    if min(shape.lead, shape.lq, shape.lkv, shape.head_dim, shape.dtype_bytes) <= 0:
        raise KernelModelError(f"splash shape {shape}: every size must be positive")
    if min(blocks) <= 0:
        raise KernelModelError(f"splash backward blocks {blocks} must be positive")


def _call(shape: SplashShape, n_q: int, n_kv: int, parts: tuple[float, float, float],
          chip: KernelChip) -> float:
    mxu, vpu, dma = parts
    t_step = max(mxu * chip.cores, vpu, dma) + chip.step_overhead_s   # one core's MXUs
    return shape.lead * n_q * n_kv * t_step + dma


def dq_seconds(shape: SplashShape, bq: int, bkv: int, chip: KernelChip) -> float:
    """Seconds of one dq kernel call (``t_call`` with the dq terms, module docstring)."""
    _check(shape, bq, bkv)
    d, e = shape.head_dim, shape.dtype_bytes
    n_q, n_kv = -(-shape.lq // bq), -(-shape.lkv // bkv)
    mxu = 6.0 * bq * round_up(bkv, chip.mxu_side) * round_up(d, chip.mxu_side) / chip.peak_flops
    vpu = (DQ_SCORE_OPS * bq * bkv + bq * d) / (VREG_ELEMS * chip.clock_hz)
    dma = (2.0 * bkv * d * e + (3.0 * bq * d * e + 2.0 * ROW_BLOCK * bq * 4) / n_kv) \
        / chip.hbm_Bps
    return _call(shape, n_q, n_kv, (mxu, vpu, dma), chip)


def dkv_seconds(shape: SplashShape, bq: int, bkv: int, bkvc: int, chip: KernelChip,
                fused: bool = False) -> float:
    """Seconds of one dk/dv kernel call (with dq too when ``fused``; module docstring)."""
    _check(shape, bq, bkv, bkvc)
    if bkv % bkvc:
        raise KernelModelError(f"block_kv_dkv_compute {bkvc} must divide block_kv_dkv {bkv}")
    d, e, f = shape.head_dim, shape.dtype_bytes, int(fused)
    n_q, n_kv, inner = -(-shape.lq // bq), -(-shape.lkv // bkv), bkv // bkvc
    mxu = (8.0 + 2 * f) * bq * round_up(bkvc, chip.mxu_side) * round_up(d, chip.mxu_side) \
        * inner / chip.peak_flops
    vpu = inner * (DKV_SCORE_OPS * bq * bkvc + 4 * bkvc * d + f * bq * d) \
        / (VREG_ELEMS * chip.clock_hz)
    dma = (2.0 * bq * d * e + 2.0 * ROW_BLOCK * bq * 4 + f * bq * d * e
           + 4.0 * bkv * d * e / n_q) / chip.hbm_Bps
    return _call(shape, n_q, n_kv, (mxu, vpu, dma), chip)


def dq_vmem_bytes(shape: SplashShape, bq: int, bkv: int) -> int:
    """Scoped VMEM (bytes) of the dq kernel (``vmem_dq``)."""
    d, e = shape.head_dim, shape.dtype_bytes
    return (2 * (3 * bq * d * e + 2 * bkv * d * e + 2 * ROW_BLOCK * bq * 4) + bq * d * 4
            + SCORE_ARRAYS * bq * bkv * 4)


def dkv_vmem_bytes(shape: SplashShape, bq: int, bkv: int, bkvc: int, fused: bool = False) -> int:
    """Scoped VMEM (bytes) of the dk/dv kernel (``vmem_dkv``)."""
    d, e, f = shape.head_dim, shape.dtype_bytes, int(fused)
    return (2 * (2 * bq * d * e + 4 * bkv * d * e + 2 * ROW_BLOCK * bq * 4 + f * bq * d * e)
            + 2 * bkv * d * 4 + f * bq * d * 4 + SCORE_ARRAYS * bq * bkvc * 4)
