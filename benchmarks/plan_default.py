"""The main job, measured: `aoizora plan` on a built-in workload, with every iteration recorded.

    python -m benchmarks.plan_default [--model wan2.1-1.3b --resolution 480p --frames 81
                                       --target v5e-8 --budget 600 --seed 0]

Writes benchmarks/results/plan_<model>_<workload>_<target>.json (``ilp_only_...`` with
``--no-seeds``: the ILP's layouts alone; the plan itself, loadable with
aoizora.load_plan) and .md (summary, iterations, which decisions the feedback changed and what
that gained by Q2). Latencies are predictions (Q2 link-load model on the compiled TPU program);
times are wall-clock seconds on this machine, whose load is recorded.
"""

from __future__ import annotations

from benchmarks.machine import git_state, machine_info
import argparse
import os
import re
import time
from pathlib import Path

import aoizora  # noqa: F401  (sets libtpu's environment first)
from aoizora.builtin import builtin_job, expert_seed_layouts
from aoizora.planning.progress import ConsoleProgress
from aoizora.report import format_plan
from aoizora.extract.atomic_io import atomic_write

RESULTS = Path(__file__).parent / "results"


def machine() -> dict:
    info = {**machine_info(), **git_state()}
    info["loadavg_start"] = info["loadavg"]
    return info


def _no_source(words: str) -> str:
    """An op's layout in words without its trailing "[key file:line (function)]"."""
    return re.sub(r" \[[^\]]*\]$", "", words)


def feedback_gain(plan) -> list[str]:
    """What the feedback changed, and the Q2 of the candidates compiled before and after it."""
    out = []
    best_so_far = None
    for rec in plan.iterations:
        qs = [c["q2_step_s"] for c in rec["candidates"] if c.get("q2_step_s")]
        for ch in rec.get("decisions_changed", []):
            mesh = "x".join(f"{k}{v}" for k, v in ch["mesh"].items())
            out.append(f"iteration {rec['iteration']}, mesh {mesh}: {len(ch['after'])} op layouts "
                       f"changed after the {ch.get('why', 'feedback')}, e.g. "
                       f"'{_no_source(ch['before'][0])}' -> '{_no_source(ch['after'][0])}'"
                       if ch["after"] and ch["before"] else f"iteration {rec['iteration']}: {ch}")
        if qs:
            it_best = min(qs)
            if best_so_far is not None and it_best < best_so_far:
                out.append(f"iteration {rec['iteration']}: best Q2 {it_best * 1e3:.3f} ms, "
                           f"{100 * (1 - it_best / best_so_far):.1f}% below the best before it "
                           f"({best_so_far * 1e3:.3f} ms)")
            best_so_far = it_best if best_so_far is None else min(best_so_far, it_best)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="wan2.1-1.3b")
    ap.add_argument("--resolution", default="480p")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--target", default="v5e-8")
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-seeds", action="store_true",
                    help="do not price the expert configurations as seed layouts (as aoizora plan --no-seeds)")
    a = ap.parse_args(argv)
    job = builtin_job(a.model, a.resolution, a.frames, a.target)
    info = machine()
    t0 = time.perf_counter()
    seeds = [] if a.no_seeds else expert_seed_layouts(job)
    p = aoizora.plan(job.fn, *job.args, target=job.target, time_budget_s=a.budget, seed=a.seed,
                     seed_layouts=seeds, progress=ConsoleProgress())
    wall = time.perf_counter() - t0
    info["loadavg_end"] = os.getloadavg()
    stem = (f"{'ilp_only' if a.no_seeds else 'plan'}_{job.model.name}_{job.workload.name}_"
            f"{job.target.short_name}")
    RESULTS.mkdir(exist_ok=True)
    p.save(str(RESULTS / f"{stem}.json"))
    gains = feedback_gain(p)
    md = [f"# `aoizora plan{' --no-seeds' if a.no_seeds else ''}`: {job.describe()}", "",
          f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['platform']}, jax {info['jax']}, "
          f"no TPU; load average {info['loadavg_start'][0]:.1f} at start, "
          f"{info['loadavg_end'][0]:.1f} at the end; {info['date']}; commit "
          f"{info['git_commit'][:7] or 'unknown'}"
          f"{' with modified ' + ', '.join(info['git_modified_files']) if info['git_modified_files'] else ''}.",
          f"Budget {a.budget:g} s, seed {a.seed}, "
          f"{'no seed layouts' if a.no_seeds else 'expert configurations priced as seed layouts'}; "
          f"wall-clock {wall:.1f} s.",
          "Latencies: predicted by the Q2 link-load model on the compiled XLA:TPU program "
          "(nothing ran on a TPU).", "", "```", format_plan(p), "```", "",
          "## Iterations", ""]
    for rec in p.iterations:
        md.append(f"- iteration {rec['iteration']} (elapsed {rec.get('elapsed_s', '?')} s):")
        for c in rec["candidates"]:
            q2 = f"{c['q2_step_s'] * 1e3:.3f} ms" if c.get("q2_step_s") else "-"
            qd = (f"{c['q2_default_order_step_s'] * 1e3:.3f} ms"
                  if c.get("q2_default_order_step_s") else "-")
            q1 = f"Q1 {c['q1_s'] * 1e3:.3f} ms" if c.get("q1_s") is not None else "seed layout"
            md.append(f"  - mesh {c['mesh']} {c['layout']}: {q1}, fits "
                      f"{c['fits_hbm']}, compile {c['compile_s']} s, Q2 {q2} (default order {qd}), "
                      f"placement {c['placement_status']}{', ' + c['error'] if c.get('error') else ''}")
        for ch in rec["changes"]:
            md.append(f"  - {ch}")
    md += ["", "## What the feedback changed", ""]
    md += [f"- {g}" for g in gains] or ["- nothing in this run"]
    atomic_write(RESULTS / f"{stem}.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
