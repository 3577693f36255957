"""How much of a compiled step's compute runs while a weight all-gather is in flight: the
compiler's room for prefetch, which Q1 takes as ``formulation.prefetch.PREFETCH_ROOM`` (rho).

For each compiled layout with evidence in ``benchmarks/results/q1_fidelity/`` (compiled by
libtpu ahead of time; nothing ran on a TPU) whose asynchronous all-gathers move at least
``MIN_GATHER_BYTES`` per call:

    window share = sum of the compiler's estimated cycles (x runs) of the compute ops scheduled
                   strictly inside the start..done window of at least one async all-gather
                   / sum of the estimated cycles (x runs) of every compute op

(the compiler's own schedule and cycle estimates; each op counted once). It bounds what the
latency-hiding scheduler lets a prefetched gather hide behind: the rest of the step runs with no
gather in flight. The median over the layouts is the figure Q1's rho is taken from.

Run: ``python -m benchmarks.prefetch_room`` (seconds; reads committed evidence) ->
``benchmarks/results/prefetch_room.json`` and ``.md``.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from aoizora.extract.evidence import Evidence
from aoizora.extract.evidence_summary import hidden_compute_cycles
from aoizora.formulation.prefetch import PREFETCH_ROOM
from benchmarks.machine import git_state

ROOT = Path(__file__).resolve().parent / "results"
EVIDENCE = ROOT / "q1_fidelity"
MIN_GATHER_BYTES = 1e9     # per call: layouts whose weights are gathered, not a stray gather


def window_share(ev: Evidence) -> tuple[float, float]:
    """(window share, async all-gather bytes per call) of one compiled program."""
    total = sum((op.estimated_cycles or 0.0) * op.count for op in ev.compute)
    inside = hidden_compute_cycles(ev, "all-gather")
    gathered = sum(c.bytes * c.count for c in ev.collectives
                   if c.is_async and "all-gather" in c.kind)
    return (inside / total if total else 0.0), float(gathered)


def rows() -> list[dict[str, Any]]:
    out = []
    for f in sorted(EVIDENCE.glob("*/*.evidence.json.gz")):
        ev = Evidence.loads(gzip.open(f, "rt").read())
        share, gathered = window_share(ev)
        out.append({"cell": f.parent.name, "layout": f.name.split(".")[0],
                    "async_all_gather_bytes_per_call": gathered, "window_share": share,
                    "counted": gathered >= MIN_GATHER_BYTES})
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = ["# Prefetch room: compute scheduled while a weight all-gather is in flight",
             "",
             "From the compiler's schedule and cycle estimates in committed evidence (libtpu, "
             "ahead of time; nothing ran on a TPU). `benchmarks/prefetch_room.py`; commit "
             f"{doc['git']['git_commit'][:12]}.", "",
             "| cell | layout | async all-gather GB per call | window share | counted |",
             "|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['cell']} | {r['layout']} | "
                     f"{r['async_all_gather_bytes_per_call'] / 1e9:.2f} | "
                     f"{r['window_share']:.2f} | {'yes' if r['counted'] else 'no'} |")
    lines += ["", f"Median window share over the {doc['counted']} layouts that gather at least "
              f"{MIN_GATHER_BYTES / 1e9:.0f} GB per call: {doc['median']:.2f} "
              f"(range {doc['min']:.2f}-{doc['max']:.2f}). Q1's rho (`PREFETCH_ROOM`): "
              f"{doc['prefetch_room']}.", ""]
    return "\n".join(lines)


def main() -> int:
    rs = rows()
    shares = [r["window_share"] for r in rs if r["counted"]]
    doc = {"git": git_state(), "rows": rs, "counted": len(shares),
           "median": statistics.median(shares), "min": min(shares), "max": max(shares),
           "prefetch_room": PREFETCH_ROOM, "unit": "share of the step's estimated compute cycles"}
    (ROOT / "prefetch_room.json").write_text(json.dumps(doc, indent=1))
    (ROOT / "prefetch_room.md").write_text(markdown(doc))
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
