"""Seeds of ``plan_torch`` ranked by the sharding ILP's own Q1 (``aoizora.planning.seed_q1``),
on diffusers' Wan transformer at tiny widths (2 layers, meta tensors)."""

from __future__ import annotations

import dataclasses
import functools

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from aoizora.extract.targets import get_target  # noqa: E402
from aoizora.models.xdit import XDiTConfig, xdit_layout  # noqa: E402
from aoizora.planning.seed_q1 import SeedQ1Error, seed_q1  # noqa: E402
from aoizora.planning.torch_planner import _ranked_todo, plan_torch, torch_problem  # noqa: E402
from aoizora.solvers.sharding import solve_sharding  # noqa: E402

from tiny_models import tiny_wan_program  # noqa: E402

MESH = {"x": 2, "y": 4}


@pytest.fixture(scope="module")
def program():
    return tiny_wan_program()


@pytest.fixture(scope="module")
def ilp(program):
    _, ir = program
    return solve_sharding(ir, get_target("v5e-8"), MESH, torch_problem(), k_best=2,
                          time_limit_s=20)


def test_q1_of_an_ilp_layout_given_as_a_seed_is_the_ilps_own(program, ilp):
    _, ir = program
    for s in ilp.all():
        assert seed_q1(ir, get_target("v5e-8"), s.layout, torch_problem()) == \
            pytest.approx(s.predicted["total_s"], rel=1e-9)


def test_q1_of_xdit_layouts_differ_and_exceed_the_ilps_optimum(program, ilp):
    _, ir = program
    tgt = get_target("v5e-8")
    q = {c: seed_q1(ir, tgt, xdit_layout(ir, c), torch_problem())
         for c in (XDiTConfig(cfg=2, ulysses=4), XDiTConfig(cfg=2, ring=2, ulysses=2))}
    assert len(set(q.values())) == 2
    assert all(v >= ilp.certificate.objective * (1 - 1e-9) for v in q.values())


def test_a_layout_no_strategy_expresses_has_no_q1(program):
    _, ir = program
    with pytest.raises(SeedQ1Error, match="lays out"):     # 4 heads over ulysses 4 x tp 2
        seed_q1(ir, get_target("v5e-8"), xdit_layout(ir, XDiTConfig(ulysses=4, tp=2)),
                torch_problem())


def test_a_seed_on_a_four_axis_mesh_has_no_q1(program):
    _, ir = program
    lay = xdit_layout(ir, XDiTConfig(cfg=2, ring=2, ulysses=2, tp=2))
    with pytest.raises(SeedQ1Error, match="at most 3"):
        seed_q1(ir, get_target("v5e-8"), lay, torch_problem())


def _names(todo):
    return [r[2].layout.name for r in todo]


def test_seeds_and_ilp_layouts_share_one_q1_order(program, ilp):
    """A seed with a better Q1 comes before a worse ILP layout, a worse one after a better; a seed
    Q1 cannot price comes last, with a note."""
    _, ir = program
    tgt = get_target("v5e-8")
    best = ilp.best
    bad = xdit_layout(ir, XDiTConfig(cfg=2, ulysses=4), name="as-if-ilp")
    bad_q1 = seed_q1(ir, tgt, bad, torch_problem())
    worse_ilp = [(bad_q1, dict(bad.mesh_axes), dataclasses.replace(best, layout=bad))]
    seeds = [functools.partial(xdit_layout, config=XDiTConfig(ulysses=4, tp=2)),   # no Q1
             functools.partial(xdit_layout, config=XDiTConfig(cfg=2, ring=2, ulysses=2)),
             dataclasses.replace(best.layout, name="seed-ilp-best")]
    todo, notes = _ranked_todo(ir, ir, None, tgt, seeds, worse_ilp)
    names = _names(todo)
    assert names[0] == "seed-ilp-best"                     # better seed before the ILP's layout
    assert names.index("xdit:cfg2xulysses2xring2 (ring priced as gathered keys)") > \
        names.index("seed-ilp-best")
    assert names[-1] == "xdit:ulysses4xtp2"                # no Q1: last, not dropped
    assert [r[0] for r in todo[:-1]] == sorted(r[0] for r in todo[:-1])
    assert any("xdit:ulysses4xtp2: no Q1" in n for n in notes)
    # and the other way round: the same seed is after an ILP layout with a better Q1
    todo2, _ = _ranked_todo(ir, ir, None, tgt, seeds[1:2],
                            [(ilp.best.predicted["total_s"], MESH, ilp.best)])
    assert _names(todo2) == ["ilp", "xdit:cfg2xulysses2xring2 (ring priced as gathered keys)"]


def test_plan_prices_the_ilps_layout_before_a_worse_seed(program):
    """With room for one candidate, the ILP's layout (Q1 better) is priced, not the seed."""
    ep, _ = program
    p = plan_torch(ep, (), "v5e-8", meshes=[MESH], top_k=1, max_candidates=1, time_budget_s=60,
                   seed_layouts=[functools.partial(xdit_layout, config=XDiTConfig(cfg=2,
                                                                                  ulysses=4))])
    rows = p.iterations[0]["candidates"]
    assert [r["layout"] for r in rows] == ["ilp"]
    assert any("seeds ranked with the ILP's layouts" in n for n in p.notes)
