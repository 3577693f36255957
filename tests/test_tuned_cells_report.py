"""The tuned-cells report says where each plan's layout came from: the ILP's own, a refined
expert or an expert, and when an ILP candidate compiled to the same price."""

from benchmarks.tuned_cells_report import commit_summaries, plan_origin


def _cell(cands, name="c"):
    rows = [{"name": "aoizora", "sim_step_s": 1.0},
            {"name": "best-tuned-expert", "sim_step_s": 1.1}]
    return {"cell": name, "rows": rows, "machine_start": {"git_commit": "abc1234"},
            "candidates": [{"layout": lab, "q2_step_s": q} for lab, q in cands]}


def test_plan_origin_by_the_cheapest_candidate():
    assert plan_origin(_cell([("expert:dsp", 2.0), ("ilp", 1.0)])) == "ILP"
    assert plan_origin(_cell([("refined:expert:cfg2_context", 1.0), ("ilp", 1.2)])) == \
        "refined cfg2_context"
    assert plan_origin(_cell([("expert:usp", 1.0), ("ilp#2", 1.00001)])) == "expert usp = ILP"
    assert plan_origin({"cell": "t", "candidates": []}) is None


def test_summary_counts_the_ilps_own_plans():
    cells = [_cell([("ilp", 1.0)], "a"), _cell([("expert:usp", 1.0), ("ilp", 1.5)], "b")]
    line = commit_summaries(cells)[0]
    assert "the ILP's own in 1 of 2" in line and "ties in 0" in line
