"""An attention's backward from its forward's residuals, in the layout a plan chose: the splash
kernel's dq and dk/dv kernels (TPU) or the reference formula (CPU), inside ``jax.shard_map``.

``sharded_attention_bwd((q, k, v, out, lse), do, layout=..., mesh=..., scale=...)`` takes the
residuals -- global q, out [B, H, Sq, D], lse [B, H, Sq] f32 (``sharded_attention(...,
residuals=True)``), k, v [B, H, Skv, D] -- and the cotangent do [B, H, Sq, D], and returns
(dq, dk, dv) without running the forward again, as splash's own VJP does with the (out,
logsumexp) it saved. With p[i, j] = exp(scale q_i . k_j - lse_i) (0 for a masked or padded key),

    dv = p^T do,   ds = p * (do v^T - rowsum(out * do)),   dq = scale ds k,   dk = scale ds^T q.

Layout: q, out, lse, do and dq split like the forward's queries (``P(batch, heads, seq)``); keys
and values enter gathered along the sequence (``P(batch, heads, None, None)``, whatever the
forward's ``kv`` mode: the strategies offer the backward gathered keys only), so with the query
sequence split each shard holds its queries' share of dk / dv, summed by a ``psum`` over the
sequence axes. Padding as the forward's (``padded_lengths`` with ``grad``): padded queries get
do = 0 and lse = 0, so they add nothing to dk / dv; padded keys are masked.

The splash path calls the kernel's backward (``_splash_attention_bwd`` of the installed JAX's
``splash_attention_kernel``: private, so pinned with the JAX version) with the residual tuple
its forward would have saved: q scaled (the kernel takes scaled queries), k, v, segment ids,
out, lse and the kernel's dq / dk-dv mask metadata. Its dq is the gradient for scaled queries,
so dq = scale * that. The backward's blocks are the layout's ``block_q_dkv`` ...
``use_fused_bwd_kernel`` (``splash_kernel``; unset: the forward's blocks, unfused); with them
set, the lengths are padded to multiples of the backward's blocks only (the dk/dv kernel's
stand in for the forward's, which the backward does not run).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from aoizora.formulation.layout import AttentionLayout
from aoizora.kernels.attention_kernels import (Kern, axes_size, check_layout, padded_lengths,
                                              scaled, shard_specs, splash_kernel)
from aoizora.kernels.primitives import reference_attention_bwd


def _pad_seq(x, n: int):
    """x padded with zeros along dim 2 to length n."""
    if x.shape[2] == n:
        return x
    return jnp.pad(x, [(0, 0), (0, 0), (0, n - x.shape[2])] + [(0, 0)] * (x.ndim - 3))


def _splash_bwd(res, do, kv_valid, kern: Kern):
    """(dq, dk, dv) of one shard by splash's dq and dk/dv kernels (module docstring)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sak

    q, k, v, o, lse = res
    b, h, lq, _ = q.shape
    kernel = splash_kernel(h, lq, k.shape[2], kern.bq, kern.bkv, kern.interpret, False,
                           backward=kern.backward)
    kw = kernel.kwargs
    seg_q = jnp.zeros((lq,), jnp.int32)

    def one(a, kk, vv, oo, ll, dd, m):
        seg = sak.SegmentIds(q=seg_q, kv=(~m).astype(jnp.int32))
        r = (a, kk, vv, seg, None, oo, ll, kernel.dq_mask_info, kernel.dkv_mask_info)
        grads = sak._splash_attention_bwd(
            False, kw["mask_value"], kw["is_mqa"], kw["block_sizes"], None, kw["mask_function"],
            kw["attn_logits_soft_cap"], kern.interpret, r, dd)
        return grads[3:6]

    valid = jnp.broadcast_to(kv_valid, (b, k.shape[2]))
    dqs, dk, dv = jax.vmap(one)(scaled(q, kern.scale), k, v, o, lse, do, valid)
    return dqs.astype(jnp.float32) * kern.scale, dk, dv


def _body(q, k, v, o, lse, do, mask=None, *, kern: Kern, skv, seq_axes):
    lkv = k.shape[2]
    kv_valid = jnp.arange(lkv) < skv
    if mask is not None:
        kv_valid = mask & kv_valid[None, :]
    if kern.impl == "splash":
        dq, dk, dv = _splash_bwd((q, k, v, o, lse), do, kv_valid, kern)
    else:
        valid = jnp.broadcast_to(kv_valid, (q.shape[0], k.shape[2]))
        dq, dk, dv = reference_attention_bwd(q, k, v, o, lse, do, valid, scale=kern.scale)
    if seq_axes:            # each shard's queries' share of dk, dv
        dk, dv = jax.lax.psum((dk, dv), seq_axes)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def sharded_attention_bwd(res, do, *, layout: AttentionLayout, mesh, scale: float,
                          impl: str = "auto", interpret: bool = False, kv_mask=None):
    """(dq, dk, dv) of the attention in ``layout`` from its residuals res = (q, k, v, out, lse)
    and the cotangent do (module docstring). impl: "splash" | "reference" | "auto" (splash on
    TPU meshes); kv_mask as the forward's."""
    q, k, v, out, lse = res
    if impl == "auto":
        impl = "splash" if mesh.devices.flat[0].platform == "tpu" else "reference"
    gathered = dataclasses.replace(layout, kv="gather")
    check_layout(q.shape, k.shape, gathered, mesh)
    sq, skv = q.shape[2], k.shape[2]
    n_s = axes_size(mesh, layout.seq)
    sq_p, skv_p, bq, bkv = padded_lengths(sq, skv, n_s, kv="gather", impl=impl,
                                          block_q=layout.block_q, block_kv=layout.block_kv,
                                          grad=True)
    backward = tuple(sorted(layout.backward_tiles.items())) if impl == "splash" else ()
    if backward:     # the lengths padded to every backward block (the dk/dv kernel's in place
        b = dict(backward)          # of the forward's, which the backward does not run)
        bq, bkv = b.get("block_q_dkv", bq), b.get("block_kv_dkv", bkv)
        mq = math.lcm(bq, *(b[k] for k in ("block_q_dq",) if k in b))
        mkv = math.lcm(bkv, *(b[k] for k in ("block_kv_dq",) if k in b))
        sq_p, skv_p = -(-sq // (n_s * mq)) * n_s * mq, -(-skv // mkv) * mkv
    qspec, kvspec = shard_specs(gathered)
    specs = (qspec, kvspec, kvspec, qspec, P(*qspec[:3]), qspec)
    args = (_pad_seq(q, sq_p), _pad_seq(k, skv_p), _pad_seq(v, skv_p),
            _pad_seq(out, sq_p), _pad_seq(lse.astype(jnp.float32), sq_p), _pad_seq(do, sq_p))
    if kv_mask is not None:
        kv_mask = jnp.pad(kv_mask.astype(bool), ((0, 0), (0, skv_p - skv)))
        specs, args = specs + (P(kvspec[0], None),), args + (kv_mask,)
    body = functools.partial(_body, kern=Kern(impl, scale, bq, bkv, interpret, backward=backward),
                             skv=skv,
                             seq_axes=tuple(layout.seq))
    dq, dk, dv = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(qspec, kvspec, kvspec),
                               check_vma=False)(*args)
    return dq[:, :, :sq], dk[:, :, :skv], dv[:, :, :skv]
