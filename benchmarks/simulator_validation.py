"""Check the reference simulator against the public worked collective timings on TPU v5e.

Source: the JAX scaling book, "How to Scale Your Model", chapter "sharding"
(jax-ml.github.io/scaling-book/sharding), Pop Quiz 2 and the AllGather / AllReduce / AllToAll
formulas, with v5e's numbers (4.5e10 B/s one way per link, 9e10 B/s both ways, about 1 us per hop;
``shared/facts/tpu.md``). The book's array: bf16[2048, 8192] = 33,554,432 bytes ("34 MB").

Each case is one collective, built as single-collective `Evidence` on the slice it names, and
simulated under the natural placement (logical mesh axis X on physical axis x, Y on y). A case is
*checked* (must be within 15 % of the book) when the book's figure is meant for it; the other rows
are shown for context with the reason (a hypothetical slice, a latency-bound size where the book
itself reports its estimate off by 2.7x against a measured profile).

Run: ``python -m benchmarks.simulator_validation`` -> ``benchmarks/results/simulator_validation
.json`` and ``.md``.
"""

from __future__ import annotations

from benchmarks.machine import machine_info
import dataclasses
import json
import os
from typing import Any

import aoizora  # noqa: F401  (libtpu environment first)
from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.extract.targets import get_target
from benchmarks.simulator import LABEL, Simulator

BOOK = "JAX scaling book, chapter 'sharding' (jax-ml.github.io/scaling-book/sharding)"
ARRAY_BYTES = 2048 * 8192 * 2          # bf16[2048, 8192]
TOLERANCE = 0.15
RESULTS = os.path.join(os.path.dirname(__file__), "results")


@dataclasses.dataclass
class Case:
    name: str
    target: str                 # canonical target the evidence names
    shape: tuple[int, int]      # physical slice (x, y)
    wrap: tuple[bool, bool]
    kind: str
    bytes: int                  # V in the evidence's convention
    book_us: float
    book_says: str
    checked: bool
    note: str = ""
    measured_us: float | None = None   # the book's own profile, where it shows one


def cases() -> list[Case]:
    V = ARRAY_BYTES
    return [
        Case("AllGather over Y=4, no wraparound", "v5e:8x4", (8, 4), (False, False),
             "all-gather", V, 560.0,
             "Pop Quiz 2: v5e mesh {X:8, Y:4}, AllGather_Y([E_Y, F]), E=2048, F=8192: "
             "3 x 8.4e6 / 4.5e10 = 560 us", True,
             measured_us=680.0),
        Case("AllGather over Y=16, full wrapped axis (bidirectional ring)", "v5e:16x16",
             (16, 16), (True, True), "all-gather", V, V / 9e10 * 1e6,
             "T = V / W_ici (bidirectional) = V / (2 W) = 373 us, independent of the axis size",
             True),
        Case("AllReduce over Y=16, full wrapped axis", "v5e:16x16", (16, 16), (True, True),
             "all-reduce", V, 2 * V / 9e10 * 1e6, "T = 2 V / W_ici = 746 us (twice an AllGather)",
             True),
        Case("ReduceScatter over Y=16, full wrapped axis", "v5e:16x16", (16, 16), (True, True),
             "reduce-scatter", V, V / 9e10 * 1e6, "T = V / W_ici = 373 us (as an AllGather)", True),
        Case("AllToAll over Y=16, full wrapped axis", "v5e:16x16", (16, 16), (True, True),
             "all-to-all", V // 16, V / (4 * 9e10) * 1e6,
             "an AllToAll costs a quarter of an AllGather of the same array: V / (4 W_ici) = "
             "93.2 us (V here: the 33.5 MB array; the evidence's V is one device's buffer, "
             "V / 16)", True,
             "the simulator starts all 240 pairwise transfers at once; under max-min sharing the "
             "short ones finish early and the busiest links are not kept full to the end, hence "
             "a little above the book's perfectly balanced count"),
        Case("AllGather over Y=4 with a wraparound (hypothetical slice)", "v5e:8x4", (8, 4),
             (False, True), "all-gather", V, 377.0,
             "Pop Quiz 2: 'with wraparound' 34e6 / 9e10 = 377 us", False,
             "no v5e slice has this (only 16-long axes wrap); the book's first approximation "
             "V / W_ici omits the ring's (N-1)/N factor, which is 3/4 at N = 4: the exact "
             "bidirectional ring count is 3 V / (8 W) = 280 us"),
        Case("AllGather over Y=4, no wraparound, small array (latency-bound)", "v5e:8x4",
             (8, 4), (False, False), "all-gather", 256 * 256 * 2, 3.0,
             "Pop Quiz 2 (b): E=F=256: 3 hops x 1 us = 3 us ('in practice closer to 8 us')",
             False, "latency-bound: the book's own estimate is 2.7x below its measured 8 us; the "
             "simulated line is a one-way ring whose closing step travels 3 hops back, and each "
             "step waits for it: 3 x (0.7 us + 3 us)",
             measured_us=8.0),
    ]


def run_case(case: Case) -> dict[str, Any]:
    target = get_target(case.target)
    X, Y = case.shape
    if tuple(case.wrap) == tuple(target.wrap):
        sim = Simulator(target)
    else:
        c = target.chip
        sim = Simulator(target, network=Network(case.shape, case.wrap, c.link_bandwidth_Bps,
                                                c.hop_latency_s, name=f"{target.name} "
                                                f"(wrap {case.wrap}, hypothetical)"))
    # logical mesh {X, Y}: rank x * Y + y; device id of chip (x, y) on v5e is x + X * y
    placement = [x + X * y for x in range(X) for y in range(Y)]
    groups = [[x * Y + y for y in range(Y)] for x in range(X)]
    ev = Evidence(target=target.name, mesh_axes={"X": X, "Y": Y}, collectives=[
        Collective(name=case.kind, kind=case.kind, dtype="bf16", bytes=int(case.bytes),
                   replica_groups=groups)])
    res = sim.run(ev, placement)
    sim_us = res.step_s * 1e6
    err = (sim_us - case.book_us) / case.book_us
    return {
        "case": case.name, "target": target.name, "slice_shape": list(case.shape),
        "wrap": list(case.wrap), "collective": case.kind, "V_bytes": int(case.bytes),
        "replica_groups": f"{X} groups of {Y} (the Y axis at every x)",
        "algorithm": res.collectives[0].algorithm,
        "simulated_us": round(sim_us, 2), "book_us": round(case.book_us, 2),
        "error_pct": round(100 * err, 1), "book_says": case.book_says,
        "measured_us_in_book": case.measured_us, "checked": case.checked,
        "within_15pct": bool(abs(err) <= TOLERANCE), "note": case.note,
    }


def machine() -> dict:
    return machine_info()

def to_markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Reference simulator against the JAX scaling book (TPU v5e)", "",
        f"Simulated column: {data['label']}. Book: {data['source']}.",
        f"Machine: {data['machine']['platform']}, {data['machine']['cpus']} CPUs, "
        f"Python {data['machine']['python']}. Generated by `python -m "
        "benchmarks.simulator_validation`.", "",
        "| case | slice | collective | V (bytes) | simulated (us) | book (us) | error | checked "
        "| algorithm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["cases"]:
        chk = ("yes, " + ("within 15%" if r["within_15pct"] else "OUTSIDE 15%")) \
            if r["checked"] else "no (context)"
        wrap = "x".join(str(s) for s in r["slice_shape"]) + (
            " wrap " + "/".join("y" if w else "n" for w in r["wrap"]))
        lines.append(f"| {r['case']} | {r['target']} ({wrap}) | {r['collective']} | "
                     f"{r['V_bytes']:,} | {r['simulated_us']:.1f} | {r['book_us']:.1f} | "
                     f"{r['error_pct']:+.1f}% | {chk} | {r['algorithm']} |")
    lines += ["", "Notes:"]
    for r in data["cases"]:
        extra = f" Book's profile: {r['measured_us_in_book']} us." if r["measured_us_in_book"] \
            else ""
        note = f" Note: {r['note']}." if r["note"] else ""
        lines.append(f"- {r['case']}: {r['book_says']}.{note}{extra}")
    lines += ["", f"All checked cases within 15%: {data['all_checked_within_15pct']}.", ""]
    return "\n".join(lines)


def main() -> int:
    rows = [run_case(c) for c in cases()]
    data = {"label": LABEL, "source": BOOK, "tolerance": TOLERANCE, "machine": machine(),
            "cases": rows,
            "all_checked_within_15pct": all(r["within_15pct"] for r in rows if r["checked"])}
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "simulator_validation.json"), "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    with open(os.path.join(RESULTS, "simulator_validation.md"), "w") as f:
        f.write(to_markdown(data))
    print(to_markdown(data))
    return 0 if data["all_checked_within_15pct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
