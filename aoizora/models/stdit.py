"""Open-Sora 1.2's spatial-temporal DiT, STDiT3 (hpcaitech/Open-Sora,
``opensora/models/stdit/stdit3.py``: ``STDiT3``, ``STDiT3Block``; sizes from ``STDiT3-XL/2`` and
``configs/opensora-v1-2/inference/sample.py``) in plain JAX.

Forward for one batch (C = hidden, T x S = latent frames x spatial tokens per frame):
  x   = patchify(latents, (1,2,2)) @ x_embedder.w + b + pos2d(h, w)      [B, T, S, C]  (PositionEmbedding2D)
  t   = mlp(sinusoid_256(timestep)) + mlp(sinusoid_256(fps))            [B, C]     (t_embedder + fps_embedder)
  t0  = t_block(silu(t)) -> 6 vectors                                    [B, 6, C]  (adaLN-single)
  y   = fc2(gelu_tanh(fc1(text)))                                        [B, 300, C] (y_embedder)
  per pair of blocks (``lax.scan`` over stacked params): a spatial block, then a temporal block;
  each block, m = scale_shift_table[6, C] + t0 = (shift_msa, scale_msa, gate_msa, shift_mlp,
  scale_mlp, gate_mlp):
    h = LN(x) * (1 + scale_msa) + shift_msa
    spatial:  self-attention over the S tokens of each frame  (attention batch = T*B, sequence S)
    temporal: self-attention over the T frames of each token  (attention batch = S*B, sequence T),
              rotary embedding over the frame index on q, k
      both: qkv linear, RMS norm of q and k over the head dim (qk_norm=True), output linear
    x = x + gate_msa * attn(h)
    x = x + cross_attn(x, y)       queries: all T*S tokens of a sample; keys/values: its text
    x = x + gate_mlp * mlp(LN(x) * (1 + scale_mlp) + shift_mlp)          fc1 -> gelu_tanh -> fc2 (4C)
  final: LN(x) * (1 + scale) + shift, (shift, scale) = scale_shift_table[2, C] + t; linear to
  pt*ph*pw*4; unpatchify.

Attention batch folds. The spatial attention folds (frames, batch) into its batch frame-major
([T, B] -> T*B) and the temporal attention (space, batch) space-major ([S, B] -> S*B), by a
transpose that stays on each device; the cross-attention's queries are the tokens frame-major in
spatial blocks and space-major in temporal blocks. So a split of the frames (resp. the space)
over devices is a contiguous split of the attention's batch (resp. of the cross-attention's
queries): Dynamic Sequence Parallelism's splits keep every attention local. The fold order does
not change the math (attention is per batch row; cross-attention per query).

Names (``primitives.hint``): the token grid is ("batch", "frames", "space", "embed") after the
embedding, ("batch", "sframes", "sspace", ...) inside spatial blocks and ("batch", "tframes",
"tspace", ...) inside temporal blocks, so a layout can split each stage differently; attention
q/k are ("sbatch" | "tbatch" | "batch", "heads", "space" | "frames" | "sseq" | "tseq" | "text",
"head_dim").

Padding (``pad_multiple`` = p): the f frames and the s spatial tokens of each frame are each
zero-padded to a multiple of p (T and S; so a split of either over p devices is even) and dropped
before the final layer. The self-attentions mask the padded keys, per stage: the spatial
attention's ``kv_mask`` [T*B, S] is True on the s real spatial positions (every row), the
temporal attention's [S*B, T] on the f real frames (every row). So a real token (frame < f,
position < s) attends only to real tokens, and every other op is per token (norms, linears,
modulation, cross-attention, whose queries are the padded tokens too but whose keys are the
text: a padded query's row is its own and is dropped), so on the real tokens the padded forward
computes the unpadded one (up to rounding). No row is masked whole: a padded frame's spatial
rows still see s positions, a padded position's temporal rows f frames (their values are
dropped). The shapes, and so the costs, are the padded ones; nothing padded: no mask operand.
The text mask of Open-Sora (prompts shorter than 300 tokens) is not modelled: all 300 text
tokens take part.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from aoizora.models.config import STDiTConfig
from aoizora.models.layers import (ParamSpec, apply_rope, gelu_tanh, layer_norm, linear, linear_spec,
                                   norm_spec, padded_length, patchify, real_tokens, rms_norm,
                                   timestep_embedding, unpatchify)
from aoizora.kernels.primitives import attention, hint

ROPE_THETA = 10000.0     # rotary_embedding_torch's default, as STDiT3's RotaryEmbedding(head_dim)


def param_specs(cfg: STDiTConfig) -> dict:
    """The parameter pytree (ParamSpec leaves); block params stacked with a leading depth dim."""
    c, L, hd = cfg.hidden, cfg.depth, cfg.head_dim
    patch = cfg.patch[0] * cfg.patch[1] * cfg.patch[2]

    def block():
        return {"scale_shift_table": ParamSpec((L, 6, c), "normal", c),
                "attn": {"qkv": linear_spec(c, 3 * c, L), "q_norm": norm_spec(hd, L),
                         "k_norm": norm_spec(hd, L), "o": linear_spec(c, c, L)},
                "cross_attn": {"q": linear_spec(c, c, L), "kv": linear_spec(c, 2 * c, L),
                               "o": linear_spec(c, c, L)},
                "mlp": {"fc1": linear_spec(c, cfg.mlp_dim, L), "fc2": linear_spec(cfg.mlp_dim, c, L)}}

    return {
        "x_embedder": linear_spec(cfg.in_channels * patch, c),
        "t_embedder": {"fc1": linear_spec(cfg.freq_dim, c), "fc2": linear_spec(c, c)},
        "fps_embedder": {"fc1": linear_spec(cfg.freq_dim, c), "fc2": linear_spec(c, c)},
        "t_block": linear_spec(c, 6 * c),
        "y_embedder": {"fc1": linear_spec(cfg.text_dim, c), "fc2": linear_spec(c, c)},
        "spatial_blocks": block(),
        "temporal_blocks": block(),
        "final": {"scale_shift_table": ParamSpec((2, c), "normal", c),
                  "out": linear_spec(c, patch * cfg.out_channels)},
    }


def padded_grid(grid: tuple[int, int, int], pad_multiple: int) -> tuple[int, int]:
    """(frames, spatial tokens per frame) after padding each to a multiple of ``pad_multiple``."""
    f, h, w = grid
    return padded_length(f, pad_multiple), padded_length(h * w, pad_multiple)


def pos_embed_2d(h: int, w: int, dim: int):
    """2D sin-cos position embedding [h*w, dim]: the first half encodes the row, the second the
    column, each as (sin, cos) of position x 10000^(-2i/(dim/2)) (PositionEmbedding2D)."""
    half = dim // 2
    inv = 1.0 / (10000.0 ** (jnp.arange(0, half, 2, dtype=jnp.float32) / half))
    rows = jnp.broadcast_to(jnp.arange(h, dtype=jnp.float32)[:, None], (h, w)).reshape(-1)
    cols = jnp.broadcast_to(jnp.arange(w, dtype=jnp.float32)[None, :], (h, w)).reshape(-1)

    def sincos(p):
        a = p[:, None] * inv[None]
        return jnp.concatenate([jnp.sin(a), jnp.cos(a)], axis=-1)

    return jnp.concatenate([sincos(rows), sincos(cols)], axis=-1)


def _mlp(p, x, act):
    return linear(p["fc2"], act(linear(p["fc1"], x)))


def _fold(x, temporal: bool):
    """[B, T, S, H, D] -> spatial [T*B, H, S, D] (frame-major) | temporal [S*B, H, T, D] (space-major)."""
    b, t, s, h, d = x.shape
    if temporal:
        return x.transpose(2, 0, 3, 1, 4).reshape(s * b, h, t, d)
    return x.transpose(1, 0, 3, 2, 4).reshape(t * b, h, s, d)


def _unfold(o, shape, temporal: bool):
    """Inverse of ``_fold``: -> [B, T, S, H*D]."""
    b, t, s, h, d = shape
    if temporal:
        return o.reshape(s, b, h, t, d).transpose(1, 3, 0, 2, 4).reshape(b, t, s, h * d)
    return o.reshape(t, b, h, s, d).transpose(1, 0, 3, 2, 4).reshape(b, t, s, h * d)


def _self_attn(cfg: STDiTConfig, a, h, rope, kv_mask, temporal: bool):
    """Spatial or temporal self-attention of h [B, T, S, C]; rope (cos, sin) over the frames;
    kv_mask None or bool [T*B, S] (spatial) / [S*B, T] (temporal), True = a real key."""
    cos, sin = rope
    b, t, s, c = h.shape
    shape = (b, t, s, cfg.heads, cfg.head_dim)
    q, k, v = jnp.split(linear(a["qkv"], h), 3, axis=-1)
    q = _fold(rms_norm(q.reshape(shape), a["q_norm"], cfg.eps), temporal)
    k = _fold(rms_norm(k.reshape(shape), a["k_norm"], cfg.eps), temporal)
    v = _fold(v.reshape(shape), temporal)
    if temporal:     # RoPE over the frame index: apply_rope wants [N, T, H, D]
        q = apply_rope(q.transpose(0, 2, 1, 3), cos, sin).transpose(0, 2, 1, 3)
        k = apply_rope(k.transpose(0, 2, 1, 3), cos, sin).transpose(0, 2, 1, 3)
    names = ("tbatch", "heads", "frames", "head_dim") if temporal else \
        ("sbatch", "heads", "space", "head_dim")
    o = attention(hint(q, *names), hint(k, *names), hint(v, *names), kv_mask=kv_mask)
    o = hint(o, *names)
    return linear(a["o"], _unfold(o, shape, temporal))


def _cross_attn(cfg: STDiTConfig, p, x, y, temporal: bool):
    b, t, s, c = x.shape
    nh, hd = cfg.heads, cfg.head_dim
    q = linear(p["q"], x)
    if temporal:     # space-major queries, so that a split of the space is contiguous
        q = q.transpose(0, 2, 1, 3)
    seq = "tseq" if temporal else "sseq"
    q = hint(q.reshape(b, t * s, nh, hd).transpose(0, 2, 1, 3), "batch", "heads", seq, "head_dim")
    k, v = jnp.split(linear(p["kv"], y), 2, axis=-1)
    tn = ("batch", "heads", "text", "head_dim")
    k = hint(k.reshape(b, -1, nh, hd).transpose(0, 2, 1, 3), *tn)
    v = hint(v.reshape(b, -1, nh, hd).transpose(0, 2, 1, 3), *tn)
    o = hint(attention(q, k, v), "batch", "heads", seq, "head_dim")
    o = o.transpose(0, 2, 1, 3)
    o = o.reshape(b, s, t, c).transpose(0, 2, 1, 3) if temporal else o.reshape(b, t, s, c)
    return linear(p["o"], o)


def _block(cfg: STDiTConfig, x, p, t0, y, rope, kv_mask, temporal: bool):
    """One STDiT3Block. x [B, T, S, C]; t0 [B, 6, C] f32; y [B, text, C]; rope (cos, sin);
    kv_mask: its self-attention's key mask (``_self_attn``) or None."""
    dt = x.dtype
    names = ("batch", "tframes", "tspace") if temporal else ("batch", "sframes", "sspace")
    x = hint(x, *names, "embed")
    m = p["scale_shift_table"].astype(jnp.float32)[None] + t0
    m = [m[:, i][:, None, None, :] for i in range(6)]             # each [B, 1, 1, C]
    h = (layer_norm(x, eps=cfg.eps).astype(jnp.float32) * (1 + m[1]) + m[0]).astype(dt)
    h = hint(h, *names, "embed")
    y_attn = _self_attn(cfg, p["attn"], h, rope, kv_mask, temporal)
    x = (x.astype(jnp.float32) + m[2] * y_attn.astype(jnp.float32)).astype(dt)
    x = hint(x, *names, "embed")
    x = x + _cross_attn(cfg, p["cross_attn"], x, y, temporal)
    x = hint(x, *names, "embed")
    h = (layer_norm(x, eps=cfg.eps).astype(jnp.float32) * (1 + m[4]) + m[3]).astype(dt)
    h = hint(gelu_tanh(linear(p["mlp"]["fc1"], h)), *names, "mlp")
    y_mlp = linear(p["mlp"]["fc2"], h)
    x = (x.astype(jnp.float32) + m[5] * y_mlp.astype(jnp.float32)).astype(dt)
    return hint(x, *names, "embed")


def forward(params: dict, cfg: STDiTConfig, latents, timestep, text, pad_multiple: int = 1):
    """The denoiser: latents [B, 4, F, H, W], timestep [B], text [B, text_len, text_dim]
    -> prediction [B, 4, F, H, W] (dtype of the latents)."""
    dt = latents.dtype
    latents = hint(latents, "batch", "channels", None, None, None)
    tokens, grid = patchify(latents, cfg.patch)
    f, gh, gw = grid
    b = tokens.shape[0]
    tp, sp = padded_grid(grid, pad_multiple)
    x = linear(params["x_embedder"], tokens).reshape(b, f, gh * gw, cfg.hidden)
    x = x + pos_embed_2d(gh, gw, cfg.hidden).astype(dt)[None, None]
    x = jnp.pad(x, ((0, 0), (0, tp - f), (0, sp - gh * gw), (0, 0)))
    x = hint(x, "batch", "frames", "space", "embed")

    t = _mlp(params["t_embedder"], timestep_embedding(timestep, cfg.freq_dim), jax.nn.silu)
    fps = jnp.full(timestep.shape, cfg.fps, jnp.float32)
    t = t + _mlp(params["fps_embedder"], timestep_embedding(fps, cfg.freq_dim), jax.nn.silu)
    t0 = linear(params["t_block"], jax.nn.silu(t)).reshape(b, 6, cfg.hidden)      # [B, 6, C] f32

    y = hint(text.astype(dt), "batch", "text", None)
    y = hint(_mlp(params["y_embedder"], y, gelu_tanh), "batch", "text", "embed")

    inv = 1.0 / (ROPE_THETA ** (jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim))
    ang = jnp.arange(tp, dtype=jnp.float32)[:, None] * inv[None]                   # [T, D/2]
    rope = (jnp.cos(ang), jnp.sin(ang))
    s_mask = real_tokens(tp * b, gh * gw, sp)          # spatial keys: real positions
    t_mask = real_tokens(sp * b, f, tp)                # temporal keys: real frames

    def body(x, ps):
        x = _block(cfg, x, ps[0], t0, y, rope, s_mask, temporal=False)
        return _block(cfg, x, ps[1], t0, y, rope, t_mask, temporal=True), None

    x, _ = jax.lax.scan(body, x, (params["spatial_blocks"], params["temporal_blocks"]))
    x = hint(x, "batch", "frames", "space", "embed")
    x = x[:, :f, :gh * gw].reshape(b, f * gh * gw, cfg.hidden)

    fin = params["final"]
    s = fin["scale_shift_table"].astype(jnp.float32)[None] + t[:, None]             # [B, 2, C]
    x = (layer_norm(x, eps=cfg.eps).astype(jnp.float32) * (1 + s[:, 1][:, None])
         + s[:, 0][:, None]).astype(dt)
    x = hint(linear(fin["out"], x), "batch", "seq", None)
    return unpatchify(x, grid, cfg.patch, cfg.out_channels, order="pqrc").astype(dt)
