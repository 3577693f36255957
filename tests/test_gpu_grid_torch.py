"""The PyTorch cells of the GPU grid (``benchmarks/gpu_grid_torch.py``) on a small model: one
cell's documented fields, and the plan never slower than the xDiT configurations it had as seeds
by the same pricing (``compare_torch``'s rows: Q2 on the same DTensor evidence)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from aoizora.extract.targets import get_target  # noqa: E402
from benchmarks.gpu_grid_torch import markdown, run_cell  # noqa: E402

FIELDS = ("plan", "best_xdit", "best_seed_xdit", "speedup", "speedup_over_seeds",
          "never_slower_than_seeds", "placement_gain_plan", "placement_gain_xdit", "rows",
          "label", "shape", "git", "wall_s")
PLAN_FIELDS = ("mesh", "layout", "device_order", "step_s", "default_order_step_s",
               "sharding_status", "placement_status", "planning_s", "candidates")


@pytest.fixture(scope="module")
def cell():
    try:
        get_target("l40-8")
    except Exception:  # noqa: BLE001 -- a tree without the GPU targets
        pytest.skip("no l40-8 target here")
    return run_cell("wan2.1-1.3b/l40-8", small=True, budget_s=120, placement_time_s=1,
                    ilp_time_s=5, top_k=1, meshes=[{"x": 2, "y": 4}])


def test_cell_has_the_documented_fields(cell):
    assert "error" not in cell, cell.get("error")
    assert all(k in cell for k in FIELDS) and all(k in cell["plan"] for k in PLAN_FIELDS)
    assert "not measured" in cell["label"]
    assert cell["plan"]["step_s"] > 0 and cell["best_xdit"]["name"].startswith("xdit:")
    assert cell["speedup"] == pytest.approx(cell["best_xdit"]["step_s"] / cell["plan"]["step_s"])
    assert cell["placement_gain_plan"] >= 1 - 1e-9
    table = markdown([cell])
    assert "wan2.1-1.3b/l40-8" in table and "not measured" in table and "geometric mean" in table


def test_plan_is_never_slower_than_its_seeds_by_the_same_pricing(cell):
    step = cell["plan"]["step_s"]
    priced = {c["layout"].split(" (")[0]: c for c in cell["plan"]["candidates"]
              if c["layout"].startswith("xdit:")}          # the seeds, as the plan priced them
    seeds = set(priced)
    rows = [r for r in cell["rows"] if r["name"] in seeds]
    assert len(rows) == cell["seeds"] == len(seeds) > 1        # every seed was priced
    for r in rows:
        assert step <= min(r["step_s"], r["placed_step_s"]) * (1 + 1e-9), r["name"]
    assert cell["never_slower_than_seeds"] and cell["speedup_over_seeds"] >= 1 - 1e-9
    # the plan's own price of each seed is compare_torch's price of that configuration
    for r in rows:
        assert priced[r["name"]]["q2_default_order_step_s"] == pytest.approx(r["step_s"])
