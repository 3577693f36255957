"""Seconds of compiled compute: one op, the whole program, and any span of the schedule.

    t_o   = estimated_cycles_o / clock_hz                  when the compiler gave cycles
          = splash_seconds(shape_o, tiles_o, chip)          for a splash attention forward kernel
            whose tiles and per-shard shapes the evidence read (``ComputeOp.kernel``): the kernel
            model of ``formulation.kernel_model`` (tile efficiency, padding, per-step overhead)
          = dq_seconds / dkv_seconds(shape_o, tiles_o, chip) for its backward kernels (dq, dk/dv,
            fused or not: ``formulation.splash_backward_model``)
          = max(flops_o / peak_flops, bytes_o / hbm_bandwidth)   otherwise (another opaque
            custom call)
    compute_s = sum_o count_o * t_o

    span(s, d, n) = sum over compute ops o scheduled strictly inside (s < index_o < d) of
                    (count_o / n) * t_o
            (seconds per run of a phase of count n: the compute async collectives started at s
            and done by d can hide behind; ``ScheduleSpans``)

A span prices its ops exactly as ``compute_s`` prices them. The evidence's own
``overlap_cycles_c`` counts only the ops the compiler gave cycles for, so a window around an
opaque kernel (a ring attention's permutes around the splash kernel) is short by the kernel.
This module has no jax import (formulation layer).
"""

from __future__ import annotations

import bisect

import numpy as np

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.kernel_model import (KernelModelError, SplashShape, kernel_chip,
                                              splash_seconds)
from aoizora.formulation.splash_backward_model import dkv_seconds, dq_seconds


def splash_op_seconds(kernel: dict, generation: str, network: Network,
                      clock_hz: float) -> float | None:
    """One run of a splash kernel op (forward, dq or dk/dv: ``kernel["kind"]``) by the kernel
    models; None when they cannot price it (unknown generation, no chip numbers, incomplete
    kernel info)."""
    try:
        chip = kernel_chip(generation, network.peak_flops, network.hbm_bandwidth_Bps, clock_hz)
        shape = SplashShape(kernel["lead"], kernel["lq"], kernel["lkv"], kernel["head_dim"],
                            kernel.get("dtype_bytes", 2))
        kind = kernel.get("kind", "fwd")
        if kind == "dq":
            return dq_seconds(shape, kernel["block_q"], kernel["block_kv"], chip)
        if kind == "dkv":
            return dkv_seconds(shape, kernel["block_q"], kernel["block_kv"],
                               kernel["block_kv_compute"], chip, bool(kernel.get("fused")))
        return splash_seconds(shape, kernel["block_q"], kernel["block_kv"],
                              kernel["block_kv_compute"], chip)
    except (KernelModelError, KeyError):
        return None


def op_seconds(op, evidence: Evidence, network: Network) -> float | None:
    """One run of compute op ``op``, seconds (``t_o``); None when it has neither cycles nor a
    chip peak to price its flops / bytes with."""
    if op.estimated_cycles is not None and evidence.clock_hz > 0:
        return op.estimated_cycles / evidence.clock_hz
    if getattr(op, "kernel", None):
        t = splash_op_seconds(op.kernel, evidence.generation, network,
                              evidence.clock_hz)
        if t is not None:
            return t
    parts = []
    if op.flops and network.peak_flops > 0:
        parts.append(op.flops / network.peak_flops)
    if op.bytes and network.hbm_bandwidth_Bps > 0:
        parts.append(op.bytes / network.hbm_bandwidth_Bps)
    if (op.flops or op.bytes) and not parts:
        return None
    return max(parts, default=0.0)


def compute_seconds(evidence: Evidence, network: Network) -> tuple[float, list[str]]:
    """``compute_s`` (seconds) and warnings for ops that could not be priced (priced 0 s)."""
    total = 0.0
    warns = []
    for op in evidence.compute:
        t = op_seconds(op, evidence, network)
        if t is None:
            warns.append(f"compute op {op.name}: no cycles and no chip peak numbers; priced 0 s")
            t = 0.0
        total += op.count * t
    return total, warns


class ScheduleSpans:
    """Compute scheduled strictly inside a span of the schedule, seconds per run.

        span(s, d, n) = sum over compute ops o with s < index_o < d of (count_o / n) * t_o

    (``t_o`` as ``compute_s`` prices it). ``empty`` when the evidence carries no schedule
    positions (every span is then 0)."""

    def __init__(self, evidence: Evidence, network: Network):
        ops = sorted(evidence.compute, key=lambda o: o.index)
        self.empty = not ops or not any(o.index for o in ops)
        self._idx = [int(o.index) for o in ops]
        self._pre = np.concatenate([[0.0], np.cumsum(
            [o.count * (op_seconds(o, evidence, network) or 0.0) for o in ops])])

    def seconds(self, start: int, done: int, count: int) -> float | None:
        """span(start, done, count); None when no compute op lies strictly inside."""
        lo = bisect.bisect_right(self._idx, int(start))
        hi = bisect.bisect_left(self._idx, int(done))
        if hi <= lo:
            return None
        return float(self._pre[hi] - self._pre[lo]) / max(int(count), 1)

