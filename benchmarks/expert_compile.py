"""Compile every expert configuration (``aoizora.models.experts``) of the full-size models ahead of
time for a TPU slice (default v5e-8), with JAX's default device order, and record per
configuration: valid or the reason it was rejected, compile seconds, HBM per device, whether it
fits, and the collectives in the compiled program.

Run:  python -m benchmarks.expert_compile [--target v5e-8] [--only MODEL]
      [--experts a,b] [--frames N (override, to validate quickly)] [--merge]
Writes benchmarks/results/expert_compile.json and .md. ``--merge`` keeps the written rows and
replaces or adds only the ones compiled now (each records its commit), e.g. after a configuration
joined ``EXPERTS``: ``--merge --experts cfg2_ulysses,usp``.
"""

from __future__ import annotations

import argparse
from collections import Counter
import json
import os
import re
import sys
import time

import aoizora  # noqa: F401  (libtpu environment first)
import jax

from aoizora.extract.targets import get_target
from aoizora.models.experts import EXPERTS, default_mesh, expert_layouts
from aoizora.models.registry import get_model
from aoizora.models.workloads import Workload
from aoizora.runtime.realize import realize
from benchmarks.machine import git_state
from aoizora.extract.atomic_io import atomic_open

RUNS = [("wan2.1-small", "tiny-9f"), ("wan2.1-1.3b", "480p-81f"), ("wan2.1-14b", "480p-81f"), ("hunyuanvideo-13b", "544p-129f")]
HERE = os.path.dirname(os.path.abspath(__file__))
UNRECORDED = "committed in 2245498 (2026-11-29; rows did not record their commit then)"
KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def compile_expert(e, target: str) -> dict:
    row = {"expert": e.name, "valid": e.valid, "reason": e.reason, "pad_multiple": e.pad_multiple}
    if not e.valid:
        return row
    row["mesh"] = dict(e.layout.mesh_axes)
    row["load_avg_1min_before"] = round(os.getloadavg()[0], 2)   # the machine is shared
    t0 = time.perf_counter()
    try:
        lowered = realize(e.fn, e.args, e.layout, default_mesh(target, e.layout.mesh_axes)).lower()
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    except Exception as ex:   # e.g. RESOURCE_EXHAUSTED: does not fit
        msg = str(ex)
        row.update(ok=False, fits="RESOURCE_EXHAUSTED" not in msg and None,
                   error=msg.splitlines()[0][:400], seconds_total=round(time.perf_counter() - t0, 1))
        return row
    mem = compiled.memory_analysis()
    total = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
             + mem.generated_code_size_in_bytes - mem.alias_size_in_bytes)
    hlo = compiled.as_text()
    row.update(ok=True, fits=True, seconds_lower=round(t1 - t0, 1), seconds_compile=round(t2 - t1, 1),
               hbm_total_bytes_per_device=int(total), hbm_temp_bytes_per_device=int(mem.temp_size_in_bytes),
               hbm_argument_bytes_per_device=int(mem.argument_size_in_bytes),
               collectives={k: len(re.findall(rf"\b{k}(?:-start)?\(", hlo)) for k in KINDS},
               splash_kernels=hlo.count("tpu_custom_call"))
    return row


def write(doc: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with atomic_open(os.path.join(out_dir, "expert_compile.json")) as f:
        json.dump(doc, f, indent=2)
    gib = 1024 ** 3
    lines = [f"# Expert configurations compiled ahead of time for {doc['target']}", "",
             "Each configuration of `aoizora.models.experts` with JAX's default device order "
             "(`jax.make_mesh`, Auto axes), realized by `aoizora.runtime.realize` (splash attention in "
             "`shard_map`), compiled by libtpu on a CPU-only, shared 2-core machine (seconds are "
             "indicative; the 1-minute load average before each compile is in the JSON). HBM: "
             "argument + output + temp + code - alias bytes per device. Collectives: static count "
             "of each kind in the compiled program (a loop body counted once).", "",
             "Code: " + "; ".join(
                 f"commit {k[:7]}: {v} row(s)" if k else f"{UNRECORDED}: {v} row(s)"
                 for k, v in sorted(Counter(r.get("git_commit", "") for r in doc["runs"]).items())) + ".", "",
             "| model | workload | expert | mesh | valid / reason | compile s | HBM/device GiB | fits | collectives |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        hb = r.get("hbm_total_bytes_per_device")
        colls = ", ".join(f"{k} {v}" for k, v in (r.get("collectives") or {}).items() if v)
        mesh = " x ".join(f"{k}={v}" for k, v in (r.get("mesh") or {}).items())
        why = r["reason"] if r["valid"] else f"rejected: {r['reason']}"
        if r.get("error"):
            why += f"; compile failed: {r['error'][:160]}"
        lines.append(f"| {r['model']} | {r['workload']} | {r['expert']} | {mesh} | {why} | "
                     f"{r.get('seconds_compile', '-')} | {'-' if hb is None else f'{hb / gib:.2f}'} | "
                     f"{r.get('fits', '-')} | {colls} |")
    with atomic_open(os.path.join(out_dir, "expert_compile.md")) as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="v5e-8")
    ap.add_argument("--only", default=None, help="one model name")
    ap.add_argument("--experts", default=None, help="comma-separated expert names")
    ap.add_argument("--frames", type=int, default=None, help="override frames (quick validation)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--merge", action="store_true",
                    help="keep the written rows; replace or add only the ones compiled now")
    a = ap.parse_args(argv)
    tgt = get_target(a.target)
    doc = {"target": tgt.short_name, "jax": jax.__version__, "runs": []}
    path = os.path.join(a.out, "expert_compile.json")
    if a.merge and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        if old.get("target") != doc["target"]:
            print(f"error: {path} is for {old.get('target')}, not {doc['target']}; drop --merge",
                  file=sys.stderr)
            return 2
        doc["runs"] = old["runs"]
    commit = git_state()["git_commit"]
    models = [m for m, _ in RUNS]

    def order(r):              # RUNS order, then EXPERTS order
        return (models.index(r["model"]) if r["model"] in models else len(models),
                EXPERTS.index(r["expert"]) if r["expert"] in EXPERTS else len(EXPERTS))
    for name, wl_name in RUNS:
        if a.only and name != a.only:
            continue
        wl = get_model(name).workload(wl_name)
        if a.frames is not None:
            wl = Workload(f"{wl.resolution}-{a.frames}f", wl.resolution, wl.width, wl.height, a.frames)
        for e in expert_layouts(name, wl, tgt):
            if a.experts and e.name not in a.experts.split(","):
                continue
            row = {"model": name, "workload": wl.name, "tokens": wl.tokens,
                   **compile_expert(e, tgt.name), "git_commit": commit}
            print(json.dumps(row), flush=True)
            doc["runs"] = [r for r in doc["runs"]
                           if (r["model"], r["workload"], r["expert"]) != (name, wl.name, e.name)]
            doc["runs"].append(row)
            doc["runs"].sort(key=order)
            write(doc, a.out)
    return 0 if all(r.get("ok", True) for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
