"""Does a refactor leave the plans alone? The same grid cells planned by two commits of this
repository, with the same budget, seed and seeds (the grid's ``run_cell`` call), compared field
by field: mesh, layout, device order and Q2's predicted step.

    # each commit in its own worktree and venv (its own ``aoizora``), one cell at a time:
    /path/to/worktree/.venv/bin/python benchmarks/refactor_invariance.py run \
        --cell wan2.1-1.3b:480p:21:v5e-8 --budget 240 --out DIR/LABEL_CELL.json
    python -m benchmarks.refactor_invariance compare DIR --before LABEL --after LABEL \
        [--md benchmarks/results/refactor_invariance.md]

``run`` imports only ``aoizora`` (whichever the interpreter has installed), so the same script
drives an old and a new commit. Q2 is "predicted (Q2)" at the commit that planned; the check is
that the two commits predict, not that either is right. Equality of Q2 is to 0.01 ms.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from aoizora.extract.atomic_io import atomic_write

TOL_S = 1e-5   # 0.01 ms


def run(cell: str, budget_s: float, out: Path, seed: int = 0) -> dict:
    import aoizora  # noqa: F401 -- sets libtpu's environment first
    from aoizora.builtin import builtin_job, expert_seed_layouts
    from aoizora.planner import plan as make_plan

    model, res, frames, target = cell.split(":")
    job = builtin_job(model, res, int(frames), target)
    t = time.perf_counter()
    p = make_plan(job.fn, *job.args, target=job.target, time_budget_s=budget_s, seed=seed,
                  seed_layouts=expert_seed_layouts(job), workers=2)
    src = Path(aoizora.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    d = {"cell": cell, "budget_s": budget_s, "seed": seed, "commit": commit,
         "wall_s": round(time.perf_counter() - t, 1), "mesh": p.mesh,
         "layout": p.layout.to_json(), "device_order": list(p.device_order),
         "q2_step_s": p.predicted["step_s"], "status": p.status,
         "planning_time_s": p.planning_time_s, "iterations": len(p.iterations),
         "time_limited": p.time_limited}
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(d, indent=1, default=str))
    return d


def _same_layout(a: dict, b: dict) -> bool:
    a, b = dict(a), dict(b)
    a.pop("name", None)
    b.pop("name", None)
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def compare(directory: Path, before: str, after: str) -> tuple[str, bool]:
    rows, ok_all = [], True
    for fb in sorted(directory.glob(f"{before}_*.json")):
        fa = directory / fb.name.replace(f"{before}_", f"{after}_", 1)
        if not fa.exists():
            continue
        b, a = json.loads(fb.read_text()), json.loads(fa.read_text())
        same = {"mesh": a["mesh"] == b["mesh"], "layout": _same_layout(a["layout"], b["layout"]),
                "device order": a["device_order"] == b["device_order"],
                "Q2": abs(a["q2_step_s"] - b["q2_step_s"]) <= TOL_S}
        ok = all(same.values())
        ok_all &= ok
        rows.append(f"| {b['cell']} | {b['commit'][:10]} | {a['commit'][:10]} | {b['mesh']} | "
                    f"{b['q2_step_s'] * 1e3:.2f} | {a['q2_step_s'] * 1e3:.2f} | "
                    + " | ".join("yes" if v else "**no**" for v in same.values())
                    + f" | {b['planning_time_s']:.0f} / {a['planning_time_s']:.0f} |")
    head = ("| cell | before | after | mesh (before) | Q2 before (ms) | Q2 after (ms) | same mesh "
            "| same layout | same device order | Q2 within 0.01 ms | planning s (before / after) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(rows) + "\n", ok_all


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--cell", required=True, help="model:resolution:frames:target")
    r.add_argument("--budget", type=float, default=240.0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("dir", type=Path)
    c.add_argument("--before", required=True)
    c.add_argument("--after", required=True)
    c.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        d = run(a.cell, a.budget, a.out, a.seed)
        print(json.dumps({k: d[k] for k in ("cell", "commit", "mesh", "q2_step_s", "wall_s")}))
        return 0
    table, ok = compare(a.dir, a.before, a.after)
    print(table)
    if a.md:
        atomic_write(a.md, table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
