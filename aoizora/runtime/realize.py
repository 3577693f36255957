"""Realize a :class:`~aoizora.formulation.layout.Layout` as a runnable, compilable JAX program.

``realize(fn, abstract_args, layout, mesh)`` traces ``fn`` to a jaxpr over the abstract args and
re-interprets it inside ``jax.jit``, eqn by eqn, under the keys of
:mod:`aoizora.extract.frontends.jax.jaxpr_walk` (top-level eqn i -> ``"i"``, eqn j in the sub-jaxpr of eqn i ->
``"i.j"``; call-like eqns inlined, ``scan`` / ``while`` bodies visited once), so a key the planner
chose on the IR names the same op here:

- every eqn is bound again as it was (``cond`` and other eqns with sub-jaxprs the walk does not
  enter are bound whole);
- call-like eqns (``jit``, ``closed_call``, ``remat2``, ``custom_jvp_call``, ``custom_vjp_call``)
  are inlined (their custom derivative rules are dropped: differentiate before realizing -- a
  training step traced with ``jax.grad`` inside is already its forward and backward eqns);
- ``scan`` becomes ``lax.scan`` whose Python body interprets the body jaxpr (``while`` likewise
  ``lax.while_loop``), so constraints inside a scanned layer apply at every iteration;
- after an eqn whose key is in ``layout.node_specs`` its output is constrained with
  ``with_sharding_constraint`` (an eqn with several outputs: every output of the spec's rank);
  one also in ``layout.reshard_from`` (a switch point) is constrained to that spec first, so the
  reshard between the two is on this output;
- at an ``aoizora_hint`` eqn the layout's ``rules`` give the spec: a dim whose logical name has a
  rule is split over the rule's axes (an empty rule: replicated); a dim with no rule (or no name)
  is ``P.UNCONSTRAINED`` (the partitioner propagates); a mesh axis already used by an earlier dim
  of the same tensor is dropped from later dims; a hint with no ruled name is left alone;
- at an ``aoizora_attention`` eqn the attention runs in ``layout.attention_for(key)`` through
  :func:`aoizora.kernels.attention_kernels.sharded_attention` (splash on TPU meshes, the reference
  on CPU meshes, both inside the same ``shard_map``), with the marker's key mask (its fourth
  operand, if any) as ``kv_mask``: split like the keys' batch (and sequence, in a ring);
- at an ``aoizora_attention_fwd`` eqn (a differentiated attention's forward: out and its
  log-sum-exp) the same, returning both (``sharded_attention(..., residuals=True)``: splash with
  ``save_residuals``);
- at an ``aoizora_attention_bwd`` eqn (q, k, v, out, lse, do -> dq, dk, dv; ``jax.grad`` of an
  attention) the backward runs in ``layout.attention_for(key)`` from the forward's residuals
  (:func:`aoizora.kernels.attention_backward.sharded_attention_bwd`: splash's dq and dk/dv kernels
  on TPU meshes, the reference formula on CPU meshes; keys gathered; the eqn's key mask, its
  seventh operand, if any), so the forward does not run again.
- an attention written without the marker (``jax.nn.dot_product_attention``, Flax, einsum ->
  softmax -> einsum, a full-mask splash kernel called by hand;
  :mod:`aoizora.extract.frontends.jax.attention_patterns`) runs the same way at its region's last eqn: q, k, v
  (and a key mask) as the region read them are transposed and reshaped to [B, H, S, D] by the
  match's dim groups, attended with the region's scale, and the result put back in the last eqn's
  dim order and dtype; the region's other eqns are not bound (their values are used only inside
  the region; a call around some of them passes them along unread; a kernel's scratch results
  are never read).

``layout.remat`` (a training step's rematerialization, ``formulation.remat``): the program is
first retraced as ``fn.with_remat(layout.remat)`` and the layout's node keys moved to it
(``aoizora.runtime.rematerialize``); a program without ``with_remat`` raises :class:`RealizeError`.

Keys the layout names that this program does not have (or attention layouts on a node that is
not an attention) raise :class:`RealizeError`: a layout made for another program is refused.
``realize`` traces the program once, so every error (specs that do not divide, attention layouts
that do not fit) is raised by ``realize`` itself, before any compile.

Inputs: ``layout.in_specs`` per flattened input leaf (``None``: replicated -- jit's input
shardings cannot be left to the partitioner without the auto-sharding pass). Outputs:
``layout.out_specs`` per flattened output leaf (``None`` for the whole list: the partitioner
chooses; ``None`` for a leaf: unconstrained). A spec that does not divide a dim, names an axis
not in the mesh, or has the wrong rank raises :class:`RealizeError` (one line, naming the tensor,
the dim and the axes).

The mesh must have ``AxisType.Auto`` axes (``aoizora.models.experts.default_mesh`` builds one):
the realizer annotates and lets the partitioner propagate.

``layout.compiler_options`` (libtpu flags) apply on TPU meshes: ``Realized.compile()`` and
``Realized.runner()`` compile with them; on other meshes they are left out (CPU XLA refuses
TPU flags).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import DropVar, Literal, jaxpr_as_fun
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from aoizora.extract.frontends.jax.attention_patterns import AttentionMatch, Patterns, find_attention
from aoizora.extract.evidence import attention_scope
from aoizora.extract.frontends.jax.jaxpr_walk import INLINE_PRIMITIVES, walk
from aoizora.formulation.layout import Layout, axes_of
from aoizora.kernels.attention_backward import sharded_attention_bwd
from aoizora.kernels.attention_kernels import AttentionLayoutError, check_layout, sharded_attention
from aoizora.kernels.primitives import (ATTENTION, ATTENTION_BWD, ATTENTION_FWD, ATTENTIONS,
                                       FORWARD_ATTENTIONS, HINT)
from aoizora.runtime.rematerialize import RematError, apply_remat


class RealizeError(ValueError):
    """A layout that cannot be realized on this program and mesh."""


@dataclasses.dataclass
class Realized:
    """A program realized under a layout. Unpacks as ``(fn, args)``.

    fn: ``jax.jit`` of the re-interpreted program with the layout's in/out shardings; call it on
    arrays with the same pytree structure as ``args`` or lower it: ``fn.lower(*args).compile()``.
    args: the abstract args as ``jax.ShapeDtypeStruct`` carrying their ``NamedSharding``.
    """

    fn: Callable
    args: tuple
    mesh: Mesh
    layout: Layout
    in_shardings: tuple
    out_shardings: Any
    traced: Any = None          # fn traced on args at realize time (every spec already checked)
    # the layout's libtpu options when the mesh is a TPU mesh, else {} (they are TPU flags);
    # ``fn`` itself is jitted without them, so it can be wrapped in another jit (as
    # ``extract.aot_compile.compile_evidence`` does, which takes them as ``compiler_options``)
    compiler_options: dict = dataclasses.field(default_factory=dict)

    def __iter__(self):
        return iter((self.fn, self.args))

    def lower(self):
        return self.traced.lower() if self.traced is not None else self.fn.lower(*self.args)

    def compile(self):
        """The compiled program, with the layout's compiler options."""
        return self.lower().compile(compiler_options=self.compiler_options or None)

    def runner(self) -> Callable:
        """``fn`` jitted with the layout's compiler options (``fn`` when it has none): the
        function a plan runs."""
        if not self.compiler_options:
            return self.fn
        return jax.jit(self.fn, compiler_options=dict(self.compiler_options))


# ---------------------------------------------------------------------------------------------
# specs

def _entry(axes: tuple[str, ...]):
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else tuple(axes)


def check_spec(spec: Sequence, shape: Sequence[int], mesh: Mesh, what: str) -> None:
    """Raise RealizeError unless ``spec`` fits an array of ``shape`` on ``mesh``."""
    if len(spec) != len(shape):
        raise RealizeError(f"{what} {tuple(shape)}: spec {tuple(spec)} has {len(spec)} entries for "
                           f"{len(shape)} dims")
    used: list[str] = []
    for d, (entry, n) in enumerate(zip(spec, shape)):
        if entry is P.UNCONSTRAINED:
            continue
        axes = axes_of(entry)
        for a in axes:
            if a not in mesh.shape:
                raise RealizeError(f"{what} {tuple(shape)}: dim {d} uses mesh axis {a!r}, not in the "
                                   f"mesh {dict(mesh.shape)}")
            if a in used:
                raise RealizeError(f"{what} {tuple(shape)}: mesh axis {a!r} used by two dims in "
                                   f"spec {tuple(spec)}")
            used.append(a)
        size = math.prod(mesh.shape[a] for a in axes)
        if n % size:
            raise RealizeError(f"{what} {tuple(shape)}: dim {d} ({n}) does not divide over mesh axes "
                               f"{axes} of size {size}; pad that dim or choose another spec")


def _sharding(mesh: Mesh, spec) -> NamedSharding:
    return NamedSharding(mesh, P(*spec))


def hint_spec(names: Sequence[str | None], rules: dict[str, tuple[str, ...]]) -> tuple | None:
    """The spec a hint gets from the rules (see module docstring), or None when no name is ruled."""
    if not any(n in rules for n in names if n is not None):
        return None
    used: set[str] = set()
    spec = []
    for n in names:
        if n is None or n not in rules:
            spec.append(P.UNCONSTRAINED)
            continue
        axes = tuple(a for a in rules[n] if a not in used)
        used.update(axes)
        spec.append(_entry(axes))
    return tuple(spec)


# ---------------------------------------------------------------------------------------------
# the interpreter

@dataclasses.dataclass
class _Ctx:
    layout: Layout
    mesh: Mesh
    attention_impl: str
    interpret: bool
    patterns: Patterns = dataclasses.field(default_factory=lambda: Patterns({}, frozenset(), []))
    captured: dict = dataclasses.field(default_factory=dict)   # (eqn key, operand) -> value


class _Dead:
    """The value of an eqn inside a recognised attention region (never computed)."""


_DEAD = _Dead()


def _canon(x, groups: list[list[int]]):
    """x with its dims regrouped: transpose to the groups' order, reshape to one dim per group."""
    perm = [d for g in groups for d in g]
    x = jnp.transpose(x, perm)
    return x.reshape(tuple(int(np.prod([x.shape[perm.index(d)] for d in g])) for g in groups))


def _uncanon(o, groups: list[list[int]], shape: tuple[int, ...]):
    perm = [d for g in groups for d in g]
    o = o.reshape(tuple(shape[d] for d in perm))
    return jnp.transpose(o, list(np.argsort(perm)))


def _pattern_attention(m: AttentionMatch, key: str, ctx: _Ctx):
    """The region's attention from its captured operands (module docstring)."""
    q, k, v = (_canon(ctx.captured[r], g) for r, g in ((m.q, m.q_groups), (m.k, m.k_groups),
                                                        (m.v, m.v_groups)))
    dt = jnp.result_type(q.dtype, k.dtype, v.dtype)
    kv_mask = None
    if m.mask is not None:
        mk = _canon(ctx.captured[m.mask], m.mask_groups)[:, :, 0]
        kv_mask = ~mk if m.mask_negated else mk
        kv_mask = jnp.broadcast_to(kv_mask, (q.shape[0], k.shape[2]))
    with jax.named_scope(attention_scope(key)):
        o = sharded_attention(q.astype(dt), k.astype(dt), v.astype(dt),
                              layout=ctx.layout.attention_for(key), mesh=ctx.mesh, scale=m.scale,
                              impl=ctx.attention_impl, interpret=ctx.interpret, kv_mask=kv_mask)
    return _uncanon(o, m.out_groups, m.out_shape).astype(m.out_dtype)


def _closed(j) -> tuple[Any, list]:
    """(open jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    if hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


def _inline_sub(eqn):
    """The sub-jaxpr jaxpr_walk.sub_jaxpr would pick, with its consts."""
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr", "body_jaxpr"):
        if name in eqn.params:
            return _closed(eqn.params[name])
    return None


def _source_context(eqn):
    """The eqn's own context (and its source name stack, so HLO op names stay those of fn)."""
    try:
        from jax._src import source_info_util as siu   # private; op names only, optional
        stack = siu.current_name_stack() + eqn.source_info.name_stack
        ctx = siu.user_context(eqn.source_info.traceback, name_stack=stack)
    except Exception:  # pragma: no cover - a jax without it: lose only op names
        ctx = contextlib.nullcontext()
    return _both(ctx, eqn.ctx.manager)


@contextlib.contextmanager
def _both(a, b):
    with a, b:
        yield


def _constrain(x, spec, ctx: _Ctx, what: str):
    check_spec(spec, x.shape, ctx.mesh, what)
    return jax.lax.with_sharding_constraint(x, _sharding(ctx.mesh, spec))


def _eval(jaxpr, consts, args, prefix: str, ctx: _Ctx) -> list:
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    def write(v, x):
        if not isinstance(v, DropVar):
            env[v] = x

    for v, x in zip(jaxpr.constvars, consts):
        write(v, x)
    for v, x in zip(jaxpr.invars, args):
        write(v, x)

    pat = ctx.patterns
    for i, eqn in enumerate(jaxpr.eqns):
        key = f"{prefix}{i}"
        if key in pat.skip or key in pat.matches:
            for j, v in enumerate(eqn.invars):
                if (key, j) in pat.needed:
                    ctx.captured[(key, j)] = read(v)
            if key in pat.skip:
                for v in eqn.outvars:
                    write(v, _DEAD)
                continue
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        sub = _inline_sub(eqn) if name in INLINE_PRIMITIVES else None
        if key in pat.matches:
            m = pat.matches[key]
            outs = [_DEAD] * len(eqn.outvars)     # a kernel's other results are its scratch
            outs[m.out_index] = _pattern_attention(m, key, ctx)
        elif sub is not None:
            outs = _eval(sub[0], sub[1], invals, key + ".", ctx)
        elif name == "scan":
            outs = _scan(eqn, invals, key, ctx)
        elif name == "while":
            outs = _while(eqn, invals, key, ctx)
        elif name in FORWARD_ATTENTIONS:
            q, k, v, *mask = invals          # the key mask, if the marker has one
            residuals = name == ATTENTION_FWD     # a differentiated forward: (out, lse)
            # the scope names the node in the compiled ops' op_name metadata, so that compiled
            # attention time can be read back per node (``extract.evidence.ATTENTION_SCOPE``)
            with jax.named_scope(attention_scope(key)):
                got = sharded_attention(q, k, v, layout=ctx.layout.attention_for(key),
                                        mesh=ctx.mesh, scale=eqn.params["scale"],
                                        impl=ctx.attention_impl, interpret=ctx.interpret,
                                        kv_mask=mask[0] if mask else None, residuals=residuals)
            outs = list(got) if residuals else [got]
        elif name == ATTENTION_BWD:
            q, k, v, out, lse, do, *mask = invals
            with jax.named_scope(attention_scope(key)):
                outs = list(sharded_attention_bwd(
                    (q, k, v, out, lse), do, layout=ctx.layout.attention_for(key), mesh=ctx.mesh,
                    scale=eqn.params["scale"], impl=ctx.attention_impl, interpret=ctx.interpret,
                    kv_mask=mask[0] if mask else None))
        elif name == HINT:
            x = invals[0]
            spec = hint_spec(eqn.params["names"], ctx.layout.rules)
            if spec is not None:
                x = _constrain(x, spec, ctx, f"hint {key} {eqn.params['names']}")
            outs = [x]
        else:
            if any(x is _DEAD for x in invals):
                raise RealizeError(f"internal: eqn {key} ({name}) reads a value inside a recognised "
                                   "attention")
            params = eqn.primitive.get_bind_params(eqn.params)
            with _source_context(eqn):
                ans = eqn.primitive.bind(*invals, **params)
            outs = list(ans) if eqn.primitive.multiple_results else [ans]
        spec = ctx.layout.node_specs.get(key)
        first = ctx.layout.reshard_from.get(key)
        if spec is not None and first is not None and len(outs) == 1:
            # a switch point (Layout.reshard_from): the reshard happens on this output
            outs = [_constrain(outs[0], first, ctx, f"node {key} ({name}) before its reshard")]
        if spec is not None:
            if key in pat.matches:
                j = pat.matches[key].out_index
                outs[j] = _constrain(outs[j], spec, ctx, f"node {key} ({name})")
            elif len(outs) == 1:
                outs = [_constrain(outs[0], spec, ctx, f"node {key} ({name})")]
            else:
                outs = [_constrain(o, spec, ctx, f"node {key} ({name}) output {j}")
                        if getattr(o, "ndim", -1) == len(spec) else o for j, o in enumerate(outs)]
        for v, x in zip(eqn.outvars, outs):
            write(v, x)
    return [read(v) for v in jaxpr.outvars]


def _scan(eqn, invals, key, ctx):
    p = eqn.params
    body, body_consts = _closed(p["jaxpr"])
    nc, ncarry = p["num_consts"], p["num_carry"]
    consts, init, xs = invals[:nc], invals[nc:nc + ncarry], invals[nc + ncarry:]

    def step(carry, x):
        outs = _eval(body, body_consts, [*consts, *carry, *x], key + ".", ctx)
        return outs[:ncarry], outs[ncarry:]

    carry, ys = jax.lax.scan(step, list(init), list(xs), length=p["length"], reverse=p["reverse"],
                             unroll=p["unroll"])
    return [*carry, *ys]


def _while(eqn, invals, key, ctx):
    p = eqn.params
    cond = jaxpr_as_fun(p["cond_jaxpr"])
    body, body_consts = _closed(p["body_jaxpr"])
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cconsts, bconsts, init = invals[:nc], invals[nc:nc + nb], invals[nc + nb:]

    def cond_fn(carry):
        return cond(*cconsts, *carry)[0]

    def body_fn(carry):
        return _eval(body, body_consts, [*bconsts, *carry], key + ".", ctx)

    return list(jax.lax.while_loop(cond_fn, body_fn, list(init)))


# ---------------------------------------------------------------------------------------------

def _check_mesh(layout: Layout, mesh: Mesh) -> None:
    got = dict(mesh.shape)
    if list(got.items()) != list(layout.mesh_axes.items()):
        raise RealizeError(f"layout {layout.name or ''} wants mesh {dict(layout.mesh_axes)}, got "
                           f"{got}; build the mesh from layout.mesh_axes")
    types = getattr(mesh, "axis_types", None) or ()
    for a, t in zip(mesh.axis_names, types):
        if t != AxisType.Auto:
            raise RealizeError(f"mesh axis {a!r} is {t}; build the mesh with axis_types=(AxisType.Auto,)"
                               f" * ndim (aoizora.models.experts.default_mesh does)")


def _check_keys(closed, layout: Layout, mesh: Mesh, patterns: Patterns) -> None:
    """Every key the layout names must be a node of this program (attention keys: an attention),
    and every attention's layout must fit its shapes and the mesh."""
    walked = [w for w in walk(closed.jaxpr) if w.key not in patterns.skip]
    prims = {w.key: ATTENTION if w.key in patterns.matches else w.eqn.primitive.name
             for w in walked}
    for key, m in patterns.matches.items():
        b, h, s, t, d = m.shape
        try:
            check_layout((b, h, s, d), (b, h, t, d), layout.attention_for(key), mesh)
        except AttentionLayoutError as e:
            raise RealizeError(f"attention node {key}: {e}") from None
    for w in walked:
        if w.eqn.primitive.name in ATTENTIONS:
            q, k = (v.aval.shape for v in w.eqn.invars[:2])
            try:
                check_layout(q, k, layout.attention_for(w.key), mesh)
            except AttentionLayoutError as e:
                raise RealizeError(f"attention node {w.key}: {e}") from None
    for k in layout.reshard_from:
        if k not in layout.node_specs:
            raise RealizeError(f"layout {layout.name or ''} reshards node {k!r} from a spec "
                               f"(reshard_from) but gives it no spec to reshard to (node_specs)")
    for k in layout.node_specs:
        if k not in prims:
            raise RealizeError(f"layout {layout.name or ''} constrains node {k!r}, which this program "
                               f"does not have (a layout for another program?)")
    for k in layout.attention:
        if k != "*" and prims.get(k) not in ATTENTIONS:
            raise RealizeError(f"layout {layout.name or ''} gives an attention layout to node {k!r}, "
                               f"which is {prims.get(k, 'not a node')!r} in this program, not an attention")


def realize(fn: Callable, abstract_args: Sequence, layout: Layout, mesh: Mesh, *,
            attention_impl: str = "auto", interpret: bool = False,
            donate_argnums: tuple[int, ...] = ()) -> Realized:
    """Realize ``fn(*abstract_args)`` under ``layout`` on ``mesh`` (see module docstring).

    abstract_args: the positional args, pytrees of ``jax.ShapeDtypeStruct`` (or arrays).
    attention_impl: "auto" (splash on TPU meshes, reference elsewhere), "splash", "reference".
    interpret: run the Pallas kernel in interpret mode (splash on CPU, for tests).
    donate_argnums: positional args whose buffers the program may reuse for its outputs (a
    training step's state: ``(0,)``); XLA reuses a donated buffer for an output of the same
    shape, dtype and sharding.
    Returns a :class:`Realized` (unpacks as ``(jitted_fn, sharded_abstract_args)``).
    """
    abstract_args = tuple(abstract_args)
    _check_mesh(layout, mesh)
    plain = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), abstract_args)
    if layout.remat is not None:   # retrace under the chosen remat, keys moved to it
        try:
            applied = apply_remat(fn, plain, layout)
        except RematError as e:
            raise RealizeError(str(e)) from None
        fn, layout = applied.fn, applied.layout
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*plain)
    in_leaves, in_tree = jax.tree_util.tree_flatten_with_path(plain)
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shape)

    patterns = find_attention(closed)
    _check_keys(closed, layout, mesh, patterns)
    if len(layout.in_specs) != len(in_leaves):
        raise RealizeError(f"layout has {len(layout.in_specs)} input specs, the program has "
                           f"{len(in_leaves)} input leaves")
    in_shardings = []
    for (path, leaf), spec in zip(in_leaves, layout.in_specs):
        spec = (None,) * len(leaf.shape) if spec is None else tuple(spec)
        check_spec(spec, leaf.shape, mesh, f"input {jax.tree_util.keystr(path) or '[0]'}")
        in_shardings.append(_sharding(mesh, spec))

    out_specs = layout.out_specs
    out_shardings = None
    if out_specs is not None:
        if len(out_specs) != len(out_leaves):
            raise RealizeError(f"layout has {len(out_specs)} output specs, the program has "
                               f"{len(out_leaves)} output leaves")
        for j, (leaf, spec) in enumerate(zip(out_leaves, out_specs)):
            if spec is not None:
                check_spec(tuple(spec), leaf.shape, mesh, f"output {j}")
        if all(s is not None for s in out_specs):
            out_shardings = jax.tree_util.tree_unflatten(
                out_tree, [_sharding(mesh, tuple(s)) for s in out_specs])

    ctx = _Ctx(layout, mesh, attention_impl, interpret, patterns)
    n_in = len(in_leaves)

    def run(*args):
        flat = jax.tree_util.tree_leaves(args)
        if len(flat) != n_in:
            raise RealizeError(f"realized program takes {n_in} input leaves, got {len(flat)}")
        ctx.captured.clear()
        outs = _eval(closed.jaxpr, closed.consts, flat, "", ctx)
        if out_specs is not None and out_shardings is None:
            outs = [o if s is None else jax.lax.with_sharding_constraint(o, _sharding(mesh, tuple(s)))
                    for o, s in zip(outs, out_specs)]
        return jax.tree_util.tree_unflatten(out_tree, outs)

    in_sh_tree = jax.tree_util.tree_unflatten(in_tree, in_shardings)
    kw = {} if out_shardings is None else {"out_shardings": out_shardings}
    bad = [i for i in donate_argnums if not 0 <= int(i) < len(abstract_args)]
    if bad:
        raise RealizeError(f"donate_argnums {tuple(donate_argnums)}: the program takes "
                           f"{len(abstract_args)} positional args")
    jitted = jax.jit(run, in_shardings=tuple(in_sh_tree), donate_argnums=tuple(donate_argnums), **kw)
    args = jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  plain, in_sh_tree)
    # trace now: a hint or node spec that does not fit raises RealizeError here, not at compile
    traced = jitted.trace(*args)
    tpu = mesh.devices.flat[0].platform == "tpu"
    return Realized(jitted, tuple(args), mesh, layout, tuple(in_sh_tree), out_shardings, traced,
                    dict(layout.compiler_options) if tpu else {})
