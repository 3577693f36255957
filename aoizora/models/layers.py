"""Shared building blocks of the DiTs, plain JAX on param dicts.

Conventions: a linear layer is ``{"w": [in, out], "b": [out]}`` and computes ``x @ w + b``;
norms compute in f32 and return the input dtype; RoPE rotates interleaved pairs
(x[2i], x[2i+1]) as both Wan (complex view) and HunyuanVideo (``rotate_half`` on pairs) do.
A model's parameters are first described as a pytree of ``ParamSpec`` leaves, from which the
abstract (``jax.ShapeDtypeStruct``) and the random (small configs) pytrees are made.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """Shape and initialiser of one parameter. init: "normal" (std 1/sqrt(fan_in)), "zeros", "ones"."""

    shape: tuple[int, ...]
    init: str = "normal"
    fan_in: int | None = None


def linear_spec(d_in: int, d_out: int, layers: int | None = None) -> dict:
    pre = () if layers is None else (layers,)
    return {"w": ParamSpec(pre + (d_in, d_out), "normal", d_in), "b": ParamSpec(pre + (d_out,), "zeros")}


def norm_spec(d: int, layers: int | None = None, bias: bool = False) -> dict:
    pre = () if layers is None else (layers,)
    out = {"scale": ParamSpec(pre + (d,), "ones")}
    if bias:
        out["bias"] = ParamSpec(pre + (d,), "zeros")
    return out


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def count(specs) -> int:
    """Number of parameters (elements) in a spec pytree."""
    return int(sum(math.prod(s.shape) for s in jax.tree.leaves(specs, is_leaf=_is_spec)))


def abstract(specs, dtype=jnp.bfloat16):
    """The ShapeDtypeStruct pytree: for tracing and compiling without allocating."""
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), specs, is_leaf=_is_spec)


def init(specs, key, dtype=jnp.float32):
    """Real random arrays (for small configs): deterministic in ``key``."""
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(key, len(leaves))
    out = []
    for k, s in zip(keys, leaves):
        if s.init == "zeros":
            out.append(jnp.zeros(s.shape, dtype))
        elif s.init == "ones":
            out.append(jnp.ones(s.shape, dtype))
        else:
            fan = s.fan_in or s.shape[-1]
            out.append((jax.random.normal(k, s.shape, jnp.float32) / np.sqrt(fan)).astype(dtype))
    return jax.tree.unflatten(treedef, out)


def linear(p: dict, x):
    return jnp.einsum("...i,io->...o", x, p["w"].astype(x.dtype)) + p["b"].astype(x.dtype)


def layer_norm(x, p: dict | None = None, eps: float = 1e-6):
    """LayerNorm over the last dim; p None: no affine (elementwise_affine=False)."""
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    y = (xf - mu) * jax.lax.rsqrt(var + eps)
    if p is not None:
        y = y * p["scale"].astype(jnp.float32)
        if "bias" in p:
            y = y + p["bias"].astype(jnp.float32)
    return y.astype(x.dtype)


def rms_norm(x, p: dict, eps: float = 1e-6):
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
    return (y * p["scale"].astype(jnp.float32)).astype(x.dtype)


def gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


def modulate(x, shift, scale):
    """x [B, S, D]; shift, scale [B, D]: x * (1 + scale) + shift."""
    return x * (1 + scale[:, None, :]) + shift[:, None, :]


def timestep_embedding(t, dim: int, max_period: float = 10000.0):
    """Sinusoidal embedding of t [B] in f32: half = dim//2, freqs = max_period^(-arange(half)/half),
    cat(cos(t*freqs), sin(t*freqs)) -- Wan's sinusoidal_embedding_1d and HunyuanVideo's
    timestep_embedding agree on this form."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)


def rope_tables(grid: tuple[int, int, int], dims: tuple[int, int, int], theta: float, length: int):
    """cos, sin [length, sum(dims)//2] for a (t, h, w) token grid flattened t-major.

    Axis a uses pairs with frequencies theta^(-2i/dims[a]); positions past the grid (padding)
    get angle 0 (left unrotated, as Wan leaves its sequence-parallel padding).
    Computed with jnp so that under jit these are traced ops, not multi-MB constants.
    """
    f, h, w = grid
    n = f * h * w
    if length < n:
        raise ValueError(f"rope_tables: length {length} < grid tokens {n}")
    pos = jnp.arange(length, dtype=jnp.int32)
    coords = (pos // (h * w), (pos // w) % h, pos % w)
    angles = []
    for c, d in zip(coords, dims):
        inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
        angles.append(c.astype(jnp.float32)[:, None] * inv[None])
    ang = jnp.concatenate(angles, axis=-1)
    ang = jnp.where((pos < n)[:, None], ang, 0.0)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x, cos, sin):
    """x [B, S, H, D]; cos, sin [S, D//2]: rotate interleaved pairs, computed in f32."""
    b, s, h, d = x.shape
    xf = x.astype(jnp.float32).reshape(b, s, h, d // 2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    c, sn = cos[None, :, None, :], sin[None, :, None, :]
    y = jnp.stack([x0 * c - x1 * sn, x0 * sn + x1 * c], axis=-1)
    return y.reshape(b, s, h, d).astype(x.dtype)


def padded_length(n: int, multiple: int) -> int:
    if multiple < 1:
        raise ValueError(f"pad multiple must be >= 1, got {multiple}")
    return -(-n // multiple) * multiple


def real_tokens(batch: int, n: int, length: int, tail: int = 0):
    """The key mask of a sequence of ``n`` real tokens zero-padded to ``length`` (then ``tail``
    more real tokens, e.g. text after the video): bool [batch, length + tail], True = real.
    None when nothing is padded (length == n): the attention then takes no mask.
    Computed with jnp (iota and compare), so under jit it is traced ops, not a constant."""
    if length < n:
        raise ValueError(f"real_tokens: length {length} < real tokens {n}")
    if length == n:
        return None
    pos = jnp.arange(length + tail, dtype=jnp.int32)
    real = pos < n
    if tail:
        real = real | (pos >= length)
    return jnp.broadcast_to(real, (batch, length + tail))


def patchify(latents, patch: tuple[int, int, int]):
    """[B, C, F, H, W] -> tokens [B, f*h*w, C*pt*ph*pw] (channel-major per patch, as Conv3d flattens)."""
    b, c, F, H, W = latents.shape
    pt, ph, pw = patch
    if F % pt or H % ph or W % pw:
        raise ValueError(f"latents {latents.shape} not divisible by patch {patch}")
    f, h, w = F // pt, H // ph, W // pw
    x = latents.reshape(b, c, f, pt, h, ph, w, pw)
    x = x.transpose(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(b, f * h * w, c * pt * ph * pw), (f, h, w)


def unpatchify(x, grid, patch, channels: int, order: str = "pqrc"):
    """tokens [B, f*h*w, pt*ph*pw*C] -> [B, C, F, H, W].

    order "pqrc": each token's outputs are (pt, ph, pw, C) (Wan); "cpqr": (C, pt, ph, pw) (HunyuanVideo).
    """
    b = x.shape[0]
    f, h, w = grid
    pt, ph, pw = patch
    n = f * h * w
    x = x[:, :n]
    if order == "pqrc":
        x = x.reshape(b, f, h, w, pt, ph, pw, channels).transpose(0, 7, 1, 4, 2, 5, 3, 6)
    else:
        x = x.reshape(b, f, h, w, channels, pt, ph, pw).transpose(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(b, channels, f * pt, h * ph, w * pw)
