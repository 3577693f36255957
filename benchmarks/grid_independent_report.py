"""The grid re-planned and re-simulated with the independent simulator (issue #34, item 5).

    python -m benchmarks.grid_independent_report [--dir benchmarks/results/grid_independent]

Reads the cell JSONs that ``python -m benchmarks.grid --out benchmarks/results/grid_independent``
wrote (every pair priced by the simulator given the program's compiled HLO: its own compute,
kernel and splash models, not the compiler's cycle estimates that Q2 prices compute with) and
writes ``benchmarks/results/grid_independent.md``: per cell the plan's speedup over the best
expert configuration (simulated), Spearman's rho between Q2 and the simulator over all priced
(layout, placement) pairs and over the plan layout's placements, top-1 (the simulator's best pair
is the plan), the plan's rank, and where Q2 and the simulator disagree: the pair each ranks
first, and which term (compute or exposed communication) turns the order. The same cells of the
earlier grid (``benchmarks/results/grid/``, simulated without the HLO: compute priced as Q2
prices it) are shown beside, for comparison. Every latency is a prediction or a simulation;
nothing ran on a TPU.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence

from benchmarks.grid_report import cell_row, fmt_ms, load_cells
from benchmarks.grid import INDEPENDENT, Q2_LABEL, RESULTS, SIM_LABEL, TIE_REL, grid_cells
from aoizora.extract.atomic_io import atomic_write

OUT = INDEPENDENT.parent / "grid_independent.md"


def _rho(v) -> str:
    return f"{v:.3f}" if v is not None else "n/a"


def _geomean(v: Sequence[float]) -> float | None:
    v = [x for x in v if x and x > 0]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def _name(p: dict[str, Any]) -> str:
    also = p.get("also") or []
    return p["what"] + (f" (= {', '.join(also[:2])})" if also else "")


def _terms(p: dict[str, Any], k: str) -> tuple[float, float]:
    """(compute, exposed communication incl. latency) of a pair by model k ("q2" or "sim")."""
    step, comp = p[f"{k}_step_s"], p[f"{k}_compute_s"] or 0.0
    return comp, step - comp


def _first(pairs: list[dict[str, Any]], k: str) -> dict[str, Any]:
    """The pair model k ranks first; the plan's pair when it ties with it (``TIE_REL``)."""
    best = min(pairs, key=lambda p: p[f"{k}_step_s"])
    plan = next((p for p in pairs if p["what"] == "aoizora"), None)
    if plan is not None and plan[f"{k}_step_s"] <= best[f"{k}_step_s"] * (1 + TIE_REL):
        return plan
    return best


def disagreement(cell: dict[str, Any]) -> dict[str, Any] | None:
    """The pair Q2 ranks first and the pair the simulator ranks first, and, when they differ
    (beyond ``TIE_REL``), which term turns the order: the difference B - A of each model's compute
    and exposed communication between Q2's first (A) and the simulator's first (B). The term whose
    difference changes most between the two models is the one that disagrees. None without
    pairs."""
    pairs = [p for p in cell.get("fidelity", {}).get("pairs", [])
             if p.get("q2_step_s") and p.get("sim_step_s")]
    if not pairs:
        return None
    a = _first(pairs, "q2")
    b = _first(pairs, "sim")
    out = {"q2_first": _name(a), "sim_first": _name(b), "q2_first_sim_s": a["sim_step_s"],
           "sim_first_q2_s": b["q2_step_s"], "q2_first_q2_s": a["q2_step_s"],
           "sim_first_sim_s": b["sim_step_s"],
           "q2_rank_of_sim_first": 1 + sum(p["q2_step_s"] < b["q2_step_s"] * (1 - TIE_REL)
                                           for p in pairs),
           "sim_rank_of_q2_first": 1 + sum(p["sim_step_s"] < a["sim_step_s"] * (1 - TIE_REL)
                                           for p in pairs)}
    same = (a is b or a["sim_step_s"] <= b["sim_step_s"] * (1 + TIE_REL)
            or b["q2_step_s"] <= a["q2_step_s"] * (1 + TIE_REL))
    out["agree"] = bool(same)
    if same:
        return out
    qa, qb, sa, sb = _terms(a, "q2"), _terms(b, "q2"), _terms(a, "sim"), _terms(b, "sim")
    d_q2 = (qb[0] - qa[0], qb[1] - qa[1])          # > 0: Q2 prices B slower in that term
    d_sim = (sb[0] - sa[0], sb[1] - sa[1])         # < 0 overall: the simulator prices B faster
    shift = (d_sim[0] - d_q2[0], d_sim[1] - d_q2[1])
    out.update(exposed_s={"q2_first": {"q2": qa[1], "sim": sa[1]},
                          "sim_first": {"q2": qb[1], "sim": sb[1]}},
               compute_s={"q2_first": {"q2": qa[0], "sim": sa[0]},
                          "sim_first": {"q2": qb[0], "sim": sb[0]}},
               q2_delta={"compute_s": d_q2[0], "communication_s": d_q2[1]},
               sim_delta={"compute_s": d_sim[0], "communication_s": d_sim[1]},
               term="compute" if abs(shift[0]) >= abs(shift[1]) else "communication",
               same_program_and_layout=(a.get("program", "job") == b.get("program", "job")
                                        and a["layout"] == b["layout"]))
    return out


def _explain(d: dict[str, Any] | None) -> str:
    if d is None:
        return "no pairs"
    if d["agree"]:
        tail = ("" if d["q2_first"].startswith("aoizora") else
                " (a baseline, not the plan: the planner did not price that layout itself "
                "within its budget)")
        return f"agree: both rank first {d['q2_first']}{tail}"
    q, s, e, c = d["q2_delta"], d["sim_delta"], d["exposed_s"], d["compute_s"]
    return (f"Q2 first: {d['q2_first']} (sim rank {d['sim_rank_of_q2_first']}); sim first: "
            f"{d['sim_first']} (Q2 rank {d['q2_rank_of_sim_first']}). Sim-first minus Q2-first, "
            f"compute {q['compute_s'] * 1e3:+.2f} ms by Q2 vs {s['compute_s'] * 1e3:+.2f} ms "
            f"simulated, communication {q['communication_s'] * 1e3:+.2f} vs "
            f"{s['communication_s'] * 1e3:+.2f} ms: **{d['term']}** turns the order. Exposed "
            f"communication (Q2-first / sim-first): Q2 {e['q2_first']['q2'] * 1e3:.2f} / "
            f"{e['sim_first']['q2'] * 1e3:.2f} ms, sim {e['q2_first']['sim'] * 1e3:.2f} / "
            f"{e['sim_first']['sim'] * 1e3:.2f} ms; compute: Q2 "
            f"{c['q2_first']['q2'] * 1e3:.2f} / {c['sim_first']['q2'] * 1e3:.2f} ms, sim "
            f"{c['q2_first']['sim'] * 1e3:.2f} / {c['sim_first']['sim'] * 1e3:.2f} ms")


def cell_line(c: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """The numbers of one cell for the table (None where the cell has none)."""
    az = cell_row(c, "aoizora") or {}
    f = c.get("fidelity", {})
    pairs = f.get("pairs", [])
    be = cell_row(c, c.get("best_expert") or "") or {}
    experts_q2 = [r for r in c.get("rows", []) if r["name"].startswith("expert:")
                  and r.get("q2_step_s")]
    beq = min(experts_q2, key=lambda r: r["q2_step_s"]) if experts_q2 else None
    own = [p for p in pairs if p.get("layout") == next(
        (q["layout"] for q in pairs if q["what"] == "aoizora"), None)
        and p.get("program", "job") == "job"]
    ms = c.get("machine_start", {}).get("load_average") or [None]
    me = (c.get("machine_end") or {}).get("load_average") or [None]
    of = (old or {}).get("fidelity", {})
    return {
        "cell": c["cell"], "error": c.get("error") or az.get("error"),
        "load": (ms[0], me[0]), "budget_s": c.get("budget_s"),
        "planning_s": c.get("planning_time_s"), "mesh": az.get("mesh"),
        "compiled": sum(1 for k in c.get("candidates", []) if k.get("q2_step_s")),
        "plan_from": next((str(k.get("layout")) for k in c.get("candidates", [])
                           if k.get("q2_step_s") and abs(k["q2_step_s"] - (az.get("q2_step_s") or 0))
                           <= 1e-6 * k["q2_step_s"]), None),
        "plan_sim_s": az.get("sim_step_s"), "plan_q2_s": az.get("q2_step_s"),
        "plan_sim_compute_s": az.get("sim_compute_s"), "plan_q2_compute_s": az.get("q2_compute_s"),
        "best_expert": c.get("best_expert"), "best_expert_sim_s": be.get("sim_step_s"),
        "speedup_sim": c.get("speedup_over_best_expert"),
        "speedup_q2": (beq["q2_step_s"] / az["q2_step_s"]) if beq and az.get("q2_step_s") else None,
        "best_expert_q2": beq["name"] if beq else None,
        "rho_all": f.get("rho_all"), "rho_placements": f.get("rho_placements"),
        "n_pairs": len(pairs), "n_placements": len(own), "top1": f.get("top1"),
        "rank": f.get("plan_sim_rank"), "sim_best": f.get("sim_best"),
        "gain": f.get("sim_best_gain_over_plan"),
        "hlo_pairs": sum(1 for p in pairs if p.get("sim_hlo")),
        "unpriced_ops": max((p.get("sim_unpriced_ops") or 0 for p in pairs), default=0),
        "disagreement": disagreement(c),
        "old": ({"speedup_sim": old.get("speedup_over_best_expert"), "rho_all": of.get("rho_all"),
                 "rho_placements": of.get("rho_placements"), "top1": of.get("top1"),
                 "best_expert": old.get("best_expert"),
                 "compiled": sum(1 for k in old.get("candidates", []) if k.get("q2_step_s")),
                 "load": ((old.get("machine_start") or {}).get("load_average") or [None])[0],
                 "mesh": (cell_row(old, "aoizora") or {}).get("mesh")} if old else None),
    }


def _x(v) -> str:
    return f"{v:.3f}x" if v else "-"


def _load(t) -> str:
    a, b = t
    return f"{a:.1f} / {b:.1f}" if a is not None and b is not None else "?"


def markdown(lines_: list[dict[str, Any]], cells: list[dict[str, Any]], all_cells: list[str]
             ) -> list[str]:
    ok = [l for l in lines_ if l["plan_sim_s"]]
    ran = {l["cell"] for l in lines_}
    commits = sorted({(c.get("machine_start") or {}).get("git_commit", "")[:7] for c in cells})
    md = ["# The grid with the independent simulator (issue #34, item 5)", "",
          f"Generated by `python -m benchmarks.grid_independent_report` from {len(cells)} cell "
          "JSON file(s) in `benchmarks/results/grid_independent/` (`python -m benchmarks.grid "
          "--cells NAME --budget 240 --out benchmarks/results/grid_independent`, commit(s) "
          f"{', '.join(commits) or '?'}). **Nothing ran on a TPU**: every program was compiled "
          "ahead of time by libtpu on a CPU-only machine; every latency is **"
          f"{SIM_LABEL}** (\"sim\") or **{Q2_LABEL}** (\"Q2\"). The simulator was given every "
          "program's compiled HLO (`Simulator.run(..., hlo=...)`), so its compute is its own "
          "model's (`benchmarks/sim/hlo_cost.py`, `kernel_model.py`, `mosaic.py`: splash block "
          "by block), independent of the compiler's cycle estimates Q2 prices compute with; its "
          "network and overlap models were independent before. Its constants were not changed "
          "for this run.", "",
          "Columns: speedup = best expert's step / the plan's step (the best of the expert "
          "configurations by the same model, each in JAX's default order); rho (all): Spearman "
          "between Q2 and sim over every priced (program, layout, placement) pair of the cell "
          "(the plan's layout under the default order, CP-SAT, heuristics, 10 seeded random "
          "placements; each other candidate the planner compiled under its CP-SAT placement and "
          "the default order; Alpa-style; experts); rho (placements): over the plan layout's "
          "placements only (the compute is the same program there, so it compares the network "
          "terms); top-1: the sim's fastest pair is the plan (0.01% ties); rank: the plan's sim "
          "rank among the pairs. Load: 1-minute load average at the cell's start / end (2 cores, "
          "shared).", "",
          "| cell | plan mesh | plan sim ms | best expert (sim) | speedup (sim) | speedup (Q2) | "
          "rho (all) | rho (placements) | top-1 | rank | pairs with HLO | load | planning s "
          "(layouts compiled) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for l in lines_:
        if not l["plan_sim_s"]:
            md.append(f"| {l['cell']} | failed: {str(l['error'])[:100]} | | | | | | | | | | "
                      f"{_load(l['load'])} | |")
            continue
        mesh = "x".join(str(v) for v in (l["mesh"] or {}).values())
        plan_s = (f"{l['planning_s']:.0f} ({l['compiled']})" if l["planning_s"] else "-")
        md.append(f"| {l['cell']} | {mesh} | {fmt_ms(l['plan_sim_s'])} | "
                  f"{(l['best_expert'] or '-').removeprefix('expert:')} "
                  f"{fmt_ms(l['best_expert_sim_s'])} | {_x(l['speedup_sim'])} | {_x(l['speedup_q2'])} | "
                  f"{_rho(l['rho_all'])} ({l['n_pairs']}) | {_rho(l['rho_placements'])} "
                  f"({l['n_placements']}) | {'yes' if l['top1'] else 'no'} | {l['rank']} | "
                  f"{l['hlo_pairs']}/{l['n_pairs']} | {_load(l['load'])} | {plan_s} |")
    g = _geomean([l["speedup_sim"] for l in ok])
    md += ["", f"Cells run: {len(ok)} of {len(all_cells)} in the grid"
           + (f"; geometric mean speedup over the best expert (sim) {g:.3f}x "
              f"({min(l['speedup_sim'] for l in ok if l['speedup_sim']):.3f}-"
              f"{max(l['speedup_sim'] for l in ok if l['speedup_sim']):.3f}x), top-1 in "
              f"{sum(bool(l['top1']) for l in ok)} of {len(ok)}" if g else "") + ".",
           "Not run (time): " + (", ".join(c for c in all_cells if c not in ran) or "none") + ".",
           "", "## Where Q2 and the simulator disagree", "",
           "Per cell: the pair each model ranks first; when they differ, each model's difference "
           "(simulator's first minus Q2's first) in compute and in exposed communication, and "
           "the term whose difference the two models price most differently.", ""]
    for l in ok:
        md.append(f"- **{l['cell']}**: {_explain(l['disagreement'])}. The plan's layout: "
                  f"{l['plan_from'] or '?'} ({l['compiled']} layout(s) compiled and priced within "
                  f"the budget). Plan compute: Q2 "
                  f"{fmt_ms(l['plan_q2_compute_s'])} ms, sim {fmt_ms(l['plan_sim_compute_s'])} ms"
                  + (f"; the sim's best pair is {l['sim_best']}, {100 * (l['gain'] - 1):.2f}% "
                     f"faster than the plan" if not l["top1"] and l.get("gain") else "")
                  + (f"; up to {l['unpriced_ops']} op(s) per program left at the compiler's "
                     "estimate (the sim's model could not price them)" if l["unpriced_ops"] else "")
                  + ".")
    md += ["", "## Against the earlier grid (simulated without the HLO)", "",
           "The same cells in `benchmarks/results/grid/`: planned by older code, simulated with "
           "compute priced from the compiler's cycle estimates (as Q2 prices it), so rho and top-1 "
           "there compared two models sharing their compute term.", "",
           "| cell | speedup (sim), old -> new | rho (all), old -> new | rho (placements), old -> "
           "new | top-1, old -> new | plan mesh, old -> new | layouts compiled, old -> new | load "
           "at start, old -> new |", "|---|---|---|---|---|---|---|---|"]
    for l in ok:
        o = l["old"]
        if not o:
            md.append(f"| {l['cell']} | (no earlier cell) | | | | | | |")
            continue
        mo = "x".join(str(v) for v in (o["mesh"] or {}).values())
        mn = "x".join(str(v) for v in (l["mesh"] or {}).values())
        md.append(f"| {l['cell']} | {_x(o['speedup_sim'])} -> {_x(l['speedup_sim'])} | "
                  f"{_rho(o['rho_all'])} -> {_rho(l['rho_all'])} | {_rho(o['rho_placements'])} -> "
                  f"{_rho(l['rho_placements'])} | {o['top1']} -> {l['top1']} | {mo} -> {mn} | "
                  f"{o['compiled']} -> {l['compiled']} | "
                  f"{o['load'] if o['load'] is None else round(o['load'], 1)} -> "
                  f"{l['load'][0] if l['load'][0] is None else round(l['load'][0], 1)} |")
    return md


def write_report(directory: Path = INDEPENDENT, out: Path = OUT, old_dir: Path = RESULTS) -> Path:
    cells = load_cells(directory)
    old = {c["cell"]: c for c in load_cells(old_dir)} if Path(old_dir).is_dir() else {}
    lines_ = [cell_line(c, old.get(c["cell"])) for c in cells]
    md = markdown(lines_, cells, [c.name for c in grid_cells()])
    atomic_write(out, "\n".join(md) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(INDEPENDENT))
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    p = write_report(Path(a.dir), Path(a.out))
    print(p.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
