"""Cells re-run with tuned experts and a compile budget: the plan against the best tuned expert,
the experts as published, and the best tuned expert under a solved placement.

    python -m benchmarks.tuned_cells_report [--dirs DIR,...] [--out FILE]

Reads the cell JSON files of each directory (inference cells of ``benchmarks.grid``, training
cells of ``benchmarks.training_grid``, both run with ``--tuned-experts --compiles N``) and
writes one table: per cell, the commit it ran at, its budget, where the plan's layout came
from (``plan_origin``), and every step **simulated by the
independent simulator** (``benchmarks/sim/``) on the program libtpu compiled for the target
(ms; no TPU ran); speedup = that row's step / the plan's (> 1: the plan is faster). Then, per
cell, each expert's published and tuned settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "benchmarks" / "results"
DIRS = (RES / "grid_tuned", RES / "training_tuned", RES / "tuned_small")
OUT = RES / "tuned_cells.md"


def _rows(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r.get("name"): r for r in c.get("rows", [])}


def _ms(r: dict[str, Any] | None) -> str:
    return f"{r['sim_step_s'] * 1e3:.4g}" if r and r.get("sim_step_s") else "-"


def _x(r: dict[str, Any] | None, plan: dict[str, Any] | None) -> str:
    if not (r and plan and r.get("sim_step_s") and plan.get("sim_step_s")):
        return "-"
    return f"{r['sim_step_s'] / plan['sim_step_s']:.3f}x"


def cell_line(c: dict[str, Any]) -> str:
    """One table row of a cell."""
    rows = _rows(c)
    plan = rows.get("aoizora")
    experts = [r for n, r in rows.items() if n.startswith("expert:") and r.get("sim_step_s")]
    pub = min(experts, key=lambda r: r["sim_step_s"]) if experts else None
    bt, solved = rows.get("best-tuned-expert"), rows.get("best-tuned-expert/solved-placement")
    commit = ((c.get("machine_start") or {}).get("git_commit")
              or (c.get("git") or {}).get("git_commit") or "?")[:7]
    budget = f"{c.get('compiles')} compiles, guard {c.get('budget_s', 0):g} s"
    tuned = f"{bt.get('expert')} ({bt.get('knobs')})" if bt else "-"
    return (f"| {c['cell']} | {commit} | {budget} | {plan_origin(c) or '-'} | {_ms(plan)} | "
            f"{tuned} {_ms(bt)} | "
            f"{_x(bt, plan)} | {pub['name'].removeprefix('expert:') if pub else '-'} {_ms(pub)} "
            f"| {_x(pub, plan)} | {_ms(solved)} | {_x(solved, plan)} | "
            f"{_x(rows.get('alpa-logical'), plan)} |")


def plan_origin(c: dict[str, Any]) -> str | None:
    """Where the plan's layout came from, by the candidate the planner chose (the least Q2 of
    the compiled candidates): "ILP" (a layout of the sharding ILP's own), "refined NAME" (an
    expert's attention with the ILP's layout around it) or "expert NAME"; with " = ILP" when an
    ILP candidate ties it (Q2 within 0.01%: the ILP found the same program). None when the cell
    kept no candidates (the training cells)."""
    cands = [x for x in c.get("candidates") or [] if x.get("q2_step_s")]
    if not cands:
        return None
    best = min(cands, key=lambda x: x["q2_step_s"])
    label = str(best.get("layout") or "")
    if label.startswith("ilp"):
        return "ILP"
    kind, _, name = label.partition(":")
    name = name.removeprefix("expert:")
    tie = any(str(x.get("layout", "")).startswith("ilp")
              and abs(x["q2_step_s"] / best["q2_step_s"] - 1) < 1e-4 for x in cands)
    return f"{'refined' if kind == 'refined' else 'expert'} {name}" + (" = ILP" if tie else "")


def tuning_lines(c: dict[str, Any]) -> list[str]:
    """Each expert of a cell: its published step, its best setting and step, the settings priced."""
    out = []
    for t in c.get("tuning", []):
        p, b = t.get("published") or {}, t.get("best") or {}
        why = next((x.get("reason") for x in t.get("trials", []) if x.get("reason")), "")
        ps = f"{p['step_s'] * 1e3:.4g} ms" if p.get("step_s") else f"not priced ({why[:160]})"
        bs = f"{b['step_s'] * 1e3:.4g} ms" if b.get("step_s") else "not priced"
        knobs = ", ".join(f"{k} {b[k]}" for k in ("remat", "blocks", "options") if k in b)
        gain = f" ({t['gain']:.3f}x from tuning)" if t.get("gain") else ""
        untried = f"; not tried (compile cap): {len(t['untried'])}" if t.get("untried") else ""
        out.append(f"- {t['name']}: as published {ps}; best {bs} with {knobs or '-'}{gain}; "
                   f"{len(t.get('trials', []))} setting(s) priced{untried}")
    return out


def commit_of(c: dict[str, Any]) -> str:
    """The short commit a cell ran at."""
    return ((c.get("machine_start") or {}).get("git_commit")
            or (c.get("git") or {}).get("git_commit") or "?")[:7]


def ratio(c: dict[str, Any], name: str) -> float | None:
    """Row ``name``'s simulated step over the plan's (> 1: the plan is faster); ``"published"``:
    the best expert as published; None when either is not priced."""
    rows = _rows(c)
    plan, r = rows.get("aoizora"), rows.get(name)
    if name == "published":
        experts = [x for n, x in rows.items() if n.startswith("expert:") and x.get("sim_step_s")]
        r = min(experts, key=lambda x: x["sim_step_s"]) if experts else None
    if not (plan and r and plan.get("sim_step_s") and r.get("sim_step_s")):
        return None
    return r["sim_step_s"] / plan["sim_step_s"]


def by_commit(cells: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The cells of the real models (not ``wan2.1-small``) with a tuned-expert ratio, by the
    commit they ran at."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        if (not c.get("error") and not c["cell"].startswith("wan2.1-small")
                and ratio(c, "best-tuned-expert")):
            groups.setdefault(commit_of(c), []).append(c)
    return groups


def commit_summaries(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Per commit with at least two cells (``by_commit``): the plan against the best tuned
    expert, the best expert as published and Alpa-style (geometric mean, median, range), and in
    how many cells the plan is never slower than the best tuned expert (0.01% ties)."""
    out = []
    for commit, cs in sorted(by_commit(cells).items(), key=lambda g: -len(g[1])):
        if len(cs) < 2:
            continue
        parts = []
        for label, name in (("best tuned expert", "best-tuned-expert"),
                            ("best expert as published", "published"),
                            ("Alpa-style", "alpa-logical")):
            xs = [x for x in (ratio(c, name) for c in cs) if x]
            if xs:
                parts.append(f"over the {label} {statistics.geometric_mean(xs):.3f}x / "
                             f"{statistics.median(xs):.3f}x ({min(xs):.3f}-{max(xs):.3f}x, "
                             f"{len(xs)} cells)")
        tuned = [ratio(c, "best-tuned-expert") for c in cs]
        never = sum(x >= 0.9999 for x in tuned)
        origins = [o for o in (plan_origin(c) for c in cs) if o]
        own = (f"; the plan's layout is the ILP's own in {sum(o == 'ILP' for o in origins)} of "
               f"{len(origins)}, a seed's that an ILP candidate ties in "
               f"{sum(o.endswith('= ILP') for o in origins)}" if origins else "")
        out.append(f"- At {commit}, {len(cs)} cells ({', '.join(c['cell'] for c in cs)}): the "
                   f"plan {'; '.join(parts)} (geometric mean / median (range)); never slower "
                   f"than the best tuned expert in {never} of {len(tuned)}{own}.")
    return out


def load(dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Every cell JSON under ``dirs``."""
    return [json.loads(p.read_text()) for d in dirs if Path(d).is_dir()
            for p in sorted(Path(d).glob("*.json"))]


def report(dirs: Sequence[Path]) -> str:
    cells = load(dirs)
    lines = ["# Cells re-run with tuned experts and a compile budget", "",
             "Generated by `python -m benchmarks.tuned_cells_report` from "
             + ", ".join(f"`{Path(d).relative_to(ROOT)}/`" for d in dirs) + ". Every step is "
             "**simulated by the independent simulator** (`benchmarks/sim/`) on the program "
             "libtpu compiled for the target ahead of time; no TPU ran. ms per step; x = the "
             "row's step / the plan's (> 1: the plan is faster). Best tuned expert: each expert "
             "at the best of its users' knobs (`aoizora/expert_tuning.py`), the least of them; "
             "as published: the best expert with its recipe's settings; solved placement: the "
             "best tuned expert under CP-SAT's placement. Only these cells were re-run: no "
             "grid-wide figure follows from them. `tuned_small/` holds cells of the small test "
             "model (`wan2.1-small`, a few MB of weights), run to check the machinery end to "
             "end: they say nothing about the real models.", "",
             "| cell | commit | budget | plan's layout | plan ms | best tuned expert ms | plan x "
             "it | best expert as published ms | plan x it | tuned + solved placement ms | plan "
             "x it | plan x Alpa-style |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [cell_line(c) for c in cells if not c.get("error")]
    summary = commit_summaries(cells)
    if summary:
        lines += ["", "Cells run at one commit (simulated):", ""] + summary
    for c in cells:
        lines += ["", f"## {c['cell']}", ""]
        if c.get("error"):
            lines.append(f"error: {c['error']}")
            continue
        lines += tuning_lines(c) or ["(no tuned experts)"]
        errs = c.get("errors") or []
        if errs:
            lines.append(f"- errors: {len(errs)} ({'; '.join(str(e.get('row') or e.get('where')) for e in errs)})")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dirs", default=",".join(str(d) for d in DIRS))
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    text = report([Path(d) for d in a.dirs.split(",") if d])
    Path(a.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
