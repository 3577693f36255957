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
  dims (a key-padding mask; the splash kernel takes it as segment ids). A mask that varies along
  heads or queries (causal, per-head) is not expressible: the region is left as ordinary ops;
- the softmax over the key dims: ``reduce_max`` (optional, with ``max(., -inf)`` and
  ``stop_gradient``) and ``sub``, ``exp``, ``reduce_sum``, ``div`` (or ``mul`` by the reciprocal);
  adding a scalar constant to the logits (softmax is shift invariant); ``convert_element_type``,
  ``transpose`` and reshapes that only add or drop size-1 dims anywhere in the chain.

Eqns are named by the keys of :mod:`aoizora.extract.jaxpr_walk` (call-like eqns inlined, so a region
may cross ``jit`` / ``custom_jvp`` boundaries; not a ``scan`` / ``while`` body boundary). A region's
values other than its result must be used only inside it (checked on the inlined data flow);
otherwise it is not matched.

Roles. Logits dims are the dot's batch dims (batch and heads), the query-side free dims (query
sequence) and the key-side free dims (key sequence, the ones the softmax reduces). Among several
batch dims the heads dim is the one with the largest position in q, the rest batch: a guess,
written in ``AttentionMatch.guesses``. Several dims with one role are flattened in order (role dim
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
import os
from typing import Any

import numpy as np

from aoizora.extract.jaxpr_walk import INLINE_PRIMITIVES, sub_jaxpr

MASK_FILL_MAX = -1e4   # a mask's fill value must be at most this (exp underflows to 0 in f32)
_PASS = frozenset({"convert_element_type", "copy", "copy_p", "reduce_precision", "optimization_barrier"})
_LOGICAL = frozenset({"convert_element_type", "not", "and", "or", "xor", "eq", "ne", "lt", "le",
                      "gt", "ge", "select_n", "copy", "copy_p"})


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


class _NoMatch(Exception):
    def __init__(self, key: str, prim: str, why: str):
        super().__init__(why)
        self.key, self.prim, self.why = key, prim, why


# ---------------------------------------------------------------------------------------------
# the inlined data flow of one scope (top level, or one scan / while body)

@dataclasses.dataclass
class _Eq:
    key: str
    eqn: Any
    ins: list           # canonical vars (Literals as they are)
    outs: list


@dataclasses.dataclass
class _Scope:
    eqns: list = dataclasses.field(default_factory=list)
    outputs: set = dataclasses.field(default_factory=set)


def _is_lit(v) -> bool:
    return type(v).__name__ == "Literal"


class _V:
    """One value of the inlined data flow: a var at one call site (a jaxpr traced once and called
    twice has the same Var objects at both sites; each site gets its own _V). ``value``: the
    array of a constant of the closed program, else None."""
    __slots__ = ("aval", "value")

    def __init__(self, aval, value=None):
        self.aval, self.value = aval, value


def _flatten(jaxpr, prefix: str, env: dict, scope: _Scope, scopes: list) -> None:
    def val(v):
        if _is_lit(v):
            return v
        if v not in env:       # a const var
            env[v] = _V(v.aval)
        return env[v]

    j = getattr(jaxpr, "jaxpr", jaxpr)
    for i, eqn in enumerate(j.eqns):
        key = f"{prefix}{i}"
        name = eqn.primitive.name
        sub = sub_jaxpr(eqn)
        ins = [val(v) for v in eqn.invars]
        if name in INLINE_PRIMITIVES and sub is not None:
            inner = dict(zip(sub.invars, ins[len(ins) - len(sub.invars):]))
            closed = next((eqn.params[n] for n in ("jaxpr", "call_jaxpr", "fun_jaxpr")
                           if n in eqn.params), None)
            for cv, c in zip(sub.constvars, getattr(closed, "consts", [])):
                inner[cv] = _V(cv.aval, c)
            _flatten(sub, key + ".", inner, scope, scopes)
            for ov, iv in zip(eqn.outvars, sub.outvars):
                env[ov] = iv if _is_lit(iv) else inner.setdefault(iv, _V(iv.aval))
            continue
        if name in ("scan", "while"):
            body = _Scope()
            bj = getattr(eqn.params["jaxpr" if name == "scan" else "body_jaxpr"], "jaxpr", None) \
                or eqn.params["jaxpr" if name == "scan" else "body_jaxpr"]
            benv = {v: _V(v.aval) for v in bj.invars}
            _flatten(bj, key + ".", benv, body, scopes)
            body.outputs = {benv[v] for v in bj.outvars if not _is_lit(v) and v in benv}
            scopes.append(body)
        outs = []
        for v in eqn.outvars:
            env[v] = _V(v.aval)
            outs.append(env[v])
        scope.eqns.append(_Eq(key, eqn, ins, outs))


def _scopes(closed) -> list[_Scope]:
    top = _Scope()
    scopes = [top]
    j = getattr(closed, "jaxpr", closed)
    env = {v: _V(v.aval) for v in j.invars}
    for cv, c in zip(j.constvars, getattr(closed, "consts", [])):
        env[cv] = _V(cv.aval, c)
    _flatten(closed, "", env, top, scopes)
    top.outputs = {env[v] for v in j.outvars if not _is_lit(v) and v in env}
    return scopes


def _shape(v) -> tuple[int, ...]:
    return tuple(int(d) for d in getattr(v.aval, "shape", ()))


def source_of(eqn) -> str:
    """'file:line (function)' of the user frame that made `eqn` ("" if unknown)."""
    try:
        from jax._src import source_info_util as siu   # private; best effort, messages only
        fr = siu.user_frame(eqn.source_info.traceback)
        return f"{os.path.basename(fr.file_name)}:{fr.start_line} ({fr.function_name})" if fr else ""
    except Exception:  # noqa: BLE001 -- source info is optional
        return ""


class _Flow:
    """Producers and consumers of one scope's canonical vars."""

    def __init__(self, scope: _Scope):
        self.scope = scope
        self.prod: dict = {}
        self.cons: dict = {}
        for idx, e in enumerate(scope.eqns):
            for v in e.outs:
                self.prod[v] = idx
            for v in e.ins:
                if not _is_lit(v):
                    self.cons.setdefault(v, []).append(idx)

    def static(self, v, depth: int = 0):
        """The value of `v` if it is a constant fill known at trace time (a float), else None."""
        if _is_lit(v):
            a = np.asarray(v.val)
            return float(a.reshape(-1)[0]) if a.size == 1 else None
        idx = self.prod.get(v)
        if idx is None or depth > 8:
            return None
        e = self.scope.eqns[idx]
        name = e.eqn.primitive.name
        if name in ("broadcast_in_dim", "reshape", "convert_element_type", "squeeze",
                    "expand_dims") or (name in _PASS):
            return self.static(e.ins[0], depth + 1)
        if len(e.outs) != 1 or _shape(e.outs[0]) != () or name in INLINE_PRIMITIVES:
            return None
        vals = [self.static(x, depth + 1) for x in e.ins]
        if any(x is None for x in vals):
            return None
        try:
            import jax.numpy as jnp
            args = [jnp.asarray(x, getattr(iv.aval, "dtype", None)) for x, iv in zip(vals, e.ins)]
            out = e.eqn.primitive.bind(*args, **e.eqn.params)
            return float(np.asarray(out).reshape(-1)[0])
        except Exception:  # noqa: BLE001 -- not foldable: not a static scale
            return None

    def varies(self, v, depth: int = 0) -> set[int]:
        """Dims of `v` along which it may vary (a superset; module docstring of the mask rule)."""
        shp = _shape(v) if not _is_lit(v) else ()
        every = {d for d, n in enumerate(shp) if n != 1}
        if _is_lit(v):
            return set()
        idx = self.prod.get(v)
        if idx is None or depth > 24:
            return every
        e = self.scope.eqns[idx]
        name, p = e.eqn.primitive.name, e.eqn.params
        if name == "broadcast_in_dim":
            x = e.ins[0]
            xs = _shape(x) if not _is_lit(x) else ()
            inner = self.varies(x, depth + 1)
            return {p["broadcast_dimensions"][i] for i in inner if xs[i] == shp[p["broadcast_dimensions"][i]]}
        if name == "transpose":
            inner = self.varies(e.ins[0], depth + 1)
            return {j for j, src in enumerate(p["permutation"]) if src in inner}
        if name in ("reshape", "squeeze", "expand_dims"):
            m = _unit_map(_shape(e.ins[0]), shp)
            if m is None:
                return every
            inner = self.varies(e.ins[0], depth + 1)
            return {m[i] for i in inner if m.get(i) is not None}
        if name in _LOGICAL:
            out: set[int] = set()
            for x in e.ins:
                xs = _shape(x) if not _is_lit(x) else ()
                if xs == ():
                    continue
                if len(xs) != len(shp) or any(a != b and a != 1 for a, b in zip(xs, shp)):
                    return every   # lax broadcasts size-1 dims of same-rank operands only
                out |= {d for d in self.varies(x, depth + 1) if xs[d] == shp[d]}
            return out
        return every


def _unit_map(a: tuple[int, ...], b: tuple[int, ...]) -> dict[int, int | None] | None:
    """For a reshape that only adds / drops size-1 dims: operand dim -> result dim (None for a
    dropped unit dim); None if it regroups."""
    ai = [i for i, n in enumerate(a) if n != 1]
    bi = [j for j, n in enumerate(b) if n != 1]
    if [a[i] for i in ai] != [b[j] for j in bi]:
        return None
    m: dict[int, int | None] = {i: None for i in range(len(a))}
    for i, j in zip(ai, bi):
        m[i] = j
    return m


# ---------------------------------------------------------------------------------------------
# the symbolic walk over a candidate region

@dataclasses.dataclass
class _Form:
    kind: str            # L (logits) | M (max) | E (exp) | S (sum) | R (1/sum) | P (probabilities)
    perm: list           # value dim -> logits dim, or None (a unit or broadcast dim)
    shifted: bool = False


class _Interp:
    def __init__(self, flow: _Flow, qk: _Eq, region: list[int]):
        self.flow, self.qk, self.region = flow, qk, region
        n = len(_shape(qk.outs[0]))
        (lc, rc), (lb, rb) = qk.eqn.params["dimension_numbers"]
        nb = len(lb)
        nl = len(_shape(qk.ins[0])) - len(lc) - len(lb)
        self.batch = list(range(nb))
        self.lfree = list(range(nb, nb + nl))
        self.rfree = list(range(nb + nl, n))
        self.lshape = _shape(qk.outs[0])
        self.kdims: list[int] | None = None       # logits dims the softmax reduces
        self.scale = 1.0
        self.mask: tuple[int, int, bool, list] | None = None   # (eqn idx, operand, negated, perm)
        self.forms: dict = {qk.outs[0]: _Form("L", list(range(n)))}

    def fail(self, e: _Eq, why: str):
        raise _NoMatch(e.key, e.eqn.primitive.name, why)

    def nonunit(self, dims) -> set[int]:
        return {d for d in dims if self.lshape[d] != 1}

    def set_k(self, e: _Eq, reduced: set[int]):
        nu = self.nonunit(reduced)
        for side in (self.rfree, self.lfree):
            if nu and nu == self.nonunit(side) and reduced <= set(side) | {d for d in reduced if self.lshape[d] == 1}:
                if self.kdims is None:
                    self.kdims = list(side)
                elif self.kdims != list(side):
                    self.fail(e, "two softmax reductions over different dims")
                return
        self.fail(e, f"reduces logits dims {sorted(reduced)}, not one side's free dims (the keys)")

    def reduced_perm(self, e: _Eq, f: _Form) -> list:
        axes = [int(a) for a in e.eqn.params["axes"]]
        red = {f.perm[a] for a in axes if f.perm[a] is not None}
        self.set_k(e, red)
        return [d for i, d in enumerate(f.perm) if i not in axes]

    def aligned(self, big: _Form, small: _Form) -> bool:
        """small (a max / sum broadcast back) lines up with big on every dim but the key dims."""
        if len(big.perm) != len(small.perm) or self.kdims is None:
            return False
        for bd, sd in zip(big.perm, small.perm):
            if sd is None:
                if bd is not None and bd not in self.kdims and self.lshape[bd] != 1:
                    return False
            elif sd != bd:
                return False
        return True

    def run(self) -> _Form:
        last = None
        for idx in self.region:
            e = self.flow.scope.eqns[idx]
            f = self.step(e)
            self.forms[e.outs[0]] = f
            last = f
        return last

    def side(self, v):
        return self.forms.get(v) if not _is_lit(v) else None

    def step(self, e: _Eq) -> _Form:
        name, p = e.eqn.primitive.name, e.eqn.params
        ins = [self.side(v) for v in e.ins]
        forms = [f for f in ins if f is not None]
        if len(e.outs) != 1 or not forms:
            self.fail(e, "an op inside the softmax with several results or none of its values")
        if name in _PASS or name == "stop_gradient":
            return _copy(forms[0])
        if name == "transpose":
            return _Form(forms[0].kind, [forms[0].perm[s] for s in p["permutation"]], forms[0].shifted)
        if name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim"):
            return self.reshape_like(e, forms[0])
        if name == "reduce_max" and forms[0].kind == "L":
            return _Form("M", self.reduced_perm(e, forms[0]))
        if name == "reduce_sum" and forms[0].kind == "E":
            return _Form("S", self.reduced_perm(e, forms[0]))
        if name == "max" and forms[0].kind == "M" and len(forms) == 1:
            c = self.flow.static(e.ins[1] if ins[0] is not None else e.ins[0])
            if c is None or c != -math.inf:
                self.fail(e, "max of the row maximum with something other than -inf")
            return _copy(forms[0])
        if name == "exp" and forms[0].kind == "L":
            return _Form("E", list(forms[0].perm))
        if name in ("mul", "div") and len(forms) == 1:
            return self.scaled(e, name, ins, forms[0])
        if name == "div" and [f.kind for f in ins] == ["E", "S"]:
            if not self.aligned(ins[0], ins[1]):
                self.fail(e, "the softmax normaliser is not the sum over the key dims")
            return _Form("P", list(ins[0].perm))
        if name == "mul" and sorted(f.kind for f in forms) == ["E", "R"]:
            fe = next(f for f in forms if f.kind == "E")
            fr = next(f for f in forms if f.kind == "R")
            if not self.aligned(fe, fr):
                self.fail(e, "the softmax normaliser is not the sum over the key dims")
            return _Form("P", list(fe.perm))
        if name == "sub" and ins[0] is not None and ins[0].kind == "L" and ins[1] is not None \
                and ins[1].kind == "M":
            if not self.aligned(ins[0], ins[1]):
                self.fail(e, "subtracts a maximum that is not over the key dims")
            return _Form("L", list(ins[0].perm), True)
        if name in ("add", "sub") and len(forms) == 1 and forms[0].kind == "L":
            other = e.ins[1] if ins[0] is not None else e.ins[0]
            if self.flow.static(other) is None:
                self.fail(e, "adds a bias to the logits (the splash kernel takes no bias)")
            return _copy(forms[0])
        if name == "select_n" and len(forms) == 1 and forms[0].kind == "L":
            return self.masked(e, ins, forms[0])
        self.fail(e, f"{name} on {'/'.join(f.kind for f in forms)} is not a softmax step")

    def scaled(self, e, name, ins, f: _Form) -> _Form:
        if f.kind == "S" and name == "div" and ins[1] is f and self.flow.static(e.ins[0]) == 1.0:
            return _Form("R", list(f.perm))
        if f.kind != "L" or f.shifted:
            self.fail(e, f"{name} of the {'shifted ' if f.shifted else ''}{f.kind} values by a constant")
        other = e.ins[1] if ins[0] is not None else e.ins[0]
        c = self.flow.static(other)
        if c is None:
            self.fail(e, f"{name} of the logits by a value not known at trace time")
        if name == "div" and ins[0] is None:
            self.fail(e, "divides a constant by the logits")
        self.scale *= (1.0 / c) if name == "div" else c
        return _copy(f)

    def masked(self, e, ins, f: _Form) -> _Form:
        if self.mask is not None:
            self.fail(e, "a second mask (combine masks before the attention)")
        if len(e.ins) != 3 or ins[0] is not None:
            self.fail(e, "select_n with the logits as predicate or more than two cases")
        which = 1 if ins[1] is None else 2
        fill = self.flow.static(e.ins[which])
        if fill is None or fill > MASK_FILL_MAX:
            self.fail(e, f"select_n of the logits with a fill that is not a large negative constant ({fill})")
        pred = e.ins[0]
        if _shape(pred) != tuple(len(f.perm) * [0]) and len(_shape(pred)) != len(f.perm):
            self.fail(e, "a mask that is not the logits' shape")
        self.mask = (e, 0, which == 2, list(f.perm))   # fill at case 1: pred True = masked
        return _copy(f)

    def reshape_like(self, e: _Eq, f: _Form) -> _Form:
        src, dst = _shape(e.ins[0]), _shape(e.outs[0])
        if e.eqn.primitive.name == "broadcast_in_dim":
            bd = e.eqn.params["broadcast_dimensions"]
            perm = [None] * len(dst)
            for i, j in enumerate(bd):
                perm[j] = f.perm[i] if src[i] == dst[j] else None
            if f.kind in ("L", "E", "P") and any(perm[j] is None and dst[j] != 1 for j in range(len(dst))):
                self.fail(e, "broadcasts the logits along a new dim")
            return _Form(f.kind, perm, f.shifted)
        m = _unit_map(src, dst)
        if m is None:
            self.fail(e, "a reshape that regroups dims of the logits")
        perm = [None] * len(dst)
        for i, j in m.items():
            if j is not None:
                perm[j] = f.perm[i]
        return _Form(f.kind, perm, f.shifted)


def _copy(f: _Form) -> _Form:
    return _Form(f.kind, list(f.perm), f.shifted)


# ---------------------------------------------------------------------------------------------
# regions

def _forward(flow: _Flow, start: int, limit: int = 400) -> dict[int, bool]:
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


def _backward(flow: _Flow, v, within: set[int]) -> set[int]:
    out: set[int] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        idx = flow.prod.get(x) if not _is_lit(x) else None
        if idx is None or idx not in within or idx in out:
            continue
        out.add(idx)
        todo.extend(flow.scope.eqns[idx].ins)
    return out


def _candidates(flow: _Flow):
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


def _escapes(flow: _Flow, region: list[int]) -> tuple[_Eq, str] | None:
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


def _match(flow: _Flow, i: int, j: int, p_side: int, region: list[int]) -> AttentionMatch:
    eqns = flow.scope.eqns
    qk, pv = eqns[i], eqns[j]
    it = _Interp(flow, qk, [r for r in region if r not in (i, j)])
    f = it.run() if len(region) > 2 else it.forms[qk.outs[0]]
    if f is None or f.kind != "P":
        raise _NoMatch(pv.key, "dot_general", "the second dot does not take softmax probabilities")
    esc = _escapes(flow, region)
    if esc:
        raise _NoMatch(esc[0].key, esc[0].eqn.primitive.name, esc[1])
    (lc, rc), (lb, rb) = qk.eqn.params["dimension_numbers"]
    k_is_rhs = it.kdims == it.rfree
    qi, ki = (0, 1) if k_is_rhs else (1, 0)
    qc, kc = (lc, rc) if k_is_rhs else (rc, lc)
    qb, kb = (lb, rb) if k_is_rhs else (rb, lb)
    qfree_l = it.lfree if k_is_rhs else it.rfree          # logits dims of the query side
    qshape, kshape = _shape(qk.ins[qi]), _shape(qk.ins[ki])
    qfree = [d for d in range(len(qshape)) if d not in qb and d not in qc]
    kfree = [d for d in range(len(kshape)) if d not in kb and d not in kc]
    # logits dim -> q / k dim
    q_of = {it.batch[n]: qb[n] for n in range(len(qb))} | dict(zip(qfree_l, qfree))
    k_of = {it.batch[n]: kb[n] for n in range(len(kb))} | dict(zip(it.kdims, kfree))
    # batch vs heads among the logits batch dims: heads = the largest q position (a guess)
    guesses = []
    nb = [d for d in it.batch if it.lshape[d] != 1]
    heads = max(nb, key=lambda d: q_of[d]) if len(nb) >= 2 else None
    if heads is not None:
        guesses.append(f"heads = q dim {q_of[heads]} ({it.lshape[heads]}), batch = q dim(s) "
                       f"{[q_of[d] for d in it.batch if d != heads]} (by position)")
    else:
        guesses.append("one batch dim in the q.k dot: read as batch, heads = 1")
    gb = _order([d for d in it.batch if d != heads], it.lshape)
    gh = [heads] if heads is not None else []
    gs = _order(list(qfree_l), it.lshape)
    gt = _order(list(it.kdims), it.lshape)
    # p @ v: its operand p_side is the probabilities (dims through f.perm)
    (pc, vc), (pbd, vbd) = pv.eqn.params["dimension_numbers"]
    if p_side == 1:
        pc, vc, pbd, vbd = vc, pc, vbd, pbd
    vshape = _shape(pv.ins[1 - p_side])
    p_log = [f.perm[d] for d in range(len(f.perm))]
    if sorted(it.nonunit(p_log[d] for d in pc if p_log[d] is not None)) != sorted(it.nonunit(it.kdims)) \
            or any(p_log[d] is None and len(f.perm) and _shape(pv.ins[p_side])[d] != 1 for d in pc):
        raise _NoMatch(pv.key, "dot_general", "the second dot does not contract the key dims")
    if it.nonunit(p_log[d] for d in pbd if p_log[d] is not None) != it.nonunit(it.batch):
        raise _NoMatch(pv.key, "dot_general", "the second dot's batch dims are not the first's")
    v_of = {p_log[pd]: vd for pd, vd in zip(list(pbd) + list(pc), list(vbd) + list(vc))
            if p_log[pd] is not None}
    vfree = [d for d in range(len(vshape)) if d not in vbd and d not in vc]
    dq = math.prod(qshape[d] for d in qc)
    dv = math.prod(vshape[d] for d in vfree)
    if dq != dv:
        raise _NoMatch(pv.key, "dot_general", f"value head dim {dv} differs from the query's {dq}")
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
            raise _NoMatch(pv.key, "dot_general", f"cannot place the {name} dims of the attention")

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
    _check_cover(pv, out_groups, _shape(pv.outs[0]), "the result")
    sizes = [math.prod(it.lshape[d] for d in g) for g in (gb, gh, gs, gt)] + [dq]
    mask, mask_neg, mask_groups = None, False, []
    if it.mask is not None:
        me, mop, mask_neg, mperm = it.mask
        pred = me.ins[mop]
        vary = {mperm[d] for d in flow.varies(pred) if d < len(mperm)}
        if None in vary or not vary <= set(it.batch) | set(it.kdims) or (vary & {heads}):
            bad = sorted(x for x in vary if x is not None and (x in gs or x == heads))
            raise _NoMatch(me.key, "select_n", f"a mask that varies along the "
                           f"{'query' if any(x in gs for x in bad) else 'head'} dims (splash takes "
                           "key-padding masks only)")
        mof = {d: n for n, d in enumerate(mperm) if d is not None}
        mb = [mof[d] for d in gb if d in mof]
        mt = [mof[d] for d in gt if d in mof]
        mask_groups = [mb, mt, [d for d in range(len(mperm)) if d not in mb and d not in mt]]
        mask = (me.key, mop)
    return AttentionMatch(
        key=pv.key, keys=[eqns[r].key for r in region], q=(qk.key, qi), k=(qk.key, ki),
        v=(pv.key, 1 - p_side), mask=mask, mask_negated=mask_neg, q_groups=q_groups,
        k_groups=k_groups, v_groups=v_groups, out_groups=out_groups, mask_groups=mask_groups,
        shape=tuple(int(x) for x in sizes), scale=float(it.scale),
        out_shape=_shape(pv.outs[0]), out_dtype=str(pv.outs[0].aval.dtype), guesses=guesses,
        source=source_of(qk.eqn))


def _check_cover(pv: _Eq, groups: list[list[int]], shape: tuple[int, ...], what: str) -> None:
    used = [d for g in groups for d in g]
    if len(set(used)) != len(used) or set(used) != set(range(len(shape))):
        left = sorted(set(range(len(shape))) - set(used))
        if any(shape[d] != 1 for d in left) or len(set(used)) != len(used):
            raise _NoMatch(pv.key, "dot_general", f"cannot read the dims of {what} {shape}")
        groups[0].extend(left)   # unit dims: carried in the batch group (size 1)


SPLASH_NAMES = ("splash_mha_fwd",)


def _splash_call(flow: _Flow, e: _Eq) -> AttentionMatch | None:
    """A hand-called splash kernel with a full mask (every block of its ``block_mask`` constant is
    2, no partial blocks, no segment ids): operands (data_next, block_mask, q, k, v), q [B,H,S,D]
    or [H,S,D] already scaled (the kernel takes no scale); its last result, shaped like q, is the
    attention (the others are the kernel's scratch and must be unused)."""
    name = str(e.eqn.params.get("name", ""))
    if e.eqn.primitive.name != "pallas_call" or not name.startswith(SPLASH_NAMES) \
            or len(e.ins) != 5 or any(flow.cons.get(o) or o in flow.scope.outputs for o in e.outs[:-1]):
        return None
    block_mask = e.ins[1].value if isinstance(e.ins[1], _V) else None
    if block_mask is None or not np.all(np.asarray(block_mask) == 2):
        return None
    q, k, v = (_shape(x) for x in e.ins[2:])
    if len(q) not in (3, 4) or k != v or q[:-2] != k[:-2] or q[-1] != k[-1] or _shape(e.outs[-1]) != q:
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
    for scope in _scopes(closed):
        flow = _Flow(scope)
        taken: set[int] = set()
        for e in scope.eqns:
            m = _splash_call(flow, e)
            if m is not None:
                matches[m.key] = m
        for i, j, p_side, region in _candidates(flow):
            if taken & set(region):
                continue
            try:
                m = _match(flow, i, j, p_side, region)
            except _NoMatch as nm:
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
            taken |= set(region)
            matches[m.key] = m
            skip |= set(m.keys[:-1])
    return Patterns(matches, frozenset(skip), warns)
