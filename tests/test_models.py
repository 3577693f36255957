"""Built-in models: sizes, token counts, a real denoising step on the small configs, the markers
the planner relies on, and cheap tracing of the full-size models (abstract inputs, no allocation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.models import layers
from aoizora.kernels.primitives import ATTENTION, HINT
from aoizora.models.registry import (FULL_SIZE, MODELS, UnknownModelError, abstract_inputs,
                                     denoise_step, forward, get_model, init_params, models_table,
                                     random_inputs)
from aoizora.models.workloads import pad_to

SMALL = ("wan2.1-small", "hunyuanvideo-small")


@pytest.mark.parametrize("name", FULL_SIZE)
def test_parameter_count_within_10_percent_of_nominal(name):
    m = get_model(name)
    assert abs(m.params - m.nominal_params) / m.nominal_params < 0.10, (name, m.params)


def test_wan_1_3b_counts_about_1_4b():
    assert 1.40e9 < get_model("wan2.1-1.3b").params < 1.44e9


@pytest.mark.parametrize("name,tokens", [
    ("wan2.1-1.3b", {"480p-81f": 32760, "480p-41f": 17160, "480p-21f": 9360}),
    ("wan2.1-14b", {"480p-81f": 32760, "720p-81f": 75600, "720p-41f": 39600, "720p-21f": 21600}),
    ("hunyuanvideo-13b", {"544p-129f": 67320, "720p-129f": 118800}),
])
def test_token_counts_match_the_facts(name, tokens):
    m = get_model(name)
    for wl, n in tokens.items():
        assert m.workload(wl).tokens == n


def test_pad_to_and_unknown_names():
    assert pad_to(32760, 1024) == 32768 and pad_to(32768, 1024) == 32768 and pad_to(75600, 8) == 75600
    with pytest.raises(UnknownModelError):
        get_model("wan9")
    with pytest.raises(ValueError):
        get_model("wan2.1-1.3b").workload("1080p-81f")


def test_models_table_lists_params_and_tokens():
    rows = {r["name"]: r for r in models_table()}
    assert set(rows) == set(FULL_SIZE)
    assert {r["name"] for r in models_table(include_small=True)} == set(MODELS)
    assert rows["wan2.1-14b"]["params"] == get_model("wan2.1-14b").params
    assert {w["name"]: w["tokens"] for w in rows["hunyuanvideo-13b"]["workloads"]}["720p-129f"] == 118800


def test_patchify_unpatchify_round_trip_both_orders():
    x = jax.random.normal(jax.random.key(0), (2, 3, 4, 6, 8))
    tok, grid = layers.patchify(x, (1, 2, 2))
    assert tok.shape == (2, 4 * 3 * 4, 12) and grid == (4, 3, 4)
    # Conv3d flattening is channel-major per patch: token t holds x[:, c, f, 2i+p, 2j+q] at c*4+p*2+q
    np.testing.assert_array_equal(tok[1, 5, 7], x[1, 1, 0, 2 * 1 + 1, 2 * 1 + 1])
    back = layers.unpatchify(tok, grid, (1, 2, 2), 3, order="cpqr")
    np.testing.assert_array_equal(back, x)
    tok_pqrc = tok.reshape(2, 48, 3, 4).transpose(0, 1, 3, 2).reshape(2, 48, 12)
    np.testing.assert_array_equal(layers.unpatchify(tok_pqrc, grid, (1, 2, 2), 3, order="pqrc"), x)


def test_rope_is_relative_and_leaves_padding_alone():
    grid, dims = (3, 4, 5), (12, 10, 10)
    cos, sin = layers.rope_tables(grid, dims, 10000.0, 64)
    q = jax.random.normal(jax.random.key(1), (1, 1, 1, 32))
    rot = lambda i: layers.apply_rope(jnp.broadcast_to(q, (1, 64, 1, 32)), cos, sin)[0, i, 0]
    # position (t,h,w) = index t*20 + h*5 + w; a shift by the same offset gives the same dot product
    d1 = jnp.dot(rot(0 * 20 + 1 * 5 + 2), rot(1 * 20 + 2 * 5 + 3))
    d2 = jnp.dot(rot(1 * 20 + 0 * 5 + 0), rot(2 * 20 + 1 * 5 + 1))
    np.testing.assert_allclose(d1, d2, rtol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(rot(37)), jnp.linalg.norm(q), rtol=1e-5)
    np.testing.assert_allclose(rot(60), q[0, 0, 0], rtol=1e-6)  # padded position: unrotated


@pytest.fixture(scope="module")
def small_runs():
    out = {}
    for name in SMALL:
        m = get_model(name)
        params = init_params(m, jax.random.key(0))
        args = random_inputs(m, m.workloads[0], jax.random.key(1))
        out[name] = (m, params, args)
    return out


@pytest.mark.parametrize("name", SMALL)
def test_small_denoise_step_runs_finite_with_cfg(name, small_runs):
    m, params, (lat, t, text, uncond, g) = small_runs[name]
    step = jax.jit(denoise_step(m))
    out = step(params, lat, t, text, uncond, g)
    assert out.shape == lat.shape and out.dtype == lat.dtype
    assert bool(jnp.all(jnp.isfinite(out)))
    # the guided output combines the two branches as the sampler does
    cond = forward(m, params, lat, t, text)
    unc = forward(m, params, lat, t, uncond)
    np.testing.assert_allclose(out, unc + 5.0 * (cond - unc), atol=2e-4, rtol=2e-4)
    assert float(jnp.max(jnp.abs(cond - unc))) > 1e-3  # the text really conditions the output
    # guidance 1 is the conditional prediction
    np.testing.assert_allclose(step(params, lat, t, text, uncond, 1.0), cond, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", SMALL)
def test_small_padded_step_has_padded_attention_and_same_output_shape(name, small_runs):
    m, params, args = small_runs[name]
    step = denoise_step(m, pad_multiple=128)  # 192 video tokens -> padded
    jx = jax.make_jaxpr(step)(params, *args)
    lens = {e.eqn.invars[0].aval.shape[2] for e in _walk(jx) if e.eqn.primitive.name == ATTENTION}
    text = m.config.text_len
    assert all(L % 128 == 0 or L == text for L in lens) and max(lens) >= 256
    out = jax.jit(step)(params, *args)
    assert out.shape == args[0].shape and bool(jnp.all(jnp.isfinite(out)))
    # an odd token count (147) pads to a multiple of 8 for an 8-way sequence split
    odd = m.workload("tiny-odd-9f")
    assert odd.tokens == 147
    lat, t, text_, unc, g = random_inputs(m, odd, jax.random.key(2))
    out = jax.jit(denoise_step(m, pad_multiple=8))(params, lat, t, text_, unc, g)
    assert out.shape == lat.shape and bool(jnp.all(jnp.isfinite(out)))


def _walk(jx):
    from aoizora.extract.frontends.jax.jaxpr_walk import walk
    return list(walk(jx.jaxpr))


@pytest.mark.parametrize("name", SMALL)
def test_markers_inside_the_scanned_blocks(name, small_runs):
    m, params, args = small_runs[name]
    eqns = _walk(jax.make_jaxpr(denoise_step(m))(params, *args))
    in_scan = [e for e in eqns if e.scope]
    att = [e for e in in_scan if e.eqn.primitive.name == ATTENTION]
    hints = [e for e in in_scan if e.eqn.primitive.name == HINT]
    assert att and hints
    names = {e.eqn.params["names"] for e in hints}
    assert ("batch", "seq", "embed") in names
    assert ("batch", "heads", "seq", "head_dim") in names
    assert ("batch", "seq", "mlp") in names
    assert ("batch", "heads", "text", "head_dim") in names or m.family == "hunyuan"
    assert any(e.eqn.params["names"] == ("batch", "text", "embed") for e in eqns
               if e.eqn.primitive.name == HINT)
    # attention runs once per block: CFG batch of 2 folded into the batch dim
    assert all(e.eqn.invars[0].aval.shape[0] == 2 for e in att)
    blocks = (m.config.layers * 2 if m.family == "wan"
              else m.config.refiner_blocks + m.config.double_blocks + m.config.single_blocks)
    assert sum(e.repeat for e in att) == blocks


@pytest.mark.parametrize("name,wl", [("wan2.1-1.3b", "480p-81f"), ("wan2.1-14b", "720p-81f"),
                                     ("hunyuanvideo-13b", "720p-129f")])
def test_full_size_models_trace_with_abstract_inputs(name, wl):
    m = get_model(name)
    args = abstract_inputs(m, wl)
    assert args[0]["patch_embed" if m.family == "wan" else "img_in"]["w"].dtype == jnp.bfloat16
    jx = jax.make_jaxpr(denoise_step(m, pad_multiple=1024))(*args)
    assert jx.out_avals[0].shape == args[1].shape
    att = [e for e in _walk(jx) if e.eqn.primitive.name == ATTENTION]
    seqs = {e.eqn.invars[0].aval.shape[2] for e in att}
    n = m.workload(wl).tokens
    assert max(seqs) == pad_to(n + (0 if m.family == "wan" else m.config.text_len), 1024)
    assert all(e.eqn.invars[0].aval.shape[3] == 128 for e in att)
