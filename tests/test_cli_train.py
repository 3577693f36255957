"""`aoizora plan / compare / check --task train`: bad training input is one line on stderr, exit
2, before any compile (a state that fits no layout says how many GiB are missing per chip and what
would fit; a batch that gives some chip no work; a model without a training step); and a training
plan of the small Wan model on v5p-8, compared with the expert training configurations and
checked, from its file."""

import json

import pytest

from aoizora import builtin
from aoizora.cli import main
from conftest import run_cli as _cli

SMALL = ["--model", "wan2.1-small", "--resolution", "128p", "--frames", "9"]


def _err(capsys, *argv):
    rc = main(list(argv))
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_state_that_fits_nowhere_is_one_line_with_what_would_fit(capsys, command):
    rc, err = _err(capsys, command, "--task", "train", "--model", "wan2.1-14b", "--resolution",
                   "720p", "--frames", "81", "--target", "v5e-4", "--quiet")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "fits no layout on v5e-4" in err and "GiB missing per chip" in err
    assert "would fit: v5e-16" in err


def test_fit_error_names_offload_and_a_smaller_batch():
    with pytest.raises(builtin.TrainFitError, match="moments offloaded to the host"):
        builtin.builtin_job("wan2.1-14b", "480p", 21, "v5e-8", task="train")
    with pytest.raises(builtin.TrainFitError, match=r"would fit: .*--batch 4"):
        builtin.builtin_job("wan2.1-14b", "720p", 81, "v5p-8", task="train", batch=64)


def test_batch_that_divides_into_no_layout(capsys):
    rc, err = _err(capsys, "plan", "--task", "train", *SMALL, "--target", "v5p-128", "--quiet")
    assert rc == 2 and "--batch 1 divides into no layout on v5p-128" in err
    assert "give --batch 6 or more" in err


def test_bad_training_arguments(capsys):
    for argv, says in ((["--batch", "0"], "--batch: '0'"),
                       (["--task", "finetune"], "invalid choice: 'finetune'")):
        with pytest.raises(SystemExit) as e:
            main(["plan", "--task", "train", *SMALL, "--quiet", *argv])
        assert e.value.code == 2 and says in capsys.readouterr().err
    rc, err = _err(capsys, "plan", "--task", "train", "--model", "hunyuanvideo-small",
                   "--resolution", "128p", "--frames", "9", "--quiet")
    assert rc == 2 and "training is built in for Wan 2.1 only" in err


def test_default_task_is_denoise():
    job = builtin.builtin_job("wan2.1-small", "128p", 9, "v5e-8")
    assert job.task == "denoise" and "training" not in job.describe()
    train = builtin.builtin_job("wan2.1-small", "128p", 9, "v5p-8", task="train", batch=2)
    assert train.task == "train" and "training, batch 2" in train.describe()
    assert train.program() == {"pad_multiple": train.pad_multiple, "task": "train", "batch": 2}
    assert train.args[1]["latents"].shape[0] == 2




@pytest.mark.tpu_compiler
@pytest.mark.slow      # about 4 minutes on a loaded 2-core machine
def test_training_plan_compare_and_check_from_the_file(tmp_path):
    job = [*SMALL, "--target", "v5p-8", "--task", "train", "--batch", "2"]
    r = _cli("plan", *job, "--time-budget", "90", "--quiet", "--out", "plan.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-600:]
    prog = json.loads((tmp_path / "plan.json").read_text())["program"]
    assert prog["task"] == "train" and prog["batch"] == 2
    c = _cli("compare", *job, "--plan", "plan.json", "--json", "--quiet", cwd=tmp_path)
    assert c.returncode == 0, c.stderr[-600:]
    rows = {r["name"]: r for r in json.loads(c.stdout)["rows"]}
    assert {"expert:maxdiffusion", "expert:fsdp_ulysses", "expert:dp_fsdp",
            "expert:fsdp_tp"} <= set(rows)
    assert rows["aoizora"]["step_s"] > 0
    ok = _cli("check", "plan.json", *job, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: "), ok.stdout + ok.stderr[-400:]
    other = _cli("check", "plan.json", *SMALL, "--target", "v5p-8", "--task", "train",
                 "--batch", "4", cwd=tmp_path)
    assert other.returncode == 2 and "made for batch 2" in other.stderr
