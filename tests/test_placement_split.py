"""The split proof (formulation/placement_split.py, solvers/placement_split.py) against brute force:
its per-class lower bounds hold for every placement, the pinned model is exact in its class, and
the proof finds and proves the enumerated optimum; on the real Wan 2.1 v5e-16 evidence it proves
the optimum over every placement."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from ortools.sat.python import cp_model

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.targets import get_target
from aoizora.formulation.placement_cpsat import SCOPE_SETS, PlacementModel, PlacementModelError
from aoizora.formulation.placement_split import (model_cost_units, phase_maxima,
                                                 set_lower_bounds, split_group)
from aoizora.formulation.traffic import TrafficModel
from aoizora.solvers import placement_heuristics as H
from aoizora.solvers.cpsat_params import set_search_params
from aoizora.solvers.placement import PlacementOptions, solve_placement
from aoizora.solvers.placement_split import split_proof
from aoizora.solvers.work_budget import WorkBudget

from tests.test_placement import layer_evidence

WAN16 = (Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "placement_evidence"
         / "wan2.1-1.3b_480p-81f_cfg2_context_v5e-16.json")


@pytest.fixture(scope="module")
def net44():
    return Network.from_target(get_target("v5e:4x4"))


@pytest.fixture(scope="module")
def net24():
    return Network.from_target(get_target("v5e:2x4"))


@pytest.fixture(scope="module")
def split44(net44):
    """(2, 8) logical mesh on 4x4 with a permute: g* is an axis-1 group of 8 (12,870 sets)."""
    ev = layer_evidence((2, 8), "v5e:4x4", permute=True)
    pm = PlacementModel(ev, net44, formulation="circuit")
    g = split_group(pm)
    return ev, pm, g, set_lower_bounds(pm, g)


def _placements(net, n_ranks, seed, n_random):
    """Axis orders, each with every single swap of two ranks, and random permutations."""
    rng = np.random.default_rng(seed)
    out = []
    for q in H.axis_order_placements(net, (2, n_ranks // 2)):
        q = net.device_chip[q]
        out.append(q)
        for a, b in itertools.combinations(range(n_ranks), 2):
            s = q.copy()
            s[[a, b]] = s[[b, a]]
            out.append(s)
    out += [rng.permutation(n_ranks) for _ in range(n_random)]
    return out


def test_split_group_is_a_ring_group_of_8(split44):
    _, pm, g, sb = split44
    assert len(pm.groups[g]) == 8 and sb.group in ((0, 1, 2, 3, 4, 5, 6, 7),
                                                   (8, 9, 10, 11, 12, 13, 14, 15))
    assert len(sb.sets) == 12870 and sb.phase_lb_units.shape == (12870, len(pm.items))


def test_set_lower_bounds_hold_for_every_placement(split44, net44):
    """phase_lb[S][p] <= M_p(P) and LB(S) <= MC(P) for P with P(g*) = S, over structured and
    random placements; never below the analytic bound, and within 10% of some placements (5.2%
    here)."""
    _, pm, g, sb = split44
    index = {S: i for i, S in enumerate(sb.sets)}
    analytic = sum(k.count * max(0, lb - O)
                   for k, lb, O in zip(pm.traffic.phases, pm.lbM, pm.O_units))
    assert int(sb.lb_units.min()) >= analytic
    closest = 1.0
    for q in _placements(net44, 16, 0, 200):
        i = index[tuple(sorted(int(q[r]) for r in sb.group))]
        M = phase_maxima(pm, q)
        assert all(int(b) <= m for b, m in zip(sb.phase_lb_units[i], M))
        mc = model_cost_units(pm, q)
        assert int(sb.lb_units[i]) <= mc
        closest = min(closest, (mc - int(sb.lb_units[i])) / mc)
    assert closest < 0.1


def test_model_cost_units_is_the_traffic_cost(split44, net44):
    ev, pm, _, _ = split44
    tm = TrafficModel(ev, net44)
    slack = pm.comm_seconds(pm.rounding_units)
    for q in _placements(net44, 16, 1, 20)[::25]:
        c = tm.cost(q)[0]
        mc = pm.comm_seconds(model_cost_units(pm, q))
        assert c - 1e-12 <= mc <= c + slack + 1e-12


def test_cut_bound_of_two_row_blocks(split44, net44):
    """g* on rows 0-1 of 4x4: its 8 all-to-all pairs {i, i + 8} cross 4 links each way, so the
    all-to-all phase loads some link with 2 flows (the analytic bound says 1), and the best
    placement of that class meets it."""
    _, pm, g, sb = split44
    rows01 = tuple(c for c in range(16) if net44.chips[c][0] in (0, 1))
    i = sb.sets.index(rows01)
    p = 0                                           # phase 0: the all-to-all over axis 0
    assert [cls for cls, _, _ in pm.items[p]] == ["a2a"] * 8
    cu = pm.units(pm.items[p][0][2])
    assert pm.lbM[p] == cu and sb.phase_lb_units[i][p] == 2 * cu
    best = min((q for q in _placements(net44, 16, 2, 0)
                if tuple(sorted(int(q[r]) for r in sb.group)) == rows01),
               key=lambda q: phase_maxima(pm, q)[p])
    assert phase_maxima(pm, best)[p] == 2 * cu


def test_pinned_model_is_exact_in_its_class(net24):
    """2x4: the pinned 'sets' model's optimum equals the brute-force minimum over the 4! 4!
    placements with the pinned ranks on the pinned chips, for several chip sets."""
    ev = layer_evidence((2, 4), "v5e:2x4", permute=True)
    tm = TrafficModel(ev, net24)
    ranks = (0, 1, 2, 3)
    for S in [(0, 1, 2, 3), (0, 1, 4, 5), (0, 2, 5, 7), (1, 2, 5, 6)]:
        rest = [c for c in range(8) if c not in S]
        brute = min(tm.cost(np.array(list(a) + list(b)))[0]
                    for a in itertools.permutations(S) for b in itertools.permutations(rest))
        pm = PlacementModel(ev, net24, formulation="sets", symmetry_breaking=False,
                            pin=(ranks, S))
        pm.model.Minimize(pm.obj_comm)
        solver = cp_model.CpSolver()
        set_search_params(solver, 0, 1, True, False)
        solver.parameters.max_time_in_seconds = 60
        assert solver.Solve(pm.model) == cp_model.OPTIMAL
        slack = pm.comm_seconds(pm.rounding_units)
        assert brute - 1e-12 <= pm.comm_seconds(solver.ObjectiveValue()) <= brute + slack + 1e-12
        chips = [next(c for c in range(8) if solver.BooleanValue(pm.x[r][c])) for r in range(8)]
        assert sorted(chips[r] for r in ranks) == list(S)


def test_pin_needs_matching_sizes_and_no_symmetry(net24):
    ev = layer_evidence((2, 4), "v5e:2x4")
    with pytest.raises(PlacementModelError, match="pin"):
        PlacementModel(ev, net24, formulation="sets", symmetry_breaking=False,
                       pin=((0, 1, 2, 3), (0, 1, 2)))
    with pytest.raises(PlacementModelError, match="symmetry"):
        PlacementModel(ev, net24, formulation="sets", pin=((0, 1, 2, 3), (0, 1, 2, 3)))


@pytest.mark.parametrize("permute", [False, True])
def test_split_proof_finds_and_proves_the_enumerated_optimum(net24, permute):
    """2x4 from the worst axis order: the split improves it to the enumerated optimum and proves
    it (no class left open); the bound is the optimum."""
    ev = layer_evidence((2, 4), "v5e:2x4", permute=permute)
    ex = H.exhaustive(ev, net24, time_limit_s=120)
    assert ex.certificate.status == "OPTIMAL"
    tm = TrafficModel(ev, net24)
    worst = max(H.axis_order_placements(net24, (2, 4)), key=lambda q: tm.cost(q))
    assert tm.cost(worst)[0] > ex.certificate.objective * (1 + 1e-6)
    pm = PlacementModel(ev, net24, formulation="circuit")
    sp = split_proof(pm, net24.device_chip[worst], WorkBudget.for_limit(120))
    assert sp is not None and sp.proven and sp.bound_units == sp.cost_units
    slack = pm.comm_seconds(pm.rounding_units)
    opt = ex.certificate.objective
    assert opt - 1e-12 <= pm.comm_seconds(sp.cost_units) <= opt + slack + 1e-12
    assert tm.cost(sp.chip_of_rank)[0] == pytest.approx(opt, rel=1e-12)


def test_wan21_v5e16_proven_over_every_placement():
    """The benchmark instance (Wan 2.1 1.3B, cfg2_context, v5e-16): level 1 proven optimal over
    every placement (not only the circuit formulation's scope), by the split."""
    rec = json.loads(WAN16.read_text())
    ev = Evidence.from_json(rec["evidence"])
    t = get_target("v5e-16")
    net = Network.from_target(t)
    res = solve_placement(ev, net, time_limit_s=60, seed=0, workers=1,
                          hint=default_device_order(t, ev.mesh_axes),
                          options=PlacementOptions(lexicographic=False))
    c = res.certificate
    assert c.status == "OPTIMAL"
    assert c.detail["bound_scope"] == SCOPE_SETS and c.detail["split"]["proven"]
    # equal up to the overlap rounding (< 1 unit per run of a phase whose overlap is not whole)
    pm = PlacementModel(ev, net, formulation="circuit")
    slack = pm.comm_seconds(pm.rounding_units)
    assert c.objective - slack - 1e-15 <= c.detail["bound_every_placement_s"] <= c.objective
    assert slack < 1e-6 * c.objective
    assert c.objective <= TrafficModel(ev, net).cost(
        default_device_order(t, ev.mesh_axes))[0] + 1e-15


def _cut_values(pm, chips):
    """Per phase: the largest right-hand side of pm.cuts[p] at a placement (rank -> chip)."""
    val = pm.hint_values(chips)
    return [max((sum(cf if v is None else cf * val[v] for v, cf in cut) for cut in cuts),
                default=0) for cuts in pm.cuts]


def test_set_cuts_hold_for_every_placement_of_the_class(net44):
    """The pinned 'sets' model on 4x4 (axis-1 group of 8 on rows 0-1): every cut of M[p] (the
    route-aware cuts of the sets included) is at most M_p at placements of the class (random
    ones and axis orders with single swaps), and the route-aware cut of the set rows 0-1 doubles
    the all-to-all phase's bound (8 pair flows each way over the 4 links between rows 1 and 2)."""
    ev = layer_evidence((2, 8), "v5e:4x4", permute=True)
    rows01 = tuple(c for c in range(16) if net44.chips[c][0] in (0, 1))
    rest = [c for c in range(16) if c not in rows01]
    pm = PlacementModel(ev, net44, formulation="sets", symmetry_breaking=False,
                        pin=(range(8), rows01))
    rng = np.random.default_rng(3)
    cands = [np.concatenate([rng.permutation(rows01), rng.permutation(rest)]) for _ in range(100)]
    cands += [q for q in _placements(net44, 16, 4, 0) if sorted(q[:8]) == list(rows01)]
    assert len(cands) > 150
    for chips in cands:
        M = phase_maxima(pm, chips)
        assert all(c <= m for c, m in zip(_cut_values(pm, chips), M))
    # the all-to-all phase (pairs {i, i + 8} across the two halves): 2 flows on some link, lbM 1
    p = 0
    cu = pm.units(pm.items[p][0][2])
    rhs = [max((cf for v, cf in cut if v is not None), default=0) for cut in pm.cuts[p]]
    assert pm.lbM[p] == cu and max(rhs) == 2 * cu


def test_set_cuts_hold_on_the_wan21_v5e16_class_of_the_optimum():
    """The same check on the real evidence (groups of 8, 4 and 2, permutes), pinned to the class
    of the best axis order (ranks 0-7 on its chips): random placements of the class and single
    swaps of the best axis order within it."""
    ev = Evidence.from_json(json.loads(WAN16.read_text())["evidence"])
    net = Network.from_target(get_target("v5e-16"))
    tm = TrafficModel(ev, net)
    best = net.device_chip[min(H.axis_order_placements(net, tuple(ev.mesh_axes.values())),
                               key=tm.cost)]
    S = tuple(sorted(int(c) for c in best[:8]))
    rest = [c for c in range(16) if c not in S]
    pm = PlacementModel(ev, net, formulation="sets", symmetry_breaking=False, pin=(range(8), S))
    rng = np.random.default_rng(5)
    cands = [np.concatenate([rng.permutation(S), rng.permutation(rest)]) for _ in range(60)]
    for a, b in itertools.combinations(range(16), 2):
        if (a < 8) == (b < 8):
            q = best.copy()
            q[[a, b]] = q[[b, a]]
            cands.append(q)
    for chips in cands:
        assert all(c <= m for c, m in zip(_cut_values(pm, chips), phase_maxima(pm, chips)))


def test_split_without_pinned_solves_is_a_valid_bound(net24, monkeypatch):
    """With the pinned solves switched off (more classes than MAX_PINNED_CLASSES) the split
    stops at min LB(S): not proven, and at most the enumerated optimum."""
    import aoizora.solvers.placement_split as SP
    monkeypatch.setattr(SP, "MAX_PINNED_CLASSES", 0)
    ev = layer_evidence((2, 4), "v5e:2x4", permute=True)
    ex = H.exhaustive(ev, net24, time_limit_s=120)
    pm = PlacementModel(ev, net24, formulation="circuit")
    d = default_device_order(get_target("v5e:2x4"), ev.mesh_axes)
    sp = split_proof(pm, net24.device_chip[d], WorkBudget.for_limit(60))
    assert not sp.proven and sp.rows["classes"] == [] and sp.rows["classes_below_incumbent"] > 0
    assert pm.comm_seconds(sp.bound_units) <= ex.certificate.objective * (1 + 1e-12)
    assert sp.bound_units == int(set_lower_bounds(pm, split_group(pm)).lb_units.min())


@pytest.mark.parametrize("lexicographic", [False, True])
def test_solve_placement_takes_the_split_placement(net24, lexicographic):
    """2x4, circuit formulation, started from the worst axis order without the warm start: the
    split finds and proves the enumerated optimum over every placement."""
    ev = layer_evidence((2, 4), "v5e:2x4", permute=True)
    ex = H.exhaustive(ev, net24, time_limit_s=120)
    tm = TrafficModel(ev, net24)
    worst = max(H.axis_order_placements(net24, (2, 4)), key=lambda q: tm.cost(q))
    res = solve_placement(ev, net24, time_limit_s=60, seed=0, hint=worst,
                          options=PlacementOptions(warm_start=False, formulation="circuit",
                                                   lexicographic=lexicographic))
    c = res.certificate
    assert c.status == "OPTIMAL" and c.detail["split"]["proven"]
    assert c.detail["bound_scope"] == SCOPE_SETS and c.detail["bound_source"] == "split"
    assert c.objective == pytest.approx(ex.certificate.objective, rel=1e-9)
    assert c.bound == pytest.approx(c.objective, rel=1e-9)
    assert c.detail["incumbent"]["from"] == "hint" and tm.cost(worst)[0] > c.objective
