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
a solver's bound proves it. HiGHS is the default since, on the Wan 2.1 14B instances, CBC
often did not finish in the planner's share (20 s per mesh) where HiGHS proved the optimum
(``benchmarks/results/sharding_solvers.md``: 14B 720p-41f, v5e-8: CBC proved 1 of 4 meshes,
HiGHS 3, e.g. mesh 2x4 in 9.6 s where CBC's answer was 2.0% above it; 14B 480p-21f, v5e-16,
mesh 2x2x4: neither proved, CBC's answer 13% above HiGHS's); on Wan 2.1 1.3B the LP relaxation
is integral and proves the optimum before either MIP runs. The solver runs themselves (CBC or
HiGHS on a PuLP model within a deadline: ``run_solver``, ``_run_cbc``, ``_run_highs``,
``available_solvers`` and the measured cost constants) live in ``aoizora.solvers.mip_run`` and
are re-exported here.

When no layout fits in HBM it raises ``MemoryBudgetError`` saying how much is missing: the
smallest per-device peak over all layouts (a second ILP that minimises it) against the budget.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pulp

from aoizora.formulation.collective_cost import AxisCosts, default_axis_costs
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.formulation.sharding_ilp import (TIME_SCALE, MEM_SCALE, ILPModel, add_kv_mode_cut,
                                              add_no_good, build_model, chosen, evaluate,
                                              peak_memory)
from aoizora.formulation.strategies import (Hardware, Options, StrategyGraph, build_strategies,
                                            spec_str)
from aoizora.solvers.certificate import Certificate
# the solver runs (re-exported: they were defined here); solve_model reads CBC_MIN_S_PER_NONZERO,
# HIGHS_LP_MIN_S_PER_NONZERO, _run_cbc and _run_highs through this module's names, so patching
# them here steers solve_model, while run_solver and _run_cbc/_run_highs read mip_run's own
from aoizora.solvers.mip_run import (CBC_MIN_S_PER_NONZERO, CBC_STOP_S, HIGHS_LP_MIN_S_PER_NONZERO,
                                     MIN_CBC_SEC, READBACK_S, READBACK_S_PER_COLUMN,
                                     ShardingSolveError, _run_cbc, _run_highs, available_solvers,
                                     run_solver)

__all__ = ["ShardingSolveError", "MemoryBudgetError", "ShardingSolution", "ShardingResult",
           "available_solvers", "run_solver", "solve_model", "settle_ties", "tensor_spec",
           "to_layout", "min_peak_bytes",
           "build_problem", "solve_sharding", "solve_program", "GiB", "INCUMBENT_SHARE",
           "CBC_COMFORT", "INTEGRAL_TOL", "PROOF_REL_TOL", "CBC_MIN_S_PER_NONZERO",
           "HIGHS_LP_MIN_S_PER_NONZERO", "READBACK_S", "READBACK_S_PER_COLUMN", "CBC_STOP_S",
           "MIN_CBC_SEC"]

GiB = 1024 ** 3


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


# ---------------------------------------------------------------------------------------------
# the budgeted solve: incumbent, then the MIP solver or the LP relaxation, then the better answer

INCUMBENT_SHARE = 0.1        # of the budget, at most, for the coordinate-descent incumbent
CBC_COMFORT = 2.0            # below this x CBC's minimum: the LP relaxation first (short budget)
INTEGRAL_TOL = 1e-6          # an LP value this close to 0 or 1 counts as integral
PROOF_REL_TOL = 1e-9         # objective within this (relative) of a bound: proven optimal
TIE_REL_TOL = 1e-9           # two Q1 values this close (relative) are a tie (settle_ties)


def _nonzeros(prob: pulp.LpProblem) -> int:
    return sum(len(c) for c in prob.constraints()) + len(prob.objective or {})


def _rows_hold(model: ILPModel, choice: dict[str, int]) -> bool:
    """Whether a choice keeps every row of the model that involves only strategy variables
    ``s`` (one-hot, memory, no-good, kv-mode); the flow rows hold by construction (x follows s)."""
    val: dict[str, float] = {}
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
       INCUMBENT_SHARE of the budget (0.03-0.08 s on the largest benchmark instance). Kept only if
       it satisfies every row of the model (``_rows_hold``: forbidden and K-best cuts included).
    2. The solvers on the time left. HiGHS (when installed) first solves the LP relaxation in
       process, without presolve (0.4-0.8 s on the 2x2x4 instance of
       benchmarks/sharding_vs_heuristics.py, build included; 0.7 s on Wan 14B's 2x4x2): its
       value is a lower bound, and when its solution is integral in every strategy variable it
       is a layout proven optimal by that bound (on all three benchmark instances it is) and CBC
       is not needed; else its rounding (each group's largest value) is a candidate if it keeps
       the rows (on Wan 14B 480p-21f, v5e-16, mesh 2x4x2, within 0.4% of the bound, where CBC
       needs over 14 s). Then the MIP on what is left, as a process on an MPS file:
       ``solver="highs"`` (default) HiGHS (``_run_highs``, ``highs_worker.py``), or
       ``solver="cbc"`` CBC (``_run_cbc``), if at least CBC_MIN_S_PER_NONZERO x nonzeros is
       left: writing the MPS file, the solver's file read and its root LP cannot be cut, and
       together cost ~4.3 us per nonzero here with CBC (1.1 s on the 2x2x4 instance, which CBC
       solves in 1.4-2.4 s in all); a budget under CBC_COMFORT x that minimum is noted as
       short. A solver still running at the deadline is killed (its answer lost; the incumbent
       and the LP bound remain): HiGHS does not check its time limit inside every step of its
       MIP presolve.
    3. The answer: the solver's if it is proven optimal, else the best of the solver's, the LP
       rounding and the incumbent (ties go to the solver's). The bound is the best of the
       solvers' lower bounds. Status OPTIMAL when the solver proved it or the answer's objective
       is within PROOF_REL_TOL of the bound; FEASIBLE (not proven) otherwise, with the bound when
       there is one; INFEASIBLE when a solver proved it (the LP relaxation's infeasibility too),
       UNKNOWN when there is no answer. ``detail["answer_from"]``: "solver", "lp-relaxation" or
       "incumbent"; ``detail["note"]`` says when the solver was cut or skipped; the stages'
       seconds are in detail.

    Returns run_solver's dict (status, objective and bound in model units, time_s = wall clock
    of the whole call, solver, detail) plus "choice" (group -> strategy index, or None).
    Determinism: the incumbent and the LP relaxation are deterministic (single thread, fixed
    order); CBC and HiGHS are seeded, but where a time limit stops them, and which path a budget
    near the thresholds takes, depend on the machine's speed and load."""
    if solver not in ("cbc", "highs"):
        raise ShardingSolveError(f"unknown solver {solver!r}; use 'cbc' or 'highs'")
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    prob = model.prob
    stages: dict[str, Any] = {}
    cands: list[tuple[float, int, str, dict[str, int]]] = []   # (objective, rank, source, choice)
    bounds: list[float] = []
    names: list[str] = []
    infeasible = False

    if incumbent:
        from aoizora.solvers.sharding_heuristics import ShardingInstance, coordinate_descent
        t = time.perf_counter()
        inst = ShardingInstance(graph, model, corrections)
        h = coordinate_descent(inst, time_limit_s=INCUMBENT_SHARE * time_limit_s, seed=seed,
                               max_restarts=1)
        stages["incumbent_s"] = round(time.perf_counter() - t, 4)
        if h.choice is not None and _rows_hold(model, h.choice):
            cands.append((h.objective * TIME_SCALE, 2, "incumbent", h.choice))
            stages["incumbent_objective_s"] = h.objective
        else:
            stages["incumbent_note"] = ("no incumbent: the descent found no layout that keeps "
                                        "every row" if h.choice is not None else
                                        "no incumbent: the descent found no feasible layout")

    nnz = _nonzeros(prob)
    cbc_need = CBC_MIN_S_PER_NONZERO * nnz
    lp_need = HIGHS_LP_MIN_S_PER_NONZERO * nnz
    left = deadline - time.perf_counter()
    proven = None                      # the candidate a solver proved optimal
    if left < CBC_COMFORT * cbc_need:
        stages["short_budget"] = (f"{left:.3f} s left, less than {CBC_COMFORT:g} x the "
                                  f"{cbc_need:.3f} s the MIP solver needs before it can stop "
                                  f"({nnz} nonzeros)")
    if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
        if solver == "highs":
            raise ShardingSolveError("HiGHS is not available: pip install highspy (or use "
                                     "solver='cbc')")
        stages["lp_skipped"] = "HiGHS (highspy) is not installed"
    elif left < lp_need:
        stages["lp_skipped"] = f"{left:.3f} s left, the LP relaxation needs about {lp_need:.3f} s"
    else:
        t = time.perf_counter()
        r = _run_highs(prob, deadline, seed, threads, mip=False)
        stages["lp_relaxation_s"] = round(time.perf_counter() - t, 4)
        stages["lp_relaxation"] = r["detail"]
        names.append(r["solver"])
        if r["status"] == "INFEASIBLE":
            infeasible = True
        elif r["status"] == "OPTIMAL":
            bounds.append(r["bound"])
            ch = _integral_choice(model)
            stages["lp_integral"] = ch is not None
            if ch is None:
                ch = chosen(model)       # rounding: each group's largest value
            if _rows_hold(model, ch):
                obj = evaluate(graph, ch, corrections)["total_s"] * TIME_SCALE
                cands.append((obj, 1, "lp-relaxation", ch))
                if stages["lp_integral"] and obj - r["bound"] <= PROOF_REL_TOL * max(abs(obj), 1.0):
                    proven = cands[-1]
    left = deadline - time.perf_counter()
    # both MIPs run as a process on an MPS file: the same minimum (CBC_MIN_S_PER_NONZERO)
    run_mip = proven is None and not infeasible and left >= cbc_need
    if proven is None and not infeasible and not run_mip:
        stages[f"{solver}_skipped"] = (f"{left:.3f} s left, {'CBC' if solver == 'cbc' else 'HiGHS'}"
                                       f" needs about {cbc_need:.3f} s before it can stop")
    r = None
    if run_mip:
        t = time.perf_counter()
        r = _run_cbc(prob, deadline, seed, threads) if solver == "cbc" else \
            _run_highs(prob, deadline, seed, threads)
        stages["solver_s"] = round(time.perf_counter() - t, 4)
        names.append(r["solver"])
        stages.update(r["detail"])
        if r["status"] == "INFEASIBLE":
            infeasible = True
        if r["bound"] is not None and r["status"] != "OPTIMAL":
            bounds.append(r["bound"])
        if r["objective"] is not None:
            cands.append((r["objective"], 0, "solver", chosen(model)))
            if r["status"] == "OPTIMAL":
                proven = cands[-1]
    if not names:
        names.append(f"PuLP {pulp.__version__}/{'CBC' if solver == 'cbc' else 'HiGHS'} (not run)")
    detail = stages
    bound = max(bounds) if bounds else None
    if not cands:
        status = "INFEASIBLE" if infeasible else "UNKNOWN"
        return {"status": status, "objective": None, "bound": bound, "solver": " + ".join(names),
                "detail": detail, "choice": None, "time_s": time.perf_counter() - t0}
    obj, _, source, ch = proven if proven is not None else min(cands, key=lambda c: (c[0], c[1]))
    detail["answer_from"] = source
    if infeasible:   # cannot happen but numerically: say so rather than hide it
        detail["infeasible_note"] = ("a solver reported the model infeasible, yet this layout "
                                     "keeps every row of it")
    if proven is not None:
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
        why = []
        if "short_budget" in stages:
            why.append("short budget: LP relaxation first"
                       + (" (skipped)" if "lp_skipped" in stages else ""))
        if "cbc_skipped" in stages:
            why.append("CBC skipped (too little time left for its file and root LP)")
        if "highs_skipped" in stages:
            why.append("HiGHS skipped (too little time left for its file and root LP)")
        if r is not None and r["status"] != "OPTIMAL":
            why.append(f"{r['solver']} stopped at the budget ({r['status']}"
                       + (", killed" if "killed" in r["detail"] else "") + ")")
        detail["note"] = ("; ".join(why) + f"; the answer is the {source}'s"
                          + ("" if status == "OPTIMAL" else ", not proven optimal"))
    name = " + ".join(names)
    if source == "incumbent":
        name = f"coordinate descent (incumbent) + {name}"
    return {"status": status, "objective": obj, "bound": bound, "solver": name,
            "detail": detail, "choice": ch, "time_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------
# layout

def _axes_entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _layout_spec(spec) -> tuple:
    return tuple(_axes_entry(a) for a in spec)


def tensor_spec(ir, graph: StrategyGraph, choice: dict[str, int], tid: str) -> tuple:
    """The PartitionSpec entries of tensor ``tid`` under a choice (replicated where no group lays
    it out); only the choice of the group that lays it out is read."""
    o = graph.origin.get(tid)
    if o is None:
        return tuple(None for _ in ir.tensors[tid].shape)
    gid, base, tr = o
    sp = graph.groups[gid].strategies[choice[gid]].specs[base]
    for x in tr:
        sp = sp[1:] if x == "drop0" else ((),) + sp
    return _layout_spec(sp)


def to_layout(ir, graph: StrategyGraph, choice: dict[str, int], name: str = "ilp") -> Layout:
    """The Layout of a choice: input leaves, outputs, dot/conv/attention outputs. No rules: the
    program's ``hint`` annotations constrain nothing in an ILP layout (they only name dims)."""

    def spec(tid):
        return tensor_spec(ir, graph, choice, tid)

    node_specs, attention = {}, {}
    for n in ir.nodes:
        if n.kind in ("dot", "conv", "attention") and n.results:
            node_specs[n.key] = spec(n.results[0])
        if n.kind == "attention":
            st = graph.groups[n.key].strategies[choice[n.key]]
            attention[n.key] = AttentionLayout(batch=st.labels.get("b", ()), heads=st.labels.get("h", ()),
                                               seq=st.labels.get("s", ()), kv=st.kv)
    return Layout(mesh_axes=dict(graph.mesh_axes), in_specs=[spec(t) for t in ir.inputs],
                  out_specs=[spec(t) for t in ir.outputs], node_specs=node_specs,
                  attention=attention, name=name)


def _weight_path(ir, nodes, tid: str, depth: int = 4) -> str:
    """The input path a tensor comes from (through scan slices and converts), or ""."""
    t = ir.tensors[tid]
    for _ in range(depth):
        if t.kind == "input":
            return t.path
        if t.kind in ("scan_xs", "scan_const") and t.outer:
            t = ir.tensors[t.outer]
            continue
        if t.kind == "node":
            n = nodes[t.producer]
            ops = [o for o in n.operands if ir.tensors[o].kind != "literal"]
            if n.kind in ("elementwise", "reshape", "transpose") and len(ops) == 1:
                t = ir.tensors[ops[0]]
                continue
        return ""
    return ""


def _words(ir, graph: StrategyGraph, choice: dict[str, int]) -> list[str]:
    out = []
    nodes = {n.key: n for n in ir.nodes}
    for gid in sorted(graph.order(), key=lambda g: graph.groups[g].kind not in ("attention", "dot", "conv")):
        G = graph.groups[gid]
        st = G.strategies[choice[gid]]
        if G.kind in ("dot", "conv", "attention"):
            n = nodes[G.anchor]
            w = next((p for p in (_weight_path(ir, nodes, o) for o in n.operands[1:2]) if p), "")
            text = st.words if not w else st.words.replace("dot:", f"dot {w}:", 1)
            guessed = n.params.get("guesses") if n.kind == "attention" else None
            out.append(f"{text} [{gid}{' ' + n.source if n.source else ''}]"
                       + (f" (dims guessed: {'; '.join(guessed)})" if guessed else ""))
        elif G.kind == "input":
            t = ir.tensors[G.anchor]
            out.append(f"input {t.path or G.anchor} {list(t.shape)}: {spec_str(st.specs[G.anchor])}")
    return out


def _solution(ir, graph, model: ILPModel, res: dict, choice: dict[str, int], time_limit_s,
              seed, threads, corrections, rank: int) -> ShardingSolution:
    pred = evaluate(graph, choice, corrections)
    obj = res["objective"] / TIME_SCALE if res["objective"] is not None else None
    bound = res["bound"] / TIME_SCALE if res["bound"] is not None else None
    if obj is not None and bound is not None:
        bound = min(bound, obj) if res["status"] != "OPTIMAL" else bound
    detail = dict(res["detail"])
    detail["rank"] = rank
    cert = Certificate(solver=res["solver"], status=res["status"], objective=obj, bound=bound,
                       time_s=res["time_s"], unit="s", seed=seed, workers=threads,
                       time_limit_s=time_limit_s, detail=detail)
    return ShardingSolution(
        layout=to_layout(ir, graph, choice, name="ilp" if rank == 0 else f"ilp#{rank + 1}"),
        certificate=cert,
        choice={g: graph.groups[g].strategies[k].name for g, k in choice.items()},
        words=_words(ir, graph, choice), predicted=pred, peak_bytes=peak_memory(model, choice),
        attention={g: {"kv": graph.groups[g].strategies[k].kv,
                       "compute_s": graph.groups[g].strategies[k].compute}
                   for g, k in choice.items() if graph.groups[g].kind == "attention"})


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


def build_problem(ir, target, mesh_axes: dict[str, int], *, axis_costs: AxisCosts | None = None,
                  hardware: Hardware | None = None, options: Options | None = None,
                  hbm_bytes: float | None = None, hbm_reserve: float = 0.1,
                  corrections: dict[str, Any] | None = None,
                  forbidden: list[dict[str, str]] | None = None,
                  attention_scale: dict[str, float] | None = None, graph=None):
    """(hardware, HBM budget in bytes, StrategyGraph, ILPModel) of one sharding instance, with
    ``solve_sharding``'s defaults; the searches of ``solvers.sharding_heuristics`` share it.
    ``graph``: the instance's StrategyGraph when the caller built it already (``build_strategies``
    with the same axis costs, hardware, options and attention scales)."""
    if hardware is None:
        if target is None:
            raise ShardingSolveError("give a target or hardware= to price compute")
        hardware = Hardware.from_chip(target.chip)
    if axis_costs is None:
        if target is None:
            raise ShardingSolveError("give a target or axis_costs= to price communication")
        axis_costs = default_axis_costs(target, mesh_axes)
    if dict(axis_costs.sizes) != {k: int(v) for k, v in mesh_axes.items()}:
        raise ShardingSolveError(f"axis costs are for mesh {axis_costs.sizes}, not {mesh_axes}")
    budget = float(hbm_bytes if hbm_bytes is not None else hardware.hbm_bytes * (1.0 - hbm_reserve))
    if graph is None:
        graph = build_strategies(ir, axis_costs, hardware, options, attention_scale)
    model = build_model(ir, graph, budget, corrections=corrections, forbidden=forbidden)
    return hardware, budget, graph, model


def solve_sharding(ir, target, mesh_axes: dict[str, int], *, axis_costs: AxisCosts | None = None,
                   solver: str = "highs", time_limit_s: float = 30.0, k_best: int = 1,
                   hbm_bytes: float | None = None, corrections: dict[str, Any] | None = None,
                   forbidden: list[dict[str, str]] | None = None, seed: int = 0, threads: int = 1,
                   options: Options | None = None, hardware: Hardware | None = None,
                   hbm_reserve: float = 0.1, distinct: str = "any",
                   attention_scale: dict[str, float] | None = None,
                   prefer: dict[str, str] | None = None, graph=None) -> ShardingResult:
    """Choose the layout of every op of `ir` on the logical mesh `mesh_axes` (see module doc).

    target: a Target (for chip numbers and default axis costs) or None with `hardware` and
    `axis_costs` given. hbm_bytes: the per-device budget for the ILP's memory rows; default the
    chip's HBM less `hbm_reserve` (a fraction kept for what the ILP's memory model does not see:
    the compiler's temporaries, kernel scratch, collective buffers -- on Wan 2.1 1.3B, 4x4, the
    compiler reported 3.17 GiB where the model counted 2.82 GiB). corrections / forbidden: the
    planner's feedback (``aoizora.formulation.sharding_ilp.build_model``). distinct: "any"
    (the K best differ in at least one op) or "kv" (first in attention kv modes; module doc).
    attention_scale: kv mode -> factor on Q1's attention compute, the planner's feedback from
    compiled programs (``aoizora.formulation.attention_calibration``). prefer: group id ->
    strategy name to take among tied optima of the best layout (``settle_ties``; the groups it
    moved are in its certificate's ``detail["tie_moves"]``). graph: the StrategyGraph already
    built for these inputs (``build_problem``), to skip building it again.

    time_limit_s: the wall-clock budget, seconds, of the whole solve: the best layout
    (``solve_model``: a coordinate-descent incumbent, HiGHS's LP relaxation, then the MIP on the
    time left -- HiGHS by default, or CBC; the best answer, with an honest certificate) and the
    k_best - 1 alternatives, which get what the best left
    (when it runs out they are dropped and the best's certificate says so in
    ``detail["k_best_note"]``). The budget starts once strategies and model are built: the build
    is reported apart as ``ShardingResult.build_s`` and not counted. What can pass the budget:
    the parts that cannot be interrupted (one descent sweep, PuLP's MPS write or HiGHS model
    build once started, reading a solution back after CBC was killed at the deadline) -- about
    0.1 s on the 2x2x4 Wan 2.1 instance of benchmarks/sharding_vs_heuristics.py. Each
    certificate's time_s is the wall clock of its own solve. The error path (nothing fits in
    HBM) solves a second ILP for the missing bytes with the same limit."""
    if distinct not in ("any", "kv"):
        raise ValueError(f"distinct={distinct!r}: use 'any' or 'kv'")
    t0 = time.perf_counter()
    hardware, budget, graph, model = build_problem(
        ir, target, mesh_axes, axis_costs=axis_costs, hardware=hardware, options=options,
        hbm_bytes=hbm_bytes, hbm_reserve=hbm_reserve, corrections=corrections,
        forbidden=forbidden, attention_scale=attention_scale, graph=graph)
    build_s = time.perf_counter() - t0
    size = {"groups": len(graph.groups), "strategies": graph.num_strategies(),
            "edges": len(graph.edges), **model.size()}
    t_solve = time.perf_counter()
    deadline = t_solve + time_limit_s
    res = solve_model(graph, model, solver=solver, time_limit_s=time_limit_s, seed=seed,
                      threads=threads, corrections=corrections)
    if res["status"] == "INFEASIBLE" or (res["objective"] is None and res["status"] != "UNKNOWN"):
        if forbidden:
            raise ShardingSolveError(
                f"no layout on mesh {mesh_axes} fits in {budget / GiB:.2f} GiB per device once the "
                f"{len(forbidden)} forbidden combination(s) are excluded")
        need, st = min_peak_bytes(ir, graph, solver=solver, time_limit_s=time_limit_s, seed=seed,
                                  threads=threads, small_bytes=budget * 1e-3)
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
    if res["objective"] is None:
        err = ShardingSolveError(f"{res['solver']} found no layout within {time_limit_s} s "
                                 f"(status {res['status']}); raise time_limit_s")
        err.certificate = Certificate(solver=res["solver"], status=res["status"], objective=None,
                                      bound=None if res["bound"] is None else res["bound"] / TIME_SCALE,
                                      time_s=res["time_s"], seed=seed, workers=threads,
                                      time_limit_s=time_limit_s, detail=dict(res["detail"]))
        raise err
    first = res["choice"]
    if prefer:
        names = {g: [st.name for st in graph.groups[g].strategies]
                 for g in prefer if g in graph.groups}
        idx = {g: names[g].index(name) for g, name in prefer.items()
               if name in names.get(g, ())}
        first, moved = settle_ties(graph, model, first, idx, corrections)
        if moved:
            q1 = evaluate(graph, first, corrections)["total_s"] * TIME_SCALE
            res = {**res, "choice": first, "objective": min(res["objective"], q1),
                   "detail": {**res["detail"], "tie_moves": moved}}
    best = _solution(ir, graph, model, res, first, time_limit_s, seed, threads, corrections, 0)
    alts = []
    prev = [first]
    for r in range(1, max(1, k_best)):
        cut = {g: graph.groups[g].strategies[k].name for g, k in prev[-1].items()
               if len(graph.groups[g].strategies) > 1}
        if not cut:
            break
        left = deadline - time.perf_counter()
        if left <= 0:
            best.certificate.detail["k_best_note"] = (
                f"{r} of the {k_best} best layouts asked: the budget of {time_limit_s} s ran out")
            break
        add_no_good(model.prob, graph, model.s, cut, f"kbest_{r}")
        rr = None
        kv_rows = (add_kv_mode_cut(model.prob, graph, model.s, first, "kvmode")
                   if distinct == "kv" and r == 1 else [])
        if kv_rows:
            rr = solve_model(graph, model, solver=solver, time_limit_s=left, seed=seed,
                             threads=threads, corrections=corrections, incumbent=False)
            for n in kv_rows:      # lifted: the next solutions are plain no-good cuts
                model.prob.get_constraint_by_name(n).changeRHS(1)
        if rr is None or rr["objective"] is None:
            left = deadline - time.perf_counter()
            if left <= 0 and rr is not None:
                best.certificate.detail["k_best_note"] = (
                    f"{r} of the {k_best} best layouts asked: the budget of {time_limit_s} s ran out")
                break
            rr = solve_model(graph, model, solver=solver, time_limit_s=max(left, 0.0), seed=seed,
                             threads=threads, corrections=corrections, incumbent=False)
        if rr["objective"] is None:
            if rr["status"] != "INFEASIBLE":
                best.certificate.detail["k_best_note"] = (
                    f"{r} of the {k_best} best layouts asked: the next was not found within the "
                    f"budget of {time_limit_s} s ({rr['status']})")
            break
        ch = rr["choice"]
        prev.append(ch)
        alts.append(_solution(ir, graph, model, rr, ch, time_limit_s, seed, threads, corrections, r))
    return ShardingResult(best=best, alternatives=alts, size=size, build_s=build_s)


def solve_program(fn, abstract_args, target, mesh_axes: dict[str, int], **kw) -> ShardingResult:
    """Trace `fn(*abstract_args)` into the partitioner IR and solve its sharding ILP
    (`solve_sharding`'s keyword arguments apply)."""
    from aoizora.extract.program_ir import build_ir
    return solve_sharding(build_ir(fn, *abstract_args), target, mesh_axes, **kw)
