"""Regenerate every figure README.md quotes from the committed results in benchmarks/results/.

    python -m benchmarks.update_readme            # rewrite the generated regions
    python -m benchmarks.update_readme --check    # exit 1 if README.md is not up to date

README.md marks each generated region as ``<!-- generated:NAME -->...<!-- /generated -->``
(inline or on lines of their own); ``REGIONS`` maps NAME to the function that writes its text,
and ``splice`` replaces what is between the markers, nothing else. The figures come from ONE
inference grid and ONE training grid:

  - inference: the cell JSON files of ``benchmarks/results/grid_independent/`` (``python -m
    benchmarks.grid --out benchmarks/results/grid_independent``): every step simulated by the
    independent simulator (``benchmarks/sim/``) on each program's compiled HLO;
  - training: ``benchmarks/results/training_grid/`` (``python -m benchmarks.training_grid``).

Per group of cells (a target, a model, all of them), for a baseline X:

  speedup     = step(X) / step(AoiZora's plan) per cell (> 1: the plan is faster), reported as
                the geometric mean AND the median over the group, with the least (the worst
                cell) and the largest;
  placement   = step(the plan's layout in ``jax.make_mesh``'s order) / step(plan) - 1;
  never slower, top-1: counts of cells (the cell's ``never_slower``, ``fidelity.top1``; in
                training, never slower than the best expert: speedup >= 1 - ``TIE``).

Every region also says where the figures came from: how many commits the cells ran at (no hash:
README.md names no commit; the results files list each cell's), the budget they were planned on.
Raises SystemExit when README.md lacks a region's markers or names a region not in ``REGIONS``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any, Callable, Sequence

from aoizora.extract.atomic_io import atomic_write

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "benchmarks" / "results"
GRID = RES / "grid_independent"
TRAINING = RES / "training_grid"
TARGET_ORDER = ("v5e-4", "v5e-8", "v5e-16", "v6e-8", "v5p-8", "v5p-16", "v5p-128")
MODEL_NAMES = {"wan2.1-1.3b": "Wan 2.1 1.3B", "wan2.1-14b": "Wan 2.1 14B",
               "hunyuanvideo-13b": "HunyuanVideo 13B", "opensora-stdit3-xl": "STDiT3-XL"}
TIE = 1e-4                # a speedup within 0.01% of 1 is a tie
REGION = re.compile(r"<!-- generated:([\w-]+) -->(.*?)<!-- /generated -->", re.S)

# the other result files: (file, what it holds, the command that writes it)
OTHER_RESULTS = (
    ("grid_independent.md", "every inference cell and row, each cell's commit",
     "python -m benchmarks.grid_independent_report"),
    ("training_grid.md", "every training cell and row, each cell's commit",
     "python -m benchmarks.training_grid --report"),
    ("compile_budget_repeat.md", "one cell planned twice with `--compiles 4`",
     "python -m benchmarks.compile_budget_repeat"),
    ("tuned_cells.md", "cells re-run with tuned experts and a compile budget",
     "python -m benchmarks.tuned_cells_report"),
    ("kernel_model_check.md", "Q2's splash forward model against axlearn's measured v5p forward",
     "python -m benchmarks.kernel_model_check"),
    ("plan_60s.md", "`aoizora plan --time-budget 60` against the grid's plan, cell by cell",
     "python -m benchmarks.plan_60s"),
    ("plan_wan2.1-1.3b_480p-81f_v5e-8.md", "the default `aoizora plan`",
     "python -m benchmarks.plan_default"),
    ("ilp_only.md", "cells planned with no seed layouts", "python -m benchmarks.ilp_only"),
    ("ilp_vs_expert.md", "the ILP's layout beside the best expert, term by term",
     "python -m benchmarks.ilp_vs_expert"),
    ("replan.md", "the seeded planner at a later commit against a grid's recorded plan",
     "python -m benchmarks.replan"),
    ("hint_invariance_v5e-16.md", "a joint text+video DiT with and without hints",
     "python -m benchmarks.hint_invariance"),
    ("refactor_invariance.md", "three cells planned before and after the planner's refactor",
     "python -m benchmarks.refactor_invariance"),
    ("tile_compare_wan2.1-1.3b_480p-81f_v5e-8.md", "one layout under three splash tile choices",
     "python -m benchmarks.tile_compare"),
    ("placement_solver.md", "placement CP-SAT against heuristics on v5e-16/64/256",
     "python -m benchmarks.placement_solver"),
    ("sharding_vs_heuristics.md", "the sharding ILP against heuristic searches (Q1)",
     "python -m benchmarks.sharding_vs_heuristics"),
    ("sharding_solvers.md", "HiGHS against CBC", "python -m benchmarks.sharding_solvers --force"),
    ("simulator_validation.md", "the independent simulator against measured public TPU figures",
     "python -m benchmarks.simulator_validation"),
    ("published_steps.md", "Q2 and the simulator against whole steps measured by their "
     "publishers", "python -m benchmarks.published_steps"),
    ("gpu_grid_torch.md", "diffusers' DiTs planned for GPU boxes against xDiT's configurations "
     "(Q2), one commit", "python -m benchmarks.gpu_grid_torch --report"),
    ("gpu_grid_jax.md", "the built-in Wan DiTs planned for GPU boxes from XLA:GPU evidence, 4 "
     "compiles a cell (Q2), one commit", "python -m benchmarks.gpu_grid_jax"),
    ("gpu_validation.md", "Q2 against published xDiT runs on GPUs",
     "python -m benchmarks.gpu_validation"),
    ("expert_compile.md", "the expert configurations compiled for v5e-8",
     "python -m benchmarks.expert_compile"),
    ("kv_overlap.md", "hiding context parallelism's key/value all-gathers",
     "python -m benchmarks.kv_overlap"),
    ("compiler_options.md", "libtpu options against the best expert's exposed communication",
     "python -m benchmarks.compiler_options"),
    ("evidence_timing.md", "trace, compile and parse times", "python -m benchmarks.evidence_timing"),
)


# -- the cells ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CellFigures:
    """One cell's figures, whichever grid it comes from (None: the cell has no such row)."""

    name: str
    target: str
    model: str
    best_expert: str
    vs_expert: float                 # best expert's step / the plan's, simulated
    vs_expert_q2: float | None       # the same by Q2, the planner's own price
    vs_alpa: float | None
    placement: float | None          # the plan's layout in make_mesh's order / the plan - 1
    never_slower: bool
    top1: bool | None
    commit: str
    budget_s: float
    planning_s: float
    compiled: int | None             # candidate layouts the planner compiled
    rho_placements: float | None = None   # Spearman, Q2 against the simulator, the plan's layout
    expert_compiled: bool | None = None   # the planner compiled the best expert's layout itself
    plan_layout: str = ""            # the plan's layout name (e.g. refined:expert:NAME, ilp#1)


def _rows(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r.get("name"): r for r in c.get("rows", [])}


def _ratio(rows, name: str, plan: str = "aoizora", key: str = "sim_step_s") -> float | None:
    r, p = rows.get(name) or {}, rows.get(plan) or {}
    return r[key] / p[key] if r.get(key) and p.get(key) else None


def inference_cell(c: dict[str, Any]) -> CellFigures:
    """A ``benchmarks.grid`` cell (independent pricing) as figures."""
    rows = _rows(c)
    place = _ratio(rows, "aoizora-layout/default-order")
    return CellFigures(
        name=c["cell"], target=c["target_arg"], model=c["model"],
        best_expert=c["best_expert"].removeprefix("expert:"),
        vs_expert=c["speedup_over_best_expert"],
        vs_expert_q2=_ratio(rows, c["best_expert"], key="q2_step_s"),
        vs_alpa=_ratio(rows, "alpa-logical"), placement=None if place is None else place - 1,
        never_slower=bool(c.get("never_slower")), top1=bool((c.get("fidelity") or {}).get("top1")),
        commit=(c.get("machine_start") or {}).get("git_commit", "?"),
        budget_s=float(c.get("budget_s") or 0), planning_s=float(c.get("planning_time_s") or 0),
        compiled=sum(1 for k in c.get("candidates", []) if k.get("compile_s")),
        rho_placements=(c.get("fidelity") or {}).get("rho_placements"),
        expert_compiled=any(k.get("layout") == c["best_expert"] and k.get("compile_s")
                            for k in c.get("candidates", [])))


def training_cell(c: dict[str, Any]) -> CellFigures:
    """A ``benchmarks.training_grid`` cell as figures."""
    rows = _rows(c)
    sp = c["speedup_over_best_expert_sim"]
    return CellFigures(
        name=c["cell"], target=c["target"], model=c["model"],
        best_expert=c["best_expert"].removeprefix("expert:"), vs_expert=sp,
        vs_expert_q2=(rows.get(c["best_expert"]) or {}).get("speedup_q2"),
        vs_alpa=(rows.get("alpa-logical") or {}).get("speedup_sim"),
        placement=c.get("placement_gain_sim"), never_slower=sp >= 1 - TIE, top1=None,
        commit=(c.get("git") or {}).get("git_commit", "?"),
        budget_s=float(c.get("budget_s") or 0),
        planning_s=float((c.get("plan") or {}).get("planning_time_s") or 0), compiled=None,
        plan_layout=(c.get("plan") or {}).get("layout_name") or "")


def load(directory: Path, as_figures: Callable[[dict[str, Any]], CellFigures]
         ) -> list[CellFigures]:
    """The cells of ``directory`` that hold a plan and a best expert, in file-name order."""
    out = []
    for p in sorted(Path(directory).glob("*.json")):
        c = json.loads(p.read_text())
        if not c.get("error") and c.get("best_expert") and _rows(c).get("aoizora"):
            out.append(as_figures(c))
    return out


# -- statistics -----------------------------------------------------------------------------------

def geomean(v: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in v) / len(v))


def ratio_text(v: Sequence[float | None], median: bool = True) -> str:
    """"g x / median m x (lo-hi x)" over the values that exist; "-" when none."""
    v = [x for x in v if x]
    if not v:
        return "-"
    if len(v) == 1:
        return f"{v[0]:.3f}x"
    med = f" / {statistics.median(v):.3f}x" if median else ""
    return f"{geomean(v):.3f}x{med} ({min(v):.3f}-{max(v):.3f}x)"


def placement_text(v: Sequence[float | None]) -> str:
    v = [x for x in v if x is not None]
    return "-" if not v else (f"{max(v) * 100:.1f}% ({sum(1 for x in v if x < 0.005)} of "
                              f"{len(v)} under 0.5%)")


def groups(cells: Sequence[CellFigures], by_model: bool = True
           ) -> list[tuple[str, list[CellFigures]]]:
    """(label, cells) per target, per model (if ``by_model``), then all cells."""
    by_t: dict[str, list] = collections.defaultdict(list)
    by_m: dict[str, list] = collections.defaultdict(list)
    for c in cells:
        by_t[c.target].append(c)
        by_m[c.model].append(c)
    rank = {t: i for i, t in enumerate(TARGET_ORDER)}
    out = [(t, by_t[t]) for t in sorted(by_t, key=lambda t: (rank.get(t, 99), t))]
    if by_model:
        rank = {m: i for i, m in enumerate(MODEL_NAMES)}
        out += [(MODEL_NAMES.get(m, m), by_m[m])
                for m in sorted(by_m, key=lambda m: (rank.get(m, 99), m))]
    return out + [("all cells", list(cells))]


def commits_text(cells: Sequence[CellFigures]) -> str:
    """"at 1 commit" or "at 7 commits (31 cells at one, 1 at each of the others)"."""
    n = collections.Counter(c.commit for c in cells)
    if len(n) == 1:
        return "at one commit"
    top = max(n.values())
    return (f"at {len(n)} commits ({top} cells at the most common; planned and priced by "
            f"different code)")


def budget_text(cells: Sequence[CellFigures]) -> str:
    budgets = sorted({c.budget_s for c in cells})
    over = [c for c in cells if c.planning_s > c.budget_s]
    comp = [c.compiled for c in cells if c.compiled is not None]
    text = (f"a wall-clock budget of {', '.join(f'{b:g}' for b in budgets)} s per cell on a shared "
            f"2-core machine, not a compile count")
    if comp:
        text += f" (its load decided how many layouts each cell compiled: {min(comp)}-{max(comp)})"
    if over:
        text += (f"; {len(over)} cell(s) ran past it "
                 f"({', '.join(f'{c.planning_s:.0f} s' for c in over)})")
    return text


def losing_cells(cells: Sequence[CellFigures]) -> list[CellFigures]:
    return sorted((c for c in cells if c.vs_expert < 1 - TIE), key=lambda c: c.vs_expert)


# -- the regions ----------------------------------------------------------------------------------

def _by_target(cells: Sequence[CellFigures]) -> str:
    return "; ".join(f"{t} {ratio_text([c.vs_expert for c in cs])}"
                     for t, cs in groups(cells, by_model=False)[:-1])


def intro(inf: Sequence[CellFigures], tr: Sequence[CellFigures]) -> str:
    """The intro's figures: the inference grid and the training grid, one sentence each."""
    lose = losing_cells(inf)
    return (f"{_tuned_intro()} The older grids compared with the experts as published. "
            f"The inference grid ({len(inf)} cells; simulated by the independent simulator, not "
            f"measured) gives {ratio_text([c.vs_expert for c in inf])} over the best expert "
            f"configuration as published per cell (geometric mean / median (worst-best cell)), "
            f"slower than it in {len(lose)} of {len(inf)} cells; "
            f"{ratio_text([c.vs_alpa for c in inf])} over Alpa-style search; at most "
            f"{max(c.placement or 0 for c in inf) * 100:.1f}% from placement alone over "
            f"`jax.make_mesh`'s order. Training steps (Wan 2.1 on v5p, {len(tr)} cells, "
            f"simulated) over the best expert as published: {_by_target(tr)}. Neither grid "
            f"has been re-run whole with tuned experts or at one commit (Limits).")


def _tuned_ratios(d: Path) -> list[float]:
    """The plan over the best tuned expert in the largest set of ``d``'s cells run at one commit
    (``benchmarks.tuned_cells_report``), or [] when that set has fewer than two cells."""
    from benchmarks.tuned_cells_report import by_commit, load, ratio

    cs = max(by_commit(load([d])).values(), key=len, default=[])
    xs = [x for x in (ratio(c, "best-tuned-expert") for c in cs) if x]
    return xs if len(xs) >= 2 else []


def _tuned_set(d: Path) -> tuple[str, list[dict]]:
    """The largest set of ``d``'s cells run at one commit (``benchmarks.tuned_cells_report``):
    (its short commit, its cells); ("", []) when that set has fewer than two cells."""
    from benchmarks.tuned_cells_report import by_commit, load

    groups = by_commit(load([d]))
    if not groups:
        return "", []
    commit, cs = max(groups.items(), key=lambda g: (len(g[1]), g[0]))
    return (commit, cs) if len(cs) >= 2 else ("", [])


def _tuned_headline(d: Path, what: str) -> str:
    """One sentence: the plan over the best tuned expert per target in the largest one-commit
    set of ``d``'s cells, then over all of them (worst cell, never slower), and what our solved
    placement adds to the best tuned expert; "" when there is no such set."""
    from benchmarks.tuned_cells_report import ratio

    _, cs = _tuned_set(d)
    if not cs:
        return ""
    per: dict[str, list[float]] = collections.defaultdict(list)
    for c in cs:
        per[c["cell"].rsplit("_", 1)[1]].append(ratio(c, "best-tuned-expert"))
    xs = [x for v in per.values() for x in v]
    solved = [ratio(c, "best-tuned-expert") / x for c in cs
              if (x := ratio(c, "best-tuned-expert/solved-placement"))]
    targets = "; ".join(f"{t} {ratio_text(v)}" + (f" ({len(v)} cells)" if len(v) > 1 else "")
                        for t, v in sorted(per.items(), key=lambda kv: _target_key(kv[0])))
    place = (f"; our solved placement moves the best tuned expert by at most "
             f"{max(abs(x - 1) for x in solved) * 100:.1f}%" if solved else "")
    return (f"{what}, {len(cs)} cells at one commit: per target {targets}; over all "
            f"{ratio_text(xs)}, never slower than it in {sum(x >= 0.9999 for x in xs)} of "
            f"{len(xs)}{place}")


def _target_key(t: str) -> tuple[str, int]:
    gen, _, n = t.partition("-")
    return gen, int(n) if n.isdigit() else 0


def _tuned_ratios(d: Path) -> list[float]:
    """The plan over the best tuned expert in the largest set of ``d``'s cells run at one
    commit, or [] when that set has fewer than two cells."""
    from benchmarks.tuned_cells_report import ratio

    return [x for x in (ratio(c, "best-tuned-expert") for c in _tuned_set(d)[1]) if x]


def _tuned_intro(dirs: Sequence[tuple[Path, str]] = ((RES / "grid_tuned", "Inference"),
                                                      (RES / "training_tuned", "Training"))
                 ) -> str:
    """The README's headline: per grid, the plan over the best tuned expert (experts tuned the
    way their users tune them, a compile budget; ``tuned_cells.md``), simulated."""
    parts = [h for d, what in dirs if (h := _tuned_headline(d, what))]
    if not parts:
        return ""
    return ("**Against experts tuned the way their users tune them** (remat, attention blocks "
            "sized to the shard, compiler options; a compile-count budget; geometric mean / "
            "median (worst-best cell) of the best tuned expert's step over the plan's, "
            "simulated by the independent simulator, `tuned_cells.md`): "
            + ". ".join(parts) + ".")


def _tuned_cell(d: Path) -> str:
    """``; X over the best tuned expert (N cells at one commit)`` for the paper table, or ""."""
    xs = _tuned_ratios(d)
    return (f"; {ratio_text(xs)} over the best tuned expert ({len(xs)} cells at one commit)"
            if xs else "")


def _table(cells: Sequence[CellFigures], by_model: bool, top1: bool) -> list[str]:
    head = ("| cells | n | vs best expert: geomean / median (worst-best) | vs Alpa-style | "
            "placement alone, largest | never slower" + (" | top-1 |" if top1 else " |"))
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for label, cs in groups(cells, by_model):
        n = len(cs)
        row = (f"| {label} | {n} | {ratio_text([c.vs_expert for c in cs])} | "
               f"{ratio_text([c.vs_alpa for c in cs], median=False)} | "
               f"{placement_text([c.placement for c in cs])} | "
               f"{sum(c.never_slower for c in cs)} of {n} |")
        lines.append(row + (f" {sum(bool(c.top1) for c in cs)} of {n} |" if top1 else ""))
    return lines


def _losers(cells: Sequence[CellFigures], what: str) -> str:
    lose = losing_cells(cells)
    if not lose:
        return f"The plan is no slower than the best expert in any {what} cell."
    experts = collections.Counter(c.best_expert for c in lose)
    text = (f"**Where the plan loses** ({len(lose)} of {len(cells)} {what} cells, best expert "
            f"{', '.join(f'{e} in {n}' for e, n in experts.most_common())}): "
            + ", ".join(f"{c.name} {c.vs_expert:.3f}x" for c in lose) + ".")
    priced = [c for c in lose if c.expert_compiled and c.vs_expert_q2]
    unpriced = [c for c in lose if c.expert_compiled is False]
    if priced:
        q2 = [c.vs_expert_q2 for c in priced]
        text += (f" Why: in {len(priced)} the planner compiled that expert's layout and Q2, the "
                 f"price it chooses by, put the plan ahead of it ({min(q2):.3f}-{max(q2):.3f}x): "
                 f"Q2 misses the gap the simulator prices.")
    if unpriced:
        text += (f" In {len(unpriced)} the budget ended before the planner compiled that "
                 f"expert's layout ({', '.join(str(c.compiled) for c in unpriced)} layout(s) "
                 f"compiled).")
    return text


def results(inf: Sequence[CellFigures], tr: Sequence[CellFigures]) -> str:
    """The README's results section: both grids, where the plan loses, the other results."""
    lines = [
        "", f"**Inference grid**: {len(inf)} cells (model x workload x target), seed 0, planned "
        f"on {budget_text(inf)}, {commits_text(inf)}. Every step is **simulated by the "
        "independent simulator** (`benchmarks/sim/`: its own compute, kernel, network and "
        "overlap models on each program's compiled HLO); no TPU ran. Speedup = baseline step / "
        "the plan's step. Baselines: the best expert configuration per cell **as published** "
        "(`aoizora/models/experts.py`, JAX's default order, not tuned); Alpa-style search (the "
        "sharding ILP with fixed alpha-beta costs); the plan's layout in `jax.make_mesh`'s order "
        "(placement alone). never slower: no baseline of the cell is faster (0.01% ties); "
        "top-1: the simulator's fastest (layout, placement) pair of the cell is the plan.", ""]
    lines += _table(inf, by_model=True, top1=True)
    lines += ["", _losers(inf, "inference"), "",
              f"**Training grid**: {len(tr)} cells (Wan 2.1, flow matching, AdamW, on v5p), "
              f"seed 0, planned on {budget_text(tr)}, {commits_text(tr)}. Simulated as above; "
              "experts as published with their authors' remat and attention blocks "
              "(`aoizora/models/training_experts.py`).", ""]
    lines += _table(tr, by_model=False, top1=False)
    lines += ["", _losers(tr, "training"), "",
              "Every cell, every row, each cell's commit: `benchmarks/results/grid_independent.md`, "
              "`benchmarks/results/training_grid.md`. Reproduce: `python -m benchmarks.grid --out "
              "benchmarks/results/grid_independent --compiles N`, `python -m "
              "benchmarks.training_grid --compiles N`, then `python -m benchmarks.update_readme`; "
              "with the grid's `--cache-dir DIR` a re-run compiles only what changed.",
              "", ilp_only_text(), "",
              "Other results in `benchmarks/results/` (each file states its machine, commit and "
              "how it ran): " + "; ".join(f"`{f}`: {what} (`{cmd}`)"
                                         for f, what, cmd in OTHER_RESULTS if (RES / f).exists())
              + "."]
    return "\n".join(lines) + "\n"


def _run_date(d: Path) -> str:
    """The newest date a run's cells recorded ("YYYY-MM-DD HH:MM UTC"; "" when none did)."""
    return max((json.loads(p.read_text()).get("machine", {}).get("date", "")
                for p in d.glob("*.json")), default="")


def _latest_run(directory: Path) -> tuple[Path, list[dict[str, Any]]] | None:
    """The subdirectory of ``directory`` whose cells ran last, and its cells' JSON; None when
    there is none."""
    runs = [p for p in Path(directory).glob("*") if p.is_dir() and any(p.glob("*.json"))]
    if not runs:
        return None
    d = max(runs, key=lambda p: (_run_date(p), p.name))
    return d, [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]


def ilp_only_text(directory: Path = RES / "ilp_only") -> str:
    """The latest run of ``benchmarks.ilp_only`` (the subdirectory whose cells ran last): the
    ILP's own layout (no seeds) against the best expert it was priced against (a grid run with
    tuned experts, the same run's experts with ``--experts``, else a committed grid); earlier
    runs are in ``ilp_only.md``."""
    runs = [p for p in Path(directory).glob("*") if p.is_dir() and any(p.glob("*.json"))]
    if not runs:
        return ""
    d = max(runs, key=lambda p: (_run_date(p), p.name))
    cs = [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]
    v = [c["speedup_over_best_expert"] for c in cs if c.get("speedup_over_best_expert")]
    tuned = [c["speedup_over_best_tuned_expert"] for c in cs
             if c.get("speedup_over_best_tuned_expert")]
    commits = sorted({c.get("git", {}).get("git_commit", "")[:7] for c in cs})
    compiles = sorted({str(c.get("compiles")) for c in cs})
    head = (f"**The ILP alone** (no seed layouts; latest run `{d.name}`, {len(cs)} cells, "
            f"{', '.join(compiles)} compiles a cell, {len(commits)} commit(s); every run in "
            "`ilp_only.md`): ")
    if tuned:
        return head + (f"{ratio_text(tuned)} (geometric mean / median, range) of the best tuned "
                       f"expert of a grid run with tuned experts, at least 0.98x in "
                       f"{sum(x >= 0.98 for x in tuned)} of {len(tuned)}, below 0.90x in "
                       f"{sum(x < 0.90 for x in tuned)} (simulated).") + seeded_text()
    if v:
        return head + (f"{ratio_text(v)} (geometric mean / median, range) of the best expert "
                       f"as published, at least 0.98x in {sum(x >= 0.98 for x in v)} of "
                       f"{len(v)} (simulated).")
    return ""


def seeded_text(directory: Path = RES / "seeded_plan") -> str:
    """The latest run of ``benchmarks.ilp_only --seeds`` (the experts as seeds, the same
    references), in one sentence; "" when there is none."""
    from benchmarks.seeded_vs_ilp import ilp_only_twin, plan_kind

    latest = _latest_run(directory)
    if latest is None:
        return ""
    d, cs = latest
    x = [c["speedup_over_best_tuned_expert"] for c in cs if c.get("speedup_over_best_tuned_expert")]
    if not x:
        return ""
    own = sum(plan_kind(c["plan"].get("layout_name", "")) == "ILP's own"
              for c in cs if c.get("speedup_over_best_tuned_expert"))
    commits = sorted({c.get("git", {}).get("git_commit", "") for c in cs})
    twins = sum(ilp_only_twin(c) is not None for c in cs if c.get("sim_step_s"))
    compiles = sorted({str(c.get("compiles")) for c in cs})
    return (f" With the experts as seeds (run `{d.name}`, {len(x)} cells, "
            f"{', '.join(compiles)} compiles a cell, {len(commits)} commit(s); {twins} of them "
            f"beside an ILP-alone run of the same code and budget; every run in "
            f"`seeded_plan.md`): {ratio_text(x)} of the same references, "
            f"never slower in {sum(v >= 1.0 for v in x)} of {len(x)}, the ILP's own layout in "
            f"{own} of {len(x)}.")


def paper(inf: Sequence[CellFigures], tr: Sequence[CellFigures]) -> str:
    """The comparison with the paper: its figures (quoted) against this repository's."""
    v5e8 = [c.placement or 0 for c in inf if c.target == "v5e-8"]
    worst = max(inf, key=lambda c: c.placement or 0)
    tw = max(tr, key=lambda c: c.placement or 0)
    return "\n".join([
        "", f"| | the paper (TPU v5e; training v5p) | this repository (simulated, {len(inf)} + "
        f"{len(tr)} cells, experts as published unless said) |", "|---|---|---|",
        f"| over expert configurations | 1.23x average | {ratio_text([c.vs_expert for c in inf])}"
        f" geometric mean / median over the best per cell; slower in "
        f"{len(losing_cells(inf))} of {len(inf)}{_tuned_cell(RES / 'grid_tuned')} |",
        f"| over Alpa | 1.32x average | {ratio_text([c.vs_alpa for c in inf], median=False)} "
        f"geometric mean over our Alpa-style ILP (fixed alpha-beta costs) |",
        f"| placement alone | up to 16.6% on v5e-8 | at most {(worst.placement or 0) * 100:.1f}% "
        f"({worst.target}), at most {max(v5e8, default=0) * 100:.1f}% on v5e-8 |",
        f"| training on v5p | 1.11x (4 chips), 1.21x (8 chips) | {_by_target(tr)} over the best "
        f"training expert as published{_tuned_cell(RES / 'training_tuned')}; placement alone "
        f"up to {(tw.placement or 0) * 100:.1f}% ({tw.target}) |", ""])


def limits(inf: Sequence[CellFigures], tr: Sequence[CellFigures]) -> str:
    """The limits that quote the grids."""
    rho = [c.rho_placements for c in inf if c.rho_placements is not None]
    low = [r for r in rho if r < 0.9]
    met = [(t, geomean([c.vs_expert for c in cs])) for t, cs in groups(inf, by_model=False)[:-1]]
    return "\n".join([
        "", "- **The grids' baselines are the experts as published**, not tuned the way their "
        "users tune them (remat, attention blocks sized to the shard, compiler options): a "
        "speedup mixes what the plan's layout adds with knobs any expert could turn. Tuned "
        "experts exist (`aoizora compare --tuned`, the grids' `--tuned-experts`); neither grid "
        "has been re-run with them. " + tuned_cells_text(),
        f"- **Neither grid is one run.** Inference: {len(inf)} cells {commits_text(inf)}, on "
        f"{budget_text(inf)}. Training: {len(tr)} cells {commits_text(tr)}. A compile-count "
        "budget (`--compiles N`) makes a cell's plan repeatable "
        "(`compile_budget_repeat.md`); the grids have not been re-run with it.",
        f"- **Training plans are experts' layouts**: {_expert_based(tr)} of {len(tr)} plans are "
        f"an expert's layout refined or retimed (its remat and attention blocks changed); "
        f"planning took {min(c.planning_s for c in tr):.0f}-{max(c.planning_s for c in tr):.0f} "
        f"s of {budget_text(tr).split(' per cell')[0].removeprefix('a wall-clock budget of ')}, "
        f"the ILP's own layouts won no cell.",
        "- **The speedup target of 1.10x over the best expert** (inference, geometric mean): "
        + ", ".join(f"{t} {g:.3f}x ({'met' if g >= 1.10 else 'missed'})" for t, g in met) + ".",
        f"- **Q2 and the simulator rank close placements differently**: Spearman's rho over the "
        f"plan layout's placements is under 0.9 in {len(low)} of {len(rho)} inference cells "
        f"(min {min(rho, default=float('nan')):.3f}); the simulator's fastest pair is the plan "
        f"in {sum(bool(c.top1) for c in inf)} of {len(inf)}."])


def tuned_cells_text(dirs: Sequence[Path] = (RES / "grid_tuned", RES / "training_tuned")) -> str:
    """The cells re-run with tuned experts (``benchmarks.tuned_cells_report``): the plan against
    the best tuned expert and the best expert as published (simulated), summed up per commit
    where one commit ran several cells, else per cell."""
    from benchmarks.tuned_cells_report import by_commit, load, ratio

    groups = {k: [c for c in cs if ratio(c, "published")]
              for k, cs in by_commit(load(dirs)).items()}
    groups = {k: cs for k, cs in groups.items() if cs}
    if not groups:
        return "No cell has been re-run with them."
    parts = []
    for _commit, cs in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        t = [ratio(c, "best-tuned-expert") for c in cs]
        pub = [ratio(c, "published") for c in cs]
        if len(cs) == 1:
            parts.append(f"{cs[0]['cell']}: the plan {t[0]:.3f}x over the best tuned expert, "
                         f"{pub[0]:.3f}x over the best as published")
            continue
        parts.append(f"{len(cs)} cells at one commit ({', '.join(c['cell'] for c in cs)}): the "
                     f"plan {geomean(t):.3f}x / {statistics.median(t):.3f}x ({min(t):.3f}-"
                     f"{max(t):.3f}x) over the best tuned expert (geometric mean / median "
                     f"(range)), never slower than it in {sum(x >= 0.9999 for x in t)} of "
                     f"{len(t)}; {geomean(pub):.3f}x over the best as published")
    n = sum(len(cs) for cs in groups.values())
    return (f"Re-run with them and a compile budget, {n} cell(s) only "
            f"(`tuned_cells.md`, simulated): " + "; ".join(parts) + ".")


def _expert_based(cells: Sequence[CellFigures]) -> int:
    return sum(1 for c in cells if "expert:" in c.plan_layout)


def published_steps_text(_inf: Sequence[CellFigures] = (), _tr: Sequence[CellFigures] = (),
                         path: Path = RES / "published_steps.json") -> str:
    """The whole-step check against maxdiffusion's published v6e runs, at the config's v6e blocks
    (block_q 3024): how far each model is over the measured bounds, and the pair's difference."""
    doc = json.loads(path.read_text())
    rows = {c["name"]: c for c in doc["cases"] if c.get("tiles", {}).get("block_q") == 3024}
    over = {m: [rows[n][m]["step_s"] / rows[n]["step_bound_s"] - 1 for n in rows]
            for m in ("sim", "q2")}
    a, b = next([a, b] for a, b in doc["pairs"] if a in rows and b in rows)

    def diff(m):
        return (rows[a][m]["step_s"] - rows[b][m]["step_s"]) * 1e3

    meas = (rows[a]["step_bound_s"] - rows[b]["step_bound_s"]) * 1e3
    pct = lambda v: f"{min(v) * 100:.1f}-{max(v) * 100:.1f}%"    # noqa: E731
    text = (f"the simulator is {pct(over['sim'])} over them, Q2 {pct(over['q2'])} over; "
            f"measured Ulysses - flash {meas:+,.0f} ms/step, simulator {diff('sim'):+,.0f}, Q2 "
            f"{diff('q2'):+,.0f}")
    return text + "".join(_measured_step_text(c) for c in doc["cases"]
                          if c.get("denoise_only") and "q2" in c and "sim" in c)


def _measured_step_text(c: dict[str, Any]) -> str:
    """One measured denoising step of a published recipe against both models."""
    err = {m: (c[m]["step_s"] / c["step_bound_s"] - 1) * 100 for m in ("sim", "q2")}
    return (f"; a measured step on {c['target']} ({c['name'].split(',')[0]}, rebuilt as our "
            f"`{c['expert']}` expert with jax's splash kernel): {c['step_bound_s'] * 1e3:,.0f} "
            f"ms, simulator {err['sim']:+.0f}%, Q2 {err['q2']:+.0f}%")


def gpu_validation_text(_inf: Sequence[CellFigures] = (), _tr: Sequence[CellFigures] = (),
                        path: Path = RES / "gpu_validation.json") -> str:
    """Q2's median error against published xDiT runs (same GPU and model), whole runs (the
    denoising steps and the VAE decode priced, against the publisher's run time)."""
    err, n = json.loads(path.read_text())["table"]["median_abs_error"]["headline"]
    return f"Against {n} published xDiT whole runs Q2 is {err * 100:.0f}% off (median"


def simulator_validation_text(_inf: Sequence[CellFigures] = (), _tr: Sequence[CellFigures] = (),
                              path: Path = RES / "simulator_validation.json") -> str:
    """The simulator's median and worst error on the measured public TPU rows it was not fitted
    to (``benchmarks.simulator_validation``)."""
    s = json.loads(path.read_text())["summary"]
    return (f"its median error is {s['median_abs_error_pct']:.1f}% on {s['independent_rows']} "
            f"measured public TPU figures it was not fitted to, worst {s['worst_error_pct']:+.1f}%")


def plan_60s_text(_inf: Sequence[CellFigures] = (), _tr: Sequence[CellFigures] = (),
                  directory: Path = RES / "plan_60s") -> str:
    """The 60 s plans against the grid's plans (``benchmarks.plan_60s``): in how many cells the
    60 s plan is within 1% (simulated) of the grid's."""
    cells = [json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))
             if not p.name.endswith(".plan.json")]
    ok = [c for c in cells if c.get("compare")]
    if not ok:
        return "no cell has been checked yet"
    within = sum(c["compare"]["within_1pct"] for c in ok)
    worst = max(c["compare"]["sim_over_reference"] for c in ok)
    budgets = sorted({c["reference"]["budget"] for c in ok})
    return (f"on {len(ok)} grid cells the 60 s plan is within 1% (simulated) of the grid's "
            f"{' / '.join(budgets)} plan in {within}, worst {worst:.3f}x (`plan_60s.md`)")


REGIONS: dict[str, Callable[[Sequence[CellFigures], Sequence[CellFigures]], str]] = {
    "intro": intro, "results": results, "paper": paper, "limits": limits,
    "published": published_steps_text, "gpuval": gpu_validation_text,
    "simval": simulator_validation_text, "plan60": plan_60s_text}


def regions(grid: Path = GRID, training: Path = TRAINING) -> dict[str, str]:
    """Each region's text, from the committed results."""
    inf, tr = load(grid, inference_cell), load(training, training_cell)
    if not inf or not tr:
        raise SystemExit(f"no cells in {grid if not inf else training}: run the grid first")
    return {name: fn(inf, tr) for name, fn in REGIONS.items()}


def splice(text: str, texts: dict[str, str]) -> str:
    """``text`` with every generated region's content replaced by ``texts[name]``; SystemExit
    when a region is unknown or one of ``texts`` has no region."""
    found = [m.group(1) for m in REGION.finditer(text)]
    unknown, missing = set(found) - set(texts), set(texts) - set(found)
    if unknown or missing:
        raise SystemExit(f"README.md's generated regions: unknown {sorted(unknown)}, missing "
                         f"{sorted(missing)} (markers: <!-- generated:NAME -->...<!-- /generated -->)")
    return REGION.sub(lambda m: f"<!-- generated:{m.group(1)} -->{texts[m.group(1)]}"
                                f"<!-- /generated -->", text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if README.md's generated regions are not what the results give")
    args = ap.parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = splice(text, regions())
    if args.check:
        if new != text:
            print("README.md's generated regions are out of date: "
                  "run python -m benchmarks.update_readme")
            return 1
        print("README.md's generated regions are up to date")
        return 0
    atomic_write(readme, new)
    print("README.md's generated regions regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
