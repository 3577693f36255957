"""The attention backward's own blocks: the kernel model that prices splash's dq and dk/dv
kernels (``formulation.splash_backward_model``), the evidence that reads them from a compiled
program, the chooser (``aoizora.kernels.backward_tiles``), the layout fields that carry them and the
realized kernels that run them."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from aoizora.kernels.backward_tiles import node_backward_tiles
from aoizora.extract.targets import get_target
from aoizora.formulation.kernel_model import KernelModelError, SplashShape, kernel_chip
from aoizora.formulation.layout import AttentionLayout, tile_problems
from aoizora.formulation.splash_backward_model import (dkv_seconds, dkv_vmem_bytes, dq_seconds,
                                                       dq_vmem_bytes)
from aoizora.kernels.attention_backward import sharded_attention_bwd
from aoizora.kernels.attention_kernels import sharded_attention
from aoizora.models.experts import default_mesh
from aoizora.kernels.primitives import reference_attention
from aoizora.kernels.tiles import AttentionShape

_C = get_target("v5p-8").chip       # v5p's numbers as Q2 carries them
V5P = kernel_chip("v5p", _C.peak_bf16_flops, _C.hbm_bandwidth_Bps, _C.clock_hz)
# one Wan 2.1 1.3B 480p-21f self-attention shard on v5p-8: 12 heads, 2,560 x 10,240 queries x keys
SHARD = SplashShape(12, 2560, 10240, 128)


def test_the_backward_kernels_are_never_faster_than_their_matmuls_at_peak():
    flops = SHARD.lead * SHARD.lq * SHARD.lkv * SHARD.head_dim
    for bq, bkv in ((128, 512), (512, 1024), (1280, 2048)):
        assert dq_seconds(SHARD, bq, bkv, V5P) >= 6 * flops / V5P.peak_flops
        assert dkv_seconds(SHARD, bq, bkv, 256, V5P) >= 8 * flops / V5P.peak_flops
        assert dkv_seconds(SHARD, bq, bkv, 256, V5P, fused=True) >= 10 * flops / V5P.peak_flops


def test_small_blocks_pay_the_per_step_overhead_and_big_ones_more_vmem():
    assert dkv_seconds(SHARD, 128, 512, 512, V5P) > 1.5 * dkv_seconds(SHARD, 512, 1024, 512, V5P)
    assert dq_seconds(SHARD, 128, 512, V5P) > 1.5 * dq_seconds(SHARD, 512, 1024, V5P)
    assert dkv_vmem_bytes(SHARD, 1024, 1024, 512) > dkv_vmem_bytes(SHARD, 512, 1024, 512)
    assert dkv_vmem_bytes(SHARD, 512, 1024, 512, fused=True) > dkv_vmem_bytes(SHARD, 512, 1024, 512)
    assert dq_vmem_bytes(SHARD, 512, 2048) > dq_vmem_bytes(SHARD, 512, 1024)
    with pytest.raises(KernelModelError, match="divide"):
        dkv_seconds(SHARD, 512, 1024, 384, V5P)


def test_the_chosen_blocks_divide_the_shard_fit_and_beat_hand_picked_ones():
    shape = AttentionShape(1, 12, 10240, 10240, 128)
    al = AttentionLayout(seq=("fsdp",))
    c = node_backward_tiles(shape, al, {"fsdp": 4}, V5P)
    assert c is not None and not tile_problems(**c.tiles)
    t = c.tiles
    assert 2560 % t["block_q_dkv"] == 0 and 10240 % t["block_kv_dkv"] == 0
    assert c.vmem_bytes <= V5P.scoped_vmem_bytes
    for bq, bkv, bkvc, bq2, bkv2 in ((512, 1024, 256, 512, 1024), (128, 512, 512, 128, 512)):
        other = dkv_seconds(SHARD, bq, bkv, bkvc, V5P) + dq_seconds(SHARD, bq2, bkv2, V5P)
        assert c.seconds <= other


@pytest.mark.parametrize("bad,match", [
    ({"block_q_dkv": 100}, "multiple of 128"),
    ({"block_kv_dkv": 512, "block_kv_dkv_compute": 384}, "does not divide"),
    ({"use_fused_bwd_kernel": True, "block_q_dq": 128}, "no dq blocks"),
    ({"use_fused_bwd_kernel": 1}, "true or false"),
    ({"block_q_dqq": 128}, "unknown tile")])
def test_bad_backward_blocks_are_named(bad, match):
    (msg,) = tile_problems(**bad)
    assert match in msg


def test_backward_blocks_round_trip_through_json():
    al = AttentionLayout(seq=("x",), block_q=256, block_q_dkv=512, block_kv_dkv=1024,
                         block_kv_dkv_compute=512, use_fused_bwd_kernel=True)
    assert AttentionLayout.from_json(al.to_json()) == al
    assert al.backward_tiles == {"block_q_dkv": 512, "block_kv_dkv": 1024,
                                 "block_kv_dkv_compute": 512, "use_fused_bwd_kernel": True}


@pytest.mark.parametrize("blocks", [
    dict(block_q_dkv=128, block_kv_dkv=256, block_kv_dkv_compute=128, use_fused_bwd_kernel=True),
    dict(block_q_dkv=128, block_kv_dkv=128, block_q_dq=128, block_kv_dq=256,
         use_fused_bwd_kernel=False)], ids=["fused", "unfused"])
def test_a_backward_in_its_own_blocks_matches_autodiff_of_the_reference(blocks):
    """Splash's backward kernels (interpret mode) in blocks other than the forward's, keys padded
    to 256 for them, against jax.vjp of the dense reference (shares no kernel)."""
    mesh = default_mesh(jax.devices()[:8], {"x": 2, "y": 4})
    ks = jax.random.split(jax.random.PRNGKey(5), 4)
    q, do = (jax.random.normal(kk, (2, 4, 100, 32)) for kk in ks[:2])
    k, v = (jax.random.normal(kk, (2, 4, 60, 32)) for kk in ks[2:])
    al = AttentionLayout(batch=("x",), heads=("y",), **blocks)
    _, vjp = jax.vjp(lambda a, b, c: reference_attention(a, b, c, scale=0.2), q, k, v)

    def run(q, k, v, do):
        out, lse = sharded_attention(q, k, v, layout=al, mesh=mesh, scale=0.2, impl="splash",
                                     interpret=True, residuals=True)
        return sharded_attention_bwd((q, k, v, out, lse), do, layout=al, mesh=mesh, scale=0.2,
                                     impl="splash", interpret=True)

    for g, w in zip(jax.jit(run)(q, k, v, do), vjp(do)):
        assert float(jnp.max(jnp.abs(g - w))) < 1e-4 * float(jnp.max(jnp.abs(w))) + 1e-5


@pytest.mark.tpu_compiler
@pytest.mark.parametrize("fused", [False, True])
def test_compiled_backward_kernels_are_read_and_priced_by_their_blocks(fused):
    """libtpu compiles the sharded backward for v5p-8; the evidence reads each backward kernel's
    kind, blocks and shard shapes, and Q2 prices it with the backward model (not its bytes)."""
    from aoizora.extract.aot_compile import target_mesh
    from aoizora.extract.compiled_evidence import evidence_from_compiled
    from aoizora.extract.network import Network, default_device_order
    from aoizora.formulation.op_time import op_seconds

    tgt = get_target("v5p-8")
    order = default_device_order(tgt, {"fsdp": 4})
    mesh = target_mesh(tgt, {"fsdp": 4}, list(order))
    extra = dict(block_q_dq=256, block_kv_dq=512) if not fused else {}
    al = AttentionLayout(seq=("fsdp",), block_q_dkv=256, block_kv_dkv=512,
                         block_kv_dkv_compute=256, use_fused_bwd_kernel=fused, **extra)

    def step(q, k, v, do):
        out, lse = sharded_attention(q, k, v, layout=al, mesh=mesh, scale=0.1, impl="splash",
                                     residuals=True)
        return sharded_attention_bwd((q, k, v, out, lse), do, layout=al, mesh=mesh, scale=0.1,
                                     impl="splash")

    arg = jax.ShapeDtypeStruct((1, 4, 2048, 128), jnp.bfloat16,
                               sharding=jax.sharding.NamedSharding(mesh, P()))
    compiled = jax.jit(step).lower(arg, arg, arg, arg).compile()
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh, compile_s=0.0)
    kinds = {o.kernel.get("kind"): o for o in ev.compute if o.kernel}
    assert set(kinds) == ({"fwd", "dkv"} if fused else {"fwd", "dkv", "dq"})
    dkv = kinds["dkv"].kernel
    assert (dkv["block_q"], dkv["block_kv"], dkv["block_kv_compute"], dkv["fused"]) == \
        (256, 512, 256, int(fused))
    assert (dkv["lead"], dkv["lq"], dkv["lkv"]) == (4, 512, 2048)
    net = Network.from_target(tgt)
    for kind, op in kinds.items():
        t = op_seconds(op, ev, net)
        assert t >= op.flops / net.peak_flops > 0, kind
