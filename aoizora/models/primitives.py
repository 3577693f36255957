"""Two markers the built-in models write, so the planner sees attention as one op and knows the
logical name of each activation dimension.

- ``attention(q, k, v, scale=...)``: q [B, H, Sq, D], k / v [B, H, Skv, D] -> [B, H, Sq, D].
  Traced, it is one ``aoizora_attention`` eqn; the IR makes it one node whose layout the planner
  chooses (batch, heads, query sequence; keys/values gathered or in a ring). Run or compiled
  directly, it lowers to the reference (dense softmax) attention; the realizer replaces it with the
  Pallas splash kernel inside ``jax.shard_map`` on TPU targets, in the layout of the plan.
- ``hint(x, names)``: identity; ``names`` gives the logical name of each dim of x
  ("batch", "seq", "embed", "heads", "mlp", ...). A layout's ``rules`` turn hints into sharding
  constraints; the IR keeps them as named points in the graph.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import mlir

ATTENTION = "aoizora_attention"
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


def hint(x, *names: str | None):
    """Name the dims of x for the planner: hint(x, "batch", "seq", "embed"). Identity."""
    if len(names) != x.ndim:
        raise ValueError(f"hint names {names} do not match a {x.ndim}-d array {x.shape}")
    return hint_p.bind(x, names=tuple(names))
