"""Solve the placement CP-SAT model (``formulation.placement_cpsat``) with a certificate.

Deterministic: fixed ``num_workers`` (default 1: measured fastest here, and deterministic as
it is), ``random_seed``, and ``interleave_search`` when several workers run (OR-Tools'
deterministic multi-worker mode). No LP relaxation by default (``linearization=0``): the LP of
max link loads is weak and slowed every instance measured. The time limit is spent as a work
budget in CP-SAT's deterministic time (``solvers.work_budget``: ``time_limit_s * WORK_PER_S``;
the split proof, the decomposition bound and the joint model each take their share of it, and
the Python steps are charged at their estimated cost), so a run gives the same answer, proven
or not, whatever the machine's load; the clock (``WALL_CAP`` times the limit) only guards it,
and ``detail["work"]["wall_cut"]`` names what the guard stopped. A run stopped by its budget
returns its incumbent, status FEASIBLE, with the proven bound. Measured here on an idle machine
with a 10 s limit: 10.8 s (Wan 2.1 1.3B, v5e-16) and 9.1 s (Wan 2.1 14B 720p-41f, v5e-16).

Lexicographic objectives: (1) exposed communication seconds, (2) link bytes, (3) flow hops. Level
1 gets the whole work left; levels 2 and 3 run only after level 1 is proven, each with the
earlier levels fixed at their optimum and the work left.

The certificate's objective is Q2's ``communication_s`` recomputed by ``formulation.traffic`` for
the returned placement (seconds). ``detail`` holds the model's own objective, units, sizes, notes.

Bound (seconds of exposed communication per step; names as in the code). The level-1 objective
comm = sum_p count_p * max(0, T_p - O_p) is separable over phases p, so

    min_P comm(P) >= sum_p count_p * min_P max(0, T_p(P) - O_p)

and any lower bound of each phase's own minimum gives a bound of the whole:
  - ``analytic_s``: per-phase link lower bounds lb[p] that need no solver
    (``formulation.placement_bounds``: cuts and per-chip injection), valid for every placement;
  - the decomposition bound (``_decomposition``): phase p alone (the evidence restricted to its
    collectives) is a small CP-SAT model min M[p] (formulation "auto": the exact "sets" model
    where it is small, scope = every placement, else "circuit"); its proven bound, when larger,
    replaces lb[p] (``PlacementModel.add_phase_bound``: also a constraint M[p] >= it of the joint
    model when its scope contains the joint model's) and
    dec_s = sum_p count_p * max(0, lbM[p] * unit_bytes / W - O_p). Phases run alone only where
    the incumbent loads them above lb[p] and they are exposed, in order of that excess, within
    ``decomposition_share`` of the work budget;
  - ``joint_s``: CP-SAT's best bound of level 1 on the whole model (minus the overlap rounding),
    valid over the model's scope (every placement for "sets"; rings on cycles / paths of links
    for "circuit");
  - ``split_s`` (when the joint model is not "sets" and a ring group g* has at most
    ``SPLIT_SETS_CAP`` chip sets; ``solvers.placement_split``): not separable, a bound of the
    joint minimum over every placement. The placements split by the chip set S of g*; a class
    P(S) is closed by its lower bound LB(S) (``formulation.placement_split``: exact loads of
    g* and its complement, cut bounds) when LB(S) >= the incumbent's model cost U, else by the
    exact pinned "sets" model with MC <= U - 1 (INFEASIBLE, or a better placement);
    split_s = min(U, bounds of the open classes) in seconds minus the overlap rounding. It runs
    first, within ``split_share`` of the work left (each open class gets a part of it in
    proportion to its room below the incumbent, U - LB(S)); it is also a constraint comm >= it of the
    joint model. When no class is left open the incumbent is proven optimal over every
    placement (status OPTIMAL, bound source "split"); without ``lexicographic`` the joint model
    is then not solved.
The certificate's bound is the largest of these valid over the model's scope; ``detail`` says
which (``bound_source``), over what (``bound_scope``), and ``bound_every_placement_s`` (the
largest valid without the circuit scope). A FEASIBLE answer that meets a proven bound is
OPTIMAL (e.g. the incumbent meets the analytic bound: no CP-SAT model is built).

Incumbent: the hint and the axis orders (``axis_order_placements``), priced by Q2's cost; CP-SAT
is hinted with it (or, when the circuit model cannot represent it, with the best candidate it
can), and the answer is never worse than it. Models estimated above ``max_model_variables``
(v5e-256), and models whose estimated build time (``BUILD_S_PER_VARIABLE`` per variable) plus
``MIN_SOLVE_S`` does not fit in what the warm start leaves of the limit (v5e-64 at 1-5 s), are
not built: the axis orders get ``FALLBACK_WARM_START_SHARE`` of the limit and the incumbent is
then improved by annealing for the rest (a heuristic, labelled in ``detail["method"]`` and the
certificate's solver name).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from fractions import Fraction
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.latency import Q2, predict_step
from aoizora.formulation import placement_bounds
from aoizora.formulation.placement_cpsat import (SCOPE_SETS, PlacementModel,
                                                  estimated_variables)
from aoizora.formulation.traffic import TrafficModel
from aoizora.formulation.placement_split import model_cost_units, split_sets_count
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.placement_split import split_proof
from aoizora.solvers.work_budget import WORK_PER_S, WorkBudget

try:
    from ortools import __version__ as _ORTOOLS_VERSION
except Exception:  # pragma: no cover
    _ORTOOLS_VERSION = "?"

SOLVER_NAME = f"CP-SAT {_ORTOOLS_VERSION}"
LEVELS = ("comm", "link_bytes", "hops")   # detail["levels"]: the lexicographic objective, in order
# Share of the time limit for the axis-order warm start (it stops early when every order is
# priced: 24 on v5e-16 in 0.03 s; 720 on v5e-64 take 1.3-2 s here, and with 0.1 the 1 s and 5 s
# runs there started CP-SAT from a worse order than the axis-order search finds) and for the
# decomposition bound; the
# variable count above which no CP-SAT model is built (v5e-256's circuit model: ~4.3 M, mostly
# pair products of the 128 data pairs and the permute over 256 ranks).
WARM_START_SHARE = 0.3
# Model building time per estimated variable (measured here: v5e-64's 226k-variable circuit model
# 6.1 s, v5e-16's 13k 0.3-0.5 s, under load 4) and the least solve time worth a build: with less
# time left the incumbent is returned without building.
BUILD_S_PER_VARIABLE = 3e-5
MIN_SOLVE_S = 0.5
# Without a CP-SAT model (over the variable cap, or no time to build it) the axis orders get
# almost all of the limit and annealing the rest: on v5e-256 (Wan 2.1 1.3B, placement_solver)
# the axis orders improved on the default order at every budget, annealing from the default
# order never did in 120 s, nor annealing from the axis orders' answer; with 80% the axis
# orders stopped before the one a bare axis-order search found at 3.9 s of 5 s.
FALLBACK_WARM_START_SHARE = 0.95
DECOMPOSITION_SHARE = 0.1
# The split proof (``solvers.placement_split``): share of the work left after the joint model is
# built, and its lower-bound pass's time per chip set (measured: v5e-16's 12,870 sets of 8 in
# 1.5-2.5 s here; charged to the work budget at this estimate); with less work left than that
# pass plus MIN_SOLVE_S it is not started. Model builds are charged at BUILD_S_PER_VARIABLE.
SPLIT_SHARE = 0.8
SPLIT_S_PER_SET = 1.5e-4
MODEL_VARIABLES_CAP = 1_000_000
# Priced placements a result carries besides its answer (``PlacementResult.candidates``).
CANDIDATES_KEPT = 16
_STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
           cp_model.INFEASIBLE: "INFEASIBLE", cp_model.UNKNOWN: "UNKNOWN",
           cp_model.MODEL_INVALID: "UNKNOWN"}


@dataclasses.dataclass
class PlacementResult:
    placement: list[int] | None          # device index (position in target.devices()) per rank
    certificate: Certificate
    q2: Q2 | None
    trace: list[tuple[float, float]]     # (seconds since start, best objective in seconds)
    # other placements priced on the way (hint, axis orders), the best CANDIDATES_KEPT by link
    # cost: what ``solvers.placement_step.choose_by_step`` also considers; not serialized
    candidates: list[list[int]] = dataclasses.field(default_factory=list, repr=False)

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


def axis_order_placements(network: Network, mesh_shape: Sequence[int],
                          deadline: float | None = None) -> list[np.ndarray]:
    """Distinct placements from mapping logical axes onto physical axes / sub-axes in every order.

    Each physical axis is split into ordered factors (every ordered factorization), the factors
    are ordered so that consecutive ones multiply to the logical axes (orders that cannot are
    pruned as they are built), and the grid is transposed accordingly. Splits with fewer factors
    come first. `deadline` (``time.perf_counter()`` value): stop enumerating there (large slices
    have millions of orders) and return what was found."""
    shape = network.shape
    grid = np.empty(shape, dtype=np.int64)
    first_dev = {}
    for d, c in enumerate(network.device_chip):
        first_dev.setdefault(int(c), d)
    if network.num_devices != network.num_chips:
        raise ValueError("axis orders need one device per chip")
    for c, co in enumerate(network.chips):
        grid[co] = first_dev[c]
    mesh_shape = [int(v) for v in mesh_shape if int(v) > 1] or [1]
    out: dict[bytes, np.ndarray] = {}
    combos = sorted(itertools.product(*[_factorizations(s) for s in shape]),
                    key=lambda fs: (sum(len(f) for f in fs), fs))

    def orders(sizes: list[int], used: list[bool], prefix: list[int], ax: int, prod: int):
        if deadline is not None and time.perf_counter() > deadline:
            return
        if ax == len(mesh_shape):
            if len(prefix) == len(sizes):
                yield list(prefix)
            return
        for j, f in enumerate(sizes):
            if used[j] or mesh_shape[ax] % (prod * f):
                continue
            used[j] = True
            prefix.append(j)
            np_, nax = prod * f, ax
            if np_ == mesh_shape[ax]:
                np_, nax = 1, ax + 1
            yield from orders(sizes, used, prefix, nax, np_)
            prefix.pop()
            used[j] = False

    for facs in combos:
        if deadline is not None and time.perf_counter() > deadline:
            break
        sizes = [f for fs in facs for f in fs]
        if not sizes:
            p = grid.reshape(-1)
            out.setdefault(p.tobytes(), p)
            continue
        g = grid.reshape(sizes)
        for perm in orders(sizes, [False] * len(sizes), [], 0, 1):
            p = np.transpose(g, perm).reshape(-1)
            out.setdefault(p.tobytes(), p)
    return list(out.values())


class _Trace(cp_model.CpSolverSolutionCallback):
    def __init__(self, pm: PlacementModel, t0: float, trace: list):
        super().__init__()
        self.pm, self.t0, self.trace = pm, t0, trace

    def on_solution_callback(self):
        # best so far: a solution worse than the incumbent already traced is not recorded
        o = self.pm.comm_seconds(self.ObjectiveValue())
        if not self.trace or o < self.trace[-1][1]:
            self.trace.append((time.perf_counter() - self.t0, o))


def _params(solver: cp_model.CpSolver, seed: int, workers: int, deterministic: bool, log: bool,
            linearization: int = 0) -> None:
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


def chips_to_devices(network: Network, chip_of_rank: Sequence[int]) -> list[int]:
    dev_of_chip = {int(c): d for d, c in enumerate(network.device_chip)}
    return [dev_of_chip[int(c)] for c in chip_of_rank]


def solve_placement(evidence: Evidence, network: Network, time_limit_s: float = 10.0,
                    seed: int = 0, workers: int = 1, hint: Sequence[int] | None = None,
                    deterministic: bool = True, lexicographic: bool = True,
                    symmetry_breaking: bool = True, formulation: str = "auto",
                    linearization: int = 0, warm_start: bool = True,
                    log: bool = False, decomposition: bool = True,
                    decomposition_share: float = DECOMPOSITION_SHARE,
                    split: bool = True, split_share: float = SPLIT_SHARE,
                    max_model_variables: int = MODEL_VARIABLES_CAP) -> PlacementResult:
    """Best placement (device index per logical rank) under the CP-SAT model, with a certificate.

    `hint`: a placement to start from (e.g. ``extract.network.default_device_order``); when the
    limit ends before the search reports a solution, the hint is returned as the incumbent.
    `warm_start`: also price the axis-order placements (``axis_order_placements``) and hint the
    best of those and `hint` (the incumbent: the answer is never worse than it).
    `decomposition`: spend up to `decomposition_share` of the work budget solving phases alone for a
    stronger bound (module docstring). `split`: first try the split proof over every placement
    (``solvers.placement_split``) within `split_share` of the work left (module docstring).
    When the model would have more than
    `max_model_variables` variables (e.g. v5e-256), no CP-SAT model is built: the incumbent is
    improved by ``placement_heuristics.annealing`` for the rest of the limit (detail["method"]
    says so) and the bound is the analytic one."""
    t0 = time.perf_counter()
    deadline = t0 + float(time_limit_s)
    budget = WorkBudget.for_limit(time_limit_s, start=t0)
    tm = TrafficModel(evidence, network)
    bw = float(network.link_bandwidth_Bps)
    detail: dict = {"notes": [], "levels": {}, "model_objective_s": None}
    # -- bound valid for every placement (formulation.placement_bounds) -------------------------
    pbs = placement_bounds.phase_link_lower_bounds(evidence, network, tm)
    analytic_s = sum(b.key.count * b.exposed_s(bw) for b in pbs)
    detail["analytic_bound_s"] = analytic_s
    # -- incumbent: the hint and the axis orders ------------------------------------------------
    one_per_chip = network.num_devices == network.num_chips
    form, nvars = (estimated_variables(evidence, network, formulation) if one_per_chip
                   else (formulation, 0))
    detail["estimated_variables"] = nvars
    fallback = one_per_chip and nvars > max_model_variables
    # no time to build and solve the model after the warm start: the same heuristic path
    no_time = (one_per_chip and not fallback and (1 - WARM_START_SHARE) * time_limit_s
               < nvars * BUILD_S_PER_VARIABLE + MIN_SOLVE_S)
    cands = [np.asarray(hint, dtype=np.int64)] if hint is not None else []
    pool = list(cands)                    # every candidate priced (for an in-scope CP-SAT hint)
    pool_cost = [tm.cost(q) for q in pool]   # their link costs, in the same order
    warm_trace: list[tuple[float, float]] = []   # (s, objective) as the incumbent improves
    if cands:
        warm_trace.append((time.perf_counter() - t0, tm.cost(cands[0])[0]))
    incumbent_from = "hint" if hint is not None else None
    if warm_start and one_per_chip:
        ax_deadline = t0 + (FALLBACK_WARM_START_SHARE if fallback or no_time
                            else WARM_START_SHARE) * time_limit_s
        axs = axis_order_placements(network, list(evidence.mesh_axes.values()),
                                    deadline=ax_deadline)
        best_c = tm.cost(cands[0]) if cands else None
        priced = 0
        for q in axs:
            if priced and time.perf_counter() > ax_deadline:
                break
            c = tm.cost(q)
            priced += 1
            pool.append(q)
            pool_cost.append(c)
            if best_c is None or c < best_c:
                cands, best_c, incumbent_from = [q], c, "axis orders"
                if not warm_trace or c[0] < warm_trace[-1][1]:
                    warm_trace.append((time.perf_counter() - t0, c[0]))
        detail["axis_orders"] = {"enumerated": len(axs), "priced": priced}
        if time.perf_counter() > ax_deadline and not (fallback or no_time):
            # the enumeration or the pricing stopped at the clock: the incumbent can differ
            budget.note_wall_cut("axis-order warm start")
    inc = cands[0] if cands else None
    inc_cost = tm.cost(inc) if inc is not None else None
    if inc is not None:
        detail["incumbent"] = {"from": incumbent_from, "objective_s": inc_cost[0],
                               "at_s": time.perf_counter() - t0}
    if inc is not None and (not warm_trace or warm_trace[-1][1] > inc_cost[0]):
        warm_trace.append((time.perf_counter() - t0, inc_cost[0]))
    trace: list[tuple[float, float]] = warm_trace

    def cert_of(placement, status, bound_s, bound_source, scope, q2=None) -> PlacementResult:
        q2 = q2 or predict_step(evidence, placement, network, tm)
        if detail.get("method", "").startswith(("CP-SAT", "incumbent")):
            detail["work"] = budget.to_json()
        detail.update(bound_source=bound_source, bound_scope=scope)
        detail.setdefault("bound_every_placement_s",
                          bound_s if scope == SCOPE_SETS and bound_s is not None else analytic_s)
        cert = Certificate(SOLVER_NAME if detail.get("method", "").startswith("CP-SAT")
                           else detail.get("method", SOLVER_NAME), status, q2.communication_s,
                           min(bound_s, q2.communication_s) if bound_s is not None else None,
                           time.perf_counter() - t0, "s", seed, workers, time_limit_s, detail)
        kept = sorted(range(len(pool)), key=lambda i: (pool_cost[i], i))[:CANDIDATES_KEPT]
        return PlacementResult([int(v) for v in placement], cert, q2, trace,
                               [[int(v) for v in pool[i]] for i in kept])

    # -- the incumbent meets the analytic bound: proven optimal over every placement ----------
    if inc is not None and inc_cost[0] <= analytic_s * (1 + 1e-12) + 1e-15:
        detail["method"] = "CP-SAT not needed"
        detail["notes"].append("the incumbent meets the analytic lower bound: optimal over every "
                               "placement")
        detail["levels"]["comm"] = {"status": "OPTIMAL", "by": "analytic bound",
                                    "done_at_s": time.perf_counter() - t0}
        return cert_of(inc, "OPTIMAL", analytic_s, "analytic", SCOPE_SETS)
    # -- no CP-SAT model (too large, or no time to build it): annealing from the incumbent --------
    est_build = nvars * BUILD_S_PER_VARIABLE
    detail["estimated_build_s"] = est_build
    if (fallback or no_time) and inc is not None:
        from aoizora.solvers import placement_heuristics as H
        if fallback:
            detail["method"] = "axis orders + annealing (heuristic fallback)"
            why = f"the CP-SAT model would have ~{nvars:,} variables (> {max_model_variables:,})"
        else:
            detail["method"] = "axis orders + annealing (no time for the CP-SAT model)"
            why = (f"building the CP-SAT model (~{nvars:,} variables) takes ~{est_build:.1f} s, "
                   f"more than the {time_limit_s:g} s limit leaves")
        detail["notes"].append(
            f"{why}: not built; the best of the hint and the axis orders "
            f"({FALLBACK_WARM_START_SHARE:.0%} of the limit; from: {incumbent_from}) improved by "
            "annealing over swaps (as many as the limit buys: "
            "placement_heuristics.evaluation_budget) within the rest of the limit; the bound is "
            "the analytic one (every placement)")
        left = deadline - time.perf_counter()
        best = inc
        if left > 0.05:
            sa = H.annealing(evidence, network, time_limit_s=left, seed=seed, starts=[inc],
                             max_evaluations=H.evaluation_budget(time_limit_s))
            detail["annealing"] = {k: sa.certificate.detail.get(k) for k in
                                   ("evaluated", "iterations", "evaluations_asked", "cut")}
            off = time.perf_counter() - t0 - sa.certificate.time_s
            trace += [(off + t, o) for t, o in sa.trace if o < trace[-1][1]]
            if tm.cost(sa.placement) < inc_cost:
                best = np.asarray(sa.placement, dtype=np.int64)
        res = cert_of(best, "FEASIBLE", analytic_s, "analytic", SCOPE_SETS)
        if res.certificate.objective <= analytic_s * (1 + 1e-12) + 1e-15:
            res.certificate.status = "OPTIMAL"
        return res
    # -- the warm start left no time to build the model: the incumbent ---------------------------
    # (the work budget is untouched so far; the clock's guard decides only on a slow machine)
    if inc is not None and budget.wall_left() < est_build + MIN_SOLVE_S:
        budget.note_wall_cut("the CP-SAT model not built")
        detail["method"] = "incumbent (no time for the CP-SAT model)"
        detail["notes"].append(
            f"{budget.wall_left():.2f} s left, building the CP-SAT model (~{nvars:,} "
            f"variables) takes ~{est_build:.1f} s: the incumbent ({incumbent_from}) returned")
        ok = inc_cost[0] <= analytic_s * (1 + 1e-12) + 1e-15
        return cert_of(inc, "OPTIMAL" if ok else "FEASIBLE", analytic_s, "analytic", SCOPE_SETS)
    # -- the CP-SAT model -------------------------------------------------------------------------
    pm = PlacementModel(evidence, network, formulation=formulation,
                        symmetry_breaking=symmetry_breaking)
    budget.charge_seconds(est_build)
    detail.update(method=f"CP-SAT ({pm.formulation})", formulation=pm.formulation,
                  scope=pm.scope, unit_bytes=pm.unit_bytes, build_s=time.perf_counter() - t0)
    detail["notes"] += list(pm.notes)
    hint_chips = network.device_chip[inc] if inc is not None else None
    # -- split proof over every placement (module docstring) ------------------------------------
    sp = None
    split_s = None
    slack_s = pm.comm_seconds(pm.rounding_units)       # overlap rounding, < 1 unit per run
    if split and hint_chips is not None and one_per_chip and pm.formulation != "sets":
        n_sets = split_sets_count(pm)
        if n_sets and budget.affords_seconds(n_sets * SPLIT_S_PER_SET + MIN_SOLVE_S):
            budget.charge_seconds(n_sets * SPLIT_S_PER_SET)      # its lower-bound pass
            sp = split_proof(pm, hint_chips, budget.child(split_share * budget.left()), seed,
                             log)
    if sp is not None:
        split_s = max(0.0, pm.comm_seconds(sp.bound_units) - slack_s)
        detail["split"] = dict(sp.rows, bound_s=split_s, proven=sp.proven,
                               objective_s=pm.comm_seconds(sp.cost_units))
        if sp.cost_units < model_cost_units(pm, hint_chips):
            # a pinned model found a better placement than the incumbent
            hint_chips = np.asarray(sp.chip_of_rank, dtype=np.int64)
            inc = np.asarray(chips_to_devices(network, hint_chips), dtype=np.int64)
            inc_cost, incumbent_from = tm.cost(inc), "split"
            pool.append(inc)
            pool_cost.append(inc_cost)
            if inc_cost[0] < trace[-1][1]:
                trace.append((time.perf_counter() - t0, inc_cost[0]))
        # valid for every placement, so for the joint model's scope
        pm.model.Add(pm.obj_comm >= sp.bound_units)
        if sp.proven:
            decomposition = False
            detail["notes"].append(
                f"split on the chip set of ranks {list(sp.group)}: every class of placements "
                "closed by its bound or its pinned model: the incumbent is optimal over every "
                "placement")

    def split_optimal(chips) -> bool:
        """The split proved that no placement beats `chips` (model units)."""
        return (sp is not None and sp.proven
                and model_cost_units(pm, chips) <= sp.bound_units)

    split_done = None
    if sp is not None and sp.proven and split_optimal(hint_chips):
        split_done = {"status": "OPTIMAL", "objective_units": sp.cost_units,
                      "bound_units": sp.bound_units, "by": "split",
                      "done_at_s": time.perf_counter() - t0}
        detail["levels"]["comm"] = dict(split_done)
        if not lexicographic:
            # level 1 is all that is asked: the joint model has nothing to add
            detail["method"] = f"CP-SAT (split; {pm.formulation} model not solved)"
            detail["model_objective_s"] = pm.comm_seconds(sp.cost_units)
            detail["bound_every_placement_s"] = split_s
            return cert_of(inc, "OPTIMAL", split_s, "split", SCOPE_SETS)

    # -- decomposition bound: each phase alone ----------------------------------------------
    dec_s, dec_scope = analytic_s, SCOPE_SETS
    if decomposition and hint_chips is not None and one_per_chip:
        dec_s, dec_scope, drows = _decomposition(
            pm, evidence, network, hint_chips, seed,
            budget.child(decomposition_share * budget.work), symmetry_breaking, log)
        detail["decomposition"] = {"bound_s": dec_s, "scope": dec_scope, "phases": drows}
    if hint_chips is not None:
        cp_hint = hint_chips
        if not pm.in_scope(hint_chips):
            # the model cannot represent the incumbent (a ring group off any cycle / path): hint
            # the best candidate it can represent; the incumbent stays the fallback answer
            ok = [q for q in pool if pm.in_scope(network.device_chip[q])]
            if ok:
                q = min(ok, key=tm.cost)
                cp_hint = network.device_chip[q]
                detail["cpsat_hint"] = {"objective_s": tm.cost(q)[0],
                                        "why": "the incumbent is outside the model's scope"}
        pm.add_hint(cp_hint)
    m = pm.model
    m.Minimize(pm.obj_comm)
    solver = cp_model.CpSolver()
    _params(solver, seed, workers, deterministic, log, linearization)
    budget.limit(solver)
    st = solver.Solve(m, _Trace(pm, t0, trace))
    budget.account(solver, st, "the joint model")
    status = _STATUS.get(st, "UNKNOWN")
    detail.update(variables=len(m.Proto().variables), constraints=len(m.Proto().constraints))
    detail["overlap_rounding_s"] = slack_s
    joint_s = (max(0.0, pm.comm_seconds(solver.BestObjectiveBound()) - slack_s)
               if st in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN) else None)
    detail["joint_bound_s"] = joint_s
    # the bound reported: the largest valid over the model's scope
    opts = [(analytic_s, "analytic", SCOPE_SETS)]
    if split_s is not None:
        opts.append((split_s, "split", SCOPE_SETS))
    if dec_scope == SCOPE_SETS or dec_scope == pm.scope:
        opts.append((dec_s, "decomposition", dec_scope))
    if joint_s is not None:
        opts.append((joint_s, "joint CP-SAT", pm.scope))
    bound_s, bound_source, bound_scope = max(opts, key=lambda o: (o[0], o[2] == SCOPE_SETS))
    detail["bound_every_placement_s"] = max(o[0] for o in opts if o[2] == SCOPE_SETS)
    if status not in ("OPTIMAL", "FEASIBLE"):
        if st == cp_model.INFEASIBLE:
            detail["notes"].append("the CP-SAT model is infeasible (a modelling error: every "
                                   "placement is feasible)")
        if inc is not None:
            detail["notes"].append("no solution reported in the time limit: the incumbent "
                                   f"({incumbent_from}) returned")
            detail["model_objective_s"] = None
            return cert_of(inc, "OPTIMAL" if split_optimal(hint_chips) else "FEASIBLE", bound_s,
                           bound_source, bound_scope)
        cert = Certificate(SOLVER_NAME, status, None, bound_s, time.perf_counter() - t0, "s",
                           seed, workers, time_limit_s, detail)
        return PlacementResult(None, cert, None, trace)
    best = [int(v) for v in _chips(solver, pm)]
    level_vals = {"comm": solver.ObjectiveValue()}
    detail["levels"]["comm"] = {"status": status, "objective_units": solver.ObjectiveValue(),
                                "bound_units": solver.BestObjectiveBound(),
                                "done_at_s": time.perf_counter() - t0}
    if split_done is not None:
        # proven by the split before the joint solve (which then gives the tie-break levels a
        # solution of the joint model to start from)
        detail["levels"]["comm"] = dict(split_done,
                                        joint_done_at_s=detail["levels"]["comm"]["done_at_s"])
    if lexicographic and status == "OPTIMAL":
        fixed = [(pm.obj_comm, int(round(solver.ObjectiveValue())))]
        for name, expr in pm.objectives[1:]:
            if budget.left() <= 0.05 * WORK_PER_S or budget.wall_left() <= 0.05:
                if budget.left() > 0.05 * WORK_PER_S:
                    budget.note_wall_cut(f"the {name} level not started")
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
            _params(s2, seed, workers, deterministic, log, linearization)
            budget.limit(s2)
            st2 = s2.Solve(m2)
            budget.account(s2, st2, f"the {name} level")
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
    q2 = predict_step(evidence, placement, network, tm)
    model_obj_s = pm.comm_seconds(level_vals["comm"])
    tol = 1e-9 * max(abs(q2.communication_s), 1e-12) + slack_s
    detail["model_objective_s"] = model_obj_s
    if abs(model_obj_s - q2.communication_s) > tol:
        detail["notes"].append(
            f"model objective {model_obj_s:.6g} s differs from Q2 {q2.communication_s:.6g} s "
            "(a ring order the model chose differs from the canonical one): not proven")
        if status == "OPTIMAL":
            status = "FEASIBLE"
    if inc is not None and inc_cost < tm.cost(placement):
        # never worse than the incumbent (the model's ring orders may differ from Q2's)
        detail["notes"].append(f"the incumbent ({incumbent_from}) is better by Q2: returned")
        st_inc = ("OPTIMAL" if split_optimal(hint_chips)
                  else "FEASIBLE" if inc_cost[0] > bound_s * (1 + 1e-12) else status)
        return cert_of(inc, st_inc, bound_s, bound_source, bound_scope)
    if status == "FEASIBLE" and (q2.communication_s <= bound_s * (1 + 1e-12) + 1e-15
                                 or split_optimal(best)):
        status = "OPTIMAL"           # the incumbent meets a proven bound (decomposition / analytic)
    return cert_of(placement, status, bound_s, bound_source, bound_scope, q2)


def decomposition_bound(evidence: Evidence, network: Network, time_limit_s: float = 10.0,
                        seed: int = 0, hint: Sequence[int] | None = None,
                        formulation: str = "auto") -> tuple[float, str, list[dict]]:
    """The decomposition bound alone (module docstring of ``formulation.placement_bounds``):
    (seconds of exposed communication that no placement in `scope` beats, scope, per-phase rows).
    Phases are solved alone only where `hint` (default: device order 0..n-1) loads them above
    their analytic bound; the others keep the analytic bound."""
    budget = WorkBudget.for_limit(time_limit_s)
    pm = PlacementModel(evidence, network, formulation=formulation)
    p = np.arange(network.num_devices) if hint is None else np.asarray(hint, dtype=np.int64)
    return _decomposition(pm, evidence, network, network.device_chip[p], seed, budget, True,
                          False)


def _decomposition(pm: PlacementModel, evidence: Evidence, network: Network, hint_chips,
                   seed: int, budget: WorkBudget, symmetry_breaking: bool, log: bool):
    """Phase-by-phase bound (module docstring): solve min M_p for phase p alone, where the
    incumbent loads phase p above its analytic bound and the phase is exposed; add each proven
    bound to the joint model (M[p] >= it) when its scope contains the joint model's. Returns
    (bound seconds, scope, rows)."""
    tm = pm.traffic
    bw = pm.bandwidth
    inc_loads = tm.phase_loads(chips_to_devices(network, hint_chips))
    todo = []
    for p, (key, pl) in enumerate(zip(tm.phases, inc_loads)):
        lb_bytes = pm.lbM[p] * pm.unit_bytes
        inc_bytes = float(pl.link_bytes.max()) if len(pl.link_bytes) else 0.0
        if inc_bytes <= float(lb_bytes) * (1 + 1e-12) or pl.exposed_s <= 0:
            continue
        gain = key.count * (pl.exposed_s - max(0.0, float(lb_bytes) / bw - tm.overlap_s[p]))
        todo.append((gain, p))
    todo.sort(reverse=True)
    rows = []
    scope = SCOPE_SETS
    for i, (gain, p) in enumerate(todo):
        if not budget.affords_seconds(0.2):
            if budget.left() >= 0.2 * WORK_PER_S:      # work left, the clock's guard out
                budget.note_wall_cut("the decomposition bound")
            rows.append({"phase": tm.phases[p].phase, "skipped": "decomposition time used up"})
            continue
        key = tm.phases[p]
        sub_ev = dataclasses.replace(
            evidence, collectives=list(tm.phase_collectives[p]))
        _, sub_vars = estimated_variables(sub_ev, network, "auto")
        if not budget.affords_seconds(sub_vars * BUILD_S_PER_VARIABLE + MIN_SOLVE_S):
            rows.append({"phase": key.phase, "skipped": f"~{sub_vars:,} variables: no time to "
                                                        "build the phase's model"})
            continue
        budget.charge_seconds(sub_vars * BUILD_S_PER_VARIABLE)
        work = budget.left() / (len(todo) - i)
        t1 = time.perf_counter()
        try:
            sub = PlacementModel(sub_ev, network, formulation="auto",
                                 symmetry_breaking=symmetry_breaking)
        except Exception as e:  # noqa: BLE001 -- a phase that cannot be modelled alone: no bound
            rows.append({"phase": key.phase, "skipped": str(e).splitlines()[0][:120]})
            continue
        sub.model.Minimize(sub.M[0])
        sub.add_hint(hint_chips)
        s = cp_model.CpSolver()
        _params(s, seed, 1, True, log)
        budget.limit(s, work)
        st = s.Solve(sub.model)
        budget.account(s, st, "the decomposition bound")
        if st in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
            b_bytes = Fraction(int(round(s.BestObjectiveBound()))) * sub.unit_bytes
            row = {"phase": key.phase, "count": key.count, "status": _STATUS.get(st),
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
    dec = sum(k.count * max(0.0, float(lb * pm.unit_bytes) / bw - O)
              for k, lb, O in zip(tm.phases, pm.lbM, tm.overlap_s))
    return dec, scope, rows


def _chips(solver: cp_model.CpSolver, pm: PlacementModel) -> list[int]:
    out = []
    for r in range(pm.R):
        for c in range(pm.C):
            if solver.BooleanValue(pm.x[r][c]):
                out.append(c)
                break
    return out
