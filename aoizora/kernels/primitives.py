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
  Differentiable, with the splash kernel's own residuals: under ``jax.jvp`` / ``jax.grad`` the
  forward is one ``aoizora_attention_fwd`` eqn (q, k, v[, mask] -> out, lse; lse [B, H, Sq] f32,
  the log-sum-exp of each query row's logits, ``scale`` included), and the backward one
  ``aoizora_attention_bwd`` eqn (q, k, v, out, lse, do[, mask] -> dq, dk, dv) that reads them, so
  the backward does not run the forward again (as splash's own VJP keeps ``out`` and
  ``logsumexp``). A rematerialization policy decides whether (out, lse) are kept or recomputed:
  ``attention(..., name=n)`` tags both with ``checkpoint_name(., n)``, so a names policy that
  keeps n keeps them. The realizer runs both as the kernel's forward with residuals and its dq
  and dk/dv kernels, in the plan's layout. With l = lse and m the mask, the backward is

      p[i, j] = exp(scale q_i . k_j - l_i) (0 for a masked key),   dv = p^T do,
      ds = p * (do v^T - rowsum(out * do)),   dq = scale ds k,   dk = scale ds^T q.

  How: the JVP of ``aoizora_attention`` binds ``aoizora_attention_fwd`` on the primals and
  ``aoizora_attention_jvp`` (q, k, v, out, lse, tq, tk, tv[, mask] -> the output tangent; linear
  in tq, tk, tv; the mask is boolean and has no tangent), whose transpose is
  ``aoizora_attention_bwd`` bound on the output cotangent do. Run or compiled directly, the jvp
  lowers to ``jax.jvp`` of the reference attention and the backward to the formula above.
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
from jax.ad_checkpoint import checkpoint_name
from jax.interpreters import ad, mlir

ATTENTION = "aoizora_attention"
ATTENTION_FWD = "aoizora_attention_fwd"
ATTENTION_BWD = "aoizora_attention_bwd"
ATTENTION_JVP = "aoizora_attention_jvp"
HINT = "aoizora_hint"
FORWARD_ATTENTIONS = (ATTENTION, ATTENTION_FWD)             # an attention's forward, as traced
ATTENTIONS = (ATTENTION, ATTENTION_FWD, ATTENTION_BWD)      # every eqn that is an attention


MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)   # a masked key's logit (splash's own value)


def _logits(q, k, scale, kv_mask):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    return s if kv_mask is None else jnp.where(kv_mask[:, None, None, :], s, MASK_VALUE)


def reference_attention(q, k, v, *, scale: float, kv_mask=None):
    """Dense softmax attention in f32 accumulation; the CPU path and the numerical reference.
    kv_mask: None or bool [B, Skv], True = attend (module docstring)."""
    p = jax.nn.softmax(_logits(q, k, scale, kv_mask), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v,
                      preferred_element_type=jnp.float32).astype(q.dtype)


def reference_attention_fwd(q, k, v, *rest, scale: float):
    """(out, lse): the reference attention and each query row's log-sum-exp [B, H, Sq] f32."""
    s = _logits(q, k, scale, rest[0] if rest else None)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    out = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return [out.astype(q.dtype), lse]


def reference_attention_bwd(q, k, v, out, lse, do, *rest, scale: float):
    """(dq, dk, dv) from the forward's residuals (out, lse) and the cotangent do (module
    docstring's formula; ``rest``: the key mask, if any)."""
    f32 = jnp.float32
    p = jnp.exp(_logits(q, k, scale, rest[0] if rest else None) - lse[..., None])
    do32 = do.astype(f32)
    dv = jnp.einsum("bhqk,bhqd->bhkd", p, do32)
    dp = jnp.einsum("bhqd,bhkd->bhqk", do32, v.astype(f32))
    ds = p * (dp - jnp.sum(out.astype(f32) * do32, axis=-1, keepdims=True))
    dq = scale * jnp.einsum("bhqk,bhkd->bhqd", ds, k.astype(f32))
    dk = scale * jnp.einsum("bhqk,bhqd->bhkd", ds, q.astype(f32))
    return [dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)]


def _mask_of(rest) -> dict:
    """The ``kv_mask`` keyword from a marker's optional last operand (none, or the mask)."""
    return {"kv_mask": rest[0]} if rest else {}


def _ref(q, k, v, *rest, scale, name=None):
    return reference_attention(q, k, v, scale=scale, **_mask_of(rest))


def _avals(*xs):
    return [jax.core.ShapedArray(x.shape, x.dtype) for x in xs]


attention_p = Primitive(ATTENTION)
attention_p.def_impl(_ref)
attention_p.def_abstract_eval(lambda q, k, v, *rest, scale, name=None: _avals(q)[0])
mlir.register_lowering(attention_p, mlir.lower_fun(_ref, multiple_results=False))


def _fwd_avals(q, k, v, *rest, scale):
    return [_avals(q)[0], jax.core.ShapedArray(q.shape[:3], jnp.float32)]


attention_fwd_p = Primitive(ATTENTION_FWD)
attention_fwd_p.multiple_results = True
attention_fwd_p.def_impl(reference_attention_fwd)
attention_fwd_p.def_abstract_eval(_fwd_avals)
mlir.register_lowering(attention_fwd_p,
                       mlir.lower_fun(reference_attention_fwd, multiple_results=True))


def reference_attention_jvp(q, k, v, out, lse, tq, tk, tv, *rest, scale: float):
    """The output tangent of the reference attention at (q, k, v) along (tq, tk, tv); out and lse
    (the forward's residuals) are not needed here; ``rest``: the key mask, if any."""
    mask = _mask_of(rest)
    return jax.jvp(lambda a, b, c: reference_attention(a, b, c, scale=scale, **mask), (q, k, v),
                   (tq, tk, tv))[1]


attention_bwd_p = Primitive(ATTENTION_BWD)
attention_bwd_p.multiple_results = True
attention_bwd_p.def_impl(reference_attention_bwd)
attention_bwd_p.def_abstract_eval(lambda q, k, v, out, lse, do, *rest, scale: _avals(q, k, v))
mlir.register_lowering(attention_bwd_p, mlir.lower_fun(reference_attention_bwd, multiple_results=True))

attention_jvp_p = Primitive(ATTENTION_JVP)
attention_jvp_p.def_impl(reference_attention_jvp)
attention_jvp_p.def_abstract_eval(lambda q, k, v, out, lse, tq, tk, tv, *rest, scale: _avals(q)[0])
mlir.register_lowering(attention_jvp_p,
                       mlir.lower_fun(reference_attention_jvp, multiple_results=False))


def _attention_jvp_rule(primals, tangents, *, scale, name=None):
    q, k, v, *mask = primals
    out, lse = attention_fwd_p.bind(*primals, scale=scale)
    if name is not None:          # the residuals a names policy keeps or recomputes together
        out, lse = checkpoint_name(out, name), checkpoint_name(lse, name)
    if all(type(t) is ad.Zero for t in tangents[:3]):
        return out, ad.Zero.from_primal_value(out)
    tq, tk, tv = (ad.instantiate_zeros(t) for t in tangents[:3])
    return out, attention_jvp_p.bind(q, k, v, out, lse, tq, tk, tv, *mask, scale=scale)


def _attention_jvp_transpose(ct, *operands, scale):
    """Only the tangents are linear; q, k, v, out, lse (and the mask) are residuals."""
    q, k, v, out, lse, tq, tk, tv, *mask = operands
    if any(ad.is_undefined_primal(x) for x in (q, k, v, out, lse, *mask)):
        raise NotImplementedError("aoizora_attention_jvp is linear in its tangents only")
    lin = [ad.is_undefined_primal(t) for t in (tq, tk, tv)]
    if type(ct) is ad.Zero:
        grads = [ad.Zero(t.aval) if u else None for t, u in zip((tq, tk, tv), lin)]
    else:
        grads = attention_bwd_p.bind(q, k, v, out, lse, ct, *mask, scale=scale)
        grads = [g if u else None for g, u in zip(grads, lin)]
    return [None] * 5 + [*grads] + [None] * len(mask)


ad.primitive_jvps[attention_p] = _attention_jvp_rule
ad.primitive_transposes[attention_jvp_p] = _attention_jvp_transpose


def attention(q, k, v, *, scale: float | None = None, kv_mask=None, name: str | None = None):
    """Attention as one op: q [B, H, Sq, D], k, v [B, H, Skv, D]; kv_mask None or bool [B, Skv]
    (True = a real key; module docstring). scale: default D ** -0.5. name: the
    ``checkpoint_name`` of the residuals (out, lse) its backward reads, for remat policies."""
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"attention wants q [B,H,Sq,D] and k = v [B,H,Skv,D]; got "
                         f"{q.shape}, {k.shape}, {v.shape}")
    scale = float(q.shape[-1] ** -0.5) if scale is None else float(scale)
    params = {"scale": scale} if name is None else {"scale": scale, "name": str(name)}
    if kv_mask is None:
        return attention_p.bind(q, k, v, **params)
    if tuple(kv_mask.shape) != (k.shape[0], k.shape[2]):
        raise ValueError(f"attention key mask {tuple(kv_mask.shape)}: want [B, Skv] = "
                         f"{(k.shape[0], k.shape[2])}")
    return attention_p.bind(q, k, v, jnp.asarray(kv_mask, bool), **params)


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
