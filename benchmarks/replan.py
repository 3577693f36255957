"""The seeded planner at this commit against a grid's recorded plan and best tuned expert, cell by
cell, with the grid's own compile budget (issue #52: does a change to Q1 or to the ILP's layouts
make the plan a layout of the ILP's own, and is it still never slower?).

    python -m benchmarks.replan --reference-dir benchmarks/results/grid_tuned [--cells A,B]
        [--out benchmarks/results/replan] [--report-only]

For each cell JSON of ``--reference-dir`` (``benchmarks.grid --tuned-experts --compiles N``):
``aoizora plan MODEL ... --compiles N`` (the cell's budget) with an empty evidence cache, the
plan compiled again in its device order and priced by Q2 and by the reference simulator
(``benchmarks.plan_60s.priced``). Compared with the grid's plan and with its best tuned expert,
both as the cell recorded them: the experts are not compiled again, so the comparison holds only
where the simulator's code (``sim code same``, by git tree id) and the code that builds and
compiles the experts' programs (``expert code same``) are the same at both commits; the report
marks a pair where either differs.

Writes ``<out>/<cell>.json`` and ``<out>.md``. Every latency is a prediction (Q2) or a
simulation of the compiled XLA:TPU program; nothing runs on a TPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.machine import git_state, machine_info
from benchmarks.plan_60s import (ROOT, priced, reference_plan, run_and_report, run_plan,
                                 sim_code_at)
from benchmarks.simulator import LABEL as SIM_LABEL

RESULTS = ROOT / "results" / "replan"
# what builds, lays out and compiles an expert's program (the comparison is by the simulator:
# Q2's code, e.g. formulation/op_time.py or traffic.py, prices the planner's candidates, not the
# recorded expert's simulated step)
EXPERT_CODE = ("aoizora/models", "aoizora/kernels", "aoizora/runtime", "aoizora/expert_tuning.py",
               "extract", "formulation/kernel_model.py")


def changed_paths(commit: str, paths: Sequence[str], head: str = "HEAD") -> list[str]:
    """The ``paths`` whose git tree (or blob) id differs between ``commit`` and ``head``."""
    def tree_id(at, p):
        done = subprocess.run(["git", "rev-parse", f"{at}:{p}"], capture_output=True,
                              text=True, cwd=ROOT.parent, check=False)
        return done.stdout.strip() or f"unknown at {at}"
    return [p for p in paths if tree_id(commit, p) != tree_id(head, p)]


def expert_code_same(changed: Sequence[str], target: str) -> bool:
    """Whether the experts' programs and prices are the same at both commits for ``target``: no
    path of ``EXPERT_CODE`` changed, or only the kernel model did and the target's devices are
    single TensorCores (the kernel model's one change in this period, v5p's megacore split,
    reduces to the former model with one core per device)."""
    if not changed:
        return True
    if list(changed) != ["formulation/kernel_model.py"]:
        return False
    from aoizora.formulation.kernel_model import CORES_PER_DEVICE
    return CORES_PER_DEVICE.get(target.split("-")[0], 0) == 1


def origin(layout_name: str) -> str:
    """"ILP" (the sharding ILP's own layout), "refined NAME" or "expert NAME"."""
    if layout_name.startswith("ilp"):
        return "ILP"
    kind, _, name = layout_name.partition(":")
    return f"{'refined' if kind == 'refined' else 'expert'} {name.removeprefix('expert:')}"


def best_tuned(ref: dict[str, Any]) -> dict[str, Any] | None:
    """The cell's best tuned expert row as recorded (name, knobs, simulated step)."""
    rows = {r["name"]: r for r in ref["rows"]}
    row = rows.get("best-tuned-expert")
    if not row or not row.get("sim_step_s"):
        return None
    solved = rows.get("best-tuned-expert/solved-placement") or {}
    return {"expert": row.get("expert"), "knobs": row.get("knobs"),
            "sim_step_s": row["sim_step_s"], "q2_step_s": row.get("q2_step_s"),
            "solved_sim_step_s": solved.get("sim_step_s")}


def run_cell(ref_path: Path, out_dir: Path, log) -> dict[str, Any]:
    """One cell (module docstring)."""
    ref = json.loads(ref_path.read_text())
    rp = reference_plan(ref)
    out: dict[str, Any] = {"cell": ref["cell"], "reference_file": os.path.relpath(ref_path),
                           "reference": rp, "best_tuned_expert": best_tuned(ref),
                           "compiles": ref["compiles"], "machine": machine_info(),
                           "git": git_state(), "labels": {"sim": SIM_LABEL,
                                                          "q2": "predicted (Q2)"},
                           "unit": "seconds"}
    at = rp["commit"] or "HEAD"
    out["sim_code_same"] = sim_code_at(at) == sim_code_at("HEAD")
    out["expert_code_changed"] = changed_paths(at, EXPERT_CODE)
    out["expert_code_same"] = expert_code_same(out["expert_code_changed"], ref["target_arg"])
    log(f"cell {ref['cell']}: aoizora plan --compiles {ref['compiles']}")
    path, out["run"] = run_plan(ref, out_dir, ("--compiles", str(ref["compiles"])))
    if out["run"]["returncode"] != 0:
        out["error"] = " / ".join(out["run"]["stderr_tail"])[-400:]
        return out
    log(f"  planned in {out['run']['wall_s']} s; compiling the plan again to simulate it")
    out["plan"] = priced(path, ref)
    out["plan"]["origin"] = origin(out["plan"]["layout"])
    return out


def _x(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def tuned_baseline_s(cell: dict[str, Any]) -> float | None:
    """The best tuned expert's simulated step at its better placement: JAX's default order or
    the placement CP-SAT solves for it (the grid's ``best-tuned-expert/solved-placement`` row,
    read from the reference cell when the record predates it)."""
    bt = cell.get("best_tuned_expert") or {}
    solved = bt.get("solved_sim_step_s")
    ref = ROOT.parent / cell.get("reference_file", "")
    if solved is None and ref.is_file():
        solved = (best_tuned(json.loads(ref.read_text())) or {}).get("solved_sim_step_s")
    steps = [v for v in (bt.get("sim_step_s"), solved) if v]
    return min(steps) if steps else None


def report(cells: list[dict[str, Any]], out_dir: Path = RESULTS) -> str:
    """The markdown table of every cell, and the counts the issue asks for."""
    commits = sorted({c["git"].get("git_commit", "")[:12] for c in cells})
    lines = [
        "# The seeded planner at this commit against the grid's plan and best tuned expert", "",
        f"Generated by `python -m benchmarks.replan` at commit {', '.join(commits)} on "
        f"{cells[0]['machine'].get('nproc')} CPUs with no TPU. Each plan ran with the grid "
        "cell's compile budget and an empty evidence cache, then was compiled again in its "
        f"device order and priced by Q2 (predicted) and **{SIM_LABEL}**. The grid's plan and "
        "best tuned expert are the cell's recorded ones, not compiled again: comparable where "
        "the simulator's code and the code that builds and compiles the experts' programs are "
        "the same at both commits (the last two columns; `benchmarks/replan.py`'s "
        "`expert_code_same` says when a changed kernel model still prices them the same). The "
        "best tuned expert's step is the better of its two recorded placements (JAX's default "
        "order, the one our placement CP-SAT solves for it). ms per "
        "step; x = the row's step over the new plan's (> 1: the new plan is faster).", "",
        "| cell | grid commit | new plan's layout | mesh | sim (ms) | Q2 (ms) | grid plan sim (ms) "
        "| x grid plan | best tuned expert | its sim (ms) | x it | wall s | sim code same | "
        "expert code same |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    xs, own, never, comparable = [], 0, 0, 0
    for c in cells:
        r, bt = c["reference"], c.get("best_tuned_expert") or {}
        head = f"| {c['cell']} | {r['commit'][:7]} | "
        if "plan" not in c:
            lines.append(head + f"error: {c.get('error', '')[:120]} |" + " - |" * 11)
            continue
        p = c["plan"]
        # from the two recorded commits, so a report made later says the same
        run_at = c["git"].get("git_commit") or "HEAD"
        c["expert_code_same"] = expert_code_same(
            changed_paths(r["commit"] or run_at, EXPERT_CODE, run_at), c["cell"].rsplit("_", 1)[1])
        bt_s = tuned_baseline_s(c)
        x_bt = _x(bt_s, p["sim_step_s"])
        ok = c["sim_code_same"] and c["expert_code_same"]
        if ok and x_bt:
            comparable += 1
            xs.append(x_bt)
            never += x_bt >= 0.9999
        own += p["origin"] == "ILP"
        mesh = "x".join(f"{k}{v}" for k, v in p["mesh"].items())
        lines.append(
            head + f"{p['origin']} | {mesh} | {p['sim_step_s'] * 1e3:.2f} | "
            f"{p['q2_step_s'] * 1e3:.2f} | {r['sim_step_s'] * 1e3:.2f} | "
            f"{_x(r['sim_step_s'], p['sim_step_s']):.3f} | {bt.get('expert', '-')} | "
            f"{(bt_s or 0) * 1e3:.2f} | "
            f"{'-' if x_bt is None else f'{x_bt:.3f}'} | {c['run']['wall_s']:.0f} | "
            f"{'yes' if c['sim_code_same'] else 'NO'} | "
            f"{'yes' if c['expert_code_same'] else 'NO'} |")
    planned = sum("plan" in c for c in cells)
    lines += ["", f"Over {planned} cells: the plan is a layout of the ILP's own in **{own}**."]
    if xs:
        lines.append(f"Over the {comparable} comparable cells: the new plan over the best tuned "
                     f"expert {statistics.geometric_mean(xs):.3f}x geometric mean, "
                     f"{statistics.median(xs):.3f}x median, worst {min(xs):.3f}x; never slower "
                     f"in **{never} of {comparable}**.")
    return "\n".join(lines + ilp_runner_up(cells, out_dir)) + "\n"


def ilp_best(plan_path: Path) -> dict[str, Any] | None:
    """The planner's cheapest compiled layout of the ILP's own (by Q2, as the planner ranked it)
    in the plan file's iterations; None when it compiled none."""
    if not plan_path.is_file():
        return None
    its = json.loads(plan_path.read_text()).get("iterations") or []
    cands = [(c["q2_step_s"], it["iteration"], c) for it in its for c in it["candidates"]
             if str(c.get("layout", "")).startswith("ilp") and c.get("q2_step_s")]
    if not cands:
        return None
    q2, it, c = min(cands, key=lambda t: (t[0], t[1]))
    return {"q2_step_s": q2, "iteration": it, "mesh": c["mesh"], "layout": c["layout"]}


def ilp_runner_up(cells: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Lines: per cell, the ILP's cheapest compiled layout against the plan, both by the
    planner's Q2 (what decided the plan; from ``<out_dir>/<cell>.plan.json``)."""
    lines = ["", "The ILP's cheapest compiled layout in each run, by the planner's Q2 (what "
             "ranked the candidates); behind: its Q2 over the plan's, - 1.", "",
             "| cell | plan's layout | plan Q2 (ms) | ILP's layout (iteration, mesh) | its Q2 (ms) "
             "| behind |", "|---|---|---|---|---|---|"]
    for c in cells:
        if "plan" not in c:
            continue
        b = ilp_best(out_dir / f"{c['cell']}.plan.json")
        pq = c["plan"].get("planner_q2_step_s") or c["plan"]["q2_step_s"]
        if b is None:
            lines.append(f"| {c['cell']} | {c['plan']['origin']} | {pq * 1e3:.2f} | none | - | - |")
            continue
        mesh = "x".join(f"{k}{v}" for k, v in b["mesh"].items())
        lines.append(f"| {c['cell']} | {c['plan']['origin']} | {pq * 1e3:.2f} | "
                     f"{b['layout']} ({b['iteration']}, {mesh}) | {b['q2_step_s'] * 1e3:.2f} | "
                     f"{100 * (b['q2_step_s'] / pq - 1):+.2f}% |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.replan",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--reference-dir", default=str(ROOT / "results" / "grid_tuned"))
    ap.add_argument("--cells", default="", help="comma-separated cell names (default: every "
                    "cell of the reference directory with a compile budget)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args(argv)
    out_dir = Path(a.out)
    want = [x for x in a.cells.split(",") if x]
    refs = ([Path(a.reference_dir) / f"{n}.json" for n in want] if want
            else sorted(Path(a.reference_dir).glob("*.json")))
    missing = [str(r) for r in refs if not r.is_file()]
    if missing:
        print(f"no grid cell {', '.join(missing)}: give cells of --reference-dir", file=sys.stderr)
        return 2
    run_and_report(refs, out_dir, run_cell, lambda cells: report(cells, out_dir), a.report_only,
                   lambda ref: bool(json.loads(ref.read_text()).get("compiles")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
