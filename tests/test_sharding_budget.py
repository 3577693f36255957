"""The sharding ILP's time limit is a wall-clock budget for the whole solve: when the MIP solver
cannot run or is cut, the answer is the coordinate-descent incumbent (or the LP relaxation's),
marked not proven unless a bound proves it; never worse than the incumbent; honest certificates.

Which path a solve takes depends on the time left (``CBC_MIN_S_PER_NONZERO`` and
``HIGHS_LP_MIN_S_PER_NONZERO`` against the model's size); the tests set those thresholds to force
a path, so they check behaviour, not the machine's speed."""

import time

import pytest

from aoizora.formulation.sharding_ilp import TIME_SCALE, evaluate
from aoizora.solvers import sharding
from aoizora.solvers.sharding import (ShardingProblem, ShardingSolveError, available_solvers,
                                      solve_sharding)
from aoizora.solvers.sharding_heuristics import build_instance, coordinate_descent

# the 2-layer MLP of test_sharding_ilp with 150 MB per device: memory rows bind
BUDGET = 150e6
MESH = {"x": 2, "y": 2}


# mlp_ir and v5e4: the shared 2-layer MLP fixtures of tests/conftest.py


@pytest.fixture(scope="module")
def optimum(mlp_ir, v5e4):
    """The proven optimum (seconds) at a generous limit, where CBC runs as before."""
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=30.0, solver="cbc")
    assert r.certificate.status == "OPTIMAL"
    assert r.certificate.detail["answer_from"] == "solver"
    return r


@pytest.fixture()
def no_solver(monkeypatch):
    """As if the budget left no time for a MIP solver nor for the LP relaxation."""
    monkeypatch.setattr(sharding, "CBC_MIN_S_PER_NONZERO", 1e3)
    monkeypatch.setattr(sharding, "HIGHS_LP_MIN_S_PER_NONZERO", 1e3)


def test_no_time_for_the_solver_gives_the_incumbent_not_proven(mlp_ir, v5e4, optimum, no_solver):
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET), time_limit_s=2.0)
    c = r.certificate
    assert c.status == "FEASIBLE" and not c.proven_optimal
    assert c.bound is None and c.gap is None
    assert c.detail["answer_from"] == "incumbent"
    assert "highs_skipped" in c.detail and "lp_skipped" in c.detail and "not proven" in c.detail["note"]
    assert c.time_s > 0 and c.time_limit_s == 2.0
    # the incumbent is the descent's answer (two deterministic starts), priced as the ILP prices it
    inst = build_instance(mlp_ir, v5e4, MESH, hbm_bytes=BUDGET)
    h = coordinate_descent(inst, time_limit_s=30.0, max_restarts=1)
    assert c.objective == pytest.approx(h.objective, rel=1e-12)
    assert c.objective == pytest.approx(r.best.predicted["total_s"], rel=1e-12)
    assert r.best.peak_bytes <= BUDGET
    assert c.objective >= optimum.certificate.objective * (1 - 1e-9)
    # same inputs and seed: the same answer
    r2 = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET), time_limit_s=2.0)
    assert r2.best.choice == r.best.choice and r2.certificate.objective == c.objective


@pytest.mark.skipif("highs" not in available_solvers(), reason="highspy not installed")
def test_lp_relaxation_when_cbc_does_not_fit(mlp_ir, v5e4, optimum, monkeypatch):
    monkeypatch.setattr(sharding, "CBC_MIN_S_PER_NONZERO", 1e3)
    monkeypatch.setattr(sharding, "HIGHS_LP_MIN_S_PER_NONZERO", 0.0)
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=10.0, solver="cbc")
    c = r.certificate
    assert "LP relaxation" in c.solver and "cbc_skipped" in c.detail
    assert c.bound is not None and c.bound <= c.objective * (1 + 1e-9)
    # the relaxation's value bounds the MIP optimum from below
    assert c.bound <= optimum.certificate.objective * (1 + 1e-9)
    if c.status == "OPTIMAL":      # proven by its own bound: the MIP optimum
        assert c.objective == pytest.approx(optimum.certificate.objective, rel=1e-9)
        assert c.detail["proof"]
    else:
        assert c.status == "FEASIBLE" and "not proven" in c.detail["note"]
    assert r.best.peak_bytes <= BUDGET
    r2 = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                        time_limit_s=10.0, solver="cbc")
    assert r2.best.choice == r.best.choice and r2.certificate.bound == c.bound


def test_cut_solver_never_worse_than_the_incumbent(mlp_ir, v5e4, optimum, monkeypatch):
    """A solver stopped by the budget with a worse layout: the incumbent is returned, with the
    solver's bound, not proven."""
    inst = build_instance(mlp_ir, v5e4, MESH, hbm_bytes=BUDGET)
    inc = coordinate_descent(inst, time_limit_s=30.0, max_restarts=1).objective * TIME_SCALE
    bound = optimum.certificate.objective * TIME_SCALE * 0.5

    def cut_cbc(prob, deadline, seed, threads):     # a worse answer and a weak bound
        return {"status": "FEASIBLE", "objective": inc * 1.5, "bound": bound,
                "solver": "PuLP/CBC", "detail": {"cbc_result": "Stopped on time limit"}}

    monkeypatch.setattr(sharding, "run_cbc", cut_cbc)
    monkeypatch.setattr(sharding, "CBC_MIN_S_PER_NONZERO", 0.0)
    monkeypatch.setattr(sharding, "HIGHS_LP_MIN_S_PER_NONZERO", 1e3)   # CBC's answer alone
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=5.0, solver="cbc")
    c = r.certificate
    assert c.status == "FEASIBLE" and c.detail["answer_from"] == "incumbent"
    assert c.objective == pytest.approx(inc / TIME_SCALE, rel=1e-12)
    assert c.bound == pytest.approx(bound / TIME_SCALE, rel=1e-12)
    assert 0 < c.gap < 1 and "not proven" in c.detail["note"]
    idx = {g: [s.name for s in inst.graph.groups[g].strategies].index(n) for g, n in r.best.choice.items()}
    assert evaluate(inst.graph, idx)["total_s"] == pytest.approx(c.objective, rel=1e-12)

    # a bound that meets the incumbent proves it
    def tight_cbc(prob, deadline, seed, threads):
        return {"status": "FEASIBLE", "objective": inc * 1.5, "bound": inc,
                "solver": "PuLP/CBC", "detail": {}}

    monkeypatch.setattr(sharding, "run_cbc", tight_cbc)
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=5.0, solver="cbc")
    assert r.certificate.status == "OPTIMAL" and r.certificate.detail["answer_from"] == "incumbent"
    assert r.certificate.bound == r.certificate.objective


def test_cbc_killed_at_the_deadline(mlp_ir, v5e4):
    """A CBC process still running at the deadline is killed: no answer (UNKNOWN), said so."""
    inst = build_instance(mlp_ir, v5e4, MESH, hbm_bytes=BUDGET)
    r = sharding.run_cbc(inst.model.prob, time.perf_counter(), 0, 1)
    assert r["status"] == "UNKNOWN" and r["objective"] is None and "killed" in r["detail"]


@pytest.mark.skipif("highs" not in available_solvers(), reason="highspy not installed")
def test_highs_mip_process_killed_at_the_deadline(mlp_ir, v5e4):
    """HiGHS's MIP runs as a process: one still running at the deadline is killed (no answer,
    UNKNOWN, said so), as CBC's is; with time, it proves the optimum."""
    inst = build_instance(mlp_ir, v5e4, MESH, hbm_bytes=BUDGET)
    r = sharding.run_highs(inst.model.prob, time.perf_counter(), 0, 1)
    assert r["status"] == "UNKNOWN" and r["objective"] is None and "killed" in r["detail"]
    r = sharding.run_highs(inst.model.prob, time.perf_counter() + 30.0, 0, 1)
    assert r["status"] == "OPTIMAL" and r["bound"] == r["objective"]
    assert "highs_process_s" in r["detail"] and "killed" not in r["detail"]


def test_incumbent_that_breaks_a_forbidden_combination_is_not_returned(mlp_ir, v5e4, no_solver):
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET), time_limit_s=2.0)
    inst = build_instance(mlp_ir, v5e4, MESH, hbm_bytes=BUDGET)
    combo = {g: n for g, n in r.best.choice.items() if len(inst.graph.groups[g].strategies) > 1}
    with pytest.raises(ShardingSolveError) as e:
        solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET, forbidden=[combo]),
                       time_limit_s=2.0)
    assert e.value.certificate.status == "UNKNOWN"
    assert "incumbent_note" in e.value.certificate.detail


def test_k_best_alternatives_share_the_budget(mlp_ir, v5e4, monkeypatch, jumping_clock):
    """The K-1 alternatives get what the best left; none when it ran out, and the best says so."""
    real = sharding.solve_model

    def slow(*a, **kw):           # the best's solve uses up the whole budget
        out = real(*a, **kw)
        jumping_clock.sleep(max(0.0, kw["time_limit_s"] - out["time_s"]) + 0.01)
        return out

    monkeypatch.setattr(sharding, "solve_model", slow)
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=0.5, k_best=3)
    assert r.alternatives == []
    assert "k_best_note" in r.certificate.detail
    monkeypatch.setattr(sharding, "solve_model", real)
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=30.0, k_best=3)
    assert len(r.alternatives) == 2 and "k_best_note" not in r.certificate.detail


@pytest.mark.skipif("highs" not in available_solvers(), reason="highspy not installed")
def test_short_budget_lp_first_then_cbc(mlp_ir, v5e4, optimum, monkeypatch):
    """A budget under twice CBC's minimum: the LP relaxation first; on this instance its solution
    is fractional, so CBC runs on what is left and proves the optimum."""
    inst = build_instance(mlp_ir, v5e4, MESH, hbm_bytes=BUDGET)
    nnz = sharding._nonzeros(inst.model.prob)
    monkeypatch.setattr(sharding, "CBC_MIN_S_PER_NONZERO", 10.0 / nnz / 1.5)   # CBC "needs" 6.7 s
    monkeypatch.setattr(sharding, "HIGHS_LP_MIN_S_PER_NONZERO", 0.0)
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET),
                       time_limit_s=10.0, solver="cbc")
    c = r.certificate
    assert "short_budget" in c.detail and c.detail["lp_integral"] is False
    assert c.status == "OPTIMAL" and c.detail["answer_from"] == "solver"
    assert c.objective == pytest.approx(optimum.certificate.objective, rel=1e-9)


@pytest.mark.skipif("highs" not in available_solvers(), reason="highspy not installed")
def test_default_lp_first_then_highs_mip(mlp_ir, v5e4, optimum):
    """The default path: the LP relaxation (fractional on this instance), then HiGHS's MIP on the
    time left proves the same optimum as CBC; the LP's value is a bound below it."""
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET), time_limit_s=30.0)
    c = r.certificate
    assert c.detail["lp_integral"] is False and "lp_relaxation_s" in c.detail
    assert c.status == "OPTIMAL" and c.detail["answer_from"] == "solver"
    assert "HiGHS" in c.solver and "CBC" not in c.solver
    assert c.objective == pytest.approx(optimum.certificate.objective, rel=1e-9)
    r2 = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET), time_limit_s=30.0)
    assert r2.best.choice == r.best.choice


@pytest.mark.skipif("highs" not in available_solvers(), reason="highspy not installed")
def test_cut_highs_keeps_the_better_of_lp_rounding_and_incumbent(mlp_ir, v5e4, optimum,
                                                                   monkeypatch):
    """HiGHS's MIP stopped by its time limit with a worse layout and a weak bound: the answer is
    the best of the LP rounding and the incumbent, with the LP's bound (the stronger), not
    proven unless that bound meets it."""
    real = sharding.run_highs
    weak = optimum.certificate.objective * TIME_SCALE * 0.1

    def cut_mip(prob, deadline, seed, threads, mip=True):
        if not mip:
            return real(prob, deadline, seed, threads, mip=False)
        return {"status": "FEASIBLE", "objective": 1e30, "bound": weak,
                "solver": "PuLP/HiGHS", "detail": {"highs_status": "Time limit reached"}}

    monkeypatch.setattr(sharding, "run_highs", cut_mip)
    r = solve_sharding(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=BUDGET), time_limit_s=5.0)
    c = r.certificate
    assert c.detail["answer_from"] in ("lp-relaxation", "incumbent")
    assert c.objective >= optimum.certificate.objective * (1 - 1e-9)
    assert optimum.certificate.objective * 0.1 < c.bound <= optimum.certificate.objective * (1 + 1e-9)
    if c.status != "OPTIMAL":
        assert "stopped at the budget" in c.detail["note"] and "not proven" in c.detail["note"]
