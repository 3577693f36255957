"""Regenerate README.md's benchmark section from the committed results in benchmarks/results/.

    python -m benchmarks.update_readme

Everything between the README's `<!-- benchmarks-start -->` and `<!-- benchmarks-end -->` markers
is replaced. Each block names the script that produced it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "benchmarks" / "results"
START, END = "<!-- benchmarks-start -->", "<!-- benchmarks-end -->"


def _tables(md: str) -> str:
    """The markdown tables of a results file (lines starting with '|')."""
    return "\n".join(l for l in md.splitlines() if l.startswith("|"))


def _first(md: str, prefix: str) -> list[str]:
    return [l for l in md.splitlines() if l.startswith(prefix)]


def _section(heading: str):
    """The part of a result file under `heading`, with its links made relative to the README."""
    def part(md: str) -> str:
        text = md.split(heading, 1)[-1].split("\n## ", 1)[0].strip() if heading in md else ""
        return text.replace("](", "](benchmarks/results/").replace(
            "](benchmarks/results/benchmarks/results/", "](benchmarks/results/")
    return part


def _tables_and_bullets(md: str) -> str:
    return f"{_tables(md)}\n\n" + "\n".join(_first(md, "- "))


def section() -> str:
    out = []
    grid = RES / "grid_readme.md"
    if grid.exists():
        out.append(grid.read_text().strip())
    plan = sorted(RES.glob("plan_*.md")) + sorted(RES.glob("ilp_only_*.md"))
    for p in plan:
        md = p.read_text()
        lines = md.splitlines()
        title = lines[0].lstrip("# ").strip()
        body = md.split("```")[1].strip() if "```" in md else ""
        gains = md.split("## What the feedback changed", 1)[-1].strip() if "## What the feedback" in md else ""
        out.append(f"### {title}\n\n{lines[2] if len(lines) > 2 else ''} {lines[3] if len(lines) > 3 else ''}\n\n"
                   f"```\n{body}\n```\n\nWhat the feedback changed:\n\n{gains}\n\n"
                   f"Reproduce: `python -m benchmarks.plan_default"
                   f"{' --no-seeds' if p.name.startswith('ilp_only') else ''}` "
                   f"(file `{p.relative_to(ROOT)}`).")
    # what of each result file goes into the README: a named section of a long file (the file
    # has every table), else its tables and bullets
    results = [
        ("placement_solver.md", _section("## Targets (issue 5)"),
         "Placement: CP-SAT against heuristics on real Wan 2.1 evidence (v5e-16, v5e-64, v5e-256)",
         "python -m benchmarks.placement_solver"),
        ("sharding_vs_heuristics.md", _section("## Summary"), "Sharding ILP against heuristics",
         "python -m benchmarks.sharding_vs_heuristics"),
        ("sharding_ilp.md", _tables_and_bullets, "Sharding ILP: CBC and HiGHS",
         "python -m benchmarks.sharding_ilp"),
        ("sharding_solvers.md", _tables_and_bullets,
         "Sharding ILP: CBC against HiGHS at the planner's per-mesh limit (Wan 2.1 14B and 1.3B)",
         "python -m benchmarks.sharding_solvers --force"),
        ("simulator_validation.md", _tables_and_bullets,
         "Reference simulator against public measured TPU figures", "python -m benchmarks.simulator_validation"),
        ("expert_compile.md", _tables_and_bullets,
         "Expert configurations of the full-size models compiled for v5e-8",
         "python -m benchmarks.expert_compile"),
        ("kv_overlap.md", _tables_and_bullets,
         "Hiding the key/value all-gathers of context parallelism (Wan 2.1 14B sizes, v5e-16)",
         "python -m benchmarks.kv_overlap"),
        ("compiler_options.md", _tables_and_bullets,
         "libtpu options against the best expert's exposed communication (Wan 2.1 14B)",
         "python -m benchmarks.compiler_options"),
        ("evidence_timing.md", _tables_and_bullets, "Trace, compile and parse times",
         "python -m benchmarks.evidence_timing"),
    ]
    for fname, extract, title, cmd in results:
        f = RES / fname
        if not f.exists():
            continue
        md = f.read_text()
        machine = next((l for l in md.splitlines() if l.lower().startswith("machine")), "")
        out.append(f"### {title}\n\n{machine}\n\n{extract(md)}\n\n"
                   f"Reproduce: `{cmd}` (full results: `benchmarks/results/{fname}`).")
    return "\n\n".join(out)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        raise SystemExit("README.md lacks the benchmark markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{section()}\n{END}{tail}")
    print("README.md benchmark section regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
