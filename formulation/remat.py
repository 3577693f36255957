"""Rematerialization as a decision of the sharding ILP: per layer group and per named activation,
keep it in HBM for the backward, recompute it there, or offload it to host memory.

Names as in the code (``G`` a layer group, ``a`` a named activation, ``s[g][k]`` the sharding
ILP's strategy binaries, ``formulation.sharding_ilp``):

Layer groups and activations (read from the IR, ``layer_groups``)
  A layer group G is a forward ``lax.scan`` whose stacked outputs (``scan_ys``) are read by
  another scan (``scan_xs``): the backward of a training step's transformer blocks, one scan
  body for every layer (one decision covers all ``trip`` iterations). Its *residuals* R_G are
  the body tensors so stacked; the ones that are body inputs (the carry) are kept under every
  policy (``always``). Its *activations* are the body tensors tagged by
  ``jax.ad_checkpoint.checkpoint_name`` (``Tensor.checkpoint``), grouped by name. seg(t), the
  ops that make tensor t from kept values: the body ops on the paths from the body inputs or
  other tagged tensors to t. ``base`` = the union of seg(r) over untagged residuals r
  (norm statistics, casts, RoPE: recomputed under any policy but the traced one);
  seg(a) = the union of seg(t) over a's tensors, minus ``base``.

Variables (one set per activation *name*: the knob, ``TrainConfig.remat``, applies one
mapping to every block, so layer groups with the same names share them)
  ``traced`` in {0,1}: the program as traced (every residual of R_G kept; the built-in step
  traced with ``remat="none"``); ``remat`` = 1 - traced: a mapping policy.
  ``y[a][c]`` in {0,1}, c in keep | recompute | offload:  sum_c y[a][c] = remat.
  ``w`` >= 0 continuous, one per (binary b, group g, distinct value v of a per-strategy vector
  val[k]): w >= sum_{k: val[k] = v} s[g][k] + b - 1, so sum_v v * w = b * val[chosen k] at the
  optimum (every such product appears only with a positive coefficient in a minimised objective
  or on the small side of a memory row, where the bound is tight).

Objective (added to Q1; seconds)
  + remat * sum_{n in base} compute(n | s) + sum_a y[a][recompute] * sum_{n in seg(a)} compute(n | s)
  + sum_a y[a][offload] * 2 * trip * bytes(a | s) / HOST_LINK_BPS
  compute(n | s): one shard's max(flops * f / peak, bytes * f / HBM bandwidth) times the node's
  repeat (the scan's trip), f the smallest shard fraction among the node's tensors under its
  group's strategy; bytes(a | s): one device's shard of a's tensors; offload moves them to the
  host in the forward and back in the backward (2 transfers, not overlapped: an upper bound).

Memory (added to every row of the sharding ILP from the forward scan's first step to the
backward scan's last: the stacked residuals live from their producer in the forward to their
consumer in the backward)
  + trip * [ sum_{t in always} bytes(t | s) + traced * sum_{t in R_G \\ always} bytes(t | s)
             + remat * sum_{t in carry} bytes(t | s) + sum_a y[a][keep] * bytes(a | s) ]
  (``carry``: the body's carry inputs, which ``jax.checkpoint`` saves as the block's input)
  A recomputed or offloaded activation lives only transiently in the backward body (one
  layer's slice, in the rows of the backward scan's ops already). Without a decision
  (``decide=False``: a program that cannot be retraced under another policy) traced = 1 and
  the term is linear in s (it goes into the rows' ordinary terms).

Offload needs host memory: the Target names none (``extract.targets.ChipSpec`` has HBM only);
every TPU VM has host DRAM and JAX's ``pinned_host`` memory kind, so ``offload`` is offered
on every target (``offload=False`` turns it off); host capacity is not a row.

The verdict is the compiler's memory analysis: a (layout, remat) that did not fit is cut as a
layout is (``add_remat_cut``; ``aoizora.planning.feedback``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulp

from aoizora.formulation.strategies import Hardware, StrategyGraph, shard_bytes

# Host link per TPU chip (PCIe), bytes/s: "How to Scale Your Model" (Austin et al., Google
# DeepMind, 2025), part 2 "All About TPUs": PCIe bandwidth about 1.5e10 B/s per chip (its
# worked problem on v6e uses 1.5e10 B/s). One figure for every generation.
HOST_LINK_BPS = 1.5e10
CHOICES = ("keep", "recompute", "offload")
TRACED = "traced"
REMAT_KEY = "remat"   # in a forbidden combination: the remat part (``remat_key``)


def remat_key(remat: dict[str, str] | None) -> str:
    """A remat choice as one string: "traced", or "name=choice,..." sorted."""
    return TRACED if remat is None else ",".join(f"{a}={c}" for a, c in sorted(remat.items()))


def parse_remat_key(key: str) -> dict[str, str] | None:
    return None if key == TRACED else dict(x.split("=", 1) for x in key.split(",") if x)


@dataclasses.dataclass
class LayerGroup:
    scope: str                         # the forward scan's key
    backward: str                      # the backward scan's key
    trip: int                          # layers (the scan's length)
    residuals: list[str]               # forward body tensors stacked for the backward
    always: list[str]                  # ... of them, body inputs (kept under every policy)
    carry: list[str]                   # the body's carry inputs (kept under a mapping policy)
    activations: dict[str, list[str]]  # checkpoint name -> forward body tensors
    segments: dict[str, list[str]]     # checkpoint name -> node keys recomputed to make it
    base: list[str]                    # node keys recomputed under any mapping policy
    first: int                         # first row index (forward scan's first op)
    last: int                          # last row index (backward scan's last op)


@dataclasses.dataclass
class RematProblem:
    groups: list[LayerGroup]
    hardware: Hardware
    decide: bool = True
    offload: bool = True
    host_bps: float = HOST_LINK_BPS
    compute_scale: float = 1.0                 # the ILP's factor on non-attention compute
    attention_scale: dict[str, Any] | None = None   # node key or "*" -> {kv mode: factor}

    def scale(self, node) -> float:
        """The planner's calibration of Q1's compute, as the strategies apply it."""
        if node.kind not in ("attention", "attention_bwd"):
            return self.compute_scale
        a = self.attention_scale or {}
        return float((a.get(node.key) or a.get("*") or {}).get("gather", 1.0))

    @property
    def names(self) -> list[str]:
        return sorted({a for G in self.groups for a in G.activations})

    @property
    def choices(self) -> tuple[str, ...]:
        return CHOICES if self.offload else CHOICES[:2]


@dataclasses.dataclass
class RematVars:
    traced: Any                             # pulp var, or 1 (no decision)
    y: dict[tuple[str, str], Any]           # (name, choice) -> pulp var
    memory: list[pulp.LpAffineExpression]   # per layer group: bytes live over its rows
    objective: pulp.LpAffineExpression      # seconds
    problem: RematProblem

    def fix(self, remat: dict[str, str] | None) -> None:
        """Fix the remat binaries to ``remat`` (None: as traced) by their bounds (``unfix``
        frees them again)."""
        if isinstance(self.traced, int):
            return
        self.traced.lowBound = self.traced.upBound = 1 if remat is None else 0
        for (a, c), v in self.y.items():
            v.lowBound = v.upBound = 1 if remat is not None and remat.get(a) == c else 0

    def unfix(self) -> None:
        for v in ([] if isinstance(self.traced, int) else [self.traced]) + list(self.y.values()):
            v.lowBound, v.upBound = 0, 1

    def choice(self) -> dict[str, str] | None:
        """None: as traced; else every activation name's choice (from solved values)."""
        if isinstance(self.traced, int) or (self.traced.value() or 0.0) > 0.5:
            return None
        return {a: max(self.problem.choices, key=lambda c: self.y[(a, c)].value() or 0.0)
                for a in self.problem.names}


def _segment(ir, producers, tid: str, scope: str, stop) -> set[str]:
    """Node keys on the paths from body inputs / tagged tensors to ``tid`` inside ``scope``."""
    out: set[str] = set()
    todo = [tid]
    while todo:
        t = ir.tensors[todo.pop()]
        if t.kind != "node" or t.scope != scope or t.producer in out:
            continue
        if t.id != tid and stop(t):
            continue
        out.add(t.producer)
        todo += producers[t.producer].operands
    return out


def layer_groups(ir) -> list[LayerGroup]:
    """The forward scans whose stacked outputs a backward scan reads (module docstring)."""
    T = ir.tensors
    pairs: dict[tuple[str, str], list[str]] = {}
    trips: dict[str, int] = {}
    for t in T.values():
        o = T.get(t.outer) if t.kind == "scan_xs" and t.outer else None
        if o is None or o.kind != "scan_ys" or not o.inner:
            continue
        inner = T[o.inner]
        if inner.scope and inner.scope != t.scope:
            pairs.setdefault((inner.scope, t.scope), []).append(inner.id)
            trips[inner.scope] = int(o.shape[0])
    order = {n.key: i for i, n in enumerate(ir.nodes)}
    nodes = {n.key: n for n in ir.nodes}
    out = []
    for (fwd, bwd), res in sorted(pairs.items()):
        res = list(dict.fromkeys(res))
        tagged: dict[str, list[str]] = {}
        for t in T.values():
            if t.scope == fwd and t.kind == "node" and t.checkpoint:
                tagged.setdefault(t.checkpoint, []).append(t.id)
        stop = (lambda t: bool(t.checkpoint))
        base: set[str] = set()
        for r in res:
            if T[r].kind == "node" and not T[r].checkpoint:
                base |= _segment(ir, nodes, r, fwd, stop)
        segs = {a: sorted(set().union(*(_segment(ir, nodes, t, fwd, stop) for t in ts)) - base)
                for a, ts in tagged.items()}
        idx = [order[k] for k in order if k.startswith(fwd + ".") or k.startswith(bwd + ".")]
        carry = [t.id for t in T.values() if t.scope == fwd and t.kind == "scan_carry"
                 and t.id not in res]
        out.append(LayerGroup(fwd, bwd, trips[fwd], res, [r for r in res if T[r].kind != "node"],
                              carry, tagged, segs, sorted(base), min(idx), max(idx)))
    return out


def remat_problem(ir, hardware: Hardware, *, decide: bool = True, offload: bool = True,
                  compute_scale: float = 1.0, attention_scale: dict[str, Any] | None = None
                  ) -> RematProblem | None:
    """The remat part of a sharding instance (None when the program has no layer group); with
    ``decide`` only where a layer group has named activations. The scales: the planner's
    calibration of compute (``strategies.Options.compute_scale``, ``attention_scale``), applied
    to the recompute time as to the ops' own compute."""
    groups = layer_groups(ir)
    if not groups:
        return None
    decide = decide and any(G.activations for G in groups)
    return RematProblem(groups, hardware, decide=decide, offload=offload,
                        compute_scale=compute_scale, attention_scale=attention_scale)


# --- per-strategy values: (group id or None, one value per strategy)

def _spec(graph: StrategyGraph, tid: str, k: int):
    gid, base, tr = graph.origin[tid]
    sp = graph.groups[gid].strategies[k].specs[base]
    for x in tr:
        sp = sp[1:] if x == "drop0" else ((),) + sp
    return sp


def tensor_values(ir, graph: StrategyGraph, tid: str) -> tuple[str | None, list[float]]:
    """One device's bytes of tensor ``tid`` under each strategy of the group that lays it out."""
    t = ir.tensors[tid]
    o = graph.origin.get(tid)
    if o is None:
        return None, [float(t.bytes)]
    n = len(graph.groups[o[0]].strategies)
    return o[0], [shard_bytes(t, _spec(graph, tid, k), graph.mesh_axes) for k in range(n)]


def node_values(ir, graph: StrategyGraph, problem: RematProblem, node
                ) -> tuple[str | None, list[float]]:
    """Seconds to run ``node`` again (times its repeat) under each strategy of its group."""
    hw, scale = problem.hardware, problem.scale(node)
    gid = graph.group_of_node.get(node.key)
    strategies = graph.groups[gid].strategies if gid else [None]
    out = []
    for k, st in enumerate(strategies):
        frac = 1.0
        for tid in node.operands + node.results:
            t = ir.tensors[tid]
            if st is None or not t.bytes or tid not in graph.origin:
                continue
            spec = st.req.get((node.key, node.operands.index(tid))) \
                if tid in node.operands and (node.key, node.operands.index(tid)) in st.req else None
            if spec is None and graph.origin[tid][0] == gid:
                spec = _spec(graph, tid, k)
            if spec is not None:
                frac = min(frac, shard_bytes(t, spec, graph.mesh_axes) / t.bytes)
        out.append(max(node.flops * frac / hw.peak_flops,
                       node.bytes * frac / hw.hbm_bandwidth_Bps) * node.repeat * scale)
    return gid, out


def _by_group(vals, scale: float = 1.0) -> dict[str | None, list[float]]:
    out: dict[str | None, list[float]] = {}
    for gid, v in vals:
        cur = out.setdefault(gid, [0.0] * len(v))
        for k, x in enumerate(v):
            cur[k] += x * scale
    return out


# --- the model

class _Products:
    """Linear forms of b * val[chosen strategy] (module docstring, ``w``)."""

    def __init__(self, prob, s):
        self.prob, self.s, self.n = prob, s, 0

    def __call__(self, b, by_group: dict[str | None, list[float]]) -> pulp.LpAffineExpression:
        expr = pulp.LpAffineExpression()
        for gid, vec in by_group.items():
            if gid is None or len(self.s[gid]) == 1:
                expr += b * float(vec[0])
                continue
            if isinstance(b, int):
                expr += pulp.lpSum(v * self.s[gid][k] for k, v in enumerate(vec) if v)
                continue
            for v in sorted(set(vec)):
                if v <= 0:
                    continue
                w = self.prob.add_variable(f"rw_{self.n}", 0, None)
                self.n += 1
                self.prob += (w >= pulp.lpSum(self.s[gid][k] for k, x in enumerate(vec) if x == v)
                              + b - 1), f"rwc_{self.n}"
                expr += v * w
        return expr


def add_remat(prob, ir, graph: StrategyGraph, s, problem: RematProblem) -> RematVars:
    """The variables, one-hot rows, objective and per-layer-group memory (module docstring)."""
    names, choices = problem.names, problem.choices
    traced, y = 1, {}
    if problem.decide:
        traced = prob.add_variable("remat_traced", 0, 1, cat=pulp.LpBinary)
        for a in names:
            for c in choices:
                y[(a, c)] = prob.add_variable(f"remat_{a}_{c}", 0, 1, cat=pulp.LpBinary)
            prob += pulp.lpSum(y[(a, c)] for c in choices) + traced == 1, f"remat_onehot_{a}"
    prod = _Products(prob, s)
    nodes = {n.key: n for n in ir.nodes}
    memory, objective = [], pulp.LpAffineExpression()
    for G in problem.groups:
        tv = {t: tensor_values(ir, graph, t) for t in G.residuals}
        mem = prod(1, _by_group([tv[t] for t in G.always], G.trip))
        mem += prod(traced, _by_group([tv[t] for t in G.residuals if t not in G.always], G.trip))
        if problem.decide:
            mem += prod(1 - traced, _by_group([tensor_values(ir, graph, t) for t in G.carry],
                                              G.trip))
            objective += prod(1 - traced, _by_group([node_values(ir, graph, problem, nodes[k])
                                                     for k in G.base]))
            for a in names:
                vals = [tensor_values(ir, graph, t) for t in G.activations.get(a, [])]
                mem += prod(y[(a, "keep")], _by_group(vals, G.trip))
                objective += prod(y[(a, "recompute")], _by_group(
                    [node_values(ir, graph, problem, nodes[k]) for k in G.segments.get(a, [])]))
                if "offload" in choices:
                    objective += prod(y[(a, "offload")],
                                      _by_group(vals, 2.0 * G.trip / problem.host_bps))
        memory.append(mem)
    return RematVars(traced, y, memory, objective, problem)


def remat_values(vars_: RematVars, remat: dict[str, str] | None) -> dict[str, float]:
    """{variable name: value} of the remat binaries under the choice ``remat`` (None: as
    traced), as ``RematVars.fix`` sets them; fixed (int) binaries are left out."""
    out: dict[str, float] = {}
    if not isinstance(vars_.traced, int):
        out[vars_.traced.name] = 1.0 if remat is None else 0.0
    for (a, c), v in vars_.y.items():
        if not isinstance(v, int):
            out[v.name] = 1.0 if remat is not None and remat.get(a) == c else 0.0
    return out


def remat_literals(vars_: RematVars | None, key: str) -> list:
    """The remat binaries that are all 1 under the choice ``key`` (``remat_key``): for a no-good
    over a (layout, remat) pair (the compiler said it did not fit). None / no decision: []."""
    if vars_ is None or isinstance(vars_.traced, int):
        return []
    remat = parse_remat_key(key)
    if remat is None:
        return [vars_.traced]
    return [vars_.y[(a, c)] for a, c in remat.items() if (a, c) in vars_.y]


def add_remat_cut(prob, vars_: RematVars, s_terms: list, remat: dict[str, str] | None,
                  name: str) -> None:
    """Forbid the combination (the layout's strategy binaries ``s_terms`` all 1, and this remat
    choice): a no-good over both (the compiler said it did not fit)."""
    lits = list(s_terms)
    if remat is None:
        lits.append(vars_.traced)
    else:
        lits += [vars_.y[(a, c)] for a, c in remat.items() if (a, c) in vars_.y]
    lits = [v for v in lits if not isinstance(v, int)]
    if lits:
        prob += pulp.lpSum(lits) <= len(lits) - 1, name


def evaluate_remat(ir, graph: StrategyGraph, problem: RematProblem, choice: dict[str, int],
                   remat: dict[str, str] | None) -> dict[str, Any]:
    """Seconds and bytes of a (layout choice, remat) pair: recompute_s, offload_s, and per layer
    group the bytes its stacks hold (``stack_bytes``)."""
    nodes = {n.key: n for n in ir.nodes}

    def at(gv):
        gid, v = gv
        return v[choice[gid]] if gid is not None and gid in choice else v[0]

    rec = off = 0.0
    stacks = []
    for G in problem.groups:
        kept = set(G.residuals) if remat is None else set(G.always) | set(G.carry) | {
            t for a, c in remat.items() if c == "keep" for t in G.activations.get(a, [])}
        stacks.append(G.trip * sum(at(tensor_values(ir, graph, t)) for t in kept))
        if remat is None:
            continue
        rec += sum(at(node_values(ir, graph, problem, nodes[k])) for k in G.base)
        for a, c in remat.items():
            if c == "recompute":
                rec += sum(at(node_values(ir, graph, problem, nodes[k])) for k in G.segments.get(a, []))
            elif c == "offload":
                off += 2.0 * G.trip * sum(at(tensor_values(ir, graph, t))
                                          for t in G.activations.get(a, [])) / problem.host_bps
    return {"recompute_s": rec, "offload_s": off, "stack_bytes": stacks}


def remat_words(remat: dict[str, str] | None) -> str:
    if remat is None:
        return "remat: as traced (every residual kept)"
    by = {c: [a for a, x in sorted(remat.items()) if x == c] for c in CHOICES}
    return "remat: " + "; ".join(f"{c} {', '.join(v)}" for c, v in by.items() if v)

