"""``plan_torch``: plan a PyTorch module with the same ILP, placement CP-SAT and Q2 as ``plan``.

    ep    = capture(model, example_inputs)         torch.export on meta tensors, no weights
    ir    = build_torch_ir(ep)                     the partitioner IR (extract.frontends.torch)
    per candidate mesh: the sharding ILP's ``top_k`` best layouts (solvers.sharding, unchanged)
    + the seed layouts given (e.g. xDiT's configurations, ``aoizora.models.xdit``), each
      priced by the same Q1 (``aoizora.planning.seed_q1``: the ILP's objective at the seed)
    the first ``max_candidates``, least Q1 first (a seed Q1 cannot price after all that it
    can), while the budget lasts:
        evidence = torch_evidence(ep, layout)      the DTensor program under a fake process
                                                   group: every collective it issues
                                                   (CommDebugMode), compute at shard shapes
        placement CP-SAT + Q2 (candidate_pricing.place, unchanged)
    the least Q2 step -> Plan

The evidence source is the sharded program itself (DTensor's collectives), not a compiler:
no XLA or Inductor compile runs. The plan says so (``predicted["evidence"]``, ``notes``).
The torch runtime gathers attention keys and values (context parallel, Ulysses); a ring is not
offered to the ILP (its ring variants are priced out by an attention scale, ``NO_RING``). The
runtime's reshards are DTensor's ``redistribute``, and the ILP prices them so
(``torch_problem``): on l40-8 the XLA pricing took Wan 2.1 1.3B's ``(seq on x, y) -> (seq on y)``
for one all-gather over x of a quarter of the tensor, where DTensor gathers the whole of it over
y and then x (4x the bytes on the slow cross-socket axis, in every block).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from aoizora.extract.network import Network
from aoizora.extract.targets import Target, get_target
from aoizora.formulation.layout import Layout
from aoizora.formulation.meshes import candidate_meshes
from aoizora.formulation.strategies import Options
from aoizora.planning.candidate import Candidate, mesh_str
from aoizora.planning.candidate_pricing import place
from aoizora.planning.compile_queue import Compiled
from aoizora.planning.plan_assembly import link_seconds
from aoizora.planning.progress import Progress
from aoizora.planning.seeds import seed_solution
from aoizora.planning.torch_proxy import block_proxy, map_layout, proxy_note, repeated_blocks
from aoizora.planning_errors import BudgetError, PlanningError
from aoizora.plans import Plan, PlanKey
from aoizora.solvers.budget import Budget, clock
from aoizora.solvers.sharding import (MemoryBudgetError, ShardingProblem, ShardingSolveError,
                                     solve_sharding)

NO_RING = {"*": {"ring": 1e3}}   # attention_scale: a ring costs 1000x its compute (not offered)
EVIDENCE = ("DTensor program under a fake process group: collectives recorded by "
            "torch.distributed.tensor.debug.CommDebugMode (kind, bytes, mesh dimension); "
            "attention by a flash-attention kernel model at shard shapes; other ops at the "
            "target's peak FLOP/s and HBM bandwidth")


@dataclasses.dataclass
class _Settings:          # what candidate_pricing.place reads
    seed: int
    placement_time_s: float
    workers: int = 1


@dataclasses.dataclass
class _Program:           # what candidate_pricing.place reads
    target: Target
    network: Network


def torch_plan_key(ep, target: str) -> PlanKey:
    """The plan key of a captured program: ``capture.graph_digest`` and ``capture.input_shapes``
    (every flattened input, as ``Layout.in_specs`` lays them out)."""
    from aoizora.extract.frontends.torch.capture import graph_digest, input_shapes

    return PlanKey(graph_digest(ep), input_shapes(ep), target)


def torch_problem() -> ShardingProblem:
    """The sharding ILP's instance for a torch program: no ring (``NO_RING``), and reshards
    priced as DTensor's ``redistribute`` runs them (``strategies.dtensor_reshard_cost``), not as
    XLA's SPMD partitioner would: one after the other, none hidden behind compute (no prefetch
    overlap, ``formulation.prefetch``: the DTensor program issues them in place)."""
    return ShardingProblem(attention_scale=NO_RING,
                           options=Options(dtensor=True, prefetch_room=0.0))


def _ilp_layouts(ir, tgt: Target, meshes, budget: Budget, top_k: int, ilp_time_s: float,
                 seed: int, progress: Progress) -> tuple[list, list[str]]:
    ranked, notes = [], []
    for m in sorted(meshes, key=lambda m: (len(m), list(m.values()))):
        if ranked and budget.left() < 0.5 * budget.total_s:
            notes.append(f"mesh {mesh_str(m)}: ILP skipped (half the time budget is kept for "
                         "evidence and placement)")
            continue
        limit = max(1.0, min(ilp_time_s, 0.4 * budget.left()))
        try:
            res = solve_sharding(ir, tgt, m, torch_problem(), k_best=top_k, time_limit_s=limit,
                                 seed=seed)
        except (MemoryBudgetError, ShardingSolveError) as e:
            notes.append(f"mesh {mesh_str(m)}: {str(e).splitlines()[0]}")
            continue
        c = res.certificate
        progress.solver(f"sharding ILP {mesh_str(m)}", c.status, c.objective, c.bound)
        ranked += [(float(s.predicted.get("total_s", math.inf)), m, s) for s in res.all()]
    return ranked, notes


def _seed_q1s(ir, ilp_ir, blocks, tgt: Target, seed_layouts) -> list[tuple]:
    """(Q1 or None, layout on ``ir``, why no Q1) per seed: Q1 on the IR the ILP solves
    (``seed_q1``): a callable seed is laid out on that IR itself, a fixed layout is carried to
    the proxy (``map_layout`` from the full program's blocks)."""
    from aoizora.planning.seed_q1 import SeedQ1Error, seed_q1

    graphs: dict = {}
    out = []
    for s in seed_layouts:
        lay = s(ir) if callable(s) else s
        try:
            if callable(s):
                on_ilp = s(ilp_ir) if ilp_ir is not ir else lay
            else:
                on_ilp = lay if blocks is None else map_layout(ir, ilp_ir, lay, blocks[0])
            out.append((seed_q1(ilp_ir, tgt, on_ilp, torch_problem(), graphs), lay, ""))
        except (SeedQ1Error, KeyError, ValueError) as e:
            out.append((None, lay, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"))
    return out


def _ranked_todo(ir, ilp_ir, blocks, tgt: Target, seed_layouts, ranked: list
                 ) -> tuple[list, list[str]]:
    """Seeds and ILP layouts in one Q1 order (least first; ties by mesh, then layout name),
    then the seeds Q1 cannot price (by mesh and name), never dropped; and the notes saying so."""
    notes, priced, unpriced = [], [], []
    for q1, lay, why in _seed_q1s(ir, ilp_ir, blocks, tgt, seed_layouts):
        sol = seed_solution(lay, None)
        if q1 is None:
            unpriced.append((math.inf, dict(lay.mesh_axes), sol, lay))
            notes.append(f"seed {lay.name or 'given layout'}: no Q1 ({why}); ranked after every "
                         "layout Q1 prices")
            continue
        sol.predicted["total_s"] = q1
        priced.append((q1, dict(lay.mesh_axes), sol, lay))
    priced += [(q1, m, s, None) for q1, m, s in ranked]

    def key(r):
        return (r[0], mesh_str(r[1]), r[2].layout.name or "")
    if seed_layouts:
        notes.append("seeds ranked with the ILP's layouts by the ILP's Q1 (aoizora.planning."
                     "seed_q1)" + ("; Q1 on the ILP's proxy" if blocks is not None else ""))
    return sorted(priced, key=key) + sorted(unpriced, key=lambda r: key(r)[1:]), notes


def _price(ep, cand: Candidate, prog: _Program, budget: Budget, settings: _Settings,
           progress: Progress) -> Candidate:
    from aoizora.runtime.torch_evidence import torch_evidence
    from aoizora.runtime.torch_layout import TorchLayoutError

    t0 = clock()
    try:
        ev, err = torch_evidence(ep, cand.solution.layout, prog.target), ""
    except TorchLayoutError as e:
        ev, err = None, str(e)
    got = Compiled(evidence=ev, error=err, seconds=clock() - t0, started_s=budget.elapsed())
    return place(cand, got, prog, budget, settings, progress)


def _price_all(ep, todo: list, prog: _Program, budget: Budget, settings: _Settings,
               notes: list[str], progress: Progress) -> list[Candidate]:
    """Evidence, placement and Q2 of each (q1, mesh, solution, seed layout) in order, while the
    budget holds twice the longest evidence run so far and a placement."""
    priced: list[Candidate] = []
    for k, (q1, m, sol, lay) in enumerate(todo, 1):
        if priced and budget.left() < 2 * max(c.compile_s for c in priced) + \
                settings.placement_time_s:
            notes.append(f"mesh {mesh_str(m)} {sol.layout.name}: not priced (time budget)")
            continue
        cand = Candidate(1, dict(m), sol)
        progress.candidate(k, len(todo), f"mesh {mesh_str(m)} {sol.layout.name or 'ilp'}: "
                                         "DTensor evidence")
        priced.append(_price(ep, cand, prog, budget, settings, progress))
    return priced


def _predicted(best: Candidate, network: Network) -> dict[str, Any]:
    q2 = best.q2
    return {"step_s": q2.step_s, "compute_s": q2.compute_s,
            "communication_s": q2.communication_s, "latency_s": q2.latency_s,
            "link_time_s": q2.link_time_s, "model": q2.model, "kind": "predicted",
            "units": "seconds per forward call", "evidence": EVIDENCE,
            "default_order_step_s": best.q2_default.step_s if best.q2_default else None,
            "q1_step_s": best.q1_s if math.isfinite(best.q1_s) else None,
            "links": link_seconds(q2, network)}


def _assemble(best: Candidate, key: PlanKey, tgt: Target, network: Network, priced: list,
              notes: list[str], elapsed: float) -> Plan:
    coords = [tuple(int(v) for v in network.chips[network.device_chip[d]])
              for d in best.placement]
    certs = {"sharding": best.solution.certificate, "placement": best.placement_cert}
    proven = all(c is not None and c.status == "OPTIMAL" for c in certs.values())
    rows = [dict(c.summary(), evidence_s=round(c.compile_s, 3)) for c in priced]
    return Plan(key=key, target=tgt.name, layout=best.solution.layout,
                device_order=list(best.placement), device_coords=coords,
                predicted=_predicted(best, network), certificates=certs,
                iterations=[{"iteration": 1, "candidates": rows}], planning_time_s=elapsed,
                layout_in_words=list(best.solution.words), fits_hbm=best.fits,
                hbm_bytes_per_device=int(best.evidence.memory.total_bytes),
                status="OPTIMAL" if proven else "NOT PROVEN", notes=notes,
                program={"frontend": "torch.export", "evidence": "dtensor-fake-pg",
                         "seed": best.seed.program if best.seed is not None else None})


def _capture_both(model, args: tuple, kwargs):
    """(program, its IR, the IR the ILP solves, the repeated blocks or None): the ILP's is a
    few-block proxy's when the model repeats blocks (``aoizora.planning.torch_proxy``), else the
    program's own (also for a program captured already)."""
    import torch

    from aoizora.extract.frontends.torch.aten_ir import build_torch_ir
    from aoizora.extract.frontends.torch.capture import CaptureError, capture

    try:
        if isinstance(model, torch.export.ExportedProgram):
            ir = build_torch_ir(model)
            return model, ir, ir, None
        ep = capture(model, args, kwargs)
        ir = build_torch_ir(ep)
        blocks, proxy = repeated_blocks(model), block_proxy(model)
        if proxy is None:
            return ep, ir, ir, None
        return ep, ir, build_torch_ir(capture(proxy, args, kwargs)), blocks
    except CaptureError as e:
        raise PlanningError(str(e)) from None


def _why_none(priced: list) -> str:
    """Why no candidate was priced, one clause per distinct reason with its count; for HBM, the
    smallest per-device need against the usable HBM, and what to do."""
    GiB = 1024 ** 3
    reasons: dict[str, int] = {}
    for c in priced:
        reasons[c.error or "does not fit in HBM"] = reasons.get(c.error or "does not fit in HBM", 0) + 1
    parts = [f"{r} ({n} of {len(priced)} candidates)" for r, n in reasons.items()]
    mems = [c.evidence.memory for c in priced if not c.error and c.evidence is not None]
    if mems:
        m = min(mems, key=lambda m: m.total_bytes)
        parts.append(f"the smallest needs {m.total_bytes / GiB:.1f} GiB per device against "
                     f"{m.hbm_bytes / GiB:.1f} GiB usable: use more GPUs or a smaller workload")
    return "; ".join(parts) or "no layout"


def plan_torch(model, example_inputs: Sequence, target: "str | Target" = "v5e-8", *,
               kwargs: dict[str, Any] | None = None, time_budget_s: float = 300.0,
               seed: int = 0, top_k: int = 2, meshes: Sequence[dict[str, int]] | None = None,
               placement_time_s: float = 10.0, ilp_time_s: float = 20.0,
               seed_layouts: Sequence[Layout] = (), max_candidates: int = 6,
               progress: Progress | None = None) -> Plan:
    """Plans ``model(*example_inputs, **kwargs)`` for ``target`` (module docstring).

    Args:
      model: a ``torch.nn.Module`` built on the meta device (``with torch.device("meta"):``: no
        weights are needed), or a program captured already
        (``extract.frontends.torch.capture.capture``; ``example_inputs`` are then not read).
      example_inputs: the positional inputs (meta tensors of the real shapes and dtypes).
      target: a TPU slice or a GPU box, e.g. ``"v5e-8"`` or ``"l40-8"``, or a ``Target``.
      kwargs: keyword inputs of the model.
      time_budget_s: wall-clock seconds for the whole planning.
      seed: the solvers' seed; the same seed gives the same plan.
      top_k: layouts kept per mesh from the sharding ILP.
      meshes: the logical meshes to consider; None: every factorization of the device count.
      placement_time_s: seconds one placement (CP-SAT) may take at most.
      ilp_time_s: seconds one sharding ILP may take at most.
      seed_layouts: layouts of this program to price beside the ILP's, or callables that make
        one from the program's IR (e.g. ``functools.partial(aoizora.models.xdit.xdit_layout,
        config=XDiTConfig(ulysses=8))``).
      max_candidates: how many layouts, least Q1 first (seeds and the ILP's layouts in one
        order, ``_ranked_todo``; seeds Q1 cannot price last), get evidence and a placement.
      progress: where the stages are reported; default silent.

    Returns:
      A ``Plan`` as ``plan`` returns one: mesh, layouts, device order, both certificates, the
      predicted step (seconds per step, Q2 on the DTensor evidence).

    Raises:
      PlanningError: the model cannot be captured, or no layout could be priced.
      BudgetError: a non-positive or infinite budget."""
    from aoizora.runtime.torch_evidence import fake_world

    if not (isinstance(time_budget_s, (int, float)) and math.isfinite(time_budget_s)
            and time_budget_s > 0):
        raise BudgetError(f"time budget {time_budget_s} s: give a positive, finite number of "
                          "seconds")
    budget, progress = Budget(float(time_budget_s)), progress or Progress()
    tgt = get_target(target)
    network = Network.from_target(tgt)
    progress.stage(f"capturing the model with torch.export for {tgt.short_name}")
    ep, ir, ilp_ir, blocks = _capture_both(model, tuple(example_inputs), kwargs)
    mesh_list = [dict(m) for m in (meshes if meshes is not None
                                   else candidate_meshes(tgt.num_devices))]
    ranked, notes = _ilp_layouts(ilp_ir, tgt, mesh_list, budget, top_k, ilp_time_s, seed,
                                 progress)
    if blocks is not None:
        ranked = [(q1, m, dataclasses.replace(s, layout=map_layout(ilp_ir, ir, s.layout,
                                                                    blocks[0])))
                  for q1, m, s in ranked]
    notes.append(proxy_note(blocks))
    if seed_layouts:
        progress.stage(f"Q1 of {len(seed_layouts)} seed layouts (the sharding ILP's objective)")
    todo, seed_notes = _ranked_todo(ir, ilp_ir, blocks, tgt, seed_layouts, ranked)
    notes += seed_notes
    prog, settings = _Program(tgt, network), _Settings(seed, placement_time_s)
    with fake_world(tgt.num_devices):
        priced = _price_all(ep, todo[:max_candidates], prog, budget, settings, notes, progress)
    ok = [c for c in priced if c.q2 is not None]
    if not ok:
        raise PlanningError(f"no layout could be priced on {tgt.name}: {_why_none(priced)}")
    best = min(ok, key=lambda c: c.q2.step_s)
    notes = [f"evidence: {EVIDENCE}; nothing ran on an accelerator",
             *[f"program: {w}" for w in ir.warnings], *notes,
             *[f"evidence of mesh {mesh_str(c.mesh_axes)}: {w}" for c in ok
               for w in c.evidence.warnings]]
    return _assemble(best, torch_plan_key(ep, tgt.name), tgt, network, priced, notes,
                     budget.elapsed())
