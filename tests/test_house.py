"""The shape of the house (issues #33, #47): functions that fit on a screen, layers that import one
way, rooms that import only along the arrows ``docs/architecture.md`` allows, no import cycles
among the solvers, no private names imported across modules, and a light ``aoizora.extract`` that
does not pull in the planner. Static checks over the source (ast)."""

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"aoizora": "aoizora", "extract": "aoizora.extract",
            "formulation": "aoizora.formulation", "solvers": "aoizora.solvers"}
LAYER = {"aoizora.extract": 0, "aoizora.formulation": 1, "aoizora.solvers": 2, "aoizora": 3}
MAX_LINES, MAX_PARAMS = 120, 10
PUBLIC_EXCEPTIONS = {("aoizora/planner.py", "plan"),      # the public plan() takes every option
                     ("aoizora/compare.py", "compare"),    # compare() the planner's, passed on
                     ("aoizora/planning/torch_planner.py", "plan_torch")}  # and plan_torch()


def _modules():
    """(relative path, dotted module name, ast) of every module of the distribution."""
    out = []
    for folder, pkg in PACKAGES.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            name = ".".join([pkg, *parts]) if parts else pkg
            if folder == "aoizora" and parts and parts[0] in ("extract", "formulation", "solvers"):
                continue
            out.append((str(p.relative_to(ROOT)), name, ast.parse(p.read_text())))
    return out


MODULES = _modules()


def _n_params(f) -> int:
    a = f.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return n - (1 if a.args and a.args[0].arg in ("self", "cls") else 0)


def test_functions_fit_on_a_screen():
    bad = []
    for path, _, tree in MODULES:
        for f in ast.walk(tree):
            if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = f.end_lineno - f.lineno + 1
            if (path, f.name) in PUBLIC_EXCEPTIONS:
                continue
            if lines > MAX_LINES or _n_params(f) > MAX_PARAMS:
                bad.append(f"{path}:{f.lineno} {f.name}: {lines} lines, {_n_params(f)} parameters")
    assert not bad, "\n".join(bad)


def _imports(name: str, tree) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) for every import of the package in `tree`,
    function-local ones included."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("aoizora"):
            out.append((n.module, [a.name for a in n.names], n.lineno))
        elif isinstance(n, ast.Import):
            out += [(a.name, [], n.lineno) for a in n.names if a.name.startswith("aoizora")]
    return out


def _layer(module: str) -> int:
    for pkg in ("aoizora.extract", "aoizora.formulation", "aoizora.solvers"):
        if module == pkg or module.startswith(pkg + "."):
            return LAYER[pkg]
    return LAYER["aoizora"]


def test_layers_import_one_way():
    bad = [f"{name} (layer {_layer(name)}) imports {mod} (layer {_layer(mod)}) at line {line}"
           for _, name, tree in MODULES for mod, _, line in _imports(name, tree)
           if _layer(mod) > _layer(name)]
    assert not bad, "\n".join(bad)


def _rooms() -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """(room -> its module patterns, room -> the rooms it may import), read from the table under
    "## Allowed arrows" in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Allowed arrows", 1)[1]
    patterns, allowed = {}, {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or cells[0] in ("Room", "---"):
            continue
        room, mods, may = cells
        patterns[room] = re.findall(r"`([\w.*]+)`", mods)
        allowed[room] = set() if may == "nothing" else {r.strip() for r in may.split(",")}
    return patterns, allowed


ROOM_PATTERNS, ROOM_ARROWS = _rooms()


def _room(module: str) -> str | None:
    """The room of a module: the room listing its exact name, else the longest package prefix."""
    best, length = None, -1
    for room, pats in ROOM_PATTERNS.items():
        for pat in pats:
            if pat == module:
                return room
            base = pat[:-2] if pat.endswith(".*") else None
            if base and (module == base or module.startswith(base + ".")) and len(base) > length:
                best, length = room, len(base)
    return best


def test_the_room_table_is_whole():
    rooms = set(ROOM_PATTERNS)
    assert {"extract", "frontends.jax", "planning", "kernels", "runtime", "models", "api"} <= rooms
    unknown = {f"{r} -> {t}" for r, ts in ROOM_ARROWS.items() for t in ts if t not in rooms}
    assert not unknown, f"arrows to rooms the table does not define: {sorted(unknown)}"
    homeless = [name for _, name, _ in MODULES if _room(name) is None]
    assert not homeless, f"modules in no room of docs/architecture.md: {homeless}"


def test_the_room_arrows_have_no_cycle():
    seen, stack = set(), []

    def visit(r):
        assert r not in stack, "rooms import in a circle: " + " -> ".join(stack[stack.index(r):] + [r])
        if r not in seen:
            seen.add(r)
            stack.append(r)
            for t in sorted(ROOM_ARROWS[r]):
                visit(t)
            stack.pop()

    for r in sorted(ROOM_ARROWS):
        visit(r)


def test_rooms_import_only_along_allowed_arrows():
    known = {name for _, name, _ in MODULES}
    bad = []
    for path, name, tree in MODULES:
        here = _room(name)
        for mod, names, line in _imports(name, tree):
            # `from aoizora import builtin` imports the module aoizora.builtin, not the package
            for target in [f"{mod}.{n}" if f"{mod}.{n}" in known else mod for n in names] or [mod]:
                there = _room(target)
                if there != here and there not in ROOM_ARROWS[here]:
                    bad.append(f"{path}:{line} {name} ({here}) imports {target} ({there}): "
                               f"not an arrow of docs/architecture.md")
    assert not bad, "\n".join(bad)


def test_a_module_outside_the_allowed_arrows_is_caught():
    """The check can fail: a kernel importing the planner's loop is not an allowed arrow."""
    assert _room("aoizora.kernels.tiles") == "kernels"
    assert _room("aoizora.planning.loop") == "planning"
    assert "planning" not in ROOM_ARROWS["kernels"]
    assert _room("aoizora.extract.frontends.jax.ir_builder") == "frontends.jax"
    assert _room("aoizora.extract.program_ir") == "extract"
    assert "frontends.jax" not in ROOM_ARROWS["formulation"]


def test_no_private_names_across_modules():
    bad = [f"{name}:{line} imports {n} from {mod}" for _, name, tree in MODULES
           for mod, names, line in _imports(name, tree) for n in names
           if n.startswith("_") and not n.startswith("__") and mod != name]
    assert not bad, "\n".join(bad)


def test_no_import_cycles_among_solvers():
    mods = {name: tree for _, name, tree in MODULES if name.startswith("aoizora.solvers.")}
    graph = {m: {i for i, _, _ in _imports(m, t) if i in mods and i != m} for m, t in mods.items()}
    seen, stack, cycles = set(), [], []

    def visit(m):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_extract_does_not_import_the_planner():
    code = ("import sys, aoizora.extract.targets; "
            "print(any(m in sys.modules for m in ('aoizora.planner', 'aoizora.solvers.sharding')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_readme_makes_no_placement_claim_it_cannot_show():
    assert "about 17%" not in (ROOT / "README.md").read_text()


DATE = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")


def _docs_and_comments(path: str, tree) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of one module."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(
        io.StringIO((ROOT / path).read_text()).readline) if t.type == tokenize.COMMENT]
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(n, clean=False)
            if doc:
                out.append((n.body[0].lineno, doc))
    return out


def test_no_dated_run_logs_in_the_package():
    """Docstrings state contracts; dated runs go to benchmarks/results/lab_notes.md (#47)."""
    bad = [f"{path}:{line}: {DATE.search(text).group()}" for path, _, tree in MODULES
           for line, text in _docs_and_comments(path, tree) if DATE.search(text)]
    assert not bad, "dated run logs in the code (move them to benchmarks/results/):\n" + "\n".join(bad)
    assert DATE.search("the grid of 2026-12-04") and not DATE.search("v5e-16 2x2x4")


def _public_definitions():
    """(qualified name, ast node) of every name in ``aoizora.__all__`` (found where it is
    defined, following re-exports), and of the public methods of the public classes."""
    trees = {name: tree for _, name, tree in MODULES}
    init = trees["aoizora"]
    public = next(ast.literal_eval(n.value) for n in init.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "_PUBLIC")
    out = []
    for name, module in public.items():
        while True:
            tree = trees[module]
            node = next((n for n in tree.body if getattr(n, "name", None) == name), None)
            if node is not None:
                break
            module = next(n.module for n in tree.body if isinstance(n, ast.ImportFrom)
                          and name in [a.name for a in n.names])
        out.append((f"{module}.{name}", node))
        if isinstance(node, ast.ClassDef):
            out += [(f"{module}.{name}.{m.name}", m) for m in node.body
                    if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")]
    return out


def test_the_public_names_state_their_contracts():
    """Every name in ``aoizora.__all__`` documents its contract the way optax does (#47): a
    function or method says Args (when it takes any), Returns and Raises (when it raises); a
    class its Attributes or its constructor's Args; a property what it is."""
    bad = []
    for qual, node in _public_definitions():
        doc = ast.get_docstring(node) or ""
        if not doc:
            bad.append(f"{qual}: no docstring")
            continue
        if isinstance(node, ast.ClassDef):
            need = [] if ("Attributes:" in doc or "Args:" in doc) else ["Attributes: or Args:"]
        elif any(getattr(d, "id", "") == "property" for d in node.decorator_list):
            need = []
        else:
            need = [s for s, due in (("Args:", _n_params(node) > 0), ("Returns:", True),
                ("Raises:", any(isinstance(n, ast.Raise) for n in ast.walk(node))))
                if due and s not in doc]
        bad += [f"{qual}: no {s}" for s in need]
    assert len(_public_definitions()) > 6
    assert not bad, "\n".join(bad)


# Where a target name is resolved (``get_target``): the doors (#47). ``plan_schema`` is the plan
# file's door (a file names its target); ``targets`` defines it; ``plan_torch`` and
# ``torch_compare`` are the PyTorch frontend's public calls.
TARGET_DOORS = {"aoizora/planner.py", "aoizora/cli.py", "aoizora/compare.py", "aoizora/builtin.py",
                "aoizora/plan_schema.py", "extract/targets.py",
                "aoizora/planning/torch_planner.py", "aoizora/torch_compare.py"}


def test_the_target_is_resolved_at_the_door():
    """Below the API and the CLI, code takes a resolved ``Target``: no ``get_target`` call."""
    bad = [f"{path}:{n.lineno}" for path, _, tree in MODULES if path not in TARGET_DOORS
           for n in ast.walk(tree) if isinstance(n, ast.Call)
           and getattr(n.func, "id", getattr(n.func, "attr", "")) == "get_target"]
    assert not bad, "get_target below the door (take a Target instead):\n" + "\n".join(bad)
    annotated = [f"{path}:{n.lineno}" for path, _, tree in MODULES for n in ast.walk(tree)
                 if isinstance(n, ast.arg) and n.annotation is not None
                 and "str | Target" in ast.unparse(n.annotation) and path not in TARGET_DOORS]
    assert not annotated, "internal signatures take a Target, not str | Target:\n" + \
        "\n".join(annotated)


MAX_SLEEP_S = 0.1


def test_tests_do_not_race_the_clock():
    """No real sleep over 0.1 s in the tests (#47): a test that needs time to pass moves the
    ``frozen_clock`` or ``jumping_clock`` of conftest.py, which ``solvers.budget.clock`` reads.
    The one exception is a wait on another process (a subprocess given a signal), which no
    clock of this one can move: its line says ``# real time:`` and why."""
    bad = []
    for p in sorted((ROOT / "tests").glob("*.py")):
        lines = p.read_text().splitlines()
        for n in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "sleep" and isinstance(n.func.value, ast.Name)
                    and n.func.value.id in ("time", "_time")):
                continue
            if "# real time:" in lines[n.lineno - 1]:   # waiting on another process, named
                continue
            arg = n.args[0] if n.args else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float))
                    and arg.value <= MAX_SLEEP_S):
                bad.append(f"tests/{p.name}:{n.lineno} {ast.unparse(n)}")
    assert not bad, "real sleeps over 0.1 s (or of a computed length) in tests:\n" + "\n".join(bad)
