"""Bad input to the command line: every tampered plan file is refused by every command that reads
one, with exit code 2 and one line on stderr naming the field; an unwritable --out or --png is
refused before any work. Nothing here plans or compiles: building the job is made to fail, so a
command that got past its checks would show it."""

import json
import math
import os

import jax
import jax.numpy as jnp
import pytest

from aoizora import builtin
from aoizora.cli import main
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.plans import Plan, program_key
from aoizora.solvers.certificate import Certificate


def _f(x, w):
    return jnp.tanh(x @ w)


ARGS = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 4), jnp.float32))


def _plan_json() -> dict:
    """A valid plan for v5e:2x4 (mesh x=2, y=4), made without planning."""
    layout = Layout({"x": 2, "y": 4}, [("x", None), (None, "y")], [("x", "y")],
                    node_specs={"0": ("x", "y")}, attention={"*": AttentionLayout(heads=("y",))},
                    rules={"seq": ("y",)}, name="test")
    p = Plan(key=program_key(_f, ARGS, "v5e:2x4"), target="v5e:2x4", layout=layout,
             device_order=[0, 1, 3, 2, 4, 5, 7, 6],
             device_coords=[(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)],
             predicted={"step_s": 1e-3, "compute_s": 8e-4, "communication_s": 2e-4,
                        "default_order_step_s": 1.2e-3, "model": "Q2",
                        "links": [{"from": [0, 0], "to": [1, 0], "seconds": 1e-4}]},
             certificates={"placement": Certificate("CP-SAT", "OPTIMAL", 2e-4, 2e-4, 0.1)})
    return p.to_json()


def _set(path: str, value):
    """A tamper: set the entry at a dotted path (list indices as numbers)."""
    def apply(d):
        *head, last = path.split(".")
        for k in head:
            d = d[int(k)] if isinstance(d, list) else d[k]
        if isinstance(d, list):
            d[int(last)] = value
        else:
            d[last] = value
    return apply


def _both_meshes(value):
    def apply(d):
        d["mesh"] = dict(value)
        d["layout"]["mesh_axes"] = dict(value)
    return apply


def _swap_coords(i, j):
    """device_coords[i] and [j] swapped: still every chip once, but no longer the chips of
    device_order[i] and [j] (what check compiles and what make_mesh deploys would differ)."""
    def apply(d):
        c = d["device_coords"]
        c[i], c[j] = c[j], c[i]
    return apply


def _drop(key):
    return lambda d: d.pop(key)


# (case, tamper, the field the error must name)
TAMPERS = [
    ("order-not-permutation", _set("device_order", [0, 0, 3, 2, 4, 5, 7, 6]), "device_order"),
    ("order-out-of-range", _set("device_order.7", 8), "device_order[7]"),
    ("order-too-short", _set("device_order", [0, 1, 2, 3]), "device_order"),
    ("order-not-integers", _set("device_order.0", "0"), "device_order[0]"),
    ("coords-outside-slice", _set("device_coords.0", [2, 0]), "device_coords[0]"),
    ("mesh-not-chip-count", _both_meshes({"x": 2, "y": 2}), "layout.mesh_axes"),
    ("mesh-differs-from-layout", _set("mesh", {"x": 4, "y": 2}), "mesh"),
    ("mesh-size-zero", _set("layout.mesh_axes", {"x": 0, "y": 4}), "layout.mesh_axes.x"),
    ("unknown-target", _set("target", "v9z:2x4"), "target"),
    ("key-target-another-slice", _set("key.target", "v5e:4x4"), "key.target"),
    ("prediction-not-a-number", _set("predicted.step_s", "fast"), "predicted.step_s"),
    ("prediction-negative", _set("predicted.compute_s", -1.0), "predicted.compute_s"),
    ("prediction-nan", _set("predicted.step_s", math.nan), "predicted.step_s"),
    ("prediction-infinite", _set("predicted.communication_s", math.inf),
     "predicted.communication_s"),
    ("prediction-missing", lambda d: d["predicted"].pop("step_s"), "predicted.step_s"),
    ("optional-prediction-negative", _set("predicted.default_order_step_s", -0.5),
     "predicted.default_order_step_s"),
    ("other-seconds-not-a-number", _set("predicted.overlap_s", "none"), "predicted.overlap_s"),
    ("link-seconds-negative", _set("predicted.links.0.seconds", -1e-6),
     "predicted.links[0].seconds"),
    ("in-spec-axis-not-in-mesh", _set("layout.in_specs.0", ["z", None]), "layout.in_specs[0]"),
    ("in-spec-wrong-rank", _set("layout.in_specs.1", [None, "y", None]), "layout.in_specs[1]"),
    ("in-spec-axis-twice", _set("layout.in_specs.0", [["x", "y"], "x"]), "layout.in_specs[0]"),
    ("in-spec-entry-not-an-axis", _set("layout.in_specs.0", [5, None]),
     "layout.in_specs[0][0]"),
    ("out-spec-axis-not-in-mesh", _set("layout.out_specs.0", ["x", "model"]),
     "layout.out_specs[0]"),
    ("node-spec-axis-not-in-mesh", _set("layout.node_specs.0", ["data", None]),
     "layout.node_specs['0']"),
    ("attention-axis-not-in-mesh", _set("layout.attention.*.heads", ["heads"]),
     "layout.attention['*'].heads"),
    ("rule-axis-not-in-mesh", _set("layout.rules.seq", ["context"]), "layout.rules.seq"),
    ("missing-layout", _drop("layout"), "layout"),
    ("wrong-format", _set("format", "aoizora-plan/0"), "format"),
    ("certificate-status", _set("certificates.placement.status", "GOOD"),
     "certificates.placement.status"),
    ("calibration-malformed", _set("calibration", {"axis_costs": []}), "calibration"),
    ("coords-contradict-order", _swap_coords(0, 1), "device_coords[0]"),
    ("certificate-objective-nan", _set("certificates.placement.objective", math.nan),
     "certificates.placement.objective"),
    ("certificate-bound-minus-infinity", _set("certificates.placement.bound", -math.inf),
     "certificates.placement.bound"),
    ("nan-in-a-free-form-record", _set("iterations", [{"candidates": [{"q1_s": math.nan}]}]),
     "iterations[0].candidates[0].q1_s"),
]

COMMANDS = {
    "show": lambda f: ["show", f],
    "check": lambda f: ["check", f],
    "compare": lambda f: ["compare", "--plan", f, "--quiet"],
    "inspect": lambda f: ["inspect", "--plan", f],
    "plan --calibration": lambda f: ["plan", "--calibration", f, "--quiet"],
}


@pytest.fixture(autouse=True)
def no_jobs(monkeypatch):
    """Building a job is the first step of planning, compiling and pricing: here it fails loudly."""
    def refuse(*a, **k):
        raise AssertionError("a job was built: the command went past its input checks")
    monkeypatch.setattr(builtin, "builtin_job", refuse)


def _run(argv, capsys) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.splitlines()


def _write(tmp_path, d, name="plan.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)


def test_the_valid_plan_is_shown(tmp_path, capsys):
    """The untampered plan passes its checks (so each case below fails for its tamper alone)."""
    code, err = _run(["show", _write(tmp_path, _plan_json())], capsys)
    assert code == 0 and err == []


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case,tamper,field", TAMPERS, ids=[t[0] for t in TAMPERS])
def test_a_tampered_plan_is_one_line_and_exit_2(tmp_path, capsys, command, case, tamper, field):
    d = _plan_json()
    tamper(d)
    path = _write(tmp_path, d)
    code, err = _run(COMMANDS[command](path), capsys)
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"aoizora: error: {field}: "), err[0]
    assert err[0].count("; ") == 1 and err[0].endswith(f"; fix it in {path} or plan again: "
                                                       f"aoizora plan --out {path}"), err[0]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("content,problem", [
    ("{not json", "not JSON"),
    ('{"format": "aoizora-plan/1", "key": ', "not JSON"),
    (b"\xff\xfe{}", "not JSON"),
    ("[1, 2]", None),
    (None, "no plan file"),
], ids=["not-json", "truncated", "not-utf8", "not-an-object", "missing"])
def test_a_file_that_is_not_a_plan_is_one_line_and_exit_2(tmp_path, capsys, command, content,
                                                          problem):
    path = tmp_path / "plan.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    code, err = _run(COMMANDS[command](str(path)), capsys)
    assert code == 2 and len(err) == 1, err
    if problem is None:
        assert err[0].startswith("aoizora: error: (the plan): a JSON object is expected, not a list")
    else:
        assert err[0].startswith(f"aoizora: error: {path}: {problem}"), err[0]


def test_a_directory_given_as_the_plan(tmp_path, capsys):
    code, err = _run(["show", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith(f"aoizora: error: {tmp_path}: a directory, not a plan file")


def test_check_reads_the_baseline_before_it_compiles(tmp_path, capsys):
    """A valid plan with a tampered baseline: the baseline's field is named and no job is built
    (the no_jobs fixture would raise), so nothing was compiled."""
    plan = _write(tmp_path, _plan_json())
    base = _plan_json()
    base["predicted"]["step_s"] = -2.0
    base_path = _write(tmp_path, base, "base.json")
    code, err = _run(["check", plan, "--baseline", base_path], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("aoizora: error: predicted.step_s: input should be greater than or "
                             "equal to 0 (got -2.0); fix it in " + base_path)


@pytest.mark.parametrize("command,flag", [
    (["plan", "--quiet"], "--out"),
    (["show", "PLAN"], "--png"),
])
def test_an_output_path_that_cannot_be_written(tmp_path, capsys, command, flag):
    """A directory, a missing directory, a path under a file, a file the system will not open for
    writing: each refused with exit 2 before the plan is read or anything is built."""
    plan = _write(tmp_path, _plan_json())
    argv = [plan if a == "PLAN" else a for a in command]
    (tmp_path / "afile").write_text("x")
    cases = [(str(tmp_path), "is a directory"),
             (str(tmp_path / "missing" / "p.json"), "is not an existing directory"),
             (str(tmp_path / "afile" / "p.json"), "is not an existing directory")]
    if os.path.exists("/proc/version"):   # refused by the kernel even to root
        cases.append(("/proc/version", "cannot be written"))
    for out, problem in cases:
        code, err = _run(argv + [flag, out], capsys)
        assert code == 2 and len(err) == 1, (out, err)
        assert err[0].startswith(f"aoizora: error: {flag}: ") and problem in err[0], err[0]


def test_out_is_checked_before_the_calibration_plan(tmp_path, capsys):
    bad = _plan_json()
    bad["target"] = "nowhere"
    code, err = _run(["plan", "--quiet", "--calibration", _write(tmp_path, bad),
                      "--out", str(tmp_path)], capsys)
    assert code == 2 and err[0].startswith("aoizora: error: --out: ")


def test_the_write_check_leaves_files_as_they_were(tmp_path, capsys):
    """Checking --out truncates nothing and leaves no empty file behind: with a valid path the
    command goes on to build its job, which fails here (no_jobs): a fault that is not the
    input's is exit 3 with its traceback, never 1."""
    kept = tmp_path / "kept.json"
    kept.write_text("earlier plan")
    new = tmp_path / "new.json"
    for out in (kept, new):
        assert main(["plan", "--quiet", "--out", str(out)]) == 3
        err = capsys.readouterr().err
        assert "AssertionError: a job was built" in err and "aoizora: internal error" in err
    assert kept.read_text() == "earlier plan" and not new.exists()


def test_check_says_fail_when_the_plan_no_longer_compiles(tmp_path, capsys, monkeypatch):
    """A compile error of the plan's own program is the regression check exists to catch:
    exit 1 with a FAIL line (the job is the plan's program; the compile is made to fail)."""
    import types

    from aoizora import planner
    from aoizora.extract.aot_compile import CompileError
    from aoizora.extract.targets import get_target

    job = types.SimpleNamespace(fn=_f, args=ARGS, target=get_target("v5e:2x4"))
    monkeypatch.setattr(builtin, "builtin_job", lambda *a, **k: job)

    def fail(*a, **k):
        raise CompileError("RESOURCE_EXHAUSTED: a made-up compiler failure\nsecond line")
    monkeypatch.setattr(planner, "compile_layout", fail)
    code = main(["check", _write(tmp_path, _plan_json()), "--target", "v5e-8"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith("FAIL: the plan no longer compiles for v5e:2x4 in its device order: "
                          "RESOURCE_EXHAUSTED: a made-up compiler failure\n")
