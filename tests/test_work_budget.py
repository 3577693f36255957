"""The placement's work budget (``solvers.work_budget``): CP-SAT's deterministic time decides
where a solve stops, the clock only guards it, and the plan says when the guard decided."""

import time

import pytest
from ortools.sat.python import cp_model

from aoizora.planning import time_limits
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.targets import get_target
from aoizora.formulation.placement_cpsat import PlacementModel
from aoizora.solvers import placement as P
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.work_budget import WORK_PER_S, WorkBudget
from test_placement import layer_evidence


@pytest.fixture(scope="module")
def inst():
    tgt = get_target("v5e:4x4")
    net = Network.from_target(tgt)
    ev = layer_evidence((2, 8), "v5e:4x4", permute=True)
    return ev, net, default_device_order(tgt, ev.mesh_axes)


def test_a_child_charges_its_parent_and_takes_a_share_of_what_is_left():
    b = WorkBudget.for_limit(10.0)
    assert b.work == pytest.approx(10.0 * WORK_PER_S) and b.left() == b.work
    b.charge_seconds(2.0)
    c = b.child(100.0)                       # at most what is left
    assert c.work == pytest.approx(8.0 * WORK_PER_S)
    c.charge(0.5)
    assert c.used == 0.5 and b.used == pytest.approx(2.0 * WORK_PER_S + 0.5)
    assert c.root() is b and b.affords_seconds(1.0) and not c.affords_seconds(1e6)


def test_the_guard_is_recorded_only_when_it_stops_a_solve(inst):
    ev, net, d = inst
    pm = PlacementModel(ev, net)
    pm.model.Minimize(pm.obj_comm)
    # the work stops it: repeatable, nothing recorded
    b = WorkBudget(work=0.05, wall_deadline=time.perf_counter() + 600)
    s = cp_model.CpSolver()
    assert b.limit(s) == pytest.approx(0.05)
    st = s.Solve(pm.model)
    b.account(s, st, "the joint model")
    assert b.used == pytest.approx(s.deterministic_time) and b.wall_cut == []
    # the clock stops it long before its work: recorded on the root budget
    root = WorkBudget(work=1e6, wall_deadline=time.perf_counter() + 600)
    child = root.child(1e6)
    child.wall_deadline = time.perf_counter() + 0.3   # well past CP-SAT's fixed start-up
    s = cp_model.CpSolver()
    child.limit(s)
    st = s.Solve(pm.model)
    child.account(s, st, "the joint model")
    assert st not in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
    assert root.wall_cut == ["the joint model"]
    child.account(s, st, "the joint model")            # once per part, however often
    assert root.wall_cut == ["the joint model"]


def test_a_placement_does_not_depend_on_the_clock(inst, monkeypatch):
    """The same instance, seed and limit, once on the real clock and once on a clock ten times
    slower (every wall-clock reading moves slowly, so a wall-clock share would give each step
    ten times more): the same placement, levels, bounds and work, and the guard never stopped
    anything. The instance is not proven within its budget, so the budget decides the answer."""
    ev, net, d = inst
    a = P.solve_placement(ev, net, time_limit_s=2.0, seed=0, hint=d)
    real = time.perf_counter
    t_first = real()
    monkeypatch.setattr(time, "perf_counter", lambda: t_first + (real() - t_first) / 10)
    b = P.solve_placement(ev, net, time_limit_s=2.0, seed=0, hint=d)
    monkeypatch.undo()
    ca, cb = a.certificate, b.certificate
    assert ca.status == "FEASIBLE" and ca.detail["levels"]["comm"]["status"] == "FEASIBLE"
    assert a.placement == b.placement and ca.objective == cb.objective and ca.bound == cb.bound
    for c in (ca, cb):
        assert c.detail["work"]["wall_cut"] == []
        assert c.detail["work"]["used"] >= 0.99 * c.detail["work"]["work"]
    assert ca.detail["work"]["used"] == cb.detail["work"]["used"]
    assert ca.detail["levels"]["comm"] == {**cb.detail["levels"]["comm"],
                                           "done_at_s": ca.detail["levels"]["comm"]["done_at_s"]}
    # not proven, yet repeatable: not a time limit in the plan's sense
    assert time_limits.placement("placement", ca, asked_s=2.0) == []


def test_what_the_plan_says_about_a_placement_the_clock_decided():
    def cert(work, limit=10.0):
        return Certificate("CP-SAT 9.15", "FEASIBLE", 1e-3, 5e-4, 10.0, time_limit_s=limit,
                             detail={"levels": {"comm": {"status": "FEASIBLE"}}, "work": work})
    w = {"work": 4.0, "used": 2.0, "wall_cut": ["the split proof"]}
    assert time_limits.placement("placement of L", cert(w)) == [
        "placement of L: the clock stopped the split proof before its work budget "
        "(10.0 s limit)"]
    # the time left cut its limit below the planner's placement_time_s
    assert time_limits.placement("placement of L", cert(dict(w, wall_cut=[]), 4.0),
                                 asked_s=10.0) == [
        "placement of L: its limit cut to 4.0 s of 10.0 s by the time budget left"]


def test_a_placement_proven_under_a_cut_limit_is_not_time_limited():
    """The time left cut the limit, yet CP-SAT proved its answer: the limit did not change it."""
    cert = P.Certificate("CP-SAT 9.15", "OPTIMAL", 1e-3, 1e-3, 4.0, time_limit_s=4.0,
                         detail={"levels": {"comm": {"status": "OPTIMAL"}},
                                 "work": {"work": 1.6, "used": 0.3, "wall_cut": []}})
    assert time_limits.placement("placement of L", cert, asked_s=10.0) == []
    cert.status = "FEASIBLE"
    assert time_limits.placement("placement of L", cert, asked_s=10.0) == [
        "placement of L: its limit cut to 4.0 s of 10.0 s by the time budget left"]
