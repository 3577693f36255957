"""The workload grid: AoiZora's plan against every baseline, cell by cell, with the reference
simulator, given every program's compiled HLO, as the independent "simulated" column.

    python -m benchmarks.grid [--cells NAME,...] [--budget S] [--seed N] [--force] [--list]
    python -m benchmarks.grid --smoke            # one small cell, written to a temp dir (CI)
    python -m benchmarks.grid --cells NAME --budget 60 --out DIR --calibration-from CELL.json
                                                 # warm start from another cell's plan
    python -m benchmarks.grid --add-experts [--cells NAME,...]
                                                 # price expert configurations a written cell
                                                 # lacks, without planning again

A cell is (model, workload, target). In each cell:
- ``aoizora``: the plan (its layout, its placement), planned within ``--budget`` seconds;
- ``aoizora-layout/default-order``: the plan's layout under JAX's default device order;
- ``heuristic-placement``: the plan's layout placed by the best (by Q2, as a heuristic would
  choose) of the heuristic placement searches (``aoizora.solvers.placement_heuristics``), each
  given the same time limit the placement CP-SAT got (random search and annealing: the count of
  evaluations it buys, ``evaluation_budget``; the planner's first final-annealing run, when it
  runs, is this same annealing unless the time left cut it);
- ``alpa-logical``: the sharding ILP with fixed, placement-oblivious alpha-beta costs, its best
  layout over the candidate meshes compiled in the default order (as ``aoizora.compare``);
- ``expert:NAME``: each expert configuration in the default order, valid or with its reason.
Every row with a compiled program has ``sim_step_s`` (``benchmarks.simulator``, ``SIM_LABEL``)
and ``q2_step_s`` ("predicted (Q2)"), both simulated / predicted on the row's own evidence under
the row's own placement; ``speedup_sim`` = row / aoizora (> 1: AoiZora faster).

Independence: every compile of a cell (the planner's, the baselines') runs inside
``aoizora.extract.aot_compile.keeping_hlo`` and keeps its program's HLO text gzip'd in a
temporary directory (removed with the cell); ``_Pricer`` hands the parsed HLO to
``Simulator.run(..., hlo=...)``, so that every op is priced by the simulator's own compute,
kernel and splash models (``benchmarks/sim/``), not by the compiler's cycle estimates that Q2
uses. Each pair records ``sim_hlo`` (the HLO was given), ``sim_unpriced_ops`` (ops the
simulator's model could not price, left at the compiler's estimate) and ``sim_notes``. The cells
in ``benchmarks/results/grid/`` predate this (simulated without the HLO: the same compute price
as Q2); the new cells go to ``benchmarks/results/grid_independent/``
(``python -m benchmarks.grid_independent_report``).

Fidelity: every (layout, placement) pair the cell evaluated is priced by both Q2 and the
simulator: the plan's layout under the default order, CP-SAT's placement, each heuristic's, and
``RANDOM_PLACEMENTS`` seeded random placements; every candidate layout the planner compiled
(under its CP-SAT placement and the default order); the baselines. ``rho_placements`` is
Spearman's rho between Q2 and the simulator over the plan layout's placements (average ranks for
ties, numpy only); ``rho_all`` over all pairs. ``top1`` is true when the simulator's best pair is
the planner's choice (within ``TIE_REL`` = 0.01% relative), and ``plan_sim_rank`` its rank (1 = best).

A cell written before an expert configuration joined ``EXPERTS`` gets its row with
``--add-experts``: compiled and priced like the others, in the default order, and stamped
``added`` (commit, date, machine), since the cell's plan was made without it as a seed.

Evidence cache (``--cache-dir DIR``; default none, every compile runs): every compile of a
cell -- the planner's candidates, the baselines, the tuned experts' settings -- is looked up in
``aoizora.extract.evidence_cache`` first and stored there with its HLO text. A cell re-run at a
later commit then compiles only the programs that commit lowers differently; the evidence, and
so every price, is the one a compile would give (the key is the lowered program, target, device
order, options, compiler versions and the evidence reader's source). A cache hit counts as a
compile in the planner's ``--compiles`` budget, so a warm cache gives the same plan. The cell
records how many of its compiles came from the cache (``evidence_cache``).

Results: one JSON per cell in ``benchmarks/results/grid_independent/`` (``--out`` for another
directory; a cell whose JSON exists is skipped
unless ``--force``), with the machine (nproc, CPU model, load average), versions, budget and seed.
Evidence objects are dropped; their summary numbers are kept. A failing baseline or planner is
recorded in the cell as an error, the grid goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import aoizora  # noqa: F401  -- sets libtpu's environment first
from aoizora.builtin import Job, builtin_job
from aoizora.extract.atomic_io import atomic_write
from aoizora.compare import alpa_logical, price_default_order
from aoizora.extract.aot_compile import keeping_hlo, read_hlo
from aoizora.extract.evidence_cache import CacheError, EvidenceCache, open_cache
from aoizora.extract.evidence import Evidence
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network, default_device_order
from aoizora.formulation.calibration import Calibration
from aoizora.formulation.latency import predict_step
from aoizora.models.experts import expert_layouts
from aoizora.planner import Candidate, plan as make_plan
from aoizora.planning.progress import Progress
from benchmarks.machine import git_state, machine_info
from benchmarks.planner_compiles import PlannerCompiles
from benchmarks.simulator import LABEL as SIM_LABEL_BASE, Simulator
from benchmarks.tuned_rows import solved_order, tuned_expert_rows
from aoizora.expert_tuning import Priced

Q2_LABEL = "predicted (Q2)"
# the "simulated" column of this grid: the simulator given every program's HLO
SIM_LABEL = (f"{SIM_LABEL_BASE}; independent: own compute/kernel model on the compiled HLO")
# cells priced by the simulator without the HLO (its compute was then the compiler's cycle
# estimates, Q2's own compute price): the committed grid up to issue #34
SIM_LABEL_OLD = SIM_LABEL_BASE
RESULTS = Path(__file__).resolve().parent / "results" / "grid"
INDEPENDENT = Path(__file__).resolve().parent / "results" / "grid_independent"
RANDOM_PLACEMENTS = 10
TIE_REL = 1e-4      # 0.01%: differences below this are ties (microseconds in a step of ms)
ALPA_ILP_TIME_S = 30.0


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    resolution: str
    frames: int
    target: str

    @property
    def name(self) -> str:
        return f"{self.model}_{self.resolution}-{self.frames}f_{self.target}"


def grid_cells() -> list[Cell]:
    """Every cell of the grid, cheapest first."""
    cells: list[Cell] = []
    for tgt in ("v5e-4", "v5e-8", "v5e-16"):
        for f in (21, 41, 81):
            cells.append(Cell("wan2.1-1.3b", "480p", f, tgt))
    for f in (21, 41, 81):
        cells.append(Cell("wan2.1-1.3b", "480p", f, "v6e-8"))
    for res in ("480p", "720p"):
        for tgt in ("v5e-4", "v5e-8", "v5e-16"):
            for f in (21, 41, 81):
                cells.append(Cell("wan2.1-14b", res, f, tgt))
    cells.append(Cell("hunyuanvideo-13b", "720p", 129, "v5e-16"))
    # cheapest first: tokens x model size / devices is a fair proxy for compile and plan time
    size = {"wan2.1-1.3b": 1, "wan2.1-14b": 10, "hunyuanvideo-13b": 12}
    res_cost = {"480p": 1, "720p": 2.3}
    cells = sorted(cells, key=lambda c: (size[c.model], res_cost[c.resolution],
                                         int(c.target.split("-")[1]) > 8, c.target.startswith("v6e"),
                                         c.frames, int(c.target.split("-")[1])))
    # the spatial-temporal family (Open-Sora STDiT3, its published 51-frame settings), last so
    # that the cells above keep their order; cheapest first within it
    for res in ("240p", "480p", "720p"):
        for tgt in ("v5e-8", "v5e-16"):
            cells.append(Cell("opensora-stdit3-xl", res, 51, tgt))
    # TPU v7x (maxdiffusion publishes Wan 720p-81f recipes for it: CFG data parallel 2 x context
    # parallel 4 or 8, and context parallel 8 pure Ulysses), last so that the cells above keep
    # their order
    for tgt in ("v7x-8", "v7x-16"):
        cells.append(Cell("wan2.1-14b", "720p", 81, tgt))
    return cells


SMOKE_CELL = Cell("wan2.1-small", "128p", 9, "v5e-8")


# ---------------------------------------------------------------------------------------------
def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho with average ranks for ties (numpy only); None when undefined (fewer than
    3 points or a constant series)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or len(x) != len(y):
        return None
    rx, ry = _avg_ranks(x), _avg_ranks(y)
    if np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _avg_ranks(x: np.ndarray) -> np.ndarray:
    # values equal to 1e-12 s (1 ps) are ties: float noise must not order placements
    x = np.round(x, 12)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    _, inv = np.unique(x, return_inverse=True)
    return (np.bincount(inv, r) / np.bincount(inv))[inv]


def evidence_summary(ev: Evidence) -> dict[str, Any]:
    """The numbers of an Evidence kept in the JSON (the object itself is too big)."""
    kinds: dict[str, dict[str, float]] = {}
    for c in ev.collectives:
        k = kinds.setdefault(c.kind, {"ops": 0, "runs": 0, "bytes_per_call": 0.0})
        k["ops"] += 1
        k["runs"] += c.count
        k["bytes_per_call"] += float(c.bytes) * c.count
    mem = ev.memory
    return {"target": ev.target, "mesh": dict(ev.mesh_axes), "fidelity": ev.fidelity,
            "compile_s": round(ev.compile_s, 3), "collectives": len(ev.collectives),
            "collective_runs": int(sum(c.count for c in ev.collectives)),
            "collective_bytes_per_call": float(sum(float(c.bytes) * c.count
                                                   for c in ev.collectives)),
            "collectives_by_kind": kinds, "compute_ops": len(ev.compute),
            "compute_cycles_per_call": float(sum((o.estimated_cycles or 0.0) * o.count
                                                 for o in ev.compute)),
            "flops_per_device": ev.flops, "hbm_bytes_per_device": int(mem.total_bytes),
            "hbm_bytes_usable": int(mem.hbm_bytes), "fits_hbm": bool(mem.fits),
            "warnings": len(ev.warnings)}


def machine() -> dict[str, Any]:
    """The machine (``benchmarks.machine``) plus the git commit and modified tracked files."""
    info = machine_info()
    return {**info, "load_average": info["loadavg"],
            "versions": {p: info[p] for p in ("python", "jax", "jaxlib", "libtpu", "ortools", "numpy")},
            **git_state()}


def _err(e: BaseException) -> str:
    lines = str(e).splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


# ---------------------------------------------------------------------------------------------
class _Pricer:
    """Q2 and the simulator on (evidence, placement) pairs; every pair is recorded. The
    simulator is given the program's HLO (kept by ``keeping_hlo`` at its compile, read back from
    the evidence's ``hlo_path``), so its compute is its own model's, not the compiler's
    estimate; a pair without HLO is priced all the same and marked ``sim_hlo: false``."""

    def __init__(self, target, network: Network):
        self.net = network
        self.sim = Simulator(target, network)
        self.pairs: list[dict[str, Any]] = []
        self._module: tuple[str | None, Any] = (None, None)   # (hlo_path, parsed module): one

    def _hlo(self, ev: Evidence):
        """The parsed HLO of ``ev`` (the last one is kept: pairs of one program come together)."""
        path = getattr(ev, "hlo_path", None)
        if not path:
            return None
        if self._module[0] != path:
            self._module = (None, None)            # free the last module before parsing the next
            text = read_hlo(ev)
            self._module = (path, parse_hlo_module(text) if text is not None else None)
        return self._module[1]

    def price(self, ev: Evidence, placement: Sequence[int], layout_id: str, what: str,
              record: bool = True, program: str = "job") -> dict[str, Any]:
        """``program``: "job" for the cell's own (padded) program, else the baseline's name (an
        expert configuration pads its own program): pairs are distinct by (program, layout,
        placement)."""
        placement = [int(p) for p in placement]
        q = predict_step(ev, placement, self.net)
        t = time.perf_counter()
        failed = ""
        try:
            hlo = self._hlo(ev)
            s = self.sim.run(ev, placement, hlo=hlo)
        except Exception as e:  # noqa: BLE001 -- recorded: this pair is then not independent
            failed = f"the simulator failed on the HLO ({_err(e)}): priced without it"
            hlo, s = None, self.sim.run(ev, placement)
        out = {"what": what, "program": program, "layout": layout_id, "placement": placement,
               "q2_step_s": q.step_s, "q2_compute_s": q.compute_s,
               "q2_communication_s": q.communication_s, "sim_step_s": s.step_s,
               "sim_compute_s": s.compute_s, "sim_communication_s": s.communication_s,
               "sim_hlo": hlo is not None, "sim_unpriced_ops": _unpriced_ops(s.notes),
               "sim_notes": ([failed] if failed else []) + _sim_notes(s.notes),
               "sim_wall_s": round(time.perf_counter() - t, 3)}
        if record:
            self.pairs.append(out)
        return out


def _unpriced_ops(notes: Sequence[str]) -> int:
    """Compute ops the simulator's own model could not price (it then used the compiler's
    estimate for them), from its notes."""
    import re

    n = 0
    for note in notes:
        m = re.match(r"(\d+) compute op\(s\) not priced by the simulator's model", note)
        if m:
            n += int(m.group(1))
    return n


def _sim_notes(notes: Sequence[str], keep: int = 12) -> list[str]:
    """The simulator's notes, without the routine loop notes, deduplicated and cut short."""
    out: list[str] = []
    for note in notes:
        if note.startswith("ops with count ") or note[:300] in out:
            continue
        out.append(note[:300])
    return out[:keep]


def _row(name: str, **kw) -> dict[str, Any]:
    r = {"name": name, "valid": True, "reason": "", "error": None, "mesh": None,
         "device_order": None, "q2_step_s": None, "sim_step_s": None, "planning_time_s": None}
    r.update(kw)
    return r


def _priced_row(name: str, pricer: _Pricer, ev: Evidence, placement, layout_id: str,
                program: str = "job", **kw) -> dict[str, Any]:
    p = pricer.price(ev, placement, layout_id, name, program=program)
    return _row(name, mesh=dict(ev.mesh_axes), device_order=p["placement"],
                q2_step_s=p["q2_step_s"], q2_compute_s=p["q2_compute_s"],
                q2_communication_s=p["q2_communication_s"], sim_step_s=p["sim_step_s"],
                sim_compute_s=p["sim_compute_s"], sim_communication_s=p["sim_communication_s"],
                evidence=evidence_summary(ev),
                evidence_source="cache" if getattr(ev, "source", "") == "cache" else "compile",
                **kw)


def _layout_key(mesh_axes, layout) -> str:
    d = layout.to_json()
    d.pop("name", None)
    import hashlib

    return hashlib.sha1(json.dumps([dict(mesh_axes), d], sort_keys=True).encode()).hexdigest()[:12]


def run_cell(cell: Cell, **kw) -> dict[str, Any]:
    """Run one cell; returns its JSON-ready dict (see the module docstring). Never raises for a
    failing planner or baseline: the error is recorded in the row / the cell. Keywords: those of
    ``_run_cell`` (budget_s, seed, progress, log, random_placements, experts, alpa,
    planner_workers, calibration_from). Every compile of the cell (the planner's candidates, the
    baselines) keeps its HLO text gzip'd in a temporary directory, removed when the cell is
    done, so that the simulator prices each program with its own model."""
    with tempfile.TemporaryDirectory(prefix="aoizora-grid-hlo-") as d, keeping_hlo(d):
        out = _run_cell(cell, **kw)
        cache = kw.get("cache")
        if cache is not None:
            out["evidence_cache"] = {"dir": cache.directory, "hits": _cache_hits(out),
                                     "notes": list(cache.notes)[-5:]}
        out["hlo_kept"] = {"files": len(os.listdir(d)),
                           "gzip_bytes": sum(os.path.getsize(os.path.join(d, f))
                                             for f in os.listdir(d))}
    return out


def _cache_hits(out: dict[str, Any]) -> dict[str, int]:
    """How many of the cell's compiles the evidence cache gave: the planner's (its plan's
    ``compiles``) and the baselines' (rows marked ``evidence_source: "cache"``)."""
    planner = (out.get("plan") or {}).get("compiles") or {}
    rows = [r for r in out.get("rows", []) if r.get("evidence_source")]
    return {"planner_compiled": int(planner.get("compiled", 0) or 0),
            "planner_from_cache": int(planner.get("cached", 0) or 0),
            "baselines_compiled": sum(r["evidence_source"] != "cache" for r in rows),
            "baselines_from_cache": sum(r["evidence_source"] == "cache" for r in rows)}


def _run_cell(cell: Cell, *, budget_s: float = 120.0, seed: int = 0,
              progress: Progress | None = None, log: Callable[[str], None] = print,
              random_placements: int = RANDOM_PLACEMENTS, experts: bool = True,
              alpa: bool = True, planner_workers: int = 2,
              calibration_from: str | None = None,
              compiles: int | None = None, tuned_experts: bool = False,
              tune_compiles: int | None = None, screen: bool = True,
              cache: EvidenceCache | None = None) -> dict[str, Any]:
    """``run_cell``'s work, inside its ``keeping_hlo``. ``cache``: the evidence cache every
    compile of the cell looks up first (module docstring; None: every compile runs).
    ``calibration_from``: a cell JSON whose plan's calibration the planner starts from (a warm
    start, ``plan(..., calibration=...)``); recorded in the cell. ``compiles``: the planner's
    budget in candidate compiles (``plan(..., compiles=N)``; ``budget_s`` is then its guard).
    ``tuned_experts``: the tuned experts' rows too (``benchmarks.tuned_rows``), each expert
    tuned within ``tune_compiles`` compiles (None: every setting). ``screen``: the planner screens
    layouts on early evidence first, as the CLI does by default (``plan(..., screen=...)``)."""
    t_cell = time.perf_counter()
    out: dict[str, Any] = {"cell": cell.name, "model": cell.model, "resolution": cell.resolution,
                           "frames": cell.frames, "target_arg": cell.target,
                           "budget_s": budget_s, "compiles": compiles, "seed": seed,
                           "screen": screen,
                           "planner_workers": planner_workers,
                           "machine_start": machine(),
                           "labels": {"sim": SIM_LABEL, "q2": Q2_LABEL,
                                      "sim_compute": "the simulator's own compute and kernel "
                                                     "models on each program's compiled HLO "
                                                     "(benchmarks/sim/hlo_cost.py, "
                                                     "kernel_model.py, mosaic.py)"},
                           "pricing": "independent", "rows": [],
                           "errors": [], "unit": "seconds"}
    calibration = None
    if calibration_from:
        src = json.loads(Path(calibration_from).read_text())
        calibration = Calibration.from_json(src["plan"]["calibration"])
        out["calibration_from"] = {"path": str(calibration_from), "cell": src["cell"],
                                   "budget_s": src.get("budget_s"),
                                   "commit": src.get("machine_start", {}).get("git_commit")}
    job: Job = builtin_job(cell.model, cell.resolution, cell.frames, cell.target)
    out.update(target=job.target.name, devices=job.target.num_devices, job=job.describe(),
               tokens=job.workload.tokens, padded_tokens=job.padded_tokens)
    network = Network.from_target(job.target)
    pricer = _Pricer(job.target, network)
    rows = out["rows"]

    # -- the plan -------------------------------------------------------------------------------
    cands: list[Candidate] = []
    plan = best = None
    log(f"[{cell.name}] planning (budget "
        f"{'' if compiles is None else f'{compiles} compiles, guard '}{budget_s:g} s)")
    try:
        from aoizora.builtin import expert_seed_layouts

        plan = make_plan(job.fn, *job.args, target=job.target, time_budget_s=budget_s, seed=seed,
                         progress=progress, on_candidate=cands.append,
                         seed_layouts=expert_seed_layouts(job), workers=planner_workers,
                         calibration=calibration, compiles=compiles, screen=screen, cache=cache)
    except Exception as e:  # noqa: BLE001 -- recorded, the cell goes on with the baselines
        out["errors"].append({"row": "aoizora", "error": _err(e),
                              "traceback": traceback.format_exc(limit=4)})
        rows.append(_row("aoizora", valid=False, error=_err(e)))
    if plan is not None:
        for c in cands:
            if c.solution.layout is plan.layout:
                best = c
        if best is None:
            key = _layout_key(plan.mesh, plan.layout)
            best = next((c for c in cands if c.evidence is not None
                         and _layout_key(c.mesh_axes, c.solution.layout) == key), None)
        out["plan"] = {"mesh": plan.mesh, "device_order": plan.device_order,
                       "device_coords": [list(c) for c in plan.device_coords],
                       "planning_time_s": plan.planning_time_s, "status": plan.status,
                       "predicted": {k: v for k, v in plan.predicted.items() if k != "links"},
                       "certificates": {k: (v.to_json() if v is not None else None)
                                        for k, v in plan.certificates.items()},
                       "iterations": plan.iterations, "notes": plan.notes,
                       "time_limited": plan.time_limited, "compiles": plan.compiles,
                       "layout_in_words": plan.layout_in_words, "fits_hbm": plan.fits_hbm,
                       "calibration": (plan.calibration.to_json()
                                       if plan.calibration is not None else None)}
        out["planning_time_s"] = plan.planning_time_s
        log(f"[{cell.name}] plan: mesh {plan.mesh}, Q2 {plan.predicted['step_s'] * 1e3:.3f} ms "
            f"(predicted), {plan.planning_time_s:.1f} s, {len(cands)} candidates compiled")
    plan_key = _layout_key(plan.mesh, plan.layout) if plan is not None else None

    if plan is not None and best is not None and best.evidence is not None:
        ev = best.evidence
        rows.append(_priced_row("aoizora", pricer, ev, plan.device_order, plan_key,
                                planning_time_s=plan.planning_time_s,
                                q2_planner_step_s=plan.predicted["step_s"]))
        rows.append(_priced_row("aoizora-layout/default-order", pricer, ev, best.default_order,
                                plan_key))
        # -- heuristic placement with the CP-SAT's time limit ------------------------------------
        cert = plan.certificates.get("placement")
        h_budget = float(cert.time_limit_s or cert.time_s) if cert is not None else 10.0
        heur = []
        try:
            from aoizora.solvers import placement_heuristics as PH

            for hname, fn in PH.HEURISTICS.items():
                kw: dict[str, Any] = {"time_limit_s": h_budget}
                if hname in ("random", "annealing"):
                    kw["seed"] = seed
                if hname in ("random", "axis_orders"):
                    kw["default"] = best.default_order
                if hname == "annealing":
                    kw["starts"] = PH.annealing_starts(network, list(ev.mesh_axes.values()),
                                                       best.default_order)
                try:
                    r = fn(ev, network, **kw)
                except PH.HeuristicError as e:
                    heur.append({"heuristic": hname, "skipped": str(e)})
                    continue
                p = pricer.price(ev, r.placement, plan_key, f"heuristic:{hname}")
                heur.append({"heuristic": hname, "status": r.certificate.status,
                             "time_s": r.certificate.time_s, "time_limit_s": h_budget,
                             "evaluated": r.certificate.detail.get("evaluated"),
                             "evaluations_asked": r.certificate.detail.get("evaluations_asked"),
                             "cut": r.certificate.detail.get("cut"),
                             "link_bytes": r.certificate.detail.get("link_bytes"),
                             "hops": r.certificate.detail.get("hops"), **p})
        except Exception as e:  # noqa: BLE001
            out["errors"].append({"row": "heuristic-placement", "error": _err(e),
                                  "traceback": traceback.format_exc(limit=4)})
        done = [h for h in heur if "q2_step_s" in h]
        if done:
            # chosen as the heuristic itself would: by Q2, then link bytes, then hops (never by
            # the simulator)
            hb = min(done, key=lambda h: (round(h["q2_step_s"], 12), h.get("link_bytes") or 0,
                                          h.get("hops") or 0))
            rows.append(_row("heuristic-placement", mesh=dict(ev.mesh_axes),
                             device_order=hb["placement"], q2_step_s=hb["q2_step_s"],
                             q2_compute_s=hb["q2_compute_s"],
                             q2_communication_s=hb["q2_communication_s"],
                             sim_step_s=hb["sim_step_s"], sim_compute_s=hb["sim_compute_s"],
                             sim_communication_s=hb["sim_communication_s"],
                             heuristic=hb["heuristic"], time_limit_s=h_budget,
                             description=f"best heuristic by Q2 ({hb['heuristic']}) with the "
                                         f"CP-SAT's time limit ({h_budget:g} s each)"))
        else:
            rows.append(_row("heuristic-placement", valid=False,
                             error=out["errors"][-1]["error"] if out["errors"] else "none ran"))
        out["heuristics"] = heur
        # -- random placements of the plan's layout ----------------------------------------------
        rng = np.random.default_rng(seed)
        n = ev.num_devices
        seen = {tuple(p["placement"]) for p in pricer.pairs if p["layout"] == plan_key}
        tries = 0
        while sum(1 for p in pricer.pairs if p["what"].startswith("random")) < random_placements \
                and tries < 20 * random_placements:
            tries += 1
            p = tuple(int(v) for v in rng.permutation(n))
            if p in seen:
                continue
            seen.add(p)
            pricer.price(ev, p, plan_key, f"random:{len(seen)}")
        # -- the other layouts the planner compiled (each under CP-SAT's placement and default) --
        for c in cands:
            if c is best or c.evidence is None or c.q2 is None:
                continue
            k = _layout_key(c.mesh_axes, c.solution.layout)
            pricer.price(c.evidence, c.placement, k, f"planner-candidate:it{c.iteration}:cpsat")
            if list(c.placement) != list(c.default_order):
                pricer.price(c.evidence, c.default_order, k,
                             f"planner-candidate:it{c.iteration}:default")
    elif plan is not None:
        out["errors"].append({"row": "aoizora", "error": "the planner's best candidate has no "
                                                         "evidence to simulate"})
        rows.append(_row("aoizora", valid=False, error="no evidence for the plan's layout",
                         q2_step_s=plan.predicted["step_s"]))
    out["candidates"] = [dict(c.summary(), iteration=c.iteration) for c in cands]
    seeds_compiled = PlannerCompiles(job)
    for c in cands:
        if c.seed is not None:
            seeds_compiled(c)
    del cands

    # -- Alpa-style logical search ----------------------------------------------------------------
    if alpa:
        log(f"[{cell.name}] Alpa-style logical search")
        try:
            alpa_best, alpa_t = alpa_logical(job, seed=seed, time_limit_s=ALPA_ILP_TIME_S)
            if alpa_best is None:
                rows.append(_row("alpa-logical", valid=False, reason="no layout fits on any mesh"))
            else:
                rows.append(_baseline_row("alpa-logical", job.fn, job.args, job, alpa_best[1].layout,
                                          network, pricer, cache=cache, planning_time_s=alpa_t,
                                          q1_s=alpa_best[0]))
        except Exception as e:  # noqa: BLE001
            out["errors"].append({"row": "alpa-logical", "error": _err(e),
                                  "traceback": traceback.format_exc(limit=4)})
            rows.append(_row("alpa-logical", valid=False, error=_err(e)))

    # -- tuned experts (first: the published settings they compile serve the expert rows) ---------
    if tuned_experts:
        log(f"[{cell.name}] tuned experts")
        try:
            tuned, out["tuning"] = tuned_expert_rows(
                job, _tuned_price(job, network, pricer, seeds_compiled, cache),
                _tuned_solved(job, network, pricer, seeds_compiled, seed), log, tune_compiles)
            rows += tuned
        except Exception as e:  # noqa: BLE001 -- recorded, the cell goes on
            out["errors"].append({"row": "tuned:*", "error": _err(e),
                                  "traceback": traceback.format_exc(limit=6)})

    # -- expert configurations --------------------------------------------------------------------
    if experts:
        try:
            exs = expert_layouts(job.model, job.workload, job.target)
        except Exception as e:  # noqa: BLE001
            exs = []
            out["errors"].append({"row": "expert:*", "error": _err(e),
                                  "traceback": traceback.format_exc(limit=4)})
        for ex in exs:
            log(f"[{cell.name}] expert:{ex.name}")
            rows.append(_expert_row(ex, job, network, pricer, out["errors"], seeds_compiled,
                                    cache))

    out["_pairs"] = pricer.pairs
    _finish_cell(out, plan_key)
    out["machine_end"] = {"load_average": list(os.getloadavg())}
    out["cell_wall_s"] = round(time.perf_counter() - t_cell, 1)
    return out


def _baseline_row(name, fn, args, job: Job, layout, network, pricer: _Pricer,
                  cache: EvidenceCache | None = None, **kw):
    d = price_default_order(fn, args, job, layout, network, cache=cache)
    ev = d.pop("evidence", None)
    if ev is None:
        return _row(name, valid=False, reason=d.get("reason", ""), mesh=d.get("mesh"),
                    fits_hbm=d.get("fits_hbm"), **kw)
    return _priced_row(name, pricer, ev, d["device_order"], _layout_key(layout.mesh_axes, layout),
                       program="job" if fn is job.fn else name, fits_hbm=True,
                       compile_s=d.get("compile_s"), **kw)


def _expert_row(ex, job: Job, network, pricer: _Pricer, errors: list,
                seeds_compiled: PlannerCompiles | None = None,
                cache: EvidenceCache | None = None) -> dict[str, Any]:
    """The row of one expert configuration: invalid with its reason, or compiled in the default
    order and priced; a failure is recorded in ``errors`` and the row says so.
    ``seeds_compiled``: the planner's compiles of the seeds; the expert's, where there is one, is
    priced in the default order instead of compiling the same program again (the evidence is in
    logical ranks)."""
    name = f"expert:{ex.name}"
    if not ex.valid:
        return _row(name, valid=False, reason=ex.reason)
    ev = seeds_compiled.evidence(ex.layout, {"pad_multiple": ex.pad_multiple}) \
        if seeds_compiled is not None else None
    if ev is not None:
        order = default_device_order(job.target, ex.layout.mesh_axes)
        key = _layout_key(ex.layout.mesh_axes, ex.layout)
        return _priced_row(name, pricer, ev, order, key, program=name, fits_hbm=True,
                           compile_s=ev.compile_s, description=ex.reason,
                           compile="the planner's compile of this seed")
    try:
        return _baseline_row(name, ex.fn, ex.args, job, ex.layout, network, pricer,
                             cache=cache, description=ex.reason)
    except Exception as e:  # noqa: BLE001 -- recorded, the cell goes on
        errors.append({"row": name, "error": _err(e), "traceback": traceback.format_exc(limit=4)})
        return _row(name, valid=False, error=_err(e))


def _tuned_price(job: Job, network: Network, pricer: _Pricer, compiled: PlannerCompiles,
                 cache: EvidenceCache | None = None):
    """``expert_tuning``'s price: a tuned setting compiled in the default order (or the
    planner's compile of it) and priced by the simulator; its evidence joins ``compiled``."""
    def price(v) -> Priced:
        ev = compiled.evidence(v.layout, v.program)
        order = default_device_order(job.target, v.layout.mesh_axes)
        if ev is None:
            d = price_default_order(v.fn, v.args, job, v.layout, network, cache=cache)
            ev = d.pop("evidence", None)
            if ev is None:
                return Priced(None, d.get("fits_hbm"), d.get("reason", ""))
            if read_hlo(ev) is not None:
                compiled.by_key[compiled.key(v.layout, v.program)] = ev
        row = _priced_row(f"tuned:{v.expert} [{v.knobs.label()}]", pricer, ev, order,
                          _layout_key(v.layout.mesh_axes, v.layout),
                          program=f"expert:{v.expert}", fits_hbm=True, compile_s=ev.compile_s)
        return Priced(row["sim_step_s"], True, detail=row)
    return price


def _tuned_solved(job: Job, network: Network, pricer: _Pricer, compiled: PlannerCompiles,
                  seed: int):
    """The best tuned setting of an expert under the placement CP-SAT solves (``tuned_rows``)."""
    def solved(t):
        v = t.best.variant
        ev = compiled.evidence(v.layout, v.program)
        if ev is None:
            return None
        order, how = solved_order(ev, network, default_device_order(job.target,
                                                                    v.layout.mesh_axes), seed)
        return {**_priced_row("best-tuned-expert/solved-placement", pricer, ev, order,
                              _layout_key(v.layout.mesh_axes, v.layout),
                              program=f"expert:{v.expert}", fits_hbm=True),
                "description": how}
    return solved


def _finish_cell(out: dict[str, Any], plan_key: str | None) -> None:
    rows = out["rows"]
    az = next((r for r in rows if r["name"] == "aoizora" and r.get("sim_step_s")), None)
    for r in rows:
        for k in ("sim", "q2"):
            v = r.get(f"{k}_step_s")
            base = az.get(f"{k}_step_s") if az else None
            r[f"speedup_{k}"] = (v / base) if (v and base) else None
    experts = [r for r in rows if r["name"].startswith("expert:") and r.get("sim_step_s")]
    be = min(experts, key=lambda r: r["sim_step_s"]) if experts else None
    out["best_expert"] = be["name"] if be else None
    out["best_expert_sim_step_s"] = be["sim_step_s"] if be else None
    out["speedup_over_best_expert"] = be["speedup_sim"] if be else None
    bt = next((r for r in rows if r["name"] == "best-tuned-expert" and r.get("sim_step_s")), None)
    if bt is not None:
        out["best_tuned_expert"] = f"{bt.get('expert')} [{bt.get('knobs')}]"
        out["speedup_over_best_tuned_expert"] = bt["speedup_sim"]
    priced = [r for r in rows if r.get("sim_step_s") and r["name"] != "aoizora"]
    out["never_slower"] = (all(r["speedup_sim"] >= 1.0 - TIE_REL for r in priced)
                           if az and priced else None)
    out["slower_than"] = [r["name"] for r in priced if az and r["speedup_sim"] < 1.0 - TIE_REL]
    # fidelity
    pairs, seen = [], {}
    for p in out.pop("_pairs", None) or []:     # one per distinct (program, layout, placement)
        k = (p.get("program", "job"), p["layout"], tuple(p["placement"]))
        if k in seen:
            also = seen[k].setdefault("also", [])
            for w in [p["what"]] + p.get("also", []):
                if w not in also and w != seen[k]["what"]:
                    also.append(w)
            continue
        seen[k] = p
        pairs.append(p)
    fid: dict[str, Any] = {"pairs": pairs}
    own = [p for p in pairs if p["layout"] == plan_key and p.get("program", "job") == "job"]
    fid["placements_of_plan_layout"] = len(own)
    fid["rho_placements"] = spearman([p["q2_step_s"] for p in own], [p["sim_step_s"] for p in own])
    fid["rho_all"] = spearman([p["q2_step_s"] for p in pairs], [p["sim_step_s"] for p in pairs])
    fid["pairs_evaluated"] = len(pairs)
    if az and pairs:
        best_sim = min(p["sim_step_s"] for p in pairs)
        fid["sim_best"] = min(pairs, key=lambda p: p["sim_step_s"])["what"]
        fid["top1"] = bool(az["sim_step_s"] <= best_sim * (1 + TIE_REL))
        fid["plan_sim_rank"] = 1 + sum(1 for p in pairs
                                       if p["sim_step_s"] < az["sim_step_s"] * (1 - TIE_REL))
        fid["sim_best_gain_over_plan"] = az["sim_step_s"] / best_sim
    else:
        fid.update(top1=None, plan_sim_rank=None, sim_best=None)
    out["fidelity"] = fid


def refresh_cell(out: dict[str, Any]) -> dict[str, Any]:
    """Recompute speedups and fidelity of a written cell from its rows and pairs. Cells written
    before pairs carried their program merged an expert's pair into the job program's pair of the
    same layout and placement (listed in ``also``); such pairs are split out again from the
    expert's row."""
    if "fidelity" not in out:
        return out
    rows = {r["name"]: r for r in out.get("rows", [])}
    pairs = []
    for p in out["fidelity"]["pairs"]:
        p = dict(p)
        p.setdefault("program", "job")
        keep = []
        for w in p.pop("also", []):
            r = rows.get(w)
            if w.startswith("expert:") and p["program"] == "job" and r and r.get("sim_step_s"):
                pairs.append({"what": w, "program": w, "layout": p["layout"],
                              "placement": r["device_order"], "q2_step_s": r["q2_step_s"],
                              "q2_compute_s": r.get("q2_compute_s"),
                              "q2_communication_s": r.get("q2_communication_s"),
                              "sim_step_s": r["sim_step_s"], "sim_compute_s": r.get("sim_compute_s"),
                              "sim_communication_s": r.get("sim_communication_s")})
            else:
                keep.append(w)
        if keep:
            p["also"] = keep
        pairs.insert(len(pairs), p)
    plan_key = next((p["layout"] for p in pairs if p["what"] == "aoizora"), None)
    out["_pairs"] = pairs
    _finish_cell(out, plan_key)
    return out


def add_expert_rows(out: dict[str, Any], log: Callable[[str], None] = print) -> list[str]:
    """Add to a written cell the rows of the expert configurations it lacks (``EXPERTS`` grew after
    it ran), priced like ``run_cell``'s, each stamped ``added`` with the commit, date and machine
    it was priced on; speedups and fidelity recomputed. Returns the names added (may be empty).
    The plan is not made again: it was planned without these configurations as seeds."""
    have = {r["name"] for r in out.get("rows", [])}
    job: Job = builtin_job(out["model"], out["resolution"], out["frames"], out["target_arg"])
    missing = [ex for ex in expert_layouts(job.model, job.workload, job.target)
               if f"expert:{ex.name}" not in have]
    if not missing:
        return []
    network = Network.from_target(job.target)
    pricer = _Pricer(job.target, network)
    stamp = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **machine()}
    added = []
    with tempfile.TemporaryDirectory(prefix="aoizora-grid-hlo-") as d, keeping_hlo(d):
        for ex in missing:
            log(f"[{out['cell']}] expert:{ex.name} (added)")
            row = _expert_row(ex, job, network, pricer, out.setdefault("errors", []))
            row["added"] = stamp
            out["rows"].append(row)
            added.append(row["name"])
    out = refresh_cell(out)
    if "fidelity" in out:
        pairs = out["fidelity"]["pairs"]
        plan_key = next((p["layout"] for p in pairs if p["what"] == "aoizora"), None)
        out["_pairs"] = pairs + pricer.pairs
        _finish_cell(out, plan_key)
    return added


# ---------------------------------------------------------------------------------------------
def write_cell(out: dict[str, Any], directory: Path, path: Path | None = None) -> Path:
    """Write ``out`` to ``directory/<cell>.json`` (or to ``path``, e.g. a repeat run's file)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = path or directory / f"{out['cell']}.json"
    atomic_write(path, json.dumps(out, indent=1, default=_json_default) + "\n")
    return path


def _json_default(o):
    if hasattr(o, "to_json"):
        return o.to_json()
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    return str(o)


class _LogProgress(Progress):
    def __init__(self, log):
        self.log, self.t0 = log, time.perf_counter()

    def _p(self, s):
        self.log(f"  {time.perf_counter() - self.t0:7.1f}s {s}")

    def stage(self, text):
        self._p(text)

    def candidate(self, k, total, text):
        self._p(f"candidate {k}/{total}: {text}")

    def note(self, text):
        self._p(text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.grid", description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="", help="comma-separated cell names (default: all, "
                                                "cheapest first); see --list")
    ap.add_argument("--budget", type=float, default=120.0, help="planning time budget per cell, s "
                    "(with --compiles: the wall clock's guard)")
    ap.add_argument("--compiles", type=int, default=None, help="planning budget per cell in "
                    "candidate compiles: the count, not the machine's load, decides the plan")
    ap.add_argument("--tuned-experts", action="store_true", help="also each expert at the best "
                    "of its users' knobs, the best of them, and that one under a solved placement")
    ap.add_argument("--tune-compiles", type=int, default=None,
                    help="with --tuned-experts: at most this many settings compiled per expert")
    ap.add_argument("--screen", action=argparse.BooleanOptionalAction, default=True,
                    help="the planner screens layouts on early evidence first (the CLI's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="re-run cells whose JSON exists")
    ap.add_argument("--smoke", action="store_true", help="one small cell into a temp dir (CI)")
    ap.add_argument("--out", default=None, help="results directory (default "
                    "benchmarks/results/grid_independent; benchmarks/results/grid holds the cells "
                    "priced before the simulator was given the HLO)")
    ap.add_argument("--list", action="store_true", help="list the cells and exit")
    ap.add_argument("--cache-dir", default=None, metavar="DIR",
                    help="evidence cache every compile looks up first and is stored in (default: "
                         "none, every compile runs); a hit counts in --compiles")
    ap.add_argument("--cache-limit-gb", type=float, default=20.0,
                    help="with --cache-dir: the cache's size limit, GB (least recently used "
                         "entries go first)")
    ap.add_argument("--planner-workers", type=int, default=2,
                    help="CP-SAT workers of the planner's placement solve (default 2, the "
                         "planner's default; 1 runs without OR-Tools' interleaved search)")
    ap.add_argument("--in-process", action="store_true",
                    help="run cells in this process (default: each cell in a child process, so "
                         "that a native crash, e.g. in a solver, is recorded and the grid goes on)")
    ap.add_argument("--calibration-from", default=None, metavar="CELL_JSON",
                    help="start the planner from the calibration of this cell's plan (a warm "
                         "start; e.g. the same model at another frame count)")
    ap.add_argument("--add-experts", action="store_true",
                    help="price the expert configurations the written cells lack (no planning)")
    ap.add_argument("--refresh", action="store_true",
                    help="recompute speedups and fidelity of the written cells (no compiles)")
    a = ap.parse_args(argv)

    def log(s):
        print(s, file=sys.stderr, flush=True)

    if a.list:
        for c in grid_cells():
            print(c.name)
        return 0
    if a.add_experts:
        want = {w.strip() for w in a.cells.split(",") if w.strip()}
        for path in sorted((Path(a.out) if a.out else INDEPENDENT).glob("*.json")):
            out = json.loads(path.read_text())
            if want and out.get("cell") not in want:
                continue
            added = add_expert_rows(out, log)
            if added:
                write_cell(out, path.parent, path)
            print(f"{path}: added {', '.join(added) or 'nothing'}")
        return 0
    if a.refresh:
        for path in sorted((Path(a.out) if a.out else INDEPENDENT).glob("*.json")):
            write_cell(refresh_cell(json.loads(path.read_text())), path.parent, path)
            print(f"refreshed {path}")
        return 0
    if a.smoke:
        d = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="aoizora-grid-smoke-"))
        out = run_smoke(seed=a.seed, log=log)
        p = write_cell(out, d)
        print(f"smoke cell written to {p}")
        _print_cell(out)
        return 0
    cells = grid_cells()
    if a.cells:
        want = [s.strip() for s in a.cells.split(",") if s.strip()]
        by = {c.name: c for c in cells + [SMOKE_CELL]}
        bad = [w for w in want if w not in by]
        if bad:
            print(f"error: unknown cell(s) {', '.join(bad)}; see python -m benchmarks.grid --list",
                  file=sys.stderr)
            return 2
        cells = [by[w] for w in want]
    d = Path(a.out) if a.out else INDEPENDENT
    try:
        cache = open_cache(a.cache_dir, int(a.cache_limit_gb * 1e9)) if a.cache_dir else None
    except CacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for c in cells:
        path = d / f"{c.name}.json"
        if path.exists() and not a.force:
            log(f"[{c.name}] exists, skipped (--force to re-run)")
            continue
        if not a.in_process:
            out = _run_isolated(c, a, d, log)
            if out is None:
                continue                    # the child wrote and printed its cell
        else:
            try:
                out = run_cell(c, budget_s=a.budget, seed=a.seed, progress=_LogProgress(log),
                               log=log, planner_workers=a.planner_workers,
                               calibration_from=a.calibration_from, compiles=a.compiles,
                               tuned_experts=a.tuned_experts, tune_compiles=a.tune_compiles,
                               screen=a.screen, cache=cache)
            except Exception as e:  # noqa: BLE001 -- e.g. an unknown workload; record, go on
                out = {"cell": c.name, "error": _err(e), "traceback": traceback.format_exc(limit=6),
                       "budget_s": a.budget, "seed": a.seed, "machine_start": machine(),
                       "rows": []}
        p = write_cell(out, d)
        log(f"[{c.name}] written {p}")
        _print_cell(out)
    return 0


def _run_isolated(c: Cell, a, d: Path, log) -> dict[str, Any] | None:
    """Run one cell in a child process. None when it wrote its JSON; else the cell's record of
    the crash (exit code or signal, the last lines of its stderr)."""
    import collections

    path = d / f"{c.name}.json"
    before = path.stat().st_mtime if path.exists() else None
    cmd = [sys.executable, "-m", "benchmarks.grid", "--in-process", "--force", "--cells", c.name,
           "--budget", str(a.budget), "--seed", str(a.seed), "--out", str(d),
           "--planner-workers", str(a.planner_workers)]
    if a.compiles is not None:
        cmd += ["--compiles", str(a.compiles)]
    if a.tuned_experts:
        cmd += ["--tuned-experts"]
    if a.tune_compiles is not None:
        cmd += ["--tune-compiles", str(a.tune_compiles)]
    cmd += ["--screen" if a.screen else "--no-screen"]
    if a.calibration_from:
        cmd += ["--calibration-from", str(Path(a.calibration_from).resolve())]
    if a.cache_dir:
        cmd += ["--cache-dir", str(Path(a.cache_dir).expanduser().resolve()),
                "--cache-limit-gb", str(a.cache_limit_gb)]
    t0 = time.perf_counter()
    start = machine()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace",
                            cwd=Path(__file__).resolve().parent.parent)
    tail: collections.deque = collections.deque(maxlen=40)
    for line in proc.stderr:
        sys.stderr.write(line)
        tail.append(line.rstrip())
    rc = proc.wait()
    if rc == 0 and path.exists() and path.stat().st_mtime != before:
        return None
    why = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
    first = next((l for l in tail if "Check failed" in l or "Error" in l), tail[-1] if tail else "")
    log(f"[{c.name}] the cell's process died ({why}): {first}")
    return {"cell": c.name, "model": c.model, "resolution": c.resolution, "frames": c.frames,
            "target_arg": c.target, "budget_s": a.budget, "seed": a.seed,
            "machine_start": start, "rows": [],
            "error": f"the cell's process died ({why}): {first.strip()[:200]}",
            "stderr_tail": list(tail), "cell_wall_s": round(time.perf_counter() - t0, 1)}


def run_smoke(seed: int = 0, log: Callable[[str], None] = lambda s: None,
              budget_s: float = 90.0, compiles: int = 3,
              cache: EvidenceCache | None = None) -> dict[str, Any]:
    """The CI smoke cell: the small Wan DiT at its 128p workload on v5e-8, a budget of
    ``compiles`` candidate compiles (``budget_s`` its guard), no screen (what it checks is the
    rows; the screen has its own tests); ``cache``: the evidence cache (``run_cell``)."""
    return run_cell(SMOKE_CELL, budget_s=budget_s, seed=seed, log=log, random_placements=4,
                    screen=False, compiles=compiles, cache=cache)


def _print_cell(out: dict[str, Any]) -> None:
    print(f"\n{out['cell']}: {out.get('job', '')}")
    if out.get("error"):
        print(f"  ERROR {out['error']}")
        return
    print(f"  {'row':34s} {'sim ms':>10s} {'Q2 ms':>10s} {'speedup(sim)':>12s}")
    for r in out["rows"]:
        sim = f"{r['sim_step_s'] * 1e3:10.3f}" if r.get("sim_step_s") else f"{'-':>10s}"
        q2 = f"{r['q2_step_s'] * 1e3:10.3f}" if r.get("q2_step_s") else f"{'-':>10s}"
        sp = f"{r['speedup_sim']:12.3f}" if r.get("speedup_sim") else f"{'-':>12s}"
        why = "" if r.get("sim_step_s") else (r.get("error") or r.get("reason") or "")[:70]
        print(f"  {r['name']:34s} {sim} {q2} {sp} {why}")
    f = out.get("fidelity", {})
    print(f"  rho(placements) {f.get('rho_placements')}, rho(all) {f.get('rho_all')}, "
          f"top-1 {f.get('top1')} (rank {f.get('plan_sim_rank')} of {f.get('pairs_evaluated')}), "
          f"planning {out.get('planning_time_s')} s")


if __name__ == "__main__":
    raise SystemExit(main())
