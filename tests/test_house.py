"""The shape of the house (issues #33, #47): functions that fit on a screen, layers that import one
way, rooms that import only along the arrows ``docs/architecture.md`` allows, no import cycles
among the solvers, no private names imported across modules, and a light ``aoizora.extract`` that
does not pull in the planner. Static checks over the source (ast)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"aoizora": "aoizora", "extract": "aoizora.extract",
            "formulation": "aoizora.formulation", "solvers": "aoizora.solvers"}
LAYER = {"aoizora.extract": 0, "aoizora.formulation": 1, "aoizora.solvers": 2, "aoizora": 3}
MAX_LINES, MAX_PARAMS = 120, 10
PUBLIC_EXCEPTIONS = {("aoizora/planner.py", "plan"),      # the public plan() takes every option
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
