"""The PyTorch cells of the GPU grid (issue 49): diffusers' video transformers planned for the
GPU targets by ``aoizora.plan_torch``, against every valid xDiT configuration in xDiT's rank
order, diffusers' ``ContextParallelConfig`` and PipeFusion (``aoizora.torch_compare``). Every
model is built on the meta device (no weights; ``benchmarks.torch_models`` states each model's
config and its native 480p latent shape), batch 2 (the CFG pair). Every latency is predicted by
Q2 (GPU network model + flash-attention kernel model) on DTensor evidence under a fake process
group, not measured: nothing runs on a GPU.

Per cell (``run_cell``): the plan (``plan_torch`` with every xDiT configuration that is one
program -- PipeFusion is not, see ``aoizora.models.xdit`` -- as a seed, beside the sharding ILP's
layouts), and ``compare_torch``'s rows. Fields:
- ``plan``: mesh, layout, device order, ``step_s`` (its solved placement), ``default_order_step_s``
  (the same layout in device-id order), statuses of both certificates, ``planning_s``;
- ``best_xdit``: the least ``step_s`` among the ``xdit:`` rows (xDiT's rank order), with
  ``placed_step_s`` (the same layout under the placement CP-SAT) and its placement status;
- ``best_seed_xdit``: the same over the configurations the plan could choose (its seeds);
- ``speedup`` = best xDiT step / plan step (> 1: the plan is faster); ``speedup_over_seeds`` the
  same against ``best_seed_xdit``, which is never below 1 (``never_slower_than_seeds``): the plan
  prices its seeds like ``compare_torch`` does, and keeps the least;
- ``placement_gain_plan`` = default order / solved placement for the plan's layout,
  ``placement_gain_xdit`` = xDiT order / solved placement for the best xDiT configuration;
- ``rows``: every ``compare_torch`` row (evidence and placements dropped), ``error``: the one-line
  reason when the cell could not be planned.

    python benchmarks/gpu_grid_torch.py                       # every cell, resumable
    python benchmarks/gpu_grid_torch.py --cells wan2.1-1.3b/l40-8,cogvideox-5b/h100-8
    python benchmarks/gpu_grid_torch.py --report              # the table from the JSON only

A cell whose JSON exists for the checkout's commit is skipped (``--force``: run it again). The
table names the commit of the cells; run from a clean, committed checkout.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aoizora.extract.atomic_io import atomic_write  # noqa: E402
from benchmarks.machine import git_state, machine_info  # noqa: E402
from benchmarks.torch_models import MODELS, SHAPES, build_on_meta  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "gpu_grid_torch"
REPORT = OUT.parent / "gpu_grid_torch.md"
TARGETS = ("l40-8", "h100-8", "h100-16")
CELLS = [f"{m}/{t}" for t in TARGETS for m in MODELS]
LABEL = ("predicted by Q2 (GPU network model + flash-attention kernel model), not measured")
TIE = 1e-9


def _slim(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("placement",)}


def _best(rows: list[dict], keep=lambda r: True) -> dict | None:
    ok = [r for r in rows if r["name"].startswith("xdit:") and r.get("step_s") and keep(r)]
    return min(ok, key=lambda r: r["step_s"]) if ok else None


def run_cell(cell: str, *, budget_s: float = 900.0, seed: int = 0, small: bool = False,
             placement_time_s: float = 5.0, top_k: int = 2, ilp_time_s: float = 20.0,
             meshes: list[dict[str, int]] | None = None) -> dict[str, Any]:
    """One cell ``MODEL/TARGET`` (module docstring); never raises for a cell that cannot be
    planned (``error``). ``small``: the model at tiny widths (``benchmarks.torch_models``)."""
    from aoizora.extract.frontends.torch.aten_ir import build_torch_ir
    from aoizora.extract.frontends.torch.capture import capture
    from aoizora.extract.targets import get_target
    from aoizora.models.xdit import self_attention_layers, video_seq, xdit_configs, xdit_layout
    from aoizora.planning.torch_planner import plan_torch
    from aoizora.torch_compare import compare_torch

    name, target = cell.split("/")
    out: dict[str, Any] = {"cell": cell, "model": name, "target": target,
                           "shape": "small (tests)" if small else SHAPES[name], "batch": 2,
                           "label": LABEL, "unit": "seconds", "budget_s": budget_s,
                           "seed": seed, "git": git_state(), "machine": machine_info()}
    t0 = time.perf_counter()
    try:
        model, args, kwargs = build_on_meta(name, small)
        ep = capture(model, args, kwargs)
        ir = build_torch_ir(ep)
        tgt = get_target(target)
        att = ir.by_kind("attention")
        heads = att[0].params["shape"][1]
        configs = xdit_configs(tgt.num_devices, heads=heads, seq=video_seq(ir), batch=2,
                               layers=self_attention_layers(ir))
        seeds = [c for c in configs if c.pipefusion == 1]
        out["capture_s"] = time.perf_counter() - t0
        plan = plan_torch(model, args, tgt, kwargs=kwargs, time_budget_s=budget_s, seed=seed,
                          top_k=top_k, ilp_time_s=ilp_time_s, meshes=meshes,
                          placement_time_s=placement_time_s,
                          seed_layouts=[functools.partial(xdit_layout, config=c) for c in seeds],
                          max_candidates=len(seeds) + 4 * top_k)
        cmp = compare_torch(ep, (), tgt, plan=plan, configs=configs,
                            placement_time_s=placement_time_s, seed=seed)
    except Exception as e:  # noqa: BLE001 -- one line in the table, the cell kept
        out["error"] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        out["wall_s"] = time.perf_counter() - t0
        return out
    rows = [_slim(r) for r in cmp["rows"]]
    seed_names = {c.name for c in seeds}
    best = _best(rows)
    best_seed = _best(rows, lambda r: r["name"] in seed_names)
    step = plan.predicted["step_s"]
    dflt = plan.predicted.get("default_order_step_s")
    out.update(
        wall_s=time.perf_counter() - t0,
        plan={"mesh": plan.mesh, "layout": plan.layout.name or "ilp",
              "device_order": plan.device_order, "step_s": step,
              "compute_s": plan.predicted["compute_s"],
              "communication_s": plan.predicted["communication_s"],
              "default_order_step_s": dflt, "status": plan.status,
              "sharding_status": plan.certificates["sharding"].status,
              "placement_status": plan.certificates["placement"].status,
              "planning_s": plan.planning_time_s,
              "candidates": plan.iterations[0]["candidates"], "notes": plan.notes},
        best_xdit=best, best_seed_xdit=best_seed,
        speedup=best["step_s"] / step if best else None,
        speedup_over_seeds=best_seed["step_s"] / step if best_seed else None,
        never_slower_than_seeds=(best_seed is None
                                 or step <= min(best_seed["step_s"],
                                                best_seed["placed_step_s"]) * (1 + TIE)),
        placement_gain_plan=dflt / step if dflt else None,
        placement_gain_xdit=(best["step_s"] / best["placed_step_s"]
                             if best and best.get("placed_step_s") else None),
        xdit_configs=len(configs), seeds=len(seeds), rows=rows)
    return out


def _ms(v) -> str:
    return f"{v * 1e3:.1f}" if v else "n/a"


def _x(v) -> str:
    return f"{v:.3f}x" if v else "n/a"


def markdown(cells: list[dict]) -> str:
    """The table of the cells' JSON (module docstring)."""
    commits = sorted({(c.get("git") or {}).get("git_commit", "")[:12] for c in cells})
    ok = [c for c in cells if not c.get("error") and c.get("speedup")]
    sp = [c["speedup"] for c in ok]
    geo = math.exp(statistics.fmean(math.log(s) for s in sp)) if sp else None
    never = sum(1 for c in ok if c["speedup"] >= 1 - TIE)
    lines = [
        "# GPU grid, PyTorch cells: plan_torch vs xDiT (predicted by Q2)", "",
        f"Every ms is {LABEL}: Q2 on DTensor evidence under a fake process group "
        "(`benchmarks/gpu_grid_torch.py`); nothing ran on a GPU. One CFG denoising step "
        "(batch 2) of diffusers' transformer on the meta device, at each model's native 480p "
        "latent shape (`benchmarks/torch_models.py`). Produced by commit "
        f"{', '.join(commits) or '?'}.", "",
        "Plan: `plan_torch` (sharding ILP's layouts + every xDiT configuration that is one "
        "program, as seeds; placement CP-SAT; Q2). xDiT: every valid configuration "
        "(USP ulysses x ring, CFG, TP, PipeFusion) in xDiT's rank order; ring attention is "
        "priced as gathered keys, PipeFusion by a steady-state model from a stage's evidence "
        "(not a layout plan_torch can choose). Speedup = best xDiT / plan (> 1: plan faster). "
        "Placement gain = default (xDiT) order / solved placement, same layout.", "",
        "| cell | plan mesh (layout) | plan ms | best xDiT (xDiT order) | xDiT ms | speedup "
        "| best seed xDiT ms | vs seeds | placement gain: plan / best xDiT | statuses "
        "(sharding, placement) | planning s |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        if c.get("error"):
            lines.append(f"| {c['cell']} | cannot be planned: {c['error']} "
                         "| | | | | | | | | |")
            continue
        p, b, s = c["plan"], c.get("best_xdit") or {}, c.get("best_seed_xdit") or {}
        mesh = "x".join(f"{k}{v}" for k, v in p["mesh"].items())
        lines.append(
            f"| {c['cell']} | {mesh} ({p['layout']}) | {_ms(p['step_s'])} | "
            f"{b.get('name', 'n/a')} | {_ms(b.get('step_s'))} | {_x(c.get('speedup'))} | "
            f"{_ms(s.get('step_s'))} | {_x(c.get('speedup_over_seeds'))} | "
            f"{_x(c.get('placement_gain_plan'))} / {_x(c.get('placement_gain_xdit'))} | "
            f"{p['sharding_status']}, {p['placement_status']} | {p['planning_s']:.0f} |")
    lines += ["", f"Cells planned: {len(ok)} of {len(cells)}. Speedup over the best xDiT "
              f"configuration: geometric mean {_x(geo)}, median "
              f"{_x(statistics.median(sp) if sp else None)}; never slower in {never} of "
              f"{len(ok)} cells; never slower than its own seeds (the xDiT configurations it "
              f"could choose) in {sum(1 for c in ok if c['never_slower_than_seeds'])} of "
              f"{len(ok)}."]
    return "\n".join(lines) + "\n"


def _path(cell: str) -> Path:
    return OUT / (cell.replace("/", "_") + ".json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default=",".join(CELLS), help="MODEL/TARGET,... (default all)")
    ap.add_argument("--budget", type=float, default=900.0, help="plan_torch's seconds per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="run cells done at this commit again")
    ap.add_argument("--report", action="store_true", help="only write the table")
    a = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    commit = git_state()["git_commit"]
    for cell in ([] if a.report else a.cells.split(",")):
        path = _path(cell)
        if path.exists() and not a.force and \
                json.loads(path.read_text()).get("git", {}).get("git_commit") == commit:
            print(f"{cell}: done at {commit[:12]}, skipped", flush=True)
            continue
        res = run_cell(cell, budget_s=a.budget, seed=a.seed)
        atomic_write(path, json.dumps(res, indent=1, default=str) + "\n")
        print(f"{cell}: {res.get('error') or _x(res.get('speedup'))} "
              f"({res['wall_s']:.0f} s)", flush=True)
    done = [json.loads(_path(c).read_text()) for c in CELLS if _path(c).exists()]
    atomic_write(REPORT, markdown(done))
    print(markdown(done))


if __name__ == "__main__":
    main()
