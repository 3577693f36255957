"""The planning run's one budget (``solvers.budget``): one clock, named shares from one table,
children made when a step starts, CP-SAT's work derived from a share's seconds."""

import math

import pytest

import aoizora.solvers.budget as B
from aoizora.solvers.work_budget import WALL_CAP, WORK_PER_S, WorkBudget


@pytest.fixture
def fake_clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(B, "clock", lambda: now[0])
    return now


def test_each_share_follows_its_row(fake_clock):
    b = B.Budget(300.0)
    fake_clock[0] += 100.0                      # 200 s left
    assert b.left() == 200.0 and b.elapsed() == 100.0
    assert b.share_s("ilp") == pytest.approx(0.4 * 200)
    # one placement: min(placement_time_s, 0.25 x left), at least 0.5 s
    assert b.share_s("placement", 10.0) == 10.0
    fake_clock[0] += 180.0                      # 20 s left
    assert b.share_s("placement", 10.0) == pytest.approx(5.0)
    assert b.share_s("step_choice", 10.0) == pytest.approx(2.0)     # 0.1 x 20 < 0.3 x 10 = 3
    fake_clock[0] += 19.0                       # 1 s left
    assert b.share_s("placement", 10.0) == 0.5 and b.share_s("step_choice", 10.0) == 0.5
    assert b.share_s("final_descent") == 1.0
    fake_clock[0] += 5.0                        # past the deadline
    assert b.over() and b.share_s("final_descent") == 0.2
    # the reserve is a share of the total, not of the time left
    assert b.share_s("reserve", 10.0) == 20.0 and b.share_s("reserve", 100.0) == 30.0


def test_a_child_is_a_budget_of_its_own_from_now(fake_clock):
    b = B.Budget(100.0)
    fake_clock[0] += 50.0
    ilp = b.child("ilp")
    assert ilp.start == fake_clock[0] and ilp.total_s == pytest.approx(20.0)
    assert ilp.deadline == pytest.approx(fake_clock[0] + 20.0)
    fake_clock[0] += 15.0
    # one ILP: min(ilp_time_s, what the ILP share has left), at least 1 s
    assert ilp.share_s("ilp_solve", 20.0) == pytest.approx(5.0)
    assert ilp.share_s("ilp_solve", 2.0) == 2.0
    ilp.extend(3.0)                             # the share moves by a wait
    assert ilp.left() == pytest.approx(8.0)
    fake_clock[0] += 30.0
    assert ilp.share_s("ilp_solve", 20.0) == 1.0
    assert b.left() == pytest.approx(5.0)       # the parent is not moved by its child


def test_annealing_keeps_a_margin_and_starts_only_with_enough_left(fake_clock):
    b = B.Budget(10.0)
    sh = B.share("annealing")
    assert b.affords("annealing") and b.share_s("annealing", 2.0) == 2.0
    assert b.share_s("annealing", 30.0) == pytest.approx(9.0)    # the time left less 1 s
    fake_clock[0] += 8.6                        # 1.4 s left: 0.4 s after the margin
    assert not b.affords("annealing")
    assert sh.available_s(b.left(), b.total_s) == pytest.approx(0.4)


def test_compile_margins_count_what_fits(fake_clock):
    b = B.Budget(10.5)
    # 10.5 s less a 2 s reserve, each compile 1.2 x 0.5 + 1 s: 5
    assert b.count("compile", 0.5, reserve_s=2.0) == 5
    assert b.count("compile", 9.0) == 0
    assert b.fits("verify", 8.0) and not b.fits("verify", 8.4)    # 1.2 x 8 + 0.5 = 10.1


def test_cp_sat_work_derives_from_the_seconds(fake_clock):
    w = WorkBudget.of(B.Budget(10.0))
    assert w.work == pytest.approx(10.0 * WORK_PER_S)
    assert w.wall_deadline == pytest.approx(fake_clock[0] + 10.0 * WALL_CAP)


def test_an_unknown_share_is_named():
    with pytest.raises(B.BudgetShareError, match="no budget share 'compiles'; known: ilp"):
        B.Budget(1.0).child("compiles")


def test_the_table_has_no_share_above_the_whole():
    for name, sh in B.SHARES.items():
        assert 0 < sh.fraction <= 1.0, name
        assert sh.floor_s <= sh.cap_s and sh.margin_s >= 0 and sh.least_s >= 0
        assert math.isfinite(sh.seconds(100.0, 100.0, 10.0))
