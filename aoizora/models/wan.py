"""Wan 2.1 text-to-video DiT (Wan-Video/Wan2.1, ``wan/modules/model.py``) in plain JAX.

Forward of ``WanModel`` for one batch:
  tokens  = patchify(latents, (1,2,2)) @ patch_embed.w + b             [B, L, dim]  (Conv3d, stride = kernel)
  context = fc2(gelu_tanh(fc1(text)))                                   [B, 512, dim]
  e       = fc2(silu(fc1(sinusoid_256(t))))                             [B, dim]
  e0      = time_proj(silu(e)) -> 6 vectors                             [B, 6, dim]
  per block (``lax.scan`` over stacked params), m = modulation[6, dim] + e0:
    y = self_attn(LN(x) * (1 + m1) + m0)   q, k RMS-normed over dim, 3D RoPE on q, k
    x = x + y * m2
    x = x + cross_attn(LN_affine(x), context)   q, k RMS-normed, no RoPE
    y = ffn(LN(x) * (1 + m4) + m3)   fc1 -> gelu_tanh -> fc2
    x = x + y * m5
  head: LN(x) * (1 + s1) + s0, s = head.modulation[2, dim] + e; linear to pt*ph*pw*16; unpatchify.

Every attention goes through ``primitives.attention`` and the main activations carry
``primitives.hint`` names. The block's activations that a training step may keep, recompute or
offload carry ``jax.ad_checkpoint.checkpoint_name`` tags (``ACTIVATION_NAMES``, per block):
  qkv         the self-attention q, k, v projections (before qk-norm and RoPE)   3 x [B, L, dim]
  attn_out    the self-attention's residuals: its output and log-sum-exp (what
              splash's backward reads; ``primitives.attention(name=...)``)  [B, H, L, D] + [B, H, L] f32
  proj_out    the o-projection and fc2 outputs (before the gated residual add)  2 x [B, L, dim]
  cross_q     the cross-attention q projection (before qk-norm)                 [B, L, dim]
  cross_kv    the cross-attention k, v projections of the text                  2 x [B, T, dim]
  cross_out   the cross-attention's residuals, as attn_out                [B, H, L, D] + [B, H, L] f32
  ffn_hidden  fc1's output (before gelu)                                        [B, L, ffn_dim]
  residual    the residual stream after self- and after cross-attention         2 x [B, L, dim]
Anything else in the block (norms, RoPE, gelu, casts) is cheap elementwise work recomputed from
these under any policy that does not keep everything. ``forward(..., remat=wrap)`` runs the scan
body as ``wrap(body)`` (e.g. ``jax.checkpoint`` with a policy; ``aoizora.models.training``).

Sequence padding (``pad_multiple``): the token sequence of n tokens is padded with zeros to L =
a multiple, as the Wan repo pads for sequence parallelism; padded positions get no RoPE
rotation and are dropped before unpatchify. The self-attention masks the padded keys
(``kv_mask`` [B, L] = position < n, as the Wan repo's ``k_lens``), so a padded token gets no
weight in any real token's softmax; every other op is per token (norms, linears, modulation,
cross-attention queries), so on the real tokens the padded forward computes the unpadded one
(up to rounding). Padded queries compute values that are dropped. The shapes, and so the costs,
are the padded ones. Unpadded (L = n): no mask operand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from aoizora.models.config import WanConfig
from aoizora.models.layers import (ParamSpec, apply_rope, gelu_tanh, layer_norm, linear, linear_spec,
                                   norm_spec, padded_length, patchify, real_tokens, rms_norm,
                                   rope_tables, timestep_embedding, unpatchify)
from aoizora.kernels.primitives import attention, hint

ACTIVATION_NAMES = ("qkv", "attn_out", "proj_out", "cross_q", "cross_kv", "cross_out",
                    "ffn_hidden", "residual")


def param_specs(cfg: WanConfig) -> dict:
    """The parameter pytree (ParamSpec leaves). Per-block params are stacked: leading dim = layers."""
    d, L = cfg.dim, cfg.layers
    patch_in = cfg.in_channels * cfg.patch[0] * cfg.patch[1] * cfg.patch[2]
    patch_out = cfg.out_channels * cfg.patch[0] * cfg.patch[1] * cfg.patch[2]

    def attn(layers):
        return {"q": linear_spec(d, d, layers), "k": linear_spec(d, d, layers),
                "v": linear_spec(d, d, layers), "o": linear_spec(d, d, layers),
                "norm_q": norm_spec(d, layers), "norm_k": norm_spec(d, layers)}

    return {
        "patch_embed": linear_spec(patch_in, d),
        "text_embed": {"fc1": linear_spec(cfg.text_dim, d), "fc2": linear_spec(d, d)},
        "time_embed": {"fc1": linear_spec(cfg.freq_dim, d), "fc2": linear_spec(d, d)},
        "time_proj": linear_spec(d, 6 * d),
        "blocks": {
            "modulation": ParamSpec((L, 6, d), "normal", d),
            "self_attn": attn(L),
            "norm3": norm_spec(d, L, bias=True),
            "cross_attn": attn(L),
            "ffn": {"fc1": linear_spec(d, cfg.ffn_dim, L), "fc2": linear_spec(cfg.ffn_dim, d, L)},
        },
        "head": {"modulation": ParamSpec((2, d), "normal", d), "out": linear_spec(d, patch_out)},
    }


def _heads(x, heads: int):
    """[B, S, D] -> [B, S, H, D/H]."""
    b, s, d = x.shape
    return x.reshape(b, s, heads, d // heads)


def _to_bhsd(x, seq_name: str):
    return hint(x.transpose(0, 2, 1, 3), "batch", "heads", seq_name, "head_dim")


def _merge(o):
    """[B, H, S, Dh] -> [B, S, H*Dh]."""
    b, h, s, dh = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, s, h * dh)


def _block(cfg: WanConfig, x, p, e0, ctx, cos, sin, kv_mask=None):
    """One Wan attention block. x [B, L, dim]; e0 [B, 6, dim] f32; ctx [B, T, dim]; kv_mask None
    or bool [B, L], True = a real token (module docstring)."""
    dt = x.dtype
    x = hint(x, "batch", "seq", "embed")
    m = p["modulation"].astype(jnp.float32)[None] + e0          # [B, 6, dim]
    m = [m[:, i] for i in range(6)]

    # self-attention with RMS qk-norm and 3D RoPE
    a = p["self_attn"]
    h = (layer_norm(x, eps=cfg.eps).astype(jnp.float32) * (1 + m[1][:, None]) + m[0][:, None]).astype(dt)
    q, k, v = (checkpoint_name(linear(a[n], h), "qkv") for n in ("q", "k", "v"))
    q = apply_rope(_heads(rms_norm(q, a["norm_q"], cfg.eps), cfg.heads), cos, sin)
    k = apply_rope(_heads(rms_norm(k, a["norm_k"], cfg.eps), cfg.heads), cos, sin)
    v = _heads(v, cfg.heads)
    o = attention(_to_bhsd(q, "seq"), _to_bhsd(k, "seq"), _to_bhsd(v, "seq"), kv_mask=kv_mask,
                  name="attn_out")
    o = hint(o, "batch", "heads", "seq", "head_dim")
    y = checkpoint_name(linear(a["o"], _merge(o)), "proj_out")
    x = (x.astype(jnp.float32) + y.astype(jnp.float32) * m[2][:, None]).astype(dt)
    x = checkpoint_name(hint(x, "batch", "seq", "embed"), "residual")

    # cross-attention to the text
    c = p["cross_attn"]
    h = layer_norm(x, p["norm3"], cfg.eps)
    q = _heads(rms_norm(checkpoint_name(linear(c["q"], h), "cross_q"), c["norm_q"], cfg.eps),
               cfg.heads)
    k = _heads(rms_norm(checkpoint_name(linear(c["k"], ctx), "cross_kv"), c["norm_k"], cfg.eps),
               cfg.heads)
    v = _heads(checkpoint_name(linear(c["v"], ctx), "cross_kv"), cfg.heads)
    o = attention(_to_bhsd(q, "seq"), _to_bhsd(k, "text"), _to_bhsd(v, "text"), name="cross_out")
    o = hint(o, "batch", "heads", "seq", "head_dim")
    x = x + linear(c["o"], _merge(o))
    x = checkpoint_name(hint(x, "batch", "seq", "embed"), "residual")

    # FFN
    f = p["ffn"]
    h = (layer_norm(x, eps=cfg.eps).astype(jnp.float32) * (1 + m[4][:, None]) + m[3][:, None]).astype(dt)
    h = checkpoint_name(linear(f["fc1"], h), "ffn_hidden")
    h = hint(gelu_tanh(h), "batch", "seq", "mlp")
    y = checkpoint_name(linear(f["fc2"], h), "proj_out")
    x = (x.astype(jnp.float32) + y.astype(jnp.float32) * m[5][:, None]).astype(dt)
    return x


def forward(params: dict, cfg: WanConfig, latents, timestep, text, pad_multiple: int = 1,
            remat=None):
    """The denoiser: latents [B, 16, F, H, W], timestep [B], text [B, text_len, text_dim]
    -> prediction [B, 16, F, H, W] (dtype of the latents). ``remat``: None, or a function
    applied to the scan body ``(x, block_params) -> (x, None)`` (e.g. a ``jax.checkpoint``)."""
    dt = latents.dtype
    latents = hint(latents, "batch", "channels", None, None, None)
    tokens, grid = patchify(latents, cfg.patch)
    n = tokens.shape[1]
    length = padded_length(n, pad_multiple)
    x = linear(params["patch_embed"], tokens)
    if length > n:
        x = jnp.pad(x, ((0, 0), (0, length - n), (0, 0)))
    x = hint(x, "batch", "seq", "embed")

    te = params["time_embed"]
    e = timestep_embedding(timestep, cfg.freq_dim)
    e = linear(te["fc2"], jax.nn.silu(linear(te["fc1"], e)))                          # [B, dim] f32
    e0 = linear(params["time_proj"], jax.nn.silu(e)).reshape(e.shape[0], 6, cfg.dim)  # [B, 6, dim]

    ctx = hint(text.astype(dt), "batch", "text", None)
    t = params["text_embed"]
    ctx = linear(t["fc2"], gelu_tanh(linear(t["fc1"], ctx)))
    ctx = hint(ctx, "batch", "text", "embed")

    cos, sin = rope_tables(grid, cfg.rope_dims, cfg.rope_theta, length)
    kv_mask = real_tokens(x.shape[0], n, length)

    def body(x, p):
        return _block(cfg, x, p, e0, ctx, cos, sin, kv_mask), None

    x, _ = jax.lax.scan(body if remat is None else remat(body), x, params["blocks"])
    x = hint(x, "batch", "seq", "embed")

    hd = params["head"]
    s = hd["modulation"].astype(jnp.float32)[None] + e[:, None]                        # [B, 2, dim]
    x = (layer_norm(x, eps=cfg.eps).astype(jnp.float32) * (1 + s[:, 1][:, None]) + s[:, 0][:, None]).astype(dt)
    x = linear(hd["out"], x)
    x = hint(x, "batch", "seq", None)
    return unpatchify(x, grid, cfg.patch, cfg.out_channels, order="pqrc").astype(dt)
