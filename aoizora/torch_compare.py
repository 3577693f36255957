"""A torch plan against xDiT's configurations and diffusers' context parallelism, on one model
and target (every latency predicted by Q2 on DTensor evidence: ``aoizora.planning.torch_planner``).

Rows:
- ``aoizora``: the plan (its layout, its placement);
- ``xdit:...``: every valid xDiT configuration (``aoizora.models.xdit.xdit_configs``) in xDiT's own
  device order (rank r on GPU r), and the same layout placed by the placement CP-SAT
  (``placed_step_s``: placement alone);
- ``diffusers:cp ...``: diffusers' ``ContextParallelConfig`` (ring x Ulysses) in its order;
- PipeFusion configurations, priced from a stage's evidence (``pipefusion_evidence``).
``speedup`` = the row's step / AoiZora's step (> 1: AoiZora faster).

PipeFusion (xDiT; Fang et al., arXiv 2405.14430): pp stages of layers/pp layers each, the
sequence cut into M patches (``--num_pipeline_patch``, default pp) that flow through the stages;
stage s sends each patch's activations to stage s + 1, and attention reads the other patches'
keys/values from the previous diffusion step (no exchange in the steady state). Its evidence is
built from the evidence of the same configuration without PipeFusion on n/pp devices (the
"stage"): per device, compute x (M + pp - 1) / (M pp) (the pipeline with its fill), the stage's
own collectives with 1/pp of their bytes on every stage's group, and one collective-permute
stage s -> s + 1 of a patch's activations [B, S/M, D] (this device's shard of them) run M
times. A steady-state model (no warm-up step), stated as such in the row.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import predict_step
from aoizora.models.xdit import (XDiTConfig, default_order, diffusers_cp_layout,
                                 self_attention_layers, video_seq, xdit_configs, xdit_layout)
from aoizora.plans import Plan
from aoizora.solvers.placement import solve_placement
from aoizora.solvers.placement_step import choose_by_step

SOURCE = "predicted (Q2 link-load model on DTensor evidence under a fake process group)"


def _groups(shape: Sequence[int], dim: int) -> list[list[int]]:
    ids = np.arange(int(np.prod(shape))).reshape(tuple(shape))
    return np.moveaxis(ids, dim, -1).reshape(-1, shape[dim]).tolist()


def _stage_dim(c: Collective, inner: dict[str, int]) -> int:
    shape = list(inner.values())
    want = sorted(map(sorted, c.replica_groups))
    for d in range(len(shape)):
        if sorted(map(sorted, _groups(shape, d))) == want:
            return d
    raise ValueError(f"collective {c.name}: its groups are no one mesh dimension's")


def pipefusion_evidence(stage: Evidence, config: XDiTConfig, patch_bytes: float,
                        patches: int | None = None) -> Evidence:
    """PipeFusion's evidence from its stage's (module docstring). ``stage``: the evidence of
    ``config`` without PipeFusion on n / pp devices; ``patch_bytes``: one patch's activations
    per device of a stage (bytes); ``patches``: M (default pp)."""
    pp, m = config.pipefusion, patches or config.pipefusion
    full = config.mesh_axes
    names = list(full)
    inner = {a: s for a, s in full.items() if a != "pp"}
    shape, pdim = list(full.values()), names.index("pp")
    colls = []
    for c in stage.collectives:
        d = names.index(list(inner)[_stage_dim(c, inner)]) if inner else pdim
        colls.append(dataclasses.replace(c, bytes=int(c.bytes / pp),
                                         replica_groups=_groups(shape, d)))
    pairs = [(g[s], g[s + 1]) for g in _groups(shape, pdim) for s in range(pp - 1)]
    colls.append(Collective(name="pipefusion.patch_send", kind="collective-permute",
                            dtype="bf16", bytes=int(patch_bytes),
                            replica_groups=[sorted({x for p in pairs for x in p})],
                            source_target_pairs=pairs, count=m,
                            phase=max((c.phase for c in colls), default=0) + 1))
    scale = (m + pp - 1) / (m * pp)
    comp = [dataclasses.replace(o, flops=o.flops * scale, bytes=o.bytes * scale,
                                estimated_cycles=None if o.estimated_cycles is None
                                else o.estimated_cycles * scale) for o in stage.compute]
    mem = dataclasses.replace(stage.memory)
    return dataclasses.replace(stage, mesh_axes=dict(full), collectives=colls, compute=comp,
                               memory=mem, warnings=stage.warnings + [
                                   f"PipeFusion pp{pp} with {m} patches: steady-state model "
                                   "from a stage's evidence (aoizora.torch_compare)"])


def _price(ev: Evidence, order: list[int], network: Network, placement_time_s: float,
           seed: int) -> dict[str, Any]:
    if not ev.memory.fits:
        return {"valid": False, "reason": "does not fit in HBM: " + ev.memory.oom_message,
                "fits_hbm": False}
    q = predict_step(ev, order, network)
    res = solve_placement(ev, network, time_limit_s=placement_time_s, seed=seed, hint=order)
    res = choose_by_step(ev, network, res, res.candidates + [order],
                         time_limit_s=max(0.5, 0.3 * placement_time_s))
    placed = res.q2.step_s if res.placement is not None else q.step_s
    return {"valid": True, "fits_hbm": True, "device_order": order, "step_s": q.step_s,
            "compute_s": q.compute_s, "communication_s": q.communication_s,
            "placed_step_s": placed, "placement": res.placement,
            "placement_status": res.certificate.status}


def _patch_bytes(ir, config: XDiTConfig, patches: int) -> float:
    """One patch's activations [B, S/M, D] per device of a stage (bf16 as the program's)."""
    att = next(n for n in ir.by_kind("attention") if n.params["shape"][2] == video_seq(ir))
    b, h, s, t, d = att.params["shape"]
    item = max(1, ir.tensors[att.results[0]].bytes // max(1, b * h * s * d))
    return b * s * h * d * item / (patches * config.cfg * config.ring * config.ulysses)


def _config_row(ep, ir, c: XDiTConfig, tgt, network, placement_time_s, seed) -> dict:
    from aoizora.runtime.torch_evidence import torch_evidence
    from aoizora.runtime.torch_layout import TorchLayoutError

    row = {"name": c.name, "flags": " ".join(c.flags()), "mesh": dict(c.mesh_axes),
           "source": SOURCE}
    inner = dataclasses.replace(c, pipefusion=1)
    try:
        ev = torch_evidence(ep, xdit_layout(ir, inner), tgt)
    except TorchLayoutError as e:
        return {**row, "valid": False, "reason": str(e)}
    if c.pipefusion > 1:
        ev = pipefusion_evidence(ev, c, _patch_bytes(ir, c, c.pipefusion))
        row["note"] = ev.warnings[-1]
    return {**row, **_price(ev, default_order(c), network, placement_time_s, seed)}


def compare_torch(model, example_inputs, target, *, kwargs=None, plan: Plan | None = None,
                  configs: Sequence[XDiTConfig] | None = None, placement_time_s: float = 5.0,
                  seed: int = 0) -> dict[str, Any]:
    """Rows of the plan, every xDiT configuration and diffusers' CP (module docstring).
    ``model``: a module (meta tensors are enough) or a captured program; ``configs``: default
    every valid one (``xdit_configs``)."""
    import torch

    from aoizora.extract.frontends.torch.aten_ir import build_torch_ir
    from aoizora.extract.frontends.torch.capture import capture
    from aoizora.runtime.torch_evidence import fake_world, torch_evidence

    ep = model if isinstance(model, torch.export.ExportedProgram) else \
        capture(model, tuple(example_inputs), kwargs)
    ir = build_torch_ir(ep)
    tgt = get_target(target)
    network = Network.from_target(tgt)
    att = ir.by_kind("attention")
    b, h = att[0].params["shape"][:2]
    layers = self_attention_layers(ir)
    configs = list(configs) if configs is not None else xdit_configs(
        tgt.num_devices, heads=h, seq=video_seq(ir), batch=b, layers=layers)
    rows = []
    with fake_world(tgt.num_devices):
        for c in configs:
            rows.append(_config_row(ep, ir, c, tgt, network, placement_time_s, seed))
        for ring in (d for d in range(1, tgt.num_devices + 1) if tgt.num_devices % d == 0):
            uly = tgt.num_devices // ring
            if h % uly or video_seq(ir) % tgt.num_devices:
                continue
            lay = diffusers_cp_layout(ir, ring, uly)
            ev = torch_evidence(ep, lay, tgt)
            rows.append({"name": lay.name, "mesh": dict(lay.mesh_axes), "source": SOURCE,
                         **_price(ev, list(range(tgt.num_devices)), network,
                                  placement_time_s, seed)})
    if plan is not None:
        pr = plan.predicted
        rows.insert(0, {"name": "aoizora", "mesh": plan.mesh, "valid": True,
                        "step_s": pr["step_s"], "compute_s": pr["compute_s"],
                        "communication_s": pr["communication_s"], "fits_hbm": plan.fits_hbm,
                        "device_order": plan.device_order, "source": SOURCE})
    base = rows[0]["step_s"] if plan is not None else None
    for r in rows:
        r["speedup"] = r["step_s"] / base if base and r.get("step_s") else None
    ok = [r for r in rows if r.get("step_s") and r["name"] != "aoizora"]
    best = min(ok, key=lambda r: r["step_s"]) if ok else None
    return {"target": tgt.name, "rows": rows, "best_baseline": best["name"] if best else None,
            "speedup_over_best_baseline": best.get("speedup") if best else None}
