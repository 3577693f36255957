"""The grid report's 60 s section: each short cell says where its planner started (the defaults,
or another cell's calibration), and the target is judged per start."""

from benchmarks.grid_report import budget_table, summarize, targets_text


def _cell(name, sim_s, speedup, planning_s, src=None):
    c = {"cell": name, "model": "wan2.1-1.3b", "target_arg": "v5e-16", "budget_s": 60,
         "planning_time_s": planning_s, "speedup_over_best_expert": speedup,
         "never_slower": speedup >= 1.0,
         "rows": [{"name": "aoizora", "sim_step_s": sim_s, "mesh": {"x": 16},
                   "device_order": list(range(16))}]}
    if src:
        c["calibration_from"] = {"cell": src, "budget_s": 240, "path": "x.json"}
    return c


def test_short_cells_say_where_they_started_and_are_judged_per_start():
    full = _cell("a_21f", 0.060, 1.2, 220.0)
    full["budget_s"] = 240
    cold = _cell("a_21f", 0.078, 1.0, 58.0)
    warm = _cell("a_21f", 0.063, 1.19, 57.0, src="a_41f")
    lines = budget_table([full], [cold, warm])
    assert "| cold |" in lines[2] and "calibration of a_41f (240 s)" in lines[3]
    s = summarize([full])
    s["short"] = [(c["cell"], c["planning_time_s"], 60, c["speedup_over_best_expert"],
                   c["never_slower"], "warm" if c.get("calibration_from") else "cold")
                  for c in (cold, warm)]
    text = [t for t in targets_text(s, 1) if "60 s budget" in t]
    assert len(text) == 2
    assert "from the defaults (cold): **met**" in text[0]
    assert "warm-started from another cell's calibration: **met**" in text[1]
    s["short"][1] = s["short"][1][:3] + (0.9, False, "warm")
    text = [t for t in targets_text(s, 1) if "60 s budget" in t]
    assert "MISSED" in text[1] and "MISSED" not in text[0]


def test_the_machine_line_names_every_machine_the_cells_ran_on():
    """Cells re-run on another machine are not reported as if they ran on the first one."""
    from benchmarks.grid_report import _counted

    def on(cpu):
        return {"machine_start": {"nproc": 2, "cpu_model": cpu}}

    def line(cells):
        return _counted(cells, lambda m: f"{m.get('nproc')} cores, {m.get('cpu_model', '?')}")

    assert line([on("AMD EPYC")] * 3) == "2 cores, AMD EPYC"
    assert line([on("AMD EPYC"), on("Intel Xeon"), on("Intel Xeon")]) == \
        "2 cores, Intel Xeon (2 cells); 2 cores, AMD EPYC (1 cells)"


def test_repeatability_counts_cells_that_record_their_time_limits():
    from benchmarks.grid_report import repeatability_text

    (line,) = repeatability_text([("a", []), ("b", ["x", "y", "z"]), ("c", ["x"]), ("d", None)])
    assert "no time limit bound in 1 of 3 cells that record it (a)" in line
    assert "in the other 2, 1-3 places" in line
    assert "1 cell ran before it was recorded" in line
    assert repeatability_text([]) == []


def test_a_repeat_run_is_shown_beside_the_grids_run_of_its_cell():
    from benchmarks.grid_report import repeat_table

    def cell(commit, compiles, speedup, slower, time_limited):
        return {"cell": "c", "machine_start": {"git_commit": commit, "date": "d"},
                "candidates": [{"compile_s": s} for s in compiles], "planning_time_s": 230.0,
                "plan": {"time_limited": time_limited},
                "rows": [{"name": "aoizora", "mesh": {"x": 2}, "sim_step_s": 0.4}],
                "speedup_over_best_expert": speedup, "slower_than": slower}

    grid = cell("bbbbbbbbb", [15.0, 20.0, 16.0], 1.14, [], ["a"])
    rep = cell("aaaaaaaaa", [40.0, 22.0], 1.10, ["alpa-logical"], ["a", "b"])
    head, _, r1, r2 = repeat_table([grid], [rep])
    assert "compile s (median)" in head
    assert r1.startswith("| c | repeat | aaaaaaa | d | 2 | 40.0 | 230.0 | 2 | x=2 |")
    assert r1.endswith("| 1.100x | no: alpa-logical |")
    assert r2.startswith("| c | grid | bbbbbbb | d | 3 | 16.0 |") and r2.endswith("| yes |")
    assert repeat_table([grid], []) == []
    # two repeats of a cell: both, then the grid's run once
    rep2 = cell("ccccccccc", [30.0], 1.12, [], ["a"])
    rows = repeat_table([grid], [rep, rep2])[2:]
    assert [r.split(" | ")[1:3] for r in rows] == [["repeat", "aaaaaaa"], ["repeat", "ccccccc"],
                                                   ["grid", "bbbbbbb"]]
