"""Seconds of one Pallas splash-attention forward call on one TPU core, from its per-shard shapes
and its tiles: the kernel model Q2 prices the splash custom-call with (the compiler gives it no
cycle estimate) and the tile chooser ranks tiles with. A PREDICTION, not a measurement.

The kernel (``jax.experimental.pallas.ops.tpu.splash_attention``, forward, no mask sparsity)
runs a grid of ``lead x n_q x n_kv`` steps, ``lead`` = batch x heads of the shard,
``n_q = Lq / bq``, ``n_kv = Lkv / bkv`` (lengths already padded to tile multiples). Each step
loads one key and one value block [bkv, D] from HBM (the query block [bq, D] and the output
block are fetched / written once per query block) and runs ``bkv / bkvc`` inner iterations,
each QK^T [bq, bkvc] and PV on the MXUs and the online softmax on the vector unit. Pallas
double-buffers the blocks, so a step's copies overlap the previous step's compute; the MXU and
the vector unit are taken to overlap too (the most optimistic schedule):

    mxu_step  = 4 * bq * bkvc_m * D_m * (bkv / bkvc) / peak_flops     (QK^T and PV, 2 FLOP per
                MAC; bkvc_m, D_m = bkvc, D rounded up to the MXU side: a partial MXU tile costs
                a whole one)
    vpu_step  = (bkv / bkvc) * (SCORE_OPS * bq * bkvc + ACC_OPS * bq * D)
                / (VREG_ELEMS * VPU_OPS_PER_CYCLE * clock_hz)
                (the online softmax per score element: max, subtract, exp, sum, cast; per
                accumulator element per inner iteration: rescale by alpha and add P V)
    dma_step  = (2 * bkv * D * e + 2 * bq * D * e / n_kv) / hbm_Bps   (k, v blocks; q in, o out
                amortized over the query block's steps)
    t_step    = max(mxu_step, vpu_step, dma_step) + STEP_OVERHEAD_S
    t_call    = ceil(lead / C) * n_q * n_kv * t_step + dma_step          (first copy exposed)

``C`` = the TensorCores of one device (``CORES_PER_DEVICE``: a v5p device is a megacore of two).
The forward's grid marks its leading (heads) dimension "parallel", so Mosaic splits it over the
C cores; each core runs its steps on its own MXUs and vector unit and the cores share the
device's HBM, so in the step above ``peak_flops`` and ``hbm_Bps`` are the device's divided by C.
With C = 1 (every other generation) this is the device's step.

``e`` = bytes per element of q, k, v. Approximation: no mask sparsity (the kernel skips no block).

Scoped VMEM the kernel allocates (bytes), checked against the compiler's scoped limit:

    vmem = 2 * (2 * bq * D * e + 2 * bkv * D * e)     (q, o, k, v blocks, double-buffered)
         + (2 * bq * LANES + bq * D) * 4               (m, l, o accumulators, f32)
         + bq * bkv * 4                                (f32 scores of the whole key block)
         + 2 * bq * LANES * 4                          (with residuals: the log-sum-exp block)

libtpu 0.0.42.1 on v5e reported scoped allocations of 22.36M for (bq, bkv, bkvc, D) =
(1024, 4096, 4096, 128), 22.98M for (2048, 2048, 2048, 128) and 55.13M for
(1216, 9728, 512, 128) (all over its 16.00M limit); the formula gives 22.50M, 23.00M and
57.59M. The scores take the whole key block even when block_kv_compute is smaller (the third
case). With residuals (a ring), libtpu 0.0.42.1 on v6e reported 32.50M (limit 32.00M) for
(2736, 2048, 2048, 128); the formula gives 32.73M (30.05M without the log-sum-exp block). It is a pre-filter; the compiler's verdict (a ``CompileError`` naming VMEM) decides.

Constants (cited at each): the MXU side per generation, the vreg size, the vector-unit op counts,
the scoped VMEM limit, the per-step overhead. Peak FLOP/s, HBM bandwidth and the clock come
from the caller (``extract.targets.ChipSpec``), so they are the numbers the rest of Q2 uses.
No constant here was fitted to a result this project reports. This module has no jax import.
"""

from __future__ import annotations

import dataclasses

LANES = 128          # vector lanes per vreg (TPU v4-v7x; jax TpuInfo num_lanes)
VREG_ELEMS = 8 * 128  # 32-bit elements per vreg: 8 sublanes x 128 lanes (jax TpuInfo)
# Vector-unit ops per element, counted in the splash forward kernel body (jax 0.10.2
# jax/experimental/pallas/ops/tpu/splash_attention/splash_attention_kernel.py, flash_attention_
# kernel): per score element max, subtract m, exp, sum, cast to the PV dtype; per accumulator
# element per inner iteration alpha * o and + P V.
SCORE_OPS = 5
ACC_OPS = 2
# Vreg-wide vector ops issued per cycle: 1 assumed (not documented publicly for v4-v6e).
VPU_OPS_PER_CYCLE = 1

# The MXU is a systolic array of MXU_SIDE x MXU_SIDE MACs: 128 on v4/v5e/v5p, 256 on v6e and v7x
# (jax 0.10.2 jax/_src/pallas/mosaic/tpu_info.py: mxu_column_size MXU_COLUMN_SIZE_GEN_LT_6 = 128,
# MXU_COLUMN_SIZE_GEN_GE_6 = 256, TPU_7X mxu_column_size=256; Cloud TPU docs: v6e "256x256 MXU").
MXU_SIDE = {"v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "v7x": 256}

# Scoped VMEM limit a Pallas kernel gets unless it asks for more (bytes). v5e: observed with
# libtpu 0.0.42.1 ("limit 16.00M" in its CompileTimeScopedVmemOom message). v6e: observed too
# ("limit 32.00M", a splash ring kernel on v6e:2x4). v7x: observed too ("limit 32.00M", a splash
# forward with blocks 2048 x 4096 on v7x:2x2x1, heads split 8 ways; the VMEM itself is 64.00M,
# "Used 74.00M of 64.00M vmem" at 4096 x 4096). v4 / v5p: 16 MiB assumed, unverified. The
# compiler's verdict decides in any case.
SCOPED_VMEM_BYTES = {"v4": 16 << 20, "v5e": 16 << 20, "v5p": 16 << 20, "v6e": 32 << 20,
                     "v7x": 32 << 20}

# TensorCores one device drives: a v5p chip is one device of two TensorCores (megacore; Cloud TPU
# docs, "TPU v5p": 2 TensorCores per chip; libtpu 0.0.42.1 shows v5p-8 as 4 devices); libtpu shows
# each v4 and v7x TensorCore as a device of its own, and v5e / v6e chips have one.
CORES_PER_DEVICE = {"v4": 1, "v5e": 1, "v5p": 2, "v6e": 1, "v7x": 1}

# Fixed cost of one Pallas TPU grid step (seconds): about 0.35 us, the figure the JAX Pallas TPU
# documentation gives for the per-iteration overhead of a pipelined pallas_call.
STEP_OVERHEAD_S = 0.35e-6


class KernelModelError(ValueError):
    """Shapes or tiles the kernel model cannot price."""


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    """The shape of an attention: q [B, H, S, D] and k, v [B, H, T, D], e bytes per element.

    One record for both places it is read: a node's global shape (``kernels.tiles``) and one
    splash call on one shard, where the kernel model only needs lead = B x H and the padded
    lengths (``SplashShape`` builds that with B = 1).

    Attributes:
      batch: B. heads: H. q_len: S, the query length. kv_len: T, the key/value length.
      head_dim: D. dtype_bytes: e.
    """

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype_bytes: int = 2

    @property
    def lead(self) -> int:
        """The kernel's leading dimension: batch x heads."""
        return self.batch * self.heads

    @property
    def lq(self) -> int:
        """The query length (as the kernel sees it: padded, for a splash call)."""
        return self.q_len

    @property
    def lkv(self) -> int:
        """The key/value length (as the kernel sees it: padded, for a splash call)."""
        return self.kv_len


def SplashShape(lead: int, lq: int, lkv: int, head_dim: int,   # noqa: N802 -- a record's name
                dtype_bytes: int = 2) -> AttentionShape:
    """One splash call on one shard: lead = batch x heads, Lq / Lkv query / key length (as the
    kernel sees them: padded), D head dim, e bytes per element; an ``AttentionShape`` of
    batch 1."""
    return AttentionShape(1, lead, lq, lkv, head_dim, dtype_bytes)


@dataclasses.dataclass(frozen=True)
class KernelChip:
    """The numbers the model needs about one TPU core (units: FLOP/s, bytes/s, bytes, s)."""

    generation: str
    peak_flops: float
    hbm_Bps: float
    mxu_side: int
    scoped_vmem_bytes: int
    clock_hz: float
    step_overhead_s: float = STEP_OVERHEAD_S
    cores: int = 1


def kernel_chip(generation: str, peak_flops: float, hbm_Bps: float,
                clock_hz: float) -> KernelChip:
    """The KernelChip of a TPU generation ("v5e", "v6e", "v5p", "v4", "v7x") with the caller's
    peak FLOP/s, HBM bandwidth (per device: ``ChipSpec.device_peak_flops`` /
    ``device_hbm_bandwidth_Bps``) and TensorCore clock."""
    if generation not in MXU_SIDE:
        raise KernelModelError(f"no kernel model for TPU generation {generation!r}; known: "
                               f"{', '.join(MXU_SIDE)}")
    if peak_flops <= 0 or hbm_Bps <= 0 or clock_hz <= 0:
        raise KernelModelError(f"kernel model needs a positive peak ({peak_flops}), HBM "
                               f"bandwidth ({hbm_Bps}) and clock ({clock_hz})")
    return KernelChip(generation, float(peak_flops), float(hbm_Bps), MXU_SIDE[generation],
                      SCOPED_VMEM_BYTES[generation], float(clock_hz),
                      cores=CORES_PER_DEVICE[generation])


def round_up(n: int, m: int) -> int:
    """n rounded up to a multiple of m."""
    return -(-n // m) * m


def block_candidates(length: int, align: int, splits: int) -> list[int]:
    """Block sizes to try for a ``length``: 128 * 2^i up to it, and it split in m = 1..splits
    blocks rounded up to ``align``."""
    out = {128 * 2 ** i for i in range(16) if 128 * 2 ** i <= length}
    out |= {round_up(-(-length // m), align) for m in range(1, splits + 1)}
    return sorted(out)


def _check(shape: SplashShape, bq: int, bkv: int, bkvc: int) -> None:
    if min(shape.lead, shape.lq, shape.lkv, shape.head_dim, shape.dtype_bytes) <= 0:
        raise KernelModelError(f"splash shape {shape}: every size must be positive")
    if min(bq, bkv, bkvc) <= 0 or bkv % bkvc:
        raise KernelModelError(f"splash tiles ({bq}, {bkv}, {bkvc}): positive, and "
                               f"block_kv_compute must divide block_kv")


def splash_vmem_bytes(shape: SplashShape, bq: int, bkv: int, bkvc: int,
                      residuals: bool = False) -> int:
    """Scoped VMEM (bytes) of one splash call with tiles (bq, bkv, bkvc): see module docstring;
    ``residuals``: the kernel also writes its log-sum-exp (``save_residuals``: a ring's steps, a
    training step's forward), one more double-buffered f32 [bq, LANES] output block."""
    _check(shape, bq, bkv, bkvc)
    d, e = shape.head_dim, shape.dtype_bytes
    io = 2 * (2 * bq * d * e + 2 * bkv * d * e)
    acc = (2 * bq * LANES + bq * d) * 4
    score = bq * bkv * 4
    lse = 2 * bq * LANES * 4 if residuals else 0
    return io + acc + score + lse


def splash_seconds(shape: SplashShape, bq: int, bkv: int, bkvc: int, chip: KernelChip) -> float:
    """Seconds of one splash forward call (``t_call`` in the module docstring). Lengths that are
    not tile multiples are padded up first (the wrapper pads them so)."""
    _check(shape, bq, bkv, bkvc)
    lq, lkv = round_up(shape.lq, bq), round_up(shape.lkv, bkv)
    n_q, n_kv = lq // bq, lkv // bkv
    d, e = shape.head_dim, shape.dtype_bytes
    inner, c = bkv // bkvc, chip.cores
    mxu = 4.0 * bq * round_up(bkvc, chip.mxu_side) * round_up(d, chip.mxu_side) * inner \
        / (chip.peak_flops / c)
    vpu = inner * (SCORE_OPS * bq * bkvc + ACC_OPS * bq * d) \
        / (VREG_ELEMS * VPU_OPS_PER_CYCLE * chip.clock_hz)
    dma = (2.0 * bkv * d * e + 2.0 * bq * d * e / n_kv) / (chip.hbm_Bps / c)
    t_step = max(mxu, vpu, dma) + chip.step_overhead_s
    return -(-shape.lead // c) * n_q * n_kv * t_step + dma


def splash_flops(shape: SplashShape) -> float:
    """The useful FLOPs of one call (no padding): 4 * lead * Lq * Lkv * D."""
    return 4.0 * shape.lead * shape.lq * shape.lkv * shape.head_dim
