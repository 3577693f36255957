"""What the loop's feedback step (``aoizora.planning.feedback``) changes in the ILP's inputs and records,
and the loop state it works on (``aoizora.planning.loop_state``): on synthetic samples, no compile."""

from types import SimpleNamespace as NS

import pytest

from aoizora.planning import feedback
from aoizora.extract.targets import get_target
from aoizora.formulation.attention_calibration import AttentionSample
from aoizora.formulation.calibration import Calibration, mesh_key
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.planning.loop_state import LoopState, Settings, mesh_states, new_record

TGT = get_target("v5e-8")
MESHES = [{"x": 8}, {"x": 2, "y": 4}]


def _state(calibration=None):
    cal = calibration or Calibration(TGT.name)
    return LoopState(program=NS(target=TGT, network=None),
                     settings=Settings(0, 2, 4, 20.0, 10.0, 1),
                     budget=None, queue=NS(reserve_s=2.0), meshes=[dict(m) for m in MESHES],
                     mesh_state=mesh_states(TGT, MESHES, cal), learned=cal, progress=None)


def test_meshes_start_from_the_calibration_or_the_default():
    measured = default_axis_costs(TGT, MESHES[0])
    cal = Calibration(TGT.name, {mesh_key(MESHES[0]): measured}, {"all-gather": [3.0, 1.0]})
    st = mesh_states(TGT, MESHES, cal)
    assert st[mesh_key(MESHES[0])].measured and st[mesh_key(MESHES[0])].costs == measured
    other = st[mesh_key(MESHES[1])]
    assert not other.measured and other.default == default_axis_costs(TGT, MESHES[1])
    # the unmeasured mesh takes the calibration's pooled kind ratios on its defaults
    for a, b in other.default.beta_s_per_byte.items():
        assert other.costs.beta_by_kind[a]["all-gather"] == pytest.approx(3.0 * b)


def test_the_ilp_inputs_key_changes_with_what_the_ilp_reads():
    s = _state()
    k = s.ilp_inputs_key(MESHES[1])
    assert s.ilp_inputs_key(MESHES[1]) == k and s.ilp_inputs_key(MESHES[0]) != k
    s.scales.compute = 2.0
    k2 = s.ilp_inputs_key(MESHES[1])
    assert k2 != k
    s.mesh_state[mesh_key(MESHES[1])].forbidden.append({"g": "s1"})
    assert s.ilp_inputs_key(MESHES[1]) != k2
    assert s.anneal_reserve == 2.0 and s.scales.attention is s.learned.attention_scale


def test_unmeasured_meshes_take_the_pooled_kind_ratios():
    s = _state()
    rec = new_record(1)
    feedback.transfer_costs(s, rec)          # nothing pooled yet: nothing moves
    assert rec.changes == [] and "transferred" not in rec.feedback
    s.learned.kind_pool["all-reduce"] = [2.0, 1.0]
    s.learned.kind_pool["all-to-all"] = [0.0, 0.0]           # no weight: not a ratio
    s.mesh_state[mesh_key(MESHES[0])].measured = True
    feedback.transfer_costs(s, rec)
    assert rec.feedback["transferred"] == {"meshes": ["x2xy4"],
                                              "ratio_to_default": {"all-reduce": 2.0}}
    st = s.mesh_state[mesh_key(MESHES[1])]
    assert all(st.costs.beta_by_kind[a] == {**st.default.beta_by_kind.get(a, {}),
                                            "all-reduce": 2.0 * b}
               for a, b in st.default.beta_s_per_byte.items())
    assert rec.changes[0].startswith("meshes x2xy4 (no ILP layout compiled yet)")
    assert s.mesh_state[mesh_key(MESHES[0])].costs == s.mesh_state[mesh_key(MESHES[0])].default


def test_fitted_attention_scales_replace_the_given_ones_node_by_node():
    given = Calibration(TGT.name, attention_scale={"*": {"gather": 2.0}, "a1": {"ring": 5.0}})
    s = _state(given)
    rec = new_record(1)
    feedback.attention_scale(s, rec)         # no sample: the given scales stay
    assert s.scales.attention == {"*": {"gather": 2.0}, "a1": {"ring": 5.0}} and rec.changes == []
    s.scales.attention_fit = [AttentionSample("a1", "gather", 1e-3, 3e-3),
                       AttentionSample("a2", "gather", 1e-3, 1e-3)]
    feedback.attention_scale(s, rec)
    assert s.scales.attention["a1"] == {"ring": 5.0, "gather": pytest.approx(3.0)}
    assert s.scales.attention["*"] == {"gather": pytest.approx(2.0)}        # pooled: 4 / 2
    assert s.scales.attention["a2"] == {"gather": pytest.approx(1.0)}
    assert s.learned.attention_scale is s.scales.attention
    assert rec.feedback["attention"]["a1"]["gather"]["samples"] == 1
    assert any(c.startswith("attention a1 (keys/values gathered)") for c in rec.changes)
    assert not any(c.startswith("attention *") for c in rec.changes)


def test_the_other_ops_scale_moves_only_past_one_percent():
    s = _state()
    rec = new_record(1)
    s.learned.compute_pool[:] = [1.005, 1.0]
    feedback.compute_scale(s, 1, [], rec)
    assert s.scales.compute == 1.0 and rec.changes == []
    s.learned.compute_pool[:] = [3.0, 1.0]
    feedback.compute_scale(s, 1, [], rec)
    assert s.scales.compute == pytest.approx(3.0)
    assert rec.changes[0].endswith("the ILP scales it by 3.000 (was 1.000)")


def test_the_first_seeded_iteration_keeps_one_compile_for_the_feedback():
    from types import SimpleNamespace as NS

    from aoizora.planning.loop import feedback_reserve

    def state(n, iters=4):
        return NS(budget=NS(compiles=n), settings=NS(max_iterations=iters))
    assert feedback_reserve(state(4), seeded=True) == 1
    assert feedback_reserve(state(3), seeded=True) == 1
    assert feedback_reserve(state(2), seeded=True) == 0      # a seed and the ILP's first
    assert feedback_reserve(state(4), seeded=False) == 0     # no seeds, or a later iteration
    assert feedback_reserve(state(None), seeded=True) == 0   # a time budget: the clock decides
    assert feedback_reserve(state(4, iters=1), seeded=True) == 0
