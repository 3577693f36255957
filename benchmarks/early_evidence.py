"""Early evidence against the full compile's, on the committed Q1-fidelity cells.

For every layout of ``benchmarks/results/q1_fidelity/<cell>/`` (each ``<name>.json`` names its
program, layout and device order; ``<name>.evidence.json.gz`` is the evidence of its full
ahead-of-time compile) the layout is compiled again with ``extract.early_evidence``
(``candidate_pricing.early_layout_evidence``): in a child
process with an XLA dump, the child killed once libtpu has written the module after the HLO
passes. Per layout: the early evidence's wall seconds (child start to module read; and to the
module written), the full compile's seconds as committed (the record's ``compile_s``: realize,
lower and compile; the evidence's ``compile_s``: ``.compile()`` alone), whether the collectives
are identical (every field of every collective but ``overlap_cycles``, which needs the backend's
cycle estimates: name, kind, dtype, bytes, groups, pairs, runs, async, phase, schedule positions,
fused compute, op_name), the first difference when not, whether the compute ops are the same
(names, kinds, runs, positions: only their cycles are missing), and the memory report's HBM
total against ``memory_analysis()``'s.

    python -m benchmarks.early_evidence                          # the 1.3B cell, then the 14B
    python -m benchmarks.early_evidence --cell wan2.1-1.3b_480p-21f_v5e-8 --only ilp_8

Writes ``benchmarks/results/early_evidence.json`` and ``.md`` (rows of earlier runs kept, a
layout run again replaces its row). Nothing ran on a TPU. The full compiles' seconds were
measured when the cells were collected, under another load of this shared machine: the ratio
is indicative, not a back-to-back pair.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import aoizora  # noqa: F401  -- libtpu's environment first
from aoizora.builtin import builtin_job
from aoizora.extract.evidence import Evidence
from aoizora.formulation.layout import Layout
from aoizora.models.experts import expert_layouts
from aoizora.planning.candidate_pricing import compile_layout, early_layout_evidence
from benchmarks.machine import git_state, machine_info, machine_line, write_results

Q1 = Path(__file__).resolve().parent / "results" / "q1_fidelity"
OUT = Path(__file__).resolve().parent / "results"
CELLS = ("wan2.1-1.3b_480p-21f_v5e-8", "wan2.1-14b_480p-21f_v5e-8")
COLLECTIVE_FIELDS = ("name", "kind", "dtype", "bytes", "replica_groups", "source_target_pairs",
                     "count", "is_async", "phase", "start_index", "done_index", "fused_with",
                     "computation", "op_name")
COMPUTE_FIELDS = ("name", "kind", "count", "index", "computation", "custom_call_target")


def collective_difference(early: Evidence, full: Evidence) -> str:
    """"" when the collectives are identical on ``COLLECTIVE_FIELDS``, else the first
    difference (in schedule order)."""
    a, b = early.collectives, full.collectives
    for i, (x, y) in enumerate(zip(a, b)):
        for f in COLLECTIVE_FIELDS:
            vx, vy = getattr(x, f), getattr(y, f)
            if vx != vy:
                return f"collective #{i} ({y.name}, {y.kind}): {f} {vx!r} early, {vy!r} full"
    if len(a) != len(b):
        return f"{len(a)} collectives early, {len(b)} full"
    return ""


def compute_match(early: Evidence, full: Evidence) -> dict[str, Any]:
    """How the early compute ops relate to the full ones: the full evidence's ops, those of them
    the early evidence has too (same name, kind, runs, schedule position), and the share of the
    full compute cycles on the ones it lacks (ops the reader records only when they carry a
    cycle estimate: copies, reduces, slices ...)."""
    mine = {(o.name, o.kind, o.count, o.index) for o in early.compute}
    hit = [o for o in full.compute if (o.name, o.kind, o.count, o.index) in mine]
    total = sum((o.estimated_cycles or 0) * o.count for o in full.compute)
    missed = total - sum((o.estimated_cycles or 0) * o.count for o in hit)
    return {"compute_ops_full": len(full.compute), "compute_ops_early": len(early.compute),
            "compute_ops_matched": len(hit),
            "unmatched_cycles_share": missed / total if total else 0.0}


def program_of(cell: str, rec: dict[str, Any], job, experts: dict[str, Any]):
    """(fn, args, layout) of a record: an expert's own padded program or the cell's job, and the
    layout as recorded."""
    layout = Layout.from_json(rec["layout"])
    prog = rec["program"]
    if prog.get("job"):
        return job.fn, job.args, layout
    ex = experts[prog["expert"]]
    if ex.pad_multiple != prog.get("pad_multiple"):
        raise ValueError(f"{cell} {rec['name']}: expert pad {ex.pad_multiple}, recorded "
                         f"{prog.get('pad_multiple')}")
    return ex.fn, ex.args, layout


def run_layout(cell: str, path: Path, job, experts, fresh_full: bool = False) -> dict[str, Any]:
    rec = json.loads(path.read_text())
    name = path.stem
    row: dict[str, Any] = {"cell": cell, "layout": name, "full_compile_s": rec.get("compile_s")}
    gz = path.with_name(f"{name}.evidence.json.gz")
    if "error" in rec or not gz.exists():
        row["error"] = f"no committed full evidence ({rec.get('error', 'missing')})"
        return row
    with gzip.open(gz, "rt") as f:
        full = Evidence.loads(f.read())
    row["full_dot_compile_s"] = full.compile_s
    fn, args, layout = program_of(cell, rec, job, experts)
    try:
        got = early_layout_evidence(fn, args, job.target, layout, rec["device_order"])
    except Exception as e:  # noqa: BLE001 -- recorded
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        return row
    ev = got.evidence
    diff = collective_difference(ev, full)
    row.update({
        "early_s": round(got.seconds, 2), "module_s": round(got.module_s, 2),
        "lowered_s": None if got.lowered_s is None else round(got.lowered_s, 2),
        "child_finished": got.child_finished, "fidelity": ev.fidelity,
        "collectives": len(full.collectives), "collectives_identical": not diff,
        "first_difference": diff, **compute_match(ev, full),
        "early_cycles": sum((op.estimated_cycles or 0) * op.count for op in ev.compute),
        "full_cycles": sum((op.estimated_cycles or 0) * op.count for op in full.compute),
        "dump_memory_bytes": got.dump_memory_bytes,
        "full_memory_bytes": full.memory.total_bytes,
        "full_memory_without_code_bytes": full.memory.total_bytes
        - full.memory.generated_code_bytes,
        "full_fits": full.memory.fits, "early_fits": ev.memory.fits,
    })
    if fresh_full:
        row.update(fresh_full_row(fn, args, job.target, layout, rec["device_order"], ev, full))
    return row


def fresh_full_row(fn, args, tgt, layout, order, early: Evidence, committed: Evidence
                   ) -> dict[str, Any]:
    """The full compile again, in this process right after the early one (a back-to-back pair
    under the same load): its wall seconds (realize, lower, compile) and ``.compile()`` seconds,
    whether the early collectives equal its collectives, and whether it reproduces the committed
    evidence (collectives, compute cycles)."""
    t0 = time.perf_counter()
    fresh = compile_layout(fn, args, tgt, layout, order)
    wall = time.perf_counter() - t0
    cyc = [sum((o.estimated_cycles or 0) * o.count for o in e.compute) for e in (fresh, committed)]
    return {"fresh_full_s": round(wall, 2), "fresh_full_dot_compile_s": round(fresh.compile_s, 2),
            "fresh_vs_early": collective_difference(early, fresh) or "identical",
            "fresh_vs_committed": collective_difference(fresh, committed)
            or ("identical" if cyc[0] == cyc[1] else f"cycles {cyc[0]:.0f} vs {cyc[1]:.0f}")}


def _s(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def report(doc: dict[str, Any]) -> list[str]:
    rows = doc["rows"]
    ok = [r for r in rows if "error" not in r]
    same = [r for r in ok if r["collectives_identical"]]
    lines = ["# Early evidence: collectives from the module after the HLO passes", "",
             machine_line(doc), "",
             "Generated by `python -m benchmarks.early_evidence` (`extract/early_evidence.py`): "
             "each layout of the committed Q1-fidelity cells compiled in a child process with "
             "`XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`, the child killed (SIGKILL) "
             "once libtpu wrote `*.after_optimizations.txt` and its memory report, the module "
             "read with `evidence_from_hlo_text`, and compared with the committed full "
             "compile's evidence (`<layout>.evidence.json.gz`). No TPU ran.", "",
             "- early s: child start (a fresh interpreter: jax import, libtpu init, tracing, "
             "lowering) to the module read; lowered s: to the module before optimization "
             "written (what is left is libtpu's HLO passes and the dump); module s: to the "
             "module and its memory report written;",
             "- full s: the committed record's `compile_s` (realize + lower + compile, measured "
             "when the cell was collected, under another load: not a back-to-back pair); "
             "`.compile()` s: the committed evidence's own `compile_s`;",
             "- collectives identical: every field of every collective but `overlap_cycles` "
             "(name, kind, dtype, bytes, groups, pairs, runs, async, phase, schedule positions, "
             "fused compute, computation, op_name);",
             "- compute ops: of the full evidence's compute ops, those the early evidence has "
             "(same name, kind, runs, position), and the share of the full compute cycles on the "
             "others (ops the reader keeps only when they carry a cycle estimate: copies, "
             "reduces, slices). The early ops carry no cycles at all;",
             "- memory: the dump's memory report (HBM after the HLO passes' buffer assignment) "
             "against `memory_analysis()`'s total, and that total less the generated code.", ""]
    if ok:
        lines += [f"**Summary.** {len(same)} of {len(ok)} layouts have identical collectives"
                  f"{'' if len(ok) == len(rows) else f' ({len(rows) - len(ok)} not run: error)'}; "
                  f"median early {_median([r['early_s'] for r in ok]):.1f} s against median full "
                  f"{_median([r['full_compile_s'] for r in ok]):.1f} s (committed; `.compile()` "
                  f"alone {_median([r['full_dot_compile_s'] for r in ok]):.1f} s); median "
                  f"ratio early/full "
                  f"{_median([r['early_s'] / r['full_compile_s'] for r in ok]):.2f}.", ""]
    fresh = [r for r in ok if "fresh_full_s" in r]
    if fresh:
        lines += [f"**Back to back** (`--fresh-full`: each layout compiled fully in this process "
                  f"right after its early evidence, same load): {len(fresh)} layouts, median "
                  f"early {_median([r['early_s'] for r in fresh]):.1f} s against median full "
                  f"{_median([r['fresh_full_s'] for r in fresh]):.1f} s (`.compile()` alone "
                  f"{_median([r['fresh_full_dot_compile_s'] for r in fresh]):.1f} s), median "
                  f"ratio {_median([r['early_s'] / r['fresh_full_s'] for r in fresh]):.2f}; "
                  f"early collectives identical to the fresh compile's in "
                  f"{sum(r['fresh_vs_early'] == 'identical' for r in fresh)} of {len(fresh)}; "
                  f"the fresh compile reproduces the committed evidence (collectives and compute "
                  f"cycles) in {sum(r['fresh_vs_committed'] == 'identical' for r in fresh)} of "
                  f"{len(fresh)}.", ""]
    for cell in doc["cells"]:
        cr = [r for r in rows if r["cell"] == cell]
        if not cr:
            continue
        lines += [f"## {cell}", "",
                  "| layout | early s | lowered s | module s | full s | `.compile()` s | collectives | "
                  "identical | compute ops matched (cycles unmatched) | memory report / analysis (/ less code) | "
                  "first difference |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in cr:
            if "error" in r:
                lines.append(f"| {r['layout']} | - | - | - | {r.get('full_compile_s')} | - | - | - | "
                             f"- | - | error: {r['error'][:150]} |")
                continue
            mem = "-"
            if r["dump_memory_bytes"]:
                mem = (f"{r['dump_memory_bytes'] / r['full_memory_bytes'] - 1:+.1%} "
                       f"({r['dump_memory_bytes'] / r['full_memory_without_code_bytes'] - 1:+.1%})")
            lines.append(
                f"| {r['layout']} | {r['early_s']:.1f} | {_s(r['lowered_s'])} | {r['module_s']:.1f} | "
                f"{r['full_compile_s']:.1f} | {r['full_dot_compile_s']:.1f} | {r['collectives']} | "
                f"{'yes' if r['collectives_identical'] else 'no'} | "
                f"{r['compute_ops_matched']}/{r['compute_ops_full']} "
                f"({r['unmatched_cycles_share']:.1%}) | {mem} | {r['first_difference'] or '-'} |")
        lines.append("")
        fr = [r for r in cr if "fresh_full_s" in r]
        if fr:
            lines += ["Back to back (`--fresh-full`):", "",
                      "| layout | early s | full s | `.compile()` s | early vs full | "
                      "full vs committed |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['layout']} | {r['early_s']:.1f} | {r['fresh_full_s']:.1f} | "
                      f"{r['fresh_full_dot_compile_s']:.1f} | {r['fresh_vs_early']} | "
                      f"{r['fresh_vs_committed']} |" for r in fr]
            lines.append("")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", action="append", help="cell directory name (default: all, in order)")
    ap.add_argument("--only", default="", help="comma-separated layout names (file stems)")
    ap.add_argument("--fresh-full", action="store_true",
                    help="also compile each layout fully, right after its early evidence")
    a = ap.parse_args(argv)
    cells = a.cell or list(CELLS)
    only = {s for s in a.only.split(",") if s}
    out_json = OUT / "early_evidence.json"
    old = json.loads(out_json.read_text())["rows"] if out_json.exists() else []
    rows = {(r["cell"], r["layout"]): r for r in old}
    for cell in cells:
        model, rest = cell.split("_", 1)
        res_frames, target = rest.rsplit("_", 1)
        resolution, frames = res_frames.split("-")
        job = builtin_job(model, resolution, int(frames.rstrip("f")), target)
        experts = {ex.name: ex for ex in expert_layouts(job.model, job.workload, job.target)}
        for path in sorted((Q1 / cell).glob("*.json")):
            if only and path.stem not in only:
                continue
            t0 = time.perf_counter()
            row = run_layout(cell, path, job, experts, a.fresh_full)
            rows[(cell, path.stem)] = row
            print(f"{cell} {path.stem}: {json.dumps({k: v for k, v in row.items() if k not in ('cell', 'layout')})}"
                  f" [{time.perf_counter() - t0:.1f} s]", flush=True)
            _write(rows)
    _write(rows)
    print(f"wrote {OUT / 'early_evidence.md'}")


def _write(rows: dict) -> None:
    order = {c: i for i, c in enumerate(CELLS)}
    ordered = sorted(rows.values(), key=lambda r: (order.get(r["cell"], 99), r["cell"], r["layout"]))
    doc = {"machine": machine_info(), "git": git_state(),
           "cells": sorted({r["cell"] for r in ordered}, key=lambda c: (order.get(c, 99), c)),
           "rows": ordered}
    write_results(str(OUT), "early_evidence", doc, report(doc))


if __name__ == "__main__":
    main()
