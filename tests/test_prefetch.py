"""Q1's prefetch overlap (formulation.prefetch): a program input's gathers hide behind compute,
up to the step's compute; the ILP's objective is that price; measured all-gather costs and
training steps turn the credit off."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.prefetch import PREFETCH_TIE, prefetch_edges
from aoizora.formulation.sharding_ilp import evaluate
from aoizora.formulation.strategies import Hardware, Options, build_strategies
from aoizora.solvers.sharding import ShardingProblem, solve_sharding


def _mlp(params, x):
    return jax.nn.gelu(x @ params["w1"]) @ params["w2"]


def _ir(batch: int):
    bf = jnp.bfloat16
    p = {"w1": jax.ShapeDtypeStruct((1024, 4096), bf), "w2": jax.ShapeDtypeStruct((4096, 1024), bf)}
    return build_ir(_mlp, p, jax.ShapeDtypeStruct((batch, 1024), bf))


def _fsdp(graph):
    """A choice with both weights split over x and gathered for the dots, the batch split too
    (FSDP), as group -> strategy index; None if the graph has no such choice."""
    choice = {}
    for gid, G in graph.groups.items():
        ks = [k for k, s in enumerate(G.strategies)
              if any("x" in a for sp in s.specs.values() for a in sp)]
        choice[gid] = ks[0] if ks else 0
    return choice


@pytest.mark.parametrize("room", [1.0, 1e-3])
def test_hidden_is_min_of_prefetch_and_compute(v5e4, room):
    ir = _ir(256)
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip),
                         Options(prefetch_room=room))
    assert g.prefetch_room == room and prefetch_edges(g)
    choice = _fsdp(g)
    ev = evaluate(g, choice)
    P = sum(g.edges[i].cost[g.edges[i].p_of[choice[g.edges[i].producer]]]
            [g.edges[i].q_of[choice[g.edges[i].consumer]]] for i in prefetch_edges(g))
    C = sum(g.groups[k].strategies[v].cost - g.groups[k].strategies[v].comm
            for k, v in choice.items())
    assert P > 0
    hidden = (1 - PREFETCH_TIE) * min(P, room * C)
    assert ev["prefetch_hidden_s"] == pytest.approx(hidden, rel=1e-12)
    assert ev["total_s"] == pytest.approx(ev["nodes_s"] + ev["edges_s"] - hidden, rel=1e-12)
    # a room of 1 hides every gather of this MLP behind its compute; a tiny one cannot
    assert (P <= room * C) == (room == 1.0)


def test_ilp_objective_is_the_overlapped_price(v5e4):
    ir = _ir(65536)
    r = solve_sharding(ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=0.5e9, hbm_reserve=0.0))
    assert r.certificate.status == "OPTIMAL"
    assert r.certificate.objective == pytest.approx(r.best.predicted["total_s"], rel=1e-6)


def test_credit_off_when_measured_or_training(v5e4):
    ir = _ir(256)
    ac = default_axis_costs(v5e4, {"x": 4})
    hw = Hardware.from_chip(v5e4.chip)
    measured = dataclasses.replace(ac, beta_by_kind={"x": {"all-gather": 1e-11}})
    assert build_strategies(ir, measured, hw).prefetch_room == 0.0
    assert build_strategies(ir, ac, hw, Options(prefetch_room=0.0)).prefetch_room == 0.0
    g = build_strategies(ir, ac, hw, Options(prefetch_room=0.0))
    assert evaluate(g, _fsdp(g))["prefetch_hidden_s"] == 0.0
    ir.state_aliases = ((0, 0),)             # a training step: its state fed back
    assert build_strategies(ir, ac, hw).prefetch_room == 0.0
