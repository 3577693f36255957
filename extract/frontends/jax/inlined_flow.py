"""The inlined data flow of a traced program, per scope (the top level, or one ``scan`` /
``while`` body): its leaf eqns in order under the keys of :mod:`aoizora.extract.frontends.jax.jaxpr_walk`, with
call-like eqns (``jit``, ``custom_jvp``, ...) inlined so a value passed into or out of a call is one
``Value``. A jaxpr traced once and called at two sites has the same ``Var`` objects at both; each
site gets its own values. ``Flow`` adds producers and consumers, constant folding of scalars known
at trace time (``Flow.static``) and which dims a value may vary along (``Flow.varies``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

from aoizora.extract.frontends.jax.jaxpr_walk import INLINE_PRIMITIVES, sub_jaxpr

PASS_PRIMS = frozenset({"convert_element_type", "copy", "copy_p", "reduce_precision",
                        "optimization_barrier"})
LOGICAL_PRIMS = frozenset({"convert_element_type", "not", "and", "or", "xor", "eq", "ne", "lt",
                           "le", "gt", "ge", "select_n", "copy", "copy_p"})



@dataclasses.dataclass
class Eq:
    key: str
    eqn: Any
    ins: list           # canonical vars (Literals as they are)
    outs: list


@dataclasses.dataclass
class Scope:
    eqns: list = dataclasses.field(default_factory=list)
    outputs: set = dataclasses.field(default_factory=set)


def is_literal(v) -> bool:
    return type(v).__name__ == "Literal"


class Value:
    """One value of the inlined data flow: a var at one call site (a jaxpr traced once and called
    twice has the same Var objects at both sites; each site gets its own Value). ``value``: the
    array of a constant of the closed program, else None."""
    __slots__ = ("aval", "value")

    def __init__(self, aval, value=None):
        self.aval, self.value = aval, value


def _flatten(jaxpr, prefix: str, env: dict, scope: Scope, found: list) -> None:
    """Append the leaf eqns of ``jaxpr`` to ``scope`` (calls inlined; a loop is one eqn of the
    scope and its body a new scope appended to ``found``). env: this level's Var -> Value."""
    def val(v):
        if is_literal(v):
            return v
        if v not in env:       # a const var
            env[v] = Value(v.aval)
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
                inner[cv] = Value(cv.aval, c)
            _flatten(sub, key + ".", inner, scope, found)
            for ov, iv in zip(eqn.outvars, sub.outvars):
                env[ov] = iv if is_literal(iv) else inner.setdefault(iv, Value(iv.aval))
            continue
        if name in ("scan", "while"):
            body = Scope()
            cj = eqn.params["jaxpr" if name == "scan" else "body_jaxpr"]
            bj = getattr(cj, "jaxpr", cj)
            benv = {v: Value(v.aval) for v in bj.invars}
            benv |= {cv: Value(cv.aval, c) for cv, c in zip(bj.constvars, getattr(cj, "consts", []))}
            _flatten(bj, key + ".", benv, body, found)
            body.outputs = {benv[v] for v in bj.outvars if not is_literal(v) and v in benv}
            found.append(body)
        outs = []
        for v in eqn.outvars:
            env[v] = Value(v.aval)
            outs.append(env[v])
        scope.eqns.append(Eq(key, eqn, ins, outs))


def scopes(closed) -> list[Scope]:
    """The top-level scope of ``closed`` (a ClosedJaxpr or Jaxpr) first, then every loop body."""
    top = Scope()
    found = [top]
    j = getattr(closed, "jaxpr", closed)
    env = {v: Value(v.aval) for v in j.invars}
    for cv, c in zip(j.constvars, getattr(closed, "consts", [])):
        env[cv] = Value(cv.aval, c)
    _flatten(closed, "", env, top, found)
    top.outputs = {env[v] for v in j.outvars if not is_literal(v) and v in env}
    return found


def shape_of(v) -> tuple[int, ...]:
    """The shape of a Value or Var (() for a scalar)."""
    return tuple(int(d) for d in getattr(v.aval, "shape", ()))


def source_of(eqn) -> str:
    """'file:line (function)' of the user frame that made `eqn` ("" if unknown)."""
    try:
        from jax._src import source_info_util as siu   # private; best effort, messages only
        fr = siu.user_frame(eqn.source_info.traceback)
        return f"{os.path.basename(fr.file_name)}:{fr.start_line} ({fr.function_name})" if fr else ""
    except Exception:  # noqa: BLE001 -- source info is optional
        return ""


class Flow:
    """Producers and consumers of one scope's canonical vars."""

    def __init__(self, scope: Scope):
        self.scope = scope
        self.prod: dict = {}
        self.cons: dict = {}
        for idx, e in enumerate(scope.eqns):
            for v in e.outs:
                self.prod[v] = idx
            for v in e.ins:
                if not is_literal(v):
                    self.cons.setdefault(v, []).append(idx)

    def static(self, v, depth: int = 0):
        """The value of `v` if it is a constant fill known at trace time (a float), else None."""
        if is_literal(v):
            a = np.asarray(v.val)
            return float(a.reshape(-1)[0]) if a.size == 1 else None
        idx = self.prod.get(v)
        if idx is None or depth > 8:
            return None
        e = self.scope.eqns[idx]
        name = e.eqn.primitive.name
        if name in ("broadcast_in_dim", "reshape", "convert_element_type", "squeeze",
                    "expand_dims") or (name in PASS_PRIMS):
            return self.static(e.ins[0], depth + 1)
        if len(e.outs) != 1 or shape_of(e.outs[0]) != () or name in INLINE_PRIMITIVES:
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
        shp = shape_of(v) if not is_literal(v) else ()
        every = {d for d, n in enumerate(shp) if n != 1}
        if is_literal(v):
            return set()
        idx = self.prod.get(v)
        if idx is None or depth > 24:
            return every
        e = self.scope.eqns[idx]
        name, p = e.eqn.primitive.name, e.eqn.params
        if name == "broadcast_in_dim":
            x = e.ins[0]
            xs = shape_of(x) if not is_literal(x) else ()
            inner = self.varies(x, depth + 1)
            return {p["broadcast_dimensions"][i] for i in inner if xs[i] == shp[p["broadcast_dimensions"][i]]}
        if name == "transpose":
            inner = self.varies(e.ins[0], depth + 1)
            return {j for j, src in enumerate(p["permutation"]) if src in inner}
        if name in ("reshape", "squeeze", "expand_dims"):
            m = unit_map(shape_of(e.ins[0]), shp)
            if m is None:
                return every
            inner = self.varies(e.ins[0], depth + 1)
            return {m[i] for i in inner if m.get(i) is not None}
        if name in LOGICAL_PRIMS:
            out: set[int] = set()
            for x in e.ins:
                xs = shape_of(x) if not is_literal(x) else ()
                if xs == ():
                    continue
                if len(xs) != len(shp) or any(a != b and a != 1 for a, b in zip(xs, shp)):
                    return every   # lax broadcasts size-1 dims of same-rank operands only
                out |= {d for d in self.varies(x, depth + 1) if xs[d] == shp[d]}
            return out
        return every


def unit_map(a: tuple[int, ...], b: tuple[int, ...]) -> dict[int, int | None] | None:
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


