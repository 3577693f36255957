"""A deterministic work budget for the CP-SAT solves of one placement (``solvers.placement``).

A wall-clock limit makes what CP-SAT finds depend on the machine's speed and load: the same
instance and seed can give different placements from one run to the next
(benchmarks/results/lab_notes.md).

So the budget is counted in CP-SAT's deterministic time (``CpSolver.deterministic_time``: a
count of work, in "deterministic seconds"; with one worker, or with ``interleave_search``, the
same model, parameters and seed stop at the same point on any machine), and the clock only
guards it. Names as in the code:

    work        = time_limit_s * WORK_PER_S        the placement's whole budget
    used        = sum of deterministic_time over the solves
                  + sum of charge_seconds(est_s) * WORK_PER_S over the Python steps,
                    each charged at its *estimated* cost (a function of the model's size,
                    not of the clock)
    left        = max(0, work - used)
    a solve     : max_deterministic_time = min(asked, left),
                  max_time_in_seconds    = wall_deadline - now   (the guard)
    wall_deadline = start + time_limit_s * WALL_CAP

``WORK_PER_S``: CP-SAT's deterministic seconds per second of one core here (fitted on one
placement instance: benchmarks/results/lab_notes.md), so that on an idle machine the solves and
the Python steps together
take about the limit. A share of the budget (the split proof, the decomposition bound) is a
child budget (``child``): its work is a part of what is left, and what it uses is charged to
its parent too.

Where the guard stops a solve before its work (a machine several times slower, or loaded),
``wall_cut`` records it, on the root budget: the result may then depend on the clock, and the
planner lists it in ``Plan.time_limited``.
"""

from __future__ import annotations

import dataclasses

from ortools.sat.python import cp_model

from aoizora.solvers.budget import Budget, clock

# CP-SAT deterministic seconds per second of the limit (module docstring).
WORK_PER_S = 0.4
# The clock's guard, as a multiple of the limit.
WALL_CAP = 1.5
_DONE = (cp_model.OPTIMAL, cp_model.INFEASIBLE)


@dataclasses.dataclass
class WorkBudget:
    work: float                                  # deterministic seconds this budget may spend
    wall_deadline: float                         # a clock() value: the guard
    used: float = 0.0
    wall_cut: list[str] = dataclasses.field(default_factory=list)   # what the guard stopped
    parent: "WorkBudget | None" = dataclasses.field(default=None, repr=False)

    @classmethod
    def for_limit(cls, time_limit_s: float, start: float | None = None) -> "WorkBudget":
        """The budget of a placement with `time_limit_s` seconds, starting at `start`
        (a ``solvers.budget.clock()`` value; default now)."""
        start = clock() if start is None else float(start)
        return cls(work=float(time_limit_s) * WORK_PER_S,
                   wall_deadline=start + float(time_limit_s) * WALL_CAP)

    @classmethod
    def of(cls, budget: Budget) -> "WorkBudget":
        """The work budget of a share of the planning run's budget (``solvers.budget``): its
        seconds, from its start."""
        return cls.for_limit(budget.total_s, budget.start)

    def root(self) -> "WorkBudget":
        b = self
        while b.parent is not None:
            b = b.parent
        return b

    def left(self) -> float:
        return max(0.0, self.work - self.used)

    def wall_left(self) -> float:
        return self.wall_deadline - clock()

    def child(self, work: float) -> "WorkBudget":
        """A share of what is left (at most `work`), charged to this budget as it is used."""
        return WorkBudget(work=max(0.0, min(float(work), self.left())),
                          wall_deadline=self.wall_deadline, parent=self)

    def charge(self, work: float) -> None:
        b = self
        while b is not None:
            b.used += float(work)
            b = b.parent

    def charge_seconds(self, est_s: float) -> None:
        """A Python step, at its estimated cost (seconds of the limit)."""
        self.charge(float(est_s) * WORK_PER_S)

    def affords_seconds(self, est_s: float) -> bool:
        """Whether `est_s` estimated seconds of the limit fit in what is left (and the guard
        has that much of the clock left)."""
        return self.left() >= float(est_s) * WORK_PER_S and self.wall_left() >= 0.0

    def limit(self, solver: cp_model.CpSolver, work: float | None = None) -> float:
        """Set `solver`'s limits for a solve of `work` (default: all that is left); returns the
        deterministic limit set."""
        w = self.left() if work is None else max(0.0, min(float(work), self.left()))
        w = max(w, 1e-3)
        solver.parameters.max_deterministic_time = w
        solver.parameters.max_time_in_seconds = max(0.01, self.wall_left())
        return w

    def note_wall_cut(self, what: str) -> None:
        """Record, once, on the root budget, that the clock's guard stopped `what`."""
        cut = self.root().wall_cut
        if what not in cut:
            cut.append(what)

    def account(self, solver: cp_model.CpSolver, status: int, what: str) -> None:
        """Charge a finished solve; record `what` when the clock's guard, not the work,
        stopped it."""
        d = float(solver.deterministic_time)
        self.charge(d)
        p = solver.parameters
        # CP-SAT stops a hair below its deterministic limit (1.0 of 1.0004 seen), and can pass
        # its wall limit in presolve: the guard stopped it when the work was well short and
        # the clock was out
        if (status not in _DONE and d < p.max_deterministic_time * 0.99
                and solver.wall_time >= p.max_time_in_seconds * 0.95):
            self.note_wall_cut(what)

    def to_json(self) -> dict:
        return {"work": self.work, "used": self.used, "work_per_s": WORK_PER_S,
                "wall_cap": WALL_CAP, "wall_cut": list(self.wall_cut)}
