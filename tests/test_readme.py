"""The README stays short and current, and no docstring names a commit.

- README.md has at most ``MAX_README_LINES`` lines;
- neither README.md nor any module, class or function docstring of the package (aoizora/,
  extract/, formulation/, solvers/) holds a commit hash: a 7-40 character hex token that is a
  prefix of a commit in ``git rev-list --all`` (skipped where git or the history is missing);
- every generated region of the README is what ``benchmarks.update_readme`` writes from the
  committed results, and a changed result changes it;
- the README holds the CI recipe of ``.ci/run`` verbatim.
"""

from __future__ import annotations

import ast
import bisect
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PACKAGE_DIRS = ("aoizora", "extract", "formulation", "solvers")
MAX_README_LINES = 300
HEX = re.compile(r"\b[0-9a-fA-F]{7,40}\b")


def commit_hashes(text: str, commits: list[str]) -> list[str]:
    """The hex tokens of ``text`` (7-40 characters) that begin a commit of ``commits`` (sorted)."""
    found = []
    for tok in HEX.findall(text):
        t = tok.lower()
        i = bisect.bisect_left(commits, t)
        if i < len(commits) and commits[i].startswith(t):
            found.append(tok)
    return found


def docstrings(path: Path):
    """(where, docstring) of the module and of every class and function in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}", doc


@pytest.fixture(scope="module")
def commits() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    out = subprocess.run(["git", "rev-list", "--all"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip("no git history here")
    return sorted(out.stdout.split())


def test_readme_at_most_300_lines():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines; keep it to {MAX_README_LINES}"


def test_commit_hashes_are_found():
    commits = sorted(["abc1234" + "a" * 33, "fedcba9" + "b" * 33])
    text = "at abc1234, not deadbee; FEDCBA9 and fedcba9bbbb; abc123 is too short"
    assert commit_hashes(text, commits) == ["abc1234", "FEDCBA9", "fedcba9bbbb"]


def test_no_commit_hash_in_readme(commits):
    assert commit_hashes(README.read_text(), commits) == []


def test_no_commit_hash_in_package_docstrings(commits):
    bad = [(where, h) for d in PACKAGE_DIRS for p in sorted((ROOT / d).rglob("*.py"))
           for where, doc in docstrings(p) for h in commit_hashes(doc, commits)]
    assert bad == [], f"docstrings name commits (state the contract, not the run): {bad[:10]}"


def test_readme_figures_are_generated_from_the_results():
    from benchmarks import update_readme

    text = README.read_text()
    assert update_readme.splice(text, update_readme.regions()) == text, (
        "README.md's generated regions are out of date: run python -m benchmarks.update_readme")


def test_a_changed_result_changes_the_readme(tmp_path):
    """One cell's simulated step moved by 1%: the regions no longer match README.md."""
    import json
    import shutil

    from benchmarks import update_readme

    grid, training = tmp_path / "grid", tmp_path / "training"
    shutil.copytree(update_readme.GRID, grid)
    shutil.copytree(update_readme.TRAINING, training)
    text = README.read_text()
    assert update_readme.splice(text, update_readme.regions(grid, training)) == text
    cell = sorted(grid.glob("*.json"))[0]
    d = json.loads(cell.read_text())
    d["speedup_over_best_expert"] *= 1.01
    cell.write_text(json.dumps(d))
    assert update_readme.splice(text, update_readme.regions(grid, training)) != text


def test_every_region_is_known_and_present():
    from benchmarks.update_readme import splice

    text = "a <!-- generated:x -->old<!-- /generated --> b"
    assert splice(text, {"x": "new"}) == "a <!-- generated:x -->new<!-- /generated --> b"
    with pytest.raises(SystemExit, match="missing \\['y'\\]"):
        splice(text, {"x": "new", "y": ""})
    with pytest.raises(SystemExit, match="unknown \\['x'\\]"):
        splice(text, {})


def test_readme_holds_the_ci_recipe_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    recipe = [l for l in ci[ci.index(next(l for l in ci if "CI recipe, verbatim" in l)) + 1:]
              if l.startswith(("aoizora ", "    --"))]
    assert len(recipe) >= 4
    text = README.read_text()
    for line in recipe:
        assert line in text.splitlines(), f"README.md lacks the CI line {line!r}"
