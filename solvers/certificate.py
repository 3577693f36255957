"""What a solver proves about its answer: status, objective, best bound, gap, time.

Status words follow OR-Tools CP-SAT: OPTIMAL (proven), FEASIBLE (a solution, not proven optimal:
time limit hit), INFEASIBLE (proven none), UNKNOWN (no solution found in the limit). Heuristics
report FEASIBLE with bound None: they prove nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

STATUSES = ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN")


@dataclasses.dataclass
class Certificate:
    """What one solver run proves about its answer (a plan's ``certificates[name]``).

    Attributes:
      solver: the solver and its version, e.g. ``"CP-SAT 9.15"``, ``"PuLP/CBC"``, ``"HiGHS"``,
        ``"annealing"``.
      status: one of ``STATUSES`` (module docstring).
      objective: the value of the answer returned, in ``unit``; None when none was found.
      bound: the best proven lower bound (minimisation), in ``unit``; None if none.
      time_s: wall-clock seconds the solve took.
      unit: the unit of ``objective`` and ``bound`` (``"s"``: seconds per step).
      seed: the solver's random seed, if it takes one.
      workers: the solver's threads, if set.
      time_limit_s: the time limit it was given, seconds.
      detail: solver-specific records (JSON values).
    """

    solver: str                   # e.g. "CP-SAT 9.15", "PuLP/CBC", "HiGHS", "annealing"
    status: str                   # one of STATUSES
    objective: float | None       # value of the solution returned (units: see `unit`)
    bound: float | None           # best proven lower bound (minimisation), None if none
    time_s: float                 # wall-clock seconds spent solving
    unit: str = "s"               # unit of objective and bound
    seed: int | None = None
    workers: int | None = None
    time_limit_s: float | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def gap(self) -> float | None:
        """Relative gap (objective - bound) / objective, a fraction; 0 when proven optimal, None
        without an objective or a bound."""
        if self.status == "OPTIMAL":
            return 0.0
        if self.objective is None or self.bound is None:
            return None
        if self.objective == 0:
            return 0.0 if self.bound >= 0 else None
        return max(0.0, (self.objective - self.bound) / abs(self.objective))

    @property
    def proven_optimal(self) -> bool:
        """Whether the status is OPTIMAL."""
        return self.status == "OPTIMAL"

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON object, with ``gap``."""
        d = dataclasses.asdict(self)
        d["gap"] = self.gap
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Certificate":
        """The certificate of ``to_json``'s object (``gap`` is recomputed)."""
        d = {k: v for k, v in d.items() if k != "gap"}
        return cls(**d)
