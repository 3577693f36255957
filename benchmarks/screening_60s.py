"""Issue #50 on the default cell: does `aoizora plan --time-budget 60` give the 300 s plan, with
and without the screen (``aoizora.planning.screening``)?

    python -m benchmarks.screening_60s --reference P300.json [--run NAME ...]
        [--plan NAME=FILE ...] [--out benchmarks/results/screening_60s] [--report-only]

``--run NAME`` runs ``aoizora plan --no-cache --out FILE`` with ``RUNS[NAME]``'s flags
(``before``: ``--time-budget 60 --no-screen``, the loop as it was; ``after``: ``--time-budget
60``, screening, the default; ``count1a``, ``count1b``: ``--compiles 1`` twice), one at a time,
and records its wall-clock and the load average before and after; ``--plan NAME=FILE`` takes a
plan made elsewhere. The report also lists each screening run's screen prices against the Q2 of
the same layouts where they were compiled fully. Every plan (the reference too) is then compiled once more in its own device
order (``candidate_pricing.compile_layout``, no cache) and priced by Q2
(``formulation.latency.predict_step``) and by the reference simulator (``benchmarks.simulator``,
its own compute model on the compiled HLO). A plan "gives the 300 s plan" when its mesh and
layout equal the reference's (the layout's JSON without its name), and its simulated step is
within ``SAME_STEP`` of the reference's. Every latency is a prediction (Q2 or the simulator on
the compiled XLA:TPU program); nothing runs on a TPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from aoizora.builtin import builtin_job
from aoizora.extract.aot_compile import keeping_hlo, read_hlo
from aoizora.extract.atomic_io import atomic_write
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.planning.candidate_pricing import compile_layout
from aoizora.plans import load_plan
from benchmarks.machine import git_state, machine_info
from benchmarks.simulator import LABEL as SIM_LABEL, Simulator

RESULTS = Path(__file__).resolve().parent / "results" / "screening_60s"
SAME_STEP = 0.01          # the "simulated step within 1%"
CELL = ("wan2.1-1.3b", "480p", 81, "v5e-8")   # the CLI's default cell
# each run's flags; count1a and count1b: the same compile count twice (the count, not the clock,
# decides what is screened and compiled: the two must agree)
RUNS = {"before": ["--time-budget", "60", "--no-screen"], "after": ["--time-budget", "60"],
        "count1a": ["--compiles", "1"], "count1b": ["--compiles", "1"]}


def run_plan(name: str, out_dir: Path) -> tuple[Path, dict[str, Any]]:
    """``aoizora plan`` at the default cell, no cache, with ``RUNS[name]``'s flags; (the plan
    file, its run record: wall seconds, load averages, the command, stderr's tail)."""
    path = out_dir / f"plan_{name}.json"
    cmd = [sys.executable, "-m", "aoizora", "plan", "--no-cache", "--out", str(path),
           *RUNS[name]]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rec = {"command": " ".join(["aoizora", *cmd[3:]]), "returncode": done.returncode,
           "wall_s": round(time.perf_counter() - t0, 1), "loadavg_before": list(load0),
           "loadavg_after": list(os.getloadavg()),
           "stderr_tail": done.stderr.strip().splitlines()[-4:]}
    (out_dir / f"plan_{name}.stderr.txt").write_text(done.stderr)
    return path, rec


def layout_key(layout) -> str:
    """A layout's identity, whatever its name."""
    d = layout.to_json()
    d.pop("name", None)
    return json.dumps(d, sort_keys=True)


def plan_steps(job, plan) -> tuple[float, float]:
    """(Q2's step, the simulator's step), seconds, of ``plan`` compiled again for ``job`` in the
    plan's own device order, no cache.

    Raises:
      aoizora.extract.aot_compile.CompileError: the plan does not compile.
    """
    net = Network.from_target(job.target)
    with tempfile.TemporaryDirectory() as tmp, keeping_hlo(tmp):
        ev = compile_layout(job.fn, job.args, job.target, plan.layout, plan.device_order)
        text = read_hlo(ev)
        sim = Simulator(job.target, net).run(ev, plan.device_order,
                                             hlo=parse_hlo_module(text) if text else None)
    return predict_step(ev, plan.device_order, net).step_s, sim.step_s


def priced(path: Path) -> dict[str, Any]:
    """A plan compiled again in its own device order, priced by Q2 and the simulator (seconds).

    Raises:
      aoizora.extract.aot_compile.CompileError: the plan does not compile.
    """
    p = load_plan(str(path))
    prog = p.program or {}
    job = builtin_job(*CELL, pad_multiple=prog.get("pad_multiple"))
    q2_s, sim_s = plan_steps(job, p)
    return {"file": os.path.relpath(path), "mesh": p.mesh, "layout": p.layout.name,
            "layout_key": layout_key(p.layout), "device_order": list(p.device_order),
            "planner_q2_step_s": p.predicted["step_s"], "q2_step_s": q2_s,
            "sim_step_s": sim_s, "planning_time_s": p.planning_time_s,
            "compiles": dict(p.compiles), "status": p.status,
            "screens": [s for it in p.iterations for s in it.get("screens") or []],
            "q2_of_compiled": {_key(c): c["q2_step_s"] for it in p.iterations
                               for c in it["candidates"] if c.get("q2_step_s")},
            "notes": [n for n in p.notes if "screen" in n or "stopped" in n]}


def _key(row: dict[str, Any]) -> str:
    """A candidate's or a screen's layout on its mesh, as a key."""
    return f"{row['layout']} on {json.dumps(row['mesh'])}"


def compare(plan: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """Whether ``plan`` gives the reference plan: same mesh, layout, device order; its simulated
    step over the reference's."""
    ratio = plan["sim_step_s"] / ref["sim_step_s"]
    same_layout = plan["mesh"] == ref["mesh"] and plan["layout_key"] == ref["layout_key"]
    return {"same_mesh_and_layout": same_layout,
            "same_device_order": plan["device_order"] == ref["device_order"],
            "sim_over_reference": ratio,
            "gives_reference": same_layout and abs(ratio - 1.0) <= SAME_STEP}


def report(out: dict[str, Any]) -> str:
    """The markdown of a run."""
    m, g = out["machine"], out["git"]
    lines = [
        "# `aoizora plan --time-budget 60` against the 300 s plan, with and without the screen "
        "(`aoizora.planning.screening`)",
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['platform']}, jax {m.get('jax', '?')}, no "
        f"TPU; {m['date']}; commit {g.get('git_commit', '')[:12]}"
        f"{' (modified: ' + ', '.join(g['git_modified_files']) + ')' if g.get('git_modified_files') else ''}. Shared with another compile-heavy session: "
        "the load average is recorded per run.",
        "Generated by `python -m benchmarks.screening_60s` (the default cell, Wan 2.1 1.3B "
        "480p-81f on v5e-8, planned with `--no-cache`: `before` with `--time-budget 60 "
        "--no-screen`, `after` with `--time-budget 60` (the screen on, the default), `count1a` "
        "and `count1b` with `--compiles 1` (every layout screened, one compiled fully: the two "
        "runs must agree); the reference is the 300 s plan of the same "
        f"cell, {out.get('reference_note', 'given')}). Every "
        f"plan is compiled again in its device order and priced by Q2 (the planner's link-load "
        f"model) and **{SIM_LABEL}**: both are predictions; nothing runs on a TPU.",
        "", "| plan | planning s / wall s | load 1-min before, after | mesh | layout | compiled | "
        "screened | Q2 (ms) | sim (ms) | sim / ref | same layout | same order | gives the 300 s "
        "plan |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ref = out["reference"]
    for name, row in [("reference (300 s)", ref)] + list(out["plans"].items()):
        run, c = row.get("run", {}), row.get("compare", {})
        load = (f"{run['loadavg_before'][0]:.2f}, {run['loadavg_after'][0]:.2f}"
                if run else out.get("reference_load", "-") if row is ref else "-")
        mesh = "x".join(f"{k}{v}" for k, v in row["mesh"].items())
        lines.append(
            f"| {name} | {row['planning_time_s']:.1f}" + (f" / {run['wall_s']:.1f}" if run else "")
            + f" | {load} | {mesh} | {row['layout']} | {row['compiles'].get('compiled', '?')} | "
            f"{row['compiles'].get('screened', '-')} | {row['q2_step_s'] * 1e3:.3f} | "
            f"{row['sim_step_s'] * 1e3:.3f} | "
            + (f"{c['sim_over_reference']:.4f} | {'yes' if c['same_mesh_and_layout'] else 'no'} | "
               f"{'yes' if c['same_device_order'] else 'no'} | "
               f"{'**yes**' if c['gives_reference'] else 'no'} |" if c else "1 | - | - | - |"))
    lines += ["", "Notes of each plan (screening, why it stopped):", ""]
    for name, row in [("reference", ref)] + list(out["plans"].items()):
        lines += [f"- {name}: " + "; ".join(row["notes"])]
    return "\n".join(lines + screens_table(out)) + "\n"


def screens_table(out: dict[str, Any]) -> list[str]:
    """Each screening run's screen prices against the Q2 of the same layouts compiled fully (in
    any run, the reference's included), milliseconds."""
    rows = [(n, r) for n, r in out["plans"].items() if r.get("screens")]
    if not rows:
        return []
    q2: dict[str, float] = {}
    for r in [out["reference"], *out["plans"].values()]:
        q2.update(r.get("q2_of_compiled", {}))
    lines = ["", "Screen prices (`screen_s`: early evidence, default device order; a ranking "
             "device, not a prediction) against Q2 of the full compile of the same layout where "
             "one ran (ms); `-`: not screened (time budget) or never compiled fully:", "",
             "| layout | mesh | " + " | ".join(f"{n} screen" for n, _ in rows) + " | Q2 |",
             "|---|---|" + "---|" * len(rows) + "---|"]
    first = rows[-1][1]["screens"] if len(rows[-1][1]["screens"]) >= len(rows[0][1]["screens"]) \
        else rows[0][1]["screens"]
    for s in first:
        cells = []
        for _, r in rows:
            m = next((x for x in r["screens"] if x["layout"] == s["layout"]
                      and x["mesh"] == s["mesh"]), None)
            cells.append(f"{m['screen_step_s'] * 1e3:.1f}" if m and m["screen_step_s"] else "-")
        q = q2.get(_key(s))
        mesh = "x".join(f"{k}{v}" for k, v in s["mesh"].items())
        lines.append(f"| {s['layout']} | {mesh} | " + " | ".join(cells)
                     + f" | {q * 1e3:.1f} |" if q else f"| {s['layout']} | {mesh} | "
                     + " | ".join(cells) + " | - |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", required=True, help="the 300 s plan (aoizora plan --out)")
    ap.add_argument("--run", action="append", default=[], choices=sorted(RUNS))
    ap.add_argument("--plan", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--reference-note", default="given",
                    help="where the reference plan was made (commit, command), for the report")
    ap.add_argument("--reference-load", default="-", help="its load averages, for the report")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the markdown from the JSON of the last run")
    a = ap.parse_args(argv)
    out_dir = Path(a.out)
    if a.report_only:
        out = json.loads((out_dir / f"{out_dir.name}.json").read_text())
        out.update(reference_note=a.reference_note, reference_load=a.reference_load)
        atomic_write(out_dir / f"{out_dir.name}.json", json.dumps(out, indent=1))
        atomic_write(out_dir.parent / f"{out_dir.name}.md", report(out))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"machine": machine_info(), "git": git_state(), "plans": {},
                           "labels": {"sim": SIM_LABEL, "q2": "predicted (Q2)"},
                           "unit": "seconds", "reference_note": a.reference_note,
                           "reference_load": a.reference_load}
    files = [(name, Path(f), None) for name, f in (s.split("=", 1) for s in a.plan)]
    files += [(name, *run_plan(name, out_dir)) for name in a.run]
    out["reference"] = priced(Path(a.reference))
    for name, path, run in files:
        row = priced(path)
        row["compare"] = compare(row, out["reference"])
        if run is not None:
            row["run"] = run
        out["plans"][name] = row
    atomic_write(out_dir / f"{out_dir.name}.json", json.dumps(out, indent=1))
    atomic_write(out_dir.parent / f"{out_dir.name}.md", report(out))
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
