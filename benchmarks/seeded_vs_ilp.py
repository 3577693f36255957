"""The planner with the experts as seeds against the same planner without them, at one commit.

    python -m benchmarks.ilp_only --seeds --cells ... --compiles 4 --reference-dir DIR --tag T
    python -m benchmarks.seeded_vs_ilp        # the table, from the JSON written so far

Each ``benchmarks/results/seeded_plan/<tag>/<cell>.json`` is one cell planned by ``aoizora.plan``
with the experts' layouts as seeds (``benchmarks.ilp_only --seeds``: the grid's planner call,
priced like the ILP-only runs, against the same reference: the best tuned expert of a grid run).
Beside it, the cell's ILP-only run (``benchmarks/results/ilp_only/<tag>/``) at the same compile
budget and the same code -- the same commit, or one whose planner, solvers, extractors and
simulator (``CODE_PATHS``) ``git diff`` finds identical -- when there is one: the two arms then
differ only in the seeds.

Per cell: what the seeded plan is (``kind``: the ILP's own layout, a refined expert -- an
expert's attention kept, the ILP's other splits -- or an expert's own), its simulated step, its
speedup over the best tuned expert, and the ILP-only arm's. Every latency is simulated by the
AoiZora reference simulator on the compiled XLA:TPU program; nothing ran on a TPU.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from aoizora.extract.atomic_io import atomic_write
from benchmarks.ilp_only import RESULTS as ILP_ONLY, SEEDED

REPORT = SEEDED.parent / "seeded_plan.md"
CODE_PATHS = ("aoizora", "formulation", "solvers", "extract", "benchmarks/sim",
              "benchmarks/simulator.py")


def plan_kind(layout_name: str) -> str:
    """"ILP's own", "refined expert", "expert" or "retimed expert" from a plan's layout name."""
    if layout_name.startswith("refined:"):
        return "refined expert"
    if layout_name.startswith("retimed:"):
        return "retimed expert"
    if layout_name.startswith("expert:"):
        return "expert"
    return "ILP's own"


def _commit(d: dict[str, Any]) -> str:
    return (d.get("git") or {}).get("git_commit", "")


def same_code(a: str, b: str) -> bool:
    """Whether commits ``a`` and ``b`` hold the same ``CODE_PATHS`` (``git diff`` finds none)."""
    if not a or not b:
        return False
    if a == b:
        return True
    r = subprocess.run(["git", "diff", "--quiet", a, b, "--", *CODE_PATHS],
                       cwd=Path(__file__).resolve().parent.parent, capture_output=True)
    return r.returncode == 0


def ilp_only_twin(d: dict[str, Any]) -> dict[str, Any] | None:
    """The latest ILP-only run of ``d``'s cell at ``d``'s compile budget and code
    (``same_code``), if any."""
    got = []
    for f in sorted(ILP_ONLY.glob(f"*/{d['cell']}.json")):
        o = json.loads(f.read_text())
        if o.get("compiles") == d.get("compiles") and o.get("sim_step_s") \
                and same_code(_commit(o), _commit(d)):
            got.append(((o.get("machine") or {}).get("date", ""), o))
    return max(got, key=lambda t: t[0])[1] if got else None


def rows(tag: str) -> list[dict[str, Any]]:
    """One row per cell of the seeded run ``tag``."""
    out = []
    for f in sorted((SEEDED / tag).glob("*.json")):
        d = json.loads(f.read_text())
        if not d.get("sim_step_s"):
            out.append({"cell": d["cell"], "error": d.get("error", "not priced")})
            continue
        twin = ilp_only_twin(d)
        out.append({"cell": d["cell"], "commit": _commit(d)[:12],
                    "mesh": "x".join(str(v) for v in d["plan"]["mesh"].values()),
                    "kind": plan_kind(d["plan"].get("layout_name", "")),
                    "layout": d["plan"].get("layout_name", ""),
                    "sim_ms": d["sim_step_s"] * 1e3,
                    "x_tuned": d.get("speedup_over_best_tuned_expert"),
                    "ilp_only_sim_ms": twin["sim_step_s"] * 1e3 if twin else None,
                    "ilp_only_commit": _commit(twin)[:12] if twin else "",
                    "ilp_only_x_tuned": twin.get("speedup_over_best_tuned_expert") if twin
                    else None})
    return out


def markdown(tag: str, rs: list[dict[str, Any]]) -> str:
    ok = [r for r in rs if "error" not in r]
    commits = sorted({r["commit"] for r in ok})
    xs = [r["x_tuned"] for r in ok if r["x_tuned"]]
    own = sum(r["kind"] == "ILP's own" for r in ok)
    L = [f"## `{tag}` (commit {', '.join(commits) or '-'})", ""]
    if xs:
        L += [f"{len(ok)} cells: over the best tuned expert (simulated) geometric mean "
              f"{statistics.geometric_mean(xs):.3f}x, median {statistics.median(xs):.3f}x, "
              f"range {min(xs):.3f}-{max(xs):.3f}x; never slower than it in "
              f"**{sum(x >= 1.0 for x in xs)} of {len(xs)}**; the plan is the ILP's own layout "
              f"in **{own} of {len(ok)}**.", ""]
    L += ["| cell | mesh | plan (kind: layout) | seeded sim (ms) | x best tuned expert | "
          "ILP only, same code: commit | sim (ms) | x best tuned expert |",
          "|---|---|---|---|---|---|---|---|"]
    f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    f2 = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in rs:
        if "error" in r:
            L.append(f"| {r['cell']} | - | {r['error']} | | | | | |")
            continue
        L.append(f"| {r['cell']} | {r['mesh']} | {r['kind']}: {r['layout']} | {f2(r['sim_ms'])} | "
                 f"{f3(r['x_tuned'])} | {r['ilp_only_commit'] or '-'} | "
                 f"{f2(r['ilp_only_sim_ms'])} | {f3(r['ilp_only_x_tuned'])} |")
    return "\n".join(L) + "\n"


def main() -> int:
    tags = sorted(p.name for p in SEEDED.iterdir() if p.is_dir()) if SEEDED.exists() else []
    head = ("# The planner with the experts as seeds, against the same planner without them\n\n"
            + __doc__.split("\n\n", 2)[2].split("\n\n")[0].replace("\n", " ") + "\n\n")
    atomic_write(REPORT, head + "\n".join(markdown(t, rows(t)) for t in tags))
    print(REPORT.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
