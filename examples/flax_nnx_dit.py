"""Plan a Flax NNX DiT, as Flax users write it (``nnx.MultiHeadAttention``, ``nnx.Linear``,
``nnx.LayerNorm``; no AoiZora markers), for a TPU v5e-8, then run the plan on 8 CPU devices and
check it computes what the unsharded module computes.

The planner takes a function of a param pytree and inputs: split the module once
(``graphdef, state = nnx.split(model)``) and plan ``fn(state, x, t, mask) =
nnx.merge(graphdef, state)(x, t, mask)`` with the ``state`` pytree as the params.

    python examples/flax_nnx_dit.py                  # plans in <= 60 s on a CPU machine
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import aoizora  # noqa: E402

SIZES = {   # tokens = frames x (height / 2) x (width / 2)
    "tiny": dict(frames=2, height=16, width=16, channels=4, dim=128, heads=4, blocks=2),
    "small": dict(frames=4, height=32, width=32, channels=16, dim=256, heads=4, blocks=2),
}
PATCH = 2


class Block(nnx.Module):
    """adaLN-modulated self-attention + MLP."""

    def __init__(self, dim: int, heads: int, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(dim, use_scale=False, use_bias=False, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim, decode=False,
                                           rngs=rngs)
        self.norm2 = nnx.LayerNorm(dim, use_scale=False, use_bias=False, rngs=rngs)
        self.fc1 = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.fc2 = nnx.Linear(4 * dim, dim, rngs=rngs)
        self.ada = nnx.Linear(dim, 6 * dim, rngs=rngs)

    def __call__(self, h, temb, mask):
        sh1, sc1, g1, sh2, sc2, g2 = jnp.split(self.ada(nnx.silu(temb)), 6, axis=-1)
        y = self.norm1(h) * (1 + sc1[:, None]) + sh1[:, None]
        h = h + g1[:, None] * self.attn(y, mask=mask)
        y = self.norm2(h) * (1 + sc2[:, None]) + sh2[:, None]
        return h + g2[:, None] * self.fc2(nnx.gelu(self.fc1(y)))


class DiT(nnx.Module):
    def __init__(self, cfg: dict, rngs: nnx.Rngs):
        d, c = cfg["dim"], cfg["channels"] * PATCH * PATCH
        self.patch = nnx.Linear(c, d, rngs=rngs)
        self.t1 = nnx.Linear(256, d, rngs=rngs)
        self.t2 = nnx.Linear(d, d, rngs=rngs)
        self.blocks = nnx.List([Block(d, cfg["heads"], rngs) for _ in range(cfg["blocks"])])
        self.norm = nnx.LayerNorm(d, use_scale=False, use_bias=False, rngs=rngs)
        self.ada_out = nnx.Linear(d, 2 * d, rngs=rngs)
        self.out = nnx.Linear(d, c, rngs=rngs)

    def __call__(self, x, t, key_mask):
        """x [B, F, Hgt, Wid, C] latents, t [B] timesteps, key_mask [B, S] (True: attend)."""
        b, f, hh, ww, c = x.shape
        gh, gw = hh // PATCH, ww // PATCH
        tok = x.reshape(b, f, gh, PATCH, gw, PATCH, c).transpose(0, 1, 2, 4, 3, 5, 6)
        h = self.patch(tok.reshape(b, f * gh * gw, PATCH * PATCH * c))
        half = 128
        freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
        a = t[:, None] * freqs[None]
        temb = self.t2(nnx.silu(self.t1(jnp.concatenate([jnp.cos(a), jnp.sin(a)], -1))))
        mask = key_mask[:, None, None, :]
        for blk in self.blocks:
            h = blk(h, temb, mask)
        shift, scale = jnp.split(self.ada_out(nnx.silu(temb)), 2, axis=-1)
        out = self.out(self.norm(h) * (1 + scale[:, None]) + shift[:, None])
        out = out.reshape(b, f, gh, gw, PATCH, PATCH, c).transpose(0, 1, 2, 4, 3, 5, 6)
        return out.reshape(b, f, hh, ww, c)


def inputs(cfg: dict, batch: int = 2, seed: int = 0):
    """(x, t, key_mask): the last quarter of the second sample's tokens are padding."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(batch, cfg["frames"], cfg["height"], cfg["width"],
                                     cfg["channels"])), jnp.float32)
    t = jnp.asarray(rng.uniform(0, 1000, size=(batch,)), jnp.float32)
    s = cfg["frames"] * (cfg["height"] // PATCH) * (cfg["width"] // PATCH)
    key_mask = np.ones((batch, s), bool)
    key_mask[-1, s - s // 4:] = False
    return x, t, jnp.asarray(key_mask)


def main(size: str = "tiny", budget_s: float = 60.0, target: str = "v5e-8") -> dict:
    cfg = SIZES[size]
    model = DiT(cfg, nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def fn(state, x, t, key_mask):
        return nnx.merge(graphdef, state)(x, t, key_mask)

    x, t, key_mask = inputs(cfg)
    plan = aoizora.plan(fn, state, x, t, key_mask, target=target, time_budget_s=budget_s,
                        meshes=[{"x": 2, "y": 4}], max_iterations=1, top_k=1)
    print(f"plan for {target}: mesh {plan.mesh}, status {plan.status}, "
          f"predicted step {plan.predicted.get('step_s', float('nan')) * 1e3:.3f} ms")
    for w in plan.layout_in_words:
        if w.startswith("attention"):
            print("  ", w)

    mesh = plan.make_mesh(jax.devices()[:8])     # 8 CPU devices in the planned order
    got = plan.jit(fn, mesh)(state, x, t, key_mask)
    want = model(x, t, key_mask)
    err = float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-30))
    print(f"applied on 8 CPU devices: max |sharded - unsharded| / max |unsharded| = {err:.2e}")
    return {"plan": plan, "error": err, "attention": dict(plan.layout.attention), "fn": fn,
            "args": (state, x, t, key_mask)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--budget", type=float, default=60.0, help="planning time budget, seconds")
    a = ap.parse_args()
    raise SystemExit(0 if main(a.size, a.budget)["error"] < 1e-3 else 1)
