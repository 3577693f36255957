"""The decomposition bound of the placement problem: each phase solved alone.

The level-1 objective comm = sum_p count_p * max(0, T_p - O_p) is separable over phases p
(``formulation.placement_bounds``), so any lower bound of min M[p] (phase p's most loaded link,
in model units) gives a bound of the whole:

    dec_s = sum_p count_p * max(0, lbM[p] * unit_bytes / W - O_p).

Phase p alone is the evidence restricted to its collectives: a small CP-SAT model min M[p]
(formulation "auto": the exact "sets" model where it is small, scope = every placement, else
"circuit"). Its proven bound b, when larger than the analytic lbM[p], replaces it
(``PlacementModel.add_phase_bound``: also the constraint M[p] >= b of the joint model ``pm``)
when its scope contains the joint model's. Phases run alone only where the incumbent loads them
above lbM[p] and they are exposed, in decreasing order of the gain
count_p * (exposed_s(incumbent) - max(0, lbM[p] * unit_bytes / W - O_p)); each gets an equal
part of the work left (``solvers.work_budget``), after its build is charged at
``BUILD_S_PER_VARIABLE`` per estimated variable.
"""

from __future__ import annotations

import dataclasses
import time
from fractions import Fraction
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.placement_cpsat import SCOPE_SETS, PlacementModel, estimated_variables
from aoizora.solvers.cpsat_params import (BUILD_S_PER_VARIABLE, MIN_SOLVE_S, STATUS_NAMES,
                                          set_search_params, solve)
from aoizora.solvers.placement_result import chips_to_devices, model_places
from aoizora.solvers.work_budget import WORK_PER_S, WorkBudget

# The least work (CP-SAT deterministic seconds) worth starting a phase with.
MIN_PHASE_WORK_S = 0.2


def decomposition_bound(evidence: Evidence, network: Network, time_limit_s: float = 10.0,
                        seed: int = 0, hint: Sequence[int] | None = None,
                        formulation: str = "auto") -> tuple[float, str, list[dict]]:
    """The decomposition bound alone (module docstring): (seconds of exposed communication that
    no placement in `scope` beats, scope, per-phase rows). Phases are solved alone only where
    `hint` (default: device order 0..n-1) loads them above their analytic bound; the others
    keep the analytic bound."""
    budget = WorkBudget.for_limit(time_limit_s)
    pm = PlacementModel(evidence, network, formulation=formulation)
    p = np.arange(network.num_devices) if hint is None else np.asarray(hint, dtype=np.int64)
    return phase_decomposition(pm, model_places(network, p), seed, budget, True, False)


def _phases_to_solve(pm: PlacementModel, hint_chips) -> list[tuple[float, int]]:
    """(gain, p) of the phases the incumbent `hint_chips` loads above lbM[p] and leaves exposed,
    largest gain first (module docstring)."""
    tm = pm.traffic
    inc_loads = tm.phase_loads(chips_to_devices(pm.net, hint_chips))
    todo = []
    for p, (key, pl) in enumerate(zip(tm.phases, inc_loads)):
        lb_bytes = pm.lbM[p] * pm.unit_bytes
        inc_bytes = float(pl.link_bytes.max()) if len(pl.link_bytes) else 0.0
        if inc_bytes <= float(lb_bytes) * (1 + 1e-12) or pl.exposed_s <= 0:
            continue
        gain = key.count * (pl.exposed_s - max(0.0, float(lb_bytes) / pm.bandwidth
                                               - tm.overlap_s[p]))
        todo.append((gain, p))
    todo.sort(reverse=True)
    return todo


def phase_decomposition(pm: PlacementModel, hint_chips, seed: int, budget: WorkBudget,
                        symmetry_breaking: bool, log: bool) -> tuple[float, str, list[dict]]:
    """The decomposition bound of the joint model `pm` (module docstring) from the incumbent
    `hint_chips` (chip per rank), within `budget`; adds each proven phase bound to `pm`.
    Returns (dec_s seconds, its scope, one row per phase tried)."""
    tm = pm.traffic
    todo = _phases_to_solve(pm, hint_chips)
    rows = []
    scope = SCOPE_SETS
    for i, (gain, p) in enumerate(todo):
        if not budget.affords_seconds(MIN_PHASE_WORK_S):
            if budget.left() >= MIN_PHASE_WORK_S * WORK_PER_S:   # work left, the clock's guard out
                budget.note_wall_cut("the decomposition bound")
            rows.append({"phase": tm.phases[p].phase, "skipped": "decomposition time used up"})
            continue
        key = tm.phases[p]
        sub_ev = dataclasses.replace(pm.ev, collectives=list(tm.phase_collectives[p]))
        _, sub_vars = estimated_variables(sub_ev, pm.net, "auto")
        if not budget.affords_seconds(sub_vars * BUILD_S_PER_VARIABLE + MIN_SOLVE_S):
            rows.append({"phase": key.phase, "skipped": f"~{sub_vars:,} variables: no time to "
                                                        "build the phase's model"})
            continue
        budget.charge_seconds(sub_vars * BUILD_S_PER_VARIABLE)
        work = budget.left() / (len(todo) - i)
        t1 = time.perf_counter()
        try:
            sub = PlacementModel(sub_ev, pm.net, formulation="auto",
                                 symmetry_breaking=symmetry_breaking)
        except Exception as e:  # noqa: BLE001 -- a phase that cannot be modelled alone: no bound
            rows.append({"phase": key.phase, "skipped": str(e).splitlines()[0][:120]})
            continue
        sub.model.Minimize(sub.M[0])
        sub.add_hint(hint_chips)
        s = cp_model.CpSolver()
        set_search_params(s, seed, 1, True, log)
        budget.limit(s, work)
        st = solve(s, sub.model)
        budget.account(s, st, "the decomposition bound")
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            b_bytes = Fraction(int(round(s.BestObjectiveBound()))) * sub.unit_bytes
            row = {"phase": key.phase, "count": key.count, "status": STATUS_NAMES.get(st),
                   "formulation": sub.formulation, "bound_bytes": float(b_bytes),
                   "analytic_bytes": float(pm.lbM[p] * pm.unit_bytes),
                   "time_s": time.perf_counter() - t1}
            if b_bytes > pm.lbM[p] * pm.unit_bytes:
                if sub.scope == SCOPE_SETS or sub.scope == pm.scope:
                    pm.add_phase_bound(p, b_bytes)
                    if sub.scope != SCOPE_SETS:
                        scope = sub.scope
                    row["used"] = True
            rows.append(row)
    dec = sum(k.count * max(0.0, float(lb * pm.unit_bytes) / pm.bandwidth - O)
              for k, lb, O in zip(tm.phases, pm.lbM, tm.overlap_s))
    return dec, scope, rows
