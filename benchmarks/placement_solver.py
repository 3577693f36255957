"""CP-SAT placement solver against heuristic searches at equal wall-clock budgets, on real evidence.

    python -m benchmarks.placement_solver [--budgets 1 5 30 120] [--targets v5e-16 v5e-64 v5e-256]
                                          [--recompile] [--compile-only]

Evidence: Wan 2.1 1.3B (480p, 81 frames, one CFG denoising step) compiled ahead of time with
libtpu under the expert layout ``cfg2_context`` (data 2 x context n/2: the best-known layout on
v5e-16, the planner's choice there; valid on every even slice), in JAX's default device order,
on v5e-16 (4x4), v5e-64 (8x8) and v5e-256 (16x16, wraparound). Each Evidence is cached with its
provenance under benchmarks/results/placement_evidence/ (``--recompile`` redoes the compiles).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import aoizora  # noqa: F401  (libtpu environment first)
from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network, default_device_order

from benchmarks.machine import machine_info

RESULTS = Path(__file__).parent / "results"
# -- evidence: the real Wan 2.1 1.3B compile, cached as JSON -----------------------------------
MODEL, RESOLUTION, FRAMES = "wan2.1-1.3b", "480p", 81
LAYOUT = "cfg2_context"
EVIDENCE_DIR = RESULTS / "placement_evidence"
GZIP_ABOVE = 1_500_000                 # bytes: larger evidence files are stored gzipped
COMPILE_COMMAND = "python -m benchmarks.placement_solver --recompile {target}"


def evidence_path(target: str) -> Path:
    plain = EVIDENCE_DIR / f"{MODEL}_{RESOLUTION}-{FRAMES}f_{LAYOUT}_{target}.json"
    gz = plain.with_suffix(".json.gz")
    return gz if gz.exists() and not plain.exists() else plain


def compile_instance(target: str) -> dict:
    """Compile Wan 2.1 1.3B (480p, 81 frames, one CFG denoising step) under the expert layout
    LAYOUT on `target` ahead of time with libtpu, in JAX's default device order; write the
    Evidence with its provenance to ``evidence_path(target)`` and return the record."""
    import gzip

    from aoizora.builtin import builtin_job
    from aoizora.models.experts import expert_layouts
    from aoizora.planner import compile_layout

    job = builtin_job(MODEL, RESOLUTION, FRAMES, target)
    ex = {e.name: e for e in expert_layouts(job.model, job.workload, job.target)}[LAYOUT]
    if not ex.valid:
        raise ValueError(f"{LAYOUT} is not valid on {target}: {ex.reason}")
    order = default_device_order(job.target, ex.layout.mesh_axes)
    t0 = time.perf_counter()
    ev = compile_layout(ex.fn, ex.args, job.target, ex.layout, order)
    wall = time.perf_counter() - t0
    rec = {"model": MODEL, "workload": job.workload.name, "job": job.describe(),
           "layout": LAYOUT, "layout_reason": ex.reason, "mesh": dict(ex.layout.mesh_axes),
           "pad_multiple": ex.pad_multiple, "target": target, "target_name": job.target.name,
           "device_order": [int(v) for v in order],
           "device_order_source": "jax.make_mesh (default_device_order)",
           "compile_command": COMPILE_COMMAND.format(target=target),
           "compile": ("aoizora.planner.compile_layout(expert.fn, expert.args, target, "
                       "expert.layout, default_device_order(target, mesh)) -> "
                       "aoizora.extract.aot_compile.compile_evidence (libtpu, ahead of time)"),
           "compile_wall_s": round(wall, 1), "machine": machine_info(),
           "evidence": ev.to_json()}
    EVIDENCE_DIR.mkdir(parents=True, exist_ok=True)
    plain = EVIDENCE_DIR / f"{MODEL}_{RESOLUTION}-{FRAMES}f_{LAYOUT}_{target}.json"
    text = json.dumps(rec, indent=None, separators=(",", ":"))
    for old in (plain, plain.with_suffix(".json.gz")):
        if old.exists():
            old.unlink()
    if len(text) > GZIP_ABOVE:
        with gzip.open(plain.with_suffix(".json.gz"), "wt") as f:
            f.write(text)
    else:
        plain.write_text(text)
    return rec


def load_instance(target: str, recompile: bool = False) -> tuple[dict, Evidence]:
    """The cached record and Evidence for `target` (compiled first when missing or `recompile`)."""
    import gzip

    p = evidence_path(target)
    if recompile or not p.exists():
        rec = compile_instance(target)
    elif p.suffix == ".gz":
        with gzip.open(p, "rt") as f:
            rec = json.load(f)
    else:
        rec = json.loads(p.read_text())
    return rec, Evidence.from_json(rec["evidence"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["v5e-16", "v5e-64", "v5e-256"])
    ap.add_argument("--recompile", action="store_true")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args(argv)
    for t in a.targets:
        rec, ev = load_instance(t, recompile=a.recompile)
        print(f"{t}: {len(ev.collectives)} collectives, mesh {ev.mesh_axes}, "
              f"compile {rec['compile_wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
