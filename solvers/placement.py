"""Solve the placement CP-SAT model (``formulation.placement_cpsat``) with a certificate.

``solve_placement`` runs named stages in a fixed order, each returning what it found with its
bound (``StageBound``: seconds, source, scope); the certificate is assembled in one place
(``_certify``) from the answer the last stage run gives (``StageAnswer``):

  1. ``analytic_stage``: the bound that needs no solver (``formulation.placement_bounds``);
  2. ``incumbent_stage``: the hint and the axis orders (``solvers.axis_orders``) priced by Q2's
     cost; the best is the incumbent. When it meets the analytic bound it is the answer
     (OPTIMAL, no CP-SAT model built);
  3. ``heuristic_stage``: when the model is too large or there is no time to build it, annealing
     from the incumbent (``solvers.placement_heuristics``) is the answer;
  4. ``split_stage``: the split proof over every placement (``solvers.placement_split``);
  5. ``decomposition_stage``: each phase alone (``solvers.placement_decomposition``);
  6. ``joint_stage``: the joint CP-SAT model, then ``tie_break_levels`` (levels 2 and 3);
     ``_joint_answer`` turns its solution, the incumbent and the bounds into the answer.

Deterministic: fixed ``num_workers`` (default 1: measured fastest here, and deterministic as
it is), ``random_seed``, and ``interleave_search`` when several workers run (OR-Tools'
deterministic multi-worker mode; ``solvers.cpsat_params``). No LP relaxation by default
(``linearization=0``): the LP of max link loads is weak and slowed every instance measured. The
time limit is spent as a work budget in CP-SAT's deterministic time (``solvers.work_budget``:
``time_limit_s * WORK_PER_S``; the split proof, the decomposition bound and the joint model each
take their share of it, and the Python steps are charged at their estimated cost), so a run
gives the same answer, proven or not, whatever the machine's load; the clock (``WALL_CAP`` times
the limit) only guards it, and ``detail["work"]["wall_cut"]`` names what the guard stopped. A
run stopped by its budget returns its incumbent, status FEASIBLE, with the proven bound
(wall time against the limit: benchmarks/results/lab_notes.md).

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
  - the decomposition bound (``solvers.placement_decomposition``): phase p alone is a small
    CP-SAT model min M[p]; its proven bound, when larger, replaces lb[p] (and is a constraint
    M[p] >= it of the joint model when its scope contains the joint model's):
    dec_s = sum_p count_p * max(0, lbM[p] * unit_bytes / W - O_p), within
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
    proportion to its room below the incumbent, U - LB(S)); it is also a constraint comm >= it
    of the joint model. When no class is left open the incumbent is proven optimal over every
    placement (status OPTIMAL, bound source "split"); without ``lexicographic`` the joint model
    is then not solved.
The certificate's bound is the largest of these valid over the model's scope (``_best_bound``);
``detail`` says which (``bound_source``), over what (``bound_scope``), and
``bound_every_placement_s`` (the largest valid without the circuit scope). A FEASIBLE answer
that meets a proven bound is OPTIMAL (e.g. the incumbent meets the analytic bound: no CP-SAT
model is built).

Several devices per chip (v4, v7x): the model places ranks on devices ("sets" only; the
incumbent, hints and solutions are then device per rank, ``placement_result.model_places``);
the split proof does not run and the analytic bound is the ring cut alone
(``placement_bounds``), so the bound is mostly the decomposition's or the joint model's; the
"circuit" formulation asked for there takes the heuristic path.

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
import time
from typing import NamedTuple, Sequence

import numpy as np
from ortools.sat.python import cp_model

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation import placement_bounds
from aoizora.formulation.latency import Q2, predict_step
from aoizora.formulation.placement_cpsat import (SCOPE_SETS, PlacementModel,
                                                  estimated_variables)
from aoizora.formulation.placement_split import model_cost_units, split_sets_count
from aoizora.formulation.traffic import TrafficModel
from aoizora.solvers.axis_orders import axis_order_placements
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.cpsat_params import (BUILD_S_PER_VARIABLE, MIN_SOLVE_S, STATUS_NAMES,
                                          set_search_params, solution_chips, solve)
from aoizora.solvers.placement_decomposition import phase_decomposition
from aoizora.solvers.placement_heuristics import annealing, evaluation_budget
from aoizora.solvers.placement_result import PlacementResult, chips_to_devices, model_places
from aoizora.solvers.placement_split import SplitResult, split_proof
from aoizora.solvers.work_budget import WORK_PER_S, WorkBudget

try:
    from ortools import __version__ as _ORTOOLS_VERSION
except Exception:  # pragma: no cover
    _ORTOOLS_VERSION = "?"

__all__ = ["LEVELS", "PlacementOptions", "PlacementResult", "StageBound", "solve_placement"]

SOLVER_NAME = f"CP-SAT {_ORTOOLS_VERSION}"
LEVELS = ("comm", "link_bytes", "hops")   # detail["levels"]: the lexicographic objective, in order
# Share of the time limit for the axis-order warm start (it stops early when every order is
# priced); fitted on benchmarks/results/placement_solver.md (benchmarks/results/lab_notes.md).
WARM_START_SHARE = 0.3
# Without a CP-SAT model (over the variable cap, or no time to build it) the axis orders get
# almost all of the limit and annealing the rest; fitted on benchmarks/results/placement_solver.md
# (v5e-256; benchmarks/results/lab_notes.md).
FALLBACK_WARM_START_SHARE = 0.95
# Share of the work budget for the decomposition bound.
DECOMPOSITION_SHARE = 0.1
# The split proof (``solvers.placement_split``): share of the work left after the joint model is
# built, and its lower-bound pass's time per chip set (benchmarks/results/lab_notes.md; charged
# to the work budget at this estimate); with less work left than that
# pass plus MIN_SOLVE_S it is not started. Model builds are charged at BUILD_S_PER_VARIABLE.
SPLIT_SHARE = 0.8
SPLIT_S_PER_SET = 1.5e-4
# The variable count above which no CP-SAT model is built (v5e-256's circuit model: ~4.3 M,
# mostly pair products of the 128 data pairs and the permute over 256 ranks).
MODEL_VARIABLES_CAP = 1_000_000
# Priced placements a result carries besides its answer (``PlacementResult.candidates``).
CANDIDATES_KEPT = 16
# Relative and absolute slack (seconds) under which an objective meets a bound.
MEETS_REL, MEETS_ABS = 1e-12, 1e-15
# Work (CP-SAT deterministic seconds per WORK_PER_S) and clock seconds below which a tie-break
# level is not started.
LEVEL_MIN_S = 0.05


@dataclasses.dataclass(frozen=True)
class PlacementOptions:
    """The knobs of ``solve_placement`` besides the limit, seed, workers and hint.

    deterministic: OR-Tools' interleaved search when several workers run (one is deterministic
        as it is). lexicographic: after level 1 is proven, solve levels 2 and 3 (``LEVELS``).
    symmetry_breaking: the model's symmetry-breaking constraints (``PlacementModel``).
    formulation: "auto", "sets" or "circuit" (``formulation.placement_cpsat``).
    linearization: CP-SAT's ``linearization_level`` (0: no LP relaxation).
    warm_start: price the axis orders (``axis_order_placements``) for the incumbent.
    log: CP-SAT's search log. decomposition / decomposition_share: the decomposition bound
    within that share of the work budget. split / split_share: the split proof within that
    share of the work left. max_model_variables: above this estimate no CP-SAT model is built
    (annealing instead)."""
    deterministic: bool = True
    lexicographic: bool = True
    symmetry_breaking: bool = True
    formulation: str = "auto"
    linearization: int = 0
    warm_start: bool = True
    log: bool = False
    decomposition: bool = True
    decomposition_share: float = DECOMPOSITION_SHARE
    split: bool = True
    split_share: float = SPLIT_SHARE
    max_model_variables: int = MODEL_VARIABLES_CAP

    def __post_init__(self):
        for name in ("decomposition_share", "split_share"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise ValueError(f"PlacementOptions.{name} must be in [0, 1]; got "
                                 f"{getattr(self, name)!r}")


class StageBound(NamedTuple):
    """A lower bound on the exposed communication (``seconds`` per step) from stage ``source``
    ("analytic", "split", "decomposition", "joint CP-SAT"), valid over ``scope`` (SCOPE_SETS:
    every placement; else the joint model's scope)."""
    seconds: float
    source: str
    scope: str


@dataclasses.dataclass
class StageAnswer:
    """What a stage answers: the placement (None: no solution), its status, the bound reported,
    and Q2 of the placement when the stage computed it."""
    placement: Sequence[int] | None
    status: str
    bound: StageBound
    q2: Q2 | None = None


def _meets(objective_s: float, bound_s: float) -> bool:
    """`objective_s` meets the proven `bound_s` (up to MEETS_REL and MEETS_ABS): optimal."""
    return objective_s <= bound_s * (1 + MEETS_REL) + MEETS_ABS


@dataclasses.dataclass
class PlacementRun:
    """One call of ``solve_placement``: its inputs, clock start, work budget, traffic model,
    the certificate's ``detail`` being filled, and the trace (seconds since start, best
    objective in seconds)."""
    evidence: Evidence
    network: Network
    time_limit_s: float
    seed: int
    workers: int
    options: PlacementOptions
    t0: float
    budget: WorkBudget
    tm: TrafficModel
    detail: dict
    trace: list

    @classmethod
    def start(cls, evidence: Evidence, network: Network, time_limit_s: float, seed: int,
              workers: int, options: PlacementOptions) -> "PlacementRun":
        t0 = time.perf_counter()
        return cls(evidence, network, time_limit_s, seed, workers, options, t0,
                   WorkBudget.for_limit(time_limit_s, start=t0), TrafficModel(evidence, network),
                   {"notes": [], "levels": {}, "model_objective_s": None}, [])

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def solver(self) -> cp_model.CpSolver:
        """A CP-SAT solver with the joint model's settings (``set_search_params``); its limit
        from the work budget."""
        s = cp_model.CpSolver()
        o = self.options
        set_search_params(s, self.seed, self.workers, o.deterministic, o.log, o.linearization)
        self.budget.limit(s)
        return s


@dataclasses.dataclass(frozen=True)
class ModelPlan:
    """Whether the CP-SAT model is built: ``variables`` its estimated size; ``fallback`` over
    ``max_model_variables``; ``no_time`` its build and least solve do not fit in what the warm
    start leaves of the limit; ``unsupported`` why the model does not apply ("" when it does:
    with several devices per chip (v4, v7x) it places ranks on devices with the "sets"
    formulation only, ``formulation.placement_cpsat``)."""
    variables: int
    fallback: bool
    no_time: bool
    unsupported: str = ""

    @property
    def build_s(self) -> float:
        return self.variables * BUILD_S_PER_VARIABLE

    @property
    def heuristic(self) -> bool:
        return self.fallback or self.no_time or bool(self.unsupported)


def model_plan(run: PlacementRun) -> ModelPlan:
    """The model's estimated size (``estimated_variables``), fallback = size >
    max_model_variables, no_time = (1 - WARM_START_SHARE) time_limit_s < size
    BUILD_S_PER_VARIABLE + MIN_SOLVE_S; unsupported: the "circuit" formulation asked for on a
    slice with several devices per chip.

    Args:
        run: the call (network, evidence, options, limit); records ``estimated_variables``.

    Returns:
        The plan."""
    net, o = run.network, run.options
    if net.num_devices != net.num_chips and o.formulation == "circuit":
        run.detail["estimated_variables"] = 0
        return ModelPlan(0, False, False, "the circuit formulation has no arc between the "
                         "devices of one chip")
    nvars = estimated_variables(run.evidence, net, o.formulation)[1]
    run.detail["estimated_variables"] = nvars
    fallback = nvars > o.max_model_variables
    # no time to build and solve the model after the warm start: the same heuristic path
    no_time = (not fallback and (1 - WARM_START_SHARE) * run.time_limit_s
               < nvars * BUILD_S_PER_VARIABLE + MIN_SOLVE_S)
    return ModelPlan(nvars, fallback, no_time)


@dataclasses.dataclass
class Incumbent:
    """The best placement priced so far (``placement``, its ``TrafficModel.cost`` ``cost``,
    ``source``: "hint", "axis orders" or "split"; None when nothing was priced) and every
    placement priced (``pool``, ``pool_cost``, in the order priced)."""
    placement: np.ndarray | None = None
    cost: tuple | None = None
    source: str | None = None
    pool: list = dataclasses.field(default_factory=list)
    pool_cost: list = dataclasses.field(default_factory=list)

    def chips(self, network: Network) -> np.ndarray | None:
        """The incumbent as the CP-SAT model places it (``model_places``: chips, or devices
        with several per chip); None without one."""
        return model_places(network, self.placement) if self.placement is not None else None

    def kept(self) -> list[list[int]]:
        """The CANDIDATES_KEPT cheapest placements priced (ties: first priced)."""
        kept = sorted(range(len(self.pool)),
                      key=lambda i: (self.pool_cost[i], i))[:CANDIDATES_KEPT]
        return [[int(v) for v in self.pool[i]] for i in kept]


# -- stages -------------------------------------------------------------------------------------
def analytic_stage(run: PlacementRun) -> StageBound:
    """Stage 1: sum_p count_p max(0, lb[p] / W - O_p) (``formulation.placement_bounds``), valid
    over every placement."""
    pbs = placement_bounds.phase_link_lower_bounds(run.evidence, run.network, run.tm)
    bw = float(run.network.link_bandwidth_Bps)
    analytic_s = sum(b.key.count * b.exposed_s(bw) for b in pbs)
    run.detail["analytic_bound_s"] = analytic_s
    return StageBound(analytic_s, "analytic", SCOPE_SETS)


def incumbent_stage(run: PlacementRun, hint: Sequence[int] | None, plan: ModelPlan) -> Incumbent:
    """Stage 2: the hint, then the axis orders until their clock share (WARM_START_SHARE of the
    limit, FALLBACK_WARM_START_SHARE on the heuristic path) ends; the least cost is the
    incumbent (the hint on ties)."""
    tm, trace = run.tm, run.trace
    inc = Incumbent()
    if hint is not None:
        inc.placement, inc.source = np.asarray(hint, dtype=np.int64), "hint"
        inc.pool, inc.pool_cost = [inc.placement], [tm.cost(inc.placement)]
        trace.append((run.elapsed(), tm.cost(inc.placement)[0]))
    if run.options.warm_start:
        ax_deadline = run.t0 + (FALLBACK_WARM_START_SHARE if plan.heuristic
                                else WARM_START_SHARE) * run.time_limit_s
        axs = axis_order_placements(run.network, list(run.evidence.mesh_axes.values()),
                                    deadline=ax_deadline)
        best_c = tm.cost(inc.placement) if inc.placement is not None else None
        priced = 0
        for q in axs:
            if priced and time.perf_counter() > ax_deadline:
                break
            c = tm.cost(q)
            priced += 1
            inc.pool.append(q)
            inc.pool_cost.append(c)
            if best_c is None or c < best_c:
                inc.placement, best_c, inc.source = q, c, "axis orders"
                if not trace or c[0] < trace[-1][1]:
                    trace.append((run.elapsed(), c[0]))
        run.detail["axis_orders"] = {"enumerated": len(axs), "priced": priced}
        if time.perf_counter() > ax_deadline and not plan.heuristic:
            # the enumeration or the pricing stopped at the clock: the incumbent can differ
            run.budget.note_wall_cut("axis-order warm start")
    if inc.placement is not None:
        inc.cost = tm.cost(inc.placement)
        run.detail["incumbent"] = {"from": inc.source, "objective_s": inc.cost[0],
                                   "at_s": run.elapsed()}
        if not trace or trace[-1][1] > inc.cost[0]:
            trace.append((run.elapsed(), inc.cost[0]))
    return inc


def heuristic_stage(run: PlacementRun, inc: Incumbent, plan: ModelPlan,
                    analytic: StageBound) -> StageAnswer:
    """Stage 3 (no CP-SAT model: too large, no time to build it, or the circuit formulation
    asked for with several devices per chip): annealing over swaps from the incumbent for the
    rest of the limit; the bound is the analytic one."""
    detail, o = run.detail, run.options
    if plan.unsupported:
        detail["method"] = "axis orders + annealing (circuit formulation, several devices per chip)"
        why = (f"{run.network.num_devices} devices on {run.network.num_chips} chips: "
               f"{plan.unsupported}")
    elif plan.fallback:
        detail["method"] = "axis orders + annealing (heuristic fallback)"
        why = (f"the CP-SAT model would have ~{plan.variables:,} variables "
               f"(> {o.max_model_variables:,})")
    else:
        detail["method"] = "axis orders + annealing (no time for the CP-SAT model)"
        why = (f"building the CP-SAT model (~{plan.variables:,} variables) takes "
               f"~{plan.build_s:.1f} s, more than the {run.time_limit_s:g} s limit leaves")
    detail["notes"].append(
        f"{why}: not built; the best of the hint and the axis orders "
        f"({FALLBACK_WARM_START_SHARE:.0%} of the limit; from: {inc.source}) improved by "
        "annealing over swaps (as many as the limit buys: "
        "placement_heuristics.evaluation_budget) within the rest of the limit; the bound is "
        "the analytic one (every placement)")
    left = run.t0 + run.time_limit_s - time.perf_counter()
    best = inc.placement
    if left > 0.05:
        sa = annealing(run.evidence, run.network, time_limit_s=left, seed=run.seed,
                       starts=[inc.placement],
                       max_evaluations=evaluation_budget(run.time_limit_s))
        detail["annealing"] = {k: sa.certificate.detail.get(k) for k in
                               ("evaluated", "iterations", "evaluations_asked", "cut")}
        off = run.elapsed() - sa.certificate.time_s
        run.trace += [(off + t, ob) for t, ob in sa.trace if ob < run.trace[-1][1]]
        if run.tm.cost(sa.placement) < inc.cost:
            best = np.asarray(sa.placement, dtype=np.int64)
    q2 = predict_step(run.evidence, best, run.network, run.tm)
    status = "OPTIMAL" if _meets(q2.communication_s, analytic.seconds) else "FEASIBLE"
    return StageAnswer(best, status, analytic, q2)


@dataclasses.dataclass
class SplitOutcome:
    """Stage 4's result: the split proof (None: not run), its bound, and, when it proved the
    incumbent optimal over every placement, level 1's record (``done``)."""
    proof: SplitResult | None
    bound: StageBound | None
    done: dict | None

    def optimal(self, pm: PlacementModel, chips) -> bool:
        """The split proved that no placement beats `chips` (model units)."""
        return (self.proof is not None and self.proof.proven
                and model_cost_units(pm, chips) <= self.proof.bound_units)


def split_stage(run: PlacementRun, pm: PlacementModel, inc: Incumbent,
                slack_s: float) -> SplitOutcome:
    """Stage 4: the split proof over every placement (``solvers.placement_split``) within
    ``split_share`` of the work left, when the joint model is not "sets". A better placement it
    finds becomes the incumbent; its bound is a constraint comm >= it of the joint model."""
    net, o, detail = run.network, run.options, run.detail
    sp = None
    hint_chips = inc.chips(net)
    if (o.split and hint_chips is not None and net.num_devices == net.num_chips
            and pm.formulation != "sets"):
        n_sets = split_sets_count(pm)
        if n_sets and run.budget.affords_seconds(n_sets * SPLIT_S_PER_SET + MIN_SOLVE_S):
            run.budget.charge_seconds(n_sets * SPLIT_S_PER_SET)      # its lower-bound pass
            sp = split_proof(pm, hint_chips, run.budget.child(o.split_share * run.budget.left()),
                             run.seed, o.log)
    if sp is None:
        return SplitOutcome(None, None, None)
    split_s = max(0.0, pm.comm_seconds(sp.bound_units) - slack_s)
    detail["split"] = dict(sp.rows, bound_s=split_s, proven=sp.proven,
                           objective_s=pm.comm_seconds(sp.cost_units))
    if sp.cost_units < model_cost_units(pm, hint_chips):
        # a pinned model found a better placement than the incumbent
        q = np.asarray(chips_to_devices(net, sp.chip_of_rank), dtype=np.int64)
        inc.placement, inc.cost, inc.source = q, run.tm.cost(q), "split"
        inc.pool.append(q)
        inc.pool_cost.append(inc.cost)
        if inc.cost[0] < run.trace[-1][1]:
            run.trace.append((run.elapsed(), inc.cost[0]))
    # valid for every placement, so for the joint model's scope
    pm.model.Add(pm.obj_comm >= sp.bound_units)
    if sp.proven:
        detail["notes"].append(
            f"split on the chip set of ranks {list(sp.group)}: every class of placements "
            "closed by its bound or its pinned model: the incumbent is optimal over every "
            "placement")
    out = SplitOutcome(sp, StageBound(split_s, "split", SCOPE_SETS), None)
    if sp.proven and out.optimal(pm, inc.chips(net)):
        out.done = {"status": "OPTIMAL", "objective_units": sp.cost_units,
                    "bound_units": sp.bound_units, "by": "split", "done_at_s": run.elapsed()}
        detail["levels"]["comm"] = dict(out.done)
    return out


def decomposition_stage(run: PlacementRun, pm: PlacementModel, inc: Incumbent,
                        analytic: StageBound) -> StageBound:
    """Stage 5: the decomposition bound (``solvers.placement_decomposition``) within
    ``decomposition_share`` of the work budget; the analytic bound when it does not run."""
    hint_chips = inc.chips(run.network)
    if hint_chips is None:
        return StageBound(analytic.seconds, "decomposition", SCOPE_SETS)
    o = run.options
    dec_s, dec_scope, rows = phase_decomposition(
        pm, hint_chips, run.seed, run.budget.child(o.decomposition_share * run.budget.work),
        o.symmetry_breaking, o.log)
    run.detail["decomposition"] = {"bound_s": dec_s, "scope": dec_scope, "phases": rows}
    return StageBound(dec_s, "decomposition", dec_scope)


def _hint_joint_model(run: PlacementRun, pm: PlacementModel, inc: Incumbent) -> None:
    """Hint the joint model with the incumbent, or, when the model cannot represent it (a ring
    group off any cycle / path), with the cheapest priced placement it can represent."""
    hint_chips = inc.chips(run.network)
    if hint_chips is None:
        return
    cp_hint = hint_chips
    if not pm.in_scope(hint_chips):
        ok = [q for q in inc.pool if pm.in_scope(model_places(run.network, q))]
        if ok:
            q = min(ok, key=run.tm.cost)
            cp_hint = model_places(run.network, q)
            run.detail["cpsat_hint"] = {"objective_s": run.tm.cost(q)[0],
                                        "why": "the incumbent is outside the model's scope"}
    pm.add_hint(cp_hint)


class _Trace(cp_model.CpSolverSolutionCallback):
    """Appends (seconds since start, objective seconds) to the trace when a solution improves
    on the last traced one."""

    def __init__(self, pm: PlacementModel, t0: float, trace: list):
        super().__init__()
        self.pm, self.t0, self.trace = pm, t0, trace

    def on_solution_callback(self):
        o = self.pm.comm_seconds(self.ObjectiveValue())
        if not self.trace or o < self.trace[-1][1]:
            self.trace.append((time.perf_counter() - self.t0, o))


@dataclasses.dataclass
class JointOutcome:
    """Stage 6's result: CP-SAT's status code and name, its level-1 bound (None when it proved
    nothing), the chip per rank of its last solution (None: none) and each level's value."""
    code: int
    status: str
    bound: StageBound | None
    chips: list[int] | None
    level_values: dict


def joint_stage(run: PlacementRun, pm: PlacementModel, inc: Incumbent,
                slack_s: float) -> JointOutcome:
    """Stage 6: the joint model minimising level 1 with the work left, hinted
    (``_hint_joint_model``); then, when level 1 is proven and ``lexicographic``, the
    tie-break levels (``tie_break_levels``)."""
    _hint_joint_model(run, pm, inc)
    m = pm.model
    m.Minimize(pm.obj_comm)
    solver = run.solver()
    st = solve(solver, m, _Trace(pm, run.t0, run.trace))
    run.budget.account(solver, st, "the joint model")
    status = STATUS_NAMES.get(st, "UNKNOWN")
    detail = run.detail
    detail.update(variables=len(m.Proto().variables), constraints=len(m.Proto().constraints))
    detail["overlap_rounding_s"] = slack_s
    joint_s = (max(0.0, pm.comm_seconds(solver.BestObjectiveBound()) - slack_s)
               if st in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN) else None)
    detail["joint_bound_s"] = joint_s
    bound = StageBound(joint_s, "joint CP-SAT", pm.scope) if joint_s is not None else None
    if status not in ("OPTIMAL", "FEASIBLE"):
        return JointOutcome(st, status, bound, None, {})
    best = [int(v) for v in solution_chips(solver, pm)]
    level_values = {"comm": solver.ObjectiveValue()}
    detail["levels"]["comm"] = {"status": status, "objective_units": solver.ObjectiveValue(),
                                "bound_units": solver.BestObjectiveBound(),
                                "done_at_s": run.elapsed()}
    if run.options.lexicographic and status == "OPTIMAL":
        best = tie_break_levels(run, pm, best, level_values)
    return JointOutcome(st, status, bound, best, level_values)


def tie_break_levels(run: PlacementRun, pm: PlacementModel, best: list[int],
                     level_values: dict) -> list[int]:
    """Levels 2 and 3 (``LEVELS``) in turn, each with the earlier levels fixed at their values
    (<=) and the work left, hinted with the last solution `best`; stops at the first level not
    proven. Records each level's value in `level_values`; returns the last solution."""
    budget, detail = run.budget, run.detail
    fixed = [(pm.obj_comm, int(round(level_values["comm"])))]
    for name, expr in pm.objectives[1:]:
        if budget.left() <= LEVEL_MIN_S * WORK_PER_S or budget.wall_left() <= LEVEL_MIN_S:
            if budget.left() > LEVEL_MIN_S * WORK_PER_S:
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
        s2 = run.solver()
        st2 = solve(s2, m2)
        budget.account(s2, st2, f"the {name} level")
        stn = STATUS_NAMES.get(st2, "UNKNOWN")
        detail["levels"][name] = {"status": stn, "done_at_s": run.elapsed()}
        if stn in ("OPTIMAL", "FEASIBLE"):
            best = [int(v) for v in solution_chips(s2, pm)]
            level_values[name] = s2.ObjectiveValue()
            detail["levels"][name].update(objective=s2.ObjectiveValue(),
                                          bound=s2.BestObjectiveBound())
            fixed.append((expr, int(round(s2.ObjectiveValue()))))
        if stn != "OPTIMAL":
            break
    return best


def _best_bound(run: PlacementRun, pm: PlacementModel,
                bounds: list[StageBound | None]) -> StageBound:
    """The largest bound valid over the joint model's scope (ties: the one over every
    placement); records the largest over every placement as ``bound_every_placement_s``.
    `bounds`: analytic first; None where a stage gave none."""
    opts = [b for b in bounds if b is not None and b.scope in (SCOPE_SETS, pm.scope)]
    best = max(opts, key=lambda b: (b.seconds, b.scope == SCOPE_SETS))
    run.detail["bound_every_placement_s"] = max(b.seconds for b in opts if b.scope == SCOPE_SETS)
    return best


def _joint_answer(run: PlacementRun, pm: PlacementModel, inc: Incumbent, joint: JointOutcome,
                  split: SplitOutcome, bound: StageBound) -> StageAnswer:
    """The answer from the joint model's solution, the incumbent and the bound: the incumbent
    when CP-SAT reported no solution or when it is better by Q2; OPTIMAL when the split proved
    the answer optimal or its objective meets `bound`; FEASIBLE when the model's objective and
    Q2's differ by more than the overlap rounding."""
    detail, net = run.detail, run.network
    if joint.chips is None:
        if joint.code == cp_model.INFEASIBLE:
            detail["notes"].append("the CP-SAT model is infeasible (a modelling error: every "
                                   "placement is feasible)")
        if inc.placement is None:
            return StageAnswer(None, joint.status, bound)
        detail["notes"].append("no solution reported in the time limit: the incumbent "
                               f"({inc.source}) returned")
        detail["model_objective_s"] = None
        return StageAnswer(inc.placement, "OPTIMAL" if split.optimal(pm, inc.chips(net))
                       else "FEASIBLE", bound)
    if split.done is not None:
        # proven by the split before the joint solve (which then gives the tie-break levels a
        # solution of the joint model to start from)
        detail["levels"]["comm"] = dict(split.done,
                                        joint_done_at_s=detail["levels"]["comm"]["done_at_s"])
    status = joint.status
    placement = chips_to_devices(net, joint.chips)
    q2 = predict_step(run.evidence, placement, net, run.tm)
    model_obj_s = pm.comm_seconds(joint.level_values["comm"])
    tol = 1e-9 * max(abs(q2.communication_s), 1e-12) + pm.comm_seconds(pm.rounding_units)
    detail["model_objective_s"] = model_obj_s
    if abs(model_obj_s - q2.communication_s) > tol:
        detail["notes"].append(
            f"model objective {model_obj_s:.6g} s differs from Q2 {q2.communication_s:.6g} s "
            "(a ring order the model chose differs from the canonical one): not proven")
        if status == "OPTIMAL":
            status = "FEASIBLE"
    if inc.placement is not None and inc.cost < run.tm.cost(placement):
        # never worse than the incumbent (the model's ring orders may differ from Q2's)
        detail["notes"].append(f"the incumbent ({inc.source}) is better by Q2: returned")
        st_inc = ("OPTIMAL" if split.optimal(pm, inc.chips(net))
                  else "FEASIBLE" if inc.cost[0] > bound.seconds * (1 + MEETS_REL) else status)
        return StageAnswer(inc.placement, st_inc, bound)
    if status == "FEASIBLE" and (_meets(q2.communication_s, bound.seconds)
                                 or split.optimal(pm, joint.chips)):
        status = "OPTIMAL"           # the incumbent meets a proven bound (decomposition / analytic)
    return StageAnswer(placement, status, bound, q2)


def _certify(run: PlacementRun, inc: Incumbent, answer: StageAnswer,
             analytic: StageBound) -> PlacementResult:
    """The certificate of `answer`, in one place: objective = Q2's ``communication_s`` of the
    placement, bound = min(the answer's bound, the objective), ``detail`` with the bound's
    source and scope and the work budget's record (CP-SAT runs), the solver named by the method
    (CP-SAT or the heuristic); the result carries the cheapest placements priced."""
    detail = run.detail
    if answer.placement is None:
        cert = Certificate(SOLVER_NAME, answer.status, None, answer.bound.seconds,
                           run.elapsed(), "s", run.seed, run.workers, run.time_limit_s, detail)
        return PlacementResult(None, cert, None, run.trace)
    b = answer.bound
    q2 = answer.q2 or predict_step(run.evidence, answer.placement, run.network, run.tm)
    method = detail.get("method", "")
    if method.startswith(("CP-SAT", "incumbent")):
        detail["work"] = run.budget.to_json()
    detail.update(bound_source=b.source, bound_scope=b.scope)
    detail.setdefault("bound_every_placement_s",
                      b.seconds if b.scope == SCOPE_SETS else analytic.seconds)
    cert = Certificate(SOLVER_NAME if method.startswith("CP-SAT")
                       else detail.get("method", SOLVER_NAME), answer.status,
                       q2.communication_s, min(b.seconds, q2.communication_s),
                       run.elapsed(), "s", run.seed, run.workers, run.time_limit_s, detail)
    return PlacementResult([int(v) for v in answer.placement], cert, q2, run.trace, inc.kept())


# -- the solver ---------------------------------------------------------------------------------
def solve_placement(evidence: Evidence, network: Network, time_limit_s: float = 10.0, *,
                    seed: int = 0, workers: int = 1, hint: Sequence[int] | None = None,
                    options: PlacementOptions | None = None) -> PlacementResult:
    """Best placement (device index per logical rank) under the CP-SAT model, with a certificate
    (module docstring: the stages, the bound, the work budget).

    `hint`: a placement to start from (e.g. ``extract.network.default_device_order``); when the
    limit ends before the search reports a solution, the hint is returned as the incumbent.
    `options` (``PlacementOptions``; default: its defaults): warm start, split, decomposition,
    tie-break levels, formulation, variable cap. The answer is never worse by Q2's cost than the
    incumbent (the hint and the axis orders priced)."""
    run = PlacementRun.start(evidence, network, time_limit_s, seed, workers,
                     options if options is not None else PlacementOptions())
    analytic = analytic_stage(run)
    plan = model_plan(run)
    inc = incumbent_stage(run, hint, plan)
    return _certify(run, inc, _solve_stages(run, inc, plan, analytic), analytic)


def _solve_stages(run: PlacementRun, inc: Incumbent, plan: ModelPlan,
                  analytic: StageBound) -> StageAnswer:
    """Stages 2 (its early answer) to 6 in order; the answer of the first that settles it."""
    detail, o = run.detail, run.options
    if inc.placement is not None and _meets(inc.cost[0], analytic.seconds):
        detail["method"] = "CP-SAT not needed"
        detail["notes"].append("the incumbent meets the analytic lower bound: optimal over every "
                               "placement")
        detail["levels"]["comm"] = {"status": "OPTIMAL", "by": "analytic bound",
                                    "done_at_s": run.elapsed()}
        return StageAnswer(inc.placement, "OPTIMAL", analytic)
    detail["estimated_build_s"] = plan.build_s
    if plan.heuristic and inc.placement is not None:
        return heuristic_stage(run, inc, plan, analytic)
    # the warm start left no time to build the model (the work budget is untouched so far; the
    # clock's guard decides only on a slow machine): the incumbent
    if inc.placement is not None and run.budget.wall_left() < plan.build_s + MIN_SOLVE_S:
        run.budget.note_wall_cut("the CP-SAT model not built")
        detail["method"] = "incumbent (no time for the CP-SAT model)"
        detail["notes"].append(
            f"{run.budget.wall_left():.2f} s left, building the CP-SAT model "
            f"(~{plan.variables:,} variables) takes ~{plan.build_s:.1f} s: the incumbent "
            f"({inc.source}) returned")
        return StageAnswer(inc.placement, "OPTIMAL" if _meets(inc.cost[0], analytic.seconds)
                       else "FEASIBLE", analytic)
    pm = PlacementModel(run.evidence, run.network, formulation=o.formulation,
                        symmetry_breaking=o.symmetry_breaking)
    run.budget.charge_seconds(plan.build_s)
    detail.update(method=f"CP-SAT ({pm.formulation})", formulation=pm.formulation,
                  scope=pm.scope, unit_bytes=pm.unit_bytes, build_s=run.elapsed())
    detail["notes"] += list(pm.notes)
    slack_s = pm.comm_seconds(pm.rounding_units)       # overlap rounding, < 1 unit per run
    split = split_stage(run, pm, inc, slack_s)
    if split.done is not None and not o.lexicographic:
        # level 1 is all that is asked: the joint model has nothing to add
        detail["method"] = f"CP-SAT (split; {pm.formulation} model not solved)"
        detail["model_objective_s"] = pm.comm_seconds(split.proof.cost_units)
        detail["bound_every_placement_s"] = split.bound.seconds
        return StageAnswer(inc.placement, "OPTIMAL", split.bound)
    dec = (decomposition_stage(run, pm, inc, analytic)
           if o.decomposition and not (split.proof is not None and split.proof.proven)
           else StageBound(analytic.seconds, "decomposition", SCOPE_SETS))
    joint = joint_stage(run, pm, inc, slack_s)
    bound = _best_bound(run, pm, [analytic, split.bound, dec, joint.bound])
    return _joint_answer(run, pm, inc, joint, split, bound)
