"""Switch points: the output of a join (a residual add) gets a group of its own, so the sharding
ILP may change a residual stream's spec between blocks for one reshard
(``formulation.strategies``); the layout realizes it with two constraints on the join's output
(``Layout.reshard_from``), and the realized program matches the unsharded one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.layout import Layout
from aoizora.formulation.strategies import Options
from aoizora.models import registry
from aoizora.models.experts import default_mesh
from aoizora.runtime.realize import RealizeError, realize
from aoizora.solvers.sharding import ShardingProblem, solve_sharding

SMALL = "opensora-stdit3-small"
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _solve(ir, switch: bool):
    opts = Options(switch_points=switch, switch_min_bytes=0)
    return solve_sharding(ir, get_target("v5e-8"), {"x": 8},
                          ShardingProblem(options=opts), time_limit_s=60, seed=0).best


@pytest.fixture(scope="module")
def stdit():
    fn = registry.denoise_step(SMALL, 8)
    params = registry.init_params(SMALL, jax.random.PRNGKey(0))
    inputs = registry.random_inputs(SMALL, "tiny-17f", jax.random.PRNGKey(1))
    args = (params, *inputs)
    return fn, args, build_ir(fn, *args)


def test_the_ilp_switches_the_stream_between_spatial_and_temporal_blocks(stdit):
    """STDiT3 alternates attention over the space (frames split) and over the frames (space
    split): with switch points the ILP changes the stream's spec between them, below the Q1 of
    one spec for the whole stream, each switch one reshard at its join."""
    fn, args, ir = stdit
    without, with_ = _solve(ir, False), _solve(ir, True)
    assert with_.certificate.status == without.certificate.status == "OPTIMAL"
    assert with_.certificate.objective < without.certificate.objective * (1 - 1e-3)
    assert not without.layout.reshard_from
    sw = with_.layout.reshard_from
    assert sw and all(with_.layout.node_specs[k] != v for k, v in sw.items())
    assert sum(w.startswith("reshard ") for w in with_.words) == len(sw)


def test_a_switched_layout_realizes_and_matches_the_unsharded_step(stdit):
    fn, args, ir = stdit
    layout = _solve(ir, True).layout
    want = np.asarray(jax.jit(fn).lower(*args).compile(compiler_options=FAST)(*args))
    r = realize(fn, args, layout, default_mesh(jax.devices()[:8], layout.mesh_axes),
                attention_impl="reference")
    compiled = r.lower().compile(compiler_options=FAST)
    placed = jax.tree_util.tree_map(lambda a, s: jax.device_put(a, s.sharding), args, r.args)
    got = np.asarray(compiled(*placed))
    assert float(np.max(np.abs(got - want))) < 1e-3 * max(1.0, float(np.max(np.abs(want))))
    assert "all-to-all" in compiled.as_text()


def test_reshard_from_round_trips_and_needs_a_spec_to_reshard_to(stdit):
    fn, args, ir = stdit
    layout = _solve(ir, True).layout
    assert Layout.from_json(layout.to_json()) == layout
    key = next(iter(layout.reshard_from))
    bad = Layout.from_json({**layout.to_json(), "node_specs": {
        k: v for k, v in layout.to_json()["node_specs"].items() if k != key}})
    with pytest.raises(RealizeError, match="reshard_from"):
        realize(fn, args, bad, default_mesh(jax.devices()[:8], bad.mesh_axes))
