"""The package's import graph: a subpackage does not pull in the planner, ``aoizora.plan`` and
the other public names still resolve, and the solvers import without cycles."""

import ast
import pathlib
import subprocess
import sys

import aoizora


def _run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_subpackage_does_not_import_the_planner():
    out = _run("import sys, aoizora.extract.targets\n"
               "print(sorted(m for m in sys.modules if m.startswith('aoizora.plan')))")
    assert out == "[]"


def test_the_public_names_resolve_on_first_use():
    out = _run("import aoizora, aoizora.planner as p, aoizora.plans as s\n"
               "print(aoizora.plan is p.plan, aoizora.BudgetError is p.BudgetError,"
               " aoizora.load_plan is s.load_plan, issubclass(aoizora.BudgetError,"
               " aoizora.PlanningError))")
    assert out == "True True True True"


def _import_graph():
    """Module -> (modules it imports at top level, modules it imports inside functions), over
    the package's four layers and their subpackages."""
    root = pathlib.Path(aoizora.__file__).resolve().parents[1]
    layers = {"aoizora": "aoizora", "extract": "aoizora.extract",
              "formulation": "aoizora.formulation", "solvers": "aoizora.solvers"}
    files = {}
    for d, pkg in layers.items():
        for p in (root / d).rglob("*.py"):
            parts = [x for x in p.relative_to(root / d).with_suffix("").parts if x != "__init__"]
            if d == "aoizora" and parts and parts[0] in layers:
                continue
            files[".".join([pkg, *parts])] = p
    graph = {}
    for name, p in files.items():
        tree = ast.parse(p.read_text())
        top, inner = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            hit = {t for t in targets if t in files and t != name}
            (top if node in tree.body else inner).update(hit)
        graph[name] = (top, inner)
    return graph


def _reaches(graph, a, b):
    todo, seen = [a], set()
    while todo:
        u = todo.pop()
        if u == b:
            return True
        if u not in seen:
            seen.add(u)
            todo += graph[u][0]
    return False


def test_no_import_cycle_and_none_hidden_in_a_function():
    """No cycle among top-level imports; in the planner's and the sharding solvers' modules no
    function-local import closes one."""
    graph = _import_graph()
    for name, (top, _) in graph.items():
        for dep in top:
            assert not _reaches(graph, dep, name), f"{name} -> {dep} closes an import cycle"
    mine = [n for n in graph if "placement" not in n]
    for name in mine:
        for dep in graph[name][1]:
            assert not _reaches(graph, dep, name), f"{name} imports {dep} inside a function"
