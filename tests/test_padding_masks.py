"""Padded tokens are masked (issue #36): the attention marker takes a key mask (forward, JVP and
backward), the IR and the strategies carry it like a found attention's mask, and the built-in
models pass it whenever they pad, so a padded program computes the unpadded one on the real
tokens -- directly on CPU, through realized layouts on 8 CPU devices (gathered keys, Ulysses,
a ring, DSP) and through a training step's gradients. Each model comparison also runs with the
mask taken away, to show that the comparison can fail."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.formulation.strategies import Hardware, build_strategies
from aoizora.models import hunyuan, registry, stdit, training, wan
from aoizora.models.experts import attention_roles, default_mesh, expert_layouts
from aoizora.kernels.primitives import ATTENTION, ATTENTION_BWD, attention
from aoizora.runtime.realize import realize

FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
WAN, HY, STD = "wan2.1-small", "hunyuanvideo-small", "opensora-stdit3-small"
# (model, workload, pad multiple): 147 video tokens -> 256 / 150 (Wan), 147 + 32 text -> 224 / 150
# video (HunyuanVideo), 5 frames x 49 positions -> 8 x 56 / 5 x 50 / 7 x 49 (STDiT3: both,
# space only, frames only)
CASES = [(WAN, "tiny-odd-9f", 128), (WAN, "tiny-odd-9f", 10), (HY, "tiny-odd-9f", 128),
         (HY, "tiny-odd-9f", 7), (STD, "tiny-odd-17f", 8), (STD, "tiny-odd-17f", 5),
         (STD, "tiny-odd-17f", 7)]
MODULES = {WAN: wan, HY: hunyuan, STD: stdit}


def _plain_masked_attention(q, k, v, mask, scale):
    """The reference, written apart from the marker: each row attends to its real keys only."""
    out = []
    for b in range(q.shape[0]):
        idx = np.flatnonzero(np.asarray(mask[b]))
        s = jnp.einsum("hqd,hkd->hqk", q[b], k[b][:, idx]) * scale
        out.append(jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v[b][:, idx]))
    return jnp.stack(out)


def _run(r, args):
    """Run a Realized program on ``args`` placed in its input shardings (cheap CPU compile)."""
    placed = jax.tree_util.tree_map(lambda a, s: jax.device_put(a, s.sharding), args, r.args)
    return r.lower().compile(compiler_options=FAST)(*placed)


def _qkv_mask(b=2, h=2, s=16, t=16, d=8, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (b, h, s, d))
    k, v = (jax.random.normal(x, (b, h, t, d)) for x in ks[1:3])
    mask = jax.random.bernoulli(ks[3], 0.6, (b, t)).at[:, 0].set(True)   # every row a real key
    return q, k, v, mask


def test_masked_marker_forward_jvp_and_grad_match_a_plain_masked_reference():
    q, k, v, mask = _qkv_mask()
    scale = 8 ** -0.5
    w = jax.random.normal(jax.random.PRNGKey(5), q.shape)

    def loss(att):
        return lambda a, b, c: jnp.sum(jnp.sin(att(a, b, c)) * w)

    ours = lambda a, b, c: attention(a, b, c, kv_mask=mask)
    ref = lambda a, b, c: _plain_masked_attention(a, b, c, mask, scale)
    np.testing.assert_allclose(ours(q, k, v), ref(q, k, v), rtol=1e-5, atol=1e-6)
    g_ours = jax.grad(loss(ours), argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_ours, g_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    masked = np.broadcast_to(~np.asarray(mask)[:, None, :], k.shape[:3])
    assert masked.any()
    assert np.all(np.asarray(g_ours[1])[masked] == 0)       # no gradient reaches a masked key
    assert np.all(np.asarray(g_ours[2])[masked] == 0)
    jvp = jax.jvp(loss(ours), (q, k, v), (w, k, v))[1]
    np.testing.assert_allclose(jvp, jax.jvp(loss(ref), (q, k, v), (w, k, v))[1], rtol=1e-4)
    # one backward op, reading the mask: q, k, v, out, lse, do, mask
    eqns = jax.make_jaxpr(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v).eqns
    bwd = [e for e in eqns if e.primitive.name == ATTENTION_BWD]
    assert len(bwd) == 1 and len(bwd[0].invars) == 7 and bwd[0].invars[6].aval.dtype == bool
    # without the mask the marker computes something else: the comparison can fail
    assert float(jnp.max(jnp.abs(attention(q, k, v) - ref(q, k, v)))) > 1e-2
    with pytest.raises(ValueError, match="key mask"):
        attention(q, k, v, kv_mask=mask[:, :-1])


def test_masked_marker_realized_on_8_cpu_devices_forward_ring_and_backward():
    q, k, v, mask = _qkv_mask(s=32, t=32)
    scale = 8 ** -0.5
    ref = _plain_masked_attention(q, k, v, mask, scale)
    mesh = default_mesh(jax.devices(), {"data": 2, "seq": 4})
    fwd = lambda a, b, c, m: attention(a, b, c, kv_mask=m)
    for kv in ("gather", "ring"):
        lay = Layout(mesh_axes={"data": 2, "seq": 4}, in_specs=[None] * 4,
                     attention={"*": AttentionLayout(batch=("data",), seq=("seq",), kv=kv)})
        got = _run(realize(fwd, (q, k, v, mask), lay, mesh), (q, k, v, mask))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=kv)
    grad = jax.grad(lambda a, b, c, m: jnp.sum(jnp.sin(attention(a, b, c, kv_mask=m))),
                    argnums=(0, 1, 2))
    want = jax.grad(lambda a, b, c: jnp.sum(jnp.sin(_plain_masked_attention(a, b, c, mask, scale))),
                    argnums=(0, 1, 2))(q, k, v)
    lay = Layout(mesh_axes={"data": 2, "seq": 4}, in_specs=[None] * 4,
                 attention={"*": AttentionLayout(batch=("data",), seq=("seq",))})
    got = _run(realize(grad, (q, k, v, mask), lay, mesh), (q, k, v, mask))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _forward(model, workload, pad):
    params = registry.init_params(model, jax.random.PRNGKey(0))
    latents, timestep, text, _, _ = registry.random_inputs(model, workload, jax.random.PRNGKey(1))
    fn = jax.jit(lambda p, x, t, c: registry.forward(model, p, x, t, c, pad))
    return np.asarray(fn(params, latents, timestep, text))


@pytest.mark.parametrize("model,workload,pad", CASES)
def test_padded_forward_equals_the_unpadded_forward(model, workload, pad, monkeypatch):
    want = _forward(model, workload, 1)
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(_forward(model, workload, pad) - want)))
    assert err < 1e-4 * scale, f"{model} pad {pad}: max abs error {err:.3g} (scale {scale:.3g})"
    # the same without the mask: the padded keys take part and the outputs differ
    monkeypatch.setattr(MODULES[model], "real_tokens", lambda *a, **k: None)
    off = float(np.max(np.abs(_forward(model, workload, pad) - want)))
    assert off > max(100 * err, 1e-3 * scale), \
        f"{model} pad {pad}: unmasked padding changed only {off:.3g} (masked: {err:.3g})"
    print(f"{model} pad {pad}: max abs error {err:.3g} masked, {off:.3g} unmasked, "
          f"scale {scale:.3g}")


def _attention_eqns(fn, args):
    return [w.eqn for w in walk(jax.make_jaxpr(fn)(*args).jaxpr) if w.eqn.primitive.name == ATTENTION]


def test_models_pass_a_mask_exactly_when_they_pad():
    """Wan: self-attention only (the text keys are not padded); HunyuanVideo: the joint video +
    text attentions, True on the text; STDiT3: the stage whose sequence is padded."""
    args = registry.abstract_inputs(WAN, "tiny-odd-9f")
    assert all(len(e.invars) == 3 for e in _attention_eqns(registry.denoise_step(WAN, 1), args))
    eq = _attention_eqns(registry.denoise_step(WAN, 128), args)
    assert [len(e.invars) for e in eq] == [4, 3]
    assert eq[0].invars[3].aval.shape == (2, 256) and eq[0].invars[3].aval.dtype == bool
    args = registry.abstract_inputs(HY, "tiny-odd-9f")
    eq = _attention_eqns(registry.denoise_step(HY, 128), args)
    assert [len(e.invars) for e in eq] == [3, 4, 4]                # refiner, double, single
    assert {e.invars[3].aval.shape for e in eq[1:]} == {(2, 256)}
    args = registry.abstract_inputs(STD, "tiny-odd-17f")
    for pad, want in ((1, [3, 3, 3, 3]), (8, [4, 3, 4, 3]), (5, [4, 3, 3, 3]), (7, [3, 3, 4, 3])):
        eq = _attention_eqns(registry.denoise_step(STD, pad), args)
        assert [len(e.invars) for e in eq] == want, pad             # spatial, cross, temporal, cross
    from aoizora.models.layers import real_tokens
    m = np.asarray(real_tokens(2, 3, 5, tail=2))
    assert m.tolist() == [[True, True, True, False, False, True, True]] * 2
    assert real_tokens(2, 5, 5) is None


def test_ir_and_strategies_carry_the_mask_like_the_keys():
    fn = registry.denoise_step(WAN, 128)
    args = registry.abstract_inputs(WAN, "tiny-odd-9f")
    ir = build_ir(fn, *args)
    self_att = [n for n in ir.by_kind("attention") if n.params["mask"]]
    assert len(self_att) == 1 and len(ir.by_kind("attention")) == 2
    n = self_att[0]
    t = ir.tensors[n.operands[3]]
    assert n.operand_labels[3] == ["b", "t"] and t.shape == [2, 256] and t.dtype == "bool"
    target = get_target("v5e-8")
    graph = build_strategies(ir, default_axis_costs(target, {"x": 2, "y": 4}),
                             Hardware.from_chip(target.chip))
    kinds = set()
    for s in graph.groups[n.key].strategies:
        want_b, want_t = s.labels.get("b", ()), s.labels.get("s", ()) if s.kv == "ring" else ()
        assert s.req[(n.key, 3)] == (want_b, want_t), (s.name, s.req[(n.key, 3)])
        kinds.add(s.kv)
    assert kinds == {"gather", "ring"}


def test_training_ir_backward_reads_the_mask_split_like_the_keys():
    cfg = training.TrainConfig(pad_multiple=128)
    step = training.train_step(WAN, cfg)
    with pytest.warns(UserWarning, match="replicated-only"):          # the PRNG's key ops
        ir = build_ir(step, *training.abstract_train_inputs(WAN, "tiny-odd-9f", 2, cfg))
    bwd = [n for n in ir.by_kind("attention_bwd") if n.params["mask"]]
    assert len(bwd) == 1 and bwd[0].operand_labels[6] == ["b", "t"]   # after q, k, v, out, lse, do
    target = get_target("v5p-8")
    graph = build_strategies(ir, default_axis_costs(target, {"x": 2, "y": 2}),
                             Hardware.from_chip(target.chip))
    for s in graph.groups[bwd[0].key].strategies:
        assert s.req[(bwd[0].key, 6)] == (s.labels.get("b", ()), ())


def test_padded_training_gradients_equal_the_unpadded_gradients():
    cfg = training.TrainConfig(compute_dtype=jnp.float32)
    params = registry.init_params(WAN, jax.random.PRNGKey(0))
    batch = training.random_batch(WAN, "tiny-odd-9f", jax.random.PRNGKey(1), 2)
    lat, ctx = batch["latents"].astype(jnp.float32), batch["context"].astype(jnp.float32)
    u = jnp.array([0.3, 0.7])
    eps = jax.random.normal(jax.random.PRNGKey(2), lat.shape)
    grads = {p: jax.jit(jax.grad(training.flow_matching_loss(WAN, dataclasses.replace(
        cfg, pad_multiple=p))))(params, lat, ctx, u, eps) for p in (1, 128)}
    rel = jax.tree.map(lambda a, b: float(jnp.linalg.norm(a - b) / (jnp.linalg.norm(b) + 1e-30)),
                       grads[128], grads[1])
    assert max(jax.tree.leaves(rel)) < 1e-3, rel


def _realized(e, args):
    mesh = default_mesh(jax.devices(), e.layout.mesh_axes)
    return np.asarray(_run(realize(e.fn, e.args, e.layout, mesh), args))


@pytest.mark.parametrize("model,workload,names", [
    (WAN, "tiny-odd-9f", ("context", "ulysses", "context+ring")),
    (HY, "tiny-odd-9f", ("context",)), (STD, "tiny-odd-17f", ("dsp",))])
def test_realized_padded_experts_equal_the_unpadded_step(model, workload, names):
    """The experts pad to 128 x the sequence degree (Wan, HunyuanVideo: 147 -> 1024 on 8) or to
    8 (STDiT3: 5 x 49 -> 8 x 56); realized on 8 CPU devices they match the unpadded step.
    "context+ring": the context layout with the self-attention's keys in a ring."""
    params = registry.init_params(model, jax.random.PRNGKey(0))
    inputs = registry.random_inputs(model, workload, jax.random.PRNGKey(1))
    args = (params, *inputs)
    want = np.asarray(jax.jit(registry.denoise_step(model, 1))(*args))
    exs = {e.name: e for e in expert_layouts(model, workload, "v5e-8", dtype=jnp.float32)}
    for name in names:
        e = exs[name.split("+")[0]]
        assert e.valid and e.pad_multiple > 1, name
        if name.endswith("+ring"):
            roles = attention_roles(e.fn, e.args)
            att = {k: (dataclasses.replace(a, kv="ring") if roles[k] == "self" else a)
                   for k, a in e.layout.attention.items()}
            e = dataclasses.replace(e, layout=dataclasses.replace(e.layout, attention=att))
        err = float(np.max(np.abs(_realized(e, args) - want)))
        assert err < 1e-3 * max(1.0, float(np.max(np.abs(want)))), f"{name}: {err:.3g}"
