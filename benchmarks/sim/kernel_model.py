"""Time of a gridded TPU kernel (Pallas / Mosaic), step by step, and of splash attention.

A Pallas TPU kernel runs its body once per grid point, in row-major order, on one TensorCore
(grid dimensions marked "parallel" are split over the cores of one device: a v5p megacore's two;
a v4 or TPU7x device is one core). Each step, the pipeline copies in the blocks whose block
index changed since the previous step (double-buffered, so the copy overlaps the previous step's
compute) and copies out the output blocks whose index is about to change. Within a step the body
is one dependent chain (attention: S = q k^T, then the softmax on S, then P v), so its MXU, VPU
and EUP work are added, not overlapped (an upper bound: the core's scheduler may overlap
independent rows of the chain); only the DMA of the next step overlaps it. So one step costs

    t_step = max(t_mxu + t_vpu + t_eup, t_dma) + GRID_STEP_OVERHEAD_S
    t_mxu  = padded matmul FLOPs / core peak          (dims padded to the MXU: K, N to mxu_dim)
    t_vpu  = f32 vector element-ops / (vpu_f32_ops_per_cycle x clock)
    t_eup  = transcendental elements / (eup_ops_per_cycle x clock)
    t_dma  = bytes copied this step / core HBM bandwidth

and the kernel ``OP_LAUNCH_S + prologue + steps_per_core x t_step`` where the prologue is the
first step's input copy (nothing to hide it behind) and ``steps_per_core = steps / cores`` when
the kernel has a "parallel" grid dimension whose extent the cores divide, else ``steps``.

A block-sparse kernel (splash attention over a mask) keeps its compute under a branch that only
the steps on kept blocks take (``gated_kernel_time``): ``run_steps`` steps cost t_step of the
whole body and their copies, the other ``steps - run_steps`` cost t_step of what is outside the
branch and their own copies (often only an output block), so

    kernel = OP_LAUNCH_S + prologue + (run_steps x t_step(run) + (steps - run_steps) x
             t_step(skip)) / cores
Constants: ``benchmarks.sim.constants``. Units: seconds, bytes, FLOPs.
"""

from __future__ import annotations

import dataclasses
import math

from benchmarks.sim.constants import (GRID_STEP_OVERHEAD_S, OP_LAUNCH_S, SPLASH_EUP_OPS_PER_ACC,
                                      SPLASH_EUP_OPS_PER_SCORE, SPLASH_MASK_VPU_OPS_PER_SCORE,
                                      SPLASH_PARTIAL_BLOCKS_PER_ROW, SPLASH_VPU_OPS_PER_ACC,
                                      SPLASH_VPU_OPS_PER_SCORE, ChipModel, chip_model)


@dataclasses.dataclass
class StepWork:
    """The average work of one grid step (see module docstring)."""

    mxu_flops: float = 0.0       # padded to the MXU
    vpu_ops: float = 0.0         # f32 element-operations
    eup_ops: float = 0.0         # transcendental elements
    dma_bytes: float = 0.0       # HBM <-> VMEM bytes copied per step, averaged over the grid
    first_bytes: float = 0.0     # the first step's input blocks (the un-hidden prologue)


@dataclasses.dataclass
class KernelTime:
    """A kernel's time and what bounds its steps."""

    seconds: float
    steps: int
    steps_per_core: float
    step_s: float
    bound: str                   # "mxu", "vpu", "eup", "dma" or "overhead"


def padded(n: int, m: int) -> int:
    """n rounded up to a multiple of m (at least m)."""
    return max(m, -(-int(n) // m) * m)


def matmul_flops(m: int, k: int, n: int, chip: ChipModel) -> float:
    """FLOPs the MXU spends on an (m x k) @ (k x n) product: k and n padded to the MXU width,
    m to the 8 rows of a vector register."""
    return 2.0 * padded(m, 8) * padded(k, chip.mxu_dim) * padded(n, chip.mxu_dim)


def _step_s(chip: ChipModel, work: StepWork) -> tuple[float, str]:
    """(seconds of one step of ``work``, what bounds it) (module docstring)."""
    parts = {
        "mxu": work.mxu_flops / chip.core_flops,
        "vpu": work.vpu_ops / (chip.vpu_f32_ops_per_cycle * chip.clock_hz),
        "eup": work.eup_ops / (chip.eup_ops_per_cycle * chip.clock_hz),
        "dma": work.dma_bytes / chip.core_hbm_Bps,
    }
    body = parts["mxu"] + parts["vpu"] + parts["eup"]
    bound = "dma" if parts["dma"] > body else max(("mxu", "vpu", "eup"), key=parts.get)
    if max(body, parts["dma"]) < GRID_STEP_OVERHEAD_S:
        bound = "overhead"
    return max(body, parts["dma"]) + GRID_STEP_OVERHEAD_S, bound


def kernel_time(chip: ChipModel, steps: int, work: StepWork, parallel_split: bool) -> KernelTime:
    """Seconds of a gridded kernel of ``steps`` steps of average ``work`` (module docstring)."""
    if steps < 1:
        raise ValueError(f"a kernel needs at least one grid step, got {steps}")
    step_s, bound = _step_s(chip, work)
    cores = chip.device_cores
    per_core = steps / cores if parallel_split and cores > 1 else float(steps)
    total = OP_LAUNCH_S + work.first_bytes / chip.core_hbm_Bps + per_core * step_s
    return KernelTime(total, int(steps), per_core, step_s, bound)


def gated_kernel_time(chip: ChipModel, steps: int, run_steps: float, run_work: StepWork,
                      skip_work: StepWork, parallel_split: bool) -> KernelTime:
    """Seconds of a gridded kernel whose compute sits under a branch that ``run_steps`` of its
    ``steps`` take (a block-sparse kernel: splash attention skips the blocks its mask leaves
    out). The other ``steps - run_steps`` steps cost ``skip_work`` (what is outside the branch,
    and their copies) plus the step overhead: ``OP_LAUNCH_S + prologue + (run_steps x t_step(
    run_work) + (steps - run_steps) x t_step(skip_work)) / cores`` (cores as in
    ``kernel_time``). ``step_s`` is the average step."""
    if steps < 1:
        raise ValueError(f"a kernel needs at least one grid step, got {steps}")
    run = min(float(steps), max(0.0, float(run_steps)))
    t_run, bound = _step_s(chip, run_work)
    t_skip, _ = _step_s(chip, skip_work)
    cores = chip.device_cores
    share = 1.0 / cores if parallel_split and cores > 1 else 1.0
    per_core = steps * share
    busy = (run * t_run + (steps - run) * t_skip) * share
    total = OP_LAUNCH_S + run_work.first_bytes / chip.core_hbm_Bps + busy
    return KernelTime(total, int(steps), per_core, busy / per_core, bound)


def splash_vmem_bytes(head_dim: int, block_q: int, block_kv: int,
                      block_kv_compute: int | None = None) -> int:
    """VMEM a splash forward step holds: double-buffered q, k, v and output blocks (bf16), the
    f32 accumulator and the running max and sum (lane-replicated to 128), and the f32 score and
    probability tiles of one sub-step. Bytes."""
    bkc = int(block_kv_compute or block_kv)
    d = padded(head_dim, 128)
    blocks = 2 * (2 * block_q * d + 2 * 2 * block_kv * d)       # q, out; k, v (x2 buffers)
    return blocks + 4 * block_q * d + 2 * 4 * block_q * 128 + 2 * 4 * block_q * bkc


def splash_time_s(chip: "str | ChipModel", q_len: int, kv_len: int, heads: int, head_dim: int,
                  batch: int, block_q: int, block_kv: int, block_kv_compute: int | None = None,
                  mask_density: float = 1.0) -> float:
    """Seconds of one splash attention forward call (``splash_mha_fwd``) on one chip.

    Grid: ``batch x heads x ceil(q_len / block_q) x kv_steps`` with
    ``kv_steps = ceil(mask_density x kv_len / block_kv)`` (the blocks the mask leaves; splash
    skips fully masked blocks, and a causal mask has density about one half). One step loads a
    (block_kv x head_dim) key block and value block (bf16), and in ``block_kv / block_kv_compute``
    sub-steps computes S = q k^T (block_q x head_dim x block_kv_compute), the online softmax on S
    (``SPLASH_VPU_OPS_PER_SCORE`` vector ops and ``SPLASH_EUP_OPS_PER_SCORE`` exp per score, plus
    ``SPLASH_MASK_VPU_OPS_PER_SCORE`` on the fraction of blocks the mask cuts through: 0 for a
    full mask, else ``min(1, SPLASH_PARTIAL_BLOCKS_PER_ROW / kv_steps)``) and
    o += P v (block_q x block_kv_compute x head_dim), with the accumulator's rescale per step. The q block (bf16) is loaded when the q
    block changes, the output written once per q block. Lengths are per shard (what one device
    sees). Tiles change the time through MXU padding of head_dim, the per-step overhead (many
    small blocks pay it more often) and the balance of DMA against compute per step; blocks whose
    working set (``splash_vmem_bytes``) exceeds the core's VMEM raise ValueError."""
    ch = chip_model(chip) if isinstance(chip, str) else chip
    for name, v in (("q_len", q_len), ("kv_len", kv_len), ("heads", heads), ("head_dim", head_dim),
                    ("batch", batch), ("block_q", block_q), ("block_kv", block_kv)):
        if int(v) < 1:
            raise ValueError(f"splash_time_s: {name} must be >= 1, got {v}")
    if not 0.0 < mask_density <= 1.0:
        raise ValueError(f"splash_time_s: mask_density must be in (0, 1], got {mask_density}")
    bkc = int(block_kv_compute or block_kv)
    bq, bkv = min(block_q, q_len), min(block_kv, kv_len)
    vmem = splash_vmem_bytes(head_dim, bq, bkv, min(bkc, bkv))
    if vmem > ch.vmem_bytes:
        raise ValueError(f"splash_time_s: blocks {bq}x{bkv} need {vmem / 2**20:.0f} MiB of VMEM, "
                         f"more than the {ch.vmem_bytes / 2**20:.0f} MiB of a {ch.name} core")
    q_blocks = math.ceil(q_len / bq)
    kv_steps = max(1, math.ceil(mask_density * math.ceil(kv_len / bkv)))
    steps = batch * heads * q_blocks * kv_steps
    sub = max(1, math.ceil(bkv / bkc))
    scores = bq * bkv
    partial_fraction = 0.0 if mask_density >= 1.0 else min(
        1.0, SPLASH_PARTIAL_BLOCKS_PER_ROW / kv_steps)
    acc = sub * bq * padded(head_dim, 128)
    work = StepWork(
        mxu_flops=sub * (matmul_flops(bq, head_dim, bkc, ch) + matmul_flops(bq, bkc, head_dim, ch)),
        vpu_ops=(SPLASH_VPU_OPS_PER_SCORE + partial_fraction * SPLASH_MASK_VPU_OPS_PER_SCORE)
        * scores + SPLASH_VPU_OPS_PER_ACC * acc,
        eup_ops=SPLASH_EUP_OPS_PER_SCORE * scores + SPLASH_EUP_OPS_PER_ACC * acc,
        dma_bytes=2 * bkv * head_dim * 2 + (2 * bq * head_dim * 2) / kv_steps,
        first_bytes=(bq + 2 * bkv) * head_dim * 2)
    return kernel_time(ch, steps, work, parallel_split=True).seconds
