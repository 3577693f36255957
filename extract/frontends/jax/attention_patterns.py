"""Attention found however it is written: a pattern pass over a traced program that finds
``dot_general(q, k) -> [scale] -> [mask] -> softmax -> [convert] -> dot_general(p, v)`` regions,
so the IR can make each one attention node and the realizer can run it as one kernel.

What is recognised (every form traces to the same region): ``jax.nn.dot_product_attention``
(its XLA implementation), Flax's ``dot_product_attention`` and ``MultiHeadAttention`` (linen and
NNX, which call one of the two), and hand-written ``einsum``/``@`` -> ``softmax`` -> ``einsum``,
with any transposes around the two dots; and a hand-called Pallas splash kernel with a full mask
(``_splash_call``). Inside a region:

- a scale: ``mul`` / ``div`` of the logits by a scalar known at trace time (a literal or a
  constant-folded scalar expression); ``scale`` is the product;
- a mask: ``select_n(pred, fill, logits)`` (``jnp.where(mask, logits, fill)``) with ``fill`` at most
  ``MASK_FILL_MAX`` (so a masked key gets no weight) and ``pred`` varying only along batch and key
  dims (a key-padding mask; the splash kernel takes it as segment ids; the broadcasts that bring
  it to the logits' shape join the region, ``_mask``). A mask that varies along heads or queries
  (causal, per-head) is not expressible: the region is left as ordinary ops;
- the softmax over the key dims: ``reduce_max`` (optional, with ``max(., -inf)`` and
  ``stop_gradient``) and ``sub``, ``exp``, ``reduce_sum``, ``div`` (or ``mul`` by the reciprocal);
  adding a scalar constant to the logits (softmax is shift invariant); ``convert_element_type``,
  ``transpose`` and reshapes that only add or drop size-1 dims anywhere in the chain.

Eqns are named by the keys of :mod:`aoizora.extract.frontends.jax.jaxpr_walk` (call-like eqns inlined, so a region
may cross ``jit`` / ``custom_jvp`` boundaries; not a ``scan`` / ``while`` body boundary). A region's
values other than its result must be used only inside it (checked on the inlined data flow);
otherwise it is not matched.

Roles. Logits dims are the dot's batch dims (batch and heads), the query-side free dims (query
sequence) and the key-side free dims (key sequence, the ones the softmax reduces). Among several
batch dims the heads dim is the one an ``aoizora_hint`` on q names "heads", else the one with the
largest position in q, the rest batch: a guess, written in ``AttentionMatch.guesses``. Several dims with one role are flattened in order (role dim
first), e.g. the query group dim of grouped-query attention joins the query sequence (queries are
independent rows). The canonical attention is q [B,H,S,D], k / v [B,H,T,D] -> [B,H,S,D];
``*_groups`` give, per operand, which of its dims make each canonical dim.

A dot -> ... -> exp, reduce_sum -> ... -> dot chain that fails a rule is "attention-like": one
line in ``Patterns.warnings`` names the op where it failed and why; its eqns stay ordinary ops.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from aoizora.extract.frontends.jax.inlined_flow import (PASS_PRIMS, Eq, Flow, Value, is_literal, scopes, shape_of,
                                          source_of, unit_map)
from aoizora.extract.frontends.jax.softmax_chain import NoMatch, SoftmaxChain


@dataclasses.dataclass
class AttentionMatch:
    """One recognised attention region (module docstring). Groups: per canonical dim, the
    operand's dims that make it, role dim first (q, out: b,h,s,d; k, v: b,h,t,d; mask: b,t and
    then the dims to index at 0, where it is constant)."""
    key: str                          # the region's last eqn: the p @ v dot_general
    keys: list[str]                   # every eqn key of the region, the last included
    q: tuple[str, int]                # (eqn key, operand index) where the region reads q
    k: tuple[str, int]
    v: tuple[str, int]
    mask: tuple[str, int] | None      # the select_n's pred operand, or None
    mask_negated: bool                # True: the pred marks masked keys (where(pred, fill, s))
    q_groups: list[list[int]]
    k_groups: list[list[int]]
    v_groups: list[list[int]]
    out_groups: list[list[int]]
    mask_groups: list[list[int]]      # [b dims, t dims, dims taken at index 0]
    shape: tuple[int, int, int, int, int]   # B, H, S, T, D
    scale: float
    out_shape: tuple[int, ...]
    out_dtype: str
    guesses: list[str]
    source: str                       # "file:line (function)" of the q.k dot (or the kernel)
    form: str = "softmax"             # "softmax": a dot-softmax-dot region; "splash": a kernel call
    out_index: int = 0                # which result of the last eqn is the attention's

    @property
    def flops(self) -> float:
        b, h, s, t, d = self.shape
        return 4.0 * b * h * s * t * d


@dataclasses.dataclass
class Patterns:
    matches: dict[str, AttentionMatch]    # by the region's last key
    skip: frozenset[str]                  # region eqn keys other than the last ones
    warnings: list[str]

    @functools.cached_property
    def needed(self) -> dict[tuple[str, int], None]:
        """(eqn key, operand index) of every value a match reads (q, k, v, mask)."""
        out: dict[tuple[str, int], None] = {}
        for m in self.matches.values():
            for r in (m.q, m.k, m.v, m.mask):
                if r is not None:
                    out[r] = None
        return out



# ---------------------------------------------------------------------------------------------
# regions

def _forward(flow: Flow, start: int, limit: int = 400) -> dict[int, bool]:
    """Eqns reachable from eqn `start`'s result without passing through a dot_general or a loop
    (those are reached but not passed), with whether the path to each went through an exp."""
    seen: dict[int, bool] = {}
    todo = [(start, False)]
    while todo and len(seen) < limit:
        idx, ex = todo.pop()
        for v in flow.scope.eqns[idx].outs:
            for c in flow.cons.get(v, []):
                e = flow.scope.eqns[c]
                nex = ex or e.eqn.primitive.name == "exp"
                if seen.get(c) is None or (nex and not seen[c]):
                    seen[c] = nex
                    if e.eqn.primitive.name not in ("dot_general", "scan", "while"):
                        todo.append((c, nex))
    return seen


def _backward(flow: Flow, v, within: set[int]) -> set[int]:
    out: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        idx = flow.prod.get(x) if not is_literal(x) else None
        if idx is None or idx not in within or idx in out:
            continue
        out.add(idx)
        todo.extend(flow.scope.eqns[idx].ins)
    return out


def _candidates(flow: Flow):
    """(qk eqn index, pv eqn index, region indices in order) for every dot -> exp -> dot chain."""
    eqns = flow.scope.eqns
    for i, e in enumerate(eqns):
        if e.eqn.primitive.name != "dot_general":
            continue
        fwd = _forward(flow, i)
        for j in sorted(fwd):
            if eqns[j].eqn.primitive.name != "dot_general" or not fwd[j]:
                continue
            within = set(fwd) - {j}
            reach = [k for k, v in enumerate(eqns[j].ins) if _backward(flow, v, within) or
                     flow.prod.get(v) == i]
            if len(reach) != 1:
                continue
            region = _backward(flow, eqns[j].ins[reach[0]], within) | {i}
            prims = {eqns[r].eqn.primitive.name for r in region}
            if "reduce_sum" not in prims:     # exp without a normaliser: not a softmax
                continue
            yield i, j, reach[0], sorted(region | {j})
            break


def _escapes(flow: Flow, region: list[int]) -> tuple[Eq, str] | None:
    """(region eqn, why) if a value of the region other than its result is used outside it."""
    inside = set(region)
    for idx in region[:-1]:
        e = flow.scope.eqns[idx]
        for v in e.outs:
            if v in flow.scope.outputs:
                return e, "its value is a result of the program or loop body"
            bad = [c for c in flow.cons.get(v, []) if c not in inside]
            if bad:
                o = flow.scope.eqns[bad[0]]
                return e, f"its value is also used by {o.eqn.primitive.name} {o.key}"
    return None


def _order(dims: list[int], shape: tuple[int, ...]) -> list[int]:
    """Role dim first: the first non-unit dim, then the rest in order."""
    first = next((d for d in dims if shape[d] != 1), dims[0] if dims else None)
    return ([first] + [d for d in dims if d != first]) if first is not None else []


def _hint_names(flow: Flow, v, depth: int = 0) -> list | None:
    """The ``aoizora_hint`` names of v's dims, through transposes, converts and reshapes that only
    add or drop unit dims (None: no hint on the way)."""
    idx = flow.prod.get(v) if not is_literal(v) else None
    if idx is None or depth > 8:
        return None
    e = flow.scope.eqns[idx]
    name = e.eqn.primitive.name
    if name == "aoizora_hint":
        return list(e.eqn.params["names"])
    inner = _hint_names(flow, e.ins[0], depth + 1) if e.ins and name in PASS_PRIMS | {
        "transpose", "reshape"} else None
    if inner is None:
        return None
    if name == "transpose":
        return [inner[p] for p in e.eqn.params["permutation"]]
    if name == "reshape":
        m = unit_map(shape_of(e.ins[0]), shape_of(e.outs[0]))
        if m is None:
            return None
        out = [None] * len(shape_of(e.outs[0]))
        for i, j in m.items():
            if j is not None:
                out[j] = inner[i]
        return out
    return inner


def _heads(flow: Flow, q, batch: list[int], lshape, q_of: dict) -> tuple[int | None, list[str]]:
    """(the logits dim that is heads or None, guesses): by q's hint names if it has them, else the
    non-unit batch dim with the largest position in q (a guess)."""
    nb = [d for d in batch if lshape[d] != 1]
    names = _hint_names(flow, q)
    if names is not None:
        named = [d for d in nb if names[q_of[d]] == "heads"]
        if len(named) == 1:
            return named[0], []
    if len(nb) < 2:
        return None, ["one batch dim in the q.k dot: read as batch, heads = 1"]
    heads = max(nb, key=lambda d: q_of[d])
    return heads, [f"heads = q dim {q_of[heads]} ({lshape[heads]}), batch = q dim(s) "
                   f"{[q_of[d] for d in batch if d != heads]} (by position)"]


def _match(flow: Flow, i: int, j: int, p_side: int, region: list[int]) -> AttentionMatch:
    eqns = flow.scope.eqns
    qk, pv = eqns[i], eqns[j]
    it = SoftmaxChain(flow, qk, [r for r in region if r not in (i, j)])
    f = it.run() if len(region) > 2 else it.forms[qk.outs[0]]
    if f is None or f.kind != "P":
        raise NoMatch(pv.key, "dot_general", "the second dot does not take softmax probabilities")
    esc = _escapes(flow, region)
    if esc:
        raise NoMatch(esc[0].key, esc[0].eqn.primitive.name, esc[1])
    (lc, rc), (lb, rb) = qk.eqn.params["dimension_numbers"]
    k_is_rhs = it.kdims == it.rfree
    qi, ki = (0, 1) if k_is_rhs else (1, 0)
    qc, kc = (lc, rc) if k_is_rhs else (rc, lc)
    qb, kb = (lb, rb) if k_is_rhs else (rb, lb)
    qfree_l = it.lfree if k_is_rhs else it.rfree          # logits dims of the query side
    qshape, kshape = shape_of(qk.ins[qi]), shape_of(qk.ins[ki])
    qfree = [d for d in range(len(qshape)) if d not in qb and d not in qc]
    kfree = [d for d in range(len(kshape)) if d not in kb and d not in kc]
    # logits dim -> q / k dim
    q_of = {it.batch[n]: qb[n] for n in range(len(qb))} | dict(zip(qfree_l, qfree))
    k_of = {it.batch[n]: kb[n] for n in range(len(kb))} | dict(zip(it.kdims, kfree))
    heads, guesses = _heads(flow, qk.ins[qi], it.batch, it.lshape, q_of)
    gb = _order([d for d in it.batch if d != heads], it.lshape)
    gh = [heads] if heads is not None else []
    gs = _order(list(qfree_l), it.lshape)
    gt = _order(list(it.kdims), it.lshape)
    # p @ v: its operand p_side is the probabilities (dims through f.perm)
    (pc, vc), (pbd, vbd) = pv.eqn.params["dimension_numbers"]
    if p_side == 1:
        pc, vc, pbd, vbd = vc, pc, vbd, pbd
    vshape = shape_of(pv.ins[1 - p_side])
    p_log = [f.perm[d] for d in range(len(f.perm))]
    if sorted(it.nonunit(p_log[d] for d in pc if p_log[d] is not None)) != sorted(it.nonunit(it.kdims)) \
            or any(p_log[d] is None and len(f.perm) and shape_of(pv.ins[p_side])[d] != 1 for d in pc):
        raise NoMatch(pv.key, "dot_general", "the second dot does not contract the key dims")
    if it.nonunit(p_log[d] for d in pbd if p_log[d] is not None) != it.nonunit(it.batch):
        raise NoMatch(pv.key, "dot_general", "the second dot's batch dims are not the first's")
    v_of = {p_log[pd]: vd for pd, vd in zip(list(pbd) + list(pc), list(vbd) + list(vc))
            if p_log[pd] is not None}
    vfree = [d for d in range(len(vshape)) if d not in vbd and d not in vc]
    dq = math.prod(qshape[d] for d in qc)
    dv = math.prod(vshape[d] for d in vfree)
    if dq != dv:
        raise NoMatch(pv.key, "dot_general", f"value head dim {dv} differs from the query's {dq}")
    # out = [pv batch dims, lhs free, rhs free]
    pfree = [d for d in range(len(f.perm)) if d not in pbd and d not in pc]
    free_p = [("p", d) for d in pfree]
    free_v = [("v", d) for d in vfree]
    out_dims = [("p", d) for d in pbd] + (free_p + free_v if p_side == 0 else free_v + free_p)
    out_of = {}
    for o, (side, d) in enumerate(out_dims):
        out_of[(side, d)] = o

    def via(of, dims):
        return [of[d] for d in dims if d in of]

    def group_missing(of, dims, name):
        if any(d not in of and it.lshape[d] != 1 for d in dims):
            raise NoMatch(pv.key, "dot_general", f"cannot place the {name} dims of the attention")

    for nm, of in (("q", q_of), ("k", k_of)):
        group_missing(of, gb + gh, nm)
    q_groups = [via(q_of, gb), via(q_of, gh), via(q_of, gs), list(qc)]
    k_groups = [via(k_of, gb), via(k_of, gh), via(k_of, gt), list(kc)]
    v_groups = [via(v_of, gb), via(v_of, gh), via(v_of, gt), vfree]
    p_of = {p_log[d]: d for d in pfree + list(pbd) if p_log[d] is not None}
    out_groups = [[out_of[("p", p_of[d])] for d in g if d in p_of] for g in (gb, gh, gs)] + \
        [[out_of[("v", d)] for d in vfree]]
    _check_cover(pv, q_groups, qshape, "q")
    _check_cover(pv, k_groups, kshape, "k")
    _check_cover(pv, v_groups, vshape, "v")
    _check_cover(pv, out_groups, shape_of(pv.outs[0]), "the result")
    sizes = [math.prod(it.lshape[d] for d in g) for g in (gb, gh, gs, gt)] + [dq]
    mask, mask_neg, mask_groups, chain = None, False, [], []
    if it.mask is not None:
        mask, mask_neg, mask_groups, chain = _mask(flow, it, (gb, gs, gt), heads, set(region))
    inside = set(region) | set(chain)
    for r in region:          # constants only the region reads (a mask's fill broadcast, a scale)
        for x in eqns[r].ins:
            if not is_literal(x) and flow.prod.get(x) not in inside and flow.static(x) is not None:
                inside |= _static_producers(flow, x, inside)
    keys = [eqns[r].key for r in sorted(inside - {j})] + [pv.key]
    return AttentionMatch(
        key=pv.key, keys=keys, q=(qk.key, qi), k=(qk.key, ki),
        v=(pv.key, 1 - p_side), mask=mask, mask_negated=mask_neg, q_groups=q_groups,
        k_groups=k_groups, v_groups=v_groups, out_groups=out_groups, mask_groups=mask_groups,
        shape=tuple(int(x) for x in sizes), scale=float(it.scale),
        out_shape=shape_of(pv.outs[0]), out_dtype=str(pv.outs[0].aval.dtype), guesses=guesses,
        source=source_of(qk.eqn))


def _mask(flow: Flow, it: SoftmaxChain, groups, heads, region: set[int]):
    """(where the region reads the mask, negated, mask groups, chain eqn indices) of a key mask.

    The mask must not vary along heads or queries (``Flow.varies``). Its source is found by
    following the predicate back through broadcasts, transposes, unit reshapes, converts, ``not``
    (flipping ``negated``) and ``and`` with an all-true constant whose results feed only that chain (and the region): those
    eqns join the region (their logits-sized values are never built, and the IR does not count
    them), and the mask is read where the chain reads its source, e.g. the [B, T] array passed."""
    gb, gs, gt = groups
    me, mop, negated, mperm = it.mask
    pred = me.ins[mop]
    vary = {mperm[d] for d in flow.varies(pred) if d < len(mperm)}
    if None in vary or not vary <= set(it.batch) | set(it.kdims) or (vary & {heads}):
        bad = sorted(x for x in vary if x is not None and (x in gs or x == heads))
        raise NoMatch(me.key, "select_n", f"a mask that varies along the "
                      f"{'query' if any(x in gs for x in bad) else 'head'} dims (splash takes "
                      "key-padding masks only)")
    reader, op, dmap, chain = me, mop, list(range(len(mperm))), set()
    while True:
        step = _mask_step(flow, reader.ins[op], dmap, region | chain)
        if step is None:
            break
        idx, op, dmap, extra = step
        reader = flow.scope.eqns[idx]
        chain |= {idx} | extra
        negated ^= reader.eqn.primitive.name == "not"
    lg = [mperm[d] if d is not None else None for d in dmap]      # source dim -> logits dim
    mb = [i for d in gb for i, x in enumerate(lg) if x == d]
    mt = [i for d in gt for i, x in enumerate(lg) if x == d]
    rest = [i for i in range(len(lg)) if i not in mb and i not in mt]
    return (reader.key, op), negated, [mb, mt, rest], sorted(chain)


def _mask_step(flow: Flow, v, dmap: list, inside: set[int]):
    """One step back from mask value v (dims -> pred dims ``dmap``): (its producer's index, the
    operand to follow, that operand's dmap, static eqns to drop with it) or None to stop."""
    idx = flow.prod.get(v) if not is_literal(v) else None
    if idx is None or v in flow.scope.outputs or any(c not in inside for c in flow.cons.get(v, [])):
        return None
    e = flow.scope.eqns[idx]
    name, p = e.eqn.primitive.name, e.eqn.params
    vs = shape_of(v)
    if name == "and" and len(e.ins) == 2:
        const = [k for k in (0, 1) if flow.static(e.ins[k]) == 1.0]
        if not const:
            return None
        op = 1 - const[0]
        xs = shape_of(e.ins[op])
        if len(xs) != len(vs):
            return None
        nm = [dmap[i] if xs[i] == vs[i] else None for i in range(len(xs))]
        return idx, op, nm, _static_producers(flow, e.ins[const[0]], inside | {idx})
    if not e.ins or is_literal(e.ins[0]):
        return None
    xs = shape_of(e.ins[0])
    if name == "broadcast_in_dim":
        bd = p["broadcast_dimensions"]
        return idx, 0, [dmap[bd[i]] if xs[i] == vs[bd[i]] else None for i in range(len(xs))], set()
    if name == "transpose":
        return idx, 0, [dmap[list(p["permutation"]).index(i)] for i in range(len(xs))], set()
    if name in ("reshape", "squeeze", "expand_dims"):
        m = unit_map(xs, vs)
        return None if m is None else (idx, 0, [dmap[m[i]] if m[i] is not None else None
                                                for i in range(len(xs))], set())
    if name in PASS_PRIMS or (name == "not" and e.ins[0].aval.dtype == bool):
        return idx, 0, list(dmap), set()
    return None


def _static_producers(flow: Flow, v, inside: set[int]) -> set[int]:
    """The eqns computing constant v (feeding only ``inside``), to drop with the mask chain."""
    out: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        idx = flow.prod.get(x) if not is_literal(x) else None
        if idx is None or idx in out or any(c not in inside | out for c in flow.cons.get(x, [])):
            continue
        out.add(idx)
        todo.extend(flow.scope.eqns[idx].ins)
    return out


def _check_cover(pv: Eq, groups: list[list[int]], shape: tuple[int, ...], what: str) -> None:
    used = [d for g in groups for d in g]
    if len(set(used)) != len(used) or set(used) != set(range(len(shape))):
        left = sorted(set(range(len(shape))) - set(used))
        if any(shape[d] != 1 for d in left) or len(set(used)) != len(used):
            raise NoMatch(pv.key, "dot_general", f"cannot read the dims of {what} {shape}")
        groups[0].extend(left)   # unit dims: carried in the batch group (size 1)


SPLASH_NAMES = ("splash_mha_fwd",)


def _splash_call(flow: Flow, e: Eq) -> AttentionMatch | None:
    """A hand-called splash kernel with a full mask (every block of its ``block_mask`` constant is
    2, no partial blocks, no segment ids): operands (data_next, block_mask, q, k, v), q [B,H,S,D]
    or [H,S,D] already scaled (the kernel takes no scale); its last result, shaped like q, is the
    attention (the others are the kernel's scratch and must be unused)."""
    name = str(e.eqn.params.get("name", ""))
    if e.eqn.primitive.name != "pallas_call" or not name.startswith(SPLASH_NAMES) \
            or len(e.ins) != 5 or any(flow.cons.get(o) or o in flow.scope.outputs for o in e.outs[:-1]):
        return None
    block_mask = e.ins[1].value if isinstance(e.ins[1], Value) else None
    if block_mask is None or not np.all(np.asarray(block_mask) == 2):
        return None
    q, k, v = (shape_of(x) for x in e.ins[2:])
    if len(q) not in (3, 4) or k != v or q[:-2] != k[:-2] or q[-1] != k[-1] or shape_of(e.outs[-1]) != q:
        return None
    groups = [[0], [1], [2], [3]] if len(q) == 4 else [[], [0], [1], [2]]
    b = q[0] if len(q) == 4 else 1
    return AttentionMatch(
        key=e.key, keys=[e.key], q=(e.key, 2), k=(e.key, 3), v=(e.key, 4), mask=None,
        mask_negated=False, q_groups=groups, k_groups=groups, v_groups=groups, out_groups=groups,
        mask_groups=[], shape=(b, q[-3], q[-2], k[-2], q[-1]), scale=1.0, out_shape=q,
        out_dtype=str(e.outs[-1].aval.dtype), guesses=[], source=source_of(e.eqn), form="splash",
        out_index=len(e.outs) - 1)


def find_attention(closed) -> Patterns:
    """Every attention region of the traced program `closed` (a ClosedJaxpr or Jaxpr)."""
    matches: dict[str, AttentionMatch] = {}
    skip: set[str] = set()
    warns: list[str] = []
    seen_warn: set[str] = set()
    for scope in scopes(closed):
        flow = Flow(scope)
        taken: set[int] = set()
        for e in scope.eqns:
            m = _splash_call(flow, e)
            if m is not None:
                matches[m.key] = m
        for i, j, p_side, region in _candidates(flow):
            if taken & {scope.eqns[r].key for r in region}:
                continue
            try:
                m = _match(flow, i, j, p_side, region)
            except NoMatch as nm:
                e = next(x for x in scope.eqns if x.key == nm.key)
                src = source_of(e.eqn) or source_of(scope.eqns[i].eqn)
                line = (f"attention-like dot_general -> softmax -> dot_general at {scope.eqns[i].key}.."
                        f"{scope.eqns[j].key} not recognised at {nm.prim} {nm.key}"
                        f"{' (' + src + ')' if src else ''}: {nm.why}; kept as ordinary ops")
                sig = f"{nm.prim}|{src}|{nm.why}"
                if sig not in seen_warn:
                    seen_warn.add(sig)
                    warns.append(line)
                continue
            taken |= set(m.keys)
            matches[m.key] = m
            skip |= set(m.keys[:-1])
    return Patterns(matches, frozenset(skip), warns)

