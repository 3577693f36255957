"""AoiZora's plan against today's practice, on one model, workload and target.

Rows (every latency predicted by the Q2 link-load model on the compiled TPU program):
- ``aoizora``: the plan (its layout, its placement);
- ``aoizora-layout/default-order``: the plan's layout under JAX's default device order (the
  ablation that isolates placement);
- ``alpa-logical``: the sharding ILP with fixed, placement-oblivious alpha-beta costs (Alpa's
  model), its best layout compiled and placed in JAX's default order;
- ``expert:NAME``: each expert configuration (``models.experts``) in JAX's default order, or the
  reason it is rejected.
``speedup`` = baseline step / AoiZora step (> 1: AoiZora faster).
"""

from __future__ import annotations

import time
from typing import Any

from aoizora.builtin import Job
from aoizora.extract.aot_compile import CompileError
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.latency import predict_step
from aoizora.models.experts import expert_layouts
from aoizora.planner import compile_layout, plan as make_plan
from aoizora.plans import Plan
from aoizora.planning.progress import Progress
from aoizora.runtime.realize import RealizeError
from aoizora.solvers.sharding import ShardingSolveError, solve_sharding


def _row(name: str, **kw) -> dict[str, Any]:
    r = {"name": name, "valid": True, "reason": "", "mesh": None, "step_s": None,
         "compute_s": None, "communication_s": None, "fits_hbm": None, "planning_time_s": None,
         "source": "predicted (Q2 link-load model on the compiled TPU program)"}
    r.update(kw)
    return r


def price_default_order(fn, args, job: Job, layout, network: Network) -> dict[str, Any]:
    """Compile `layout` in JAX's default device order and price it with Q2."""
    order = default_device_order(job.target, layout.mesh_axes)
    try:
        ev = compile_layout(fn, args, job.target, layout, order)
    except (CompileError, RealizeError) as e:
        return {"valid": False, "reason": str(e).splitlines()[0], "mesh": dict(layout.mesh_axes)}
    out = {"mesh": dict(layout.mesh_axes), "fits_hbm": ev.memory.fits,
           "device_order": order, "compile_s": ev.compile_s}
    if not ev.memory.fits:
        out.update(valid=False, reason="does not fit in HBM: " + ev.memory.oom_message[:160])
        return out
    q = predict_step(ev, order, network)
    out.update(step_s=q.step_s, compute_s=q.compute_s, communication_s=q.communication_s,
               latency_s=q.latency_s)
    out["evidence"] = ev
    return out


def compare(job: Job, *, plan: Plan | None = None, time_budget_s: float = 120.0, seed: int = 0,
            progress: Progress | None = None, keep_evidence: bool = False) -> dict[str, Any]:
    progress = progress or Progress()
    network = Network.from_target(job.target)
    rows = []
    if plan is None:
        progress.stage(f"planning {job.describe()}")
        from aoizora.builtin import expert_seed_layouts

        plan = make_plan(job.fn, *job.args, target=job.target, time_budget_s=time_budget_s,
                         seed_layouts=expert_seed_layouts(job),
                         seed=seed, progress=progress)
    pr = plan.predicted
    rows.append(_row("aoizora", mesh=plan.mesh, step_s=pr["step_s"], compute_s=pr["compute_s"],
                     communication_s=pr["communication_s"], fits_hbm=plan.fits_hbm,
                     planning_time_s=plan.planning_time_s, device_order=plan.device_order))
    progress.stage("AoiZora's layout under JAX's default device order")
    pj = plan_job(job, plan)
    d = price_default_order(pj.fn, pj.args, job, plan.layout, network)
    rows.append(_row("aoizora-layout/default-order", **_clean(d, keep_evidence)))

    progress.stage("Alpa-style logical search (fixed alpha-beta, default order)")
    best, alpa_t = alpa_logical(job, seed=seed)
    if best is None:
        rows.append(_row("alpa-logical", valid=False, reason="no layout fits on any mesh"))
    else:
        d = price_default_order(job.fn, job.args, job, best[1].layout, network)
        rows.append(_row("alpa-logical", planning_time_s=alpa_t, q1_s=best[0],
                         **_clean(d, keep_evidence)))

    for ex in job_experts(job):
        progress.stage(f"expert configuration {ex.name}")
        if not ex.valid:
            rows.append(_row(f"expert:{ex.name}", valid=False, reason=ex.reason))
            continue
        d = price_default_order(ex.fn, ex.args, job, ex.layout, network)
        rows.append(_row(f"expert:{ex.name}", description=ex.reason, **_clean(d, keep_evidence)))

    base = rows[0]["step_s"]
    for r in rows:
        r["speedup"] = (r["step_s"] / base) if (r.get("step_s") and base) else None
    experts = [r for r in rows if r["name"].startswith("expert:") and r.get("step_s")]
    best_expert = min(experts, key=lambda r: r["step_s"]) if experts else None
    return {"model": job.model.name, "workload": job.workload.name, "target": job.target.name,
            "tokens": job.workload.tokens, "padded_tokens": job.padded_tokens,
            "rows": rows, "best_expert": best_expert["name"] if best_expert else None,
            "speedup_over_best_expert": best_expert["speedup"] if best_expert else None,
            "plan": plan}


def job_experts(job: Job) -> list:
    """The expert configurations of the job's task: inference (``models.experts``) or training
    (``models.training_experts``, each with its own train step and remat)."""
    if getattr(job, "task", "denoise") == "train":
        from aoizora.models.training_experts import training_expert_layouts

        return training_expert_layouts(job.model, job.workload, job.target, job.batch)
    return expert_layouts(job.model, job.workload, job.target)


def alpa_logical(job: Job, *, seed: int = 0, time_limit_s: float = 30.0):
    """Alpa-style logical search: the sharding ILP with fixed, placement-oblivious alpha-beta
    costs on every candidate mesh; the best by Q1. Returns ((q1_s, ShardingSolution) or None,
    seconds spent)."""
    from aoizora.formulation.meshes import candidate_meshes

    t0 = time.perf_counter()
    ir = build_ir(job.fn, *job.args)
    best = None
    for m in candidate_meshes(job.target.num_devices):
        try:
            res = solve_sharding(ir, job.target, m, time_limit_s=time_limit_s, seed=seed)
        except ShardingSolveError:
            continue
        q1 = res.best.predicted["total_s"]
        if best is None or q1 < best[0]:
            best = (q1, res.best)
    return best, time.perf_counter() - t0


def plan_job(job: Job, plan: Plan) -> Job:
    """The job's program in the variant the plan was made for (e.g. a seed's smaller padding)."""
    from aoizora.builtin import builtin_job

    prog = plan.program or {}
    pad, remat = prog.get("pad_multiple"), prog.get("remat")
    if (not pad or pad == job.pad_multiple) and remat == getattr(job, "remat", None):
        return job
    return builtin_job(job.model.name, None, None, job.target, workload=job.workload.name,
                       pad_multiple=pad or job.pad_multiple, task=getattr(job, "task", "denoise"),
                       batch=getattr(job, "batch", 1), remat=remat)


def _clean(d: dict[str, Any], keep_evidence: bool) -> dict[str, Any]:
    d = dict(d)
    if not keep_evidence:
        d.pop("evidence", None)
    return d
