"""XLA:GPU ahead of time, no GPU (issue 49): the jax CUDA plugin's deviceless topology compiles
sharded programs for the GPU targets, and the evidence reader takes their HLO (collectives,
replica groups, memory, compute) as it takes XLA:TPU's. Needs the ``gpu`` extra; without it a
GPU target refuses to compile (never a silent CPU fallback)."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from aoizora.extract.aot_compile import CompileError, target_mesh
from aoizora.extract.targets import get_target

HAS_CUDA = (importlib.util.find_spec("jax_plugins") is not None
            and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None)


@pytest.mark.skipif(HAS_CUDA, reason="the gpu extra is installed")
def test_without_the_plugin_a_gpu_target_says_what_to_install():
    with pytest.raises(CompileError, match=r"pip install -e '\.\[gpu\]'"):
        target_mesh(get_target("h100-8"), {"x": 8})


def _matmul_evidence(target, axes, options=None):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from aoizora.extract.aot_compile import compile_evidence

    target = get_target(target)
    mesh = target_mesh(target, axes)
    x, y = list(axes)
    a = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P(x, y)))
    b = jax.ShapeDtypeStruct((512, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, P(y, None)))
    f = lambda a, b: jnp.sum(jnp.tanh(a @ b), axis=0)
    return compile_evidence(f, (a, b), mesh=mesh, target=target, compiler_options=options)


def test_xla_gpu_evidence_has_collectives_groups_memory_and_compute():
    pytest.importorskip("jax_plugins.xla_cuda12")
    ev = _matmul_evidence("h100-8", {"x": 2, "y": 4})
    assert ev.fidelity == "gpu" and ev.memory.fits and ev.memory.temp_bytes > 0
    assert ev.memory.hbm_bytes == 80 * 10**9
    kinds = {(c.kind, tuple(map(tuple, c.replica_groups))) for c in ev.collectives}
    # the contraction over y: an all-reduce of the [512, 2048] bf16 partial product in groups of 4
    assert ("all-reduce", ((0, 1, 2, 3), (4, 5, 6, 7))) in kinds
    big = max(ev.collectives, key=lambda c: c.bytes)
    assert big.bytes == 512 * 2048 * 2 and not big.is_async     # XLA:GPU marks it is_sync
    gemm = max(ev.compute, key=lambda o: o.flops)
    assert gemm.flops == 2 * 512 * 128 * 2048                  # per device: [512,128] x [128,2048]


def test_libtpu_options_of_a_tpu_layout_are_dropped_with_a_warning():
    pytest.importorskip("jax_plugins.xla_cuda12")
    ev = _matmul_evidence("a100-8", {"x": 2, "y": 4},
                          {"xla_tpu_enable_async_collective_fusion": True,
                           "xla_enable_async_all_reduce": True})
    w = [w for w in ev.warnings if w.startswith("TPU options not given to XLA:GPU")]
    assert w and "xla_tpu_enable_async_collective_fusion" in w[0]
    assert "xla_enable_async_all_reduce" in w[0]


def test_h100_16_is_two_hosts():
    pytest.importorskip("jax_plugins.xla_cuda12")
    from aoizora.extract.targets import get_target
    devs = get_target("h100-16").devices()
    assert len(devs) == 16 and {d.process_index for d in devs} == {0, 1}
    ev = _matmul_evidence("h100-16", {"x": 2, "y": 8})
    assert ev.fidelity == "gpu" and ev.collectives


def test_plan_a_jax_dit_for_h100_8():
    pytest.importorskip("jax_plugins.xla_cuda12")
    sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
    import plain_jax_dit as E

    out = E.main("tiny", budget_s=30.0, target="h100-8")
    plan = out["plan"]
    assert plan.target == "h100-8" and plan.fits_hbm and out["error"] < 1e-5
    assert any("XLA:GPU" in n for n in plan.notes)
    assert plan.predicted["compute_s"] > 0
