"""A planning budget counted in compiles (``plan(..., compiles=N)``, ``aoizora plan --compiles
N``): bad counts are refused in one line, the CLI hands the count and a wall-clock guard to the
planner, the repeat check ignores timings and nothing else, and (slow) the small model planned
twice with the same count gives the same plan."""

import json
import types

import jax
import jax.numpy as jnp
import pytest

import aoizora
from aoizora import cli
from aoizora.planner import BudgetError
from benchmarks.compile_budget_repeat import differences, timing_free


def test_a_count_below_one_is_refused_before_any_work():
    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(BudgetError, match="whole number of compiles"):
            aoizora.plan(lambda a: a, x, compiles=bad)


@pytest.mark.parametrize("value", ["0", "two", "1.5"])
def test_the_cli_refuses_a_bad_count_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "--compiles", value, "--quiet"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "--compiles" in err


class _Stop(Exception):
    pass


@pytest.mark.parametrize("argv, want", [
    (["--compiles", "3"], (3, cli.COMPILE_GUARD_S)),
    (["--compiles", "3", "--time-budget", "50"], (3, 50.0)),
    ([], (None, 300.0)),
])
def test_the_cli_hands_the_count_and_its_guard_to_the_planner(monkeypatch, argv, want):
    import aoizora.builtin as builtin
    import aoizora.planner as planner

    got = {}

    def fake_plan(fn, *args, **kw):
        got.update(kw)
        raise _Stop()

    monkeypatch.setattr(planner, "plan", fake_plan)
    monkeypatch.setattr(builtin, "expert_seed_layouts", lambda job: [])
    args = cli.build_parser().parse_args(
        ["plan", "--model", "wan2.1-small", "--resolution", "128p", "--frames", "9", "--quiet",
         *argv])
    args.signals = types.SimpleNamespace()      # main() sets the signal handling; not needed here
    with pytest.raises(_Stop):
        cli.cmd_plan(args)
    assert (got["compiles"], got["time_budget_s"]) == want


def test_the_repeat_check_ignores_timings_and_nothing_else():
    a = {"mesh": {"x": 2}, "planning_time_s": 3.0, "iterations": [
        {"candidates": [{"compile_s": 4.1, "q2_step_s": 1e-3}], "elapsed_s": 9.0}]}
    b = json.loads(json.dumps(a))
    b["planning_time_s"], b["iterations"][0]["candidates"][0]["compile_s"] = 7.0, 2.2
    assert differences(a, b) != [] and differences(timing_free(a), timing_free(b)) == []
    b["iterations"][0]["candidates"][0]["q2_step_s"] = 2e-3       # a decision, not a timing
    assert differences(timing_free(a), timing_free(b)) == [".iterations[0].candidates[0]"
                                                           ".q2_step_s"]
    b["iterations"].append({})
    assert ".iterations (length 1 vs 2)" in differences(timing_free(a), timing_free(b))


@pytest.mark.slow      # two plans of the small model: about 1-2 minutes on 2 shared cores
@pytest.mark.tpu_compiler
def test_the_same_count_gives_the_same_plan_twice():
    from aoizora.builtin import builtin_job, expert_seed_layouts

    job = builtin_job("wan2.1-small", "128p", 9, "v5e-8")
    plans = [aoizora.plan(job.fn, *job.args, target=job.target, time_budget_s=1800, compiles=3,
                          seed_layouts=expert_seed_layouts(job)).to_json() for _ in range(2)]
    assert differences(timing_free(plans[0]), timing_free(plans[1])) == []
    assert any("budget: 3 candidate compile(s)" in n for n in plans[0]["notes"])
