"""Two markers the built-in models write, so the planner sees attention as one op and knows the
logical name of each activation dimension.

- ``attention(q, k, v, scale=...)``: q [B, H, Sq, D], k / v [B, H, Skv, D] -> [B, H, Sq, D].
  Traced, it is one ``aoizora_attention`` eqn; the IR makes it one node whose layout the planner
  chooses (batch, heads, query sequence; keys/values gathered or in a ring). Run or compiled
  directly, it lowers to the reference (dense softmax) attention; the realizer replaces it with the
  Pallas splash kernel inside ``jax.shard_map`` on TPU targets, in the layout of the plan.
  Differentiable: ``jax.grad`` through it gives one ``aoizora_attention_bwd`` eqn per attention
  (q, k, v, do -> dq, dk, dv), so a training step's backward attention is one op too, which the
  realizer runs as the kernel's own backward (splash's dq and dk/dv kernels) in the plan's layout.
  How: the JVP of ``aoizora_attention`` is ``aoizora_attention_jvp`` (q, k, v, tq, tk, tv -> the
  output tangent; linear in tq, tk, tv), whose transpose is ``aoizora_attention_bwd`` bound on the
  output cotangent do. Run or compiled directly, both lower to the reference attention's
  derivatives (``jax.jvp`` / ``jax.vjp`` of ``reference_attention``).
- ``hint(x, names)``: identity; ``names`` gives the logical name of each dim of x
  ("batch", "seq", "embed", "heads", "mlp", ...). A layout's ``rules`` turn hints into sharding
  constraints; the IR keeps them as named points in the graph. Linear: under ``jax.grad`` the
  cotangent of x gets the same hint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

ATTENTION = "aoizora_attention"
ATTENTION_BWD = "aoizora_attention_bwd"
ATTENTION_JVP = "aoizora_attention_jvp"
HINT = "aoizora_hint"


def reference_attention(q, k, v, *, scale: float):
    """Dense softmax attention in f32 accumulation; the CPU path and the numerical reference."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(q.dtype)


attention_p = Primitive(ATTENTION)
attention_p.def_impl(lambda q, k, v, *, scale: reference_attention(q, k, v, scale=scale))
attention_p.def_abstract_eval(lambda q, k, v, *, scale: jax.core.ShapedArray(q.shape, q.dtype))
mlir.register_lowering(attention_p, mlir.lower_fun(reference_attention, multiple_results=False))


def reference_attention_jvp(q, k, v, tq, tk, tv, *, scale: float):
    """The output tangent of the reference attention at (q, k, v) along (tq, tk, tv)."""
    return jax.jvp(lambda a, b, c: reference_attention(a, b, c, scale=scale), (q, k, v),
                   (tq, tk, tv))[1]


def reference_attention_bwd(q, k, v, do, *, scale: float):
    """(dq, dk, dv): the reference attention's vector-Jacobian product with the cotangent do."""
    _, vjp = jax.vjp(lambda a, b, c: reference_attention(a, b, c, scale=scale), q, k, v)
    return tuple(vjp(do))


def _avals(*xs):
    return [jax.core.ShapedArray(x.shape, x.dtype) for x in xs]


attention_bwd_p = Primitive(ATTENTION_BWD)
attention_bwd_p.multiple_results = True
attention_bwd_p.def_impl(lambda q, k, v, do, *, scale: reference_attention_bwd(q, k, v, do, scale=scale))
attention_bwd_p.def_abstract_eval(lambda q, k, v, do, *, scale: _avals(q, k, v))
mlir.register_lowering(attention_bwd_p, mlir.lower_fun(reference_attention_bwd, multiple_results=True))

attention_jvp_p = Primitive(ATTENTION_JVP)
attention_jvp_p.def_impl(
    lambda q, k, v, tq, tk, tv, *, scale: reference_attention_jvp(q, k, v, tq, tk, tv, scale=scale))
attention_jvp_p.def_abstract_eval(lambda q, k, v, tq, tk, tv, *, scale: _avals(q)[0])
mlir.register_lowering(attention_jvp_p,
                       mlir.lower_fun(reference_attention_jvp, multiple_results=False))


def _attention_jvp_rule(primals, tangents, *, scale):
    q, k, v = primals
    out = attention_p.bind(q, k, v, scale=scale)
    if all(type(t) is ad.Zero for t in tangents):
        return out, ad.Zero.from_primal_value(out)
    tq, tk, tv = (ad.instantiate_zeros(t) for t in tangents)
    return out, attention_jvp_p.bind(q, k, v, tq, tk, tv, scale=scale)


def _attention_jvp_transpose(ct, q, k, v, tq, tk, tv, *, scale):
    """Only the tangents are linear; q, k, v are residuals (known primal values)."""
    if any(ad.is_undefined_primal(x) for x in (q, k, v)):
        raise NotImplementedError("aoizora_attention_jvp is linear in its tangents only")
    lin = [ad.is_undefined_primal(t) for t in (tq, tk, tv)]
    if type(ct) is ad.Zero:
        grads = [ad.Zero(t.aval) if u else None for t, u in zip((tq, tk, tv), lin)]
    else:
        grads = attention_bwd_p.bind(q, k, v, ct, scale=scale)
        grads = [g if u else None for g, u in zip(grads, lin)]
    return [None, None, None, *grads]


ad.primitive_jvps[attention_p] = _attention_jvp_rule
ad.primitive_transposes[attention_jvp_p] = _attention_jvp_transpose


def attention(q, k, v, *, scale: float | None = None):
    """Attention as one op: q [B, H, Sq, D], k, v [B, H, Skv, D]."""
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [B,H,Sq,D] and k = v [B,H,Skv,D]; got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    scale = float(q.shape[-1] ** -0.5) if scale is None else float(scale)
    return attention_p.bind(q, k, v, scale=scale)


hint_p = Primitive(HINT)
hint_p.def_impl(lambda x, *, names: x)
hint_p.def_abstract_eval(lambda x, *, names: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(hint_p, mlir.lower_fun(lambda x, *, names: x, multiple_results=False))
# linear (identity): its tangent and its cotangent carry the same names, so a training step's
# gradients are named like the activations they are gradients of
ad.deflinear(hint_p, lambda ct, *, names: [hint_p.bind(ct, names=names)])


def hint(x, *names: str | None):
    """Name the dims of x for the planner: hint(x, "batch", "seq", "embed"). Identity."""
    if len(names) != x.ndim:
        raise ValueError(f"hint names {names} do not match a {x.ndim}-d array {x.shape}")
    return hint_p.bind(x, names=tuple(names))
