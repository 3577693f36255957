"""A re-plan with a warm evidence cache: the same plan, in how many seconds.

Runs ``aoizora plan`` for one cell (default: Wan 2.1 1.3B, 480p-81f, v5e-8, the 300 s budget;
``--compiles N``: a budget of N compiles instead, the time budget a guard) with one fresh evidence
cache directory (which also keeps the solver answers no clock decided: ``aoizora.planning.
solve_memo``): cold (every compile runs and is stored), then again
until a run compiles nothing (every compile found in the cache; at most ``--runs``): a run after
a budget-limited one spends the time the cache saves on candidates the one before could not
reach, so its plan may differ (better); the run that compiles nothing is the warm re-plan, and
its plan is compared with the run before it. Records each run's wall time (the whole process,
seconds), the plan's own ``planning_time_s``, its compiled / cached counts, and whether its plan
is the one before's (layout, device order, predicted step). Writes ``benchmarks/results/warm_cache_<cell>
.json`` and ``.md``. Latencies are Q2 predictions; nothing ran on a TPU.

    python -m benchmarks.warm_cache
    python -m benchmarks.warm_cache --compiles 16
    python -m benchmarks.warm_cache --model wan2.1-small --resolution 128p --frames 9
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.machine import git_state

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run_plan(job: list[str], budget: float, cache: str, out: str, compiles: int | None = None
             ) -> dict:
    t0 = time.perf_counter()
    limit = ["--time-budget", str(budget)] if compiles is None else ["--compiles", str(compiles)]
    p = subprocess.run([sys.executable, "-m", "aoizora", "plan", *job, *limit,
                        "--cache-dir", cache, "--out", out, "--quiet"],
                       capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"aoizora plan failed: {p.stderr.strip().splitlines()[-1:]}")
    d = json.load(open(out))
    return {"wall_s": round(wall, 2), "planning_time_s": round(d["planning_time_s"], 2),
            "compiles": d.get("compiles", {}), "mesh": d["mesh"],
            "device_order": d["device_order"], "step_ms": d["predicted"]["step_s"] * 1e3,
            "layout": d["layout"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="wan2.1-1.3b")
    ap.add_argument("--resolution", default="480p")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--target", default="v5e-8")
    ap.add_argument("--time-budget", type=float, default=300.0)
    ap.add_argument("--compiles", type=int, default=None,
                    help="a budget of N compiles instead of --time-budget")
    ap.add_argument("--runs", type=int, default=5, help="at most this many runs")
    args = ap.parse_args(argv)
    job = ["--model", args.model, "--resolution", args.resolution, "--frames",
           str(args.frames), "--target", args.target]
    cell = f"{args.model}_{args.resolution}-{args.frames}f_{args.target}"
    budget = (f"{args.time_budget:g} s budget" if args.compiles is None
              else f"a budget of {args.compiles} compiles")
    suffix = "" if args.compiles is None else f"_compiles{args.compiles}"
    git = git_state()
    runs = []
    with tempfile.TemporaryDirectory(prefix="aoizora-warm-") as d:
        cache = os.path.join(d, "cache")
        for i in range(args.runs):
            r = run_plan(job, args.time_budget, cache, os.path.join(d, f"run{i}.json"),
                         args.compiles)
            if runs:
                prev = runs[-1]
                r["same_plan_as_before"] = (
                    r["layout"] == prev["layout"] and r["device_order"] == prev["device_order"]
                    and abs(r["step_ms"] - prev["step_ms"]) <= 1e-9 * prev["step_ms"])
            runs.append(r)
            print(i, {k: v for k, v in r.items() if k != "layout"}, flush=True)
            if i and r["compiles"].get("compiled") == 0:
                break
    for r in runs:
        r.pop("layout")
    os.makedirs(RESULTS, exist_ok=True)
    stem = os.path.join(RESULTS, f"warm_cache_{cell}{suffix}")
    with open(stem + ".json", "w") as f:
        json.dump({"cell": cell, "time_budget_s": args.time_budget, "compiles": args.compiles,
                   "runs": runs, **git,
                   "machine": {"cpus": os.cpu_count(), "load_average": list(os.getloadavg())}},
                  f, indent=1)
    lines = [f"# Re-planning {cell} with a warm evidence cache", "",
             f"`aoizora plan` ({budget}) with one fresh `--cache-dir`, run "
             "until a run compiles nothing, on this shared 2-core machine (wall seconds of the "
             "whole process; step latencies predicted by Q2, nothing ran on a TPU; load average "
             f"{os.getloadavg()[0]:.1f} at the end). Commit {git['git_commit'][:10]}"
             f"{' (modified: ' + ', '.join(git['git_modified_files']) + ')' if git['git_modified_files'] else ''}. "
             "Generated by `python -m benchmarks.warm_cache"
             f"{'' if args.compiles is None else f' --compiles {args.compiles}'}`.", "",
             "| run | wall s | planning_time_s | compiled | evidence from cache | "
             "solver answers from cache | mesh | step ms (Q2) | same plan as the run before |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs):
        c = r["compiles"]
        mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
        lines.append(f"| {'cold' if i == 0 else f'warm {i}'} | {r['wall_s']:.1f} | "
                     f"{r['planning_time_s']:.1f} | {c.get('compiled', '?')} | "
                     f"{c.get('cached', '?')} | {c.get('solver_answers_cached', 0)} | {mesh} | "
                     f"{r['step_ms']:.3f} | "
                     f"{r.get('same_plan_as_before', '-')} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()
