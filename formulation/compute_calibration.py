"""The compute of every op but attention, calibrated on compiled programs: the planner's third
feedback into the sharding ILP (besides the effective bandwidth per axis and the attention
compute of ``formulation.attention_calibration``).

Q1 prices each op unfused: ``max(flops / peak, bytes / HBM bandwidth)`` with every op reading its
operands and writing its results (``formulation.strategies``). The compiler fuses the
elementwise chains, norms and converts around the matmuls, so Q1's compute is high by a factor
that barely depends on the layout (about 2x on the example in benchmarks/results/lab_notes.md).
Too high a compute price
makes communication look cheap next to it: the ILP then trades compute it overprices for
communication the compiled program pays in full.

For compiled ILP candidates ``c`` (their choices are known; seeds are not):

    T[c]  = the compiled program's compute per step (Q2's ``compute_s``) minus its attention
            nodes' compiled compute (``compiled_attention_seconds``), seconds
    Q[c]  = Q1's compute of every group but the attention groups under c's choice, unscaled
            (the ILP's ``other_compute_s`` over the scale ``sigma_c`` it was solved with)

    sigma = sum_c T[c] / sum_c Q[c]                    (pooled over every mesh and iteration)

The ILP then prices the compute of every op but attention at ``sigma`` times Q1's
(``Options.compute_scale``). Approximations: one factor for the whole program, whatever the op,
the mesh or the shard shape (it fixes the level of compute against communication, not the
ranking of two layouts' compute); the few ops that join an attention node's group in the ILP
(e.g. its output's reshape) are in T[c] but not in Q[c].
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable


@dataclasses.dataclass
class ComputeSample:
    """One compiled ILP candidate: Q1's non-attention compute against the compiler's."""
    q1_s: float              # Q[c], seconds per step, unscaled
    compiled_s: float        # T[c], seconds per step
    candidate: str = ""      # which candidate it came from, for the record

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def compute_sample(other_compute_s: float, scale_used: float, compiled_compute_s: float,
                   compiled_attention_s: float, candidate: str = "") -> ComputeSample | None:
    """The sample of one candidate (module docstring), or None when either side is not positive.
    other_compute_s: the ILP's ``predicted["other_compute_s"]`` solved with ``scale_used``."""
    q = other_compute_s / scale_used if scale_used > 0 else 0.0
    t = compiled_compute_s - compiled_attention_s
    if not (q > 0 and t > 0 and math.isfinite(q) and math.isfinite(t)):
        return None
    return ComputeSample(q, t, candidate)


def fit_compute_scale(samples: Iterable[ComputeSample]) -> float | None:
    """sigma (module docstring), or None without samples."""
    samples = list(samples)
    q = sum(s.q1_s for s in samples)
    t = sum(s.compiled_s for s in samples)
    return t / q if samples and q > 0 else None
