"""Async parts priced by their demand sets (``formulation.async_demand``): a tiny transfer with a
short window no longer exposes the big transfers in flight beside it, and a big transfer with a
short window inside a long part is still exposed, in Q2 and in the placement CP-SAT model alike."""

import pytest

from aoizora.extract.evidence import Collective, ComputeOp, Evidence
from aoizora.extract.network import Network
from aoizora.extract.targets import get_target
from aoizora.formulation.async_demand import demand_sets
from aoizora.formulation.latency import predict_step
from aoizora.formulation.traffic import TrafficModel, link_bytes_bound
from aoizora.solvers.placement import solve_placement
from benchmarks.simulator import Simulator

CLOCK = 1.5e9
BIG = 16 * 2 ** 20          # bytes per pair: about 0.37 ms on one v5e link
RING = [(i, (i + 1) % 8) for i in range(8)]


def _ms(t):
    return t * 1e-3 * CLOCK


def _evidence(colls, ops):
    return Evidence(target="v5e:2x4", mesh_axes={"x": 8}, collectives=colls,
                    compute=[ComputeOp(n, "fusion", _ms(t), index=i) for n, t, i in ops],
                    clock_hz=CLOCK)


def _permute(name, nbytes, start, done):
    return Collective(name, "collective-permute", "bf16", nbytes, [list(range(8))],
                      is_async=True, start_index=start, done_index=done,
                      source_target_pairs=list(RING))


@pytest.fixture(scope="module")
def net():
    return Network.from_target(get_target("v5e-8"))


def test_a_tiny_short_window_does_not_expose_the_big_transfers_beside_it(net):
    """A ring step: K and V (16 MiB each) in flight over 1 ms of compute, and a 4 KiB permute
    (the ring's running max) whose own window holds 0.01 ms. The part used to hide behind its
    shortest window (0.01 ms) and expose both big transfers; by its demand sets it hides."""
    colls = [_permute("k", BIG, 1, 30), _permute("v", BIG, 2, 31), _permute("m", 4096, 20, 22)]
    ops = [("attn", 0.99, 10), ("tiny", 0.01, 21), ("after", 1.0, 40)]
    ev = _evidence(colls, ops)
    assert len({c.phase for c in ev.collectives}) == 1
    tm = TrafficModel(ev, net)
    assert tm.demands == [[]]                    # the tiny one can never bind: pruned
    assert tm.overlap_s[0] == pytest.approx(1.0e-3, rel=1e-9)
    order = list(range(8))
    q = predict_step(ev, order, net)
    assert 0.5e-3 < q.link_time_s < 1.0e-3
    assert q.communication_s == 0.0
    s = Simulator("v5e-8").run(ev, order)
    assert q.step_s == pytest.approx(s.step_s, rel=0.01)


def test_a_big_transfer_with_a_short_window_stays_exposed(net):
    """A 16 MiB permute whose window holds 0.05 ms, inside a part that a long, small permute
    stretches over 2 ms: the full span would hide it; its own demand set exposes T - 0.05 ms,
    in Q2 and as the placement model's certified objective."""
    colls = [_permute("big", BIG, 1, 5), _permute("long", 4096, 2, 20)]
    ops = [("short", 0.05, 3), ("rest", 2.0, 10)]
    ev = _evidence(colls, ops)
    tm = TrafficModel(ev, net)
    assert [[d.members for d in ds] for ds in tm.demands] == [[(0,)]]
    assert tm.demands[0][0].overlap_s == pytest.approx(0.05e-3, rel=1e-9)
    order = list(range(8))
    q = predict_step(ev, order, net)
    alone = predict_step(_evidence([_permute("big", BIG, 1, 5)], ops), order, net)
    assert q.communication_s == pytest.approx(alone.communication_s, rel=1e-9)
    assert q.communication_s > 0.2e-3
    res = solve_placement(ev, net, time_limit_s=60, seed=0)
    assert res.certificate.status == "OPTIMAL"
    q_best = predict_step(ev, res.placement, net)
    assert res.certificate.objective == pytest.approx(q_best.communication_s, rel=1e-9)
    assert res.certificate.detail["model_objective_s"] == pytest.approx(
        q_best.communication_s, rel=1e-9)


def test_demand_sets_without_schedule_positions_keep_the_shortest_window():
    """No schedule positions: one window per part, the shortest (as before), no sub-demands."""
    a = Collective("a", "all-gather", "bf16", BIG, [list(range(8))], is_async=True,
                   overlap_cycles=_ms(0.3))
    b = Collective("b", "all-gather", "bf16", BIG, [list(range(8))], is_async=True,
                   overlap_cycles=_ms(0.1))
    full, subs = demand_sets([a, b], lambda s, d: None, lambda c: c.overlap_cycles / CLOCK,
                             [BIG, BIG], 45e9)
    assert full == pytest.approx(0.1e-3) and subs == []


def test_link_bytes_bound_covers_every_kind():
    p = _permute("p", 100, 1, 2)
    assert link_bytes_bound(p) == 800
    ag = Collective("g", "all-gather", "bf16", 100, [[0, 1, 2, 3], [4, 5, 6, 7]])
    ar = Collective("r", "all-reduce", "bf16", 100, [[0, 1, 2, 3]])
    a2a = Collective("t", "all-to-all", "bf16", 100, [[0, 1, 2, 3]])
    assert (link_bytes_bound(ag), link_bytes_bound(ar), link_bytes_bound(a2a)) == (600, 600, 300)
