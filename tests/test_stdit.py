"""The spatial-temporal DiT (Open-Sora STDiT3): sizes, workloads, its IR's spatial and temporal
attention nodes, a small model run on CPU, and its expert configurations (DSP among them): each
valid one matches the unsharded step, DSP's switch is all-to-alls, and it compiles for v5e-8."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.builtin import builtin_job
from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.models import registry
from aoizora.models.experts import EXPERTS, default_mesh, expert_layouts
from aoizora.models.stdit_experts import stdit_roles
from aoizora.runtime.realize import realize

SMALL = "opensora-stdit3-small"
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def test_xl_sizes_and_workload_tokens():
    m = registry.get_model("opensora-stdit3-xl")
    c = m.config
    assert (c.depth, c.hidden, c.heads, c.head_dim, c.mlp_dim) == (28, 1152, 16, 72, 4608)
    assert (c.in_channels, c.text_len, c.text_dim) == (4, 300, 4096)
    assert 1.15e9 < m.params < 1.25e9
    got = {w.name: (w.grid, w.tokens) for w in m.workloads}
    assert got == {"240p-51f": ((15, 15, 27), 6075), "480p-51f": ((15, 30, 54), 24300),
                   "720p-51f": ((15, 45, 80), 54000)}


def test_job_pads_frames_and_space_to_the_devices():
    job = builtin_job("opensora-stdit3-xl", "240p", 51, "v5e-16")
    assert job.pad_multiple == 16 and job.padded_tokens == 16 * 416     # 15 -> 16, 405 -> 416


def test_ir_has_spatial_temporal_and_cross_attention_per_block_pair():
    fn = registry.denoise_step(SMALL, 8)
    args = registry.abstract_inputs(SMALL, "tiny-17f")
    roles = stdit_roles(fn, args)
    assert sorted(roles.values()) == ["cross_spatial", "cross_temporal", "spatial", "temporal"]
    shapes = {tuple(w.eqn.invars[0].aval.shape) for w in walk(jax.make_jaxpr(fn)(*args).jaxpr)
              if w.eqn.primitive.name == "aoizora_attention"}
    # CFG pair B=2; 5 frames -> 8, 8x8 = 64 spatial tokens; heads 8 of 32
    assert {(16, 8, 64, 32), (128, 8, 8, 32), (2, 8, 512, 32)} == shapes


def test_small_model_runs_on_cpu_and_padding_is_dropped():
    params = registry.init_params(SMALL, jax.random.PRNGKey(0))
    inputs = registry.random_inputs(SMALL, "tiny-odd-17f", jax.random.PRNGKey(1))
    out = jax.jit(registry.denoise_step(SMALL, 8))(params, *inputs)
    assert out.shape == (1, 4, 5, 14, 14) and bool(jnp.all(jnp.isfinite(out)))
    assert float(jnp.std(out)) > 0


def test_experts_valid_and_rejected_with_reasons():
    exs = {e.name: e for e in expert_layouts("opensora-stdit3-xl", "240p-51f", "v5e-8")}
    assert list(exs) == list(EXPERTS)
    assert {n for n, e in exs.items() if e.valid} == {"dsp", "ulysses", "context", "fsdp_sp"}
    assert "CFG pair" in exs["cfg2_context"].reason and "16 heads divide" in exs["usp"].reason
    dsp = exs["dsp"].layout
    assert dsp.mesh_axes == {"sp": 8} and dsp.rules["sframes"] == ("sp",) and dsp.rules["tspace"] == ("sp",)
    wan = {e.name: e for e in expert_layouts("wan2.1-small", "tiny-9f", "v5e-8")}
    assert not wan["dsp"].valid and "one sequence" in wan["dsp"].reason


def test_every_valid_expert_matches_the_unsharded_step_and_dsp_switches_by_all_to_all():
    params = registry.init_params(SMALL, jax.random.PRNGKey(0))
    inputs = registry.random_inputs(SMALL, "tiny-17f", jax.random.PRNGKey(1))
    args = (params, *inputs)
    want = None
    for e in expert_layouts(SMALL, "tiny-17f", "v5e-8", dtype=jnp.float32):
        if not e.valid:
            continue
        if want is None:     # every valid configuration pads to 8: one program
            want = np.asarray(jax.jit(e.fn).lower(*args).compile(compiler_options=FAST)(*args))
        mesh = default_mesh(jax.devices(), e.layout.mesh_axes)
        r = realize(e.fn, e.args, e.layout, mesh)
        compiled = r.lower().compile(compiler_options=FAST)
        placed = jax.tree_util.tree_map(lambda a, s: jax.device_put(a, s.sharding), args, r.args)
        got = np.asarray(compiled(*placed))
        err = float(np.max(np.abs(got - want)))
        assert err < 1e-3 * max(1.0, float(np.max(np.abs(want)))), f"{e.name}: max abs error {err:.3g}"
        if e.name == "dsp":
            hlo = compiled.as_text()
            assert "all-to-all" in hlo, "dsp: no all-to-all in the program"


@pytest.mark.tpu_compiler
def test_dsp_compiles_for_v5e_8_with_all_to_alls_and_no_activation_all_gathers():
    dsp = next(e for e in expert_layouts(SMALL, "tiny-17f", "v5e-8") if e.name == "dsp")
    mesh = default_mesh("v5e-8", dsp.layout.mesh_axes)
    hlo = realize(dsp.fn, dsp.args, dsp.layout, mesh).compile().as_text()
    assert "tpu_custom_call" in hlo, "dsp: no splash kernel in the TPU program"
    # the blocks run in a while loop: everything outside the ENTRY computation is inside it
    # (the loop body and the computations it calls; the splash kernel is one custom call)
    entry = hlo.index("\nENTRY ")
    blocks, top = hlo[:entry], hlo[entry:]
    assert " while(" in top, "dsp: no while loop over the blocks in the program"
    # per block pair: frames split -> space split -> frames split, two all-to-alls, and no
    # all-gather inside the blocks (the only gathers are of the final layer's input, after them)
    assert len(re.findall(r" all-to-all\(", blocks)) == 2, "dsp: not 2 all-to-alls per block pair"
    assert " all-gather(" not in blocks, "dsp: an all-gather inside the blocks"
