"""Solve the placement CP-SAT model (``formulation.placement_cpsat``) with a certificate.

Deterministic: fixed ``num_workers`` (default 1: measured fastest here, and deterministic as
it is), ``random_seed``, and ``interleave_search`` when several workers run (OR-Tools'
deterministic multi-worker mode). No LP relaxation by default (``linearization=0``): the LP of
max link loads is weak and slowed every instance measured. A run that ends OPTIMAL gives the same answer every time; a run
cut by the wall-clock limit returns its incumbent, status FEASIBLE, with the proven bound.

Lexicographic objectives: (1) exposed communication seconds, (2) link bytes, (3) flow hops. Level
1 gets the whole time limit; levels 2 and 3 run only after level 1 is proven, each with the
earlier levels fixed at their optimum and the remaining time.

The certificate's objective is Q2's ``communication_s`` recomputed by ``formulation.traffic`` for
the returned placement (seconds); its bound is CP-SAT's best bound of level 1 (seconds), valid
over the model's scope (every placement for the "sets" formulation; connected rings for
"circuit"). ``detail`` holds the model's own objective, units, sizes, notes.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.latency import Q2, predict_step
from aoizora.formulation.placement_cpsat import PlacementModel
from aoizora.solvers.certificate import Certificate

try:
    from ortools import __version__ as _ORTOOLS_VERSION
except Exception:  # pragma: no cover
    _ORTOOLS_VERSION = "?"

SOLVER_NAME = f"CP-SAT {_ORTOOLS_VERSION}"
_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
           cp_model.INFEASIBLE: "INFEASIBLE", cp_model.UNKNOWN: "UNKNOWN",
           cp_model.MODEL_INVALID: "UNKNOWN"}


@dataclasses.dataclass
class PlacementResult:
    placement: list[int] | None          # device index (position in target.devices()) per rank
    certificate: Certificate
    q2: Q2 | None
    trace: list[tuple[float, float]]     # (seconds since start, best objective in seconds)

    def to_json(self):
        return {"placement": self.placement, "certificate": self.certificate.to_json(),
                "q2": self.q2.to_json() if self.q2 else None, "trace": self.trace}


def _factorizations(n: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of n into factors >= 2 (n itself included; () for n == 1)."""
    if n == 1:
        return [()]
    out = []
    for f in range(2, n + 1):
        if n % f == 0:
            for rest in _factorizations(n // f):
                out.append((f,) + rest)
    return out


def axis_order_placements(network: Network, mesh_shape: Sequence[int]) -> list[np.ndarray]:
    """Distinct placements from mapping logical axes onto physical axes / sub-axes in every order."""
    shape = network.shape
    grid = np.empty(shape, dtype=np.int64)
    first_dev = {}
    for d, c in enumerate(network.device_chip):
        first_dev.setdefault(int(c), d)
    if network.num_devices != network.num_chips:
        raise ValueError("axis orders need one device per chip")
    for c, co in enumerate(network.chips):
        grid[co] = first_dev[c]
    mesh_shape = [int(v) for v in mesh_shape]
    out: dict[bytes, np.ndarray] = {}
    for facs in itertools.product(*[_factorizations(s) for s in shape]):
        sizes = [f for fs in facs for f in fs]
        g = grid.reshape(sizes) if sizes else grid.reshape(-1)
        for perm in set(itertools.permutations(range(len(sizes)))):
            ordered = [sizes[i] for i in perm]
            # merge consecutive factors into the logical axes
            i, ok = 0, True
            for m in mesh_shape:
                prod = 1
                while prod < m and i < len(ordered):
                    prod *= ordered[i]
                    i += 1
                if prod != m:
                    ok = False
                    break
            if not ok or i != len(ordered):
                continue
            p = np.transpose(g, perm).reshape(-1)
            out.setdefault(p.tobytes(), p)
    return list(out.values())



class _Trace(cp_model.CpSolverSolutionCallback):
    def __init__(self, pm: PlacementModel, t0: float, trace: list):
        super().__init__()
        self.pm, self.t0, self.trace = pm, t0, trace

    def on_solution_callback(self):
        self.trace.append((time.perf_counter() - self.t0,
                           self.pm.comm_seconds(self.ObjectiveValue())))


def _params(solver: cp_model.CpSolver, limit: float, seed: int, workers: int,
            deterministic: bool, log: bool, linearization: int = 0) -> None:
    p = solver.parameters
    p.max_time_in_seconds = max(0.01, float(limit))
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


def chips_to_devices(network: Network, chip_of_rank: Sequence[int]) -> list[int]:
    dev_of_chip = {int(c): d for d, c in enumerate(network.device_chip)}
    return [dev_of_chip[int(c)] for c in chip_of_rank]


def solve_placement(evidence: Evidence, network: Network, time_limit_s: float = 10.0,
                    seed: int = 0, workers: int = 1, hint: Sequence[int] | None = None,
                    deterministic: bool = True, lexicographic: bool = True,
                    symmetry_breaking: bool = True, formulation: str = "auto",
                    linearization: int = 0, warm_start: bool = True,
                    log: bool = False) -> PlacementResult:
    """Best placement (device index per logical rank) under the CP-SAT model, with a certificate.

    `hint`: a placement to start from (e.g. ``extract.network.default_device_order``); when the
    limit ends before the search reports a solution, the hint is returned as the incumbent.
    `warm_start`: also price the axis-order placements (``axis_order_placements``, milliseconds)
    and hint the best of those and `hint`."""
    t0 = time.perf_counter()
    pm = PlacementModel(evidence, network, formulation=formulation,
                        symmetry_breaking=symmetry_breaking)
    build_s = time.perf_counter() - t0
    if warm_start and network.num_devices == network.num_chips:
        cands = ([np.asarray(hint, dtype=np.int64)] if hint is not None else []) + \
            axis_order_placements(network, list(evidence.mesh_axes.values()))
        hint = min(cands, key=lambda q: pm.traffic.cost(q))
    if hint is not None:
        pm.add_hint(network.device_chip[np.asarray(hint, dtype=np.int64)])
    trace: list[tuple[float, float]] = []
    m = pm.model
    m.Minimize(pm.obj_comm)
    solver = cp_model.CpSolver()
    remaining = time_limit_s - (time.perf_counter() - t0)
    _params(solver, remaining, seed, workers, deterministic, log, linearization)
    st = solver.Solve(m, _Trace(pm, t0, trace))
    status = _STATUS.get(st, "UNKNOWN")
    detail = {"formulation": pm.formulation, "scope": pm.scope, "notes": list(pm.notes), "unit_bytes": pm.unit_bytes,
              "build_s": build_s, "variables": len(m.Proto().variables),
              "constraints": len(m.Proto().constraints), "levels": {}}
    if status not in ("OPTIMAL", "FEASIBLE"):
        bound = (max(0.0, pm.comm_seconds(solver.BestObjectiveBound() - pm.rounding_units))
                 if st != cp_model.INFEASIBLE else None)
        if hint is not None and st != cp_model.INFEASIBLE:
            # the time ran out before the search reported a solution: the hint is the incumbent
            placement = [int(v) for v in hint]
            q2 = predict_step(evidence, placement, network, pm.traffic)
            detail["notes"].append("no solution reported in the time limit: the hint returned")
            detail["model_objective_s"] = None
            cert = Certificate(SOLVER_NAME, "FEASIBLE", q2.communication_s,
                               min(bound, q2.communication_s) if bound is not None else None,
                               time.perf_counter() - t0, "s", seed, workers, time_limit_s, detail)
            return PlacementResult(placement, cert, q2, trace or [(time.perf_counter() - t0,
                                                                   q2.communication_s)])
        cert = Certificate(SOLVER_NAME, status, None, bound, time.perf_counter() - t0, "s", seed,
                           workers, time_limit_s, detail)
        return PlacementResult(None, cert, None, trace)
    bound_units = solver.BestObjectiveBound()
    best = [int(v) for v in _chips(solver, pm)]
    level_vals = {"comm": solver.ObjectiveValue()}
    detail["levels"]["comm"] = {"status": status, "objective_units": solver.ObjectiveValue(),
                                "bound_units": bound_units,
                                "done_at_s": time.perf_counter() - t0}
    if lexicographic and status == "OPTIMAL":
        fixed = [(pm.obj_comm, int(round(solver.ObjectiveValue())))]
        for name, expr in pm.objectives[1:]:
            remaining = time_limit_s - (time.perf_counter() - t0)
            if remaining <= 0.05:
                detail["levels"][name] = {"status": "skipped: no time left"}
                break
            m2 = pm.model.Clone()
            for e, v in fixed:
                m2.Add(e <= v)
            m2.ClearHints()
            for r in range(pm.R):
                for c in range(pm.C):
                    m2.AddHint(pm.x[r][c], best[r] == c)
            m2.Minimize(expr)
            s2 = cp_model.CpSolver()
            _params(s2, remaining, seed, workers, deterministic, log, linearization)
            st2 = s2.Solve(m2)
            stn = _STATUS.get(st2, "UNKNOWN")
            detail["levels"][name] = {"status": stn, "done_at_s": time.perf_counter() - t0}
            if stn in ("OPTIMAL", "FEASIBLE"):
                best = [int(v) for v in _chips(s2, pm)]
                level_vals[name] = s2.ObjectiveValue()
                detail["levels"][name].update(objective=s2.ObjectiveValue(),
                                              bound=s2.BestObjectiveBound())
                fixed.append((expr, int(round(s2.ObjectiveValue()))))
            if stn != "OPTIMAL":
                break
    placement = chips_to_devices(network, best)
    q2 = predict_step(evidence, placement, network, pm.traffic)
    model_obj_s = pm.comm_seconds(level_vals["comm"])
    slack_s = pm.comm_seconds(pm.rounding_units)       # overlap rounding, < 1 unit per run
    detail["overlap_rounding_s"] = slack_s
    tol = 1e-9 * max(abs(q2.communication_s), 1e-12) + slack_s
    detail["model_objective_s"] = model_obj_s
    if abs(model_obj_s - q2.communication_s) > tol:
        detail["notes"].append(
            f"model objective {model_obj_s:.6g} s differs from Q2 {q2.communication_s:.6g} s "
            "(a ring order the model chose differs from the canonical one): not proven")
        if status == "OPTIMAL":
            status = "FEASIBLE"
    cert = Certificate(SOLVER_NAME, status, q2.communication_s,
                       max(0.0, pm.comm_seconds(bound_units) - slack_s),
                       time.perf_counter() - t0, "s", seed, workers, time_limit_s, detail)
    return PlacementResult(placement, cert, q2, trace)


def _chips(solver: cp_model.CpSolver, pm: PlacementModel) -> list[int]:
    out = []
    for r in range(pm.R):
        for c in range(pm.C):
            if solver.BooleanValue(pm.x[r][c]):
                out.append(c)
                break
    return out
