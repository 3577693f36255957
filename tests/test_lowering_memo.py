"""Evidence found without lowering (aoizora.planning.lowering_memo): a warm plan of the small
model lowers no candidate whose evidence is cached and gives the same plan, its choices by Q2
step coming back from the memo; any changed input (layout, device order, compiler options, the
lowering code) lowers again; a corrupt record is reported in one line and the layout lowered."""

import dataclasses
import os

import pytest

from aoizora.builtin import builtin_job, expert_seed_layouts
from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.extract.network import default_device_order
from aoizora.planner import plan
from aoizora.planning import candidate_pricing, lowering_memo

pytestmark = pytest.mark.tpu_compiler
OPTION = "xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call"


@pytest.fixture(scope="module")
def job():
    return builtin_job("wan2.1-small", "128p", 9, "v5e-4")


@pytest.fixture
def lowerings(monkeypatch):
    """The layouts lowered (``compile_evidence`` calls: each one lowers), in order."""
    seen = []
    real = candidate_pricing.compile_evidence

    def counting(*a, **k):
        seen.append(k["mesh"].shape)
        return real(*a, **k)

    monkeypatch.setattr(candidate_pricing, "compile_evidence", counting)
    return seen


def _plan(job, cache):
    """The short plan of ``test_compile_workers``: two expert seeds and the ILP's best on one
    mesh, one iteration, in-process compiles."""
    return plan(job.fn, *job.args, target=job.target, time_budget_s=240, top_k=1,
                max_iterations=1, meshes=[{"data": 2, "seq": 2}], placement_time_s=5,
                seed_layouts=expert_seed_layouts(job)[:2], cache=cache, compile_workers="inline")


def test_a_warm_plan_lowers_nothing_and_gives_the_same_plan(job, tmp_path, lowerings):
    cache = EvidenceCache(tmp_path)
    cold = _plan(job, cache)
    n = cold.compiles["compiled"]
    assert n >= 2 and len(lowerings) >= n
    del lowerings[:]
    warm = _plan(job, cache)
    assert lowerings == [] and warm.compiles["compiled"] == 0 and warm.compiles["cached"] >= n
    assert warm.layout.to_json() == cold.layout.to_json()
    assert warm.device_order == cold.device_order
    assert warm.predicted["step_s"] == pytest.approx(cold.predicted["step_s"], rel=1e-9)
    choice = warm.certificates["placement"].detail["step_choice"]
    assert choice["from_cache"]         # the choice by step came back (solve_memo.step_choice)
    assert choice == {**cold.certificates["placement"].detail["step_choice"], "from_cache": True}


@pytest.fixture
def seed(job):
    """The first expert seed's program, layout and default device order."""
    sd = expert_seed_layouts(job)[0]
    fn, args = sd.fn or job.fn, sd.args if sd.args is not None else job.args
    return fn, args, sd.layout, default_device_order(job.target, sd.layout.mesh_axes)


def test_any_changed_input_lowers_again(job, seed, tmp_path, lowerings, monkeypatch):
    fn, args, layout, order = seed
    cache = EvidenceCache(tmp_path)

    def compile_(lay=layout, order=order, **kw):
        return candidate_pricing.compile_layout(fn, args, job.target, lay, order, cache=cache,
                                                **kw)

    first = compile_()
    again = compile_()
    assert len(lowerings) == 1 and again.source == "cache" and again == first
    compile_(order=list(reversed(order)))                          # another device order
    compile_(lay=dataclasses.replace(layout, name="renamed"))     # another layout
    compile_(compiler_options={OPTION: True})                      # other compiler options
    assert len(lowerings) == 4
    monkeypatch.setattr(lowering_memo, "LOWERING_CODE", lowering_memo.LOWERING_CODE[:-1])
    code_changed = compile_()                                      # other lowering code
    assert len(lowerings) == 5 and code_changed.source == "cache"  # same program: evidence hit
    compile_()
    assert len(lowerings) == 5


def test_a_corrupt_record_is_reported_in_one_line_and_lowered(job, seed, tmp_path, lowerings):
    fn, args, layout, order = seed
    lines = []
    cache = EvidenceCache(tmp_path, report=lines.append)
    first = candidate_pricing.compile_layout(fn, args, job.target, layout, order, cache=cache)
    (path,) = [p for _, _, p in cache.entries(records=True) if p.endswith(".rec")]
    with open(path, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"XXXX")
    again = candidate_pricing.compile_layout(fn, args, job.target, layout, order, cache=cache)
    assert len(lowerings) == 2 and again == first and again.source == "cache"
    assert len(lines) == 1 and "corrupt entry" in lines[0] and "lowering again" in lines[0]
    assert "\n" not in lines[0]
    candidate_pricing.compile_layout(fn, args, job.target, layout, order, cache=cache)
    assert len(lowerings) == 2                                     # recorded again
