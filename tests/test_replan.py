"""The re-plan report: where the new plan came from, and the comparison with a grid's recorded
plan and best tuned expert only where the code that priced them is the same."""

import json

from benchmarks.replan import expert_code_same, ilp_best, origin, report


def test_origin_of_a_plan_layout():
    assert origin("ilp") == "ILP" and origin("ilp#2") == "ILP"
    assert origin("refined:expert:cfg2_ulysses") == "refined cfg2_ulysses"
    assert origin("expert:usp") == "expert usp"


def test_a_changed_kernel_model_is_the_same_only_for_single_core_devices():
    assert expert_code_same([], "v5p-8")
    assert expert_code_same(["formulation/kernel_model.py"], "v5e-8")
    assert not expert_code_same(["formulation/kernel_model.py"], "v5p-8")
    assert not expert_code_same(["extract"], "v5e-8")


def _cell(name, origin_layout, sim, best_tuned_sim):
    return {"cell": name, "git": {"git_commit": "HEAD"}, "machine": {"nproc": 2},
            "reference": {"commit": "HEAD", "sim_step_s": 0.1},
            "best_tuned_expert": {"expert": "usp", "sim_step_s": best_tuned_sim},
            "sim_code_same": True, "run": {"wall_s": 60.0},
            "plan": {"origin": origin(origin_layout), "mesh": {"x": 2, "y": 4},
                     "sim_step_s": sim, "q2_step_s": sim}}


def test_report_counts_the_ilps_plans_and_never_slower():
    md = report([_cell("a_v5e-8", "ilp", 0.09, 0.1), _cell("b_v5e-8", "expert:usp", 0.1, 0.1),
                 _cell("c_v5e-8", "refined:expert:usp", 0.11, 0.1)])
    assert "a layout of the ILP's own in **1**" in md
    assert "never slower in **2 of 3**" in md


def test_the_ilps_cheapest_compiled_layout_and_how_far_behind_the_plan(tmp_path):
    """From the plan file's iterations: the ILP's layout of least Q2, and its gap to the plan."""
    its = [{"iteration": 1, "candidates": [
               {"mesh": {"x": 8}, "layout": "ilp", "q2_step_s": 0.12},
               {"mesh": {"data": 2, "context": 4}, "layout": "refined:expert:usp",
                "q2_step_s": 0.10},
               {"mesh": {"x": 2, "y": 4}, "layout": "ilp#2", "q2_step_s": None}]},
           {"iteration": 2, "candidates": [
               {"mesh": {"x": 2, "y": 4}, "layout": "ilp", "q2_step_s": 0.11}]}]
    (tmp_path / "a_v5e-8.plan.json").write_text(json.dumps({"iterations": its}))
    assert ilp_best(tmp_path / "a_v5e-8.plan.json") == {
        "q2_step_s": 0.11, "iteration": 2, "mesh": {"x": 2, "y": 4}, "layout": "ilp"}
    assert ilp_best(tmp_path / "missing.plan.json") is None
    md = report([_cell("a_v5e-8", "refined:expert:usp", 0.1, 0.1)], tmp_path)
    assert "| a_v5e-8 | refined usp | 100.00 | ilp (2, x2xy4) | 110.00 | +10.00% |" in md
