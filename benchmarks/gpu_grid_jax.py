"""The JAX cells of the GPU grid (issue 49): built-in DiTs planned for the GPU targets from
XLA:GPU ahead-of-time evidence, against today's expert configurations and JAX's default device
order. Every latency is predicted by Q2 (the link-load model, NCCL's effective link bandwidths,
compute priced at the GPU's datasheet peak: XLA:GPU gives no cycle estimates); nothing ran on a
GPU. Needs the ``gpu`` extra (``pip install -e '.[gpu]'``).

Per cell (``aoizora.compare.compare``): ``aoizora`` (the plan), ``aoizora-layout/default-order``
(the plan's layout in device-id order: placement alone), ``alpa-logical`` and every
``expert:NAME`` (default order). ``speedup_over_best_expert`` = best expert / plan (> 1: the plan
is faster); ``placement_gain`` = default order / planned order for the plan's layout.
The xDiT baselines (USP, CFG, PipeFusion in xDiT's rank order) are the PyTorch frontend's grid.

    python benchmarks/gpu_grid_jax.py --cells wan2.1-1.3b/480p-81f/h100-8 --compiles 4

A cell's budget is a number of candidate compiles (``--compiles``; ``--budget`` seconds of wall
clock is its guard), so the machine's load does not decide the plan.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")     # XLA:GPU compiles need no backend

from aoizora.builtin import builtin_job  # noqa: E402
from aoizora.compare import compare  # noqa: E402
from benchmarks.machine import git_state  # noqa: E402

OUT = Path(__file__).parent / "results" / "gpu_grid_jax"
CELLS = [f"{m}/480p-81f/{t}" for m in ("wan2.1-1.3b", "wan2.1-14b")
         for t in ("l40-8", "h100-8", "h100-16")]


def run_cell(cell: str, budget_s: float, seed: int, compiles: int | None = None) -> dict:
    """One cell's rows (evidence dropped) with the machine and versions."""
    model, wl, target = cell.split("/")
    res, frames = wl.split("-")
    job = builtin_job(model, res, int(frames.rstrip("f")), target)
    t0 = time.perf_counter()
    out = compare(job, time_budget_s=budget_s, seed=seed, compiles=compiles)
    plan = out.pop("plan")
    rows = out["rows"]
    mine = next(r for r in rows if r["name"] == "aoizora")
    dflt = next((r for r in rows if r["name"] == "aoizora-layout/default-order"), {})
    out.update(cell=cell, budget_s=budget_s, compiles=compiles, seed=seed,
               wall_s=time.perf_counter() - t0,
               placement_gain=(dflt.get("step_s") / mine["step_s"]
                               if dflt.get("step_s") and mine.get("step_s") else None),
               plan_status=plan.status, plan_notes=plan.notes, plan_mesh=plan.mesh,
               plan_device_order=plan.device_order, source="predicted by Q2 on XLA:GPU evidence",
               git=git_state(), machine={"nproc": os.cpu_count(), "cpu": platform.processor(),
                        "load": os.getloadavg()})
    return out


def markdown(cells: list[dict]) -> str:
    commits = sorted({_commit(c) for c in cells})
    lines = ["# GPU grid, JAX cells: plan vs experts and default order (predicted by Q2)", "",
             "Q2 on XLA:GPU ahead-of-time evidence (`benchmarks/gpu_grid_jax.py`); nothing ran "
             "on a GPU. Step latency of one CFG denoising step, ms. Produced by commit "
             f"{', '.join(commits)}"
             + (" (`unrecorded`: a cell run before cells recorded their commit)."
                if "unrecorded" in commits else ".")
             + " Status: OPTIMAL when both solvers (the sharding ILP and the placement "
               "CP-SAT) proved the plan's answers optimal.", "",
             "| cell | commit | budget | plan mesh | plan ms | default order ms | placement gain "
             "| best expert | expert ms | speedup over best expert | status |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        r = {x["name"]: x for x in c["rows"]}
        me, d = r["aoizora"], r.get("aoizora-layout/default-order", {})
        be = r.get(c["best_expert"] or "", {})
        ms = lambda v: f"{v * 1e3:.2f}" if v else "n/a"
        budget = (f"{c['compiles']} compiles" if c.get("compiles")
                  else f"{c['budget_s']:.0f} s of wall clock")
        lines.append(f"| {c['cell']} | {_commit(c)} | {budget} | {c['plan_mesh']} | "
                     f"{ms(me.get('step_s'))} | "
                     f"{ms(d.get('step_s'))} | {c['placement_gain'] or 0:.3f}x | "
                     f"{c['best_expert'] or 'none fits in HBM'} | {ms(be.get('step_s'))} | "
                     + (f"{c['speedup_over_best_expert']:.3f}x" if c['speedup_over_best_expert']
                        else "n/a") + f" | {c['plan_status']} |")
    return "\n".join(lines) + "\n"


def _commit(cell: dict) -> str:
    """The commit a cell ran at, or "unrecorded"."""
    return str((cell.get("git") or {}).get("git_commit") or "unrecorded")[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--budget", type=float, default=1800.0, help="wall-clock guard, seconds")
    ap.add_argument("--compiles", type=int, default=4, help="candidate compiles per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="run cells not done at this commit")
    a = ap.parse_args()
    commit = git_state()["git_commit"][:12]
    OUT.mkdir(parents=True, exist_ok=True)
    for cell in a.cells.split(","):
        path = OUT / (cell.replace("/", "_") + ".json")
        if path.exists() and (not a.force or _commit(json.loads(path.read_text())) == commit):
            continue
        path.write_text(json.dumps(run_cell(cell, a.budget, a.seed, a.compiles), indent=2,
                                   default=str) + "\n")
    done = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]
    (OUT.parent / "gpu_grid_jax.md").write_text(markdown(done))
    print(markdown(done))


if __name__ == "__main__":
    main()
