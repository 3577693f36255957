"""Q1 prices attention by the splash kernel model at each strategy's per-shard shape and the tiles
it would run with (and its layouts carry those tiles), and prices a chain of followers as one
fused pass over HBM."""

import jax
import pytest
import jax.numpy as jnp

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.attention_tiles import AttentionShape, best_tiles
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.kernel_model import kernel_chip
from aoizora.formulation.strategies import Hardware, Options, build_strategies, fused_tensors
from aoizora.solvers.sharding import solve_sharding
from aoizora.kernels.tiles import node_tiles
from aoizora.formulation.layout import AttentionLayout

sds = jax.ShapeDtypeStruct


def _attention_ir(s=4096, h=8, d=128):
    from aoizora.kernels.primitives import attention

    return build_ir(lambda q, k, v: attention(q, k, v), *[sds((1, h, s, d), jnp.bfloat16)] * 3)


def _attention_strategies(ir, tgt, mesh, hw):
    g = build_strategies(ir, default_axis_costs(tgt, mesh), hw)
    att = ir.by_kind("attention")[0].key
    return {st.name: st for st in g.groups[att].strategies}


def test_attention_priced_by_the_kernel_model_at_its_tiles(v5e4):
    ir = _attention_ir()
    c = v5e4.chip
    kernel = _attention_strategies(ir, v5e4, {"x": 4}, Hardware.from_chip(c))
    roof = _attention_strategies(ir, v5e4, {"x": 4}, Hardware(c.peak_bf16_flops,
                                                                c.hbm_bandwidth_Bps, c.hbm_bytes))
    chip = kernel_chip(c.generation, c.peak_bf16_flops, c.hbm_bandwidth_Bps, c.clock_hz)
    heads = next(st for name, st in kernel.items() if st.labels.get("h") == ("x",))
    want = best_tiles(AttentionShape(1, 8, 4096, 4096, 128), 1, 4, 1, False, chip)
    assert heads.compute == want.seconds and heads.tiles["block_q"] == want.block_q
    # the kernel model is never faster than the MXU roofline of the same shard
    assert all(st.compute >= roof[n].compute * 0.999 for n, st in kernel.items() if st.compute)
    # the chooser the planner tiles layouts with gives the same tiles
    nt = node_tiles(AttentionShape(1, 8, 4096, 4096, 128), AttentionLayout(heads=("x",)),
                    {"x": 4}, chip)
    assert (nt.block_q, nt.block_kv, nt.block_kv_compute) == tuple(heads.tiles.values())


def test_ilp_layout_carries_the_tiles_it_was_priced_with(v5e4):
    ir = _attention_ir()
    r = solve_sharding(ir, v5e4, {"x": 4})
    att = ir.by_kind("attention")[0].key
    al = r.layout.attention[att]
    assert set(al.tiles) == {"block_q", "block_kv", "block_kv_compute"}
    assert al.tiles["block_kv"] % al.tiles["block_kv_compute"] == 0


def test_without_a_kernel_chip_attention_falls_back_to_its_roofline(v5e4):
    ir = _attention_ir()
    c = v5e4.chip
    roof = _attention_strategies(ir, v5e4, {"x": 4}, Hardware(c.peak_bf16_flops,
                                                                c.hbm_bandwidth_Bps, c.hbm_bytes))
    assert all(st.tiles is None for st in roof.values())


def test_a_chain_of_followers_is_one_pass_over_hbm(v5e4):
    x = sds((4096, 4096), jnp.bfloat16)
    ir = build_ir(lambda a: jnp.tanh(jnp.exp(a) * 2.0 + 1.0), x)
    read_free, written_free = fused_tensors(ir)
    out = ir.outputs[0]
    assert out not in written_free            # the program's result is written
    assert written_free and written_free <= read_free

    def total(fusion):
        g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip),
                             Options(fusion=fusion))
        return sum(G.strategies[0].cost for G in g.groups.values())

    one_pass = 2 * 4096 * 4096 * 2 / v5e4.chip.hbm_bandwidth_Bps   # read a, write the result
    assert total(True) < total(False)
    assert abs(total(True) - one_pass) / one_pass < 0.05


def test_a_ring_is_priced_as_permutes_over_one_link(v5e4):
    """Ring attention's keys/values go to the ring neighbour: one link, one direction, even on
    an axis the all-gather's default prices over two (v5e-4 is 2x2: a logical 4 spans both)."""
    from aoizora.formulation.collective_cost import default_axis_costs as dac

    ir = _attention_ir()
    ac = dac(v5e4, {"x": 4})
    ring = next(st for st in _attention_strategies(ir, v5e4, {"x": 4},
                                                   Hardware.from_chip(v5e4.chip)).values()
                if st.kv == "ring")
    kv_bytes = 2 * 1 * 8 * 4096 * 128 * 2          # k and v, gathered, per device at the end
    one_link = ac.alpha_s["x"] + 3 / 4 * kv_bytes / v5e4.chip.link_bandwidth_Bps
    assert ring.comm == pytest.approx(one_link, rel=1e-6)
    assert ac.all_gather("x", kv_bytes) < one_link   # the all-gather's default uses 2 links
