"""The splash kernel's blocks fit its mask metadata in SMEM: long full-sequence shards (heads
split, e.g. Ulysses on Wan 2.1 14B 720p-81f) compile; a SMEM overflow is a compile error, not a
layout that does not fit in HBM."""

import jax
import jax.numpy as jnp
import pytest

from aoizora.extract.aot_compile import CompileError, _scratch_detail, _scratch_space
from aoizora.formulation.layout import AttentionLayout
from aoizora.formulation.attention_tiles import SPLASH_SMEM_BUDGET, splash_metadata_bytes
from aoizora.kernels.attention_kernels import padded_lengths, sharded_attention, splash_blocks
from aoizora.kernels.primitives import reference_attention
from aoizora.extract.targets import get_target


def test_metadata_bytes_match_what_libtpu_reported():
    # 75,776 tokens per shard at block 128: 592 x 592 blocks; libtpu: "Used 1.08M of 1.00M smem"
    assert splash_metadata_bytes(75776, 75776, 128, 128) == 592 * 640 * 3
    assert splash_metadata_bytes(75776, 75776, 128, 128) / 2**20 == pytest.approx(1.084, abs=1e-3)
    # few key blocks: int8 indices
    assert splash_metadata_bytes(1024, 1024, 128, 128) == 8 * 128 * 2


@pytest.mark.parametrize("lq,lkv,want", [
    (32768, 32768, (128, 128)),      # Wan 1.3B 480p-81f, full sequence: fits at 128
    (75776, 75776, (256, 256)),      # Wan 14B 720p-81f, full sequence
    (118912, 118912, (256, 256)),    # HunyuanVideo 720p-129f, full sequence
    (14848, 118912, (128, 128)),     # the same, queries split over 8 (context parallel)
    (100, 60, (104, 128)),           # a short shard: one query block
])
def test_blocks_double_only_when_the_metadata_would_not_fit(lq, lkv, want):
    bq, bkv = splash_blocks(lq, lkv)
    assert (bq, bkv) == want
    assert splash_metadata_bytes(lq, lkv, bq, bkv) <= SPLASH_SMEM_BUDGET


def test_padding_follows_the_blocks():
    sq_p, skv_p, bq, bkv = padded_lengths(75600, 75600, 1, kv="gather", impl="splash")
    assert (bq, bkv) == (256, 256) and sq_p % 256 == 0 and skv_p % 256 == 0
    assert sq_p - 75600 < 256 and skv_p - 75600 < 256


def test_a_larger_block_computes_the_same_attention():
    """A 256 block (the layout's tiles, as a doubled block is) computes the same attention
    (interpret mode on CPU)."""
    import numpy as np
    from jax.sharding import AxisType, Mesh

    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("x", "y"),
                axis_types=(AxisType.Auto,) * 2)
    ks = jax.random.split(jax.random.PRNGKey(2), 3)
    q = jax.random.normal(ks[0], (2, 4, 300, 32))
    k, v = (jax.random.normal(kk, (2, 4, 280, 32)) for kk in ks[1:])
    al = AttentionLayout(batch=("x",), heads=("y",), block_q=256, block_kv=256)
    got = jax.jit(lambda q, k, v: sharded_attention(q, k, v, layout=al, mesh=mesh, scale=0.2,
                                                    impl="splash", interpret=True))(q, k, v)
    err = float(jnp.max(jnp.abs(got - reference_attention(q, k, v, scale=0.2))))
    assert err < 1e-5, f"splash block 256 (interpret) vs reference: max abs error {err:.3g}"


def test_scratch_memory_overflow_is_told_apart_from_hbm():
    assert _scratch_space("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
                          "memory in memory space smem. Used 1.08M of 1.00M smem.") == "SMEM"
    assert _scratch_space("RESOURCE_EXHAUSTED: Allocation (size=1933312) would exceed memory "
                          "(size=1048576) :: #allocation3 [shape = 'u8[1933312]{0}', "
                          "space=smem, size = 0x1d8000, scoped,") == "SMEM"
    assert _scratch_space("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
                          "required for HLO temporaries (15.88G) exceeds available HBM") == ""
    assert _scratch_space("INVALID_ARGUMENT: something else") == ""
    # libtpu 0.0.42.1 on a splash kernel whose tiles overflow the scoped VMEM
    assert _scratch_space("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: \nRan out of "
                          "memory in memory space vmem while allocating on stack") == "VMEM"


def test_a_vmem_overflow_error_names_the_size_and_the_limit():
    msg = ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory "
           "space vmem while allocating on stack for %splash = (f32[2736,128]) custom-call(), "
           "metadata={op_name=\"a/b\"}. Scoped allocation with size 32.50M and limit 32.00M "
           "exceeded scoped vmem limit by 508.0K. It should not be possible\nSee the docs")
    assert _scratch_detail(msg) == (" (Scoped allocation with size 32.50M and limit 32.00M "
                                    "exceeded scoped vmem limit by 508.0K. It should not be "
                                    "possible)")
    assert _scratch_detail("RESOURCE_EXHAUSTED: Ran out of memory in memory space smem.") == ""


@pytest.mark.tpu_compiler
def test_a_long_full_sequence_shard_compiles_for_v5e(monkeypatch):
    """75,776 tokens per shard, heads split over 4 chips: at block 128 libtpu runs out of SMEM
    (a CompileError that says so); with the blocks ``splash_blocks`` picks it compiles."""
    import aoizora.kernels.attention_kernels as ak
    from aoizora.extract.aot_compile import compile_evidence, target_mesh

    mesh = target_mesh(get_target("v5e-4"), {"h": 4}, platform="tpu")
    al = AttentionLayout(heads=("h",))
    q = jax.ShapeDtypeStruct((1, 8, 75776, 128), jnp.bfloat16)

    def f(q, k, v):
        return sharded_attention(q, k, v, layout=al, mesh=mesh, scale=0.1, impl="splash")

    ev = compile_evidence(f, (q, q, q), mesh=mesh, target=get_target("v5e-4"))
    assert ev.memory.fits, ev.memory.oom_message
    monkeypatch.setattr(ak, "SPLASH_SMEM_BUDGET", 1 << 30)     # never double: block 128
    with pytest.raises(CompileError, match="on-chip SMEM overflows"):    # a new trace
        compile_evidence(lambda *a: f(*a), (q, q, q), mesh=mesh, target=get_target("v5e-4"))
