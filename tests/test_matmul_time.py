"""Q1's matmul at its shard shape (formulation.matmul_time): the MXU's padding by generation,
and a split that leaves a ragged shard costs Q1 more than one that does not."""

import pytest

from aoizora.formulation.matmul_time import MXU_EFFICIENCY, padding_factor

ROLES = {"m": "lhs_free", "k": "contracting", "n": "rhs_free"}


def test_padding_to_the_mxu_width_of_each_generation():
    assert padding_factor({"m": 4096, "k": 1536, "n": 1536}, ROLES, "v5e") == 1.0
    # 1536 columns over 8 devices: 192 per device, a 128-wide MXU computes 256 of them
    assert padding_factor({"m": 4096, "k": 1536, "n": 192}, ROLES, "v5e") == pytest.approx(256 / 192)
    # v6e's MXU is 256 wide: 1536 / 8 = 192 pads to 256 there too, 1536 / 4 = 384 to 512
    assert padding_factor({"m": 4096, "k": 384, "n": 1536}, ROLES, "v6e") == pytest.approx(512 / 384)
    assert padding_factor({"m": 4096, "k": 384, "n": 1536}, ROLES, "v5e") == 1.0
    assert padding_factor({"m": 4, "k": 128, "n": 128}, ROLES, "v5e") == 2.0      # rows to 8
    assert padding_factor({"m": 4096, "k": 100, "n": 100}, ROLES, "h100") == 1.0  # no MXU model
    assert 0.9 < MXU_EFFICIENCY < 0.95


def test_the_ilp_prices_a_ragged_column_split_above_an_even_one():
    import jax
    import jax.numpy as jnp

    from aoizora.extract.frontends.jax.ir_builder import build_ir
    from aoizora.extract.targets import get_target
    from aoizora.solvers.sharding import build_problem

    def f(x, w):
        return x @ w

    # 3136 columns over 8 devices: 392 each, computed as 512 by a 128-wide MXU; split by rows
    # instead, 512 rows each and the columns padded to 3200 (both splits compute-bound)
    x = jax.ShapeDtypeStruct((4096, 1536), jnp.bfloat16)
    ir = build_ir(f, x, jax.ShapeDtypeStruct((1536, 3136), jnp.bfloat16))
    _, _, graph, _ = build_problem(ir, get_target("v5e-8"), {"x": 8})
    dot = next(g for g in graph.groups.values() if g.kind == "dot")
    cost = {s.name: s.cost for s in dot.strategies}
    assert cost["n1:x"] == pytest.approx(cost["m0:x"] * (512 / 392) / (3200 / 3136), rel=1e-6)
