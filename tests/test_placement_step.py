"""The planner's placement choice by Q2 step (``solvers.placement_step``): never worse than any
placement it is given, honest about the link-load certificate, deterministic."""

import itertools

import numpy as np
import pytest

from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import predict_step
from aoizora.formulation.traffic import TrafficModel, mesh_axis_groups
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.placement import PlacementResult, solve_placement
from aoizora.solvers.placement_step import choose_by_step, step_key


@pytest.fixture(scope="module")
def small():
    """An all-gather of 64 KiB over the 4-wide axis of a 2x4 mesh: link time and hop latency are
    of the same size (a few us), so link load and Q2 step disagree on some placements."""
    net = Network.from_target(get_target("v5e:2x4"))
    ev = Evidence("v5e:2x4", {"a": 2, "b": 4}, collectives=[
        Collective("ag", "all-gather", "bf16", 64 * 1024, mesh_axis_groups((2, 4), [1]),
                   count=10, phase=0)])
    return ev, net, TrafficModel(ev, net)


def _result(ev, net, p, bound):
    q2 = predict_step(ev, p, net)
    cert = Certificate("test", "OPTIMAL", q2.communication_s, bound, 0.0, "s")
    return PlacementResult([int(v) for v in p], cert, q2, [])


def _pair(tm):
    """p1 of less link load but a longer Q2 step than p2 (found in a fixed random sample)."""
    rng = np.random.default_rng(0)
    sample = [rng.permutation(8) for _ in range(200)]
    for p1, p2 in itertools.permutations(sample, 2):
        s1, s2 = tm.scores(p1), tm.scores(p2)
        if s2[0] > s1[0] * (1 + 1e-9) and s2[0] + s2[3] < s1[0] + s1[3]:
            return p1, p2
    pytest.fail("no such pair in the sample")


def test_never_worse_than_any_placement_given(small):
    ev, net, tm = small
    rng = np.random.default_rng(1)
    cands = [rng.permutation(8) for _ in range(5)]
    res = _result(ev, net, rng.permutation(8), bound=0.0)
    out = choose_by_step(ev, net, res, cands, max_evaluations=0)
    best = min(step_key(tm, q)[0] for q in cands + [np.asarray(res.placement)])
    assert step_key(tm, out.placement)[0] == pytest.approx(best, rel=1e-12)
    assert out.q2.step_s == pytest.approx(predict_step(ev, out.placement, net).step_s)


def test_descent_reaches_a_swap_local_optimum(small):
    ev, net, tm = small
    res = _result(ev, net, np.random.default_rng(2).permutation(8), bound=0.0)
    out = choose_by_step(ev, net, res, [], max_evaluations=10_000, time_limit_s=60)
    assert out.certificate.detail["step_choice"]["descent_cut"] is None
    p = np.asarray(out.placement)
    s = step_key(tm, p)[0]
    for i, j in itertools.combinations(range(8), 2):
        q = p.copy()
        q[i], q[j] = q[j], q[i]
        assert step_key(tm, q)[0] >= s - 1e-15


def test_a_lower_step_with_more_link_load_is_no_longer_proven(small):
    ev, net, tm = small
    p1, p2 = _pair(tm)
    res = _result(ev, net, p1, bound=tm.scores(p1)[0])   # p1 "proven" optimal in link load
    out = choose_by_step(ev, net, res, [p2], max_evaluations=0)
    assert out.placement == [int(v) for v in p2]
    c = out.certificate
    assert c.status == "FEASIBLE" and c.gap > 0
    assert c.objective == pytest.approx(out.q2.communication_s)
    assert c.detail["step_choice"]["changed"] is True
    assert res.certificate.status == "OPTIMAL" and "notes" not in res.certificate.detail


def test_equal_link_load_keeps_the_proof(small):
    ev, net, tm = small
    res = solve_placement(ev, net, time_limit_s=10, seed=0)
    assert res.certificate.status == "OPTIMAL"
    out = choose_by_step(ev, net, res, res.candidates)
    assert step_key(tm, out.placement) <= step_key(tm, res.placement)
    comm = tm.scores(out.placement)[0]
    meets = (comm <= res.certificate.bound * (1 + 1e-12)
             or comm <= res.certificate.objective * (1 + 1e-12) + 1e-15)
    assert (out.certificate.status == "OPTIMAL") == meets
    assert out.certificate.bound == res.certificate.bound


def test_equal_link_load_above_a_rounded_bound_keeps_the_proof(small):
    """A certified OPTIMAL answer whose bound sits a little below its objective (the CP-SAT
    model's overlap rounding): a placement of lower step and the same link load is as good as
    the proven optimum, so it stays OPTIMAL; an answer that was only FEASIBLE stays FEASIBLE."""
    ev, net, tm = small
    rng = np.random.default_rng(0)
    sample = [rng.permutation(8) for _ in range(200)]
    p1, p2 = next((a, b) for a, b in itertools.permutations(sample, 2)
                  if tm.scores(a)[0] == tm.scores(b)[0]
                  and step_key(tm, b)[0] < step_key(tm, a)[0])
    res = _result(ev, net, p1, bound=tm.scores(p1)[0] * (1 - 1e-6))
    out = choose_by_step(ev, net, res, [p2], max_evaluations=0)
    assert out.placement != [int(v) for v in p1] and out.certificate.status == "OPTIMAL"
    assert out.certificate.bound == res.certificate.bound
    res.certificate.status = "FEASIBLE"
    assert choose_by_step(ev, net, res, [p2], max_evaluations=0).certificate.status == "FEASIBLE"


def test_deterministic(small):
    ev, net, _ = small
    res = _result(ev, net, np.random.default_rng(3).permutation(8), bound=0.0)
    a = choose_by_step(ev, net, res, [], max_evaluations=50, time_limit_s=60)
    b = choose_by_step(ev, net, res, [], max_evaluations=50, time_limit_s=60)
    assert a.placement == b.placement
    assert a.certificate.detail["step_choice"]["descent_cut"] == "evaluation cap (50)"


def test_a_choice_comes_back_from_the_memo_unless_the_clock_cut_it(small, tmp_path):
    """``SolveMemo.step_choice``: the same choice (placement, record, certificate) for the same
    evidence, network, placements and cap, whatever the result's certificate or the limit; a
    descent the clock cut is never kept."""
    from aoizora.extract.evidence_cache import EvidenceCache
    from aoizora.planning.solve_memo import SolveMemo

    ev, net, _ = small
    calls = []

    def counting(*a, **k):
        calls.append(1)
        return choose_by_step(*a, **k)

    memo = SolveMemo(EvidenceCache(tmp_path))
    choose = memo.step_choice(counting)
    res = _result(ev, net, np.random.default_rng(3).permutation(8), bound=0.0)
    a = choose(ev, net, res, [], max_evaluations=50, time_limit_s=60)
    b = choose(ev, net, res, [], max_evaluations=50, time_limit_s=5)
    assert len(calls) == 1 and memo.hits == 1
    assert b.placement == a.placement and b.q2.step_s == a.q2.step_s
    assert b.certificate.status == a.certificate.status
    assert b.certificate.detail["step_choice"] == {**a.certificate.detail["step_choice"],
                                                   "from_cache": True}
    choose(ev, net, res, [], max_evaluations=49, time_limit_s=60)     # another cap
    assert len(calls) == 2
    other = _result(ev, net, np.random.default_rng(4).permutation(8), bound=0.0)
    cut = choose(ev, net, other, [], max_evaluations=50, time_limit_s=0.0)
    assert cut.certificate.detail["step_choice"]["descent_cut"] == "time limit"
    choose(ev, net, other, [], max_evaluations=50, time_limit_s=0.0)
    assert len(calls) == 4 and memo.kept == 2
