"""Remat as a decision of the sharding ILP (formulation/remat.py) on wan2.1-small's training
step: under a large HBM budget the ILP keeps every residual (the program as traced); under a
small one it recomputes, and its peak memory row drops below what any layout of the traced
program needs; the plan's remat, applied by plan.jit (the step retraced with that policy) on 8
CPU devices, gives the unsharded loss."""

import warnings

import jax
import numpy as np
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.remat import (CHOICES, layer_groups, parse_remat_key, remat_key,
                                       remat_problem)
from aoizora.formulation.sharding_ilp import build_model
from aoizora.models import registry, training
from aoizora.models.wan import ACTIVATION_NAMES
from aoizora.models.workloads import Workload
from aoizora.plans import Plan, program_key
from aoizora.runtime.rematerialize import retraceable
from aoizora.solvers.mip_run import run_solver
from aoizora.solvers.sharding import ShardingProblem, build_problem, solve_sharding

# a hand-written layout, never priced: the numerics tests check values, not latencies
UNPRICED = {"step_s": 0.0, "compute_s": 0.0, "communication_s": 0.0, "kind": "unpriced"}

MODEL = "wan2.1-small"
WORKLOAD = Workload("t-256p-17f", "256p", 256, 256, 17)   # 1280 tokens: activations dominate
MESH = {"x": 4}     # v5p-8's 4 chips on one axis: HiGHS proves each budget in seconds (2x2: minutes)


def _ir(workload, batch=2):
    cfg = training.TrainConfig()
    step = training.train_step(MODEL, cfg)
    args = training.abstract_train_inputs(MODEL, workload, batch, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return step, args, build_ir(step, *args)


@pytest.fixture(scope="module")
def program():
    return _ir(WORKLOAD)


def test_layer_group_and_activations_come_from_the_ir(program):
    step, _, ir = program
    assert retraceable(step)
    (G,) = layer_groups(ir)
    assert G.trip == registry.get_model(MODEL).config.layers
    assert set(G.activations) == set(ACTIVATION_NAMES)
    assert len(G.activations["qkv"]) == 3 and G.segments["attn_out"]
    # the attention is recomputed with attn_out, not with qkv (the projections' dots)
    kinds = {a: {ir.node(k).kind for k in ks} for a, ks in G.segments.items()}
    assert "attention" in kinds["attn_out"] and "dot" in kinds["qkv"]
    assert parse_remat_key(remat_key({"qkv": "keep"})) == {"qkv": "keep"}


def _min_peak(ir, graph, hw, remat):
    m = build_model(ir, graph, float("inf"), objective="memory", small_bytes=20e3,
                    remat=remat_problem(ir, hw))
    m.remat.fix(remat)
    r = run_solver(m.prob, "highs", 60, 0, 1)
    assert r["status"] == "OPTIMAL"
    return r["objective"] * 1e6


def test_small_budget_trades_layout_against_remat(program):
    _, _, ir = program
    target = get_target("v5p-8")
    hw, _, graph, _ = build_problem(ir, target, MESH, ShardingProblem(remat="decide"))
    traced_min = _min_peak(ir, graph, hw, None)            # any layout, every residual kept
    keep_min = _min_peak(ir, graph, hw, {a: "keep" for a in ACTIVATION_NAMES})

    def solve(budget):
        return solve_sharding(ir, target, MESH, ShardingProblem(
            remat="decide", hbm_bytes=budget, graph=graph), time_limit_s=120).best
    # a guard, not a speed claim: HiGHS stops at optimality, well inside it on a quiet machine

    big = solve(1e9)                                       # 1 GB: everything fits
    assert big.layout.remat is None and big.predicted["recompute_s"] == 0
    small = solve(0.8 * traced_min)                        # no traced layout fits
    assert small.layout.remat is not None and small.predicted["recompute_s"] > 0
    assert small.peak_bytes <= 0.8 * traced_min < big.peak_bytes
    tight = solve(0.95 * keep_min)                         # not even every name kept
    assert tight.layout.remat is not None
    assert any(c in ("recompute", "offload") for c in tight.layout.remat.values())
    assert set(tight.layout.remat.values()) <= set(CHOICES)
    assert tight.peak_bytes <= 0.95 * keep_min < small.peak_bytes
    print("remat chosen:", small.layout.remat, tight.layout.remat,
          [round(x / 1e6, 2) for x in (big.peak_bytes, small.peak_bytes, tight.peak_bytes)])


@pytest.mark.slow     # about 90 s on 2 cores: `python -m pytest -m slow`
def test_realized_step_with_the_chosen_remat_matches_the_unsharded_step():
    """8 CPU devices, v5p-16's 2x4 mesh: the ILP's layout and remat under a budget no traced
    layout meets, applied by plan.jit (retraced with that remat), state donated."""
    from aoizora.runtime.rematerialize import apply_remat

    step, (st_abs, b_abs), ir = _ir(WORKLOAD)
    target, mesh_axes = get_target("v5p-16"), {"x": 2, "y": 4}
    hw, _, graph, _ = build_problem(ir, target, mesh_axes, ShardingProblem(remat="decide"))
    budget = 0.8 * _min_peak(ir, graph, hw, None)
    sol = solve_sharding(ir, target, mesh_axes, ShardingProblem(
        remat="decide", hbm_bytes=budget, graph=graph), time_limit_s=45).best
    assert sol.layout.remat is not None and sol.peak_bytes <= budget
    applied = apply_remat(step, (st_abs, b_abs), sol.layout)
    assert applied.fn.remat == training.normalize_remat(sol.layout.remat)
    assert len(applied.dropped) <= 0.1 * len(sol.layout.node_specs)   # keys found again

    cfg = training.TrainConfig()
    params = registry.init_params(MODEL, jax.random.PRNGKey(0))
    batch = training.random_batch(MODEL, WORKLOAD, jax.random.PRNGKey(1), 2)
    ref_state, ref_loss = jax.jit(step)(training.init_train_state(MODEL, params, cfg), batch)
    plan = Plan(key=program_key(step, (st_abs, b_abs), target.name), target=target.name,
                layout=sol.layout, device_order=list(range(8)),
                device_coords=[(i % 2, i // 2 % 2, i // 4) for i in range(8)], predicted=UNPRICED, certificates={})
    fn = plan.jit(step, plan.make_mesh(jax.devices()[:8]), donate_argnums=(0,))
    got_state, got_loss = fn(training.init_train_state(MODEL, params, cfg), batch)
    np.testing.assert_allclose(float(got_loss), float(ref_loss), rtol=2e-3)
    mu_got, mu_ref = got_state["opt_state"][0].mu, ref_state["opt_state"][0].mu
    errs = [float(np.linalg.norm(np.asarray(a - b)) / (np.linalg.norm(np.asarray(b)) + 1e-30))
            for a, b in zip(jax.tree.leaves(mu_got), jax.tree.leaves(mu_ref))]
    assert float(np.median(errs)) < 2e-2 and max(errs) < 0.1, errs
    print("remat applied:", sol.layout.remat, "peak MB", round(sol.peak_bytes / 1e6, 2),
          "of", round(budget / 1e6, 2), "dropped keys", applied.dropped,
          [ir.node(k).primitive for k in applied.dropped])


def test_a_layout_and_remat_that_did_not_fit_is_cut_together(program):
    """The loop's feedback: the compiler said (layout, remat) did not fit -> the pair is a
    forbidden combination (its remat part under REMAT_KEY) and the ILP solved again answers
    something else; the same layout under another remat stays allowed."""
    from aoizora.formulation.remat import REMAT_KEY

    _, _, ir = program
    target = get_target("v5p-8")
    _, _, graph, _ = build_problem(ir, target, MESH, ShardingProblem(remat="decide"))

    def solve(forbidden=None):
        return solve_sharding(ir, target, MESH, ShardingProblem(
            remat="decide", hbm_bytes=1e9, graph=graph, forbidden=forbidden),
            time_limit_s=45).best

    first = solve()
    cut = {**first.choice, REMAT_KEY: remat_key(first.layout.remat)}
    again = solve([cut])
    assert (again.choice, again.layout.remat) != (first.choice, first.layout.remat)
    # the cut holds the remat binaries: fixing the layout, another remat is still feasible
    hw = build_problem(ir, target, MESH)[0]
    m = build_model(ir, graph, 1e9, forbidden=[cut], remat=remat_problem(ir, hw))
    m.remat.fix({a: "keep" for a in ACTIVATION_NAMES})
    for gid, name in first.choice.items():
        k = [st.name for st in graph.groups[gid].strategies].index(name)
        for j, v in enumerate(m.s[gid]):
            if not isinstance(v, int):
                v.lowBound = v.upBound = 1 if j == k else 0
    assert run_solver(m.prob, "highs", 60, 0, 1)["status"] in ("OPTIMAL", "FEASIBLE")


def test_plan_file_carries_the_remat_and_checks_it(tmp_path):
    import json

    from aoizora.formulation.layout import Layout
    from aoizora.plans import load_plan
    from aoizora.plan_schema import PlanError

    step, args, _ = _ir("tiny-9f")
    target = get_target("v5p-8")
    n = len(jax.tree.leaves(args))
    plan = Plan(key=program_key(step, args, target.name), target=target.name,
                layout=Layout(mesh_axes={"x": 2, "y": 2}, in_specs=[None] * n,
                              remat={"qkv": "keep", "ffn_hidden": "offload"}),
                device_order=list(range(4)), device_coords=[(i % 2, i // 2, 0) for i in range(4)],
                predicted={"step_s": 1e-3, "compute_s": 1e-3, "communication_s": 0.0},
                certificates={})
    path = str(tmp_path / "plan.json")
    plan.save(path)
    assert load_plan(path).layout.remat == {"qkv": "keep", "ffn_hidden": "offload"}
    d = json.load(open(path))
    d["layout"]["remat"]["qkv"] = "save"
    json.dump(d, open(path, "w"))
    with pytest.raises(PlanError, match="layout.remat") as e:
        load_plan(path)
    assert "\n" not in str(e.value)


@pytest.mark.tpu_compiler
@pytest.mark.slow     # about 90 s on 2 cores
def test_the_compiler_sees_the_remat_the_ilp_chose(program):
    """The verdict: libtpu's memory analysis of the step compiled for v5p-8 under the ILP's
    large-budget choice (as traced) and under its small-budget remat: the remat's program needs
    less HBM (the compile is what the planner's feedback reads)."""
    from aoizora.planning.candidate_pricing import compile_layout
    from aoizora.extract.network import default_device_order

    step, args, ir = program
    target = get_target("v5p-8")
    mems = []
    for budget in (1e9, 60e6):
        sol = solve_sharding(ir, target, MESH, ShardingProblem(remat="decide", hbm_bytes=budget),
                             time_limit_s=45).best
        ev = compile_layout(step, args, target, sol.layout, default_device_order(target, MESH))
        assert ev.memory.fits
        mems.append((sol.layout.remat, ev.memory.temp_bytes, ev.memory.total_bytes))
    (r0, temp0, total0), (r1, temp1, total1) = mems
    assert r0 is None and r1 is not None
    assert temp1 < 0.8 * temp0 and total1 < total0, mems
