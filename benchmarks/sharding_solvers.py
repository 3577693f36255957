"""The MIP solver behind the planner's sharding ILP: CBC against HiGHS, as the planner asks.

Each instance is a grid cell's program (one denoising step, the planner's padding) on one of the
target's logical meshes (``formulation.meshes.candidate_meshes``). Both solvers run the same
``solve_sharding`` call the planner's first iteration makes: default axis costs, the two best
layouts (``k_best=2, distinct="kv"``), seed 0, one thread, and the planner's per-mesh limit
(``plan(ilp_time_s=20)``) as the wall-clock budget of the whole solve. ``solve_model`` runs the
same stages for both -- a coordinate-descent incumbent, HiGHS's LP relaxation (proven when
integral) -- and then the MIP on the time left: CBC as a process on a file (``solver="cbc"``)
or HiGHS in process (``solver="highs"``, the default since this benchmark).

Reported per row: status, Q1 of the best layout (the ILP's objective: predicted step latency,
placement-oblivious, **ms**, a prediction), the best bound, the gap, where the answer came from
(``solver``, ``lp-relaxation``, ``incumbent``), the MIP's own seconds and the whole solve's wall
clock (seconds on this shared 2-core machine: indicative), how many of the 2 layouts asked came
back. Nothing is compiled.

Run:  python -m benchmarks.sharding_solvers [--limit 20] [--force]
Writes benchmarks/results/sharding_solvers.json and .md (resumes: rows already in the JSON are
kept unless --force).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import aoizora  # noqa: F401  (libtpu environment first)
from aoizora.builtin import builtin_job
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.meshes import candidate_meshes
from aoizora.solvers.sharding import ShardingSolveError, solve_sharding
from benchmarks.machine import git_state, machine_info
from aoizora.extract.atomic_io import atomic_open

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "sharding_solvers")
# (model, resolution, frames, target): grid cells whose ILPs CBC did not always finish
INSTANCES = [("wan2.1-14b", "480p", 21, "v5e-16"), ("wan2.1-14b", "720p", 41, "v5e-8"),
             ("wan2.1-1.3b", "480p", 21, "v5e-16")]
SOLVERS = ("cbc", "highs")


def _mesh(m: dict[str, int]) -> str:
    return "x".join(str(v) for v in m.values())


def run_instance(model: str, res: str, frames: int, target: str, limit: float) -> list[dict]:
    job = builtin_job(model, res, frames, target)
    ir = build_ir(job.fn, *job.args)
    rows = []
    for m in candidate_meshes(job.target.num_devices):
        for solver in SOLVERS:
            t = time.perf_counter()
            row = {"cell": f"{model}_{res}-{frames}f_{target}", "mesh": _mesh(m), "solver": solver,
                   "limit_s": limit}
            try:
                r = solve_sharding(ir, job.target, m, k_best=2, distinct="kv", time_limit_s=limit,
                                   seed=0, solver=solver)
            except ShardingSolveError as e:
                rows.append({**row, "error": str(e).splitlines()[0]})
                continue
            c, d = r.certificate, r.certificate.detail
            rows.append({**row, "status": c.status, "q1_ms": c.objective * 1e3,
                         "bound_ms": None if c.bound is None else c.bound * 1e3, "gap": c.gap,
                         "answer_from": d.get("answer_from"), "mip_s": d.get("solver_s"),
                         "lp_integral": d.get("lp_integral"), "build_s": r.build_s,
                         "wall_s": time.perf_counter() - t, "layouts": len(r.all()),
                         "solver_name": c.solver})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def write_md(data: dict) -> str:
    mi = data["machine"]
    lines = [
        "# Sharding ILP: CBC against HiGHS at the planner's per-mesh limit", "",
        f"Machine: {mi.get('cpu')}, {mi.get('nproc')} CPUs (shared), load average "
        f"{', '.join(f'{x:.1f}' for x in mi.get('loadavg', []))} at the start; PuLP "
        f"{mi.get('pulp')}, HiGHS (highspy) {mi.get('highspy')}; {mi.get('date')}; commit "
        f"{data.get('commit', '?')}. Single-threaded solvers, seed 0, the two best layouts "
        f"(k_best=2, distinct kv) within {data['limit_s']:g} s of wall clock for the whole solve "
        f"(`solve_sharding`, as the planner's first iteration calls it).", "",
        "Q1 = the ILP's objective, the predicted step latency of its placement-oblivious model, "
        "in **ms** (a prediction). 'from': where the answer came from (solver = the MIP; lp = "
        "HiGHS's LP relaxation, proven when integral; incumbent = coordinate descent). "
        "'MIP s': the MIP solver's own seconds (empty when the LP proved the optimum first); "
        "'wall s': the whole solve, build excluded.", "",
        "| cell | mesh | solver | status | Q1 ms | bound ms | gap | from | MIP s | wall s | layouts |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['cell']} | {r['mesh']} | {r['solver']} | error: {r['error']} "
                         f"| | | | | | | |")
            continue
        bound = "" if r["bound_ms"] is None else f"{r['bound_ms']:.3f}"
        gap = "" if r["gap"] is None else f"{100 * r['gap']:.2f}%"
        mip = "" if r["mip_s"] is None else f"{r['mip_s']:.2f}"
        lines.append(f"| {r['cell']} | {r['mesh']} | {'CBC' if r['solver'] == 'cbc' else 'HiGHS'} "
                     f"| {r['status']} | {r['q1_ms']:.3f} | {bound} | {gap} | {r['answer_from']} "
                     f"| {mip} | {r['wall_s']:.2f} | {r['layouts']} |")
    # summary: per cell, how often each solver proved the optimum, and its worst excess
    lines += ["", "Summary per cell (excess = Q1 over the better of the two on that mesh):", ""]
    for cell in dict.fromkeys(r["cell"] for r in data["rows"]):
        rows = [r for r in data["rows"] if r["cell"] == cell and "error" not in r]
        best = {}
        for r in rows:
            best[r["mesh"]] = min(best.get(r["mesh"], float("inf")), r["q1_ms"])
        parts = []
        for s in SOLVERS:
            mine = [r for r in rows if r["solver"] == s]
            proven = sum(r["status"] == "OPTIMAL" for r in mine)
            worst = max((r["q1_ms"] / best[r["mesh"]] - 1 for r in mine), default=0.0)
            parts.append(f"{'CBC' if s == 'cbc' else 'HiGHS'} proved {proven} of {len(mine)} "
                         f"meshes, worst excess {100 * worst:.2f}%")
        lines.append(f"- {cell}: " + "; ".join(parts) + ".")
    lines += ["", "Reproduce: `python -m benchmarks.sharding_solvers --force`."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=20.0,
                    help="wall-clock seconds per solve (default: the planner's ilp_time_s, 20)")
    ap.add_argument("--force", action="store_true", help="re-run the instances already done")
    a = ap.parse_args(argv)
    path = OUT + ".json"
    data = {"rows": [], "limit_s": a.limit}
    if os.path.exists(path) and not a.force:
        data = json.load(open(path))
        if data.get("limit_s") != a.limit:
            raise SystemExit(f"{path} was run at --limit {data.get('limit_s')}; pass --force to "
                             f"re-run at {a.limit}")
    data["machine"] = machine_info()
    data["commit"] = git_state()["git_commit"][:7]
    done = {r["cell"] for r in data["rows"]}
    for model, res, frames, target in INSTANCES:
        cell = f"{model}_{res}-{frames}f_{target}"
        if cell in done:
            continue
        data["rows"] += run_instance(model, res, frames, target, a.limit)
        with atomic_open(path) as f:
            json.dump(data, f, indent=1)
    with atomic_open(OUT + ".md") as f:
        f.write(write_md(data))
    print(f"wrote {OUT}.json and .md")


if __name__ == "__main__":
    main()
