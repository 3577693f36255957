"""The ILP-only report's per-cell comparison with the best expert (benchmarks.ilp_only)."""

import json

from benchmarks import ilp_only


def _result(date: str, mesh: dict, sim: float, q2: float) -> dict:
    expert = {"name": "expert:cfg2_context", "mesh": {"data": 2, "context": 4},
              "description": "CFG 2 x context 4", "q2_step_s": 0.110, "sim_step_s": 0.100,
              "sim_compute_s": 0.080, "sim_communication_s": 0.020}
    return {"cell": "m_480p-21f_v5e-8", "machine": {"date": date}, "sim_step_s": sim,
            "sim_compute_s": sim - 0.001, "q2_step_s": q2,
            "speedup_over_best_expert": 0.100 / sim,
            "reference": {"best_expert": "cfg2_context", "source": "this run"},
            "experts": [expert],
            "plan": {"mesh": mesh, "layout_in_words": [
                "dot w: rows(m0) on x [7 f.py:1 (linear)]",
                "self-attention: sequence on x [100.1 p.py:2 (attention)]",
                "self-attention: sequence on x [101.1 p.py:2 (attention)]"]}}


def test_latest_run_by_date_not_by_tag_name(tmp_path, monkeypatch):
    monkeypatch.setattr(ilp_only, "RESULTS", tmp_path)
    for tag, date, mesh, sim in (("zz-old", "2026-12-01 10:00 UTC", {"x": 8}, 0.125),
                                 ("aa-new", "2026-12-06 10:00 UTC", {"x": 4, "y": 2}, 0.095)):
        (tmp_path / tag).mkdir()
        (tmp_path / tag / "cell.json").write_text(json.dumps(_result(date, mesh, sim, 0.105)))
    lines = ilp_only.differences(["aa-new", "zz-old"])
    rows = [ln for ln in lines if ln.startswith("| m_480p")]
    assert len(rows) == 1
    row = rows[0]
    assert "| aa-new | 4x2: self-attention: sequence on x |" in row   # one phrase per decision
    assert "cfg2_context 2x4: CFG 2 x context 4" in row
    assert "| 105.0 / 110.0 | ILP |" in row
    assert row.endswith("| 1.053 |")


def test_no_section_without_runs_priced_with_experts(tmp_path, monkeypatch):
    monkeypatch.setattr(ilp_only, "RESULTS", tmp_path)
    (tmp_path / "t").mkdir()
    d = _result("2026-12-06", {"x": 8}, 0.1, 0.1)
    d["reference"]["source"] = "grid"
    (tmp_path / "t" / "cell.json").write_text(json.dumps(d))
    assert ilp_only.differences(["t"]) == []


def test_a_grid_run_with_tuned_experts_is_a_reference(tmp_path, monkeypatch):
    """``--reference-dir``: the cell's best expert as published and its best tuned expert."""
    monkeypatch.setattr(ilp_only, "GRID_RESULTS", tmp_path / "grid")
    run = tmp_path / "grid_tuned"
    run.mkdir()
    rows = [{"name": "aoizora", "sim_step_s": 0.090, "q2_step_s": 0.100},
            {"name": "expert:context", "sim_step_s": 0.120, "q2_step_s": 0.12},
            {"name": "expert:cfg2_context", "sim_step_s": 0.102, "q2_step_s": 0.11},
            {"name": "best-tuned-expert", "sim_step_s": 0.095, "q2_step_s": 0.105}]
    (run / "c.json").write_text(json.dumps({
        "rows": rows, "best_tuned_expert": "cfg2_context [blocks shard]",
        "machine_start": {"git_commit": "abcdef1234567890"}}))
    ref = ilp_only._grid_reference("c", run)
    assert ref["best_expert"] == "cfg2_context" and ref["best_expert_sim_s"] == 0.102
    assert ref["best_tuned_expert_sim_s"] == 0.095 and ref["grid_commit"] == "abcdef123456"
    assert ref["source"] == "grid_tuned/c.json"


def test_the_seeded_arm_is_set_beside_the_ilp_only_run_of_its_commit(tmp_path, monkeypatch):
    """benchmarks.seeded_vs_ilp: a seeded plan's kind comes from its layout's name, and the
    ILP-only arm beside it is the run at the same commit and compile budget (not another's:
    "zzz" is not a commit, so git finds no same code)."""
    from benchmarks import seeded_vs_ilp as S

    assert [S.plan_kind(n) for n in ("ilp", "ilp#2", "refined:expert:dsp", "expert:usp")] == [
        "ILP's own", "ILP's own", "refined expert", "expert"]
    seeded, only = tmp_path / "seeded", tmp_path / "only"
    monkeypatch.setattr(S, "SEEDED", seeded)
    monkeypatch.setattr(S, "ILP_ONLY", only)

    def res(commit, sim, name="ilp"):
        return {"cell": "c", "git": {"git_commit": commit}, "compiles": 4, "sim_step_s": sim,
                "speedup_over_best_tuned_expert": 0.1 / sim,
                "plan": {"mesh": {"x": 8}, "layout_name": name}}
    for d, tag, r in ((seeded, "t", res("abc", 0.09, "refined:expert:dsp")),
                      (only, "old", res("zzz", 0.12)), (only, "new", res("abc", 0.08))):
        (d / tag).mkdir(parents=True)
        (d / tag / "c.json").write_text(json.dumps(r))
    (row,) = S.rows("t")
    assert row["kind"] == "refined expert" and abs(row["ilp_only_sim_ms"] - 80.0) < 1e-9
    assert "never slower than it in **1 of 1**" in S.markdown("t", [row])
