"""Does an identity ``hint`` change the plan? The joint text+video DiT of ``benchmarks/joint_dit.py``
at full size, with and without hints, through the planner's ILP and the real compiler.

    python -m benchmarks.hint_invariance [--target v5e-16] [--layers 24] [--out NAME]
    python -m benchmarks.hint_invariance --compare BEFORE.json AFTER.json --out NAME
                                             # one table from a run of older code and a new one

For every candidate logical mesh of the target (``formulation.meshes.candidate_meshes``): the
sharding ILP's best layout and Q1, with hints and without. The best layout over the meshes (by
Q1) is realized, compiled for the target with libtpu and priced by Q2
(``formulation.latency.predict_step``) under JAX's default device order; its collectives are
listed. Written to ``benchmarks/results/hint_invariance_<target>.{json,md}`` with the code's
commit, so runs of the code before and after the hint fix can be set side by side.
Latencies are predictions (Q1: the ILP's alpha-beta model; Q2: the link-load model on the compiled
program); nothing runs on a TPU.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import aoizora
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import predict_step
from aoizora.formulation.meshes import candidate_meshes
from aoizora.planner import compile_layout
from aoizora.solvers.sharding import solve_sharding
from benchmarks.joint_dit import make
from benchmarks.machine import git_state, machine_info
from aoizora.extract.atomic_io import atomic_write

RESULTS = Path(__file__).resolve().parent / "results"
FULL = dict(L=24, D=3072, H=24, F=12288, S=32768, T=512, B=2)   # about 4.1e9 parameters


def run_variant(target, hints: bool, size: dict, ilp_s: float) -> dict:
    fn, args = make(hints=hints, **size)
    ir = build_ir(fn, *args)
    per_mesh = []
    for mesh in candidate_meshes(target.num_devices):
        r = solve_sharding(ir, target, mesh, time_limit_s=ilp_s, seed=0)
        per_mesh.append({"mesh": mesh, "q1_s": r.best.predicted["total_s"],
                         "status": r.certificate.status, "layout": r.layout})
    best = min(per_mesh, key=lambda m: m["q1_s"])
    net = Network.from_target(target)
    order = default_device_order(target, best["mesh"])
    ev = compile_layout(fn, args, target, best["layout"], order)
    q2 = predict_step(ev, order, net)
    coll = collections.Counter(f"{c.kind} {c.bytes} B x{c.count}" for c in ev.collectives)
    return {"hints": hints, "nodes": len(ir.nodes),
            "meshes": [{k: v for k, v in m.items() if k != "layout"} for m in per_mesh],
            "best_mesh": best["mesh"], "best_q1_s": best["q1_s"],
            "attention": [str(a) for a in best["layout"].attention.values()],
            "fits_hbm": ev.memory.fits, "q2_step_s": q2.step_s, "q2_compute_s": q2.compute_s,
            "q2_communication_s": q2.communication_s, "collectives": dict(sorted(coll.items()))}


def table(runs: list[tuple[str, dict]]) -> list[str]:
    """Markdown rows, one per (code label, variant)."""
    md = ["| code | variant | IR nodes | best mesh | Q1 (ms) | Q2 step (ms) | Q2 compute (ms) "
          "| Q2 exposed comm (ms) | collectives |", "|---|---|---|---|---|---|---|---|---|"]
    for label, doc in runs:
        for v in doc["variants"]:
            mesh = "x".join(str(n) for n in v["best_mesh"].values())
            md.append(f"| {label} ({doc['git'].get('git_commit', '')[:7]}) | "
                      f"{'with hints' if v['hints'] else 'without hints'} | {v['nodes']} | {mesh} | "
                      f"{v['best_q1_s'] * 1e3:.2f} | {v['q2_step_s'] * 1e3:.2f} | "
                      f"{v['q2_compute_s'] * 1e3:.2f} | {v['q2_communication_s'] * 1e3:.2f} | "
                      f"{sum(int(k.rsplit('x', 1)[1]) * n for k, n in v['collectives'].items())} |")
    return md


def report(runs: list[tuple[str, dict]], stem: str) -> str:
    doc = runs[-1][1]
    md = [f"# Hints and the plan: joint text+video DiT on {doc['target']}", "",
          f"Model: `benchmarks/joint_dit.py`, {doc['size']} (about 4.1e9 parameters at 24 layers). "
          "For each code version: the ILP on every candidate mesh, its best layout by Q1 "
          "compiled with libtpu for the target and priced by Q2 under JAX's default device "
          "order. Q1: the ILP's alpha-beta estimate; Q2: the link-load model on the compiled "
          "XLA:TPU program (predictions; nothing ran on a TPU). Collectives: executions per step.",
          "", *table(runs), ""]
    for label, d in runs:
        h, p = d["variants"]
        md.append(f"- {label}: Q2 with hints / without = {h['q2_step_s'] / p['q2_step_s']:.4f}; "
                  f"same collectives: {h['collectives'] == p['collectives']}.")
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="v5e-16")
    ap.add_argument("--layers", type=int, default=FULL["L"])
    ap.add_argument("--ilp-s", type=float, default=60.0)
    ap.add_argument("--out", default="")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args(argv)
    if a.compare:
        runs = [(lbl, json.loads(Path(f).read_text())) for lbl, f in zip(("before", "after"), a.compare)]
        text = report(runs, a.out)
        atomic_write(RESULTS / f"{a.out or 'hint_invariance'}.md", text)
        print(text)
        return 0
    tg = get_target(a.target)
    size = dict(FULL, L=a.layers)
    out = {"target": tg.name, "size": size, "machine": machine_info(), "git": git_state(),
           "unit": "seconds", "variants": [run_variant(tg, h, size, a.ilp_s) for h in (True, False)]}
    stem = a.out or f"hint_invariance_{tg.short_name}"
    atomic_write(RESULTS / f"{stem}.json", json.dumps(out, indent=1, default=str) + "\n")
    text = report([("this code", out)], stem)
    atomic_write(RESULTS / f"{stem}.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
