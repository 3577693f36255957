"""Plan a DiT written in plain JAX, with no AoiZora markers, for a TPU v5e-8, then run the plan on
8 CPU devices and check it computes what the unsharded function computes.

The model is what a user would write: params in a dict, patchify -> timestep-modulated blocks
(adaLN) of self-attention and MLP -> unpatchify. Attention is ``jax.nn.dot_product_attention``
(``--attention einsum``: einsum -> softmax -> einsum with a key-padding mask); the planner finds it
in the traced program, chooses its layout, and on TPU runs it as the Pallas splash kernel.

    python examples/plain_jax_dit.py                 # plans in <= 60 s on a CPU machine
    python examples/plain_jax_dit.py --attention einsum --budget 30
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import aoizora  # noqa: E402

SIZES = {   # latent frames x height x width x channels, patch 2x2, width, heads, blocks
    "tiny": dict(frames=2, height=16, width=16, channels=4, dim=128, heads=4, blocks=2),
    "small": dict(frames=4, height=32, width=32, channels=16, dim=256, heads=4, blocks=2),
}
PATCH = 2


def init_params(key, cfg: dict) -> dict:
    """Random params (normal / sqrt(fan in)), deterministic in `key`."""
    d, c = cfg["dim"], cfg["channels"] * PATCH * PATCH
    shapes = {"patch": (c, d), "t1": (256, d), "t2": (d, d), "out": (d, c), "ada_out": (d, 2 * d)}
    for i in range(cfg["blocks"]):
        shapes |= {f"b{i}_{n}": s for n, s in (("qkv", (d, 3 * d)), ("o", (d, d)),
                                               ("w1", (d, 4 * d)), ("w2", (4 * d, d)),
                                               ("ada", (d, 6 * d)))}
    keys = jax.random.split(key, len(shapes))
    return {n: jax.random.normal(k, s, jnp.float32) / math.sqrt(s[0])
            for k, (n, s) in zip(keys, sorted(shapes.items()))}


def timestep_embedding(t, dim: int = 256):
    half = dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    a = t[:, None].astype(jnp.float32) * freqs[None]
    return jnp.concatenate([jnp.cos(a), jnp.sin(a)], axis=-1)


def layer_norm(x, eps: float = 1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)


def attention(q, k, v, key_mask, how: str):
    """q, k, v [B, S, H, Dh]; key_mask [B, S] (True: attend)."""
    if how == "dot_product_attention":
        return jax.nn.dot_product_attention(q, k, v, mask=key_mask[:, None, None, :])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = jnp.where(key_mask[:, None, None, :], s, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


def make_dit(cfg: dict, how: str = "dot_product_attention"):
    """dit(params, x, t, key_mask): x [B, F, Hgt, Wid, C] latents, t [B] timesteps."""
    d, nh = cfg["dim"], cfg["heads"]

    def dit(params, x, t, key_mask):
        b, f, hh, ww, c = x.shape
        gh, gw = hh // PATCH, ww // PATCH
        tok = x.reshape(b, f, gh, PATCH, gw, PATCH, c).transpose(0, 1, 2, 4, 3, 5, 6)
        h = tok.reshape(b, f * gh * gw, PATCH * PATCH * c) @ params["patch"]
        s = h.shape[1]
        temb = jax.nn.silu(timestep_embedding(t) @ params["t1"]) @ params["t2"]
        for i in range(cfg["blocks"]):
            p = {n[len(f"b{i}_"):]: w for n, w in params.items() if n.startswith(f"b{i}_")}
            sh1, sc1, g1, sh2, sc2, g2 = jnp.split(jax.nn.silu(temb) @ p["ada"], 6, axis=-1)
            y = layer_norm(h) * (1 + sc1[:, None]) + sh1[:, None]
            q, k, v = jnp.split(y @ p["qkv"], 3, axis=-1)
            q, k, v = (a.reshape(b, s, nh, d // nh) for a in (q, k, v))
            o = attention(q, k, v, key_mask, how).reshape(b, s, d)
            h = h + g1[:, None] * (o @ p["o"])
            y = layer_norm(h) * (1 + sc2[:, None]) + sh2[:, None]
            h = h + g2[:, None] * (jax.nn.gelu(y @ p["w1"]) @ p["w2"])
        shift, scale = jnp.split(jax.nn.silu(temb) @ params["ada_out"], 2, axis=-1)
        out = (layer_norm(h) * (1 + scale[:, None]) + shift[:, None]) @ params["out"]
        out = out.reshape(b, f, gh, gw, PATCH, PATCH, c).transpose(0, 1, 2, 4, 3, 5, 6)
        return out.reshape(b, f, hh, ww, c)

    return dit


def inputs(cfg: dict, batch: int = 2, seed: int = 0):
    """(x, t, key_mask) as arrays: the last tokens of the second sample are padding."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(batch, cfg["frames"], cfg["height"], cfg["width"],
                                     cfg["channels"])), jnp.float32)
    t = jnp.asarray(rng.uniform(0, 1000, size=(batch,)), jnp.float32)
    s = cfg["frames"] * (cfg["height"] // PATCH) * (cfg["width"] // PATCH)
    key_mask = np.ones((batch, s), bool)
    key_mask[-1, s - s // 4:] = False
    return x, t, jnp.asarray(key_mask)


def main(size: str = "tiny", attention_form: str = "dot_product_attention",
         budget_s: float = 60.0, target: str = "v5e-8") -> dict:
    cfg = SIZES[size]
    dit = make_dit(cfg, attention_form)
    params = init_params(jax.random.key(0), cfg)
    x, t, key_mask = inputs(cfg)

    plan = aoizora.plan(dit, params, x, t, key_mask, target=target, time_budget_s=budget_s,
                        meshes=[{"x": 2, "y": 4}], max_iterations=1, top_k=1)
    print(f"plan for {target}: mesh {plan.mesh}, status {plan.status}, "
          f"predicted step {plan.predicted.get('step_s', float('nan')) * 1e3:.3f} ms")
    for w in plan.layout_in_words:
        if w.startswith("attention"):
            print("  ", w)

    mesh = plan.make_mesh(jax.devices()[:8])     # 8 CPU devices in the planned order
    got = plan.jit(dit, mesh)(params, x, t, key_mask)
    want = jax.jit(dit)(params, x, t, key_mask)
    err = float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-30))
    print(f"applied on 8 CPU devices: max |sharded - unsharded| / max |unsharded| = {err:.2e}")
    return {"plan": plan, "error": err, "attention": dict(plan.layout.attention)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--attention", choices=["dot_product_attention", "einsum"],
                    default="dot_product_attention")
    ap.add_argument("--budget", type=float, default=60.0, help="planning time budget, seconds")
    a = ap.parse_args()
    r = main(a.size, a.attention, a.budget)
    raise SystemExit(0 if r["error"] < 1e-3 else 1)
