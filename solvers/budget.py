"""One time budget for a planning run: one clock, one table of shares.

The clock is ``time.perf_counter`` (seconds), the only one the planner reads. ``plan()`` makes
one ``Budget`` of ``time_budget_s`` seconds; every limit the loop hands a solver is a named
share of it, made when the step starts (``Budget.child(name, asked_s)``), in seconds:

    left       = deadline - clock()
    base       = fraction * (total_s if of_total else left - margin_s)
    seconds    = max(floor_s, min(base, cap_s, asked * asked_s))

(``asked_s``: what the caller asks for the step, e.g. ``plan(placement_time_s=...)``; ``asked``
None: no such cap). The table, ``SHARES`` (names as in the code):

    name           fraction of     asked (cap)      floor  cap    margin least  what
    ilp            0.4      left   -                -      -      -      -      an iteration's ILPs
                                                                                and seed refinements
    ilp_solve      1.0      left   ilp_time_s       1.0 s  -      -      -      one ILP or
                                                                                refinement (of ilp)
    placement      0.25     left   placement_time_s 0.5 s  -      -      -      one placement
    step_choice    0.1      left   0.3 x pl.        0.5 s  -      -      -      its swap descent
    reserve        0.1      total  2 x pl.          -      -      -      -      kept from compiles
    annealing      1.0      left   its run's budget -      -      1.0 s  0.5 s  a final annealing
    final_descent  1.0      left   -                0.2 s  2.0 s  -      -      its swap descent
    incumbent      0.1      total  -                -      -      -      -      an ILP's start
    feasibility    0.33     left   -                -      -      -      -      a fitting layout
                                                                                and remat, first

(pl.: ``placement_time_s``.) ``reserve``: no compile starts into it while the best placement is
unproven (that candidate's placement, then the final annealing's first run; ``aoizora.
final_annealing``). ``incumbent``: a sharding solve's coordinate-descent start
(``solvers.sharding.solve_model``), of that solve's limit. ``feasibility``: with remat
decisions and no rounding that fits, the zero-objective MIP that finds one (``solve_model``). ``least_s``: below it the step does
not start (``affords``). Two margins decide whether a compile starts (``MARGINS``):
``compile``: 1.2 x the longest a compile took alone + 1.0 s must fit before the deadline less
the reserve (``count``); ``verify``: 1.2 x + 0.5 s for the re-compile of the plan in its device
order (``fits``).

What the solvers count in other units derives from a share's seconds:
  - CP-SAT's work (``solvers.work_budget``): ``work = seconds * WORK_PER_S`` deterministic
    seconds, the clock guarding it at ``start + seconds * WALL_CAP`` (``WorkBudget.of(budget)``;
    the placement solver makes it from the float limit it is given, ``WorkBudget.for_limit``);
  - a placement heuristic's evaluations (``solvers.placement_heuristics.evaluation_budget``):
    ``EVALUATIONS_PER_S * seconds`` of the share asked, so that the clock only caps it.

A budget may also hold a number of compiles (``Budget(..., compiles=N)``; ``plan(...,
compiles=N)``, ``aoizora plan --compiles N``): then the compile queue starts a candidate's compile
only while fewer than N have run (``compiles_left``), and the seconds are a guard, as above, that
stops the run on a machine slower than expected. A count does not depend on the machine's speed
or load: with the same inputs, seed and N, the same compiles run (where the clock's guard does
not bind, which ``Plan.time_limited`` lists). Shares stay in seconds; only compiles are counted.

One clock: every deadline in the planner and its solvers is a ``clock()`` value. The exception
is the HiGHS worker process (``solvers.mip_run``), which is handed its deadline on the epoch
clock (``time.time()``): ``perf_counter``'s reference point is undefined across processes.
"""

from __future__ import annotations

import dataclasses
import math
import time


def clock() -> float:
    """The planner's one clock: ``time.perf_counter()``, seconds (looked up at each call, so a
    test that slows ``time.perf_counter`` slows every budget)."""
    return time.perf_counter()


class BudgetShareError(KeyError):
    """A share the table does not name."""


@dataclasses.dataclass(frozen=True)
class Share:
    """One row of the table (module docstring: ``seconds``)."""

    fraction: float
    asked: float | None = None       # multiple of the caller's asked seconds that caps it
    floor_s: float = -math.inf
    cap_s: float = math.inf
    margin_s: float = 0.0            # kept back from the time left before the fraction
    of_total: bool = False           # a fraction of the budget's total, not of its time left
    least_s: float = 0.0             # below this, the step is not started

    def available_s(self, left: float, total: float) -> float:
        """The base before caps and floor: ``fraction`` of the total or of ``left - margin_s``."""
        return self.fraction * (total if self.of_total else left - self.margin_s)

    def seconds(self, left: float, total: float, asked_s: float | None = None) -> float:
        s = min(self.available_s(left, total), self.cap_s)
        if self.asked is not None and asked_s is not None:
            s = min(s, self.asked * float(asked_s))
        return max(self.floor_s, s)


@dataclasses.dataclass(frozen=True)
class Margin:
    """A step of ``expected_s`` starts when ``factor * expected_s + plus_s`` fits."""

    factor: float
    plus_s: float

    def need_s(self, expected_s: float) -> float:
        return self.factor * float(expected_s) + self.plus_s


SHARES: dict[str, Share] = {
    "ilp": Share(0.4),
    "ilp_solve": Share(1.0, asked=1.0, floor_s=1.0),
    "placement": Share(0.25, asked=1.0, floor_s=0.5),
    "step_choice": Share(0.1, asked=0.3, floor_s=0.5),
    "reserve": Share(0.1, asked=2.0, of_total=True),
    "annealing": Share(1.0, asked=1.0, margin_s=1.0, least_s=0.5),
    "final_descent": Share(1.0, floor_s=0.2, cap_s=2.0),
    "incumbent": Share(0.1, of_total=True),
    "feasibility": Share(0.33),
}

MARGINS: dict[str, Margin] = {
    "compile": Margin(1.2, 1.0),
    "verify": Margin(1.2, 0.5),
}


def share(name: str) -> Share:
    """The table's row ``name``; BudgetShareError names the known ones otherwise."""
    try:
        return SHARES[name]
    except KeyError:
        raise BudgetShareError(f"no budget share {name!r}; known: {', '.join(SHARES)}") from None


class Budget:
    """``total_s`` seconds of ``clock`` from ``start`` (default now): ``deadline = start +
    total_s``. ``child(name, asked_s)`` is the named share of it, a Budget of its own starting
    now (in seconds only); ``extend(s)`` moves the deadline (a step that waited keeps its share).
    ``compiles``: at most that many candidate compiles (None: the seconds decide alone; module
    docstring); ``compiles_left(done)`` says how many remain after ``done``.

    Raises:
        ValueError: ``compiles`` is not a whole number of 1 or more.
    """

    def __init__(self, total_s: float, start: float | None = None, name: str = "plan",
                 compiles: int | None = None):
        self.start = clock() if start is None else float(start)
        self.total_s = float(total_s)
        self.deadline = self.start + self.total_s
        self.name = name
        if compiles is not None and (isinstance(compiles, bool) or int(compiles) != compiles
                                     or compiles < 1):
            raise ValueError(f"compiles={compiles!r}: give a whole number of compiles, 1 or more")
        self.compiles = None if compiles is None else int(compiles)

    def compiles_left(self, done: int) -> int | None:
        """Compiles the count still allows after ``done`` have run (None: no count)."""
        return None if self.compiles is None else max(0, self.compiles - int(done))

    @classmethod
    def until(cls, deadline: float, start: float | None = None, name: str = "plan") -> "Budget":
        """The budget from ``start`` (default now) to ``deadline`` (a ``clock`` value)."""
        start = clock() if start is None else float(start)
        return cls(float(deadline) - start, start, name)

    def left(self) -> float:
        return self.deadline - clock()

    def elapsed(self) -> float:
        return clock() - self.start

    def over(self) -> bool:
        """The deadline has passed."""
        return clock() > self.deadline

    def share_s(self, name: str, asked_s: float | None = None) -> float:
        """The seconds of share ``name`` now (module docstring)."""
        return share(name).seconds(self.left(), self.total_s, asked_s)

    def child(self, name: str, asked_s: float | None = None) -> "Budget":
        """Share ``name`` as a budget of its own, from now."""
        now = clock()
        s = share(name).seconds(self.deadline - now, self.total_s, asked_s)
        return Budget(s, now, name)

    def affords(self, name: str) -> bool:
        """Whether share ``name`` has at least its ``least_s`` now."""
        sh = share(name)
        return sh.available_s(self.left(), self.total_s) >= sh.least_s

    def extend(self, seconds: float) -> None:
        self.deadline += float(seconds)
        self.total_s += float(seconds)

    def count(self, margin: str, expected_s: float, reserve_s: float = 0.0) -> int:
        """How many steps of ``expected_s`` fit, each with ``MARGINS[margin]``, before the
        deadline less ``reserve_s``."""
        left = self.left() - reserve_s
        return max(0, int(left // MARGINS[margin].need_s(expected_s)))

    def fits(self, margin: str, expected_s: float) -> bool:
        """Whether one step of ``expected_s`` with ``MARGINS[margin]`` fits before the deadline
        (strictly)."""
        return self.left() > MARGINS[margin].need_s(expected_s)

    def __repr__(self) -> str:
        count = "" if self.compiles is None else f", {self.compiles} compiles"
        return f"Budget({self.name}: {self.total_s:.3f} s{count}, {self.left():.3f} s left)"
