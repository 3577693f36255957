"""The GPU validation table (``benchmarks/gpu_validation.py``), cheaply: the published rows are
consistent with their configurations, the built targets have the stated GPUs, and the table and
its medians build from tiny fake records (no capture, no pricing)."""

from __future__ import annotations

import pytest

from benchmarks.gpu_validation import (MODELS, STREAM, box_target, markdown, published_rows,
                                       table)


def test_published_rows_match_their_configurations():
    rows = published_rows()
    assert len(rows) >= 5 and len({r.source for r in rows}) >= 3
    for r in rows:
        degrees = 1
        for v in r.config.values():
            degrees *= v
        assert degrees == r.gpus, r
        assert r.source.startswith("https://") and r.model in MODELS and r.model in STREAM
        assert r.measured_s > 0 and r.steps > 0 and r.gpu in ("h100", "h20", "a100")


def test_built_targets():
    pytest.importorskip("torch")
    h20 = box_target("h20", 4)
    assert h20.num_devices == 4 and h20.chip.peak_bf16_flops == pytest.approx(148e12)
    assert box_target("h100", 8).name == "h100-8"
    assert box_target("h100", 2).chip.peak_bf16_flops == box_target("h100", 8).chip.peak_bf16_flops


def _record(gpu="h100", exact=True, measured=100.0, steps=50, step=1.5, gpus=2):
    return {"source": "https://example.org/x", "states": "x", "gpu": gpu, "gpus": gpus,
            "model": "flux-dev-1024", "config": {"ulysses": 2}, "steps": steps,
            "measured_s": measured, "same_gpu": gpu == "h100", "exact_model": exact, "note": "",
            "xdit_config": "xdit:ulysses2", "target": "t", "step_s": step, "compute_s": step,
            "communication_s": 0.0, "repo_layout_step_s": 2 * step, "fits_hbm": True,
            "xdit_collectives_step_s": step, "fallbacks": []}


def test_table_errors_groups_and_medians():
    t = table([_record(step=1.5), _record(step=3.0), _record(gpu="h20", step=2.2),
               _record(exact=False, step=1.0)])
    rows = t["rows"]
    assert rows[0]["measured_step_bound_s"] == pytest.approx(2.0)
    assert rows[0]["error"] == pytest.approx(-0.25) and rows[1]["error"] == pytest.approx(0.5)
    assert rows[0]["repo_layout_error"] == pytest.approx(0.5)
    assert [r["group"] for r in rows] == ["headline", "headline", "built-gpu",
                                          "approximate-model"]
    assert all(r["independent"] for r in rows)
    med = t["median_abs_error"]
    assert med["headline"] == (pytest.approx(0.375), 2) and med["built-gpu"][1] == 1
    assert med["all"][1] == 4 and t["median_abs_error_xdit_collectives"]["headline"][1] == 2
    doc = {"table": t, "git": {"git_commit": "abc", "git_modified_files": []},
           "machine": {"date": "d"}, "models": {"flux-dev-1024": "FLUX"}}
    md = "\n".join(markdown(doc))
    assert "UPPER BOUND" in md and "37.5%" in md and "https://example.org/x" in md


def test_speedup_over_the_series_one_gpu_row():
    t = table([_record(gpus=1, measured=200.0, step=2.0), _record(measured=100.0, step=1.25)])
    two = t["rows"][1]
    assert two["speedup_measured"] == pytest.approx(2.0)
    assert two["speedup_predicted"] == pytest.approx(1.6)
    assert two["speedup_error"] == pytest.approx(-0.2)
    assert "speedup_error" not in t["rows"][0]
    assert t["median_abs_speedup_error"]["headline"] == (pytest.approx(0.2), 1)
