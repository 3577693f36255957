"""The plan chooses attention tiles: the kernel model's tiles for each attention node at its
per-shard shapes, compiled in the plan's device order and kept because Q2 prices them lower;
the plan file records them and the realized program uses them."""

import re

import pytest

import aoizora
from aoizora.plans import Plan
from benchmarks.joint_dit import make


@pytest.fixture(scope="module")
def planned():
    fn, args = make(L=2, D=512, H=4, F=1024, S=4096, T=256, B=2)
    return fn, args, aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, seed=0,
                                  meshes=[{"x": 2, "y": 4}], max_iterations=1, top_k=1)


@pytest.mark.tpu_compiler
def test_the_plan_takes_tiles_that_price_lower(planned):
    _, _, p = planned
    (note,) = [n for n in p.notes if n.startswith("attention tiles")]
    got = re.search(r"([\d.]+) -> ([\d.]+) ms", note)
    if got is None:   # the ILP's layout already ran the kernel model's tiles when compared
        assert "chosen before the comparison" in note
    else:
        before, after = (float(x) for x in got.groups())
        assert after < before and p.predicted["step_s"] * 1e3 == pytest.approx(after, abs=1e-3)
    tiles = [a.tiles for a in p.layout.attention.values()]
    assert tiles and all(t.get("block_q") and t.get("block_kv") for t in tiles)


@pytest.mark.tpu_compiler
def test_the_plan_file_keeps_the_tiles(planned, tmp_path):
    _, _, p = planned
    p.save(str(tmp_path / "plan.json"))
    q = aoizora.load_plan(str(tmp_path / "plan.json"))
    assert isinstance(q, Plan)
    assert {k: a.tiles for k, a in q.layout.attention.items()} == \
        {k: a.tiles for k, a in p.layout.attention.items()}
