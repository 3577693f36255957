"""The grid's smoke cell (the small Wan DiT on v5e-8, small budget): every row is there, priced by
both Q2 and the simulator on real XLA:TPU output, the simulator given each program's HLO (its own
compute model, independent of the compiler's estimates), and fidelity is computed."""

import copy
import math

import pytest

from aoizora.extract.evidence_cache import open_cache
from benchmarks.grid import SIM_LABEL, Q2_LABEL, add_expert_rows, run_smoke, spearman
from benchmarks.grid_report import summarize, table

pytestmark = pytest.mark.tpu_compiler


def test_spearman_average_ranks():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ties take average ranks: x ranks 1.5 1.5 3 4
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1, 2], [1, 2]) is None


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return open_cache(tmp_path_factory.mktemp("evidence-cache"))


@pytest.fixture(scope="module")
def cell(cache):
    c = run_smoke(seed=0, cache=cache)
    assert not c["errors"], c["errors"]
    return c


def test_a_warm_cache_serves_the_cells_compiles(cell, cache):
    hits = cell["evidence_cache"]["hits"]
    assert hits["planner_from_cache"] == 0 and hits["planner_compiled"] >= 1
    assert hits["baselines_compiled"] >= 3
    again = run_smoke(seed=0, cache=cache)
    assert not again["errors"], again["errors"]
    warm = again["evidence_cache"]["hits"]
    # every baseline (experts, Alpa-style) from the cache, priced to the same figures (a row
    # may take the planner's compile of its seed instead; which seeds the planner compiled can
    # differ where a time limit bound, so the rows are compared where both runs priced them)
    assert warm["baselines_compiled"] == 0 and warm["baselines_from_cache"] >= 3
    cold = {r["name"]: r["sim_step_s"] for r in cell["rows"]
            if r.get("evidence_source") and not r["name"].startswith("aoizora")}
    hot = {r["name"]: r["sim_step_s"] for r in again["rows"]
           if r.get("evidence_source") and not r["name"].startswith("aoizora")}
    both = set(cold) & set(hot)
    assert len(both) >= 3 and all(cold[k] == hot[k] for k in both)
    # the planner's first candidate is the same program: found, not compiled
    assert warm["planner_from_cache"] >= 1
    if not cell["plan"]["time_limited"] and not again["plan"]["time_limited"]:
        assert warm["planner_compiled"] == 0           # no clock decided anything: same plan
        assert again["plan"]["layout_in_words"] == cell["plan"]["layout_in_words"]


def test_smoke_cell_rows(cell):
    assert cell["labels"]["sim"] == SIM_LABEL and cell["labels"]["q2"] == Q2_LABEL
    assert "independent" in SIM_LABEL and cell["pricing"] == "independent"
    names = [r["name"] for r in cell["rows"]]
    for want in ("aoizora", "aoizora-layout/default-order", "heuristic-placement", "alpa-logical"):
        assert want in names
    assert sum(n.startswith("expert:") for n in names) >= 3
    az = cell["rows"][names.index("aoizora")]
    assert az["speedup_sim"] == pytest.approx(1.0)
    # the aoizora row's Q2 is the planner's own prediction, re-priced on the same evidence
    assert az["q2_step_s"] == pytest.approx(az["q2_planner_step_s"], rel=1e-9)
    priced = [r for r in cell["rows"] if r.get("sim_step_s")]
    assert len(priced) >= 5
    for r in priced:
        assert r["q2_step_s"] > 0 and math.isfinite(r["sim_step_s"])
        assert r["sim_step_s"] >= r["sim_compute_s"] > 0
        if "evidence" in r:                              # summary numbers, not the object
            assert r["evidence"]["compile_s"] > 0 and r["evidence"]["fits_hbm"]
        assert r["speedup_sim"] == pytest.approx(r["sim_step_s"] / az["sim_step_s"])
    for r in cell["rows"]:
        if not r.get("sim_step_s"):
            assert r["reason"] or r["error"]           # an invalid row says why
    assert cell["best_expert"].startswith("expert:")
    # a seed the planner compiled is priced from that compile, not compiled again
    assert any(r.get("compile") == "the planner's compile of this seed" for r in cell["rows"])
    # the default order is never better than the plan by Q2 (the planner falls back to it)
    d = cell["rows"][names.index("aoizora-layout/default-order")]
    assert az["q2_step_s"] <= d["q2_step_s"] * (1 + 1e-9)


def test_smoke_cell_fidelity_and_report(cell):
    f = cell["fidelity"]
    assert f["placements_of_plan_layout"] >= 4          # default, CP-SAT/heuristics, randoms
    assert f["pairs_evaluated"] >= f["placements_of_plan_layout"] + 3
    assert f["rho_all"] is None or -1.0 <= f["rho_all"] <= 1.0
    assert isinstance(f["top1"], bool) and f["plan_sim_rank"] >= 1
    keys = {(p["program"], p["layout"], tuple(p["placement"])) for p in f["pairs"]}
    assert len(keys) == len(f["pairs"])          # distinct (program, layout, placement) pairs
    # every priced expert row is a pair of its own program (experts pad their own programs)
    for r in cell["rows"]:
        if r["name"].startswith("expert:") and r.get("sim_step_s"):
            assert any(p["program"] == r["name"] and p["sim_step_s"] == r["sim_step_s"]
                       for p in f["pairs"])
    assert all("evidence" not in p for p in f["pairs"])
    # every pair was simulated with its program's compiled HLO: the simulator's own compute model
    for p in f["pairs"]:
        assert p["sim_hlo"], p["what"]
        assert not any("no HLO given" in n for n in p["sim_notes"]), (p["what"], p["sim_notes"])
    # one kept HLO per compiled layout at least (an expert priced from its seed's compile
    # shares that compile's file)
    layouts = {p["layout"] for p in f["pairs"]}
    assert cell["hlo_kept"]["files"] >= len(layouts) and cell["hlo_kept"]["gzip_bytes"] > 0
    s = summarize([cell])
    assert "v5e-8" in s["geomean"] and not s["failed"]
    assert any(line.startswith(f"| {cell['cell']} |") for line in table([cell]))


def test_add_experts_prices_the_rows_a_written_cell_lacks(cell):
    """A cell written before two configurations joined the expert list gets their rows back,
    priced as the full run priced them and stamped with when they were added."""
    gone = ("expert:cfg2_ulysses", "expert:usp")     # valid (8 heads / 4) and invalid (8 / 8)
    old = copy.deepcopy(cell)
    old["rows"] = [r for r in old["rows"] if r["name"] not in gone]
    old["fidelity"]["pairs"] = [p for p in old["fidelity"]["pairs"] if p["program"] not in gone]
    assert add_expert_rows(old, log=lambda s: None) == list(gone)
    by = {r["name"]: r for r in old["rows"]}
    full = {r["name"]: r for r in cell["rows"]}
    assert by["expert:cfg2_ulysses"]["sim_step_s"] == pytest.approx(
        full["expert:cfg2_ulysses"]["sim_step_s"], rel=1e-9)
    assert not by["expert:usp"]["valid"] and by["expert:usp"]["reason"] == full["expert:usp"]["reason"]
    for name in gone:
        assert by[name]["added"]["git_commit"] is not None and by[name]["added"]["date"]
    assert old["best_expert"] == cell["best_expert"]
    assert any(p["program"] == "expert:cfg2_ulysses" and p["sim_hlo"]
               for p in old["fidelity"]["pairs"])
    assert old["fidelity"]["pairs_evaluated"] == cell["fidelity"]["pairs_evaluated"]
    assert add_expert_rows(old, log=lambda s: None) == []                # nothing left to add
