"""Compiled evidence for the Q1-fidelity benchmark: every layout of a cell compiled once, priced by
Q2 and by the reference simulator, cached as JSON.

    python -m benchmarks.q1_fidelity_collect --cell wan2.1-1.3b,480p,21,v5e-8 [--ilp-limit S]
    python -m benchmarks.q1_fidelity_collect --reprice-q2     # every cell: Q2 again, no compile

The layouts of a cell: every valid expert configuration (``models.experts.expert_layouts``, on its
own padded program) and the sharding ILP's best layout on every candidate mesh
(``formulation.meshes.candidate_meshes``; the ILP as the planner's first iteration runs it: no
feedback, ``remat="stacks"``), on the cell's program. Each is compiled ahead of time by libtpu
in JAX's default device order (``aoizora.planning.candidate_pricing.compile_layout``) with its HLO kept,
then priced by Q2 (``formulation.latency.predict_step``) and by the simulator
(``benchmarks.simulator``: its own compute model on the HLO), both in that order.

One file per layout, ``benchmarks/results/q1_fidelity/<cell>/<layout>.json``: the layout (JSON),
the ILP's strategy choice (ILP layouts), the program it was compiled for, Q2's and the
simulator's figures term by term (compute by op kind, collectives by kind), the compiler's
memory figure, and the evidence itself (``<layout>.evidence.json.gz``) so Q2 can be re-run. A
file that exists is not compiled again. Nothing here ran on a TPU: every latency is a prediction
(Q2) or a simulation (the simulator) of the compiled program.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import aoizora  # noqa: F401  -- sets libtpu's environment first
from aoizora.builtin import builtin_job
from aoizora.planning.candidate_pricing import compile_layout
from aoizora.extract.aot_compile import keeping_hlo, read_hlo
from aoizora.extract.evidence import Evidence, attention_node_of
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.latency import predict_step
from aoizora.formulation.meshes import candidate_meshes
from aoizora.formulation.op_time import op_seconds
from aoizora.models.experts import expert_layouts
from aoizora.solvers.sharding import ShardingProblem, ShardingSolveError, solve_sharding
from benchmarks.sim.constants import chip_model
from benchmarks.sim.hlo_cost import compute_breakdown
from benchmarks.simulator import LABEL as SIM_LABEL, Simulator

RESULTS = Path(__file__).resolve().parent / "results" / "q1_fidelity"


def cell_name(model: str, resolution: str, frames: int, target: str) -> str:
    return f"{model}_{resolution}-{frames}f_{target}"


def is_attention_op(op) -> bool:
    """A compute op of an attention: a splash kernel, or an op in an attention node's scope."""
    return bool(getattr(op, "kernel", None)) or "splash" in (op.custom_call_target or "") \
        or "splash" in op.name or attention_node_of(op.op_name or "") is not None


def q2_terms(ev: Evidence, order: Sequence[int], net: Network) -> dict[str, Any]:
    """Q2's step and its terms (seconds): compute split into attention and the rest."""
    q = predict_step(ev, list(order), net)
    att = sum(op.count * (op_seconds(op, ev, net) or 0.0) for op in ev.compute
              if is_attention_op(op))
    return {"step_s": q.step_s, "compute_s": q.compute_s, "communication_s": q.communication_s,
            "compute_attention_s": att, "compute_other_s": q.compute_s - att}


def sim_terms(sim: Simulator, ev: Evidence, order: Sequence[int], module) -> dict[str, Any]:
    """The simulator's step and its terms (seconds): compute by what bounds each op (its own
    ``compute_breakdown``), collectives by kind (time of all runs, and the exposed part)."""
    s = sim.run(ev, list(order), hlo=module)
    runs = {op.name: int(op.count) for op in ev.compute}
    gen = ev.target.split(":")[0]
    by_kind: dict[str, dict[str, float]] = {}
    for c in s.collectives:
        k = by_kind.setdefault(c.kind, {"time_s": 0.0, "exposed_s": 0.0, "bytes": 0.0})
        k["time_s"] += c.time_s * c.count
        k["exposed_s"] += c.total_exposed_s
        k["bytes"] += float(c.bytes) * c.count
    out = {"step_s": s.step_s, "compute_s": s.compute_s, "communication_s": s.communication_s,
           "collectives": by_kind, "hlo": module is not None}
    if module is not None:
        out["compute_by_kind"] = compute_breakdown(module, chip_model(gen), runs)
    return out


def collective_bytes(ev: Evidence) -> dict[str, float]:
    """Bytes per device per step by collective kind, as compiled."""
    out: dict[str, float] = {}
    for c in ev.collectives:
        out[c.kind] = out.get(c.kind, 0.0) + float(c.bytes) * c.count
    return out


def layouts_of(job, ilp_limit_s: float, ilp_prefix: str = "ilp",
               experts: bool = True) -> list[dict[str, Any]]:
    """The cell's layouts (module docstring): dicts with name, layout, fn, args, program, and the
    ILP's choice and Q1 for ILP layouts (named ``<ilp_prefix>:<mesh>``: a prefix per version of
    Q1 keeps the layouts an earlier Q1 chose)."""
    out = []
    for ex in expert_layouts(job.model, job.workload, job.target) if experts else []:
        if ex.valid:
            out.append({"name": f"expert:{ex.name}", "layout": ex.layout, "fn": ex.fn,
                        "args": ex.args, "program": {"expert": ex.name,
                                                     "pad_multiple": ex.pad_multiple}})
    ir = build_ir(job.fn, *job.args)
    for m in candidate_meshes(job.target.num_devices):
        try:
            res = solve_sharding(ir, job.target, m, ShardingProblem(remat="stacks"),
                                 time_limit_s=ilp_limit_s, seed=0)
        except ShardingSolveError as e:
            print(f"  mesh {m}: no ILP layout ({str(e).splitlines()[0]})", flush=True)
            continue
        sol = res.best
        name = f"{ilp_prefix}:" + "x".join(str(v) for v in m.values())
        out.append({"name": name, "layout": sol.layout, "fn": job.fn, "args": job.args,
                    "program": {"job": True}, "choice": dict(sol.choice),
                    "q1_at_collect_s": sol.predicted.get("total_s"),
                    "ilp_status": sol.certificate.status})
    return out


def collect_cell(model: str, resolution: str, frames: int, target: str, ilp_limit_s: float,
                 only: set[str] | None = None, ilp_prefix: str = "ilp") -> Path:
    """Compile and price every layout of the cell not cached yet; returns the cell's directory."""
    job = builtin_job(model, resolution, frames, target)
    d = RESULTS / cell_name(model, resolution, frames, target)
    d.mkdir(parents=True, exist_ok=True)
    net = Network.from_target(job.target)
    sim = Simulator(job.target, net)
    wanted_experts = only is None or any(n.startswith("expert:") for n in only)
    for L in layouts_of(job, ilp_limit_s, ilp_prefix, wanted_experts):
        fname = L["name"].replace(":", "_")
        path = d / f"{fname}.json"
        if path.exists() or (only and L["name"] not in only):
            continue
        layout = L["layout"]
        order = default_device_order(job.target, layout.mesh_axes)
        rec: dict[str, Any] = {"cell": d.name, "name": L["name"], "program": L["program"],
                               "mesh": dict(layout.mesh_axes), "device_order": list(order),
                               "layout": layout.to_json(), "choice": L.get("choice"),
                               "q1_at_collect_s": L.get("q1_at_collect_s"),
                               "labels": {"sim": SIM_LABEL, "q2": "predicted (Q2)"},
                               "unit": "seconds, bytes per device"}
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp, keeping_hlo(tmp):
            try:
                ev = compile_layout(L["fn"], L["args"], job.target, layout, order)
            except Exception as e:  # noqa: BLE001 -- recorded
                rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                path.write_text(json.dumps(rec, indent=1))
                print(f"  {L['name']}: {rec['error']}", flush=True)
                continue
            text = read_hlo(ev)
            module = parse_hlo_module(text) if text is not None else None
        rec["compile_s"] = round(time.perf_counter() - t0, 1)
        rec["fits_hbm"] = bool(ev.memory.fits)
        rec["memory"] = {"compiler_total_bytes": int(ev.memory.total_bytes),
                         "argument_bytes": ev.memory.argument_bytes,
                         "temp_bytes": ev.memory.temp_bytes, "output_bytes": ev.memory.output_bytes,
                         "alias_bytes": ev.memory.alias_bytes}
        rec["collective_bytes"] = collective_bytes(ev)
        rec["q2"] = q2_terms(ev, order, net)
        rec["sim"] = sim_terms(sim, ev, order, module)
        del module
        with gzip.open(d / f"{fname}.evidence.json.gz", "wt", compresslevel=6) as f:
            f.write(ev.dumps())
        path.write_text(json.dumps(rec, indent=1, default=str))
        print(f"  {L['name']}: compiled in {rec['compile_s']} s, Q2 {rec['q2']['step_s']*1e3:.1f} ms,"
              f" sim {rec['sim']['step_s']*1e3:.1f} ms", flush=True)
    return d


def reprice_q2(cell_dir: Path, commit: str) -> int:
    """Q2 of every record of `cell_dir` again from its kept evidence, in its recorded device
    order (Q2's code changed; the evidence and the simulator's figures did not); returns the
    number of records repriced. Each records the commit that priced it (``q2_commit``)."""
    from aoizora.extract.targets import get_target

    net = Network.from_target(get_target(cell_dir.name.rsplit("_", 1)[1]))
    n = 0
    for path in sorted(cell_dir.glob("*.json")):
        ev_path = path.with_name(path.name[:-len(".json")] + ".evidence.json.gz")
        if not ev_path.exists():
            continue
        rec = json.loads(path.read_text())
        with gzip.open(ev_path, "rt") as f:
            ev = Evidence.loads(f.read())
        rec["q2"] = q2_terms(ev, rec["device_order"], net)
        rec["q2_commit"] = commit
        path.write_text(json.dumps(rec, indent=1, default=str))
        n += 1
    return n


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", help="model,resolution,frames,target")
    ap.add_argument("--reprice-q2", action="store_true",
                    help="price every collected layout by Q2 again from its kept evidence")
    ap.add_argument("--ilp-limit", type=float, default=60.0, help="seconds per mesh's ILP")
    ap.add_argument("--only", default="", help="comma-separated layout names")
    ap.add_argument("--ilp-prefix", default="ilp", help="name prefix of the ILP's layouts")
    a = ap.parse_args(argv)
    if a.reprice_q2:
        from benchmarks.machine import git_state
        g = git_state()
        commit = g["git_commit"][:12] + ("+modified" if g["git_modified_files"] else "")
        for d in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
            print(f"{d.name}: {reprice_q2(d, commit)} layouts repriced at {commit}")
        return 0
    try:
        model, res, frames, target = (a.cell or "").split(",")
        frames_i = int(frames)
    except ValueError:
        print("--cell: give model,resolution,frames,target (e.g. wan2.1-1.3b,480p,21,v5e-8)",
              file=sys.stderr)
        return 2
    only = {s for s in a.only.split(",") if s} or None
    d = collect_cell(model, res, frames_i, target, a.ilp_limit, only, a.ilp_prefix)
    print(f"wrote {d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
