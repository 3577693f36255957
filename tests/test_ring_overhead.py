"""Q1 prices a ring attention's own memory passes (combine, carry copies, log-sum-exp slice) on
top of its kernels, before any compile (``formulation.ring_overhead``)."""

import jax
import jax.numpy as jnp
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.attention_tiles import AttentionShape, best_tiles
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.kernel_model import kernel_chip
from aoizora.formulation.ring_overhead import ring_overhead_bytes, ring_overhead_seconds
from aoizora.formulation.strategies import Hardware, build_strategies

sds = jax.ShapeDtypeStruct


def test_bytes_of_the_three_passes():
    # Wan 2.1 1.3B 480p-21f, v5e-8, batch on 2 and the sequence in a ring of 4 (module docstring)
    lead, l, d, e = 12, 2560, 128, 2
    combine = 4 * lead * l * d * (4 + 2 + 4)
    carry = 3 * 2 * 2 * lead * l * d * 2
    lse = 4 * lead * l * 129 * 4
    assert ring_overhead_bytes(4, lead, l, l, d, e) == combine + carry + lse
    # the compiled combine fusion: 49.9 us by libtpu's estimate; by bytes at 819 GB/s:
    assert combine / 4 / 819e9 == pytest.approx(48e-6, rel=0.02)
    assert ring_overhead_bytes(1, lead, l, l, d, e) == 0.0
    assert ring_overhead_seconds(4, lead, l, l, d, e, 0.0) == 0.0
    with pytest.raises(ValueError, match="bandwidth"):
        ring_overhead_seconds(4, lead, l, l, d, e, -1.0)


def test_a_rings_compute_is_its_kernels_plus_its_passes():
    from aoizora.kernels.primitives import attention

    h, s, d = 8, 4096, 128
    ir = build_ir(lambda q, k, v: attention(q, k, v), *[sds((1, h, s, d), jnp.bfloat16)] * 3)
    v5e4 = get_target("v5e-4")
    c = v5e4.chip
    hw = Hardware.from_chip(c)
    key = ir.by_kind("attention")[0].key
    sts = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), hw).groups[key].strategies
    ring = next(st for st in sts if st.kv == "ring" and st.labels.get("s") == ("x",))
    chip = kernel_chip(c.generation, c.peak_bf16_flops, c.hbm_bandwidth_Bps, c.clock_hz)
    kern = best_tiles(AttentionShape(1, h, s, s, d), 1, 1, 4, True, chip)
    passes = ring_overhead_seconds(4, h, s // 4, s // 4, d, 2, hw.hbm_bandwidth_Bps)
    assert passes > 0
    assert ring.compute == pytest.approx(kern.seconds + passes)
    assert ring.tiles["block_q"] == kern.block_q
    # the gathered variant of the same split pays no ring passes
    gathered = next(st for st in sts if st.kv == "gather" and st.labels.get("s") == ("x",))
    assert gathered.compute == pytest.approx(
        best_tiles(AttentionShape(1, h, s, s, d), 1, 1, 4, False, chip).seconds)
