"""The calibration a plan carries (what the loop learned on a target) and the warm start it gives
the next plan: JSON, clear errors, and that the first ILPs of the next plan use it."""

import json

import jax.numpy as jnp
import pytest

import aoizora
from aoizora.formulation.calibration import Calibration, CalibrationError, mesh_key
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.extract.targets import get_target
from aoizora.plans import PlanError, load_plan


def _calibration():
    tgt = get_target("v5e-8")
    costs = default_axis_costs(tgt, {"x": 2, "y": 4})
    costs.beta_by_kind = {"y": {"all-to-all": 3 * costs.beta_s_per_byte["y"]}}
    return Calibration(tgt.name, {mesh_key({"x": 2, "y": 4}): costs},
                       {"all-to-all": [0.6, 0.2]}, {"*": {"ring": 1.4}, "12.3": {"gather": 2.0}},
                       {"program": "abc"})


def test_round_trip_and_lookups():
    c = _calibration()
    back = Calibration.from_json(json.loads(json.dumps(c.to_json())))
    assert back == c
    assert back.costs_for({"x": 2, "y": 4}) == c.axis_costs[mesh_key({"x": 2, "y": 4})]
    assert back.costs_for({"y": 4, "x": 2}) is None        # axis order is part of the mesh
    assert back.kind_ratios == {"all-to-all": pytest.approx(3.0)}


@pytest.mark.parametrize("mutate,match", [
    (lambda d: d.pop("target"), "malformed calibration"),
    (lambda d: d["attention_scale"]["*"].update(ring=-1.0), "positive"),
    (lambda d: d["axis_costs"][0].pop("costs"), "malformed calibration"),
    (lambda d: d.update(kind_pool={"all-gather": [1.0]}), "malformed calibration"),
])
def test_a_malformed_calibration_is_one_clear_error(mutate, match):
    d = _calibration().to_json()
    mutate(d)
    with pytest.raises(CalibrationError, match=match):
        Calibration.from_json(d)


def test_a_calibration_from_another_target_is_refused():
    c = _calibration()
    with pytest.raises(CalibrationError, match="measured on v5e:2x4, not v5e:4x4"):
        aoizora.plan(lambda x: x, jnp.zeros(4), target="v5e-16", calibration=c)


def test_a_plan_file_with_a_corrupt_calibration_is_a_plan_error(tmp_path):
    d = {"format": "aoizora-plan/1", "key": {"fingerprint": "f", "input_shapes": [],
                                             "target": "v5e:2x4"},
         "target": "v5e:2x4", "layout": {"mesh_axes": {"x": 8}, "in_specs": []},
         "device_order": list(range(8)), "device_coords": [[i % 2, i // 2] for i in range(8)],
         "predicted": {"step_s": 1e-3, "compute_s": 1e-3, "communication_s": 0.0},
         "certificates": {}, "calibration": {"target": "v5e:2x4", "kind_pool": {"x": "y"}}}
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(d))
    with pytest.raises(PlanError, match="^calibration: malformed calibration"):
        load_plan(str(f))
    d["calibration"] = None
    f.write_text(json.dumps(d))
    assert load_plan(str(f)).calibration is None
