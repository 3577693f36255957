"""Solve the sharding ILP and turn the answer into a Layout.

``solve_sharding(ir, target, mesh_axes)`` builds the strategies
(``aoizora.formulation.strategies``) and the PuLP model (``aoizora.formulation.sharding_ilp``),
solves it with HiGHS (default) or CBC (``solver="cbc"``), each as a process on an MPS file that
is killed at the deadline (one thread, fixed seed, time limit), and returns a
``ShardingResult``: the Layout, a Certificate (status, objective, best bound and gap as the
solver reported them: CBC's log, HiGHS's ``mip_dual_bound``), the chosen strategies in words,
the ILP's size, and -- with ``k_best > 1`` -- the next best distinct solutions (each found after
a no-good cut on the previous ones). With ``distinct="kv"`` the second solution must also run
the keys/values of every attention op that offers both ways the other way (gathered / in a ring)
than the first (the ``kv-mode`` rows of ``formulation.sharding_ilp``; skipped when no such
solution exists), the rest plain no-good cuts: the K best then differ in the decision the
placement-oblivious model prices least reliably (how much of a ring's traffic hides behind
compute), not in the layout of one small op.

``time_limit_s`` is a wall-clock budget for the whole solve, after the build (``build_s``,
reported apart): ``solve_model`` starts from a coordinate-descent incumbent, solves HiGHS's LP
relaxation (an integral solution is proven optimal by its own value), then the MIP on the time
left (HiGHS, or CBC with a hard deadline), and returns the best answer, marked not proven unless
a solver's bound proves it. HiGHS is the default: on the large instances it proves optima CBC
does not reach in the planner's share (``benchmarks/results/sharding_solvers.md``; a summary in
benchmarks/results/lab_notes.md). The solver runs themselves (CBC or
HiGHS on a PuLP model within a deadline: ``run_solver``, ``run_cbc``, ``run_highs``,
``available_solvers`` and the measured cost constants) live in ``aoizora.solvers.mip_run`` and
are re-exported here; the instance's knobs and its build (``ShardingProblem``,
``build_problem``) in ``aoizora.solvers.sharding_problem``; a choice as a Layout and in words
(``to_layout``, ``tensor_spec``, ``layout_words``) in ``aoizora.solvers.sharding_layout``.

When no layout fits in HBM it raises ``MemoryBudgetError`` saying how much is missing: the
smallest per-device peak over all layouts (a second ILP that minimises it) against the budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulp

from aoizora.formulation.compiler_settings import ilp_compiler_options
from aoizora.formulation.layout import Layout
from aoizora.formulation.remat import remat_values, remat_words
from aoizora.formulation.sharding_ilp import (TIME_SCALE, MEM_SCALE, ILPModel, add_kv_mode_cut,
                                              add_no_good, build_model, chosen, evaluate,
                                              peak_memory)
from aoizora.formulation.strategies import StrategyGraph
from aoizora.solvers.budget import SHARES, clock
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.stop import checkpoint
# the solver runs (re-exported: they were defined here); solve_model reads CBC_MIN_S_PER_NONZERO,
# HIGHS_LP_MIN_S_PER_NONZERO, run_cbc and run_highs through this module's names, so patching
# them here steers solve_model, while run_solver and run_cbc/run_highs read mip_run's own
from aoizora.solvers.mip_run import (CBC_MIN_S_PER_NONZERO, CBC_STOP_S, HIGHS_LP_MIN_S_PER_NONZERO,
                                     MIN_CBC_SEC, READBACK_S, READBACK_S_PER_COLUMN,
                                     ShardingSolveError, run_cbc, run_highs, available_solvers,
                                     run_solver)
from aoizora.solvers.sharding_heuristics import ShardingInstance, coordinate_descent
from aoizora.solvers.sharding_layout import layout_words, tensor_spec, to_layout
from aoizora.solvers.sharding_problem import GiB, ShardingProblem, build_problem

__all__ = ["ShardingSolveError", "MemoryBudgetError", "ShardingSolution", "ShardingResult",
           "available_solvers", "run_solver", "solve_model", "settle_ties", "tensor_spec",
           "to_layout", "min_peak_bytes",
           "ShardingProblem", "build_problem", "solve_sharding", "solve_program", "GiB", "INCUMBENT_SHARE",
           "CBC_COMFORT", "INTEGRAL_TOL", "PROOF_REL_TOL", "CBC_MIN_S_PER_NONZERO",
           "HIGHS_LP_MIN_S_PER_NONZERO", "READBACK_S", "READBACK_S_PER_COLUMN", "CBC_STOP_S",
           "MIN_CBC_SEC"]


class MemoryBudgetError(ShardingSolveError):
    """No layout on this mesh fits in the per-device HBM budget."""

    def __init__(self, msg: str, min_bytes: float | None, budget: float):
        super().__init__(msg)
        self.min_bytes = min_bytes
        self.budget = budget


@dataclasses.dataclass
class ShardingSolution:
    layout: Layout
    certificate: Certificate
    choice: dict[str, str]                 # group id -> strategy name
    words: list[str]                       # "attention 0.12: heads on y, sequence on x", ...
    predicted: dict[str, float]            # Q1 parts, seconds
    peak_bytes: float                      # largest memory row, bytes per device
    # attention node key -> {"kv": mode, "compute_s": Q1's unscaled compute of its strategy, per
    # call (times repeat)}: what ``formulation.attention_calibration`` compares with the compiler
    attention: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout.to_json(), "certificate": self.certificate.to_json(),
                "choice": dict(self.choice), "words": list(self.words),
                "predicted": dict(self.predicted), "peak_bytes": self.peak_bytes,
                "attention": {k: dict(v) for k, v in self.attention.items()}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ShardingSolution":
        """The solution of ``to_json``'s dict."""
        return cls(Layout.from_json(d["layout"]), Certificate.from_json(d["certificate"]),
                   dict(d["choice"]), list(d["words"]), dict(d["predicted"]),
                   float(d["peak_bytes"]), {k: dict(v) for k, v in d["attention"].items()})


@dataclasses.dataclass
class ShardingResult:
    best: ShardingSolution
    alternatives: list[ShardingSolution]   # the next best distinct solutions (k_best - 1 at most)
    size: dict[str, int]                   # groups, strategies, edges, ILP variables and rows
    build_s: float                         # seconds to build strategies and model

    @property
    def layout(self) -> Layout:
        return self.best.layout

    @property
    def certificate(self) -> Certificate:
        return self.best.certificate

    def all(self) -> list[ShardingSolution]:
        return [self.best] + self.alternatives

    def to_json(self) -> dict[str, Any]:
        return {"best": self.best.to_json(), "alternatives": [a.to_json() for a in self.alternatives],
                "size": dict(self.size), "build_s": self.build_s}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ShardingResult":
        """The result of ``to_json``'s dict."""
        return cls(ShardingSolution.from_json(d["best"]),
                   [ShardingSolution.from_json(a) for a in d["alternatives"]],
                   dict(d["size"]), float(d["build_s"]))


# ---------------------------------------------------------------------------------------------
# the budgeted solve: incumbent, then the MIP solver or the LP relaxation, then the better answer

INCUMBENT_SHARE = SHARES["incumbent"].fraction   # of the budget, at most, for the incumbent
CBC_COMFORT = 2.0            # below this x CBC's minimum: the LP relaxation first (short budget)
INTEGRAL_TOL = 1e-6          # an LP value this close to 0 or 1 counts as integral
PROOF_REL_TOL = 1e-9         # objective within this (relative) of a bound: proven optimal
TIE_REL_TOL = 1e-9           # two Q1 values this close (relative) are a tie (settle_ties)


def _nonzeros(prob: pulp.LpProblem) -> int:
    return sum(len(c) for c in prob.constraints()) + len(prob.objective or {})


def _rows_hold(model: ILPModel, choice: dict[str, int], remat: Any = "free") -> bool:
    """Whether a choice keeps every row of the model that involves only strategy variables
    ``s`` (one-hot, memory, no-good, kv-mode); the flow rows hold by construction (x follows s).
    ``remat``: with a remat decision, the remat choice the layout comes with (a mapping, or None
    for the program as traced): the rows over strategy and remat binaries are checked too (a
    no-good over a (layout, remat) pair); "free" checks strategy-only rows."""
    val: dict[str, float] = {}
    if remat != "free" and model.remat is not None:
        val.update(remat_values(model.remat, remat))
    for gid, vs in model.s.items():
        for k, v in enumerate(vs):
            if not isinstance(v, int):
                val[v.name] = 1.0 if choice[gid] == k else 0.0
    for c in model.prob.constraints():
        tot = c.constant
        for v, a in c.items():
            x = val.get(v.name)
            if x is None:
                break
            tot += a * x
        else:
            tol = 1e-9 * max(1.0, abs(c.constant))
            if (c.sense == pulp.LpConstraintLE and tot > tol) or (
                    c.sense == pulp.LpConstraintGE and tot < -tol) or (
                    c.sense == pulp.LpConstraintEQ and abs(tot) > tol):
                return False
    return True


def settle_ties(graph: StrategyGraph, model: ILPModel, choice: dict[str, int],
                prefer: dict[str, int], corrections: dict[str, Any] | None = None,
                rel_tol: float = TIE_REL_TOL) -> tuple[dict[str, int], list[str]]:
    """(choice, moved groups): among Q1's tied optima, one closer to a preference.

    Q1 often cannot tell layouts apart that the compiler does (a small weight replicated or
    split: neither moves a byte Q1 prices), and the solver returns whichever tie it meets first.
    For each group g of ``prefer`` (group id -> strategy index; in sorted order, one pass):

      choice[g] <- prefer[g]   if  Q1(choice with g moved) <= Q1(choice) * (1 + rel_tol)
                               and every row of the model holds (``_rows_hold``)

    Q1 never rises by more than rel_tol per move, so an optimum stays an optimum (its certificate
    holds); greedy, so it is the nearest tie reachable one group at a time, not the nearest of all."""
    cur = dict(choice)
    q = evaluate(graph, cur, corrections)["total_s"]
    moved = []
    for gid in sorted(prefer):
        k = prefer[gid]
        if cur.get(gid, k) == k:
            continue
        trial = {**cur, gid: k}
        qt = evaluate(graph, trial, corrections)["total_s"]
        if qt <= q + rel_tol * abs(q) and _rows_hold(model, trial):
            cur, q = trial, min(q, qt)
            moved.append(gid)
    return cur, moved


def _integral_choice(model: ILPModel) -> dict[str, int] | None:
    """The choice of a solved model whose strategy variables are all integral, else None."""
    for vs in model.s.values():
        for v in vs:
            if not isinstance(v, int):
                x = v.value() or 0.0
                if min(abs(x), abs(1.0 - x)) > INTEGRAL_TOL:
                    return None
    return chosen(model)


def solve_model(graph: StrategyGraph, model: ILPModel, *, solver: str = "highs",
                time_limit_s: float = 30.0, seed: int = 0, threads: int = 1,
                corrections: dict[str, Any] | None = None, incumbent: bool = True
                ) -> dict[str, Any]:
    """Solve one sharding ILP (a built ``model`` on ``graph``) within `time_limit_s` seconds of
    wall clock counted from this call, and never answer worse than a cheap incumbent.

    1. Incumbent (``incumbent=True``): coordinate descent (``solvers.sharding_heuristics``) from
       all-replicated and from the cheapest strategy per group, no random restarts, for at most
       INCUMBENT_SHARE of the budget. Kept only if it satisfies every row of the model
       (``_rows_hold``: forbidden and K-best cuts included).
    2. The solvers on the time left. HiGHS (when installed) first solves the LP relaxation in
       process, without presolve: its value is a lower bound, and when its solution is
       integral in every strategy variable it is a layout proven optimal by that bound and CBC
       is not needed; else its rounding (each group's largest value) is a candidate if it keeps
       the rows (times and gaps: benchmarks/results/lab_notes.md). Then the MIP on what is
       left, as a process on an MPS file:
       ``solver="highs"`` (default) HiGHS (``run_highs``, ``highs_worker.py``), or
       ``solver="cbc"`` CBC (``run_cbc``), if at least CBC_MIN_S_PER_NONZERO x nonzeros is
       left: writing the MPS file, the solver's file read and its root LP cannot be cut
       (``mip_run``'s constants); a budget under CBC_COMFORT x that minimum is noted as
       short. With remat decisions and no candidate yet (no rounding fits a tight HBM budget),
       a zero-objective MIP first finds a (layout, remat) that fits (``_feasibility_stage``):
       a candidate, and the MIP's start. A solver still running at the deadline is killed (its
       answer lost; the incumbent and the LP bound remain): HiGHS does not check its time limit inside every step of its
       MIP presolve.
    3. The answer: the solver's if it is proven optimal, else the best of the solver's, the LP
       rounding and the incumbent (ties go to the solver's). The bound is the best of the
       solvers' lower bounds. Status OPTIMAL when the solver proved it or the answer's objective
       is within PROOF_REL_TOL of the bound; FEASIBLE (not proven) otherwise, with the bound when
       there is one; INFEASIBLE when a solver proved it (the LP relaxation's infeasibility too),
       UNKNOWN when there is no answer. ``detail["answer_from"]``: "solver", "lp-relaxation",
       "remat-fixed", "feasibility" or "incumbent"; ``detail["note"]`` says when the solver was
       cut or skipped; the stages'
       seconds are in detail.

    Returns run_solver's dict (status, objective and bound in model units, time_s = wall clock
    of the whole call, solver, detail) plus "choice" (group -> strategy index, or None).
    Determinism: the incumbent and the LP relaxation are deterministic (single thread, fixed
    order); CBC and HiGHS are seeded, but where a time limit stops them, and which path a budget
    near the thresholds takes, depend on the machine's speed and load."""
    if solver not in ("cbc", "highs"):
        raise ShardingSolveError(f"unknown solver {solver!r}; use 'cbc' or 'highs'")
    t0 = clock()
    checkpoint()
    run = _ModelSolve(graph, model, solver, seed, threads, corrections, deadline=t0 + time_limit_s)
    # remat decisions: the incumbent and the LP rounding see strategies only; the solver decides
    run.remat = model.remat is not None and model.remat.problem.decide
    if incumbent and not run.remat:
        _incumbent_stage(run, INCUMBENT_SHARE * time_limit_s)
        checkpoint()
    nnz = _nonzeros(model.prob)
    cbc_need = CBC_MIN_S_PER_NONZERO * nnz
    left = run.deadline - clock()
    if left < CBC_COMFORT * cbc_need:
        run.stages["short_budget"] = (f"{left:.3f} s left, less than {CBC_COMFORT:g} x the "
                                      f"{cbc_need:.3f} s the MIP solver needs before it can stop "
                                      f"({nnz} nonzeros)")
    if run.remat:   # the program as traced first, then a bound, then the other fixed remats
        _remat_fixed_stage(run, HIGHS_LP_MIN_S_PER_NONZERO * nnz, REMAT_TRIALS[:1])
        left = run.deadline - clock()
    _lp_stage(run, HIGHS_LP_MIN_S_PER_NONZERO * nnz, left)
    checkpoint()
    if run.remat and run.proven is None:
        _remat_fixed_stage(run, HIGHS_LP_MIN_S_PER_NONZERO * nnz, REMAT_TRIALS[1:])
    if run.remat and not run.cands and not run.infeasible and solver == "highs":
        _feasibility_stage(run, cbc_need)
    checkpoint()
    mip = _mip_stage(run, cbc_need)
    return _answer(run, mip, clock() - t0)


@dataclasses.dataclass
class _ModelSolve:
    """One ``solve_model`` call: its inputs and what its stages found so far."""

    graph: StrategyGraph
    model: ILPModel
    solver: str
    seed: int
    threads: int
    corrections: dict[str, Any] | None
    deadline: float                                   # a ``clock()`` value
    stages: dict[str, Any] = dataclasses.field(default_factory=dict)
    cands: list = dataclasses.field(default_factory=list)   # (objective, rank, source, choice)
    bounds: list[float] = dataclasses.field(default_factory=list)
    names: list[str] = dataclasses.field(default_factory=list)
    infeasible: bool = False
    proven: tuple | None = None                       # the candidate a solver proved optimal
    remat: bool = False                               # the model decides rematerialization
    remat_choice: dict[str, str] | None = None        # the solver's remat choice (None: traced)
    remat_fixed: dict[str, str] | None = None         # the remat of the "remat-fixed" candidate
    remat_feasible: dict[str, str] | None = None      # the remat of the "feasibility" candidate
    start: dict[str, float] | None = None             # the MIP's start (``_feasibility_stage``)


def _incumbent_stage(run: _ModelSolve, limit_s: float) -> None:
    """Step 1 of ``solve_model``: the coordinate-descent incumbent, kept if it keeps every row."""
    t = clock()
    inst = ShardingInstance(run.graph, run.model, run.corrections)
    h = coordinate_descent(inst, time_limit_s=limit_s, seed=run.seed, max_restarts=1)
    run.stages["incumbent_s"] = round(clock() - t, 4)
    if h.choice is not None and _rows_hold(run.model, h.choice):
        run.cands.append((h.objective * TIME_SCALE, 2, "incumbent", h.choice))
        run.stages["incumbent_objective_s"] = h.objective
    else:
        run.stages["incumbent_note"] = ("no incumbent: the descent found no layout that keeps "
                                        "every row" if h.choice is not None else
                                        "no incumbent: the descent found no feasible layout")


def _lp_stage(run: _ModelSolve, lp_need: float, left: float) -> None:
    """Step 2's LP relaxation (HiGHS in process): a bound, and a candidate (proven when the
    relaxation is integral) if its rounding keeps the rows. ``left``: seconds left before it."""
    stages, model = run.stages, run.model
    if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
        if run.solver == "highs":
            raise ShardingSolveError("HiGHS is not available: pip install highspy (or use "
                                     "solver='cbc')")
        stages["lp_skipped"] = "HiGHS (highspy) is not installed"
        return
    if left < lp_need:
        stages["lp_skipped"] = f"{left:.3f} s left, the LP relaxation needs about {lp_need:.3f} s"
        return
    t = clock()
    r = run_highs(model.prob, run.deadline, run.seed, run.threads, mip=False)
    stages["lp_relaxation_s"] = round(clock() - t, 4)
    stages["lp_relaxation"] = r["detail"]
    run.names.append(r["solver"])
    if r["status"] == "INFEASIBLE":
        run.infeasible = True
    elif r["status"] == "OPTIMAL":
        run.bounds.append(r["bound"])
        ch = _integral_choice(model)
        stages["lp_integral"] = ch is not None
        if run.remat:      # a bound only (Q1's evaluate does not price the remat part); it
            fixed = min((c for c in run.cands if c[2] == "remat-fixed"), default=None)
            if fixed and fixed[0] - r["bound"] <= PROOF_REL_TOL * max(abs(fixed[0]), 1.0):
                run.proven = fixed                      # proves a fixed-remat layout optimal
            return
        if ch is None:
            ch = chosen(model)       # rounding: each group's largest value
        if _rows_hold(model, ch):
            obj = evaluate(run.graph, ch, run.corrections)["total_s"] * TIME_SCALE
            run.cands.append((obj, 1, "lp-relaxation", ch))
            if stages["lp_integral"] and obj - r["bound"] <= PROOF_REL_TOL * max(abs(obj), 1.0):
                run.proven = run.cands[-1]


REMAT_TRIALS = (None, "keep", "recompute", "offload")   # traced, then every name one way


def _remat_fixed_stage(run: _ModelSolve, lp_need: float, trials: tuple) -> None:
    """With remat decisions: the LP relaxation with the remat binaries fixed to each of
    ``REMAT_TRIALS`` (the same model, bounds moved; run before the free relaxation, traced
    first, so a short budget still gets the program as traced); each answer rounded (each
    group's largest value) and kept if it holds every row (``_remat_candidate``), priced by the
    whole objective; the best one is a candidate beside the MIP's answer (which may mix choices
    per activation), proven optimal when the free relaxation's bound meets it. Needs HiGHS in
    process; skipped without it."""
    rv = run.model.remat
    if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
        return
    best = None
    for trial in trials:
        if (trial is not None and trial not in rv.problem.choices) or \
                run.deadline - clock() < lp_need:
            continue
        rm = None if trial is None else {a: trial for a in rv.problem.names}
        rv.fix(rm)
        try:
            r = run_highs(run.model.prob, run.deadline, run.seed, run.threads, mip=False)
        finally:
            rv.unfix()
        obj = _remat_candidate(run, rm) if r["status"] == "OPTIMAL" else None
        run.stages.setdefault("remat_fixed", []).append(
            {"remat": trial or "traced", "status": r["status"], "bound": r["bound"],
             "objective": None if obj is None else obj[0]})
        if obj is not None and (best is None or obj[0] < best[0]):
            best = (obj[0], obj[1], rm)
    prev = [c for c in run.cands if c[2] == "remat-fixed"]
    if best is not None and (not prev or best[0] < prev[0][0]):
        run.cands[:] = [c for c in run.cands if c[2] != "remat-fixed"]   # one: the best
        run.cands.append((best[0], 1, "remat-fixed", best[1]))
        run.remat_fixed = best[2]


def _remat_candidate(run: _ModelSolve, rm: dict[str, str] | None):
    """(objective in model units, choice) of the solved LP's rounding (each group's largest
    value) under the remat ``rm``, if it keeps every row: the strategy-only rows by
    ``_rows_hold``, the memory rows with the stacks by ``peak_memory``; else None."""
    model = run.model
    ch = _integral_choice(model) or chosen(model)
    if not _rows_hold(model, ch, rm) or peak_memory(model, ch, rm) > model.hbm_budget * (1 + 1e-9):
        return None
    rmv = model.remat_eval(ch, rm)
    q = evaluate(run.graph, ch, run.corrections)["total_s"] + rmv["recompute_s"] + rmv["offload_s"]
    return q * TIME_SCALE, ch


FEASIBILITY_SHARE = SHARES["feasibility"].fraction   # of the time left (``_feasibility_stage``)


def _feasibility_stage(run: _ModelSolve, cbc_need: float) -> None:
    """With remat decisions, when no rounding kept the rows (a tight HBM budget): HiGHS's MIP on
    the same rows with a zero objective (any (layout, remat) that fits; its first incumbent
    ends the search) for FEASIBILITY_SHARE of the time left. Its answer is a candidate priced by
    the whole objective, and the MIP start of the MIP that follows (``run.start``): on tight
    budgets HiGHS's MIP with the objective may find no layout at all in the budget (wan2.1-small's
    training step on v5p-8 under 95% of the smallest kept-residual peak: none in 120 s; with a
    zero objective, one in 5 s)."""
    left = run.deadline - clock()
    if left * FEASIBILITY_SHARE < cbc_need:
        return
    prob, model = run.model.prob, run.model
    objective = prob.objective
    prob.objective = pulp.LpAffineExpression()
    t = clock()
    try:
        r = run_highs(prob, clock() + left * FEASIBILITY_SHARE, run.seed, run.threads)
    finally:
        prob.objective = objective
    run.stages["feasibility_s"] = round(clock() - t, 4)
    run.stages["feasibility"] = r["detail"].get("highs_status", r["status"])
    if r["detail"].get("highs_status") not in ("Optimal", "Time limit reached") or \
            any(v.value() is None for vs in model.s.values() for v in vs if not isinstance(v, int)):
        return
    ch, rm = chosen(model), model.remat.choice()
    if not _rows_hold(model, ch, rm) or peak_memory(model, ch, rm) > model.hbm_budget * (1 + 1e-9):
        return
    rmv = model.remat_eval(ch, rm)
    q = evaluate(run.graph, ch, run.corrections)["total_s"] + rmv["recompute_s"] + rmv["offload_s"]
    run.cands.append((q * TIME_SCALE, 2, "feasibility", ch))
    run.remat_feasible = rm
    run.start = {v.name: v.value() for v in prob.variables()
                 if v.cat == pulp.LpInteger and v.value() is not None}


def _mip_stage(run: _ModelSolve, cbc_need: float) -> dict[str, Any] | None:
    """Step 2's MIP (HiGHS or CBC as a process on an MPS file) on the time left, when nothing is
    proven yet and at least ``cbc_need`` seconds are left; returns its run (None if skipped)."""
    stages = run.stages
    left = run.deadline - clock()
    # both MIPs run as a process on an MPS file: the same minimum (CBC_MIN_S_PER_NONZERO)
    run_mip = run.proven is None and not run.infeasible and left >= cbc_need
    if run.proven is None and not run.infeasible and not run_mip:
        stages[f"{run.solver}_skipped"] = (
            f"{left:.3f} s left, {'CBC' if run.solver == 'cbc' else 'HiGHS'}"
            f" needs about {cbc_need:.3f} s before it can stop")
    if not run_mip:
        return None
    t = clock()
    prob = run.model.prob
    r = run_cbc(prob, run.deadline, run.seed, run.threads) if run.solver == "cbc" else \
        run_highs(prob, run.deadline, run.seed, run.threads,
                  **({"start": run.start} if run.start else {}))
    stages["solver_s"] = round(clock() - t, 4)
    run.names.append(r["solver"])
    stages.update(r["detail"])
    if r["status"] == "INFEASIBLE":
        run.infeasible = True
    if r["bound"] is not None and r["status"] != "OPTIMAL":
        run.bounds.append(r["bound"])
    if r["objective"] is not None:
        if run.remat:
            run.remat_choice = run.model.remat.choice()
        run.cands.append((r["objective"], 0, "solver", chosen(run.model)))
        if r["status"] == "OPTIMAL":
            run.proven = run.cands[-1]
    return r


def _answer(run: _ModelSolve, mip: dict[str, Any] | None, time_s: float) -> dict[str, Any]:
    """Step 3 of ``solve_model``: the answer, its status and bound, and why it is not the
    solver's proof when it is not."""
    names, detail = run.names, run.stages
    if not names:
        names.append(f"PuLP {pulp.__version__}/{'CBC' if run.solver == 'cbc' else 'HiGHS'} "
                     "(not run)")
    bound = max(run.bounds) if run.bounds else None
    if not run.cands:
        status = "INFEASIBLE" if run.infeasible else "UNKNOWN"
        return {"status": status, "objective": None, "bound": bound, "solver": " + ".join(names),
                "detail": detail, "choice": None, "time_s": time_s}
    obj, _, source, ch = (run.proven if run.proven is not None
                          else min(run.cands, key=lambda c: (c[0], c[1])))
    detail["answer_from"] = source
    if run.infeasible:   # cannot happen but numerically: say so rather than hide it
        detail["infeasible_note"] = ("a solver reported the model infeasible, yet this layout "
                                     "keeps every row of it")
    if run.proven is not None:
        status, bound = "OPTIMAL", obj
        if source == "lp-relaxation":
            detail["proof"] = "the LP relaxation's solution is integral: its value bounds every layout"
    elif bound is not None and obj - bound <= PROOF_REL_TOL * max(abs(obj), 1.0):
        status, bound = "OPTIMAL", obj
        detail["proof"] = "objective equals the solvers' lower bound"
    else:
        status = "FEASIBLE"
        if bound is not None:
            bound = min(bound, obj)
    if source != "solver" or status != "OPTIMAL":
        detail["note"] = (_why_not_solver(detail, mip) + f"; the answer is the {source}'s"
                          + ("" if status == "OPTIMAL" else ", not proven optimal"))
    name = " + ".join(names)
    if source == "incumbent":
        name = f"coordinate descent (incumbent) + {name}"
    return {"status": status, "objective": obj, "bound": bound, "solver": name,
            "detail": detail, "choice": ch, "time_s": time_s,
            "remat": {"solver": run.remat_choice, "remat-fixed": run.remat_fixed,
                      "feasibility": run.remat_feasible}.get(source)}


def _why_not_solver(stages: dict[str, Any], mip: dict[str, Any] | None) -> str:
    why = []
    if "short_budget" in stages:
        why.append("short budget: LP relaxation first"
                   + (" (skipped)" if "lp_skipped" in stages else ""))
    if "cbc_skipped" in stages:
        why.append("CBC skipped (too little time left for its file and root LP)")
    if "highs_skipped" in stages:
        why.append("HiGHS skipped (too little time left for its file and root LP)")
    if mip is not None and mip["status"] != "OPTIMAL":
        why.append(f"{mip['solver']} stopped at the budget ({mip['status']}"
                   + (", killed" if "killed" in mip["detail"] else "") + ")")
    return "; ".join(why)


def _solution(ir, graph, model: ILPModel, res: dict, choice: dict[str, int], run: _Run,
              rank: int) -> ShardingSolution:
    pred = evaluate(graph, choice, run.corrections)
    remat = res.get("remat")
    if model.remat_eval is not None:
        rm = model.remat_eval(choice, remat)
        pred.update(recompute_s=rm["recompute_s"], offload_s=rm["offload_s"],
                    stack_bytes=sum(rm["stack_bytes"]))
        pred["total_s"] += rm["recompute_s"] + rm["offload_s"]
    obj = res["objective"] / TIME_SCALE if res["objective"] is not None else None
    bound = res["bound"] / TIME_SCALE if res["bound"] is not None else None
    if obj is not None and bound is not None:
        bound = min(bound, obj) if res["status"] != "OPTIMAL" else bound
    detail = dict(res["detail"])
    detail["rank"] = rank
    cert = Certificate(solver=res["solver"], status=res["status"], objective=obj, bound=bound,
                       time_s=res["time_s"], unit="s", seed=run.seed, workers=run.threads,
                       time_limit_s=run.time_limit_s, detail=detail)
    layout = to_layout(ir, graph, choice, name="ilp" if rank == 0 else f"ilp#{rank + 1}")
    layout.remat = remat
    return ShardingSolution(
        layout=layout,
        certificate=cert,
        choice={g: graph.groups[g].strategies[k].name for g, k in choice.items()},
        words=layout_words(ir, graph, choice) + ([remat_words(remat)] if model.remat else []),
        predicted=pred, peak_bytes=peak_memory(model, choice, remat),
        attention={g: {"kv": graph.groups[g].strategies[k].kv,
                       "compute_s": graph.groups[g].strategies[k].compute}
                   for g, k in choice.items()
                   if graph.groups[g].kind in ("attention", "attention_bwd")})


def min_peak_bytes(ir, graph: StrategyGraph, *, solver: str = "highs", time_limit_s: float = 30.0,
                   seed: int = 0, threads: int = 1, small_bytes: float = 0.0
                   ) -> tuple[float | None, str]:
    """The smallest per-device peak (bytes) over all layouts, under the ILP's memory model, and
    the solver status of that answer."""
    m = build_model(ir, graph, hbm_budget=float("inf"), objective="memory", small_bytes=small_bytes)
    r = run_solver(m.prob, solver, time_limit_s, seed, threads)
    if r["objective"] is None:
        return None, r["status"]
    return r["objective"] / MEM_SCALE, r["status"]


@dataclasses.dataclass(frozen=True)
class _Run:
    """How one ``solve_sharding`` call runs its solves."""

    solver: str
    time_limit_s: float
    seed: int
    threads: int
    corrections: dict[str, Any] | None

    def solve(self, graph, model, time_limit_s: float, incumbent: bool = True) -> dict[str, Any]:
        return solve_model(graph, model, solver=self.solver, time_limit_s=time_limit_s,
                           seed=self.seed, threads=self.threads, corrections=self.corrections,
                           incumbent=incumbent)


def solve_sharding(ir, target, mesh_axes: dict[str, int], problem: ShardingProblem | None = None,
                   *, solver: str = "highs", time_limit_s: float = 30.0, k_best: int = 1,
                   seed: int = 0, threads: int = 1, distinct: str = "any") -> ShardingResult:
    """Choose the layout of every op of `ir` on the logical mesh `mesh_axes` (see module doc).

    target: a Target (for chip numbers and default axis costs) or None with ``problem`` giving
    ``hardware`` and ``axis_costs``. problem: the instance's knobs
    (``solvers.sharding_problem.ShardingProblem``: axis costs, hardware, strategy options, HBM
    budget, the planner's corrections / forbidden combinations / attention scales, the tie
    preference ``prefer`` -- the groups it moved are in the best's certificate's
    ``detail["tie_moves"]`` -- and a StrategyGraph already built). distinct: "any" (the K best
    differ in at least one op) or "kv" (first in attention kv modes; module doc).
    Each layout returned carries the compiler options it is to be compiled with
    (``formulation.compiler_settings.ilp_compiler_options``: on TPU, no windowed einsums, so the
    compiled gathers are those Q1 priced).

    time_limit_s: the wall-clock budget, seconds, of the whole solve: the best layout
    (``solve_model``: a coordinate-descent incumbent, HiGHS's LP relaxation, then the MIP on the
    time left -- HiGHS by default, or CBC; the best answer, with an honest certificate) and the
    k_best - 1 alternatives, which get what the best left
    (when it runs out they are dropped and the best's certificate says so in
    ``detail["k_best_note"]``). The budget starts once strategies and model are built: the build
    is reported apart as ``ShardingResult.build_s`` and not counted. What can pass the budget:
    the parts that cannot be interrupted (one descent sweep, PuLP's MPS write or HiGHS model
    build once started, reading a solution back after CBC was killed at the deadline;
    benchmarks/results/lab_notes.md). Each
    certificate's time_s is the wall clock of its own solve. The error path (nothing fits in
    HBM) solves a second ILP for the missing bytes with the same limit."""
    if distinct not in ("any", "kv"):
        raise ValueError(f"distinct={distinct!r}: use 'any' or 'kv'")
    problem = problem or ShardingProblem()
    run = _Run(solver, time_limit_s, seed, threads, problem.corrections)
    checkpoint()
    t0 = clock()
    _, budget, graph, model = build_problem(ir, target, mesh_axes, problem)
    build_s = clock() - t0
    size = {"groups": len(graph.groups), "strategies": graph.num_strategies(),
            "edges": len(graph.edges), **model.size()}
    deadline = clock() + time_limit_s
    res = run.solve(graph, model, time_limit_s)
    if res["status"] == "INFEASIBLE" or (res["objective"] is None and res["status"] != "UNKNOWN"):
        _raise_no_layout(ir, graph, mesh_axes, budget, problem.forbidden, run)
    if res["objective"] is None:
        _raise_no_answer(res, run)
    first, res = _settle_preferred(graph, model, res, problem.prefer, run.corrections)
    best = _solution(ir, graph, model, res, first, run, 0)
    alts = _next_best(ir, graph, model, run, [first], best, k_best, distinct, deadline)
    for sol in (best, *alts):     # compiled with the settings under which Q1's collectives hold
        sol.layout.compiler_options = ilp_compiler_options(target)
    return ShardingResult(best=best, alternatives=alts, size=size, build_s=build_s)


def _raise_no_layout(ir, graph, mesh_axes, budget: float, forbidden, run: _Run) -> None:
    """No layout fits: ShardingSolveError once forbidden combinations are excluded, else
    MemoryBudgetError with the smallest peak (``min_peak_bytes``) against the budget."""
    if forbidden:
        raise ShardingSolveError(
            f"no layout on mesh {mesh_axes} fits in {budget / GiB:.2f} GiB per device once the "
            f"{len(forbidden)} forbidden combination(s) are excluded")
    need, st = min_peak_bytes(ir, graph, solver=run.solver, time_limit_s=run.time_limit_s,
                              seed=run.seed, threads=run.threads, small_bytes=budget * 1e-3)
    if need is None:
        raise MemoryBudgetError(f"no layout on mesh {mesh_axes} fits in {budget / GiB:.3f} GiB "
                                f"per device (the smallest peak could not be computed: {st}); "
                                f"use more chips or a smaller workload", None, budget)
    raise MemoryBudgetError(
        f"no layout on mesh {mesh_axes} fits in HBM: the smallest per-device peak over all "
        f"layouts is {need / GiB:.3f} GiB ({need:.0f} B) against {budget / GiB:.3f} GiB "
        f"({budget:.0f} B); {max(need - budget, 0) / GiB:.3f} GiB missing"
        f"{'' if st == 'OPTIMAL' else ' (minimum not proven: ' + st + ')'}; "
        f"use more chips, a mesh with more axes, or a smaller workload", need, budget)


def _raise_no_answer(res: dict[str, Any], run: _Run) -> None:
    err = ShardingSolveError(f"{res['solver']} found no layout within {run.time_limit_s} s "
                             f"(status {res['status']}); raise time_limit_s")
    err.certificate = Certificate(solver=res["solver"], status=res["status"], objective=None,
                                  bound=None if res["bound"] is None else res["bound"] / TIME_SCALE,
                                  time_s=res["time_s"], seed=run.seed, workers=run.threads,
                                  time_limit_s=run.time_limit_s, detail=dict(res["detail"]))
    raise err


def _settle_preferred(graph, model, res: dict[str, Any], prefer: dict[str, str] | None,
                      corrections) -> tuple[dict[str, int], dict[str, Any]]:
    """(choice, solve result): the solver's choice moved to ``prefer``'s strategies among Q1's
    tied optima (``settle_ties``), and the result updated when a group moved."""
    first = res["choice"]
    if not prefer or (model.remat is not None and model.remat.problem.decide):
        return first, res     # remat rows are not checked by settle_ties' _rows_hold
    names = {g: [st.name for st in graph.groups[g].strategies]
             for g in prefer if g in graph.groups}
    idx = {g: names[g].index(name) for g, name in prefer.items()
           if name in names.get(g, ())}
    first, moved = settle_ties(graph, model, first, idx, corrections)
    if moved:
        q1 = evaluate(graph, first, corrections)["total_s"] * TIME_SCALE
        res = {**res, "choice": first, "objective": min(res["objective"], q1),
               "detail": {**res["detail"], "tie_moves": moved}}
    return first, res


def _next_best(ir, graph, model: ILPModel, run: _Run, prev: list[dict[str, int]],
               best: ShardingSolution, k_best: int, distinct: str, deadline: float
               ) -> list[ShardingSolution]:
    """The k_best - 1 next best distinct solutions after ``prev`` (the best's choice), each
    after a no-good cut on the one before (the first also after the kv-mode cut with
    ``distinct="kv"``), within what is left before ``deadline``; when the budget runs out the
    best's certificate says so (``detail["k_best_note"]``)."""
    first, alts = prev[0], []
    budget_note = (lambda r: f"{r} of the {k_best} best layouts asked: the budget of "
                             f"{run.time_limit_s} s ran out")
    for r in range(1, max(1, k_best)):
        checkpoint()
        cut = {g: graph.groups[g].strategies[k].name for g, k in prev[-1].items()
               if len(graph.groups[g].strategies) > 1}
        if not cut:
            break
        left = deadline - clock()
        if left <= 0:
            best.certificate.detail["k_best_note"] = budget_note(r)
            break
        add_no_good(model.prob, graph, model.s, cut, f"kbest_{r}")
        rr = None
        kv_rows = (add_kv_mode_cut(model.prob, graph, model.s, first, "kvmode")
                   if distinct == "kv" and r == 1 else [])
        if kv_rows:
            rr = run.solve(graph, model, left, incumbent=False)
            for n in kv_rows:      # lifted: the next solutions are plain no-good cuts
                model.prob.get_constraint_by_name(n).changeRHS(1)
        if rr is None or rr["objective"] is None:
            left = deadline - clock()
            if left <= 0 and rr is not None:
                best.certificate.detail["k_best_note"] = budget_note(r)
                break
            rr = run.solve(graph, model, max(left, 0.0), incumbent=False)
        if rr["objective"] is None:
            if rr["status"] != "INFEASIBLE":
                best.certificate.detail["k_best_note"] = (
                    f"{r} of the {k_best} best layouts asked: the next was not found within the "
                    f"budget of {run.time_limit_s} s ({rr['status']})")
            break
        ch = rr["choice"]
        prev.append(ch)
        alts.append(_solution(ir, graph, model, rr, ch, run, r))
    return alts


def solve_program(fn, abstract_args, target, mesh_axes: dict[str, int], **kw) -> ShardingResult:
    """Trace `fn(*abstract_args)` into the partitioner IR and solve its sharding ILP
    (`solve_sharding`'s keyword arguments apply)."""
    from aoizora.extract.frontends.jax.ir_builder import build_ir
    return solve_sharding(build_ir(fn, *abstract_args), target, mesh_axes, **kw)
