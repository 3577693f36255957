"""Two markers the built-in models write, so the planner sees attention as one op and knows the
logical name of each activation dimension.

- ``attention(q, k, v, scale=..., kv_mask=None)``: q [B, H, Sq, D], k / v [B, H, Skv, D] ->
  [B, H, Sq, D]; ``kv_mask`` None or bool [B, Skv] (True = a real key; the same for every head
  and query: a key-padding mask). With m = kv_mask,

      out[b, h, i] = sum_j p[b, h, i, j] v[b, h, j],
      p[b, h, i, :] = softmax_j(scale * q[b, h, i] . k[b, h, j]  if m[b, j]  else  MASK_VALUE),

  so a masked key gets weight exp(MASK_VALUE - max) = 0 whenever its row has one real key (a
  row with no real key averages every value: no well-defined softmax; the splash kernel returns
  something else there, ``attention_kernels``). The models pad their token sequences and mask the
  padded keys, so a padded program computes the unpadded one on the real tokens.
  Traced, it is one ``aoizora_attention`` eqn (operands q, k, v and the mask, if any); the IR
  makes it one node whose layout the planner chooses (batch, heads, query sequence; keys/values
  gathered or in a ring), the mask its fourth operand labelled like the keys' batch and sequence,
  as for an attention found in the program. Run or compiled directly, it lowers to the reference
  (dense softmax) attention; the realizer replaces it with the Pallas splash kernel inside
  ``jax.shard_map`` on TPU targets, in the layout of the plan (the mask as splash segment ids).
  Differentiable: ``jax.grad`` through it gives one ``aoizora_attention_bwd`` eqn per attention
  (q, k, v, do[, mask] -> dq, dk, dv), so a training step's backward attention is one op too,
  which the realizer runs as the kernel's own backward (splash's dq and dk/dv kernels) in the
  plan's layout.
  How: the JVP of ``aoizora_attention`` is ``aoizora_attention_jvp`` (q, k, v, tq, tk, tv[, mask]
  -> the output tangent; linear in tq, tk, tv; the mask is boolean and has no tangent), whose
  transpose is ``aoizora_attention_bwd`` bound on the output cotangent do. Run or compiled
  directly, both lower to the reference attention's derivatives (``jax.jvp`` / ``jax.vjp`` of
  ``reference_attention`` at the same mask): masked keys get dk = dv = 0.
- ``hint(x, names)``: identity; ``names`` gives the logical name of each dim of x
  ("batch", "seq", "embed", "heads", "mlp", ...). A layout's ``rules`` turn hints into sharding
  constraints; the IR keeps them as named points in the graph. Linear: under ``jax.grad`` the
  cotangent of x gets the same hint.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

ATTENTION = "aoizora_attention"
ATTENTION_BWD = "aoizora_attention_bwd"
ATTENTION_JVP = "aoizora_attention_jvp"
HINT = "aoizora_hint"


MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)   # a masked key's logit (splash's own value)


def reference_attention(q, k, v, *, scale: float, kv_mask=None):
    """Dense softmax attention in f32 accumulation; the CPU path and the numerical reference.
    kv_mask: None or bool [B, Skv], True = attend (module docstring)."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if kv_mask is not None:
        s = jnp.where(kv_mask[:, None, None, :], s, MASK_VALUE)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(q.dtype)


def _mask_of(rest) -> dict:
    """The ``kv_mask`` keyword from a marker's optional last operand (none, or the mask)."""
    return {"kv_mask": rest[0]} if rest else {}


def _ref(q, k, v, *rest, scale):
    return reference_attention(q, k, v, scale=scale, **_mask_of(rest))


attention_p = Primitive(ATTENTION)
attention_p.def_impl(_ref)
attention_p.def_abstract_eval(lambda q, k, v, *rest, scale: jax.core.ShapedArray(q.shape, q.dtype))
mlir.register_lowering(attention_p, mlir.lower_fun(_ref, multiple_results=False))


def reference_attention_jvp(q, k, v, tq, tk, tv, *rest, scale: float):
    """The output tangent of the reference attention at (q, k, v) along (tq, tk, tv); ``rest``:
    the key mask, if any (a constant: no tangent)."""
    mask = _mask_of(rest)
    return jax.jvp(lambda a, b, c: reference_attention(a, b, c, scale=scale, **mask), (q, k, v),
                   (tq, tk, tv))[1]


def reference_attention_bwd(q, k, v, do, *rest, scale: float):
    """(dq, dk, dv): the reference attention's vector-Jacobian product with the cotangent do;
    ``rest``: the key mask, if any."""
    mask = _mask_of(rest)
    _, vjp = jax.vjp(lambda a, b, c: reference_attention(a, b, c, scale=scale, **mask), q, k, v)
    return tuple(vjp(do))


def _avals(*xs):
    return [jax.core.ShapedArray(x.shape, x.dtype) for x in xs]


attention_bwd_p = Primitive(ATTENTION_BWD)
attention_bwd_p.multiple_results = True
attention_bwd_p.def_impl(reference_attention_bwd)
attention_bwd_p.def_abstract_eval(lambda q, k, v, do, *rest, scale: _avals(q, k, v))
mlir.register_lowering(attention_bwd_p, mlir.lower_fun(reference_attention_bwd, multiple_results=True))

attention_jvp_p = Primitive(ATTENTION_JVP)
attention_jvp_p.def_impl(reference_attention_jvp)
attention_jvp_p.def_abstract_eval(lambda q, k, v, tq, tk, tv, *rest, scale: _avals(q)[0])
mlir.register_lowering(attention_jvp_p,
                       mlir.lower_fun(reference_attention_jvp, multiple_results=False))


def _attention_jvp_rule(primals, tangents, *, scale):
    q, k, v, *mask = primals
    out = attention_p.bind(*primals, scale=scale)
    if all(type(t) is ad.Zero for t in tangents[:3]):
        return out, ad.Zero.from_primal_value(out)
    tq, tk, tv = (ad.instantiate_zeros(t) for t in tangents[:3])
    return out, attention_jvp_p.bind(q, k, v, tq, tk, tv, *mask, scale=scale)


def _attention_jvp_transpose(ct, q, k, v, tq, tk, tv, *mask, scale):
    """Only the tangents are linear; q, k, v (and the mask) are residuals (known primal values)."""
    if any(ad.is_undefined_primal(x) for x in (q, k, v, *mask)):
        raise NotImplementedError("aoizora_attention_jvp is linear in its tangents only")
    lin = [ad.is_undefined_primal(t) for t in (tq, tk, tv)]
    if type(ct) is ad.Zero:
        grads = [ad.Zero(t.aval) if u else None for t, u in zip((tq, tk, tv), lin)]
    else:
        grads = attention_bwd_p.bind(q, k, v, ct, *mask, scale=scale)
        grads = [g if u else None for g, u in zip(grads, lin)]
    return [None, None, None, *grads, *[None] * len(mask)]


ad.primitive_jvps[attention_p] = _attention_jvp_rule
ad.primitive_transposes[attention_jvp_p] = _attention_jvp_transpose


def attention(q, k, v, *, scale: float | None = None, kv_mask=None):
    """Attention as one op: q [B, H, Sq, D], k, v [B, H, Skv, D]; kv_mask None or bool [B, Skv]
    (True = a real key; module docstring). scale: default D ** -0.5."""
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [B,H,Sq,D] and k = v [B,H,Skv,D]; got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    scale = float(q.shape[-1] ** -0.5) if scale is None else float(scale)
    if kv_mask is None:
        return attention_p.bind(q, k, v, scale=scale)
    if tuple(kv_mask.shape) != (k.shape[0], k.shape[2]):
        raise ValueError(f"attention key mask {tuple(kv_mask.shape)}: want [B, Skv] = "
                         f"{(k.shape[0], k.shape[2])}")
    return attention_p.bind(q, k, v, jnp.asarray(kv_mask, bool), scale=scale)


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
