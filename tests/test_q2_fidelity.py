"""Q2 (the solvers' link-load model plus per-hop latency) against the reference simulator on the
cases where they used to part: a bent line, a scattered group, and the per-hop latency."""

import numpy as np
import pytest

from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.formulation.traffic import latency_hops
from benchmarks.grid import spearman
from benchmarks.simulator import Simulator

W = 4.5e10          # v5e one-way link bandwidth, B/s
LAT = 1e-6          # per hop, s
V = 48 * 2 ** 20    # bytes: large, so bandwidth dominates latency


def _net():
    # 2 x 4, no wraparound; chip id = x + 2 y (x in 0..1, y in 0..3)
    coords = [(x, y) for y in range(4) for x in range(2)]
    return Network((2, 4), (False, False), W, LAT, device_coords=coords, name="v5e:2x4")


def _ev(groups, kind="all-gather", nbytes=V):
    return Evidence(target="v5e:2x4", mesh_axes={"a": 2, "b": 4},
                    collectives=[Collective("c0", kind, "bf16", int(nbytes), groups)],
                    compute=[], clock_hz=1.5e9)


def test_bent_line_closing_step_stays_on_the_line():
    net = _net()
    # chips 1-0-2-4: (1,0) (0,0) (0,1) (0,2): an L, no cycle; its end (0,2) -> start (1,0) by
    # dimension order would leave the line through chips 5 and 3
    ring = net.ring_through([1, 0, 2, 4])
    assert ring.kind == "line"
    line_links = {net.link_id[(a, b)] for a, b in zip(ring.order, ring.order[1:])}
    line_links |= {net.link_id[(b, a)] for a, b in zip(ring.order, ring.order[1:])}
    used = {lid for step in net.ring_step_routes(ring) for lid in step}
    assert used <= line_links and len(used) == 6
    # Q2 and the simulator agree on two such lines side by side (they used to differ by 2x)
    ev = _ev([[0, 1, 2, 3], [4, 5, 6, 7]])
    placement = [1, 0, 2, 4, 3, 5, 7, 6]          # group 0 on chips 1-0-2-4, group 1 on 3-5-7-6
    q = predict_step(ev, placement, net)
    s = Simulator("v5e:2x4", net).run(ev, placement)
    assert q.step_s == pytest.approx(s.step_s, rel=0.02)
    assert q.communication_s == pytest.approx(3 * V / 4 / W, rel=1e-9)   # 3/4 V per link


@pytest.mark.xfail(strict=True, reason="known disagreement: for a group whose chips form no physical ring, several ring orders are equally short; Q2 and the independent simulator (benchmarks/sim/topology.py) break that tie differently (up to 2x on one collective). Which order libtpu takes is not read from the compiled program yet")
def test_scattered_group_runs_both_ways_when_its_directions_cannot_contend():
    net = _net()
    # chips 0, 3, 5, 6: no two are neighbours along a cycle/path -> scattered
    ring = net.ring_through([0, 3, 5, 6])
    assert ring.kind == "scattered"
    both = net.ring_directions(ring)
    ev = _ev([[0, 1, 2, 3], [4, 5, 6, 7]])
    placement = [0, 3, 5, 6, 1, 2, 4, 7]
    q = predict_step(ev, placement, net)
    s = Simulator("v5e:2x4", net).run(ev, placement)
    assert s.collectives[0].algorithm == ("bidirectional ring" if both == 2
                                          else "unidirectional ring")
    assert q.step_s == pytest.approx(s.step_s, rel=0.05)


def test_latency_term_counts_steps_times_the_longest_step():
    net = _net()
    # a straight closed-less line of 4 along y: 3 steps, closing step back over 3 hops
    assert latency_hops("ring", "all-gather", [0, 2, 4, 6], net) == 3 * 3
    assert latency_hops("ring", "all-reduce", [0, 2, 4, 6], net) == 2 * 3 * 3
    # a 2x2 square closes: 3 steps of 1 hop
    assert latency_hops("ring", "all-gather", [0, 1, 2, 3], net) == 3
    # all-to-all: one step as long as the longest pair route (0 -> 7 is 1 + 3 hops)
    assert latency_hops("a2a", "all-to-all", [0, 7], net) == 4
    small = _ev([[0, 1, 2, 3], [4, 5, 6, 7]], nbytes=4096)    # latency-bound
    q_square = predict_step(small, [0, 1, 2, 3, 4, 5, 6, 7], net)
    q_line = predict_step(small, [0, 2, 4, 6, 1, 3, 5, 7], net)
    assert q_square.latency_s == pytest.approx(3 * LAT)
    assert q_line.latency_s == pytest.approx(9 * LAT)
    assert q_line.step_s > q_square.step_s


@pytest.mark.xfail(strict=True, reason="known disagreement: for a group whose chips form no physical ring, several ring orders are equally short; Q2 and the independent simulator (benchmarks/sim/topology.py) break that tie differently (up to 2x on one collective). Which order libtpu takes is not read from the compiled program yet")
def test_q2_ranks_random_placements_as_the_simulator_does():
    net = _net()
    sim = Simulator("v5e:2x4", net)
    ev = Evidence(target="v5e:2x4", mesh_axes={"a": 2, "b": 4}, clock_hz=1.5e9, compute=[],
                  collectives=[
                      Collective("ag", "all-gather", "bf16", 6 * 2 ** 20,
                                 [[0, 1, 2, 3], [4, 5, 6, 7]], phase=0),
                      Collective("a2a", "all-to-all", "bf16", 2 * 2 ** 20,
                                 [[0, 4], [1, 5], [2, 6], [3, 7]], phase=1),
                      Collective("ar", "all-reduce", "bf16", 64 * 1024,
                                 [[0, 1, 2, 3, 4, 5, 6, 7]], phase=2)])
    rng = np.random.default_rng(0)
    pls = [list(rng.permutation(8)) for _ in range(24)]
    q = [predict_step(ev, p, net).step_s for p in pls]
    s = [sim.run(ev, p).step_s for p in pls]
    assert spearman(q, s) >= 0.9


# -- overlap: what an async collective hides behind ---------------------------------------------
CLOCK = 1.5e9


def _window_ev(extra=(), kernel=True):
    """An async all-gather over all 8 chips, started at 1 and done at 10; inside its window a fusion
    the compiler gave cycles for (0.2 ms) and, with ``kernel``, an opaque custom call (no cycles;
    flops for 0.8 ms at the v5e peak); outside it, 1 ms more compute."""
    from aoizora.extract.evidence import ComputeOp

    from aoizora.extract.targets import get_target

    net = Network.from_target(get_target("v5e-8"))
    fus = 0.2e-3 * CLOCK
    ag = Collective("ag", "all-gather", "bf16", V, [list(range(8))], is_async=True,
                    start_index=1, done_index=10, overlap_cycles=fus)      # as extracted: cycles only
    comp = [ComputeOp("fusion", "fusion", fus, index=3),
            ComputeOp("after", "fusion", 1e-3 * CLOCK, index=12)]
    if kernel:
        comp.append(ComputeOp("splash", "custom-call", None, flops=0.8e-3 * net.peak_flops,
                              bytes=1.0, index=5))
    ev = Evidence(target="v5e:2x4", mesh_axes={"x": 8}, collectives=[ag, *extra], compute=comp,
                  clock_hz=CLOCK)
    return ev, net


def test_overlap_window_counts_an_opaque_kernel():
    """W_c prices every op in the window as compute_s does: the kernel without cycles counts
    (extraction's overlap_cycles alone would leave 0.8 ms of it out), and Q2 meets the simulator."""
    from aoizora.formulation.op_time import ScheduleSpans
    from aoizora.formulation.traffic import TrafficModel

    ev, net = _window_ev()
    assert ScheduleSpans(ev, net).seconds(1, 10, 1) == pytest.approx(1.0e-3, rel=1e-9)
    tm = TrafficModel(ev, net)
    assert tm.overlap_s == [pytest.approx(1.0e-3, rel=1e-9)]
    order = list(range(8))
    q = predict_step(ev, order, net)
    s = Simulator("v5e-8").run(ev, order)
    assert q.link_time_s > 0.2e-3                 # more than the fusion alone could hide
    assert q.communication_s == pytest.approx(max(0.0, q.link_time_s - 1.0e-3), abs=1e-12)
    assert q.step_s == pytest.approx(s.step_s, rel=0.01)


def test_sync_collective_inside_an_async_window_costs_only_itself():
    """A small blocking all-reduce scheduled inside the all-gather's window shares its phase; it
    blocks for its own transfer and leaves the all-gather's overlap in place (it used to void
    it: the whole phase exposed)."""
    ar = Collective("ar", "all-reduce", "bf16", 4096, [list(range(8))], start_index=4,
                    done_index=4)
    ev, net = _window_ev([ar])
    assert {c.phase for c in ev.collectives} == {0}           # in flight together
    order = list(range(8))
    alone = predict_step(_window_ev()[0], order, net)
    with_ar = predict_step(ev, order, net)
    ar_only = predict_step(Evidence(target="v5e:2x4", mesh_axes={"x": 8}, collectives=[ar],
                                    compute=[], clock_hz=CLOCK), order, net)
    assert alone.communication_s < alone.link_time_s              # the all-gather is hidden...
    assert with_ar.communication_s == pytest.approx(               # ...and stays so
        alone.communication_s + ar_only.communication_s, rel=1e-9)
    assert with_ar.communication_s < 0.1 * alone.link_time_s
    s = Simulator("v5e-8").run(ev, order)
    assert with_ar.step_s == pytest.approx(s.step_s, rel=0.01)


def test_blocking_collectives_in_one_window_pay_their_latencies_in_turn():
    """Small blocking all-gathers scheduled one after another inside an async window share its
    phase; each waits for its own ring steps, so their hop latencies add up (Q2 used to count
    the longest one once: Wan 14B 480p-41f on v5e-16 has 14 such all-gathers per layer)."""
    small = [Collective(f"ag{i}", "all-gather", "bf16", 2048, [list(range(8))],
                        start_index=6 + i, done_index=6 + i) for i in range(4)]
    ev, net = _window_ev(small)
    assert {c.phase for c in ev.collectives} == {0}
    for order in (list(range(8)), [0, 3, 5, 6, 1, 2, 4, 7]):
        q = predict_step(ev, order, net)
        sync = next(p for p in q.phases if len(p.collectives) == 4)
        one = predict_step(Evidence(target="v5e:2x4", mesh_axes={"x": 8}, collectives=small[:1],
                                    compute=[], clock_hz=CLOCK), order, net)
        assert sync.latency_s == pytest.approx(4 * one.phases[0].latency_s, rel=1e-12)
        s = Simulator("v5e-8").run(ev, order)
        assert q.step_s == pytest.approx(s.step_s, rel=0.01)


def test_placement_certificate_on_split_phase_classes():
    """The placement CP-SAT prices the sync and async classes of one phase as two terms: it still
    proves its answer, and its objective is Q2's communication_s of that answer."""
    from aoizora.solvers.placement import solve_placement

    ar = Collective("ar", "all-reduce", "bf16", 2 ** 20, [[0, 1, 2, 3], [4, 5, 6, 7]],
                    start_index=4, done_index=4)
    ev, net = _window_ev([ar], kernel=False)
    res = solve_placement(ev, net, time_limit_s=20, seed=0, workers=1)
    c = res.certificate
    assert c.status == "OPTIMAL"
    q = predict_step(ev, res.placement, net)
    assert c.objective == pytest.approx(q.communication_s, rel=1e-6)
    assert len(q.phases) == 2 and sorted(p.overlap_s > 0 for p in q.phases) == [False, True]


def test_a_chain_of_windows_is_priced_in_parts():
    """One evidence phase chains three async all-gathers: a small one A with a short window, C
    bridging it to a large one B whose window holds 5 ms of compute. The classes in flight
    together are {A, C} and {B}: B stays hidden behind its own window instead of A's (as one
    class it was exposed in full), and Q2 meets the simulator."""
    from aoizora.extract.evidence import ComputeOp
    from aoizora.extract.targets import get_target
    from aoizora.formulation.traffic import phase_classes

    net = Network.from_target(get_target("v5e-8"))
    g = [list(range(8))]
    A = Collective("A", "all-gather", "bf16", V // 64, g, is_async=True, start_index=1,
                   done_index=4)
    C = Collective("C", "all-gather", "bf16", V // 64, g, is_async=True, start_index=3,
                   done_index=8)
    B = Collective("B", "all-gather", "bf16", V, g, is_async=True, start_index=6, done_index=20)
    comp = [ComputeOp("a", "fusion", 0.01e-3 * CLOCK, index=2),
            ComputeOp("c", "fusion", 0.05e-3 * CLOCK, index=5),
            ComputeOp("b", "fusion", 5e-3 * CLOCK, index=10)]
    ev = Evidence(target="v5e:2x4", mesh_axes={"x": 8}, collectives=[A, C, B], compute=comp,
                  clock_hz=CLOCK)
    parts = phase_classes(ev.collectives)
    assert sorted(sorted(c.name for c in cs) for cs in parts.values()) == [["A", "C"], ["B"]]
    order = list(range(8))
    q = predict_step(ev, order, net)
    b_alone = predict_step(Evidence(target="v5e:2x4", mesh_axes={"x": 8}, collectives=[
        Collective("B", "all-gather", "bf16", V, g)], compute=[], clock_hz=CLOCK), order, net)
    assert b_alone.communication_s < 5e-3                      # B fits in its window
    assert q.communication_s < 0.2 * b_alone.communication_s   # and is not charged
    s = Simulator("v5e-8").run(ev, order)
    assert q.step_s == pytest.approx(s.step_s, rel=0.01)
