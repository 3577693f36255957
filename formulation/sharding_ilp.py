"""The sharding ILP (Alpa-style) over a StrategyGraph, as a PuLP model.

Names as in the code (``g`` a group, ``k`` one of its strategies, ``e`` an edge between groups,
``p`` / ``q`` the distinct producer / required specs of the edge's tensor):

Variables
  ``s[g][k]`` in {0,1}: group g uses strategy k (a group with one strategy has no variable: 1).
  ``x[e][p][q]`` in [0,1] (continuous): edge e carries its tensor from spec p to spec q. With
  one-hot ``s`` the row/column sums below force x to the one pair in use, so x needs no integrality.

Objective (Q1, the placement-oblivious step latency; seconds, scaled by ``TIME_SCALE`` in the model)
  minimise  sum_g sum_k s[g][k] * (cost[g][k] + correction[g][k])
          + sum_e sum_{p,q} x[e][p][q] * r[e][p][q]
          + remat_time(s, traced, y)       (recompute and offload, ``formulation.remat``)
          - h                              (prefetch overlap, ``formulation.prefetch``: the
                                            resharding of program inputs hidden behind compute,
                                            h <= that resharding, h <= rho x compute)
  cost[g][k]: compute of every op in the group (one shard: max(flops/peak, bytes/HBM bandwidth))
  plus its own communication (partial-sum all-reduce or reduce-scatter, gathers a follower cannot
  avoid), times each op's repeat (a scan body is in the model once: its costs are times the trip
  count) -- ``Strategy.cost``; r[e][p][q] (``Edge.cost``): resharding the edge's tensor from p
  to q (``strategies.reshard_cost``) times the consumer's repeat. ``correction`` is the planner's additive feedback (seconds, per node key
  or per node key and strategy name).

Constraints
  (one-hot)  sum_k s[g][k] = 1                                        for every group g
  (rows)     sum_q x[e][p][q] = sum_{k : p_of[k] = p} s[P(e)][k]      for every edge e and p
  (columns)  sum_p x[e][p][q] = sum_{k : q_of[k] = q} s[C(e)][k]      for every edge e and q
  (memory)   sum_{tensors t live at step i} bytes(t | s) + sum_{operands o of op i} copy(o | s)
                 <= hbm_budget                                         for every step i
  (no-good)  sum_{g in cut} s[g][k_g] <= |cut| - 1                    for every forbidden combination
  (kv-mode)  sum_{k : kv[g][k] = kv*_g} s[g][k] <= 0                   for every g in A
             for a previous solution whose attention groups A (those offering keys/values both
             gathered and in a ring) ran them as kv*_g: every one of them the other way
             (``add_kv_mode_cut``; the planner's diverse top-K)

Rematerialization (``remat``, a training step's layer groups; ``formulation.remat`` states its
variables, objective terms and the memory term): every memory row from a forward scan's first
step to its backward scan's last also holds that layer group's stacked residuals,
``trip * bytes(residual | s)`` (as traced, or the kept named activations and the carry), and with
decisions the objective adds the recompute and offload seconds:
  (memory)   ... + sum_{G live at i} stacks_G(s, traced, y) <= hbm_budget
  (no-good)  a (layout, remat) pair the compiler said did not fit: the cut also holds the remat
             binaries of that choice (``REMAT_KEY`` in a forbidden combination)

Optimizer state (ZeRO as points of this one model): every leaf of a training step's state --
the fp32 master weight, AdamW's mu and nu -- is a program input with a group of its own
(``in:<tensor>``, every spec over the mesh), so each chooses its spec independently; the new
state is tied to the old one's spec (state edges). The bf16 compute copy is the cast that
follows the master weight's group (same spec) and reaches each consumer's required spec on an
edge (an all-gather where the master is split: priced per use, times the scan's trip, and
counted in memory as the consumer's operand copy). The gradient comes out of the backward dots
with the batch contraction split: all-reduced when the gradient's spec is replicated,
reduce-scattered when it is split (the dot's own communication). Hence: DP = all replicated;
ZeRO-1 = mu, nu split, master replicated (the update's all-gather to the master's spec is the
edge into the replicated weight update); ZeRO-2 = also the gradient split (reduce-scatter);
ZeRO-3 / FSDP = the master split too (gathered for compute at each use). Not modelled: a bf16
copy whose spec differs from its master's and is kept across the step (the cast follows).

Memory, an over-approximation of the live buffers the program itself needs (it does not see the
compiler's own temporaries, kernel scratch or collective buffers: the solver keeps a reserve of
HBM for those, see ``aoizora.solvers.sharding.solve_sharding``):
steps are the ops in program order (a scan body once; what lives across the loop -- stacked
weights, the carry, consts -- is live at every body step). Program inputs and consts are live
throughout, except a donated input (state fed back, ``ProgramIR.state_aliases``: the compiler
may write its next value into its buffer), which lives to its last consumer; outputs to the
end, every other tensor from its producer to its last consumer (a
tensor fed to a scan: to the end of the body). bytes(t | s) is one device's shard under the
chosen spec (padded shards rounded up); a scan's xs slice is counted besides the stacked array,
a scan const aliases its outer tensor (0). A scan's stacked result (``scan_ys``, ``trip``
slices) lives whole from the scan's first step to its last consumer (``stacked_outputs``; the
compiler allocates it before the loop), except a layer group's residuals, which the (memory)
term of ``formulation.remat`` counts; a carry's result aliases the carry (0). At op i each
operand that comes from another group is counted once more, at the spec op i needs (the
resharded copy; counted even when no reshard happens). Tensors below ``small_bytes`` count at their full size as constants. Rows implied by
another row (a subset of its terms with a smaller constant) are dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulp

from aoizora.formulation.remat import (REMAT_KEY, RematProblem, RematVars, add_remat,
                                       evaluate_remat, remat_literals)
from aoizora.formulation.prefetch import PREFETCH_TIE, add_prefetch_overlap, hidden_seconds
from aoizora.formulation.strategies import StrategyGraph, shard_bytes

TIME_SCALE = 1e6      # model objective unit: microseconds
MEM_SCALE = 1e-6      # model memory unit: MB


@dataclasses.dataclass
class MemoryRow:
    step: str                                   # node key of the step
    terms: dict[tuple[str, int], float]         # (group, strategy) -> bytes
    const: float                                # bytes fixed whatever the layout
    index: int = -1                             # the step's position in program order
    stacks: tuple[int, ...] = ()                # layer groups whose residual stacks are live here


@dataclasses.dataclass
class ILPModel:
    prob: pulp.LpProblem
    s: dict[str, list[Any]]                     # group -> per strategy: pulp var or 1 (fixed)
    x: list[dict[tuple[int, int], Any]]         # per edge
    memory_rows: list[MemoryRow]
    hbm_budget: float
    constant_s: float                           # objective part no variable changes, seconds
    remat: RematVars | None = None              # rematerialization (``formulation.remat``)
    remat_eval: Any = None                      # (choice, remat) -> evaluate_remat's dict

    def size(self) -> dict[str, int]:
        return {"binaries": sum(1 for v in self.prob.variables() if v.cat == pulp.LpInteger),
                "continuous": sum(1 for v in self.prob.variables() if v.cat != pulp.LpInteger),
                "constraints": self.prob.numConstraints(),
                "memory_rows": len(self.memory_rows)}


def _strategy_index(graph: StrategyGraph, group: str, name: str) -> int:
    for k, s in enumerate(graph.groups[group].strategies):
        if s.name == name:
            return k
    raise KeyError(f"group {group} has no strategy {name!r}")


def memory_rows(ir, graph: StrategyGraph, small_bytes: float,
                remat: RematProblem | None = None) -> list[MemoryRow]:
    """The (memory) rows; with ``remat`` each row says which layer groups' residual stacks are
    live at its step (``MemoryRow.stacks``; their bytes are ``formulation.remat``'s)."""
    T = ir.tensors
    order = {n.key: i for i, n in enumerate(ir.nodes)}
    N = len(ir.nodes)
    scope_rng: dict[str, tuple[int, int]] = {}
    for n in ir.nodes:
        parts = n.key.split(".")
        for j in range(1, len(parts)):
            sc = ".".join(parts[:j])
            lo, hi = scope_rng.get(sc, (N, -1))
            scope_rng[sc] = (min(lo, order[n.key]), max(hi, order[n.key]))
    start, end = {}, {}
    donated = {ir.inputs[i] for _, i in getattr(ir, "state_aliases", ())}
    stacked = stacked_outputs(ir, remat)
    for tid, t in T.items():
        if t.kind in ("input", "const"):
            start[tid], end[tid] = -1, (-1 if tid in donated else N)
        elif t.kind == "node":
            start[tid] = end[tid] = order[t.producer]
        elif t.kind in ("scan_carry", "scan_xs", "scan_const"):
            lo, hi = scope_rng.get(t.scope, (N, N))
            start[tid], end[tid] = lo, lo
        else:   # scan outer results: exist after the body; a stacked one from its first step
            inner_scope = T[t.inner].scope if t.inner else ""
            lo, hi = scope_rng.get(inner_scope, (None, None)) if inner_scope else (None, None)
            pos = hi if hi is not None else start.get(t.inner, 0)
            start[tid] = end[tid] = pos
            if tid in stacked and lo is not None:
                start[tid] = lo
    for n in ir.nodes:
        for tid in n.operands:
            if tid in end:
                end[tid] = max(end[tid], order[n.key])
    for tid, t in T.items():
        if t.kind in ("scan_carry", "scan_xs", "scan_const") and t.outer in end:
            lo, hi = scope_rng.get(t.scope, (0, 0))
            end[t.outer] = max(end[t.outer], hi)
            if t.loop_back in end:
                end[t.loop_back] = max(end[t.loop_back], hi)
                end[tid] = max(end[tid], hi)
        if t.kind in ("scan_carry_out", "scan_ys") and t.inner in end and tid not in stacked:
            end[t.inner] = max(end[t.inner], start[tid])
    for tid in ir.outputs:
        end[tid] = N

    def expr(tid) -> tuple[dict, float]:
        t = T[tid]
        if t.kind in ("literal", "scan_const", "scan_carry_out", "scan_ys") and tid not in stacked:
            return {}, 0.0   # literals; aliases of a buffer counted elsewhere
        o = graph.origin.get(tid)
        if o is None and tid in stacked and t.inner in graph.origin:   # the body's spec, stacked
            gi, b, tr = graph.origin[t.inner]
            o = (gi, b, tr + ("add0",))
        if o is None or t.bytes < small_bytes:
            return {}, float(t.bytes)
        gid, base, tr = o
        G = graph.groups[gid]
        vals = []
        memo: dict = {}
        for s in G.strategies:
            spec = s.specs[base]
            if spec not in memo:
                sp = spec
                for x in tr:
                    sp = sp[1:] if x == "drop0" else ((),) + sp
                memo[spec] = shard_bytes(t, sp, graph.mesh_axes)
            vals.append(memo[spec])
        if len(G.strategies) == 1:
            return {}, vals[0]
        return {(gid, k): v for k, v in enumerate(vals)}, 0.0

    exprs = {tid: expr(tid) for tid in T}
    rows: list[MemoryRow] = []
    live_sorted = sorted(T, key=lambda t: start.get(t, 0))
    for i, n in enumerate(ir.nodes):
        terms: dict[tuple[str, int], float] = {}
        const = 0.0
        for tid in live_sorted:
            if start.get(tid, N + 1) > i:
                break
            if end.get(tid, -2) < i:
                continue
            tt, c = exprs[tid]
            const += c
            for key, v in tt.items():
                terms[key] = terms.get(key, 0.0) + v
        gid = graph.group_of_node.get(n.key)
        if gid is not None:
            G = graph.groups[gid]
            for k_op, tid in enumerate(n.operands):
                if (n.key, k_op) not in G.strategies[0].req:
                    continue
                t = T[tid]
                vals = [shard_bytes(t, s.req[(n.key, k_op)], graph.mesh_axes) for s in G.strategies]
                if len(vals) == 1 or t.bytes < small_bytes:
                    const += max(vals)
                else:
                    for k, v in enumerate(vals):
                        terms[(gid, k)] = terms.get((gid, k), 0.0) + v
        live = tuple(gi for gi, G in enumerate(remat.groups if remat else ())
                     if G.first <= i <= G.last)
        rows.append(MemoryRow(n.key, terms, const, i, live))
    return _drop_implied(rows)


def stacked_outputs(ir, remat: RematProblem | None = None) -> set[str]:
    """The scans' stacked results (``scan_ys``) the memory rows count whole, ``trip`` slices,
    from the scan's first step: every one but a layer group's residuals (``remat``'s stacks
    count those). The compiler allocates a scan's stacked output before the loop and writes one
    slice per trip (a training step's gradients of the stacked weights, live through the
    backward scan: several GiB per chip on a large model; benchmarks/results/lab_notes.md)."""
    covered = {r for G in (remat.groups if remat else ()) for r in G.residuals}
    return {tid for tid, t in ir.tensors.items()
            if t.kind == "scan_ys" and t.inner and t.inner not in covered}


def _drop_implied(rows: list[MemoryRow]) -> list[MemoryRow]:
    """Drop a row when another has every one of its terms at least as large and a larger constant."""
    rows = sorted(rows, key=lambda r: (-len(r.terms), -r.const))
    kept: list[MemoryRow] = []
    for r in rows:
        implied = False
        for q in kept:
            if q.stacks != r.stacks:
                continue
            if q.const >= r.const and all(q.terms.get(k, -1.0) >= v for k, v in r.terms.items()):
                implied = True
                break
        if not implied:
            kept.append(r)
    return kept


def build_model(ir, graph: StrategyGraph, hbm_budget: float, *,
                corrections: dict[str, Any] | None = None,
                forbidden: list[dict[str, str]] | None = None,
                small_bytes: float | None = None,
                objective: str = "latency", remat: RematProblem | None = None) -> ILPModel:
    """The PuLP model (see the module docstring). `forbidden`: combinations {node key or group id:
    strategy name} that may not all hold at once. `objective="memory"` minimises the largest
    memory row instead (to tell how much is missing when nothing fits). `remat`: the layer
    groups of a training step (``formulation.remat``): their residual stacks in the memory rows
    and, with ``remat.decide``, keep / recompute / offload per named activation."""
    prob = pulp.LpProblem("sharding", pulp.LpMinimize)
    s: dict[str, list[Any]] = {}
    gids = graph.order()
    for gi, gid in enumerate(gids):
        G = graph.groups[gid]
        if len(G.strategies) == 1:
            s[gid] = [1]
        else:
            s[gid] = [prob.add_variable(f"s_{gi}_{k}", 0, 1, cat=pulp.LpBinary) for k in range(len(G.strategies))]
            prob += pulp.lpSum(s[gid]) == 1, f"onehot_{gi}"
    corr = strategy_corrections(graph, corrections or {})
    obj_terms = []
    constant = 0.0
    for gid in gids:
        G = graph.groups[gid]
        for k, st in enumerate(G.strategies):
            c = st.cost + corr.get((gid, k), 0.0)
            if isinstance(s[gid][k], int):
                constant += c
            elif c:
                obj_terms.append((s[gid][k], c))
    x: list[dict[tuple[int, int], Any]] = []
    for ei, e in enumerate(graph.edges):
        sp, sc = s[e.producer], s[e.consumer]
        xe: dict[tuple[int, int], Any] = {}
        if len(e.p_specs) == 1 or len(e.q_specs) == 1:
            # the cost depends on one side only: put it on that side's strategies
            if len(e.p_specs) == 1 and len(e.q_specs) == 1:
                constant += e.cost[0][0]
            elif len(e.p_specs) == 1:
                for k, v in enumerate(sc):
                    c = e.cost[0][e.q_of[k]]
                    _add(obj_terms, v, c) if not isinstance(v, int) else None
                    constant += c if isinstance(v, int) else 0.0
            else:
                for k, v in enumerate(sp):
                    c = e.cost[e.p_of[k]][0]
                    _add(obj_terms, v, c) if not isinstance(v, int) else None
                    constant += c if isinstance(v, int) else 0.0
            x.append(xe)
            continue
        for p in range(len(e.p_specs)):
            for q in range(len(e.q_specs)):
                xe[(p, q)] = prob.add_variable(f"x_{ei}_{p}_{q}", 0, 1)
                if e.cost[p][q]:
                    obj_terms.append((xe[(p, q)], e.cost[p][q]))
        for p in range(len(e.p_specs)):
            prob += _eq([xe[(p, q)] for q in range(len(e.q_specs))],
                        [sp[k] for k in range(len(sp)) if e.p_of[k] == p]), f"row_{ei}_{p}"
        for q in range(len(e.q_specs)):
            prob += _eq([xe[(p, q)] for p in range(len(e.p_specs))],
                        [sc[k] for k in range(len(sc)) if e.q_of[k] == q]), f"col_{ei}_{q}"
        x.append(xe)
    rows = memory_rows(ir, graph, small_bytes if small_bytes is not None else hbm_budget * 1e-3,
                       remat)
    rv = add_remat(prob, ir, graph, s, remat) if remat is not None else None

    def stacks(r):
        return pulp.lpSum(rv.memory[gi] * MEM_SCALE for gi in r.stacks) if r.stacks else 0

    if objective == "memory":
        M = prob.add_variable("peak_MB", 0, None)
        prob += M
        for ri, r in enumerate(rows):
            prob += (_lin([(s[g][k], v * MEM_SCALE) for (g, k), v in r.terms.items()])
                     + stacks(r) + r.const * MEM_SCALE <= M), f"mem_{ri}"
    else:
        coef: dict[Any, float] = {}
        for v, c in obj_terms:
            coef[v] = coef.get(v, 0.0) + c * TIME_SCALE
        obj = pulp.LpAffineExpression(list(coef.items()), constant=constant * TIME_SCALE)
        h = add_prefetch_overlap(prob, graph, s, x, graph.prefetch_room, TIME_SCALE)
        prob += (obj + (rv.objective * TIME_SCALE if rv is not None else 0)
                 - (h * (1.0 - PREFETCH_TIE) if h is not None else 0))
        for ri, r in enumerate(rows):
            prob += (_lin([(s[g][k], v * MEM_SCALE) for (g, k), v in r.terms.items()])
                     + stacks(r) <= (hbm_budget - r.const) * MEM_SCALE), f"mem_{ri}"
    for ci, combo in enumerate(forbidden or []):
        combo = dict(combo)
        extra = remat_literals(rv, combo.pop(REMAT_KEY, "traced"))
        add_no_good(prob, graph, s, combo, f"forbid_{ci}", extra)
    ev = None if remat is None else (
        lambda choice, rm: evaluate_remat(ir, graph, remat, choice, rm))
    return ILPModel(prob, s, x, rows, hbm_budget, constant, rv, ev)


def _lin(pairs) -> pulp.LpAffineExpression:
    """sum of coef * var (a fixed strategy, the int 1, goes to the constant)."""
    const = 0.0
    coef: dict[Any, float] = {}
    for v, c in pairs:
        if isinstance(v, int):
            const += v * c
        else:
            coef[v] = coef.get(v, 0.0) + c
    return pulp.LpAffineExpression(list(coef.items()), constant=const)


def _eq(lhs, rhs) -> pulp.LpConstraint:
    """sum(lhs) == sum(rhs) for lists of variables (or fixed 1s)."""
    return _lin([(v, 1.0) for v in lhs] + [(v, -1.0) for v in rhs]) == 0


def _add(terms, v, c):
    if c:
        terms.append((v, c))


def _group_of(graph: StrategyGraph, key: str) -> str:
    if key in graph.groups:
        return key
    if key in graph.group_of_node:
        return graph.group_of_node[key]
    raise KeyError(f"{key!r} is neither a group nor a node of the strategy graph")


def strategy_corrections(graph: StrategyGraph, corrections: dict[str, Any]) -> dict[tuple[str, int], float]:
    out: dict[tuple[str, int], float] = {}
    for key, val in corrections.items():
        gid = _group_of(graph, key)
        G = graph.groups[gid]
        if isinstance(val, dict):
            for name, c in val.items():
                k = _strategy_index(graph, gid, name)
                out[(gid, k)] = out.get((gid, k), 0.0) + float(c)
        else:
            for k in range(len(G.strategies)):
                out[(gid, k)] = out.get((gid, k), 0.0) + float(val)
    return out


def add_no_good(prob, graph: StrategyGraph, s, combo: dict[str, str], name: str,
                extra: list | None = None) -> None:
    """Forbid the combination {group/node key: strategy name} (at least one must differ);
    ``extra``: more binaries of the combination (a remat choice, ``formulation.remat``)."""
    vs = list(extra or [])
    fixed_true = 0
    for key, sname in combo.items():
        gid = _group_of(graph, key)
        v = s[gid][_strategy_index(graph, gid, sname)]
        if isinstance(v, int):
            fixed_true += 1
        else:
            vs.append(v)
    if not vs:
        raise ValueError(f"forbidden combination {combo} involves no choice; the ILP would be infeasible")
    prob += pulp.lpSum(vs) <= len(vs) - 1, name


def ring_groups(graph: StrategyGraph) -> list[str]:
    """The attention groups that offer keys/values both gathered and in a ring."""
    return [gid for gid in graph.order()
            if len({st.kv for st in graph.groups[gid].strategies}) > 1]


def add_kv_mode_cut(prob, graph: StrategyGraph, s, choice: dict[str, int], name: str) -> list[str]:
    """The (kv-mode) rows: every attention group of ``ring_groups`` runs its keys/values
    otherwise than in `choice` (group -> strategy index). Returns the rows' names (none when no
    group offers both); ``row.changeRHS(1)`` lifts a row (a one-hot sum is at most 1)."""
    names = []
    for i, gid in enumerate(ring_groups(graph)):
        strategies = graph.groups[gid].strategies
        kv = strategies[choice[gid]].kv
        names.append(f"{name}_{i}")
        prob += pulp.lpSum(s[gid][k] for k, st in enumerate(strategies) if st.kv == kv) <= 0, \
            names[-1]
    return names


def chosen(model: ILPModel) -> dict[str, int]:
    """Group -> chosen strategy index, from a solved model."""
    out = {}
    for gid, vs in model.s.items():
        if len(vs) == 1:
            out[gid] = 0
            continue
        vals = [v.value() or 0.0 for v in vs]
        out[gid] = max(range(len(vs)), key=lambda k: vals[k])
    return out


def evaluate(graph: StrategyGraph, choice: dict[str, int], corrections: dict | None = None
             ) -> dict[str, float]:
    """Q1 of a choice, seconds: node costs, edge costs, communication part, and the compute of
    every group but the attention (and attention backward) groups (``other_compute_s``, as scaled by
    ``Options.compute_scale``; corrections not included)."""
    corr = strategy_corrections(graph, corrections or {})
    node = sum(graph.groups[g].strategies[k].cost + corr.get((g, k), 0.0) for g, k in choice.items())
    comm = sum(graph.groups[g].strategies[k].comm for g, k in choice.items())
    edge = sum(e.cost[e.p_of[choice[e.producer]]][e.q_of[choice[e.consumer]]] for e in graph.edges)
    other = sum(graph.groups[g].strategies[k].cost - graph.groups[g].strategies[k].comm
                for g, k in choice.items()
                if graph.groups[g].kind not in ("attention", "attention_bwd"))
    hidden = hidden_seconds(graph, choice)
    return {"total_s": node + edge - hidden, "nodes_s": node, "edges_s": edge,
            "comm_s": comm + edge, "prefetch_hidden_s": hidden, "other_compute_s": other}


def peak_memory(model: ILPModel, choice: dict[str, int], remat: Any = "solved") -> float:
    """Largest memory row under a choice, bytes per device; with layer groups, their stacks
    under ``remat`` (a mapping, None: as traced; "solved": the model's solved remat choice)."""
    stacks: list[float] = []
    if model.remat_eval is not None:
        if remat == "solved":
            remat = model.remat.choice() if model.remat is not None else None
        stacks = model.remat_eval(choice, remat)["stack_bytes"]
    best = 0.0
    for r in model.memory_rows:
        v = r.const + sum(b for (g, k), b in r.terms.items() if choice.get(g) == k)
        best = max(best, v + sum(stacks[gi] for gi in r.stacks))
    return best
