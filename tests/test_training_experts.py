"""Expert training configurations (``models.training_experts``): verdicts with reasons, the
state's specs (weights and AdamW moments alike, ZeRO-3), the batch on the data axis, and each
valid configuration of the small model trained for real on 8 CPU devices: its loss equals the
unsharded step's."""

import jax
import numpy as np
import pytest

from aoizora.models import registry, training
from aoizora.models.experts import default_mesh
from aoizora.models.training_experts import (MAXDIFFUSION_REMAT, SOURCES, TRAINING_EXPERTS,
                                             optimizer_sharding, state_leaves,
                                             training_expert_layouts)
from aoizora.runtime.realize import realize


def _by_name(*a):
    return {e.name: e for e in training_expert_layouts(*a)}


def test_verdicts_on_v5p_with_reasons():
    ex = _by_name("wan2.1-1.3b", "480p-21f", "v5p-8", 1)
    assert list(ex) == list(TRAINING_EXPERTS)
    assert ex["maxdiffusion"].valid and ex["maxdiffusion"].layout.mesh_axes == {"fsdp": 4}
    assert ex["fsdp_ulysses"].valid and ex["fsdp_ulysses"].layout.mesh_axes == {"sp": 4}
    assert not ex["dp_fsdp"].valid and "global batch 1 does not divide" in ex["dp_fsdp"].reason
    assert ex["fsdp_tp"].layout.mesh_axes == {"fsdp": 2, "tensor": 2}
    ex16 = _by_name("wan2.1-1.3b", "480p-21f", "v5p-16", 2)
    assert ex16["dp_fsdp"].layout.mesh_axes == {"data": 2, "fsdp": 4}     # the published fsdp 4
    assert ex16["fsdp_ulysses"].layout.mesh_axes == {"dp": 2, "sp": 4}  # 12 heads, 8 chips
    assert "Ulysses 4 leaves data parallel 2" in _by_name(
        "wan2.1-1.3b", "480p-21f", "v5p-16", 1)["fsdp_ulysses"].reason
    for e in ex.values():
        assert e.source == SOURCES[e.name] and e.source
    # Wan 14B: 12 bytes of state per parameter do not fit one v5e chip's 15.75 GiB over 4 chips
    v5e = _by_name("wan2.1-14b", "480p-21f", "v5e-4", 1)
    assert not v5e["maxdiffusion"].valid and "training state" in v5e["maxdiffusion"].reason
    assert _by_name("wan2.1-14b", "480p-21f", "v5p-8", 1)["maxdiffusion"].valid
    with pytest.raises(training.TrainingError, match="Wan 2.1"):
        training_expert_layouts("hunyuanvideo-small", "tiny-9f", "v5p-8")


def test_state_specs_weights_and_moments_alike_batch_on_data():
    ex = _by_name("wan2.1-small", "tiny-9f", "v5p-16", 2)
    for e in ex.values():
        assert e.valid, e.reason
        leaves = state_leaves(e.args)
        by_param: dict = {}
        for (part, keys, _), spec in zip(leaves, e.layout.in_specs):
            if part == "param":
                by_param.setdefault(tuple(keys), set()).add(spec)
        assert all(len(s) == 1 for s in by_param.values())   # weight, mu and nu: one spec
        n_state = len(jax.tree.leaves(e.args[0]))
        assert e.layout.out_specs[-1] == () and len(e.layout.out_specs) == n_state + 1
        assert "sharded" in optimizer_sharding(e.args, e.layout)
        d = e.to_json()                                      # the Expert's fields and its own
        assert d["valid"] and d["source"] == SOURCES[e.name] and d["layout"]["mesh_axes"]
        assert d["optimizer_sharding"] == optimizer_sharding(e.args, e.layout)
    assert ex["maxdiffusion"].to_json()["pad_multiple"] == ex["maxdiffusion"].pad_multiple
    data = [s for (part, k, _), s in zip(state_leaves(ex["dp_fsdp"].args),
                                         ex["dp_fsdp"].layout.in_specs)
            if part == "data" and k[0] in ("latents", "context")]
    assert data and all(s[0] == "data" for s in data)
    assert ex["maxdiffusion"].layout.compiler_options.get("xla_tpu_scoped_vmem_limit_kib") == 65536
    assert not ex["fsdp_ulysses"].layout.compiler_options
    if "remat" in {f.name for f in __import__("dataclasses").fields(training.TrainConfig)}:
        assert training.remat_choices(ex["maxdiffusion"].remat) == training.remat_choices(
            MAXDIFFUSION_REMAT)
        assert ex["fsdp_ulysses"].remat == "full"


@pytest.mark.slow
def test_valid_experts_train_like_the_unsharded_step():
    ex = [e for e in training_expert_layouts("wan2.1-small", "tiny-9f", "v5p-16", 2) if e.valid]
    mesh_devices = jax.devices()[:8]
    for e in ex:
        params = registry.init_params("wan2.1-small", jax.random.PRNGKey(0))
        state = training.init_train_state("wan2.1-small", params, e.config)
        batch = training.random_batch("wan2.1-small", "tiny-9f", jax.random.PRNGKey(1), 2)
        _, ref = jax.jit(e.fn)(state, batch)
        mesh = default_mesh(mesh_devices, e.layout.mesh_axes)
        r = realize(e.fn, e.args, e.layout, mesh)
        _, got = r.fn(state, batch)
        np.testing.assert_allclose(float(got), float(ref), rtol=2e-3, err_msg=e.name)
