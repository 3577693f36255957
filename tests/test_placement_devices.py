"""The placement CP-SAT model where a chip shows as two devices (v4, v7x): ranks placed on
devices, checked against every device order priced by ``TrafficModel.cost`` (Q2's link-load
pricing, what the one-device tests check the model's objective with)."""

import itertools

import numpy as np
import pytest
from ortools.sat.python import cp_model

from aoizora.extract import targets as T
from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.formulation.placement_bounds import phase_link_lower_bounds
from aoizora.formulation.placement_cpsat import (PlacementModel, PlacementModelError,
                                                  estimated_variables)
from aoizora.formulation.traffic import TrafficModel, mesh_axis_groups
from aoizora.solvers.axis_orders import axis_order_placements
from aoizora.solvers.cpsat_params import solution_chips
from aoizora.solvers.placement import PlacementOptions, solve_placement
from aoizora.solvers.placement_heuristics import annealing
from tests.test_placement import layer_evidence

CLOCK = 1.5e9
MiB = 2**20


def two_per_chip_network(name: str) -> Network:
    """`name`'s 2x2x1 slice as libtpu numbers it: devices 2c and 2c + 1 on chip c (x fastest)."""
    t = T.get_target(name)
    coords = [(x, y, 0) for y in range(2) for x in range(2) for _ in range(2)]
    return Network((2, 2, 1), (False, False, False), t.chip.link_bandwidth_Bps,
                   t.chip.hop_latency_s, device_coords=coords, name=t.name)


def every_device_order(ev: Evidence, net: Network) -> tuple:
    """The least ``TrafficModel.cost`` (comm s, link bytes, hops; lexicographic) over all 8!
    device orders. The cost of an order depends only on the chip of each rank
    (``TrafficModel.chip_of_rank``), so each distinct chip map is priced once (2,520 of them);
    the test checks that on swaps of two devices of one chip."""
    tm = TrafficModel(ev, net)
    seen: dict[bytes, tuple] = {}
    for q in itertools.permutations(range(net.num_devices)):
        key = net.device_chip[list(q)].tobytes()
        if key not in seen:
            seen[key] = tm.cost(q)
    return min(seen.values())


def assert_swaps_inside_a_chip_keep_the_cost(ev: Evidence, net: Network) -> None:
    tm, rng = TrafficModel(ev, net), np.random.default_rng(0)
    for _ in range(20):
        p = rng.permutation(net.num_devices)
        q = p.copy()
        c = int(rng.integers(net.num_chips))
        a, b = np.nonzero(np.isin(p, np.nonzero(net.device_chip == c)[0]))[0]
        q[[a, b]] = q[[b, a]]
        assert tm.cost(q) == tm.cost(p)


def assert_optimal_by_every_order(res, ev: Evidence, net: Network) -> None:
    """CP-SAT's answer: OPTIMAL, each lexicographic level equal to the least over every device
    order, its model objective equal to Q2's."""
    c = res.certificate
    assert c.solver.startswith("CP-SAT") and c.detail["method"] == "CP-SAT (sets)"
    assert c.status == "OPTIMAL" and c.gap == pytest.approx(0.0, abs=1e-5)
    best = every_device_order(ev, net)
    got = TrafficModel(ev, net).cost(res.placement)
    assert got[0] == pytest.approx(best[0], rel=1e-9)
    assert got[1:] == pytest.approx(best[1:], rel=1e-12)          # link bytes, hops levels
    q2 = predict_step(ev, res.placement, net)
    assert c.objective == pytest.approx(q2.communication_s, rel=1e-12)
    assert c.detail["model_objective_s"] == pytest.approx(q2.communication_s, rel=1e-5)


def solved(ev: Evidence, net: Network, symmetry_breaking: bool = True, placement=None):
    """The model minimising comm (x fixed to `placement` when given), solved to OPTIMAL with
    one worker: (model, solver)."""
    pm = PlacementModel(ev, net, symmetry_breaking=symmetry_breaking)
    for r, d in enumerate([] if placement is None else placement):
        pm.model.Add(pm.x[r][int(d)] == 1)
    pm.model.Minimize(pm.obj_comm)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    assert s.Solve(pm.model) == cp_model.OPTIMAL
    return pm, s


def assert_canonical_keeps_cost_and_constraints(pm, ev: Evidence, net: Network, n: int):
    """``canonical`` of n random placements: the same cost, and feasible for the model with
    every symmetry constraint."""
    tm = TrafficModel(ev, net)
    for p in np.random.default_rng(0).permutation(np.tile(np.arange(8), (n, 1)), axis=1):
        q = pm.canonical(p)
        assert tm.cost(q) == tm.cost(p)
        solved(ev, net, True, q)


@pytest.mark.parametrize("name", ["v7x-8", "v4-8"])
@pytest.mark.parametrize("shape,permute", [((2, 4), False), ((2, 4), True), ((4, 2), True)])
def test_cpsat_on_two_device_chips_is_the_best_device_order(name, shape, permute):
    """``layer_evidence``'s collectives on (2, 4) and (4, 2) meshes: rings of 4 ranks (on 2, 3
    or 4 chips), pairs (maybe on one chip), all-to-alls of 2 and 4 ranks, an all-reduce over
    all 8, a permute."""
    net = two_per_chip_network(name)
    ev = layer_evidence(shape, T.get_target(name).name, permute=permute)
    assert_swaps_inside_a_chip_keep_the_cost(ev, net)
    res = solve_placement(ev, net, time_limit_s=20, hint=list(range(8)))
    assert_optimal_by_every_order(res, ev, net)


def test_the_model_prices_every_placement_exactly_on_two_device_chips():
    """With x fixed to any device order (no symmetry breaking) the model's objective is the
    exact cost in its units: the loads are right everywhere, not only at the optimum."""
    net = two_per_chip_network("v7x-8")
    ev = layer_evidence((4, 2), "v7x:2x2x1", permute=True)
    tm, rng = TrafficModel(ev, net), np.random.default_rng(1)
    for _ in range(6):
        p = rng.permutation(8)
        pm, s = solved(ev, net, False, p)
        exact = tm.cost(p)[0]
        assert pm.comm_seconds(s.ObjectiveValue()) == pytest.approx(
            exact, abs=pm.comm_seconds(pm.rounding_units) + 1e-15)


@pytest.mark.parametrize("mesh", [{"a": 2, "b": 4}, {"sp": 8}])
def test_symmetry_breaking_on_devices_keeps_the_optimum(mesh):
    """Ordered slabs / rank 0 fixed / a chip's devices holding increasing ranks: the optimum
    with them equals the optimum without, and ``canonical`` keeps the cost of a placement."""
    net = two_per_chip_network("v7x-8")
    shape = tuple(mesh.values())
    ev = Evidence(target="v7x:2x2x1", mesh_axes=mesh, clock_hz=CLOCK, collectives=[
        Collective("ag", "all-gather", "bf16", 8 * MiB,
                   mesh_axis_groups(shape, [len(shape) - 1]), count=4),
        Collective("a2a", "all-to-all", "bf16", 4 * MiB, mesh_axis_groups(shape, [0]),
                   count=2, phase=1)])
    tm, vals = TrafficModel(ev, net), []
    for sb in (True, False):
        pm, s = solved(ev, net, sb)
        vals.append((s.ObjectiveValue(), tm.cost(solution_chips(s, pm))[0]))
        if sb:
            assert any(n.startswith("symmetry:") for n in pm.notes)
            assert_canonical_keeps_cost_and_constraints(pm, ev, net, 5)
    assert vals[0] == pytest.approx(vals[1])


def test_slice_symmetry_moves_both_devices_of_a_chip():
    """Evidence without rank symmetry: rank 0 on a device of a representative chip (slice
    automorphisms on chips, both devices moved) with the devices of each chip holding increasing
    ranks. The optimum equals the one without symmetry breaking, and ``canonical`` maps any
    placement to one of equal cost that satisfies every symmetry constraint."""
    net = two_per_chip_network("v7x-8")
    ev = Evidence(target="v7x:2x2x1", mesh_axes={"x": 8}, clock_hz=CLOCK, collectives=[
        Collective("ag", "all-gather", "bf16", 8 * MiB, [[0, 1, 2], [3, 4, 5], [6], [7]],
                   count=4),
        Collective("p", "collective-permute", "bf16", 4 * MiB, [list(range(8))],
                   source_target_pairs=[(0, 3), (3, 6), (1, 7)], count=2, phase=1),
        Collective("a2a", "all-to-all", "bf16", 4 * MiB, [[0, 4, 5, 7], [1, 2, 3, 6]],
                   count=3, phase=2)])
    (pm, s), (_, s_off) = solved(ev, net, True), solved(ev, net, False)
    assert s.ObjectiveValue() == s_off.ObjectiveValue()
    assert any("slice route automorphisms" in n for n in pm.notes)
    assert any("increasing ranks" in n for n in pm.notes)
    assert_canonical_keeps_cost_and_constraints(pm, ev, net, 20)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_a_hint_sets_every_variable_consistently(shape):
    """``add_hint`` of any placement (mapped by ``canonical``) gives every variable a value, and
    the model with every variable fixed at its hint is feasible (the solver's warm start)."""
    net = two_per_chip_network("v7x-8")
    ev = layer_evidence(shape, "v7x:2x2x1", permute=True)
    for seed in range(3):
        pm = PlacementModel(ev, net)
        pm.add_hint(np.random.default_rng(seed).permutation(8))
        proto = pm.model.Proto()
        assert len(proto.solution_hint.vars) == len(proto.variables)
        pm.model.Minimize(pm.obj_comm)
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        s.parameters.fix_variables_to_their_hinted_value = True
        assert s.Solve(pm.model) == cp_model.OPTIMAL


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_the_size_estimate_follows_the_device_model(shape):
    """``estimated_variables`` (the solver's build-time and cap test) within 40% of the model."""
    net = two_per_chip_network("v7x-8")
    ev = layer_evidence(shape, "v7x:2x2x1", permute=True)
    form, est = estimated_variables(ev, net, "auto")
    built = len(PlacementModel(ev, net).model.Proto().variables)
    assert form == "sets" and 0.6 * built <= est <= 1.4 * built


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_the_analytic_bound_is_below_every_device_order_phase_by_phase(shape):
    """``placement_bounds`` with two devices per chip (the ring cut over chip-set sizes): each
    phase's lb[p] is at most its least most-loaded link over all 8! device orders, and the ring
    phases get a bound above 0."""
    net = two_per_chip_network("v7x-8")
    ev = layer_evidence(shape, "v7x:2x2x1", permute=True)
    tm = TrafficModel(ev, net)
    lbs = phase_link_lower_bounds(ev, net, tm)
    least = np.full(len(lbs), np.inf)
    maps = {net.device_chip[list(q)].tobytes(): q
            for q in itertools.permutations(range(8))}
    for q in maps.values():
        least = np.minimum(least, [pl.link_bytes.max() for pl in tm.phase_loads(q)])
    assert all(float(b.link_bytes) <= m * (1 + 1e-12) for b, m in zip(lbs, least))
    assert sum(b.link_bytes > 0 for b in lbs) >= 2


def test_circuit_is_refused_on_two_device_chips_and_the_solver_anneals():
    net = two_per_chip_network("v7x-8")
    ev = layer_evidence((2, 4), "v7x:2x2x1")
    with pytest.raises(PlacementModelError, match="sets"):
        PlacementModel(ev, net, formulation="circuit")
    res = solve_placement(ev, net, time_limit_s=2.0, hint=list(range(8)),
                          options=PlacementOptions(formulation="circuit"))
    assert sorted(res.placement) == list(range(8))
    assert "circuit formulation, several devices per chip" in res.certificate.solver


def test_axis_orders_take_the_devices_of_a_chip_as_an_axis():
    net = two_per_chip_network("v7x-8")
    orders = axis_order_placements(net, [2, 4])
    assert orders and all(sorted(q.tolist()) == list(range(8)) for q in orders)
    # some order puts the two devices of one chip on the size-2 logical axis
    assert any(all(net.device_chip[q[i]] == net.device_chip[q[i + 4]] for i in range(4))
               for q in orders)


def _tiny_wan_evidence(target: str, expert: str):
    from aoizora.builtin import builtin_job
    from aoizora.extract.network import default_device_order
    from aoizora.models.experts import expert_layouts
    from aoizora.planning.candidate_pricing import compile_layout
    job = builtin_job("wan2.1-small", "128p", 9, target)
    ex = next(e for e in expert_layouts(job.model, job.workload, job.target) if e.name == expert)
    order = default_device_order(job.target, ex.layout.mesh_axes)
    ev = compile_layout(ex.fn, ex.args, job.target, ex.layout, order)
    return ev, [int(v) for v in order], Network.from_target(job.target)


@pytest.mark.tpu_compiler
@pytest.mark.parametrize("target,expert", [("v7x-8", "ulysses"), ("v7x-8", "cfg2_context"),
                                           ("v4-8", "tp_cfg")])
def test_tiny_wan_on_two_device_chips_cpsat_is_proven_and_beats_annealing(target, expert):
    """wan2.1-small (128p, 9 frames) compiled with libtpu (as tests/test_v7x.py does): CP-SAT's
    placement is OPTIMAL, the best over every device order, and no worse than annealing's."""
    ev, order, net = _tiny_wan_evidence(target, expert)
    assert net.num_devices == 2 * net.num_chips
    res = solve_placement(ev, net, time_limit_s=30, hint=order)
    assert_optimal_by_every_order(res, ev, net)
    tm = TrafficModel(ev, net)
    sa = annealing(ev, net, time_limit_s=2.0, starts=[order])
    assert tm.cost(res.placement)[0] <= tm.cost(sa.placement)[0] * (1 + 1e-12)
