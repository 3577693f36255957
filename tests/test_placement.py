"""The placement CP-SAT model and solver against enumeration, time-outs, seeds, and the default order.

Evidence is built by hand (realistic per-layer collectives of a 2D logical mesh, counts of 30)."""

import time

import numpy as np
import pytest

from aoizora.extract.evidence import Collective, ComputeOp, Evidence
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import predict_step
from aoizora.formulation.placement_cpsat import PlacementModel
from aoizora.formulation.traffic import TrafficModel, mesh_axis_groups
from aoizora.solvers import placement_heuristics as H
from aoizora.solvers.placement import PlacementOptions, solve_placement

CLOCK = 1.5e9


def layer_evidence(shape, target, permute=False, overlap=True):
    """Per-layer collectives of a (a, b) logical mesh, 30 layers:
    phase 0: all-to-all over axis 0 (Ulysses-like), 12 MiB buffer;
    phase 1: all-gather over axis 1 (K/V), 24 MiB gathered, with a reduce-scatter over axis 0
             in flight at the same time (8 MiB);
    phase 2: all-reduce over every device, async, overlapping 1 ms of compute;
    phase 3 (optional): collective-permute shifting by one along axis 1 (ring attention), 4 MiB."""
    MiB = 2**20
    cs = [
        Collective("a2a", "all-to-all", "bf16", 12 * MiB, mesh_axis_groups(shape, [0]),
                   count=30, phase=0),
        Collective("ag", "all-gather", "bf16", 24 * MiB, mesh_axis_groups(shape, [1]),
                   count=30, phase=1),
        Collective("rs", "reduce-scatter", "bf16", 8 * MiB, mesh_axis_groups(shape, [0]),
                   count=30, phase=1),
        Collective("ar", "all-reduce-start", "bf16", 6 * MiB, mesh_axis_groups(shape, [0, 1]),
                   count=30, phase=2, is_async=True,
                   overlap_cycles=(1e-3 * CLOCK if overlap else 0.0)),
    ]
    if permute:
        a, b = shape
        ids = np.arange(a * b).reshape(shape)
        pairs = [(int(ids[i, j]), int(ids[i, (j + 1) % b])) for i in range(a) for j in range(b)]
        cs.append(Collective("shift", "collective-permute", "bf16", 4 * MiB, [sorted(ids.ravel().tolist())],
                             source_target_pairs=pairs, count=30, phase=3))
    comp = [ComputeOp("mlp", "fusion", 2e-3 * CLOCK, count=30)]
    return Evidence(target=target, mesh_axes={"a": shape[0], "b": shape[1]}, collectives=cs,
                    compute=comp, clock_hz=CLOCK)


@pytest.fixture(scope="module")
def nets():
    return {n: Network.from_target(get_target(n)) for n in ("v5e:2x2", "v5e:2x4", "v5e:4x4")}


def test_traffic_matches_scaling_book(nets):
    """All-gather on a line of 4 without wrap: 3 V / 4 per link (the book's 3 x V/4 / W);
    on a closed ring (2x2 square): 3 V / 8 each way (about V / (2 W))."""
    net = nets["v5e:4x4"]
    V = 8 * 2**20
    ev = Evidence("v5e:4x4", {"a": 4, "b": 4}, collectives=[
        Collective("ag", "all-gather", "bf16", V, mesh_axis_groups((4, 4), [1]))])
    tm = TrafficModel(ev, net)
    line = list(range(16))                       # rows of the logical mesh on physical x lines
    loads = tm.phase_loads(line)[0].link_bytes
    assert loads.max() == pytest.approx(3 * V / 4) and (loads > 0).sum() == 4 * 3 * 2
    square = H.axis_order_placements(net, (4, 4))
    best = min(tm.phase_loads(p)[0].link_bytes.max() for p in square)
    assert best == pytest.approx(3 * V / 8)
    q = predict_step(ev, line, net)
    assert q.communication_s == pytest.approx(3 * V / 4 / 4.5e10)


def _check_exact(res, ev, net):
    c = res.certificate
    q2 = predict_step(ev, res.placement, net)
    assert c.objective == pytest.approx(q2.communication_s, rel=1e-12)
    # the CP-SAT model's own objective equals Q2 recomputed by formulation.traffic (None when
    # the limit ended before the search reported a solution and the hint was returned)
    if c.detail["model_objective_s"] is not None:
        assert c.detail["model_objective_s"] == pytest.approx(q2.communication_s, rel=1e-9)


@pytest.mark.parametrize("name,shape,permute", [("v5e:2x2", (2, 2), True),
                                                ("v5e:2x4", (2, 4), False),
                                                ("v5e:2x4", (2, 4), True)])
def test_solver_proves_the_enumerated_optimum(nets, name, shape, permute):
    net = nets[name]
    ev = layer_evidence(shape, name, permute=permute)
    ex = H.exhaustive(ev, net, time_limit_s=120)
    assert ex.certificate.status == "OPTIMAL" and ex.certificate.detail["complete"]
    res = solve_placement(ev, net, time_limit_s=60, seed=0)
    assert res.certificate.status == "OPTIMAL"
    assert res.certificate.objective == pytest.approx(ex.certificate.objective, rel=1e-9)
    assert res.certificate.gap == 0.0
    _check_exact(res, ev, net)
    # lexicographic tie-break: no placement with the same comm has fewer link bytes
    tm = TrafficModel(ev, net)
    assert tm.cost(res.placement)[1] <= ex.certificate.detail["link_bytes"] * (1 + 1e-12)
    # and the optimum beats (or ties) JAX's default order
    d = default_device_order(get_target(name), ev.mesh_axes)
    assert res.certificate.objective <= predict_step(ev, d, net).communication_s + 1e-15


def test_optimum_is_not_the_default_on_2x4(nets):
    """A case where placement matters: the default order is strictly worse than the optimum."""
    net = nets["v5e:2x4"]
    ev = layer_evidence((2, 4), "v5e:2x4")
    d = default_device_order(get_target("v5e:2x4"), ev.mesh_axes)
    res = solve_placement(ev, net, time_limit_s=60)
    assert res.certificate.objective < 0.99 * predict_step(ev, d, net).communication_s


def test_same_seed_same_answer(nets):
    net = nets["v5e:2x4"]
    ev = layer_evidence((2, 4), "v5e:2x4", permute=True)
    a = solve_placement(ev, net, time_limit_s=60, seed=7, workers=2)
    b = solve_placement(ev, net, time_limit_s=60, seed=7, workers=2)
    assert a.placement == b.placement and a.certificate.objective == b.certificate.objective


def test_time_out_returns_the_incumbent_not_proven(nets):
    # 8x8: the proof takes far longer than the limit on any machine (the benchmark leaves a gap
    # after 60 s), so the answer is the incumbent, not proven.
    net = Network.from_target(get_target("v5e:8x8"))
    ev = layer_evidence((8, 8), "v5e:8x8", permute=True)
    d = default_device_order(get_target("v5e:8x8"), ev.mesh_axes)
    res = solve_placement(ev, net, time_limit_s=2.0, hint=d,
                          options=PlacementOptions(warm_start=False))
    c = res.certificate
    assert c.status == "FEASIBLE" and not c.proven_optimal
    assert res.placement is not None and c.bound is not None and c.bound < c.objective
    assert c.gap > 0
    _check_exact(res, ev, net)
    assert c.objective <= predict_step(ev, d, net).communication_s + 1e-15


def test_symmetry_breaking_keeps_costs(nets):
    """canonical() maps any placement to an equal-cost one inside the symmetry-broken region."""
    net = nets["v5e:4x4"]
    ev = layer_evidence((4, 4), "v5e:4x4")
    pm = PlacementModel(ev, net, formulation="circuit")
    tm = TrafficModel(ev, net)
    rng = np.random.default_rng(0)
    for _ in range(20):
        p = rng.permutation(16)
        q = pm.canonical(p)
        assert tm.cost(p) == pytest.approx(tm.cost(q))
        assert int(q[0]) in pm.fixed[0]


def test_heuristics_same_cost_function(nets):
    net = nets["v5e:2x4"]
    ev = layer_evidence((2, 4), "v5e:2x4")
    d = default_device_order(get_target("v5e:2x4"), ev.mesh_axes)
    opt = solve_placement(ev, net, time_limit_s=60).certificate.objective
    runs = [H.axis_orders(ev, net, default=d),
            H.random_search(ev, net, time_limit_s=30, seed=1, default=d, max_evaluations=300),
            H.annealing(ev, net, time_limit_s=30, seed=1, starts=[d], max_evaluations=600)]
    for r in runs:
        c = r.certificate
        assert c.status == "FEASIBLE" and c.bound is None
        assert c.objective >= opt - 1e-15
        assert c.objective == pytest.approx(predict_step(ev, r.placement, net).communication_s)
        objs = [o for _, o in r.trace]
        assert objs == sorted(objs, reverse=True) and objs[-1] == pytest.approx(c.objective)
    # annealing starts from the default order and never ends worse than its start
    assert runs[2].certificate.objective <= predict_step(ev, d, net).communication_s
    with pytest.raises(H.HeuristicError, match="exhaustive"):
        H.exhaustive(layer_evidence((4, 4), "v5e:4x4"), nets["v5e:4x4"])


def test_heuristic_schedules_follow_a_count_not_the_clock(nets, monkeypatch):
    """Random search and annealing make the evaluations their budget buys whatever the clock
    says, so the same seed and budget give the same answer; the clock only caps a run, and a
    run it cut says so."""
    net = nets["v5e:2x4"]
    ev = layer_evidence((2, 4), "v5e:2x4")
    d = default_device_order(get_target("v5e:2x4"), ev.mesh_axes)
    for fn, kw in ((H.annealing, {"starts": [d]}), (H.random_search, {"default": d})):
        a = fn(ev, net, time_limit_s=2.0, seed=3, **kw)
        # the same run on a clock 10x slower than the first: every reading of it moves slowly
        real = time.perf_counter
        t_first = real()
        monkeypatch.setattr(H.time, "perf_counter", lambda: t_first + (real() - t_first) / 10)
        b = fn(ev, net, time_limit_s=2.0, seed=3, **kw)
        monkeypatch.undo()
        assert a.placement == b.placement and a.trace and b.trace
        for r in (a, b):
            dt = r.certificate.detail
            assert dt["evaluations_asked"] == H.evaluation_budget(2.0) and dt["cut"] is None
        assert a.certificate.detail["evaluated"] == b.certificate.detail["evaluated"]
        # a limit the clock reaches first cuts the run, and the result says where
        c = fn(ev, net, time_limit_s=1e-9, seed=3, max_evaluations=10**6, **kw)
        assert c.certificate.detail["cut"].startswith("time limit after 0 of 1000000")


def test_q2_overlap_and_compute(nets):
    """Q2: step = compute + exposed comm; an async phase hides behind its overlap window."""
    net = nets["v5e:2x4"]
    ev = layer_evidence((2, 4), "v5e:2x4")
    ev0 = layer_evidence((2, 4), "v5e:2x4", overlap=False)
    p = list(range(8))
    q, q0 = predict_step(ev, p, net), predict_step(ev0, p, net)
    assert q.compute_s == pytest.approx(30 * 2e-3)
    ar, ar0 = q.phases[2], q0.phases[2]
    assert ar.overlap_s == pytest.approx(1e-3) and ar0.overlap_s == 0.0
    assert ar.exposed_s == pytest.approx(max(0.0, ar.link_s - 1e-3))
    assert q0.communication_s - q.communication_s == pytest.approx(30 * (ar.link_s - ar.exposed_s))
    assert q.step_s == pytest.approx(q.compute_s + q.communication_s + q.latency_s)
    assert 0.0 <= q.latency_s <= sum(p.count * p.latency_s for p in q.phases) + 1e-15
    assert q.model.endswith("(prediction)")


# -- lower bounds: analytic (every placement) and decomposition (phases solved alone) ----------
from aoizora.formulation.placement_bounds import comm_lower_bound, phase_link_lower_bounds  # noqa: E402
from aoizora.solvers.placement_decomposition import decomposition_bound  # noqa: E402


@pytest.mark.parametrize("name,shape,permute", [("v5e:2x4", (2, 4), True),
                                                ("v5e:4x4", (4, 4), True)])
def test_analytic_bound_below_every_placement(nets, name, shape, permute):
    """lb[p] <= the most loaded link of phase p under any placement (random ones and the axis
    orders), so the comm bound is below every placement's cost."""
    net = nets[name]
    ev = layer_evidence(shape, name, permute=permute)
    tm = TrafficModel(ev, net)
    lbs = phase_link_lower_bounds(ev, net, tm)
    lb = comm_lower_bound(ev, net, tm)
    rng = np.random.default_rng(0)
    cands = [rng.permutation(net.num_devices) for _ in range(40)]
    cands += H.axis_order_placements(net, shape)
    for p in cands:
        for b, pl in zip(lbs, tm.phase_loads(p)):
            assert float(b.link_bytes) <= pl.link_bytes.max() * (1 + 1e-12)
        assert lb <= tm.cost(p)[0] * (1 + 1e-12)
    assert lb > 0


def test_decomposition_bound_between_joint_bound_and_optimum(nets):
    """2x4 with a permute: analytic <= decomposition <= enumerated optimum; the certificate's
    bound is the largest of them and of the joint CP-SAT bound, and says which."""
    net = nets["v5e:2x4"]
    ev = layer_evidence((2, 4), "v5e:2x4", permute=True)
    opt = H.exhaustive(ev, net, time_limit_s=120).certificate.objective
    dec, scope, rows = decomposition_bound(ev, net, time_limit_s=20)
    an = comm_lower_bound(ev, net)
    assert an <= dec * (1 + 1e-12) and dec <= opt * (1 + 1e-9)
    assert scope == "every placement"
    assert all(r.get("formulation") == "sets" for r in rows if "formulation" in r)
    res = solve_placement(ev, net, time_limit_s=60)
    c = res.certificate
    assert c.status == "OPTIMAL" and c.objective == pytest.approx(opt, rel=1e-9)
    d = c.detail
    assert d["bound_source"] in ("analytic", "decomposition", "joint CP-SAT")
    assert d["analytic_bound_s"] <= d["bound_every_placement_s"] * (1 + 1e-12)
    assert d["bound_every_placement_s"] <= opt * (1 + 1e-9)
    assert c.bound >= d["joint_bound_s"] * (1 - 1e-12) - 1e-15


def test_decomposition_is_tight_on_a_separable_instance(nets):
    """Phases whose optima one placement reaches together (all-gathers over the rows, then over
    the columns of a 2x4 logical mesh on the 2x4 slice): the per-phase bound equals the optimum
    and the solver proves it without a joint search (bound from the analytic / decomposition
    side, every placement)."""
    net = nets["v5e:2x4"]
    MiB = 2**20
    ev = Evidence("v5e:2x4", {"a": 2, "b": 4}, collectives=[
        Collective("ag_rows", "all-gather", "bf16", 24 * MiB, mesh_axis_groups((2, 4), [1]),
                   count=30, phase=0),
        Collective("ag_all", "all-gather", "bf16", 8 * MiB, mesh_axis_groups((2, 4), [0, 1]),
                   count=30, phase=1)], clock_hz=CLOCK)
    opt = H.exhaustive(ev, net, time_limit_s=120).certificate.objective
    dec, scope, _ = decomposition_bound(ev, net, time_limit_s=20)
    assert dec == pytest.approx(opt, rel=1e-9) and scope == "every placement"
    res = solve_placement(ev, net, time_limit_s=30)
    c = res.certificate
    assert c.status == "OPTIMAL" and c.objective == pytest.approx(opt, rel=1e-9)
    assert c.detail["bound_every_placement_s"] == pytest.approx(opt, rel=1e-9)
    assert c.detail["bound_scope"] == "every placement"


def test_decomposition_raises_the_bound_of_an_all_to_all(nets):
    """An all-to-all over 4 ranks alone: the analytic bound (3 flows over <= 4 out-links: 1 flow
    per link) is below its optimum; solving the phase alone proves the optimum."""
    net = nets["v5e:2x4"]
    ev = Evidence("v5e:2x4", {"a": 2, "b": 4}, collectives=[
        Collective("a2a", "all-to-all", "bf16", 12 * 2**20, mesh_axis_groups((2, 4), [1]),
                   count=30, phase=0)], clock_hz=CLOCK)
    opt = H.exhaustive(ev, net, time_limit_s=120).certificate.objective
    an = comm_lower_bound(ev, net)
    dec, scope, rows = decomposition_bound(ev, net, time_limit_s=20)
    assert an < dec * (1 - 1e-9)
    assert dec == pytest.approx(opt, rel=1e-9) and scope == "every placement"
    assert any(r.get("used") for r in rows)


def test_too_large_model_falls_back_to_a_labelled_heuristic(nets):
    """Over the variable cap no CP-SAT model is built: annealing from the incumbent, labelled,
    never worse than the hint, with the analytic bound."""
    net = nets["v5e:4x4"]
    ev = layer_evidence((4, 4), "v5e:4x4", permute=True)
    d = default_device_order(get_target("v5e:4x4"), ev.mesh_axes)
    res = solve_placement(ev, net, time_limit_s=2.0, hint=d,
                          options=PlacementOptions(max_model_variables=100))
    c = res.certificate
    assert c.detail["method"] == "axis orders + annealing (heuristic fallback)"
    assert c.status in ("FEASIBLE", "OPTIMAL") and "heuristic fallback" in c.solver
    assert c.objective <= predict_step(ev, d, net).communication_s + 1e-15
    assert c.bound == pytest.approx(comm_lower_bound(ev, net)) and c.bound <= c.objective
    _check_exact(res, ev, net)


def test_an_incumbent_at_the_analytic_bound_records_the_link_load_level_proven(nets):
    """When JAX's order already meets the analytic bound, CP-SAT is not run: the certificate says
    so, and its link-load level is recorded as proven (the tie-break levels were not attempted,
    which ``aoizora.planning.time_limits`` does not count as a time limit)."""
    from aoizora.planning import time_limits
    from aoizora.solvers.placement import LEVELS

    net = nets["v5e:2x4"]
    cs = [Collective("ag", "all-gather", "bf16", 24 * 2**20, mesh_axis_groups((2, 4), [1]),
                     count=30, phase=0)]
    ev = Evidence(target="v5e:2x4", mesh_axes={"a": 2, "b": 4}, collectives=cs,
                  compute=[ComputeOp("mlp", "fusion", 2e-3 * CLOCK, count=30)], clock_hz=CLOCK)
    res = solve_placement(ev, net, time_limit_s=10, seed=0,
                          hint=default_device_order(get_target("v5e:2x4"), ev.mesh_axes))
    c = res.certificate
    assert c.status == "OPTIMAL" and c.detail["method"] == "CP-SAT not needed"
    assert c.detail["levels"]["comm"]["status"] == "OPTIMAL"
    assert set(c.detail["levels"]) < set(LEVELS)
    assert time_limits.placement("p", c) == []


def test_placement_options_reject_a_share_outside_0_1():
    with pytest.raises(ValueError, match="split_share must be in"):
        PlacementOptions(split_share=1.5)
    assert PlacementOptions().decomposition_share == 0.1 and PlacementOptions().split_share == 0.8
