"""The training grid: AoiZora's plan of a Wan 2.1 training step against the expert training
configurations on v5p, cell by cell (model, workload, global batch, target).

    python -m benchmarks.training_grid [--cells NAME,...] [--budget S] [--seed N] [--force]
                                       [--no-alpa] [--list]
    python -m benchmarks.training_grid --report     # the markdown summary from the written cells
    python -m benchmarks.training_grid --alpa-only [--cells ...]  # (re)add the Alpa-style rows

In each cell (``builtin_job(..., task="train", batch=B)``: flow matching, AdamW, fp32 state):
- ``aoizora``: ``aoizora.plan`` of the train step with the expert training configurations as
  seeds (``builtin.expert_seed_layouts``), within ``--budget`` seconds. Its program (its own
  variant: padding, remat; the state donated as ``plan.jit(..., donate_argnums=(0,))`` runs it)
  is the planner's own compile of that layout, its HLO kept (``keeping_hlo``;
  ``PlannerCompiles``), else compiled once more. That one program is priced under the plan's
  placement and under ``jax.make_mesh``'s default order (the evidence is in logical ranks, so one
  compile serves both placements): the difference is what placement alone gains;
- ``expert:NAME``: each expert training configuration (``models.training_experts``, each with its
  own remat, tiles and libtpu options), donated: the planner's compile of it as a seed where it
  made one, else compiled here in ``jax.make_mesh``'s default order;
- ``alpa-logical``: Alpa-style logical search (``compare.alpa_logical``: the sharding ILP with
  fixed, placement-oblivious alpha-beta costs, 30 s per mesh, best by its Q1) on the step as the
  job traces it (every residual kept), compiled in ``jax.make_mesh``'s order.

Per compiled row: the step time **predicted by Q2** (``formulation.latency.predict_step``) and
**simulated by the AoiZora reference simulator** (``benchmarks.simulator``, on the compiled HLO:
its own compute, kernel and network models); HBM per chip from the compiler's memory analysis
(arguments + outputs + temporaries - aliased, per device); MFU = model FLOPs / (chips x bf16
peak x simulated step); the remat of the row's program and how it shards the AdamW moments;
speedup = the row's simulated step / the plan's (> 1: the plan faster). Model FLOPs per step
(stated in each cell): ``6 x params x B x S + 12 x layers x B x S x (S + S_text) x dim`` -- the
dense weights' forward and backward (2 + 4 FLOPs per parameter per video token) plus attention's
(QK^T and PV: 4 x S x S_kv x dim per layer forward, x 3 with the backward; self over the S video
tokens, cross over the S_text text tokens); S the unpadded video tokens; recomputation under
remat and padding are not model FLOPs. The busiest links (simulated) under the plan's placement
and under ``jax.make_mesh``'s order are listed too, and the simulator's compute by kind
(``benchmarks.sim.hlo_cost.compute_breakdown``) per row; for a plan under 40% MFU the report
says where its step goes (``where_the_step_goes``).

No TPU runs here: every step time is a prediction (Q2) or a simulation (reference simulator).
Results: one JSON per cell in ``benchmarks/results/training_grid/`` (a cell whose JSON exists is
skipped unless ``--force``) and ``benchmarks/results/training_grid.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import aoizora  # noqa: F401  -- sets libtpu's environment first
from aoizora.builtin import Job, builtin_job, expert_seed_layouts
from aoizora.compare import alpa_logical, plan_job
from aoizora.extract.aot_compile import CompileError, keeping_hlo, target_mesh
from aoizora.extract.compiled_evidence import evidence_from_compiled
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network, default_device_order
from aoizora.formulation.latency import predict_step
from aoizora.models.training_experts import optimizer_sharding, training_expert_layouts
from aoizora.planner import plan as make_plan
from aoizora.planning.progress import Progress
from aoizora.runtime.realize import RealizeError, realize
from benchmarks.machine import git_state, machine_info
from benchmarks.planner_compiles import PlannerCompiles
from benchmarks.sim.constants import chip_model
from benchmarks.sim.hlo_cost import compute_breakdown
from benchmarks.simulator import LABEL as SIM_LABEL, Simulator
from benchmarks.tuned_rows import solved_order, tuned_expert_rows
from aoizora.expert_tuning import Priced
from aoizora.extract.atomic_io import atomic_write

Q2_LABEL = "predicted (Q2)"
RESULTS = Path(__file__).resolve().parent / "results" / "training_grid"
SUMMARY = Path(__file__).resolve().parent / "results" / "training_grid.md"
TOP_LINKS = 5
ALPA_ILP_TIME_S = 30.0      # per mesh, as the inference grid gives it (benchmarks.grid)


@dataclasses.dataclass(frozen=True)
class Cell:
    model: str
    workload: str
    batch: int
    target: str

    @property
    def name(self) -> str:
        return f"{self.model}_{self.workload}_b{self.batch}_{self.target}"


def training_cells() -> list[Cell]:
    """The cells, smallest first (the order they are run in)."""
    out = []
    for model in ("wan2.1-1.3b", "wan2.1-14b"):
        for wl in ("480p-21f", "480p-41f", "480p-81f", "720p-21f", "720p-41f", "720p-81f"):
            for batch in (1, 2, 4):
                for tgt in ("v5p-8", "v5p-16"):
                    out.append(Cell(model, wl, batch, tgt))
    return out


def model_flops(job: Job) -> dict[str, Any]:
    """Model FLOPs of one training step (module docstring): value and formula."""
    m, c = job.model, job.model.config
    b, s = job.batch, job.workload.tokens
    dense = 6 * m.params * b * s
    attn = 12 * c.layers * b * s * (s + c.text_len) * c.dim
    return {"flops": float(dense + attn), "dense": float(dense), "attention": float(attn),
            "formula": "6 x params x B x S + 12 x layers x B x S x (S + S_text) x dim",
            "params": m.params, "B": b, "S": s, "S_text": c.text_len, "layers": c.layers,
            "dim": c.dim}


def compile_hlo(fn, args, tgt, layout, order):
    """(Evidence, HLO text) of ``layout`` realized in ``order``, the state (arg 0) donated."""
    import jax

    mesh = target_mesh(tgt, layout.mesh_axes, list(order))
    r = realize(fn, args, layout, mesh, donate_argnums=(0,))
    t0 = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = r.fn.lower(*r.args).compile(compiler_options=layout.compiler_options or None)
    except Exception as err:  # noqa: BLE001 -- the compiler's verdict
        raise CompileError(f"XLA cannot compile for {tgt.name}: {str(err).splitlines()[0]}") from err
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh, compile_s=time.perf_counter() - t0)
    return ev, compiled.as_text()


def price(ev, hlo: str, order, job: Job, sim: Simulator, flops: float) -> dict[str, Any]:
    """Q2 and the simulator on one compiled program (``hlo``: its HLO text, from which the
    simulator also prices host offload) under one placement."""
    q = predict_step(ev, order, Network.from_target(job.target))
    r = sim.run(ev, order, hlo=hlo)
    n = job.target.num_devices
    peak = job.target.chip.device_peak_flops
    return {"q2_step_s": q.step_s, "q2_compute_s": q.compute_s,
            "q2_communication_s": q.communication_s, "sim_step_s": r.step_s,
            "sim_compute_s": r.compute_s, "sim_communication_s": r.communication_s,
            "mfu_sim": flops / (n * peak * r.step_s) if r.step_s else None,
            "links_sim": [dataclasses.asdict(l) for l in r.busiest_links[:TOP_LINKS]],
            "device_order": list(order)}


def compute_by_kind(ev, module, job: Job) -> dict[str, Any]:
    """The simulator's compute of one compiled program by kind, seconds per step
    (``compute_breakdown``; the same under every placement)."""
    parts = compute_breakdown(module, chip_model(job.target.chip.generation),
                              {o.name: o.count for o in ev.compute})
    return {"sim_compute_by_kind_s": {k: v for k, v in sorted(parts.items()) if v > 0}}


def memory_row(ev) -> dict[str, Any]:
    m = ev.memory
    return {"hbm_bytes_per_chip": m.total_bytes, "hbm_gib_per_chip": m.total_bytes / 2**30,
            "hbm_capacity_gib": m.hbm_bytes / 2**30, "fits_hbm": m.fits,
            "argument_bytes": m.argument_bytes, "temp_bytes": m.temp_bytes,
            "alias_bytes": m.alias_bytes, "compile_s": round(ev.compile_s, 1)}


def expert_row(ex, job: Job, sim: Simulator, flops: float, log,
               compiled: PlannerCompiles | None = None) -> dict[str, Any]:
    """The expert compiled in the default order; ``compiled``: the planner's compiles, reused
    when the planner compiled that very layout and program (a seed)."""
    row = {"name": f"expert:{ex.name}", "valid": ex.valid, "reason": ex.reason,
           "source": ex.source, "remat": ex.remat,
           "mesh": dict(ex.layout.mesh_axes) if ex.valid else None}
    if not ex.valid:
        return row
    row["optimizer_sharding"] = optimizer_sharding(ex.args, ex.layout)
    row["compiler_options"] = dict(ex.layout.compiler_options)
    order = default_device_order(job.target, ex.layout.mesh_axes)
    try:
        got = compiled.get(ex.layout, _program(ex)) if compiled is not None else None
        if got is not None:
            ev, hlo = got
            row["compile"] = "the planner's compile of this seed (the same layout and program)"
        else:
            log(f"  compiling expert {ex.name} {ex.layout.mesh_axes} (default order)")
            ev, hlo = compile_hlo(ex.fn, ex.args, job.target, ex.layout, order)
    except (CompileError, RealizeError) as e:
        row.update(valid=False, reason=f"does not compile: {str(e).splitlines()[0][:300]}")
        return row
    row.update(memory_row(ev))
    if not ev.memory.fits:
        row.update(valid=False, reason="does not fit in HBM: " + ev.memory.oom_message[:200])
        return row
    module = parse_hlo_module(hlo)
    row.update(price(ev, hlo, order, job, sim, flops))
    row.update(compute_by_kind(ev, module, job))
    return row


def add_tuned(out: dict[str, Any], job: Job, sim: Simulator, flops: float, log,
              compiled: PlannerCompiles, tune_compiles: int | None) -> None:
    """The tuned experts' rows (``benchmarks.tuned_rows``) into ``out``; each setting compiled in
    the default order (or the planner's compile of it) and simulated; its compile joins
    ``compiled``, so the expert rows reuse the published settings'."""
    network = Network.from_target(job.target)

    def row_of(v, ev, hlo, order) -> dict[str, Any]:
        module = parse_hlo_module(hlo)
        return {"remat": v.program.get("remat"), "mesh": dict(v.layout.mesh_axes),
                "optimizer_sharding": optimizer_sharding(v.args, v.layout), **memory_row(ev),
                **price(ev, hlo, order, job, sim, flops), **compute_by_kind(ev, module, job)}

    def price_setting(v) -> Priced:
        order = default_device_order(job.target, v.layout.mesh_axes)
        got = compiled.get(v.layout, v.program)
        if got is None:
            log(f"  compiling tuned {v.expert} [{v.knobs.label()}]")
            try:
                got = compile_hlo(v.fn, v.args, job.target, v.layout, order)
            except (CompileError, RealizeError) as e:
                return Priced(None, None, f"does not compile: {str(e).splitlines()[0][:200]}")
            if got[0].memory.fits:
                compiled.add(v.layout, v.program, *got)
        ev, hlo = got
        if not ev.memory.fits:
            return Priced(None, False, "does not fit in HBM: " + ev.memory.oom_message[:200])
        return Priced(None, True, detail={}) if hlo is None else _priced(row_of(v, ev, hlo,
                                                                                order))

    def solved(t) -> dict[str, Any] | None:
        v = t.best.variant
        got = compiled.get(v.layout, v.program)
        if got is None or got[1] is None:
            return None
        order, how = solved_order(got[0], network,
                                  default_device_order(job.target, v.layout.mesh_axes))
        return {**row_of(v, got[0], got[1], order), "description": how}

    try:
        rows, out["tuning"] = tuned_expert_rows(job, price_setting, solved, log, tune_compiles)
        out["rows"] += rows
    except Exception:  # noqa: BLE001 -- recorded, the cell goes on
        out["errors"].append({"where": "tuned", "error": traceback.format_exc()[-2000:]})


def _priced(row: dict[str, Any]) -> Priced:
    return Priced(row.get("sim_step_s"), True, detail=row)


def alpa_row(job: Job, sim: Simulator, flops: float, log) -> dict[str, Any]:
    """Alpa-style logical search (``compare.alpa_logical``: the sharding ILP with fixed,
    placement-oblivious alpha-beta costs on every candidate mesh, ``ALPA_ILP_TIME_S`` each, the
    best by Q1) on the step as the job traces it, compiled in ``jax.make_mesh``'s order."""
    log("  Alpa-style logical search")
    best, t = alpa_logical(job, seed=0, time_limit_s=ALPA_ILP_TIME_S)
    row: dict[str, Any] = {"name": "alpa-logical", "valid": best is not None,
                           "planning_time_s": t}
    if best is None:
        return {**row, "reason": "the ILP finds no layout that fits on any mesh"}
    layout = best[1].layout
    order = default_device_order(job.target, layout.mesh_axes)
    row.update(mesh=dict(layout.mesh_axes), q1_s=best[0],
               remat=layout.remat if layout.remat is not None else job.remat or "none",
               optimizer_sharding=optimizer_sharding(job.args, layout))
    log(f"  compiling alpa-logical {layout.mesh_axes} (default order)")
    try:
        ev, hlo = compile_hlo(job.fn, job.args, job.target, layout, order)
    except (CompileError, RealizeError) as e:
        return {**row, "valid": False, "reason": f"does not compile: {str(e).splitlines()[0][:300]}"}
    row.update(memory_row(ev))
    if not ev.memory.fits:
        return {**row, "valid": False, "reason": "does not fit in HBM: " + ev.memory.oom_message[:200]}
    module = parse_hlo_module(hlo)
    row.update(price(ev, hlo, order, job, sim, flops))
    row.update(compute_by_kind(ev, module, job))
    return row


def _program(ex) -> dict[str, Any]:
    return {"pad_multiple": ex.pad_multiple, "remat": ex.remat}


def plan_rows(job: Job, budget: float, seed: int, sim: Simulator, flops: float, log,
              compiled: PlannerCompiles, compiles: int | None = None):
    """(plan summary, [plan row, plan-layout-in-default-order row]); ``compiled`` collects the
    planner's compiles (call inside ``keeping_hlo``); ``compiles``: the planner's budget in
    candidate compiles (``budget`` seconds its guard)."""
    seeds = expert_seed_layouts(job)
    t0 = time.perf_counter()
    p = make_plan(job.fn, *job.args, target=job.target, time_budget_s=budget, seed=seed,
                  seed_layouts=seeds, progress=_LogProgress(log), on_candidate=compiled,
                  compiles=compiles)
    wall = time.perf_counter() - t0
    if not p.program:
        p.program = job.program()
    pj = plan_job(job, p)
    summary = {"planning_time_s": p.planning_time_s, "planning_wall_s": wall,
               "status": p.status, "mesh": p.mesh, "layout_name": p.layout.name,
               "program": p.program, "q2_predicted": {k: v for k, v in p.predicted.items()
                                                      if k != "links"},
               "q2_links": (p.predicted.get("links") or [])[:TOP_LINKS],
               "iterations": len(p.iterations), "time_limited": p.time_limited,
               "layout_in_words": list(p.layout_in_words), "notes": list(p.notes),
               "plan": p.to_json()}
    log(f"  plan: {p.layout.name} mesh {p.mesh}, Q2 {p.predicted['step_s'] * 1e3:.2f} ms")
    got = compiled.get(p.layout, p.program)
    if got is None:
        log("  compiling the plan again for its HLO")
        got = compile_hlo(pj.fn, pj.args, job.target, p.layout, p.device_order)
    ev, hlo = got
    remat = p.layout.remat if p.layout.remat is not None else p.program.get(
        "remat", job.remat or "none")
    common = {"remat": remat,
              "optimizer_sharding": optimizer_sharding(pj.args, p.layout),
              "mesh": dict(p.layout.mesh_axes), "valid": True, **memory_row(ev)}
    module = parse_hlo_module(hlo)              # one program: parsed and broken down once
    common.update(compute_by_kind(ev, module, job))
    rows = [{"name": "aoizora", **common, **price(ev, hlo, p.device_order, job, sim, flops)}]
    default = default_device_order(job.target, p.layout.mesh_axes)
    rows.append({"name": "aoizora-layout/default-order", **common,
                 **price(ev, hlo, default, job, sim, flops)})
    return summary, rows


def run_cell(cell: Cell, budget: float, seed: int, log=print, alpa: bool = True,
             compiles: int | None = None, tuned: int | bool | None = None) -> dict[str, Any]:
    """One training cell's JSON-ready record (module docstring); ``compiles``: the planner's
    budget in candidate compiles, ``budget`` seconds then its guard; ``tuned``: the tuned
    experts' rows too (``benchmarks.tuned_rows``; True: every setting, an int: at most that many
    settings compiled per expert)."""
    job = builtin_job(cell.model, None, None, cell.target, workload=cell.workload, task="train",
                      batch=cell.batch)
    sim = Simulator(job.target)
    flops = model_flops(job)
    out: dict[str, Any] = {"cell": cell.name, **dataclasses.asdict(cell), "budget_s": budget,
                           "compiles": compiles,
                           "seed": seed, "machine": machine_info(), "git": git_state(),
                           "tokens": job.workload.tokens, "padded_tokens": job.padded_tokens,
                           "model_flops": flops, "labels": {"q2": Q2_LABEL, "sim": SIM_LABEL},
                           "rows": [], "errors": []}
    compiled = PlannerCompiles(job)
    with tempfile.TemporaryDirectory(prefix="aoizora-training-hlo-") as d, keeping_hlo(d):
        try:
            out["plan"], rows = plan_rows(job, budget, seed, sim, flops["flops"], log, compiled,
                                          compiles)
            out["rows"] += rows
        except Exception as e:  # noqa: BLE001 -- recorded, the cell goes on
            out["errors"].append({"where": "plan", "error": traceback.format_exc()[-2000:]})
            log(f"  plan failed: {e}")
        if tuned:
            add_tuned(out, job, sim, flops["flops"], log, compiled,
                      None if tuned is True else int(tuned))
        for ex in training_expert_layouts(job.model, job.workload, job.target, job.batch):
            try:
                out["rows"].append(expert_row(ex, job, sim, flops["flops"], log, compiled))
            except Exception as e:  # noqa: BLE001
                out["errors"].append({"where": ex.name, "error": traceback.format_exc()[-2000:]})
                log(f"  expert {ex.name} failed: {e}")
    if alpa:
        add_alpa(out, job, sim, flops["flops"], log)
    finish(out)
    out["machine_end"] = machine_info()
    return out


def add_alpa(out: dict[str, Any], job: Job, sim: Simulator, flops: float, log) -> None:
    """The cell's ``alpa_row`` (replacing one it had); a failure is recorded in its errors."""
    out["rows"] = [r for r in out["rows"] if r["name"] != "alpa-logical"]
    out["errors"] = [e for e in out["errors"] if e.get("where") != "alpa-logical"]
    try:
        out["rows"].append(alpa_row(job, sim, flops, log))
    except Exception as e:  # noqa: BLE001 -- recorded, the cell goes on
        out["errors"].append({"where": "alpa-logical", "error": traceback.format_exc()[-2000:]})
        log(f"  Alpa-style search failed: {e}")


def alpa_only(path: Path, log=print) -> dict[str, Any]:
    """A written cell with its Alpa-style row (re)computed, the rest as written."""
    out = json.loads(path.read_text())
    job = builtin_job(out["model"], None, None, out["target"], workload=out["workload"],
                      task="train", batch=out["batch"])
    add_alpa(out, job, Simulator(job.target), out["model_flops"]["flops"], log)
    out["alpa_git"] = git_state()
    finish(out)
    return out


def finish(out: dict[str, Any]) -> None:
    """Speedups over each baseline and the placement gain (simulated and Q2)."""
    rows = {r["name"]: r for r in out["rows"]}
    plan = rows.get("aoizora")
    if not plan:
        return
    for r in out["rows"]:
        if r.get("sim_step_s") and plan.get("sim_step_s"):
            r["speedup_sim"] = r["sim_step_s"] / plan["sim_step_s"]
            r["speedup_q2"] = r["q2_step_s"] / plan["q2_step_s"]
    d = rows.get("aoizora-layout/default-order")
    if d and d.get("sim_step_s"):
        out["placement_gain_sim"] = d["sim_step_s"] / plan["sim_step_s"] - 1
        out["placement_gain_q2"] = d["q2_step_s"] / plan["q2_step_s"] - 1
    experts = [r for r in out["rows"] if r["name"].startswith("expert:") and r.get("sim_step_s")]
    if experts:
        best = min(experts, key=lambda r: r["sim_step_s"])
        out["best_expert"] = best["name"]
        out["speedup_over_best_expert_sim"] = best["speedup_sim"]
    bt = rows.get("best-tuned-expert")
    if bt and bt.get("speedup_sim"):
        out["best_tuned_expert"] = f"{bt.get('expert')} [{bt.get('knobs')}]"
        out["speedup_over_best_tuned_expert_sim"] = bt["speedup_sim"]


class _LogProgress(Progress):
    def __init__(self, log):
        self.log, self.t0 = log, time.perf_counter()

    def stage(self, text):
        self.log(f"  {time.perf_counter() - self.t0:7.1f}s {text}")

    def candidate(self, k, total, text):
        self.stage(f"candidate {k}/{total}: {text}")

    def note(self, text):
        self.stage(text)


def write_cell(out: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{out['cell']}.json"
    atomic_write(path, json.dumps(out, indent=1, default=str) + "\n")
    return path


def _ms(x) -> str:
    return f"{x * 1e3:.1f}" if x else "-"


def report(directory: Path = RESULTS) -> list[str]:
    """The markdown summary of every written cell."""
    cells = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))]
    lines = ["# Training grid: Wan 2.1 training steps on v5p", "",
             f"Generated by `python -m benchmarks.training_grid --report` (module docstring: "
             f"what each row is). **No TPU ran**: `Q2 ms` is {Q2_LABEL}, `sim ms` is {SIM_LABEL} "
             f"on the compiled HLO; both for the program libtpu compiled ahead of time for the "
             f"target. Speedup = row's simulated step / the plan's (> 1: the plan faster). MFU = "
             f"model FLOPs / (chips x bf16 peak x simulated step), model FLOPs = 6 x params x B x S"
             f" + 12 x layers x B x S x (S + S_text) x dim. HBM: the compiler's memory analysis, "
             f"per chip, state donated. `commit`: the code each cell ran at (cells of different "
             f"commits were planned and priced by different code: CHANGELOG.md says what "
             f"changed).", ""]
    lines += summary_lines(cells)
    for c in cells:
        lines += cell_lines(c)
    return lines


def summary_lines(cells: list[dict[str, Any]]) -> list[str]:
    """One row per cell (the plan against the best expert, simulated and Q2) and, per target, the
    geometric mean of the simulated speedup over the best expert."""
    out = ["## Summary", "",
           "| cell | commit | plan | remat | best expert | speedup (sim) | speedup (Q2) | best "
           "tuned expert | over it (sim) | over Alpa-style (sim) | MFU (sim) | placement gain "
           "(sim) | HBM GiB/chip |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    per_target: dict[str, list[float]] = {}
    per_target_tuned: dict[str, list[float]] = {}
    for c in cells:
        rows = {r["name"]: r for r in c["rows"]}
        plan, best = rows.get("aoizora"), rows.get(c.get("best_expert") or "")
        if not plan or not best:
            out.append(f"| {c['cell']} | {_commit(c)} |" + " - |" * 11)
            continue
        sp = best["sim_step_s"] / plan["sim_step_s"]
        per_target.setdefault(c["target"], []).append(sp)
        gain = c.get("placement_gain_sim")
        name = (c.get("plan") or {}).get("layout_name", "-")
        tuned = c.get("speedup_over_best_tuned_expert_sim")
        if tuned:
            per_target_tuned.setdefault(c["target"], []).append(tuned)
        out.append(f"| {c['cell']} | {_commit(c)} | `{name}` | "
                   f"{_remat(plan.get('remat'))} | {best['name']} | {sp:.3f}x | "
                   f"{best['q2_step_s'] / plan['q2_step_s']:.3f}x | "
                   f"{c.get('best_tuned_expert') or 'not run'} | "
                   f"{f'{tuned:.3f}x' if tuned else '-'} | {_alpa(rows)} | "
                   f"{100 * plan['mfu_sim']:.1f}% | "
                   f"{'-' if gain is None else f'{100 * gain:+.1f}%'} | "
                   f"{plan['hbm_gib_per_chip']:.1f} |")
    out.append("")
    for tgt, sps in sorted(per_target.items()):
        g = math.exp(sum(math.log(x) for x in sps) / len(sps))
        out.append(f"- {tgt}: geometric mean over the best expert {g:.3f}x (simulated) over "
                   f"{len(sps)} cell(s); never slower than the best expert: "
                   f"{'yes' if min(sps) >= 1 - 1e-9 else 'no'}.")
    for tgt, sps in sorted(per_target_tuned.items()):
        out.append(f"- {tgt}, against the best tuned expert (each expert at the best of its "
                   f"users' remat, attention blocks and compiler options): geometric mean "
                   f"{statistics.geometric_mean(sps):.3f}x, median {statistics.median(sps):.3f}x, "
                   f"worst {min(sps):.3f}x (simulated) over {len(sps)} cell(s).")
    return out + [""]


def _commit(c: dict[str, Any]) -> str:
    """The commit the cell ran at (its code: a cell of an older commit priced otherwise)."""
    return str((c.get("git") or {}).get("git_commit") or "?")[:7]


def _alpa(rows: dict[str, Any]) -> str:
    r = rows.get("alpa-logical")
    if not r:
        return "not run"
    return f"{r['speedup_sim']:.3f}x" if r.get("speedup_sim") else "no plan"


def cell_lines(c: dict[str, Any]) -> list[str]:
    f = c["model_flops"]
    p = c.get("plan") or {}
    out = [f"## {c['model']} {c['workload']}, batch {c['batch']}, {c['target']}", "",
           f"The plan: `{p.get('layout_name', '-')}` on mesh {p.get('mesh')}"
           f" ({'; '.join(p.get('layout_in_words', [])[:4])}).", "",
           f"{c['tokens']:,} video tokens (padded to {c['padded_tokens']:,}); model FLOPs "
           f"{f['flops'] / 1e12:.1f} TFLOP per step ({f['dense'] / 1e12:.1f} dense + "
           f"{f['attention'] / 1e12:.1f} attention). Planning budget {c['budget_s']:g} s, "
           f"planning time {p.get('planning_time_s', 0):.0f} s, status {p.get('status', '-')}; "
           f"machine {c['machine'].get('cpus')} CPUs, load {c['machine'].get('loadavg', [0])[0]:.1f}"
           f", {c['machine'].get('date')}.", "",
           "| row | mesh | remat | AdamW moments | Q2 ms | sim ms | speedup (sim) | MFU (sim) "
           "| HBM GiB/chip | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in c["rows"]:
        mesh = "x".join(f"{k}{v}" for k, v in (r.get("mesh") or {}).items()) or "-"
        sp = f"{r['speedup_sim']:.3f}x" if r.get("speedup_sim") else "-"
        mfu = f"{100 * r['mfu_sim']:.1f}%" if r.get("mfu_sim") else "-"
        hbm = f"{r['hbm_gib_per_chip']:.1f}" if r.get("hbm_gib_per_chip") else "-"
        note = "" if r.get("sim_step_s") else (r.get("reason") or "")[:120]
        out.append(f"| {r['name']} | {mesh} | {_remat(r.get('remat'))} | "
                   f"{r.get('optimizer_sharding') or '-'} | {_ms(r.get('q2_step_s'))} | "
                   f"{_ms(r.get('sim_step_s'))} | {sp} | {mfu} | {hbm} | {note} |")
    if c.get("placement_gain_sim") is not None:
        out += ["", f"Placement alone (the plan's layout, its placement vs `jax.make_mesh`'s "
                    f"order): {100 * c['placement_gain_sim']:+.2f}% simulated, "
                    f"{100 * c['placement_gain_q2']:+.2f}% predicted (Q2)."]
        plan_row = next(r for r in c["rows"] if r["name"] == "aoizora")
        for what, row in (("the plan", plan_row),
                          ("`jax.make_mesh`'s order", next(
                              (r for r in c["rows"] if r["name"] == "aoizora-layout/default-order"),
                              None))):
            if row is None:
                continue
            links = ", ".join(f"{l['src']}->{l['dst']} {l['utilization'] * 100:.0f}% busy "
                              f"({l['bytes'] / 2**20:.0f} MiB)" for l in row["links_sim"])
            out.append(f"Busiest links under {what} (simulated; device order "
                       f"{row.get('device_order')}): {links or '-'}.")
        out += remat_lines(c, plan_row)
        out += where_the_step_goes(c, plan_row)
    for e in c.get("errors", []):
        out.append(f"Error ({e['where']}): `{e['error'].strip().splitlines()[-1][:200]}`")
    return out + [""]


def remat_lines(c: dict[str, Any], plan_row: dict[str, Any]) -> list[str]:
    """Where the plan's remat differs from every compiled expert's: what it keeps, the HBM it
    leaves, and its simulated step against the best expert's (the layouts differ too, so this
    is not the remat's own share)."""
    experts = [r for r in c["rows"] if r["name"].startswith("expert:") and r.get("sim_step_s")]
    mine = _remat(plan_row.get("remat"))
    if not experts or not plan_row.get("sim_step_s") or any(
            _remat(r.get("remat")) == mine for r in experts):
        return []
    best = min(experts, key=lambda r: r["sim_step_s"])
    left = (plan_row.get("hbm_capacity_gib") or 0) - (plan_row.get("hbm_gib_per_chip") or 0)
    kinds = sorted({_remat(r.get("remat")) for r in experts})
    return [f"Remat: the plan's ({mine}) differs from every expert's ({'; '.join(kinds)}); it "
            f"uses {plan_row.get('hbm_gib_per_chip', 0):.1f} GiB per chip, leaving {left:.1f} GiB "
            f"of {plan_row.get('hbm_capacity_gib', 0):.1f} GiB (the compiler's memory analysis); "
            f"its simulated step is {plan_row['sim_step_s'] * 1e3:.1f} ms against the best "
            f"expert's {best['sim_step_s'] * 1e3:.1f} ms ({best['name']}, {_remat(best.get('remat'))}); "
            f"the layouts and kernel blocks differ too, so that gain is not the remat's alone."]


MFU_EXPLAINED_BELOW = 0.40


def where_the_step_goes(c: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """For a plan under ``MFU_EXPLAINED_BELOW`` MFU: its simulated step against the model FLOPs
    at peak, split into the simulator's compute by kind and the exposed communication."""
    parts = row.get("sim_compute_by_kind_s")
    if not parts or not row.get("mfu_sim") or row["mfu_sim"] >= MFU_EXPLAINED_BELOW:
        return []
    step = row["sim_step_s"]
    ideal = row["mfu_sim"] * step
    exposed = max(step - row["sim_compute_s"], 0.0)
    items = sorted(parts.items(), key=lambda kv: -kv[1]) + [("exposed communication", exposed)]
    words = ", ".join(f"{k} {v * 1e3:.1f} ms ({100 * v / step:.0f}%)" for k, v in items
                      if v >= 5e-5)
    att = sum(v for k, v in parts.items() if k.startswith("attention"))
    return [f"Where the plan's {step * 1e3:.1f} ms go (simulated; MFU {100 * row['mfu_sim']:.1f}%"
            f": the model FLOPs at peak would take {ideal * 1e3:.1f} ms): {words}. Attention "
            f"kernels take {100 * att / step:.0f}% of the step, where the attention's model "
            f"FLOPs ({c['model_flops']['attention'] / 1e12:.1f} TFLOP) at peak would take "
            f"{ideal * c['model_flops']['attention'] / c['model_flops']['flops'] * 1e3:.1f} ms."]


def _remat(r) -> str:
    if isinstance(r, (list, tuple)):
        r = dict(r)
    if isinstance(r, dict) and r and set(r.values()) == {"keep"}:
        return f"all {len(r)} named activations kept (rest recomputed)"
    if isinstance(r, dict):
        return ", ".join(f"{k}: {v}" for k, v in sorted(r.items())) + " (rest recomputed)"
    if r == "none":
        return "none (every residual kept)"
    return str(r) if r else "-"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.training_grid",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--cells", default="", help="comma-separated cell names (default: all)")
    ap.add_argument("--budget", type=float, default=300.0, help="planning budget per cell, s "
                    "(with --compiles: the wall clock's guard)")
    ap.add_argument("--compiles", type=int, default=None,
                    help="planning budget per cell in candidate compiles")
    ap.add_argument("--tuned-experts", action="store_true", help="also each expert at the best "
                    "of its users' knobs, the best of them, and that one under a solved placement")
    ap.add_argument("--tune-compiles", type=int, default=None,
                    help="with --tuned-experts: at most this many settings compiled per expert")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--summary", default=str(SUMMARY))
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--report", action="store_true", help="only write the summary")
    ap.add_argument("--no-alpa", action="store_true", help="skip the Alpa-style row")
    ap.add_argument("--alpa-only", action="store_true",
                    help="add the Alpa-style row to written cells, the rest as written")
    a = ap.parse_args(argv)
    cells = training_cells()
    if a.list:
        print("\n".join(c.name for c in cells))
        return 0
    out_dir = Path(a.out)
    if not a.report:
        want = [c for c in cells if not a.cells or c.name in a.cells.split(",")]
        known = {c.name for c in cells}
        extra = [x for x in a.cells.split(",") if x and x not in known]
        want += [Cell(*_parse(x)) for x in extra]
        for c in want:
            if a.alpa_only:
                if (out_dir / f"{c.name}.json").exists():
                    print(f"cell {c.name}: Alpa-style row", flush=True)
                    write_cell(alpa_only(out_dir / f"{c.name}.json",
                                         log=lambda s: print(s, flush=True)), out_dir)
                continue
            if (out_dir / f"{c.name}.json").exists() and not a.force:
                continue
            print(f"cell {c.name}", flush=True)
            write_cell(run_cell(c, a.budget, a.seed, log=lambda s: print(s, flush=True),
                                alpa=not a.no_alpa, compiles=a.compiles,
                                tuned=(a.tune_compiles or True) if a.tuned_experts else None),
                       out_dir)
    atomic_write(Path(a.summary), "\n".join(report(out_dir)) + "\n")
    return 0


def _parse(name: str) -> tuple:
    """A cell name model_workload_bB_target back into its fields (any model, e.g. wan2.1-small)."""
    model, workload, b, target = name.split("_")
    return model, workload, int(b[1:]), target


if __name__ == "__main__":
    raise SystemExit(main())
