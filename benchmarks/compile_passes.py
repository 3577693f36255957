"""Where a compile's time goes, and whether options that skip work change the evidence.

For one cell's expert layout (default: Wan 2.1 1.3B, 480p-81f, v5e-8, ``cfg2_context``, JAX's
default device order) each option set is compiled ahead of time by libtpu in a child process
with libtpu's pass timer on (``TPU_VMODULE=hlo_pass_pipeline=1``: one line per HLO pass with its
time). Per option set: the compile's wall time, the time in HLO passes (by pass and by
pipeline, largest first) and the rest (libtpu's backend after the HLO passes: LLO scheduling,
code generation, Mosaic kernels), and the evidence compared with the default's:
the same collectives (kind, bytes, groups, runs, async) and the compute cycles within 1%.

    python -m benchmarks.compile_passes                           # the default cell
    python -m benchmarks.compile_passes --model wan2.1-small --resolution 128p --frames 9

Writes ``benchmarks/results/compile_passes_<cell>.json`` and ``.md``. Nothing ran on a TPU:
times are of the ahead-of-time compile on this machine's CPUs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
EXPERT = "cfg2_context"
# options that might skip work the evidence does not read (each checked against the default)
OPTION_SETS: dict[str, dict[str, Any] | None] = {
    "default": None,
}
_PASS = re.compile(r"HLO pass: (\S+) time: [^(]*\((\d+) us\)")
_PIPE = re.compile(r"Running HLO pass pipeline on module \S+: (.+)$")
_STAGE = re.compile(r"\] (\w+) stage duration: ((?:[\d.]+(?:h|ms|us|m|s))+)")
_UNIT = re.compile(r"([\d.]+)(h|ms|us|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def duration_s(text: str) -> float:
    """An absl duration ("1m53.2s", "584.8ms", "5.4s") in seconds."""
    return sum(float(v) * _SECONDS[u] for v, u in _UNIT.findall(text))


def parse_pass_log(text: str) -> dict[str, Any]:
    """libtpu's pass-timer lines -> seconds per pass and per pipeline (the pipeline a pass ran
    in is the last one announced before it), and their sum."""
    per_pass: dict[str, float] = collections.Counter()
    per_pipe: dict[str, float] = collections.Counter()
    pipe = "?"
    for line in text.splitlines():
        m = _PIPE.search(line)
        if m:
            pipe = m.group(1).strip()
            continue
        m = _PASS.search(line)
        if m:
            s = int(m.group(2)) * 1e-6
            per_pass[m.group(1)] += s
            per_pipe[pipe] += s
    stages: dict[str, float] = collections.Counter()
    for m in _STAGE.finditer(text):
        stages[m.group(1)] += duration_s(m.group(2))
    return {"passes_s": sum(per_pass.values()), "stages_s": dict(stages),
            "by_pass": dict(sorted(per_pass.items(), key=lambda kv: -kv[1])[:25]),
            "by_pipeline": dict(sorted(per_pipe.items(), key=lambda kv: -kv[1])[:15])}


def evidence_signature(ev) -> dict[str, Any]:
    """What pricing reads, to compare two compiles: each collective's kind, bytes, groups,
    runs and async flag (sorted), and the compute cycles per call."""
    colls = sorted((c.kind, int(c.bytes), str(c.replica_groups), int(c.count), bool(c.is_async))
                   for c in ev.collectives)
    cycles = sum((op.estimated_cycles or 0) * op.count for op in ev.compute)
    return {"collectives": colls, "cycles": float(cycles), "fits": ev.memory.fits,
            "hbm_bytes": int(ev.memory.total_bytes)}


def child(args: argparse.Namespace) -> None:
    """In the child process: compile one option set, print the evidence signature as JSON."""
    import aoizora  # noqa: F401
    from aoizora.builtin import builtin_job
    from aoizora.planning.candidate_pricing import compile_layout
    from aoizora.extract.network import default_device_order
    from aoizora.models.experts import expert_layouts

    job = builtin_job(args.model, args.resolution, args.frames, args.target)
    e = next(x for x in expert_layouts(job.model, job.workload, job.target) if x.name == args.expert)
    order = default_device_order(job.target, e.layout.mesh_axes)
    options = json.loads(args.options) if args.options else None
    t0 = time.perf_counter()
    ev = compile_layout(e.fn, e.args, job.target, e.layout, order, compiler_options=options)
    wall = time.perf_counter() - t0
    print("SIGNATURE " + json.dumps({"compile_s": ev.compile_s, "realize_compile_s": wall,
                                     **evidence_signature(ev)}), flush=True)


def run_option_set(args: argparse.Namespace, options: dict | None) -> dict[str, Any]:
    env = {**os.environ, "TPU_VMODULE": "hlo_pass_pipeline=1", "TPU_STDERR_LOG_LEVEL": "0",
           "TPU_MIN_LOG_LEVEL": "0"}
    cmd = [sys.executable, "-m", "benchmarks.compile_passes", "--child", "--model", args.model,
           "--resolution", args.resolution, "--frames", str(args.frames), "--target",
           args.target, "--expert", args.expert, "--options", json.dumps(options or {})]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sig = next((json.loads(l[len("SIGNATURE "):]) for l in p.stdout.splitlines()
                if l.startswith("SIGNATURE ")), None)
    if sig is None:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    timing = parse_pass_log(p.stderr)
    out = {**sig, **timing, "other_s": sig["compile_s"] - timing["passes_s"]}
    st = out["stages_s"]
    if "BACKEND_PASSES" not in st and "HLO_PASSES" in st:   # not logged: the rest of the compile
        st["BACKEND_PASSES (rest)"] = sig["compile_s"] - st["HLO_PASSES"] - st.get(
            "CODE_GENERATION", 0.0)
    return out


def same_evidence(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, str]:
    """Same collectives and bytes, cycles within 1%, same fit."""
    if a["collectives"] != b["collectives"]:
        ca = collections.Counter(map(tuple, a["collectives"]))
        cb = collections.Counter(map(tuple, b["collectives"]))
        only_a, only_b = ca - cb, cb - ca
        return False, (f"collectives differ: {sum(only_a.values())} only in the default "
                       f"(e.g. {next(iter(only_a), None)}), {sum(only_b.values())} only here "
                       f"(e.g. {next(iter(only_b), None)})")
    if a["fits"] != b["fits"]:
        return False, "fit differs"
    rel = abs(a["cycles"] - b["cycles"]) / max(a["cycles"], 1.0)
    return rel <= 0.01, f"cycles {100 * rel:.2f}% apart"


def report(cell: str, rows: dict[str, dict[str, Any]]) -> str:
    lines = [f"# Where a compile's time goes: {cell}, expert {EXPERT}, JAX's default order", "",
             "Ahead-of-time compiles by libtpu on this machine's CPUs (no TPU ran); pass times "
             "from libtpu's pass timer (`TPU_VMODULE=hlo_pass_pipeline=1`), seconds. "
             "Generated by `python -m benchmarks.compile_passes`.", "",
             "libtpu's own stage timer splits END_TO_END into HLO_PASSES (the HLO the evidence "
             "reads), BACKEND_PASSES (LLO: the low-level scheduling of each kernel's bundles) "
             "and CODE_GENERATION.", "",
             "| options | compile s | HLO_PASSES s | BACKEND_PASSES s | CODE_GENERATION s | "
             "END_TO_END s | same evidence |",
             "|---|---|---|---|---|---|---|"]
    base = rows.get("default")
    for label, r in rows.items():
        if "error" in r:
            lines.append(f"| {label} | - | - | - | - | - | error: {r['error'][:120]} |")
            continue
        same = "-" if label == "default" or not base else "%s (%s)" % same_evidence(base, r)
        st = r.get("stages_s", {})
        st = {**st, "BACKEND_PASSES": st.get("BACKEND_PASSES", st.get("BACKEND_PASSES (rest)"))}
        cells = " | ".join(f"{st[k]:.2f}" if st.get(k) is not None else "-" for k in
                           ("HLO_PASSES", "BACKEND_PASSES", "CODE_GENERATION", "END_TO_END"))
        lines.append(f"| {label} | {r['compile_s']:.2f} | {cells} | {same} |")
    if base and "by_pipeline" in base:
        lines += ["", "## Default: HLO pass pipelines, largest first (s)", ""]
        lines += [f"- {k}: {v:.2f}" for k, v in base["by_pipeline"].items()]
        lines += ["", "## Default: HLO passes, largest first (s)", ""]
        lines += [f"- {k}: {v:.2f}" for k, v in base["by_pass"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="wan2.1-1.3b")
    ap.add_argument("--resolution", default="480p")
    ap.add_argument("--frames", type=int, default=81)
    ap.add_argument("--target", default="v5e-8")
    ap.add_argument("--expert", default=EXPERT)
    ap.add_argument("--options", default="", help="(child) JSON compiler options")
    ap.add_argument("--extra", default="", help='more option sets: JSON {"label": {...}}')
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return
    sets = dict(OPTION_SETS)
    if args.extra:
        sets.update(json.loads(args.extra))
    cell = f"{args.model}_{args.resolution}-{args.frames}f_{args.target}"
    rows = {}
    for label, options in sets.items():
        rows[label] = run_option_set(args, options)
        r = rows[label]
        print(label, {k: v for k, v in r.items() if k not in ("collectives", "by_pass")},
              flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    stem = os.path.join(RESULTS, f"compile_passes_{cell}")
    with open(stem + ".json", "w") as f:
        json.dump({"cell": cell, "expert": args.expert, "option_sets": sets,
                   "rows": {k: {kk: vv for kk, vv in v.items() if kk != "collectives"}
                            for k, v in rows.items()}}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(report(cell, rows))
    print(f"wrote {stem}.md")


if __name__ == "__main__":
    main()
