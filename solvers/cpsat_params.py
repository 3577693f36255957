"""The CP-SAT settings every placement solve shares (``solvers.placement``, its decomposition
bound and ``solvers.placement_split``'s pinned models), and the build-cost estimates that decide
whether a model is worth building within a work budget (``solvers.work_budget``).

Deterministic: a fixed ``num_workers`` and ``random_seed``; with several workers OR-Tools'
interleaved search (``interleave_search``), with one the search is deterministic as it is.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from aoizora.formulation.placement_cpsat import PlacementModel
from aoizora.solvers.stop import cancel_on_stop

# Model building time per estimated variable (measured here: v5e-64's 226k-variable circuit model
# 6.1 s, v5e-16's 13k 0.3-0.5 s, under load 4) and the least solve time worth a build: with less
# time left the incumbent is returned without building.
BUILD_S_PER_VARIABLE = 3e-5
MIN_SOLVE_S = 0.5
# CP-SAT's status codes by name (MODEL_INVALID reads as UNKNOWN: no answer).
STATUS_NAMES = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
                cp_model.INFEASIBLE: "INFEASIBLE", cp_model.UNKNOWN: "UNKNOWN",
                cp_model.MODEL_INVALID: "UNKNOWN"}


def set_search_params(solver: cp_model.CpSolver, seed: int, workers: int, deterministic: bool,
                      log: bool, linearization: int = 0) -> None:
    """The search settings every placement solve shares; its limits come from its work budget
    (``WorkBudget.limit``)."""
    p = solver.parameters
    p.num_workers = int(workers)
    p.random_seed = int(seed)
    # One worker is deterministic as it is; several need OR-Tools' interleaved search.
    p.interleave_search = bool(deterministic) and int(workers) > 1
    p.log_search_progress = bool(log)
    # Probing in presolve adds millions of binary clauses on the set formulation for no gain;
    # the LP relaxation of max link loads is weak and slows the search (measured: 4x4 proven
    # in seconds without it, not in 60 s with it).
    p.cp_model_probing_level = 0
    p.linearization_level = int(linearization)


def solve(solver: cp_model.CpSolver, model: cp_model.CpModel, callback=None) -> int:
    """``solver.Solve(model, callback)``, stopped early by the run's stop request
    (``solvers.stop``: an interrupt calls ``StopSearch`` from the signal watcher's thread).
    CP-SAT's own SIGINT handler is off: it would swallow the Ctrl-C (the search stopped as
    FEASIBLE and the planner not told), so the planner's handler sees it instead."""
    solver.parameters.catch_sigint_signal = False
    with cancel_on_stop(solver.StopSearch, "a placement CP-SAT search (stopped early)"):
        return solver.Solve(model, callback) if callback is not None else solver.Solve(model)


def solution_chips(solver: cp_model.CpSolver, pm: PlacementModel) -> list[int]:
    """The chip of each rank in the solver's solution of `pm`: the c with x[r][c] true."""
    out = []
    for r in range(pm.R):
        for c in range(pm.C):
            if solver.BooleanValue(pm.x[r][c]):
                out.append(c)
                break
    return out
