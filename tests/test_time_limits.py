"""Where a time limit decided a planning run: what `aoizora.planning.time_limits` reads from the solvers'
certificates (the plan's side: tests/test_plan_file.py, tests/test_planner.py)."""

from aoizora.planning import time_limits
from aoizora.solvers.certificate import Certificate


def _placement(levels, cut=None):
    detail = {"levels": {k: {"status": v} for k, v in levels.items()}}
    if cut is not None:
        detail["step_choice"] = {"descent_cut": cut}
    return Certificate("CP-SAT 9.15", "OPTIMAL", 1e-3, 1e-3, 0.2, time_limit_s=10.0,
                       detail=detail)


PROVEN = {"comm": "OPTIMAL", "link_bytes": "OPTIMAL", "hops": "OPTIMAL"}


def test_a_proof_is_not_time_limited():
    assert time_limits.sharding("ILP", Certificate("HiGHS", "OPTIMAL", 1.0, 1.0, 0.1)) == []
    assert time_limits.placement("placement", _placement(PROVEN)) == []
    # a descent stopped by its evaluation cap is repeatable
    assert time_limits.placement("placement", _placement(PROVEN, "evaluation cap (4000)")) == []
    assert time_limits.sharding("ILP", None) == [] and time_limits.placement("p", None) == []


def test_an_ilp_stopped_by_its_limit_is_named_with_its_gap():
    cert = Certificate("HiGHS", "FEASIBLE", 1.0, 0.9, 20.0, time_limit_s=20.0,
                       detail={"k_best_note": "1 of the 2 best layouts asked: the budget of "
                                              "20.0 s ran out"})
    out = time_limits.sharding("sharding ILP on mesh 2x4", cert)
    assert out == ["sharding ILP on mesh 2x4: FEASIBLE at its 20.0 s limit, gap 10.00%",
                   "sharding ILP on mesh 2x4: 1 of the 2 best layouts asked: the budget of "
                   "20.0 s ran out"]


def test_a_placement_not_proven_on_every_level_is_named():
    out = time_limits.placement("placement of mesh 4x4 L", _placement(
        {"comm": "OPTIMAL", "link_bytes": "skipped: no time left"}, "time limit"))
    assert out == ["placement of mesh 4x4 L: CP-SAT 9.15 not proven on every level in its 10.0 s "
                   "limit (link_bytes skipped: no time left)",
                   "placement of mesh 4x4 L: the swap descent stopped at its time limit"]
    # no CP-SAT model (a heuristic's answer): no level is proven
    heuristic = Certificate("annealing", "FEASIBLE", 1e-3, None, 5.0, time_limit_s=5.0)
    assert "(comm not proven)" in time_limits.placement("p", heuristic)[0]
    # the incumbent met the analytic bound: link load proven, the tie-breaks not attempted
    analytic = Certificate("CP-SAT 9.15", "OPTIMAL", 1e-3, 1e-3, 0.1, time_limit_s=10.0,
                           detail={"method": "CP-SAT not needed", "levels": {
                               "comm": {"status": "OPTIMAL", "by": "analytic bound"}}})
    assert time_limits.placement("p", analytic) == []
