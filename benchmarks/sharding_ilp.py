"""The sharding ILP on Wan 2.1 1.3B (480p, 81 frames: 32,760 tokens, one denoising step with the
CFG pair as batch 2, 30 blocks under ``lax.scan`` -- the block is in the ILP once): ILP size, build
and solve seconds, status, objective, bound and gap with CBC and HiGHS, on every 16-chip (v5e-16,
4x4) and 8-chip (v5e-8, 2x4) logical mesh of 1 to 3 axes we list below.

The token sequence is padded to a multiple of 128 x chips (the realizer and splash attention need
dividing shards). With ``--compile`` the ILP's layout for the 4x4 and 2x4 meshes is realized and
compiled ahead of time by libtpu, and the compiler's HBM per device is set beside the ILP's
predicted peak.

Run:  /work/venv/bin/python benchmarks/sharding_ilp.py [--compile] [--time-limit 60]
Writes benchmarks/results/sharding_ilp.json and .md.
"""

from __future__ import annotations

from benchmarks.machine import machine_info
import argparse
import json
import os
import time

import aoizora  # noqa: F401  (libtpu environment first)
import jax

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.models.registry import abstract_inputs, denoise_step, get_model
from aoizora.solvers.sharding import available_solvers, solve_sharding
from aoizora.extract.atomic_io import atomic_open

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL, WORKLOAD = "wan2.1-1.3b", "480p-81f"
MESHES = [
    ("v5e-16", {"x": 4, "y": 4}), ("v5e-16", {"x": 2, "y": 8}), ("v5e-16", {"x": 8, "y": 2}),
    ("v5e-16", {"x": 16}), ("v5e-16", {"x": 2, "y": 2, "z": 4}),
    ("v5e-8", {"x": 2, "y": 4}), ("v5e-8", {"x": 4, "y": 2}), ("v5e-8", {"x": 8}),
    ("v5e-8", {"x": 2, "y": 2, "z": 2}),
]
COMPILE = {("v5e-16", "4x4"), ("v5e-8", "2x4")}
GiB = 1024 ** 3


def mesh_name(m: dict[str, int]) -> str:
    return "x".join(str(v) for v in m.values())


def machine() -> dict:
    from aoizora.solvers.sharding import available_solvers

    return {**machine_info(), "solvers": available_solvers(),
            "note": "2-core CPU machine shared with other jobs; solvers single-threaded; seconds "
                    "are wall clock and indicative"}

def compile_check(step, args, layout, target, mesh_axes) -> dict:
    from aoizora.models.experts import default_mesh
    from aoizora.runtime.realize import realize
    t0 = time.perf_counter()
    try:
        c = realize(step, args, layout, default_mesh(target, mesh_axes)).compile()
    except Exception as e:   # an out-of-memory compile is an outcome
        return {"ok": False, "error": str(e).splitlines()[0][:300],
                "seconds": round(time.perf_counter() - t0, 1)}
    ma = c.memory_analysis()
    total = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
             + ma.generated_code_size_in_bytes - ma.alias_size_in_bytes)
    return {"ok": True, "seconds": round(time.perf_counter() - t0, 1), "hbm_bytes_per_device": int(total),
            "argument_bytes": int(ma.argument_size_in_bytes), "temp_bytes": int(ma.temp_size_in_bytes)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    m = get_model(MODEL)
    args = abstract_inputs(m, WORKLOAD)
    rows = []
    irs = {}
    for tname, mesh in MESHES:
        tgt = get_target(tname)
        pad = 128 * tgt.chips
        if pad not in irs:
            step = denoise_step(m, pad_multiple=pad)
            t0 = time.perf_counter()
            irs[pad] = (step, build_ir(step, *args), time.perf_counter() - t0)
        step, ir, trace_s = irs[pad]
        for solver in available_solvers():
            t0 = time.perf_counter()
            r = solve_sharding(ir, tgt, mesh, solver=solver, time_limit_s=a.time_limit)
            wall = time.perf_counter() - t0
            c = r.certificate
            row = {"target": tname, "mesh": mesh, "solver": c.solver, "pad_multiple": pad,
                   "ir_nodes": len(ir.nodes), "trace_s": round(trace_s, 2), "size": r.size,
                   "build_s": round(r.build_s, 2), "solve_s": round(c.time_s, 2),
                   "total_s": round(wall, 2), "status": c.status, "objective_s": c.objective,
                   "bound_s": c.bound, "gap": c.gap, "predicted": r.best.predicted,
                   "predicted_peak_bytes": r.best.peak_bytes,
                   "attention": [w for w in r.best.words if w.startswith("attention")],
                   "layout": r.layout.to_json(), "detail": c.detail}
            print(f"{tname} {mesh_name(mesh):8s} {solver:5s} {c.status:8s} Q1={c.objective:.4f}s "
                  f"gap={c.gap} build={r.build_s:.2f}s solve={c.time_s:.2f}s size={r.size}", flush=True)
            if a.compile and solver == "cbc" and (tname, mesh_name(mesh)) in COMPILE:
                row["compile"] = compile_check(step, args, r.layout, tgt, mesh)
                print("   compile:", row["compile"], flush=True)
            rows.append(row)
    write(rows, a.out, a.time_limit)


def write(rows, out_dir, time_limit) -> None:
    os.makedirs(out_dir, exist_ok=True)
    doc = {"model": MODEL, "workload": WORKLOAD, "time_limit_s": time_limit, "machine": machine(),
           "runs": rows}
    with atomic_open(os.path.join(out_dir, "sharding_ilp.json")) as f:
        json.dump(doc, f, indent=1)
    lines = [f"# Sharding ILP: {MODEL} {WORKLOAD} (one denoising step, CFG batch 2, 30 scanned blocks)",
             "", f"Machine: {doc['machine']['platform']}, {doc['machine']['cpus']} CPUs (shared), "
             f"PuLP {doc['machine']['pulp']}, HiGHS {doc['machine']['highs']}; single-threaded "
             f"solvers, time limit {time_limit:.0f} s. Q1 = the ILP's predicted step latency "
             "(placement-oblivious). Sequence padded to 128 x chips.", "",
             "| target | mesh | solver | groups | binaries | continuous | rows | build s | solve s | "
             "status | Q1 s | bound s | gap | peak GiB (ILP) | HBM GiB (compiler) | attention |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["size"]
        comp = r.get("compile")
        hbm = (f"{comp['hbm_bytes_per_device'] / GiB:.2f}" if comp and comp.get("ok")
               else ("OOM/err" if comp else ""))
        att = "; ".join(w.split(" [")[0].replace("attention: ", "") for w in r["attention"])
        gap = "" if r["gap"] is None else f"{r['gap']:.2%}"
        bound = "" if r["bound_s"] is None else f"{r['bound_s']:.4f}"
        lines.append(f"| {r['target']} | {mesh_name(r['mesh'])} | {r['solver'].split('/')[-1]} | "
                     f"{s['groups']} | {s['binaries']} | {s['continuous']} | {s['constraints']} | "
                     f"{r['build_s']:.2f} | {r['solve_s']:.2f} | {r['status']} | "
                     f"{r['objective_s']:.4f} | {bound} | {gap} | "
                     f"{r['predicted_peak_bytes'] / GiB:.2f} | {hbm} | {att} |")
    lines.append("")
    for r in rows:
        if r["target"] == "v5e-16" and mesh_name(r["mesh"]) == "4x4":
            lines.append(f"- 16-chip 2D mesh (4x4), {r['solver'].split('/')[-1]}: {r['status']} in "
                         f"{r['solve_s']:.2f} s of solving, {r['build_s'] + r['solve_s']:.2f} s with "
                         f"building strategies and model (target: optimal in < 10 s).")
    for r in rows:
        comp = r.get("compile")
        if comp and comp.get("ok"):
            lines.append(f"- {r['target']} {mesh_name(r['mesh'])}: the ILP's layout realized and compiled "
                         f"by libtpu in {comp['seconds']:.0f} s; compiler HBM per device "
                         f"{comp['hbm_bytes_per_device'] / GiB:.2f} GiB (arguments "
                         f"{comp['argument_bytes'] / GiB:.2f}, temporaries {comp['temp_bytes'] / GiB:.2f}) "
                         f"against the ILP's predicted peak {r['predicted_peak_bytes'] / GiB:.2f} GiB.")
        elif comp:
            lines.append(f"- {r['target']} {mesh_name(r['mesh'])}: compile failed: {comp['error']}")
    lines.append("- Attention column: the self-attention layout, then the cross-attention layout "
                 "(keys/values gathered along their sequence unless it says ring).")
    with atomic_open(os.path.join(out_dir, "sharding_ilp.md")) as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
