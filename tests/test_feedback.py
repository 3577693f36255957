"""What the planner's loop feeds back into the sharding ILP from compiled programs:

- attention compute: compiled attention time is read back per node (realize scopes each
  attention node), fitted per node and kv mode against Q1's compute, and scales the ILP's
  attention strategies exactly as the formulation says;
- exposed cost per logical axis and collective kind, from Q2 of the best placement."""

import jax
import jax.numpy as jnp
import pytest

from aoizora.extract.evidence import (ComputeOp, Evidence, attention_node_of, attention_scope)
from aoizora.extract.network import Network
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.attention_calibration import (AttentionSample, attention_samples,
                                                       compiled_attention_seconds,
                                                       fit_attention_scale, scales)
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.strategies import Hardware, StrategyError, build_strategies
from aoizora.kernels.primitives import attention
from aoizora.solvers.sharding import ShardingProblem, solve_sharding

SDS = jax.ShapeDtypeStruct


def _attention_ir():
    return build_ir(lambda q, k, v: attention(q, k, v), *[SDS((1, 4, 1024, 64), jnp.bfloat16)] * 3)


def test_scope_names_the_innermost_attention_node():
    name = f"jit(run)/while/body/{attention_scope('3.1.7')}/shard_map/while/body/add"
    assert attention_node_of(name) == "3.1.7"
    assert attention_node_of("jit(run)/while/body/dot_general") is None
    assert attention_node_of("") is None


def test_compiled_seconds_per_node_from_op_names():
    net = Network.from_target(get_target("v5e-8"))
    ev = Evidence(target="v5e:2x4", mesh_axes={"x": 8}, clock_hz=1e9, compute=[
        ComputeOp("a", "fusion", 2e6, count=3, op_name=f"x/{attention_scope('7')}/exp"),
        ComputeOp("b", "fusion", 1e6, count=1, op_name=f"x/{attention_scope('7')}/shard_map/add"),
        ComputeOp("c", "custom-call", None, flops=net.peak_flops * 0.004, count=2,
                  op_name=f"x/{attention_scope('9')}/splash"),
        ComputeOp("d", "fusion", 5e6, count=1, op_name="x/dot_general")])
    got = compiled_attention_seconds(ev, net)
    assert got == pytest.approx({"7": 3 * 2e-3 + 1e-3, "9": 2 * 0.004})
    att = {"7": {"kv": "ring", "compute_s": 0.002}, "9": {"kv": "gather", "compute_s": 0.0},
           "11": {"kv": "gather", "compute_s": 0.001}}       # 9: no Q1 compute; 11: not compiled
    s = attention_samples(att, ev, net, "c1")
    assert [(x.key, x.kv, x.q1_compute_s, x.candidate) for x in s] == [("7", "ring", 0.002, "c1")]
    assert s[0].compiled_s == pytest.approx(7e-3)


def test_a_rings_exposed_transfers_count_in_its_sample():
    """Q2's exposed time of each phase is shared among its collectives by bytes; what falls on
    collectives under a ring node's scope is added to that node's compiled time (ring only)."""
    from types import SimpleNamespace as NS

    from aoizora.extract.evidence import Collective
    from aoizora.formulation.attention_calibration import exposed_scope_seconds

    net = Network.from_target(get_target("v5e-8"))
    ring, gath = f"x/{attention_scope('7')}/shard_map/ppermute", f"x/{attention_scope('9')}/ag"
    ev = Evidence(target="v5e:2x4", mesh_axes={"x": 8}, clock_hz=1e9, compute=[
        ComputeOp("a", "fusion", 2e6, count=1, op_name=f"x/{attention_scope('7')}/exp"),
        ComputeOp("b", "fusion", 1e6, count=1, op_name=f"x/{attention_scope('9')}/exp")],
        collectives=[Collective("p", "collective-permute", "bf16", 300, [list(range(8))],
                                op_name=ring),
                     Collective("g", "all-gather", "bf16", 100, [list(range(8))], op_name=gath),
                     Collective("w", "all-gather", "bf16", 100, [list(range(8))],
                                op_name="x/dot_general")])
    q2 = NS(phases=[NS(collectives=["p", "g"], count=4, exposed_s=1e-3),
                    NS(collectives=["w"], count=1, exposed_s=5e-3),
                    NS(collectives=["p"], count=2, exposed_s=0.0)])
    x = exposed_scope_seconds(ev, q2)
    assert x == pytest.approx({"7": 4 * 1e-3 * 0.75, "9": 4 * 1e-3 * 0.25})
    att = {"7": {"kv": "ring", "compute_s": 0.001}, "9": {"kv": "gather", "compute_s": 0.001}}
    without = {s.key: s.compiled_s for s in attention_samples(att, ev, net)}
    with_q2 = {s.key: s.compiled_s for s in attention_samples(att, ev, net, q2=q2)}
    assert with_q2["7"] == pytest.approx(without["7"] + 3e-3)
    assert with_q2["9"] == pytest.approx(without["9"])          # gathered: its edge, not here


def test_fit_per_node_and_pooled():
    samples = [AttentionSample("self", "ring", 0.02, 0.04, "a"),
               AttentionSample("cross", "ring", 0.001, 0.02, "a"),
               AttentionSample("self", "gather", 0.02, 0.025, "b"),
               AttentionSample("self", "gather", 0.02, 0.035, "c")]
    fit = fit_attention_scale(samples)
    sc = scales(fit)
    assert sc["self"] == pytest.approx({"ring": 2.0, "gather": 1.5})
    assert sc["cross"] == pytest.approx({"ring": 20.0})            # never compiled gathered
    assert sc["*"] == pytest.approx({"ring": 0.06 / 0.021, "gather": 1.5})
    assert fit["self"]["gather"]["samples"] == 2
    assert fit["self"]["gather"]["candidates"] == ["b", "c"]
    assert fit_attention_scale([]) == {}


def test_ilp_prices_attention_with_the_scale():
    """gathered: scale x compute + comm; ring: max(scale x compute, comm); a node's own factor
    wins over "*"; no factor leaves Q1 as it was."""
    ir = _attention_ir()
    v5e4 = get_target("v5e-4")
    ac, hw = default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip)
    key = ir.by_kind("attention")[0].key
    base = build_strategies(ir, ac, hw).groups[key].strategies
    for scale_map, f in (({"*": {"gather": 3.0, "ring": 5.0}}, {"gather": 3.0, "ring": 5.0}),
                         ({"*": {"gather": 3.0, "ring": 5.0}, key: {"ring": 0.5}},
                          {"gather": 3.0, "ring": 0.5})):
        got = build_strategies(ir, ac, hw, attention_scale=scale_map).groups[key].strategies
        assert [s.name for s in got] == [s.name for s in base]
        for b, s in zip(base, got):
            assert s.compute == pytest.approx(b.compute) and b.compute > 0
            want = (max(f["ring"] * b.compute, b.comm) if b.kv == "ring"
                    else f["gather"] * b.compute + b.comm)
            assert s.cost == pytest.approx(want)
    ring = [s for s in base if s.kv == "ring"][0]
    assert ring.cost == pytest.approx(max(ring.compute, ring.comm))
    # a ring made very costly is no longer chosen; the solution reports its Q1 compute per node
    r = solve_sharding(ir, v5e4, {"x": 4}, ShardingProblem(attention_scale={"*": {"ring": 50.0}}))
    assert r.layout.attention[key].kv == "gather"
    assert r.best.attention[key]["kv"] == "gather" and r.best.attention[key]["compute_s"] > 0
    for bad in ({"*": {"ring": 0.0}}, {"*": {"fast": 2.0}}, {"*": 2.0}):
        with pytest.raises(StrategyError, match="attention_scale"):
            build_strategies(ir, ac, hw, attention_scale=bad)


@pytest.mark.tpu_compiler
def test_compiled_attention_is_found_per_node():
    """Compiled for v5e:2x4 with the real TPU compiler: every attention node of the layout has
    compiled ops under its scope, so each one gives a sample."""
    from aoizora.extract.network import default_device_order
    from aoizora.models import registry as R
    from aoizora.planner import compile_layout

    m = R.get_model("wan2.1-small")
    fn = R.denoise_step(m, pad_multiple=128)
    args = R.abstract_inputs(m, m.workloads[0], dtype=jnp.float32)
    tgt, mesh = get_target("v5e-8"), {"x": 2, "y": 4}
    sol = solve_sharding(build_ir(fn, *args), tgt, mesh).best
    ev = compile_layout(fn, args, tgt, sol.layout, default_device_order(tgt, mesh))
    samples = attention_samples(sol.attention, ev, Network.from_target(tgt))
    assert sol.attention and sorted(s.key for s in samples) == sorted(sol.attention)
    assert all(s.compiled_s > 0 and s.kv == sol.layout.attention[s.key].kv for s in samples)


# --- exposed cost per axis and collective kind ----------------------------------------

def test_axis_costs_by_kind_replace_beta_for_that_kind_only():
    from aoizora.formulation.collective_cost import AxisCosts
    ac = AxisCosts(sizes={"x": 4}, alpha_s={"x": 0.0}, beta_s_per_byte={"x": 1e-9},
                   beta_by_kind={"x": {"all-gather": 2e-10}})
    V = 4e6
    assert ac.all_gather("x", V) == pytest.approx(2e-10 * 3 / 4 * V)
    assert ac.reduce_scatter("x", V) == pytest.approx(1e-9 * 3 / 4 * V)
    assert ac.all_reduce("x", V) == pytest.approx(2e-9 * 3 / 4 * V)
    assert ac.all_to_all("x", V) == pytest.approx(1e-9 * 3 / 16 * V)
    s = ac.scaled({"x": 10.0})
    assert s.all_gather("x", V) == pytest.approx(10 * ac.all_gather("x", V))
    assert s.all_to_all("x", V) == pytest.approx(10 * ac.all_to_all("x", V))
    assert AxisCosts.from_json(s.to_json()) == s


def test_exposed_cost_per_kind_from_q2():
    """An async all-gather half hidden behind compute is charged half its link time; a
    synchronous all-reduce all of it; the floor keeps a fully hidden one at EXPOSURE_FLOOR."""
    from aoizora.extract.evidence import Collective
    from aoizora.formulation.collective_cost import default_axis_costs
    from aoizora.formulation.latency import predict_step
    from aoizora.formulation.traffic import mesh_axis_groups
    from aoizora.formulation.axis_feedback import EXPOSURE_FLOOR, effective_axis_costs

    tgt = get_target("v5e-4")
    net = Network.from_target(tgt)
    clock, MiB = 1e9, 2 ** 20
    groups = mesh_axis_groups([4], [0])

    def evidence(overlap_s):
        return Evidence(target=tgt.name, mesh_axes={"x": 4}, clock_hz=clock, collectives=[
            Collective("ag", "all-gather-start", "bf16", 24 * MiB, groups, count=3, phase=0,
                       is_async=True, overlap_cycles=overlap_s * clock),
            Collective("ar", "all-reduce", "bf16", 8 * MiB, groups, count=2, phase=1)])

    placement = [0, 1, 2, 3]
    first = predict_step(evidence(0.0), placement, net)
    t_ag, t_ar = (ph.link_s for ph in first.phases)
    costs = default_axis_costs(tgt, {"x": 4})
    for hidden, share in ((0.5 * t_ag, 0.5), (10 * t_ag, EXPOSURE_FLOOR)):
        ev = evidence(hidden)
        new, detail = effective_axis_costs(ev, placement, net, costs, predict_step(ev, placement, net))
        by = detail["x"]["by_kind"]
        assert by["all-gather"]["exposed_share"] == pytest.approx(share)
        assert by["all-reduce"]["exposed_share"] == pytest.approx(1.0)
        # charged: share x link time, for the bytes alpha-beta prices
        assert new.beta_by_kind["x"]["all-gather"] == pytest.approx(share * t_ag / (3 / 4 * 24 * MiB))
        assert new.beta_by_kind["x"]["all-reduce"] == pytest.approx(t_ar / (2 * 3 / 4 * 8 * MiB))
        assert new.all_gather("x", 24 * MiB) - new.alpha_s["x"] == pytest.approx(share * t_ag)
        # kinds not measured keep the pooled effective beta; the all-to-all, routed on its own
        # by default, its default scaled as the axis's beta was
        assert "reduce-scatter" not in new.beta_by_kind["x"]
        assert new.beta_s_per_byte["x"] == pytest.approx(detail["x"]["beta_after_s_per_B"])
        scale = detail["x"]["beta_after_s_per_B"] / costs.beta_s_per_byte["x"]
        assert new.beta_by_kind["x"]["all-to-all"] == pytest.approx(
            costs.beta_by_kind["x"]["all-to-all"] * scale)
    # without Q2 only the pooled effective bandwidth is measured
    new, detail = effective_axis_costs(evidence(0.0), placement, net, costs)
    assert "by_kind" not in detail["x"] and new.beta_by_kind == costs.beta_by_kind   # defaults


def test_meshes_not_compiled_take_the_kinds_measured_on_others():
    """R[k] = sum w r / sum w over measured axes (r = measured / default beta, w = link
    seconds); a mesh never compiled gets beta0[a] x R[k] for every axis and kind."""
    from aoizora.formulation.collective_cost import AxisCosts
    from aoizora.formulation.axis_feedback import pool_kind_ratios, transferred_axis_costs

    d1 = AxisCosts(sizes={"x": 2, "y": 4}, alpha_s={"x": 0.0, "y": 0.0},
                   beta_s_per_byte={"x": 1e-10, "y": 2e-10})
    pool: dict = {}
    pool_kind_ratios(pool, {"x": {"by_kind": {"all-to-all": {"beta_s_per_B": 4e-10, "link_s": 1.0}}},
                            "y": {"by_kind": {"all-to-all": {"beta_s_per_B": 2e-10, "link_s": 3.0},
                                              "all-gather": {"beta_s_per_B": 1e-10, "link_s": 2.0}}},
                            "z": {"effective_bandwidth_Bps": 1e9}}, d1)
    ratios = {k: sw / w for k, (sw, w) in pool.items()}
    assert ratios == pytest.approx({"all-to-all": (1.0 * 4 + 3.0 * 1) / 4.0, "all-gather": 0.5})
    d2 = AxisCosts(sizes={"a": 8}, alpha_s={"a": 1e-6}, beta_s_per_byte={"a": 3e-10})
    t = transferred_axis_costs(d2, ratios)
    V = 8e6
    assert t.all_to_all("a", V) == pytest.approx(1e-6 + 1.75 * 3e-10 * 7 / 64 * V)
    assert t.all_gather("a", V) == pytest.approx(1e-6 + 0.5 * 3e-10 * 7 / 8 * V)
    assert t.all_reduce("a", V) == pytest.approx(d2.all_reduce("a", V))     # kind not measured
    # a kind measured on under MIN_POOLED_LINK_S of link time (latency-bound) is not pooled
    from aoizora.formulation.axis_feedback import MIN_POOLED_LINK_S

    small: dict = {}
    pool_kind_ratios(small, {"x": {"by_kind": {"all-to-all": {
        "beta_s_per_B": 40e-10, "link_s": MIN_POOLED_LINK_S / 2}}}}, d1)
    assert small == {}
