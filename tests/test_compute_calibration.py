"""The planner's calibration of non-attention compute (formulation.compute_calibration)."""

import jax.numpy as jnp
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.calibration import Calibration, CalibrationError
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.compute_calibration import compute_sample, fit_compute_scale
from aoizora.formulation.sharding_ilp import evaluate
from aoizora.formulation.strategies import Hardware, Options, StrategyError, build_strategies
from aoizora.models import registry as R


@pytest.fixture(scope="module")
def small_ir():
    m = R.get_model("wan2.1-small")
    fn = R.denoise_step(m, pad_multiple=128)
    return build_ir(fn, *R.abstract_inputs(m, m.workloads[0], dtype=jnp.float32))


def _graph(ir, scale):
    tgt = get_target("v5e-8")
    mesh = {"x": 2, "y": 4}
    return build_strategies(ir, default_axis_costs(tgt, mesh), Hardware.from_chip(tgt.chip),
                            Options(compute_scale=scale), None)


def test_the_scale_multiplies_every_compute_but_attentions(small_ir):
    g1, g2 = _graph(small_ir, 1.0), _graph(small_ir, 0.5)
    assert list(g1.groups) == list(g2.groups)
    dots = att = 0
    for gid, G in g1.groups.items():
        for s1, s2 in zip(G.strategies, g2.groups[gid].strategies):
            assert s1.name == s2.name and s1.comm == pytest.approx(s2.comm)
            if G.kind == "attention":
                assert s1.compute == pytest.approx(s2.compute)
                att += 1
            elif G.kind == "dot" and s1.cost - s1.comm > 0:
                assert s2.cost - s2.comm == pytest.approx(0.5 * (s1.cost - s1.comm))
                dots += 1
    assert dots and att
    # Q1's split: the compute of the groups other than attention halves
    choice = {gid: 0 for gid in g1.groups}
    e1, e2 = evaluate(g1, choice), evaluate(g2, choice)
    assert e1["other_compute_s"] > 0
    assert e2["other_compute_s"] == pytest.approx(0.5 * e1["other_compute_s"])
    with pytest.raises(StrategyError, match="compute_scale"):
        _graph(small_ir, 0.0)


def test_samples_pool_compiled_over_unscaled_q1():
    a = compute_sample(other_compute_s=0.10, scale_used=0.5, compiled_compute_s=0.25,
                       compiled_attention_s=0.05, candidate="a")
    assert (a.q1_s, a.compiled_s) == (pytest.approx(0.2), pytest.approx(0.2))
    b = compute_sample(0.3, 1.0, 0.2, 0.05)
    assert fit_compute_scale([a, b]) == pytest.approx((0.2 + 0.15) / (0.2 + 0.3))
    assert fit_compute_scale([]) is None
    assert compute_sample(0.1, 1.0, 0.05, 0.05) is None      # nothing left beside attention


def test_calibration_carries_the_pool_and_refuses_a_bad_one():
    c = Calibration("v5e:2x4", compute_pool=[0.09, 0.18])
    assert c.compute_scale == pytest.approx(0.5)
    back = Calibration.from_json(c.to_json())
    assert back.compute_pool == [0.09, 0.18] and back.compute_scale == pytest.approx(0.5)
    old = c.to_json()
    del old["compute_pool"]                                   # plans saved before: scale 1
    assert Calibration.from_json(old).compute_scale == 1.0
    with pytest.raises(CalibrationError, match="compute_pool"):
        Calibration.from_json({**c.to_json(), "compute_pool": [0.1, 0.0]})
