"""Solve the sharding ILP and turn the answer into a Layout.

``solve_sharding(ir, target, mesh_axes)`` builds the strategies
(``aoizora.formulation.strategies``) and the PuLP model (``aoizora.formulation.sharding_ilp``),
solves it with CBC (default; one thread, fixed seed, time limit) or HiGHS (``solver="highs"``,
when highspy is installed), and returns a ``ShardingResult``: the Layout, a Certificate (status,
objective, best bound and gap as the solver reported them: CBC's log, HiGHS's ``mip_dual_bound``),
the chosen strategies in words, the ILP's size, and -- with ``k_best > 1`` -- the next best
distinct solutions (each found after a no-good cut on the previous ones). With
``distinct="kv"`` the second solution must also run the keys/values of every attention op that
offers both ways the other way (gathered / in a ring) than the first (the ``kv-mode`` rows of
``formulation.sharding_ilp``; skipped when no such solution exists), the rest plain no-good
cuts: the K best then differ in the decision the placement-oblivious model prices least reliably
(how much of a ring's traffic hides behind compute), not in the layout of one small op.

When no layout fits in HBM it raises ``MemoryBudgetError`` saying how much is missing: the
smallest per-device peak over all layouts (a second ILP that minimises it) against the budget.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
import warnings
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

GiB = 1024 ** 3


class ShardingSolveError(ValueError):
    """The sharding ILP could not be solved as asked."""

    certificate: Certificate | None = None


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


def available_solvers() -> list[str]:
    out = []
    avail = pulp.listSolvers(onlyAvailable=True)
    if "PULP_CBC_CMD" in avail:
        out.append("cbc")
    if "HiGHS" in avail:
        out.append("highs")
    return out


# ---------------------------------------------------------------------------------------------
# solver backends

class _quiet_stdout:
    """Silence the C-level stdout (file descriptor 1) for a block."""

    def __enter__(self):
        import sys
        sys.stdout.flush()
        self.saved = os.dup(1)
        self.null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self.null, 1)

    def __exit__(self, *exc):
        os.dup2(self.saved, 1)
        os.close(self.saved)
        os.close(self.null)
        return False

def _cbc_bound(log: str) -> tuple[float | None, str]:
    """(best bound, result line) from CBC's log, in the model's (unscaled-constant-free) units."""
    res = re.search(r"Result - (.*)", log)
    result = res.group(1).strip() if res else ""
    lb = None
    m = re.search(r"Lower bound:\s+([-+0-9.eE]+)", log)
    if m:
        lb = float(m.group(1))
    return lb, result


def run_solver(prob: pulp.LpProblem, solver: str, time_limit_s: float, seed: int, threads: int
         ) -> dict[str, Any]:
    """Solve a PuLP problem (minimisation); return {status, objective, bound (model units, from
    the solver: CBC's log "Lower bound", HiGHS's mip_dual_bound), time_s, solver, detail}."""
    t0 = time.perf_counter()
    if solver == "cbc":
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "cbc.log")
            with warnings.catch_warnings():   # PuLP 3.3 marks its bundled CBC for removal in 4.0
                warnings.simplefilter("ignore", DeprecationWarning)
                cmd = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads, logPath=log,
                                        options=[f"randomSeed {seed + 1}", f"randomCbcSeed {seed + 1}"])
            prob.solve(cmd)
            text = open(log).read() if os.path.exists(log) else ""
        elapsed = time.perf_counter() - t0
        obj = pulp.value(prob.objective) if prob.sol_status in (1, 2) else None
        lb, result = _cbc_bound(text)
        offset = float(prob.objective.constant) if prob.objective is not None else 0.0
        # CBC's log leaves the objective's constant out; pulp's value has it
        detail = {"cbc_result": result}
        if prob.status == 1 and prob.sol_status == 1 and ("optimal" in result.lower() or not result):
            status, bound = "OPTIMAL", obj
        elif obj is not None:
            status = "FEASIBLE"
            bound = lb + offset if lb is not None else None
            if lb is None:
                detail["bound_note"] = "CBC's log gave no lower bound for this stop"
        elif prob.status == -1 and "time" not in result.lower() and re.search(
                r"Problem is infeasible|proven infeasible|relaxation infeasible", text, re.IGNORECASE):
            status, bound = "INFEASIBLE", None
        else:
            status, bound = "UNKNOWN", (lb + offset if lb is not None else None)
        return {"status": status, "objective": obj, "bound": bound, "time_s": elapsed,
                "solver": f"PuLP {pulp.__version__}/CBC", "detail": detail}
    if solver == "highs":
        if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
            raise ShardingSolveError("HiGHS is not available: pip install highspy (or use solver='cbc')")
        cmd = pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=threads, random_seed=seed)
        with _quiet_stdout():   # highspy prints its banner before pulp turns its output off
            prob.solve(cmd)
        elapsed = time.perf_counter() - t0
        h = prob.solverModel
        info = h.getInfo()
        ms = h.modelStatusToString(h.getModelStatus())
        have = prob.sol_status in (1, 2)
        obj = pulp.value(prob.objective) if have else None
        offset = float(prob.objective.constant) if prob.objective is not None else 0.0
        bound = info.mip_dual_bound + offset if abs(info.mip_dual_bound) < 1e30 else None
        if ms == "Optimal":
            status, bound = "OPTIMAL", obj
        elif ms == "Infeasible":
            status = "INFEASIBLE"
        elif have:
            status = "FEASIBLE"
        else:
            status = "UNKNOWN"
        detail = {"highs_status": ms, "mip_gap": info.mip_gap, "mip_node_count": info.mip_node_count}
        if bound is None:
            detail["bound_note"] = "HiGHS reported no finite dual bound for this stop"
        return {"status": status, "objective": obj, "bound": bound, "time_s": elapsed,
                "solver": f"PuLP {pulp.__version__}/HiGHS {h.version()}", "detail": detail}
    raise ShardingSolveError(f"unknown solver {solver!r}; use 'cbc' or 'highs'")


# ---------------------------------------------------------------------------------------------
# layout

def _axes_entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def _layout_spec(spec) -> tuple:
    return tuple(_axes_entry(a) for a in spec)


def to_layout(ir, graph: StrategyGraph, choice: dict[str, int], name: str = "ilp") -> Layout:
    """The Layout of a choice: input leaves, outputs, dot/conv/attention outputs and hints."""
    T = ir.tensors

    def spec(tid):
        o = graph.origin.get(tid)
        if o is None:
            return tuple(None for _ in T[tid].shape)
        gid, base, tr = o
        sp = graph.groups[gid].strategies[choice[gid]].specs[base]
        for x in tr:
            sp = sp[1:] if x == "drop0" else ((),) + sp
        return _layout_spec(sp)

    node_specs, attention = {}, {}
    for n in ir.nodes:
        if n.kind in ("dot", "conv", "attention", "hint") and n.results:
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
            if n.kind in ("elementwise", "hint", "reshape", "transpose") and len(ops) == 1:
                t = ir.tensors[ops[0]]
                continue
        return ""
    return ""


def _words(ir, graph: StrategyGraph, choice: dict[str, int]) -> list[str]:
    out = []
    nodes = {n.key: n for n in ir.nodes}
    for gid in sorted(graph.groups, key=lambda g: (graph.groups[g].kind not in ("attention", "dot", "conv"), g)):
        G = graph.groups[gid]
        st = G.strategies[choice[gid]]
        if G.kind in ("dot", "conv", "attention"):
            n = nodes[G.anchor]
            w = next((p for p in (_weight_path(ir, nodes, o) for o in n.operands[1:2]) if p), "")
            text = st.words if not w else st.words.replace("dot:", f"dot {w}:", 1)
            out.append(f"{text} [{gid}{' ' + n.source if n.source else ''}]")
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


def min_peak_bytes(ir, graph: StrategyGraph, *, solver: str = "cbc", time_limit_s: float = 30.0,
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
                  attention_scale: dict[str, float] | None = None):
    """(hardware, HBM budget in bytes, StrategyGraph, ILPModel) of one sharding instance, with
    ``solve_sharding``'s defaults; the searches of ``solvers.sharding_heuristics`` share it."""
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
    graph = build_strategies(ir, axis_costs, hardware, options, attention_scale)
    model = build_model(ir, graph, budget, corrections=corrections, forbidden=forbidden)
    return hardware, budget, graph, model


def solve_sharding(ir, target, mesh_axes: dict[str, int], *, axis_costs: AxisCosts | None = None,
                   solver: str = "cbc", time_limit_s: float = 30.0, k_best: int = 1,
                   hbm_bytes: float | None = None, corrections: dict[str, Any] | None = None,
                   forbidden: list[dict[str, str]] | None = None, seed: int = 0, threads: int = 1,
                   options: Options | None = None, hardware: Hardware | None = None,
                   hbm_reserve: float = 0.1, distinct: str = "any",
                   attention_scale: dict[str, float] | None = None) -> ShardingResult:
    """Choose the layout of every op of `ir` on the logical mesh `mesh_axes` (see module doc).

    target: a Target (for chip numbers and default axis costs) or None with `hardware` and
    `axis_costs` given. hbm_bytes: the per-device budget for the ILP's memory rows; default the
    chip's HBM less `hbm_reserve` (a fraction kept for what the ILP's memory model does not see:
    the compiler's temporaries, kernel scratch, collective buffers -- on Wan 2.1 1.3B, 4x4, the
    compiler reported 3.17 GiB where the model counted 2.82 GiB). corrections / forbidden: the
    planner's feedback (``aoizora.formulation.sharding_ilp.build_model``). distinct: "any"
    (the K best differ in at least one op) or "kv" (first in attention kv modes; module doc).
    attention_scale: kv mode -> factor on Q1's attention compute, the planner's feedback from
    compiled programs (``aoizora.formulation.attention_calibration``)."""
    if distinct not in ("any", "kv"):
        raise ValueError(f"distinct={distinct!r}: use 'any' or 'kv'")
    t0 = time.perf_counter()
    hardware, budget, graph, model = build_problem(
        ir, target, mesh_axes, axis_costs=axis_costs, hardware=hardware, options=options,
        hbm_bytes=hbm_bytes, hbm_reserve=hbm_reserve, corrections=corrections,
        forbidden=forbidden, attention_scale=attention_scale)
    build_s = time.perf_counter() - t0
    size = {"groups": len(graph.groups), "strategies": graph.num_strategies(),
            "edges": len(graph.edges), **model.size()}
    res = run_solver(model.prob, solver, time_limit_s, seed, threads)
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
    first = chosen(model)
    best = _solution(ir, graph, model, res, first, time_limit_s, seed, threads, corrections, 0)
    alts = []
    prev = [first]
    for r in range(1, max(1, k_best)):
        cut = {g: graph.groups[g].strategies[k].name for g, k in prev[-1].items()
               if len(graph.groups[g].strategies) > 1}
        if not cut:
            break
        add_no_good(model.prob, graph, model.s, cut, f"kbest_{r}")
        rr = None
        kv_rows = (add_kv_mode_cut(model.prob, graph, model.s, first, "kvmode")
                   if distinct == "kv" and r == 1 else [])
        if kv_rows:
            rr = run_solver(model.prob, solver, time_limit_s, seed, threads)
            for n in kv_rows:      # lifted: the next solutions are plain no-good cuts
                model.prob.get_constraint_by_name(n).changeRHS(1)
        if rr is None or rr["objective"] is None:
            rr = run_solver(model.prob, solver, time_limit_s, seed, threads)
        if rr["objective"] is None:
            break
        ch = chosen(model)
        prev.append(ch)
        alts.append(_solution(ir, graph, model, rr, ch, time_limit_s, seed, threads, corrections, r))
    return ShardingResult(best=best, alternatives=alts, size=size, build_s=build_s)


def solve_program(fn, abstract_args, target, mesh_axes: dict[str, int], **kw) -> ShardingResult:
    """Trace `fn(*abstract_args)` into the partitioner IR and solve its sharding ILP
    (`solve_sharding`'s keyword arguments apply)."""
    from aoizora.extract.program_ir import build_ir
    return solve_sharding(build_ir(fn, *abstract_args), target, mesh_axes, **kw)
