"""Heuristic sharding searches price a layout exactly as the ILP does, never beat its proven
optimum, never return a layout over the memory budget, and are deterministic for a seed."""

import pytest

from aoizora.formulation.sharding_ilp import TIME_SCALE, chosen, evaluate, peak_memory
from aoizora.solvers.sharding import ShardingProblem, run_solver, solve_sharding
from aoizora.solvers.sharding_heuristics import (SEARCHES, ShardingHeuristicError, annealing,
                                                 build_instance, coordinate_descent, exhaustive,
                                                 random_search)

# the 2-layer MLP of test_sharding_ilp: with 150 MB per device the replicated weights (268 MB)
# do not fit, so memory rows bind (Megatron column-then-row split is the optimum)
BUDGET = 150e6


# mlp_ir and v5e4: the shared 2-layer MLP fixtures of tests/conftest.py


@pytest.fixture(scope="module")
def tight(mlp_ir, v5e4):
    """(instance, ILP objective s, ILP choice) on a 4-chip line with the tight budget."""
    inst = build_instance(mlp_ir, v5e4, {"x": 4}, hbm_bytes=BUDGET)
    r = run_solver(inst.model.prob, "cbc", 30.0, 0, 1)
    assert r["status"] == "OPTIMAL"
    return inst, r["objective"] / TIME_SCALE, chosen(inst.model)


@pytest.mark.parametrize("mesh,budget", [({"x": 4}, BUDGET), ({"x": 4}, None), ({"x": 2, "y": 2}, BUDGET)])
def test_price_of_the_ilp_choice_is_its_objective(mlp_ir, v5e4, mesh, budget):
    inst = build_instance(mlp_ir, v5e4, mesh, hbm_bytes=budget)
    r = run_solver(inst.model.prob, "cbc", 30.0, 0, 1)
    ch = chosen(inst.model)
    c = inst.from_choice(ch)
    assert inst.objective(c) == pytest.approx(r["objective"] / TIME_SCALE, rel=1e-9)
    assert inst.objective(c) == pytest.approx(evaluate(inst.graph, ch)["total_s"], rel=1e-12)
    assert inst.rows(c).max() == pytest.approx(peak_memory(inst.model, ch), rel=1e-12)
    assert inst.feasible(c)
    # the batch pricer and the single-move delta agree with the full price
    obj, peak = inst.batch(c[None, :])
    assert obj[0] == pytest.approx(inst.objective(c), rel=1e-12)
    i = int(inst.free[-1])
    k = (int(c[i]) + 1) % int(inst.K[i])
    c2 = c.copy()
    c2[i] = k
    assert inst.objective(c) + inst.move_delta(c, i, k) == pytest.approx(inst.objective(c2), rel=1e-12)
    d, rows = inst.move_deltas(c, inst.rows(c), i)
    assert d[k] == pytest.approx(inst.move_delta(c, i, k), rel=1e-12, abs=1e-18)
    assert rows[:, k] == pytest.approx(inst.rows(c2), rel=1e-12)


def test_same_instance_as_solve_sharding(mlp_ir, v5e4, tight):
    inst, obj, ch = tight
    r = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=BUDGET))
    assert r.certificate.objective == pytest.approx(obj, rel=1e-9)
    names = {g: inst.graph.groups[g].strategies[k].name for g, k in ch.items()}
    assert inst.objective(inst.from_choice(
        {g: [s.name for s in inst.graph.groups[g].strategies].index(n) for g, n in r.best.choice.items()}
    )) == pytest.approx(obj, rel=1e-9)
    assert set(names) == set(r.best.choice)


def test_exhaustive_finds_the_ilp_optimum(tight):
    inst, obj, _ = tight
    assert inst.space_size() < 10_000
    e = exhaustive(inst, time_limit_s=60.0)
    assert e.certificate.status == "OPTIMAL" and e.certificate.gap == 0.0
    assert e.certificate.detail["complete"] and e.evaluated == inst.space_size()
    assert e.objective == pytest.approx(obj, rel=1e-9)
    assert e.peak_bytes <= BUDGET
    assert peak_memory(inst.model, e.choice) <= BUDGET


def test_exhaustive_refuses_a_large_space(mlp_ir, v5e4):
    inst = build_instance(mlp_ir, v5e4, {"x": 2, "y": 2}, hbm_bytes=BUDGET)
    with pytest.raises(ShardingHeuristicError, match="max_states"):
        exhaustive(inst, max_states=1000)


def test_exhaustive_proves_infeasibility(mlp_ir, v5e4):
    inst = build_instance(mlp_ir, v5e4, {"x": 4}, hbm_bytes=20e6)   # below a quarter of the weights
    e = exhaustive(inst, time_limit_s=60.0)
    assert e.certificate.status == "INFEASIBLE" and e.choice is None and e.objective is None


@pytest.mark.parametrize("name", sorted(SEARCHES))
def test_heuristics_never_beat_the_optimum_nor_break_memory(mlp_ir, v5e4, name):
    for mesh in ({"x": 4}, {"x": 2, "y": 2}):
        inst = build_instance(mlp_ir, v5e4, mesh, hbm_bytes=BUDGET)
        r = run_solver(inst.model.prob, "cbc", 30.0, 0, 1)
        assert r["status"] == "OPTIMAL"
        opt = r["objective"] / TIME_SCALE
        caps = {"random": {"max_samples": 3000}, "descent": {"max_restarts": 20},
                "annealing": {"max_steps": 3000}, "metropolis": {"max_steps": 5000}}[name]
        res = SEARCHES[name](inst, time_limit_s=30.0, seed=1, **caps)
        c = res.certificate
        assert c.status == "FEASIBLE" and c.bound is None and c.gap is None
        assert res.objective >= opt * (1 - 1e-9)
        assert res.objective == pytest.approx(evaluate(inst.graph, res.choice)["total_s"], rel=1e-12)
        assert peak_memory(inst.model, res.choice) <= BUDGET
        assert res.peak_bytes <= BUDGET
        # the trace improves and ends at the answer
        vals = [v for _, v in res.trace]
        assert vals == sorted(vals, reverse=True)
        assert vals[-1] == pytest.approx(res.objective, rel=1e-12)
        assert all(v >= opt * (1 - 1e-9) for v in vals)


def test_descent_and_annealing_reach_the_optimum_on_the_small_instance(tight):
    inst, obj, _ = tight
    for res in (coordinate_descent(inst, time_limit_s=30.0, max_restarts=50),
                annealing(inst, time_limit_s=30.0, max_steps=5000),
                annealing(inst, time_limit_s=30.0, max_steps=20000, moves="metropolis")):
        assert res.objective == pytest.approx(obj, rel=1e-9), res.search
        assert res.time_to_reach(obj) is not None


@pytest.mark.parametrize("fn,caps", [(random_search, {"max_samples": 2000}),
                                     (coordinate_descent, {"max_restarts": 10}),
                                     (annealing, {"max_steps": 2000}),
                                     (annealing, {"max_steps": 4000, "moves": "metropolis"})])
def test_same_seed_same_answer(mlp_ir, v5e4, fn, caps):
    inst = build_instance(mlp_ir, v5e4, {"x": 2, "y": 2}, hbm_bytes=BUDGET)
    a = fn(inst, time_limit_s=30.0, seed=3, **caps)
    b = fn(inst, time_limit_s=30.0, seed=3, **caps)
    assert a.choice == b.choice and a.objective == b.objective
    assert [v for _, v in a.trace] == [v for _, v in b.trace]
    assert a.evaluated == b.evaluated


def test_unknown_moves_is_an_error(tight):
    with pytest.raises(ShardingHeuristicError, match="heat-bath"):
        annealing(tight[0], moves="gibbs", max_steps=10)


def test_random_search_is_seed_dependent(mlp_ir, v5e4):
    inst = build_instance(mlp_ir, v5e4, {"x": 2, "y": 2}, hbm_bytes=BUDGET)
    traces = {tuple(v for _, v in random_search(inst, time_limit_s=30.0, seed=s, max_samples=300).trace)
              for s in range(4)}
    assert len(traces) > 1


def test_nothing_feasible_is_unknown_not_an_answer(mlp_ir, v5e4):
    inst = build_instance(mlp_ir, v5e4, {"x": 4}, hbm_bytes=20e6)
    for res in (random_search(inst, time_limit_s=30.0, max_samples=500),
                coordinate_descent(inst, time_limit_s=30.0, max_restarts=3),
                annealing(inst, time_limit_s=30.0, max_steps=500),
                annealing(inst, time_limit_s=30.0, max_steps=500, moves="metropolis")):
        assert res.certificate.status == "UNKNOWN"
        assert res.choice is None and res.objective is None and res.trace == []
