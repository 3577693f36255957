"""`aoizora check`, the CI gate, on a plan of the small built-in model: it passes, fails on a
regression (exit 1), says when the compiler is not the plan's, and refuses a corrupt plan."""

import json

import pytest
from conftest import run_cli as _cli

pytestmark = pytest.mark.tpu_compiler

JOB = ["--model", "wan2.1-small", "--resolution", "128p", "--frames", "9", "--target", "v5e-8"]




@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    r = _cli("plan", *JOB, "--time-budget", "40", "--quiet", "--out", "plan.json", cwd=d)
    assert r.returncode == 0, r.stderr[-400:]
    return d


def test_check_passes_and_fails_on_a_regression(plan_file):
    ok = _cli("check", "plan.json", *JOB, "--max-step-ms", "1000", cwd=plan_file)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: ") and "another compiler" not in ok.stdout
    tight = _cli("check", "plan.json", *JOB, "--max-step-ms", "0.000001", cwd=plan_file)
    assert tight.returncode == 1 and tight.stdout.startswith("FAIL: ")


def test_check_says_when_the_compiler_is_not_the_plans(plan_file):
    d = json.loads((plan_file / "plan.json").read_text())
    assert d["compiler"]["libtpu"]
    d["compiler"]["libtpu"] = "0.0.1"
    (plan_file / "older.json").write_text(json.dumps(d))
    r = _cli("check", "older.json", *JOB, cwd=plan_file)
    assert r.returncode == 0
    assert "compiled by another compiler than the plan's (libtpu 0.0.1 -> " in r.stdout


def test_check_refuses_a_corrupt_plan(plan_file):
    (plan_file / "bad.json").write_text('{"format": "aoizora-plan/1", "key": ')
    r = _cli("check", "bad.json", *JOB, cwd=plan_file)
    assert r.returncode == 2 and "bad.json: not JSON" in r.stderr and "Traceback" not in r.stderr
