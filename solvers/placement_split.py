"""A proof over every placement by splitting on one group's chip set.

The math and names: ``formulation.placement_split``.

Given the joint model ``pm`` (for its units and items; any formulation) and an incumbent
placement P0 (rank -> chip) with model cost U = MC(P0) (units):

  1. g* = ``split_group(pm)`` and LB(S) for every chip set S of g* (``set_lower_bounds``);
  2. the classes P(S) with LB(S) >= U are closed (no strictly better placement there);
  3. each open class, in increasing LB(S) (ties: lexicographic S), gets the exact pinned model
     ``PlacementModel(evidence, network, formulation="sets", symmetry_breaking=False,
     pin=(g*, S))`` (scope: every placement of P(S)) with the class's bounds
     M[p] >= phase_lb[S][p] and the extra constraint MC <= U - 1, minimising MC: INFEASIBLE
     closes the class; a solution is a strictly better placement (U drops to its cost; OPTIMAL
     closes the class at the new U; classes closed before stay closed, their bounds were >= the
     old U); the open classes share the work budget left (``solvers.work_budget``: CP-SAT's
     deterministic time) in proportion to their room U - LB(S), at least ``MIN_CLASS_WORK``
     each; a time-out leaves it open with the solver's bound
     (FEASIBLE) or LB(S) (UNKNOWN). A class whose pinned model would have more than
     ``PINNED_SETS_CAP`` set variables stays open with LB(S); with more than
     ``MAX_PINNED_CLASSES`` classes below U, every one stays open with LB(S).

Bound over every placement (units): min(U, min_{open S} bound(S)) <= min_P MC(P); when no class
is open it equals U and the incumbent is optimal over every placement (in model units, i.e. up
to the overlap rounding ``pm.rounding_units``, as every CP-SAT certificate here).
One worker, fixed seed: deterministic.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from aoizora.formulation.placement_cpsat import SETS_CAP, PlacementModel
from aoizora.formulation.placement_split import (model_cost_units, set_lower_bounds,
                                                 split_group)
from aoizora.solvers.cpsat_params import set_search_params, solution_chips, solve
from aoizora.solvers.work_budget import WORK_PER_S, WorkBudget

# Set variables a pinned model may have (its "sets" formulation over the classes' k-subsets).
PINNED_SETS_CAP = SETS_CAP
# Classes below the incumbent up to which pinned models are solved; with more, the split stops
# at its lower bounds (min LB(S), valid) and leaves the time to the joint model. v5e-16 with
# Wan 2.1 evidence: 6.
MAX_PINNED_CLASSES = 64
# The least work (CP-SAT deterministic seconds) a pinned class gets: a class just below the
# incumbent closes in about 0.07 (v5e-16, Wan 2.1 14B evidence).
MIN_CLASS_WORK = 0.1


@dataclasses.dataclass
class SplitResult:
    chip_of_rank: list[int]          # the best placement seen (rank -> chip)
    cost_units: int                  # U = MC of it
    bound_units: int                 # valid over every placement
    proven: bool                     # no class left open: U = min over every placement
    group: tuple[int, ...] | None    # g*
    rows: dict                       # counts and per-class records for the certificate's detail


def split_proof(pm: PlacementModel, incumbent: Sequence[int], budget: WorkBudget,
                seed: int = 0, log: bool = False) -> SplitResult | None:
    """Steps 1-3 of the module docstring within `budget` (``solvers.work_budget``: CP-SAT's
    deterministic time, the clock only a guard); None when no group qualifies for the split
    (``formulation.placement_split.split_group``)."""
    t0 = time.perf_counter()
    g = split_group(pm)
    if g is None:
        return None
    best = [int(v) for v in incumbent]
    U = model_cost_units(pm, best)
    sb = set_lower_bounds(pm, g)
    lb_s = time.perf_counter() - t0
    order = [int(i) for i in np.argsort(sb.lb_units, kind="stable") if sb.lb_units[i] < U]
    ranks = list(sb.group)
    n_below = len(order)
    classes = []
    open_bounds: list[int] = []
    if len(order) > MAX_PINNED_CLASSES:          # every class stays open with LB(S)
        open_bounds.append(int(sb.lb_units[order[0]]))
        order = []
    for n, i in enumerate(order):
        S = sb.sets[i]
        lbS = int(sb.lb_units[i])
        row = {"set": list(S), "lb_units": lbS}
        classes.append(row)
        if lbS >= U:                              # U dropped below this class's bound
            row["status"] = "closed by its bound"
            continue
        if not budget.affords_seconds(0.05):
            if budget.left() >= 0.05 * WORK_PER_S:      # work left, the clock's guard out
                budget.note_wall_cut("the split proof")
            row["status"] = "open: no time left"
            open_bounds.append(lbS)
            continue
        sub = PlacementModel(pm.ev, pm.net, formulation="sets", symmetry_breaking=False,
                             pin=(ranks, S))
        n_sets = sum(len(v) for v in sub.y.values())
        if n_sets > PINNED_SETS_CAP:
            row["status"] = f"open: {n_sets:,} set variables"
            open_bounds.append(lbS)
            continue
        if sub.unit_bytes != pm.unit_bytes:
            raise AssertionError("pinned model units differ from the joint model's")
        for p, v in enumerate(sb.phase_lb_units[i]):    # M_p >= its bound over P(S)
            if v > 0:
                sub.model.Add(sub.M[p] >= int(v))
        sub.model.Add(sub.obj_comm <= U - 1)
        sub.model.Minimize(sub.obj_comm)
        solver = cp_model.CpSolver()
        # the open classes share what is left by their room below the incumbent, U - LB(S)
        room = [U - int(sb.lb_units[j]) for j in order[n:] if int(sb.lb_units[j]) < U]
        set_search_params(solver, seed, 1, True, log)
        budget.limit(solver, max(MIN_CLASS_WORK, budget.left() * (U - lbS) / sum(room)))
        st = solve(solver, sub.model)
        budget.account(solver, st, "the split proof")
        row["time_s"] = round(solver.WallTime(), 3)
        row["work"] = round(solver.deterministic_time, 3)
        if st == cp_model.INFEASIBLE:
            row["status"] = "closed: no placement below the incumbent"
        elif st in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            chips = solution_chips(solver, sub)
            U_new = model_cost_units(pm, chips)
            if U_new >= U:                        # the pinned model and MC disagree: not used
                row["status"] = "open: the pinned model's solution is not below the incumbent"
                open_bounds.append(lbS)
                continue
            best, U = chips, U_new
            if st == cp_model.OPTIMAL:
                row["status"] = "closed: better placement, optimal in its class"
            else:
                row["status"] = "open: better placement, time out"
                open_bounds.append(max(lbS, int(np.ceil(solver.BestObjectiveBound()))))
        else:
            row["status"] = "open: time out"
            open_bounds.append(lbS)
    bound = min([U] + open_bounds)
    rows = {"group": list(sb.group), "sets": len(sb.sets), "exact_phases": sb.exact_phases,
            "classes_below_incumbent": n_below, "classes": classes,
            "lower_bounds_s": round(lb_s, 3), "time_s": round(time.perf_counter() - t0, 3)}
    return SplitResult(best, U, bound, not open_bounds, sb.group, rows)
