"""What the sharding ILP is worth on its own: each grid cell planned with no seed layouts.

    python -m benchmarks.ilp_only [--cells NAME,...] [--budget S] [--seed N] [--force] [--tag T]
    python -m benchmarks.ilp_only --report        # the table, from the JSON written so far
    python -m benchmarks.ilp_only --cells NAME,... --compiles 3 --experts --tag T
                                                  # experts priced in the same run
    python -m benchmarks.ilp_only --cells NAME,... --compiles 4 --reference-dir DIR --tag T
                                                  # against a grid run (its tuned experts)
    python -m benchmarks.ilp_only --seeds ...     # the control: the same call with the experts
                                                  # as seeds (benchmarks.seeded_vs_ilp)

For each cell of ``benchmarks.grid.grid_cells()``: ``aoizora.plan`` with ``seed_layouts=[]`` (as
``aoizora plan --no-seeds``), so every layout it compiles is one of the ILP's; its plan priced like
the grid's rows -- Q2 (``formulation.latency.predict_step``) and the reference simulator
(``benchmarks.simulator``) on the plan's compiled evidence under the plan's device order. It is
set against the cell's committed grid JSON (``benchmarks/results/grid/<cell>.json``): the best
expert configuration by simulated step, and the plan (which had the experts as seeds).

With ``--experts`` every expert configuration of the cell is compiled and priced in the same run,
by the same code (``benchmarks.grid._expert_row``: JAX's default order, its published tiles), and
the best of them is the reference instead (``reference["source"] == "this run"``): the rows of
one JSON then come from one commit.

``speedup_over_best_expert`` = best expert's simulated step / ILP-only simulated step (> 1: the ILP's
own layout is faster); ``speedup_over_plan`` = plan's simulated step / ILP-only's. A cell
"wins or ties" when ``speedup_over_best_expert >= 0.99`` (within 1%).

Every latency is a prediction (Q2 or the simulator on the compiled XLA:TPU program); nothing runs
on a TPU. Results: ``benchmarks/results/ilp_only/<tag>/<cell>.json`` (``--tag``: e.g. the code
version, "after-hint-fix") and ``benchmarks/results/ilp_only.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import aoizora
from aoizora.builtin import builtin_job, expert_seed_layouts
from aoizora.extract.aot_compile import keeping_hlo, read_hlo
from aoizora.extract.evidence_cache import CacheError, EvidenceCache, open_cache
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.planner import Candidate
from benchmarks.grid import RESULTS as GRID_RESULTS, grid_cells
from benchmarks.machine import git_state, machine_info
from benchmarks.simulator import LABEL as SIM_LABEL, Simulator
from aoizora.extract.atomic_io import atomic_write

RESULTS = Path(__file__).resolve().parent / "results" / "ilp_only"
SEEDED = Path(__file__).resolve().parent / "results" / "seeded_plan"   # --seeds' runs
REPORT = Path(__file__).resolve().parent / "results" / "ilp_only.md"
TIE = 0.99          # within 1% of the best expert counts as a tie


def _grid_reference(cell_name: str, directory: Path | None = None) -> dict[str, Any]:
    """The grid cell's best expert (as published) and plan, simulated and Q2 steps (seconds),
    and, where the cell was run with tuned experts, its best tuned expert: from ``directory``
    (``--reference-dir``: a grid run, e.g. ``grid_tuned/``) when given, else from the
    independent grid (``grid_independent/``: the simulator's own compute on the HLO) when it
    has the cell, else the grid."""
    if directory is not None:
        path = directory / f"{cell_name}.json"
    else:
        ind = GRID_RESULTS.parent / "grid_independent" / f"{cell_name}.json"
        path = ind if ind.exists() else GRID_RESULTS / f"{cell_name}.json"
    g = json.loads(path.read_text())
    rows = {r["name"]: r for r in g["rows"]}
    experts = [r for r in g["rows"] if r["name"].startswith("expert:") and r.get("sim_step_s")]
    best = min(experts, key=lambda r: r["sim_step_s"])
    plan = rows.get("aoizora", {})
    # the best tuned expert at its better placement: JAX's default order or the one our
    # placement CP-SAT solves for it
    tuned_steps = [rows.get(n, {}).get("sim_step_s") for n in
                   ("best-tuned-expert", "best-tuned-expert/solved-placement")]
    tuned_steps = [v for v in tuned_steps if v]
    return {"best_expert": best["name"][len("expert:"):], "best_expert_sim_s": best["sim_step_s"],
            "best_expert_q2_s": best["q2_step_s"], "plan_sim_s": plan.get("sim_step_s"),
            "plan_q2_s": plan.get("q2_step_s"),
            "best_tuned_expert": g.get("best_tuned_expert"),
            "best_tuned_expert_sim_s": min(tuned_steps) if tuned_steps else None,
            "grid_commit": g.get("machine_start", {}).get("git_commit", "")[:12],
            "source": f"{path.parent.name}/{path.name}"}


# the reference until the experts priced in the same run replace it (``--experts``)
_NO_REFERENCE = {"best_expert": None, "best_expert_sim_s": None, "best_expert_q2_s": None,
                 "plan_sim_s": None, "plan_q2_s": None, "grid_commit": "", "source": "this run"}


def run_cell(cell, budget_s: float, seed: int, compiles: int | None = None,
             experts: bool = False, reference_dir: Path | None = None,
             cache: EvidenceCache | None = None, seeds: bool = False) -> dict[str, Any]:
    """Plan one cell with no seeds (``seeds``: with the experts' layouts as seeds, as the grid's
    planner column) and price the plan; never raises for a failing plan.
    ``compiles``: the planner's budget in candidate compiles (``budget_s`` then its guard; a
    compile ``cache`` gives counts as one);
    ``experts``: price every expert configuration in this run too (the module docstring);
    ``reference_dir``: the grid run whose cell is the reference (``_grid_reference``)."""
    job = builtin_job(cell.model, cell.resolution, cell.frames, cell.target)
    out: dict[str, Any] = {"cell": cell.name, "budget_s": budget_s, "compiles": compiles,
                           "seed": seed, "seeds": seeds,
                           "machine": machine_info(), "git": git_state(),
                           "labels": {"sim": SIM_LABEL, "q2": "predicted (Q2)"}, "unit": "seconds",
                           "reference": (_NO_REFERENCE if experts
                                         else _grid_reference(cell.name, reference_dir))}
    cands: list[Candidate] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, keeping_hlo(tmp):
        try:
            p = aoizora.plan(job.fn, *job.args, target=job.target, time_budget_s=budget_s,
                             seed=seed, seed_layouts=expert_seed_layouts(job) if seeds else [],
                             on_candidate=cands.append, compiles=compiles, cache=cache)
        except Exception as e:  # noqa: BLE001 -- recorded
            out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return out
        if experts:
            out["reference"] = _expert_reference(out, job)
        return _priced_plan(out, p, cands, job, t0)


def _expert_reference(out: dict[str, Any], job) -> dict[str, Any]:
    """Every expert configuration compiled in JAX's default order and priced by Q2 and the
    simulator on its own HLO (``benchmarks.grid._expert_row``), in this run; the best by
    simulated step is the reference. The rows are kept in ``out["experts"]``."""
    from benchmarks.grid import _Pricer, _expert_row
    from aoizora.models.experts import expert_layouts

    net = Network.from_target(job.target)
    pricer, errors = _Pricer(job.target, net), []
    rows = [_expert_row(ex, job, net, pricer, errors)
            for ex in expert_layouts(job.model, job.workload, job.target)]
    out["experts"] = rows
    out["expert_errors"] = errors
    priced = [r for r in rows if r.get("sim_step_s")]
    if not priced:
        return {**out["reference"], "source": "grid (no expert priced in this run)"}
    best = min(priced, key=lambda r: r["sim_step_s"])
    return {"best_expert": best["name"][len("expert:"):], "best_expert_sim_s": best["sim_step_s"],
            "best_expert_q2_s": best["q2_step_s"], "plan_sim_s": None, "plan_q2_s": None,
            "grid_commit": out["git"].get("git_commit", "")[:12], "source": "this run"}


def _priced_plan(out: dict[str, Any], p, cands: list, job, t0: float) -> dict[str, Any]:
    """``out`` with the plan and its prices: Q2 and the simulator (its own compute model on the
    plan's HLO, kept while planning) under the plan's device order."""
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    best = next((c for c in cands if c.solution.layout is p.layout and c.evidence is not None), None)
    out["plan"] = {"mesh": p.mesh, "device_order": p.device_order, "status": p.status,
                   "layout_in_words": p.layout_in_words, "planning_time_s": p.planning_time_s,
                   "q2_planner_step_s": p.predicted["step_s"], "candidates": len(cands),
                   "layout_name": p.layout.name}
    if best is None:
        out["error"] = "the plan's compiled evidence was not among the candidates"
        return out
    net = Network.from_target(job.target)
    q = predict_step(best.evidence, p.device_order, net)
    text = read_hlo(best.evidence)
    s = Simulator(job.target, net).run(best.evidence, p.device_order,
                                       hlo=parse_hlo_module(text) if text is not None else None)
    out["sim_hlo"] = text is not None
    out["candidates"] = [dict(c.summary(), words=list(c.solution.words)) for c in cands]
    ref = out["reference"]
    out.update(q2_step_s=q.step_s, sim_step_s=s.step_s, sim_compute_s=s.compute_s,
               speedup_over_best_expert=(ref["best_expert_sim_s"] / s.step_s
                                         if ref["best_expert_sim_s"] else None),
               speedup_over_plan=(ref["plan_sim_s"] / s.step_s) if ref["plan_sim_s"] else None,
               speedup_over_best_tuned_expert=(ref["best_tuned_expert_sim_s"] / s.step_s
                                               if ref.get("best_tuned_expert_sim_s") else None))
    return out


def report(tags: Sequence[str]) -> str:
    """The markdown table over every tag's cells (one row per cell and tag)."""
    lines = ["# The sharding ILP's own layouts (no seed layouts) against the grid", "",
             "Each cell planned by `aoizora.plan(..., seed_layouts=[])` "
             "(`python -m benchmarks.ilp_only`), priced on its compiled XLA:TPU program under its "
             f"device order: **{SIM_LABEL}** (sim) and Q2. Best expert and plan: the committed grid "
             "cell (`benchmarks/results/grid/`), simulated, unless marked (this run): every "
             "expert compiled and simulated in the same run, at the same commit "
             "(`--experts`); x best tuned expert: against the best tuned expert of a grid run "
             "with tuned experts (`--reference-dir`, e.g. `grid_tuned/`; the tag says its "
             "commit). Nothing ran on a TPU.", "",
             "| cell | code | ILP-only mesh | ILP-only sim (ms) | Q2 (ms) | best expert | its sim (ms) "
             "| x best expert | x best tuned expert | plan sim (ms) | x plan | budget (s) | compiled "
             "| load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for tag in tags:
        n = wins = 0
        tuned: list[float] = []
        for f in sorted((RESULTS / tag).glob("*.json")):
            d = json.loads(f.read_text())
            ref = d["reference"]
            if "sim_step_s" not in d or d.get("speedup_over_best_expert") is None:
                lines.append(f"| {d['cell']} | {tag} | - | {d.get('error', 'no expert priced')} "
                             f"| | {ref['best_expert'] or '-'} | "
                             f"{(ref['best_expert_sim_s'] or 0) * 1e3:.2f} | | | | | "
                             f"{d['budget_s']:g} |")
                continue
            n += 1
            wins += d["speedup_over_best_expert"] >= TIE
            if d.get("speedup_over_best_tuned_expert"):
                tuned.append(d["speedup_over_best_tuned_expert"])
            mesh = "x".join(str(v) for v in d["plan"]["mesh"].values())
            xp = f"{d['speedup_over_plan']:.3f}" if d["speedup_over_plan"] else "-"
            xt = d.get("speedup_over_best_tuned_expert")
            xt = f"{xt:.3f}" if xt else "-"
            lines.append(f"| {d['cell']} | {tag} | {mesh} | {d['sim_step_s'] * 1e3:.2f} | "
                         f"{d['q2_step_s'] * 1e3:.2f} | {ref['best_expert']}"
                         f"{' (this run)' if ref.get('source') == 'this run' else ''} | "
                         f"{ref['best_expert_sim_s'] * 1e3:.2f} | "
                         f"{d['speedup_over_best_expert']:.3f} | {xt} | "
                         f"{(ref['plan_sim_s'] or 0) * 1e3:.2f} | {xp} | {d['budget_s']:g} | "
                         f"{d['plan']['candidates']} | {_load(d)} |")
        vs_tuned = ""
        if tuned:
            vs_tuned = (f" Against the best tuned expert: at least 0.98x in "
                        f"**{sum(x >= 0.98 for x in tuned)} of {len(tuned)}**, below 0.90x in "
                        f"{sum(x < 0.90 for x in tuned)}, geometric mean "
                        f"{statistics.geometric_mean(tuned):.3f}x.")
        summary.append(f"- `{tag}`: {n} cells priced; the ILP's own layout is within 1% of the "
                       f"best expert or faster in **{wins} of {n}** (simulated).{vs_tuned}")
    note = ["", "compiled: candidate layouts the planner compiled within the budget; load: the "
            "machine's 1-minute load average when the cell started (2 cores; the planner's budget "
            "is wall-clock, so a loaded machine compiles fewer candidates and feeds back less).", ""]
    return "\n".join(lines[:4] + summary + note + lines[4:] + differences(tags)) + "\n"


def _attention_words(words: Sequence[str]) -> str:
    """The layout's attention decisions, one phrase per attention op (file locations dropped)."""
    att = [w.split(" [")[0] for w in words if "attention:" in w.split(" [")[0]]
    return "; ".join(dict.fromkeys(att)) or "-"


def _latest(tags: Sequence[str]) -> dict[str, tuple[str, dict]]:
    """Each cell's latest result (by the run's date) that priced it with its experts in the same
    run, cell name -> (tag, result)."""
    runs = []
    for tag in tags:
        for f in sorted((RESULTS / tag).glob("*.json")):
            d = json.loads(f.read_text())
            if "sim_step_s" in d and d["reference"].get("source") == "this run":
                runs.append((d.get("machine", {}).get("date", ""), tag, d))
    return {d["cell"]: (tag, d) for _date, tag, d in sorted(runs, key=lambda r: (r[0], r[1]))}


def _difference_row(tag: str, d: dict) -> str:
    """One cell: the ILP's layout against the best expert, and what each model says of them."""
    best = next(e for e in d["experts"]
                if e["name"] == "expert:" + d["reference"]["best_expert"])
    mesh = "x".join(str(v) for v in d["plan"]["mesh"].values())
    emesh = "x".join(str(v) for v in (best.get("mesh") or {}).values())
    q2_prefers = "ILP" if d["q2_step_s"] < best["q2_step_s"] else "expert"
    sim_comm = d["sim_step_s"] - d["sim_compute_s"]
    ms = lambda x: f"{x * 1e3:.1f}"  # noqa: E731
    return (f"| {d['cell']} | {tag} | {mesh}: {_attention_words(d['plan']['layout_in_words'])} | "
            f"{best['name'][len('expert:'):]} {emesh}: {best.get('description') or '-'} | "
            f"{ms(d['q2_step_s'])} / {ms(best['q2_step_s'])} | {q2_prefers} | "
            f"{ms(d['sim_compute_s'])} + {ms(sim_comm)} | "
            f"{ms(best['sim_compute_s'])} + {ms(best['sim_communication_s'])} | "
            f"{d['speedup_over_best_expert']:.3f} |")


def differences(tags: Sequence[str]) -> list[str]:
    """The section that says, per cell, what the ILP's own layout does differently from the best
    expert (mesh, attention scheme) and which way each model ranks the two."""
    latest = _latest(tags)
    if not latest:
        return []
    return ["", "## What the ILP's layout does differently (latest run with experts per cell)", "",
            "ILP: the ILP-only plan's mesh and attention decisions; expert: the best expert by "
            "simulated step, priced in the same run. Q2 (predicted, the planner's price) of the "
            "ILP's plan / of the expert, and which Q2 prefers; sim: simulated compute + exposed "
            "communication, ms. Nothing ran on a TPU.", "",
            "| cell | tag | ILP layout | best expert | Q2 ms (ILP / expert) | Q2 prefers | "
            "ILP sim ms | expert sim ms | x best expert (sim) |",
            "|---|---|---|---|---|---|---|---|---|"] + [
        _difference_row(*latest[c]) for c in sorted(latest)]


def _load(d: dict) -> str:
    la = d.get("machine", {}).get("loadavg") or d.get("machine", {}).get("loadavg_start")
    return f"{la[0]:.1f}" if la else "?"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="", help="comma-separated cell names (default: all)")
    ap.add_argument("--budget", type=float, default=240.0,
                    help="planning budget per cell, s (with --compiles: the wall clock's guard)")
    ap.add_argument("--compiles", type=int, default=None,
                    help="planning budget per cell in candidate compiles")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="after-hint-fix")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--experts", action="store_true",
                    help="compile and price every expert in the same run (the reference)")
    ap.add_argument("--cache-dir", default=None, metavar="DIR",
                    help="evidence cache every compile looks up first (benchmarks.grid's "
                         "--cache-dir; default: none, every compile runs)")
    ap.add_argument("--cache-limit-gb", type=float, default=20.0)
    ap.add_argument("--seeds", action="store_true",
                    help="plan with the experts' layouts as seeds (the control arm), into "
                         "benchmarks/results/seeded_plan/<tag>/")
    ap.add_argument("--reference-dir", default=None, metavar="DIR",
                    help="a grid run's results directory (e.g. benchmarks/results/grid_tuned) "
                         "whose cells are the reference, with their best tuned experts")
    a = ap.parse_args(argv)
    ref_dir = Path(a.reference_dir).resolve() if a.reference_dir else None
    try:
        cache = open_cache(a.cache_dir, int(a.cache_limit_gb * 1e9)) if a.cache_dir else None
    except CacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.report:
        want = set(filter(None, a.cells.split(",")))
        d = (SEEDED if a.seeds else RESULTS) / a.tag
        d.mkdir(parents=True, exist_ok=True)
        for cell in grid_cells():
            if (want and cell.name not in want) or ((d / f"{cell.name}.json").exists() and not a.force):
                continue
            print(f"[{cell.name}] planning {'with' if a.seeds else 'with no'} seeds, budget "
                  f"{a.budget:g} s", flush=True)
            out = run_cell(cell, a.budget, a.seed, a.compiles, a.experts, ref_dir, cache,
                           a.seeds)
            atomic_write(d / f"{cell.name}.json", json.dumps(out, indent=1, default=str) + "\n")
            print(f"[{cell.name}] {out.get('sim_step_s', out.get('error'))}", flush=True)
    tags = sorted(p.name for p in RESULTS.iterdir() if p.is_dir()) if RESULTS.exists() else []
    atomic_write(REPORT, report(tags))
    print(REPORT.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
