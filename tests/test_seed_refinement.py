"""Seed refinement: the ILP completes an expert layout around its attention (aoizora.planning.seed_refinement)."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import pytest

import aoizora
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.layout import AttentionLayout
from aoizora.formulation.strategies import Hardware, build_strategies
from aoizora.models import registry as R
from aoizora.models.experts import expert_layouts
from aoizora.planning.seed_refinement import RefinementError, attention_pins, refine_seed


@pytest.fixture(scope="module")
def cfg2():
    m = R.get_model("wan2.1-small")
    wl = m.workloads[0]
    ex = next(e for e in expert_layouts(m, wl, get_target("v5e-8"), dtype=jnp.float32)
              if e.name == "cfg2_context")
    return ex, build_ir(ex.fn, *ex.args)


def _graph(ir, layout, tgt):
    return build_strategies(ir, default_axis_costs(tgt, layout.mesh_axes),
                            Hardware.from_chip(tgt.chip), None, None)


def test_pins_keep_exactly_the_seeds_attention(cfg2):
    ex, ir = cfg2
    tgt = get_target("v5e-8")
    graph = _graph(ir, ex.layout, tgt)
    kept, forbidden = attention_pins(graph, ex.layout)
    att = [g for g, G in graph.groups.items() if G.kind == "attention"]
    assert sorted(kept) == sorted(att) and att
    for gid, name in kept.items():
        G = graph.groups[gid]
        st = next(s for s in G.strategies if s.name == name)
        a = ex.layout.attention_for(G.anchor)
        assert (st.labels.get("b", ()), st.labels.get("s", ()), st.kv) == (a.batch, a.seq, a.kv)
        # every other strategy of the group is cut, the kept one is not
        cut = {next(iter(f.values())) for f in forbidden if gid in f}
        assert cut == {s.name for s in G.strategies} - {name}


def test_refinement_keeps_attention_and_rules_and_changes_only_parameters(cfg2):
    ex, ir = cfg2
    tgt = get_target("v5e-8")
    n_params = len(jax.tree_util.tree_leaves(ex.args[0]))
    ref = refine_seed(ir, tgt, ex.layout, range(n_params), time_limit_s=30, seed=0)
    assert ref is not None, "the ILP should lay the small model's weights out otherwise"
    L = ref.layout
    assert L.name == "refined:expert:cfg2_context"
    assert L.mesh_axes == ex.layout.mesh_axes and L.rules == ex.layout.rules
    assert L.attention == ex.layout.attention
    assert L.in_specs[n_params:] == ex.layout.in_specs[n_params:]
    differ = [i for i in range(n_params) if L.in_specs[i] != ex.layout.in_specs[i]]
    assert len(differ) == ref.changed > 0
    # the ILP's own answer runs every attention the seed's way, and is certified
    for gid, name in ref.kept.items():
        assert ref.solution.choice[gid] == name
    assert ref.solution.certificate.status in ("OPTIMAL", "FEASIBLE")
    # deterministic
    again = refine_seed(ir, tgt, ex.layout, range(n_params), time_limit_s=30, seed=0)
    assert again.layout == L


def test_tied_optima_keep_the_seeds_parameter_layout():
    """Wan 2.1 1.3B 480p-81f on v5e-8 (real shapes, abstract: nothing is allocated): around
    cfg2_context's attention Q1 ties a parameter's split (the seed's) with the ILP's own
    answer; the refinement takes the seed's, at the same proven Q1. (Which expert's parameter
    ties depends on Q1's pricing: cfg2_context's before Q1 priced fused follower chains,
    fsdp_sp's until the ILP had switch points, cfg2_context's again since.)"""
    import aoizora.solvers.sharding as S
    from aoizora.planning.seed_refinement import seed_strategies

    tgt = get_target("v5e-8")
    ex = next(e for e in expert_layouts(R.get_model("wan2.1-1.3b"), "480p-81f", tgt)
              if e.name == "cfg2_context")
    ir = build_ir(ex.fn, *ex.args)
    n = len(jax.tree_util.tree_leaves(ex.args[0]))
    ref = refine_seed(ir, tgt, ex.layout, range(n), time_limit_s=30, seed=0)
    cert = ref.solution.certificate
    assert cert.status == "OPTIMAL" and cert.detail["tie_moves"]
    moved = [ir.inputs.index(g.removeprefix("in:")) for g in cert.detail["tie_moves"]]
    # the same Q1 as the ILP without the preference, which lays those leaves out otherwise
    graph = _graph(ir, ex.layout, tgt)
    kept, forbidden = attention_pins(graph, ex.layout)
    plain = S.solve_sharding(ir, tgt, dict(ex.layout.mesh_axes),
                             S.ShardingProblem(forbidden=forbidden), time_limit_s=30, seed=0).best
    for i in moved:
        assert ref.layout.in_specs[i] == ex.layout.in_specs[i] != plain.layout.in_specs[i]
    assert cert.objective == pytest.approx(plain.certificate.objective, rel=1e-9)
    # settled: no preferred group the answer leaves can move there at Q1's optimum
    prefer = seed_strategies(ir, graph, ex.layout, range(n))
    idx = {g: next(k for k, st in enumerate(graph.groups[g].strategies) if st.name == name)
           for g, name in prefer.items()}
    names = {g: [st.name for st in graph.groups[g].strategies] for g in graph.groups}
    choice = {g: names[g].index(name) for g, name in ref.solution.choice.items()}
    _, _, _, model = S.build_problem(ir, tgt, dict(ex.layout.mesh_axes),
                                     S.ShardingProblem(forbidden=forbidden))
    again, moved_again = S.settle_ties(graph, model, choice, idx)
    assert moved_again == [] and again == choice


def test_settle_ties_moves_only_at_equal_q1(cfg2):
    """A preference that costs Q1 is not taken; one that does not is."""
    import aoizora.solvers.sharding as S
    from aoizora.formulation.sharding_ilp import evaluate

    ex, ir = cfg2
    tgt = get_target("v5e-8")
    mesh = dict(ex.layout.mesh_axes)
    _, _, graph, model = S.build_problem(ir, tgt, mesh)
    res = S.solve_sharding(ir, tgt, mesh, time_limit_s=30, seed=0).best
    names = {g: [st.name for st in graph.groups[g].strategies] for g in graph.groups}
    choice = {g: names[g].index(name) for g, name in res.choice.items()}
    q = evaluate(graph, choice)["total_s"]
    worse = {}
    for g, G in sorted(graph.groups.items()):
        for k in range(len(G.strategies)):
            if k == choice[g]:
                continue
            d = evaluate(graph, {**choice, g: k})["total_s"] - q
            if d > 1e-7 * q and not worse:
                worse[g] = k
    assert worse
    got, moved = S.settle_ties(graph, model, choice, worse)
    assert got == choice and moved == []
    # an equal-Q1 preference (the solver's own choice) is a no-op, not a move
    got, moved = S.settle_ties(graph, model, choice, {g: choice[g] for g in worse})
    assert got == choice and moved == []


def test_a_seed_attention_the_ilp_does_not_offer_is_one_clear_error(cfg2):
    ex, ir = cfg2
    odd = dataclasses.replace(ex.layout, attention={"*": AttentionLayout(heads=("nope",))})
    with pytest.raises(RefinementError, match="no strategy for"):
        refine_seed(ir, get_target("v5e-8"), odd, range(3), time_limit_s=10)


def test_the_planner_prices_the_refined_seed(cfg2):
    """Each refinement is compiled and priced right after its seed, with its seed's program."""
    ex, _ = cfg2
    from aoizora.planner import Seed

    other = next(e for e in expert_layouts(R.get_model("wan2.1-small"),
                                           R.get_model("wan2.1-small").workloads[0], get_target("v5e-8"),
                                           dtype=jnp.float32) if e.name == "tp_cfg")
    seeds = [Seed(e.layout, e.fn, tuple(e.args), {"pad_multiple": e.pad_multiple})
             for e in (ex, other)]
    p = aoizora.plan(ex.fn, *ex.args, target="v5e-8", time_budget_s=120, meshes=[],
                     max_iterations=1, verify=False, seed_layouts=seeds)
    it = p.iterations[0]
    names = [c["layout"] for c in it["candidates"]]
    assert names[:3] == ["expert:cfg2_context", "refined:expert:cfg2_context", "expert:tp_cfg"]
    assert all(c["q2_step_s"] > 0 for c in it["candidates"])
    assert it["refinements"][0]["changed_params"] > 0
    best = min(it["candidates"], key=lambda c: c["q2_step_s"])
    assert p.layout.name == best["layout"]
    won = ex if "cfg2_context" in best["layout"] else other
    assert p.program == {"pad_multiple": won.pad_multiple}


def test_a_training_seed_is_refined_on_its_retraceable_twin_with_the_ilps_remat():
    """A training expert seed carries its twin (same layout, the step as traced with every
    residual kept); its refinement decides the remat there, and the donated state's outputs
    follow the inputs the ILP lays out."""
    from aoizora.builtin import builtin_job, expert_seed_layouts
    from aoizora.runtime.rematerialize import retraceable
    from aoizora.planning.seed_refinement import _norm

    job = builtin_job("wan2.1-small", "128p", 9, "v5p-8", task="train", batch=2)
    sd = expert_seed_layouts(job)[0]
    assert sd.layout.name == "train-expert:maxdiffusion" and sd.program["remat"] != "none"
    tw = sd.retraceable
    assert tw is not None and retraceable(tw.fn) and tw.program["remat"] == "none"
    assert tw.layout.mesh_axes == sd.layout.mesh_axes and tw.layout.rules == sd.layout.rules
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the random ops the IR keeps replicated
        ir = build_ir(tw.fn, *tw.args)
    n = len(jax.tree.leaves(tw.args[0]))
    ref = refine_seed(ir, job.target, tw.layout, range(n), remat="decide", time_limit_s=20)
    assert ref is not None and ref.layout.name == "refined:train-expert:maxdiffusion"
    assert "remat_fixed" in ref.solution.certificate.detail   # the ILP decided the remat
    assert any(w.startswith("remat: ") for w in ref.solution.words)
    assert ref.layout.remat == ref.solution.layout.remat      # and the layout carries it
    assert ref.layout.attention == tw.layout.attention        # the seed's attention, kept
    donated = [i for i in range(n) if _norm(tw.layout.out_specs[i]) == _norm(tw.layout.in_specs[i])]
    assert donated and all(_norm(ref.layout.out_specs[i]) == _norm(ref.layout.in_specs[i])
                           for i in donated)
    # without "decide" the refinement keeps the twin's remat (the program as traced)
    plain = refine_seed(ir, job.target, tw.layout, range(n), time_limit_s=20)
    assert plain is None or ("remat_fixed" not in plain.solution.certificate.detail
                             and plain.layout.remat is None)
