"""HunyuanVideo DiT (Tencent/HunyuanVideo, ``hyvideo/modules/models.py``, HYVideoDiffusionTransformer)
in plain JAX.

Forward for one batch (h = hidden, T = text tokens):
  img  = patchify(latents, (1,2,2)) @ img_in.w + b                          [B, L, h]  (Conv3d, stride = kernel)
  vec  = time_in(sinusoid(t)) + vector_in(clip_pooled) + guidance_in(sinusoid(1000 g_emb))   [B, h]
  txt  = txt_in(text, t): SingleTokenRefiner -- input_embedder, then 2 refiner blocks
         (LN -> qkv -> per-head LayerNorm q/k -> self-attention over the text -> proj, gated; LN -> SiLU MLP,
         gated), gates from silu(t_embedder(t) + c_embedder(mean of text)).             [B, T, h]
  20 dual-stream blocks (``lax.scan``): separate weights for img and txt (modulation 6h from vec,
     LN -> qkv -> RMS q/k norm, RoPE on the img q/k), ONE attention over concat(img, txt),
     then per stream: x += gate1 * proj(attn); x += gate2 * mlp(LN(x) * (1 + scale2) + shift2).
  40 single-stream blocks (``lax.scan``) on x = concat(img, txt): modulation 3h from vec;
     linear1(LN(x)*(1+scale)+shift) -> qkv | mlp; RMS q/k norm; RoPE on the img part;
     x += gate * linear2(concat(attention, gelu_tanh(mlp)))   (attention and MLP in parallel).
  final: LN(img) * (1 + scale) + shift (from vec) -> linear to 16*pt*ph*pw -> unpatchify.

RoPE: head_dim 128 split [16, 56, 56] over (t, h, w), theta 256, interleaved pairs.
Every attention goes through ``primitives.attention``; activations carry ``primitives.hint`` names
("seq" is the joint video+text sequence inside attention and the single blocks, "text" the text
stream). Padding (``pad_multiple``): the n video tokens are zero-padded to L so that the joint
sequence (video + T text tokens) is a multiple of ``pad_multiple``; for a multiple 128*n' with
n' | T this keeps the video part divisible by n' as well. The joint attentions (dual- and
single-stream) mask the padded video keys: ``kv_mask`` [B, L + T] is True on the n real video
tokens and on the T text tokens, False on positions n..L-1 (the padding sits between the video
and the text). Every other op is per token, so on the real tokens the padded forward computes
the unpadded one (up to rounding); padded video rows are dropped before unpatchify. The text
attention mask of the original (for prompts shorter than T) is not modelled: all T text tokens
take part -- the shapes, and so the costs, are the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aoizora.models.config import HunyuanConfig
from aoizora.models.layers import (apply_rope, gelu_tanh, layer_norm, linear, linear_spec,
                                   norm_spec, padded_length, patchify, real_tokens, rms_norm,
                                   rope_tables, timestep_embedding, unpatchify)
from aoizora.kernels.primitives import attention, hint


def _mlp_spec(d_in, d_hidden, d_out, layers=None):
    return {"fc1": linear_spec(d_in, d_hidden, layers), "fc2": linear_spec(d_hidden, d_out, layers)}


def param_specs(cfg: HunyuanConfig) -> dict:
    """The parameter pytree (ParamSpec leaves); block params stacked with a leading layer dim."""
    h, hd, m = cfg.hidden, cfg.head_dim, cfg.mlp_dim
    patch = cfg.patch[0] * cfg.patch[1] * cfg.patch[2]
    R, D, S = cfg.refiner_blocks, cfg.double_blocks, cfg.single_blocks

    def stream(L):
        return {"mod": linear_spec(h, 6 * h, L), "qkv": linear_spec(h, 3 * h, L),
                "q_norm": norm_spec(hd, L), "k_norm": norm_spec(hd, L), "proj": linear_spec(h, h, L),
                "mlp": _mlp_spec(h, m, h, L)}

    specs = {
        "img_in": linear_spec(cfg.in_channels * patch, h),
        "txt_in": {
            "input_embedder": linear_spec(cfg.text_dim, h),
            "t_embedder": _mlp_spec(cfg.freq_dim, h, h),
            "c_embedder": _mlp_spec(cfg.text_dim, h, h),
            "blocks": {"norm1": norm_spec(h, R, bias=True), "qkv": linear_spec(h, 3 * h, R),
                       "q_norm": norm_spec(hd, R, bias=True), "k_norm": norm_spec(hd, R, bias=True),
                       "proj": linear_spec(h, h, R), "norm2": norm_spec(h, R, bias=True),
                       "mlp": _mlp_spec(h, int(h * cfg.mlp_ratio), h, R),
                       "ada": linear_spec(h, 2 * h, R)},
        },
        "time_in": _mlp_spec(cfg.freq_dim, h, h),
        "vector_in": _mlp_spec(cfg.clip_dim, h, h),
        "double_blocks": {"img": stream(D), "txt": stream(D)},
        "single_blocks": {"linear1": linear_spec(h, 3 * h + m, S), "linear2": linear_spec(h + m, h, S),
                          "q_norm": norm_spec(hd, S), "k_norm": norm_spec(hd, S),
                          "mod": linear_spec(h, 3 * h, S)},
        "final": {"ada": linear_spec(h, 2 * h), "out": linear_spec(h, patch * cfg.out_channels)},
    }
    if cfg.guidance_embed:
        specs["guidance_in"] = _mlp_spec(cfg.freq_dim, h, h)
    return specs


def _embed(p, x, act=jax.nn.silu):
    return linear(p["fc2"], act(linear(p["fc1"], x)))


def _qkv(x, p_lin, heads):
    """[B, S, h] -> three [B, S, H, hd]."""
    b, s, _ = x.shape
    qkv = linear(p_lin, x).reshape(b, s, 3, heads, -1)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def _attend(q, k, v, seq_name: str, kv_mask=None):
    """q, k, v [B, S, H, hd] -> [B, S, H*hd] through the attention primitive, hinted; kv_mask
    None or bool [B, S] (True = a real key)."""
    t = lambda x: hint(x.transpose(0, 2, 1, 3), "batch", "heads", seq_name, "head_dim")
    o = hint(attention(t(q), t(k), t(v), kv_mask=kv_mask), "batch", "heads", seq_name, "head_dim")
    b, hh, s, d = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, s, hh * d)


def _chunks(v, n):
    """[B, n*h] -> n vectors [B, h]."""
    return jnp.split(v, n, axis=-1)


def _refiner(cfg: HunyuanConfig, params, text, timestep):
    """SingleTokenRefiner: text [B, T, text_dim] -> [B, T, h]."""
    dt = text.dtype
    c = _embed(params["t_embedder"], timestep_embedding(timestep, cfg.freq_dim)) \
        + _embed(params["c_embedder"], jnp.mean(text.astype(jnp.float32), axis=1))   # [B, h] f32
    x = hint(linear(params["input_embedder"], text), "batch", "text", "embed")
    ca = jax.nn.silu(c)

    def body(x, p):
        x = hint(x, "batch", "text", "embed")
        gate_msa, gate_mlp = _chunks(linear(p["ada"], ca), 2)
        q, k, v = _qkv(layer_norm(x, p["norm1"], cfg.eps), p["qkv"], cfg.heads)
        q, k = layer_norm(q, p["q_norm"], cfg.eps), layer_norm(k, p["k_norm"], cfg.eps)
        o = linear(p["proj"], _attend(q, k, v, "text"))
        x = (x + o * gate_msa[:, None].astype(dt))
        y = hint(jax.nn.silu(linear(p["mlp"]["fc1"], layer_norm(x, p["norm2"], cfg.eps))),
                 "batch", "text", "mlp")
        x = x + linear(p["mlp"]["fc2"], y) * gate_mlp[:, None].astype(dt)
        return x, None

    x, _ = jax.lax.scan(body, x, params["blocks"])
    return x


def _double(cfg: HunyuanConfig, img, txt, p, vec_a, cos, sin, kv_mask=None):
    dt = img.dtype
    img = hint(img, "batch", "seq", "embed")
    txt = hint(txt, "batch", "text", "embed")
    pi, pt = p["img"], p["txt"]
    mi = [c[:, None].astype(dt) for c in _chunks(linear(pi["mod"], vec_a), 6)]
    mt = [c[:, None].astype(dt) for c in _chunks(linear(pt["mod"], vec_a), 6)]

    def qkv(x, ps, mod):
        x = layer_norm(x, eps=cfg.eps) * (1 + mod[1]) + mod[0]
        q, k, v = _qkv(x, ps["qkv"], cfg.heads)
        return rms_norm(q, ps["q_norm"], cfg.eps), rms_norm(k, ps["k_norm"], cfg.eps), v

    qi, ki, vi = qkv(img, pi, mi)
    qi, ki = apply_rope(qi, cos, sin), apply_rope(ki, cos, sin)
    qt, kt, vt = qkv(txt, pt, mt)
    o = _attend(jnp.concatenate([qi, qt], 1), jnp.concatenate([ki, kt], 1),
                jnp.concatenate([vi, vt], 1), "seq", kv_mask)
    n = img.shape[1]

    def finish(x, o, ps, mod, seq_name):
        x = x + linear(ps["proj"], o) * mod[2]
        x = hint(x, "batch", seq_name, "embed")
        y = hint(gelu_tanh(linear(ps["mlp"]["fc1"], layer_norm(x, eps=cfg.eps) * (1 + mod[4]) + mod[3])),
                 "batch", seq_name, "mlp")
        return x + linear(ps["mlp"]["fc2"], y) * mod[5]

    return finish(img, o[:, :n], pi, mi, "seq"), finish(txt, o[:, n:], pt, mt, "text")


def _single(cfg: HunyuanConfig, x, p, vec_a, cos, sin, n_img: int, kv_mask=None):
    dt = x.dtype
    h = cfg.hidden
    x = hint(x, "batch", "seq", "embed")
    shift, scale, gate = [c[:, None].astype(dt) for c in _chunks(linear(p["mod"], vec_a), 3)]
    y = linear(p["linear1"], layer_norm(x, eps=cfg.eps) * (1 + scale) + shift)
    b, s, _ = y.shape
    qkv, mlp = y[..., :3 * h].reshape(b, s, 3, cfg.heads, -1), y[..., 3 * h:]
    q = rms_norm(qkv[:, :, 0], p["q_norm"], cfg.eps)
    k = rms_norm(qkv[:, :, 1], p["k_norm"], cfg.eps)
    v = qkv[:, :, 2]
    q = jnp.concatenate([apply_rope(q[:, :n_img], cos, sin), q[:, n_img:]], 1)
    k = jnp.concatenate([apply_rope(k[:, :n_img], cos, sin), k[:, n_img:]], 1)
    o = _attend(q, k, v, "seq", kv_mask)
    mlp = hint(gelu_tanh(hint(mlp, "batch", "seq", "mlp")), "batch", "seq", "mlp")
    out = linear(p["linear2"], jnp.concatenate([o, mlp], axis=-1))
    return x + out * gate


def forward(params: dict, cfg: HunyuanConfig, latents, timestep, text, pooled, pad_multiple: int = 1):
    """The denoiser: latents [B, 16, F, H, W], timestep [B], text [B, T, text_dim], pooled
    [B, clip_dim] -> prediction [B, 16, F, H, W] (dtype of the latents)."""
    dt = latents.dtype
    latents = hint(latents, "batch", "channels", None, None, None)
    tokens, grid = patchify(latents, cfg.patch)
    n = tokens.shape[1]
    T = cfg.text_len
    length = padded_length(n + T, pad_multiple) - T          # padded video tokens
    img = linear(params["img_in"], tokens)
    if length > n:
        img = jnp.pad(img, ((0, 0), (0, length - n), (0, 0)))
    img = hint(img, "batch", "seq", "embed")

    b = latents.shape[0]
    vec = _embed(params["time_in"], timestep_embedding(timestep, cfg.freq_dim)) \
        + _embed(params["vector_in"], pooled.astype(jnp.float32))
    if cfg.guidance_embed:
        g = jnp.full((b,), cfg.embedded_guidance * 1000.0, jnp.float32)
        vec = vec + _embed(params["guidance_in"], timestep_embedding(g, cfg.freq_dim))
    vec_a = jax.nn.silu(vec)                                    # [B, h] f32, the modulation input

    text = hint(text.astype(dt), "batch", "text", None)
    txt = hint(_refiner(cfg, params["txt_in"], text, timestep), "batch", "text", "embed")

    cos, sin = rope_tables(grid, cfg.rope_dims, cfg.rope_theta, length)
    kv_mask = real_tokens(b, n, length, tail=T)        # joint video + text keys

    def dbody(carry, p):
        return _double(cfg, *carry, p, vec_a, cos, sin, kv_mask), None

    (img, txt), _ = jax.lax.scan(dbody, (img, txt), params["double_blocks"])

    x = jnp.concatenate([img, txt], axis=1)

    def sbody(x, p):
        return _single(cfg, x, p, vec_a, cos, sin, length, kv_mask), None

    x, _ = jax.lax.scan(sbody, x, params["single_blocks"])
    img = hint(x[:, :length], "batch", "seq", "embed")

    shift, scale = [c[:, None].astype(dt) for c in _chunks(linear(params["final"]["ada"], vec_a), 2)]
    img = linear(params["final"]["out"], layer_norm(img, eps=cfg.eps) * (1 + scale) + shift)
    img = hint(img, "batch", "seq", None)
    return unpatchify(img, grid, cfg.patch, cfg.out_channels, order="cpqr").astype(dt)
