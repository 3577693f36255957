"""The remat knob of the built-in training step (``TrainConfig.remat``): every policy gives the
same loss and gradients on CPU; "full" recomputes the block's forward in the backward (its jaxpr
has the forward ops twice), "none" does not; bad settings fail in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.models import registry, training
from aoizora.kernels.primitives import FORWARD_ATTENTIONS
from aoizora.models.wan import ACTIVATION_NAMES

MODEL, WORKLOAD, BATCH = "wan2.1-small", "tiny-9f", 2
POLICIES = ("none", "full", "dots",
            {"qkv": "keep", "attn_out": "keep", "ffn_hidden": "offload", "residual": "keep"})


@pytest.fixture(scope="module")
def inputs():
    params = registry.init_params(MODEL, jax.random.PRNGKey(0))
    batch = training.random_batch(MODEL, WORKLOAD, jax.random.PRNGKey(1), BATCH)
    u = jnp.array([0.3, 0.8], jnp.float32)
    eps = jax.random.normal(jax.random.PRNGKey(2), batch["latents"].shape, jnp.float32)
    return params, batch["latents"], batch["context"], u, eps


def _value_and_grad(remat):
    return jax.value_and_grad(training.flow_matching_loss(MODEL, training.TrainConfig(remat=remat)))


def test_every_policy_gives_the_same_loss_and_gradients(inputs):
    ref_loss, ref_grads = jax.jit(_value_and_grad("none"))(*inputs)
    for remat in POLICIES[1:]:
        loss, grads = jax.jit(_value_and_grad(remat))(*inputs)
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-4)
        errs = [float(jnp.linalg.norm(a - b)) / (float(jnp.linalg.norm(b)) + 1e-30)
                for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))]
        assert max(errs) < 5e-2 and float(np.median(errs)) < 1e-2, (remat, errs)   # bf16


def _attention_ops(remat, inputs) -> int:
    jaxpr = jax.make_jaxpr(_value_and_grad(remat))(*inputs).jaxpr
    return sum(w.eqn.primitive.name in FORWARD_ATTENTIONS for w in walk(jaxpr))


def _has_checkpoint(remat, inputs) -> bool:
    loss = training.flow_matching_loss(MODEL, training.TrainConfig(remat=remat))
    return "remat2[" in str(jax.make_jaxpr(loss)(*inputs))     # jax.checkpoint's eqn


def test_full_remat_recomputes_the_forward_and_none_does_not(inputs):
    assert _attention_ops("none", inputs) == 2       # self + cross attention, the scan body once
    assert _attention_ops("full", inputs) == 4       # ... and again in the backward scan
    # self-attention's residuals (out, lse) kept: only cross-attention runs again
    assert _attention_ops({"attn_out": "keep"}, inputs) == 3
    assert not _has_checkpoint("none", inputs)
    assert _has_checkpoint("full", inputs) and _has_checkpoint("dots", inputs)


def test_policy_names_and_one_line_errors():
    cfg = training.TrainConfig(remat={"qkv": "keep", "ffn_hidden": "offload"})
    assert cfg.remat == (("ffn_hidden", "offload"), ("qkv", "keep")) and hash(cfg)
    choices = training.remat_choices(cfg.remat)
    assert set(choices) == set(ACTIVATION_NAMES) and choices["attn_out"] == "recompute"
    assert set(training.remat_choices("none").values()) == {"keep"}
    assert set(training.remat_choices("full").values()) == {"recompute"}
    for bad, msg in [("some", "give one of"), ({"qkvv": "keep"}, "unknown activation"),
                     ({"qkv": "save"}, "give one of"), (3, "give one of")]:
        with pytest.raises(training.TrainingError, match=msg) as e:
            training.TrainConfig(remat=bad)
        assert "\n" not in str(e.value)


def test_ir_reads_checkpoint_names_as_tags_not_ops():
    """``checkpoint_name`` is an identity: no node (no replicated-only warning), a tag on the
    tensor; both in the inference step and in the training step's forward, where an attention's
    log-sum-exp carries its output's name."""
    import warnings

    from aoizora.extract.frontends.jax.ir_builder import build_ir

    cfg = training.TrainConfig()
    st, b = training.abstract_train_inputs(MODEL, WORKLOAD, BATCH, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ir = build_ir(training.train_step(MODEL, cfg), st, b)
        inf = build_ir(registry.denoise_step(MODEL), *registry.abstract_inputs(MODEL, WORKLOAD))
    # the attentions' residuals (out, lse) exist only when differentiated: tagged in training
    residuals = {"attn_out", "cross_out"}
    for r, names in ((ir, set(ACTIVATION_NAMES)), (inf, set(ACTIVATION_NAMES) - residuals)):
        assert not [n for n in r.nodes if n.primitive == "name"]
        assert {t.checkpoint for t in r.tensors.values()} - {None} == names
    fwd = [n for n in ir.nodes if n.primitive == "aoizora_attention_fwd"]
    assert len(fwd) == 2 and all(len(n.results) == 2 for n in fwd)
    assert {ir.tensors[n.results[1]].checkpoint for n in fwd} == residuals   # lse tagged too
