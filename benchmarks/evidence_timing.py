"""How long tracing, one compile and parsing the evidence take for Wan 2.1 1.3B at 480p, 81 frames,
on v5e-8 and v5e-16 (issue 3, "Done when").

Layout: `fsdp+cp` from benchmarks/model_compile.py (mesh data=2 x seq=N/2 in jax.make_mesh order,
CFG pair over data, sequence over seq, splash attention with gathered keys/values, weights FSDP
over all devices). Steps, each timed with time.perf_counter (seconds, wall clock on a shared
2-core machine, so indicative):
- trace: jax.make_jaxpr + the realizer's jit wrapper and .lower() (StableHLO);
- compile: .compile() (XLA:TPU ahead of time, libtpu);
- parse: compiled.as_text() -> parse_hlo_module -> Evidence (collectives, compute, schedule,
  memory, cost analysis).

Run:  /work/venv/bin/python benchmarks/evidence_timing.py [--targets v5e-8,v5e-16] [--frames N]
Writes benchmarks/results/evidence_timing.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import aoizora  # noqa: F401  (libtpu environment first)
import jax

from aoizora.extract.compiled_evidence import evidence_from_compiled
from aoizora.extract.evidence_summary import summarize_evidence
from aoizora.models.registry import abstract_inputs, denoise_step
from aoizora.runtime.realize import realize

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from benchmarks.model_compile import fsdp_cp_setup, layout_for  # noqa: E402
from aoizora.extract.atomic_io import atomic_open


def time_one(target: str, model: str, workload: str, frames: int | None) -> dict:
    m, wl, tgt, axes, mesh, pad = fsdp_cp_setup(model, workload, target, frames)
    t0 = time.perf_counter()
    args = abstract_inputs(m, wl)
    r = realize(denoise_step(m, pad_multiple=pad), args, layout_for(args, axes), mesh)
    lowered = r.lower()
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh, compile_s=t2 - t1)
    t3 = time.perf_counter()
    text_chars = len(compiled.as_text())
    return {"target": tgt.name, "model": model, "workload": wl.name, "tokens": wl.tokens,
            "mesh": axes, "trace_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
            "parse_s": round(t3 - t2, 2), "hlo_chars": text_chars,
            "collectives": len(ev.collectives),
            "collective_runs": sum(c.count for c in ev.collectives),
            "compute_ops": len(ev.compute), "hbm_bytes": ev.memory.total_bytes,
            "fits": ev.memory.fits, "summary": summarize_evidence(ev)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="v5e-8,v5e-16")
    ap.add_argument("--model", default="wan2.1-1.3b")
    ap.add_argument("--workload", default="480p-81f")
    ap.add_argument("--frames", type=int, default=None, help="override frames (quick validation)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    rows = []
    for t in a.targets.split(","):
        row = time_one(t.strip(), a.model, a.workload, a.frames)
        print(json.dumps({k: v for k, v in row.items() if k != "summary"}), flush=True)
        rows.append(row)
    os.makedirs(a.out, exist_ok=True)
    with atomic_open(os.path.join(a.out, "evidence_timing.json")) as f:
        json.dump({"jax": jax.__version__, "runs": rows}, f, indent=2)
    lines = [f"# Trace, compile and parse times: {a.model}, {a.workload}", "",
             "Wall-clock seconds on a shared 2-core CPU machine (no TPU; libtpu compiles ahead of "
             "time). Layout fsdp+cp (see benchmarks/model_compile.py).", "",
             "| target | mesh | tokens | trace s | compile s | parse s | HLO chars | collectives "
             "(runs) | HBM/device GiB | fits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
        lines.append(f"| {r['target']} | {mesh} | {r['tokens']:,} | {r['trace_s']} | "
                     f"{r['compile_s']} | {r['parse_s']} | {r['hlo_chars']:,} | "
                     f"{r['collectives']} ({r['collective_runs']}) | "
                     f"{r['hbm_bytes'] / 1024**3:.2f} | {r['fits']} |")
    for r in rows:
        lines += ["", f"## {r['target']}", "", "```", r["summary"], "```"]
    with atomic_open(os.path.join(a.out, "evidence_timing.md")) as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
