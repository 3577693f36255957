"""Plan files: JSON round trip, and clear errors for corrupt, foreign or mismatched plans."""

import json

import jax
import jax.numpy as jnp
import pytest

from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora import time_limits
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
    (json.dumps({"format": "aoizora-plan/1", "target": "v5e:2x4"}), "corrupt plan"),
])
def test_corrupt_files_are_clear_errors(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PlanError, match=match):
        load_plan(str(path))


def test_missing_file():
    with pytest.raises(PlanError, match="no plan file"):
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
