"""benchmarks.plan_60s: the comparison with the grid's plan and the report (no compiles)."""

from benchmarks import plan_60s as P


def _plan(step, words=("a",), order=(0, 1)):
    return {"mesh": {"x": 2}, "layout_in_words": list(words), "device_order": list(order),
            "sim_step_s": step}


def test_compare_gives_reference_only_when_layout_order_and_step_agree():
    ref = _plan(1.0)
    assert P.compare(_plan(1.005), ref)["gives_reference"]
    assert not P.compare(_plan(1.02), ref)["gives_reference"]
    other = P.compare(_plan(0.99, words=("b",)), ref)
    assert not other["gives_reference"] and other["within_1pct"]
    assert not P.compare(_plan(1.0, order=(1, 0)), ref)["gives_reference"]


def test_report_counts_cells_and_names_errors():
    ref = {**_plan(0.1), "budget": "4 compiles", "compiled": 4, "commit": "abc1234def"}
    ok = {"cell": "c1", "reference": ref, "machine": {"nproc": 2}, "git": {"git_commit": "f" * 40},
          "sim_code_same": True,
          "run": {"wall_s": 61.0, "loadavg_before": [1.0], "loadavg_after": [1.5]},
          "plan": {**_plan(0.1005), "layout": "refined:expert:x", "compiles": {"compiled": 1},
                   "notes": ["stopped: time budget"]}}
    ok["compare"] = P.compare(ok["plan"], ref)
    bad = {"cell": "c2", "reference": ref, "machine": {"nproc": 2},
           "git": {"git_commit": "f" * 40}, "sim_code_same": True,
           "run": {"wall_s": 3.0}, "error": "no plan"}
    text = P.report([ok, bad])
    assert "gives the grid's plan in **1**" in text and "within 1% of it (simulated) in **1**" in text
    assert "error: no plan" in text
