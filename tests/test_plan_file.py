"""Plan files: JSON round trip, and clear errors for corrupt, foreign or mismatched plans."""

import json

import jax
import jax.numpy as jnp
import pytest

from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.planning import time_limits
from aoizora.plan_schema import field_path, validate_plan_json
from aoizora.plans import Plan, PlanError, load_plan, program_key
from aoizora.report import format_plan
from aoizora.solvers.certificate import Certificate


def _f(x, w):
    return jnp.tanh(x @ w)


ARGS = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 4), jnp.float32))


def _plan():
    key = program_key(_f, ARGS, "v5e:2x4")
    layout = Layout({"x": 2, "y": 4}, [("x", None), (None, "y")], [("x", "y")],
                    node_specs={"0": ("x", "y")}, attention={"*": AttentionLayout(heads=("y",))},
                    name="test")
    return Plan(key=key, target="v5e:2x4", layout=layout, device_order=[0, 1, 3, 2, 4, 5, 7, 6],
                device_coords=[(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)],
                predicted={"step_s": 1e-3, "compute_s": 8e-4, "communication_s": 2e-4,
                           "model": "Q2"},
                certificates={"placement": Certificate("CP-SAT", "OPTIMAL", 2e-4, 2e-4, 0.1)})


def test_round_trip(tmp_path):
    p = _plan()
    path = tmp_path / "plan.json"
    p.save(str(path))
    q = load_plan(str(path))
    assert q.to_json() == p.to_json()
    assert q.mesh == {"x": 2, "y": 4}
    assert q.certificates["placement"].gap == 0.0
    assert str(q.in_shardings[0]) == str(jax.sharding.PartitionSpec("x", None))


def test_make_mesh_keeps_the_permutation_on_cpu_devices():
    mesh = _plan().make_mesh(jax.devices())
    assert [d.id for d in mesh.devices.flat] == [0, 1, 3, 2, 4, 5, 7, 6]
    assert dict(mesh.shape) == {"x": 2, "y": 4}


@pytest.mark.parametrize("content,match", [
    ("{not json", "not JSON"),
    (json.dumps({"format": "something-else"}), "not an AoiZora plan"),
    (json.dumps({"format": "aoizora-plan/1", "target": "v5e:2x4"}), "^key: field required"),
])
def test_corrupt_files_are_clear_errors(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PlanError, match=match):
        load_plan(str(path))


def test_missing_file():
    with pytest.raises(PlanError, match="^/nonexistent/plan.json: no plan file"):
        load_plan("/nonexistent/plan.json")


def test_key_refuses_another_program():
    p = _plan()
    other = program_key(lambda x, w: jnp.sin(x @ w), ARGS, "v5e:2x4")
    with pytest.raises(PlanError, match="another program"):
        p.check_key(other)
    bigger = program_key(_f, (jax.ShapeDtypeStruct((16, 16), jnp.float32), ARGS[1]), "v5e:2x4")
    with pytest.raises(PlanError, match="inputs"):
        p.check_key(bigger)
    p.check_key(program_key(_f, ARGS, "v5e:2x4"))  # same program: accepted


def test_a_plan_says_where_time_limits_bound(tmp_path):
    """``Plan.time_limited`` round-trips; the summary prints the first few under their note."""
    p = _plan()
    assert p.time_limited == []
    p.time_limited = [f"compile of mesh 2x4 L{i}: not started (time budget)" for i in range(7)]
    p.notes = [time_limits.summary(p.time_limited)]
    assert p.notes[0].startswith("time limits bound in 7 place(s)")
    p.save(str(tmp_path / "plan.json"))
    assert load_plan(str(tmp_path / "plan.json")).time_limited == p.time_limited
    text = format_plan(p)
    assert "time limit: compile of mesh 2x4 L4" in text and "L5" not in text
    assert "... and 2 more (plan.time_limited)" in text


def test_a_plan_names_the_compiler_that_priced_it(tmp_path, monkeypatch):
    from aoizora.extract.aot_compile import compiler_differences, compiler_identity

    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_ici_ag_pipelining=true")
    here = compiler_identity()
    assert here["jax"] == jax.__version__ and here["libtpu"]
    assert here["LIBTPU_INIT_ARGS"] == "--xla_tpu_enable_ici_ag_pipelining=true"
    p = _plan()
    p.compiler = dict(here)
    path = tmp_path / "plan.json"
    p.save(str(path))
    q = load_plan(str(path))
    assert q.compiler == here and compiler_differences(q.compiler) == []
    assert "LIBTPU_INIT_ARGS=--xla_tpu_enable_ici_ag_pipelining=true" in format_plan(q)
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    older = dict(here, libtpu="0.0.1")
    assert compiler_differences(older) == [
        f"libtpu 0.0.1 -> {here['libtpu']}",
        "LIBTPU_INIT_ARGS --xla_tpu_enable_ici_ag_pipelining=true -> (none)"]
    # a plan saved before the record was kept loads with an empty one, and nothing differs
    d = q.to_json()
    del d["compiler"]
    old = Plan.from_json(d)
    assert old.compiler == {} and compiler_differences(old.compiler) == []
    assert "compiled by" not in format_plan(old)


def test_loading_checks_the_plan_and_names_the_field(tmp_path):
    """Plan.from_json and load_plan both check; the error is one line naming the field and the
    file, and the plan's other fields are not needed to say so."""
    d = _plan().to_json()
    d["device_order"][3] = 1
    with pytest.raises(PlanError) as e:
        Plan.from_json(d)
    assert str(e.value).startswith("device_order: device 1 appears 2 times (a permutation of 0..7 "
                                   "is needed); ")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(PlanError) as e:
        load_plan(str(path))
    msg = str(e.value)
    assert "\n" not in msg and f"fix it in {path}" in msg


def test_a_plan_as_saved_by_the_planner_passes():
    """The committed plan of the default job (the planner's own output) is valid as it is."""
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "benchmarks/results/plan_wan2.1-1.3b_480p-81f_v5e-8.json"
    p = load_plan(str(path))
    assert p.target == "v5e:2x4" and sorted(p.device_order) == list(range(8))


def test_v4_counts_devices_not_chips():
    """v4 shows two devices per chip: the order covers 16 devices of the 8-chip 2x2x2 slice and
    each chip's coordinates appear twice; a mesh of 8 (the chip count) is refused."""
    d = _plan().to_json()
    chips = [(i % 2, (i // 2) % 2, i // 4) for i in range(8)]
    d["target"] = d["key"]["target"] = "v4:2x2x2"
    d["mesh"] = d["layout"]["mesh_axes"] = {"x": 4, "y": 4}
    d["device_order"] = list(range(16))
    d["device_coords"] = [list(chips[r // 2]) for r in range(16)]
    validate_plan_json(d)
    d["device_coords"][1] = list(chips[1])
    with pytest.raises(PlanError, match=r"^device_coords: chip \[0, 0, 0\] is given for 1 entries, v4:2x2x2 has 2"):
        validate_plan_json(d)
    d["mesh"] = d["layout"]["mesh_axes"] = {"x": 2, "y": 4}
    with pytest.raises(PlanError, match="^layout.mesh_axes: .* 8 ranks but v4:2x2x2 has 16 devices"):
        validate_plan_json(d)


def test_field_paths():
    assert field_path(("layout", "in_specs", 3, 0)) == "layout.in_specs[3][0]"
    assert field_path(("layout", "node_specs", "97.113")) == "layout.node_specs['97.113']"
    assert field_path(()) == "(the plan)"


def test_a_plan_file_too_large_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    from aoizora import plans

    monkeypatch.setattr(plans, "MAX_PLAN_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(list(range(1000))))
    with pytest.raises(PlanError, match=r"big.json: larger than 0 MiB, which no plan is; "
                                        "make one with"):
        load_plan(str(path))


@pytest.mark.parametrize("depth", [65, 100_000])
def test_a_plan_file_nested_too_deeply_is_one_error(tmp_path, depth):
    """65 levels: past the cap; 100,000: past Python's own recursion limit (a RecursionError
    before the cap was checked)."""
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth)
    with pytest.raises(PlanError, match="deep.json: nested deeper than a plan ever is"):
        load_plan(str(path))


def test_a_saved_plan_is_strict_json(tmp_path):
    """Free-form records with a NaN or an infinity (an iteration's Q1 of a seed) are saved as
    null: the file is strict JSON and loads again."""
    p = _plan()
    p.iterations = [{"candidates": [{"q1_s": float("inf")}], "x": float("nan")}]
    path = tmp_path / "plan.json"
    p.save(str(path))
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    json.loads(text, parse_constant=lambda c: pytest.fail(c))
    assert load_plan(str(path)).iterations == [{"candidates": [{"q1_s": None}], "x": None}]
