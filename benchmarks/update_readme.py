"""Regenerate README.md's results section from the committed results in benchmarks/results/.

    python -m benchmarks.update_readme            # rewrite the section
    python -m benchmarks.update_readme --check    # exit 1 if README.md is not up to date

Everything between the README's `<!-- benchmarks-start -->` and `<!-- benchmarks-end -->` markers
is replaced by ``section()``: one short table of the workload grid, read from the cell JSON files
of ``benchmarks/results/grid/`` (``python -m benchmarks.grid``), and the list of the other result
files with the command that writes each. Per group of cells (a target, a model, all of them):

  vs X        = geometric mean over the group's cells of  step(X) / step(AoiZora's plan),
                with its least and largest value (> 1: the plan is faster);
  placement   = the largest over the group of  step(plan's layout, jax.make_mesh order) /
                step(plan) - 1, and in how many cells it is under 0.5%;
  never slower, top-1: counts of cells (the cell JSON's ``never_slower`` and
                ``fidelity.top1``).

Every step is the row's ``sim_step_s`` (the AoiZora reference simulator) as the cell JSON holds it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence
from aoizora.extract.atomic_io import atomic_write

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "benchmarks" / "results"
GRID = RES / "grid"
START, END = "<!-- benchmarks-start -->", "<!-- benchmarks-end -->"
TARGET_ORDER = ("v5e-4", "v5e-8", "v5e-16", "v6e-8")
MODEL_NAMES = {"wan2.1-1.3b": "Wan 2.1 1.3B", "wan2.1-14b": "Wan 2.1 14B",
               "hunyuanvideo-13b": "HunyuanVideo 13B"}
PLACEMENT_SMALL = 0.005   # a placement gain under this counts as small (0.5%)

# the other result files: (file, what it holds, the command that writes it)
OTHER_RESULTS = (
    ("plan_wan2.1-1.3b_480p-81f_v5e-8.md", "the default `aoizora plan`, its summary and iterations",
     "python -m benchmarks.plan_default"),
    ("ilp_only.md", "every grid cell planned with no seed layouts: what the ILP's own layouts "
     "are worth against the best expert", "python -m benchmarks.ilp_only"),
    ("hint_invariance_v5e-16.md", "a 4.1e9-parameter joint text+video DiT with and without "
     "hints, before and after the fix", "python -m benchmarks.hint_invariance"),
    ("refactor_invariance.md", "three grid cells planned before and after the refactor of the "
     "planner: the same plans", "python -m benchmarks.refactor_invariance"),
    ("tile_compare_wan2.1-1.3b_480p-81f_v5e-8.md", "one layout under three splash tile choices, "
     "priced by Q2's kernel model", "python -m benchmarks.tile_compare"),
    ("placement_solver.md", "placement CP-SAT against heuristics on v5e-16, v5e-64, v5e-256",
     "python -m benchmarks.placement_solver"),
    ("sharding_vs_heuristics.md", "sharding ILP against heuristic searches (Q1)",
     "python -m benchmarks.sharding_vs_heuristics"),
    ("sharding_solvers.md", "HiGHS against CBC at the planner's per-mesh limit",
     "python -m benchmarks.sharding_solvers --force"),
    ("simulator_validation.md", "the independent simulator against 17 measured public TPU figures",
     "python -m benchmarks.simulator_validation"),
    ("expert_compile.md", "the expert configurations compiled for v5e-8",
     "python -m benchmarks.expert_compile"),
    ("kv_overlap.md", "hiding context parallelism's key/value all-gathers",
     "python -m benchmarks.kv_overlap"),
    ("compiler_options.md", "libtpu options against the best expert's exposed communication",
     "python -m benchmarks.compiler_options"),
    ("evidence_timing.md", "trace, compile and parse times",
     "python -m benchmarks.evidence_timing"),
)


def load_cells(directory: Path = GRID) -> list[dict[str, Any]]:
    """The grid's cell JSON files that hold a plan, in file-name order."""
    cells = [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]
    return [c for c in cells if not c.get("error") and row(c, "aoizora")]


def row(cell: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The row ``name`` of a cell with a simulated step, or None."""
    r = next((r for r in cell.get("rows", []) if r.get("name") == name), None)
    return r if r and r.get("sim_step_s") else None


def speedups(cells: Sequence[dict[str, Any]], name: str) -> list[float]:
    """step(row ``name``) / step(plan) per cell that has the row; "best-expert": the cell's best
    expert configuration (``speedup_over_best_expert``)."""
    if name == "best-expert":
        return [c["speedup_over_best_expert"] for c in cells if c.get("speedup_over_best_expert")]
    out = []
    for c in cells:
        r, az = row(c, name), row(c, "aoizora")
        if r and az:
            out.append(r["sim_step_s"] / az["sim_step_s"])
    return out


def geomean(v: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in v) / len(v))


def _ratio(v: Sequence[float]) -> str:
    if not v:
        return "-"
    if len(v) == 1:
        return f"{v[0]:.3f}x"
    return f"{geomean(v):.3f}x ({min(v):.3f}-{max(v):.3f}x)"


def _placement(v: Sequence[float]) -> str:
    if not v:
        return "-"
    small = sum(1 for x in v if x - 1.0 < PLACEMENT_SMALL)
    return f"{(max(v) - 1.0) * 100:.1f}% ({small} of {len(v)} under {PLACEMENT_SMALL:.1%})"


def groups(cells: Sequence[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(label, cells) per target, per model, then all cells."""
    by_target: dict[str, list] = {}
    by_model: dict[str, list] = {}
    for c in cells:
        by_target.setdefault(c.get("target_arg", "?"), []).append(c)
        by_model.setdefault(c.get("model", "?"), []).append(c)
    rank = {t: i for i, t in enumerate(TARGET_ORDER)}
    out = [(t, by_target[t]) for t in sorted(by_target, key=lambda t: (rank.get(t, 99), t))]
    rank = {m: i for i, m in enumerate(MODEL_NAMES)}
    out += [(MODEL_NAMES.get(m, m), by_model[m])
            for m in sorted(by_model, key=lambda m: (rank.get(m, 99), m))]
    return out + [("all cells", list(cells))]


def grid_table(cells: Sequence[dict[str, Any]]) -> list[str]:
    budgets = sorted({f"{c.get('budget_s', 0):g} s" for c in cells})
    lines = [
        f"The workload grid: {len(cells)} cells (model x workload x target), planning budget "
        f"{', '.join(budgets)}, seed 0. Every step latency is **simulated by the AoiZora reference "
        "simulator** (`benchmarks/simulator.py`) on the program libtpu compiled for the target "
        "ahead of time; no TPU ran. Speedup = baseline step / the plan's step: geometric mean "
        "over the cells (least-largest). Baselines: the best of seven expert configurations "
        "(`aoizora/models/experts.py`) in JAX's default order; Alpa-style search (the sharding "
        "ILP with fixed alpha-beta costs, default order); the plan's own layout in "
        "`jax.make_mesh`'s order (what placement alone gains). **Planned and simulated before this "
        "round's changes** (hints, Q2's splash kernel model, tiles: `CHANGELOG.md`) by the "
        "simulator of that time, which priced compute as Q2 did (splash at 100% of peak): not "
        "re-run yet.", "",
        "| cells | n | vs best expert | vs Alpa-style search | placement vs `jax.make_mesh` order, "
        "largest | never slower | top-1 |",
        "|---|---|---|---|---|---|---|"]
    for label, cs in groups(cells):
        never = sum(1 for c in cs if c.get("never_slower"))
        top1 = sum(1 for c in cs if (c.get("fidelity") or {}).get("top1"))
        lines.append(f"| {label} | {len(cs)} | {_ratio(speedups(cs, 'best-expert'))} | "
                     f"{_ratio(speedups(cs, 'alpa-logical'))} | "
                     f"{_placement(speedups(cs, 'aoizora-layout/default-order'))} | "
                     f"{never} of {len(cs)} | {top1} of {len(cs)} |")
    lines += ["", "never slower: the plan is no slower than any baseline in the cell (differences "
              "under 0.01% are ties); top-1: the simulator's fastest (layout, placement) pair of "
              "the cell is the plan. Every cell, every row: `benchmarks/results/grid.md`. "
              "Reproduce: `python -m benchmarks.grid` (a cell at a time, about 5-9 minutes each "
              "on 2 cores), `python -m benchmarks.grid_report`, "
              "`python -m benchmarks.update_readme`."]
    return lines


def other_results() -> list[str]:
    lines = ["Other results (each file states its machine and how it ran):", ""]
    for fname, what, cmd in OTHER_RESULTS:
        if (RES / fname).exists():
            lines.append(f"- `benchmarks/results/{fname}`: {what} (`{cmd}`)")
    return lines


def section() -> str:
    cells = load_cells()
    body = (grid_table(cells) if cells
            else ["No grid cell has run yet (`python -m benchmarks.grid`)."])
    return "\n".join(body + [""] + other_results())


def splice(text: str, body: str) -> str:
    """``text`` with everything between the markers replaced by ``body``."""
    if START not in text or END not in text:
        raise SystemExit("README.md lacks the benchmark markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}\n{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if README.md's results section is not what the results give")
    args = ap.parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = splice(text, section())
    if args.check:
        if new != text:
            print("README.md's results section is out of date: "
                  "run python -m benchmarks.update_readme")
            return 1
        print("README.md's results section is up to date")
        return 0
    atomic_write(readme, new)
    print("README.md results section regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
