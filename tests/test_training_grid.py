"""benchmarks.training_grid on the small Wan model (tiny workload, short budget): one cell planned
and compared with every expert training configuration, each row priced by Q2 and the reference
simulator on its compiled HLO, with MFU, HBM, remat and optimizer sharding; the summary says
which figures are predicted and which simulated."""

import json

import pytest

from benchmarks import training_grid as TG

pytestmark = [pytest.mark.tpu_compiler, pytest.mark.slow]   # about 4 minutes on 2 cores


def test_one_small_cell_end_to_end(tmp_path):
    cell = TG.Cell("wan2.1-small", "tiny-9f", 2, "v5p-8")
    out = TG.run_cell(cell, budget=90.0, seed=0, log=lambda s: None)
    path = TG.write_cell(out, tmp_path)
    doc = json.loads(path.read_text())
    assert not doc["errors"], doc["errors"]
    rows = {r["name"]: r for r in doc["rows"]}
    assert {"aoizora", "aoizora-layout/default-order", "expert:maxdiffusion",
            "expert:fsdp_ulysses", "expert:dp_fsdp", "expert:fsdp_tp", "alpa-logical"} <= set(rows)
    alpa = rows["alpa-logical"]       # the ILP alone: compiled and priced like the experts
    assert alpa["planning_time_s"] > 0 and (alpa.get("sim_step_s") or alpa.get("reason"))
    plan = rows["aoizora"]
    for key in ("q2_step_s", "sim_step_s", "mfu_sim", "hbm_gib_per_chip"):
        assert plan[key] > 0, key
    assert 0 < plan["mfu_sim"] < 1 and plan["speedup_sim"] == 1.0
    parts = plan["sim_compute_by_kind_s"]      # the simulator's compute, by kind
    assert "attention backward (dq, dk/dv)" in parts
    assert sum(parts.values()) == pytest.approx(plan["sim_compute_s"], rel=0.02)
    assert doc["model_flops"]["formula"].startswith("6 x params x B x S")
    assert rows["expert:maxdiffusion"]["remat"] == {"attn_out": "offload", "cross_out": "offload"}
    assert rows["expert:fsdp_ulysses"]["remat"] == "full"
    for r in doc["rows"]:
        if r.get("sim_step_s"):
            assert r["speedup_sim"] > 0 and r["optimizer_sharding"]
    assert doc["placement_gain_sim"] is not None
    # the seeds the planner compiled (after the first two refinements) are priced from its
    # compiles, not compiled again
    seeds = {c["layout"].split(":", 1)[1] for it in doc["plan"]["plan"]["iterations"]
             for c in it["candidates"] if c["layout"].startswith("train-expert:") and c["q2_step_s"]}
    assert seeds
    for name in seeds:
        assert rows[f"expert:{name}"]["compile"].startswith("the planner's compile"), name
    lines = "\n".join(TG.report(tmp_path))
    assert "predicted (Q2)" in lines and "simulated (AoiZora reference simulator)" in lines
    assert "| expert:maxdiffusion |" in lines and "No TPU ran" in lines
