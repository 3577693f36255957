"""The examples plan a model written as users write it (plain JAX with jax.nn.dot_product_attention
or einsum-softmax-einsum, Flax NNX; no AoiZora markers) on v5e-8 with their attention split over a
mesh axis, the splash kernel in the compiled v5e-8 program, and the plan applied on 8 CPU devices
equal to the unsharded function. A Flax linen module plans and applies the same way."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest

import aoizora
from aoizora.models.experts import default_mesh
from aoizora.runtime.realize import realize

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _splash_in_v5e8_program(fn, args, plan) -> bool:
    sds = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    mesh = default_mesh("v5e-8", plan.mesh)
    return "tpu_custom_call" in realize(fn, sds, plan.layout, mesh).compile().as_text()


def _split(attention: dict) -> bool:
    return any(a.batch or a.heads or a.seq for a in attention.values())


@pytest.mark.tpu_compiler
@pytest.mark.parametrize("form", ["dot_product_attention", "einsum"])
def test_plain_jax_dit_example(form):
    ex = _load("plain_jax_dit")
    r = ex.main("tiny", form, budget_s=60.0)
    assert r["error"] < 1e-4, f"sharded vs unsharded: relative error {r['error']:.2e}"
    plan = r["plan"]
    assert len(plan.layout.attention) == 2 and _split(plan.layout.attention), plan.layout.attention
    words = [w for w in plan.layout_in_words if w.startswith("attention")]
    assert len(words) == 2 and all("dims guessed: heads = q dim 2" in w for w in words), words
    cfg = ex.SIZES["tiny"]
    dit = ex.make_dit(cfg, form)
    args = (ex.init_params(jax.random.key(0), cfg), *ex.inputs(cfg))
    assert _splash_in_v5e8_program(dit, args, plan), "no splash kernel in the v5e-8 program"


@pytest.mark.tpu_compiler
def test_flax_nnx_dit_example():
    ex = _load("flax_nnx_dit")
    r = ex.main("tiny", budget_s=60.0)
    assert r["error"] < 1e-4, f"sharded vs unsharded: relative error {r['error']:.2e}"
    assert len(r["attention"]) == 2 and _split(r["attention"]), r["attention"]
    assert _splash_in_v5e8_program(r["fn"], r["args"], r["plan"]), "no splash kernel in the v5e-8 program"


@pytest.mark.tpu_compiler
def test_flax_linen_module_plans_and_applies_directly():
    from flax import linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = x + nn.MultiHeadDotProductAttention(num_heads=4)(nn.LayerNorm()(x))
            return x + nn.Dense(x.shape[-1])(nn.gelu(nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x))))

    model = Block()
    x = jax.random.normal(jax.random.key(1), (2, 64, 64))
    variables = model.init(jax.random.key(0), x)
    plan = aoizora.plan(model.apply, variables, x, target="v5e-8", time_budget_s=60,
                        meshes=[{"x": 2, "y": 4}], max_iterations=1, top_k=1)
    assert len(plan.layout.attention) == 1 and _split(plan.layout.attention)
    # the plan says how it read the attention it found, and what it guessed
    assert any(n.startswith("program: attention") and "guessed" in n for n in plan.notes)
    got = plan.jit(model.apply, plan.make_mesh(jax.devices()[:8]))(variables, x)
    want = model.apply(variables, x)
    assert float(jnp.max(jnp.abs(got - want))) < 1e-4
