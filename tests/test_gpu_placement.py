"""Placement on GPU fabrics (issue 49): the same CP-SAT model and Q2 pricing over switched links
of different bandwidth (PCIe 24 GB/s, UPI 10 GB/s on l40-8; NVLink and InfiniBand rails on
h100-16), with the integer link weights of ``PlacementModel._link_weights``."""

import numpy as np
import pytest

from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.extract.targets import get_target
from aoizora.formulation.placement_cpsat import PlacementModel
from aoizora.formulation.traffic import TrafficModel
from aoizora.solvers.placement import solve_placement


def _ev(target, mesh, groups_by_kind):
    cs = [Collective(name=f"c{i}", kind=k, dtype="bf16", bytes=V, replica_groups=g, phase=i,
                     count=1) for i, (k, V, g) in enumerate(groups_by_kind)]
    return Evidence(target=target, mesh_axes=mesh, collectives=cs)


def _tp_sp(n_inner):
    """A 2 x 4 mesh: all-gathers of 64 MiB over the inner axis (consecutive ranks) and 1 MiB
    all-reduces over the outer one."""
    inner = [list(range(i, i + n_inner)) for i in range(0, 8, n_inner)]
    outer = [[i + j * n_inner for j in range(8 // n_inner)] for i in range(n_inner)]
    return [("all-gather", 64 << 20, inner), ("all-reduce", 1 << 20, outer)]


def test_link_weights_are_exact_time_ratios():
    net = Network.from_target(get_target("l40-8"))
    pm = PlacementModel(_ev("l40-8", {"a": 2, "b": 4}, _tp_sp(4)), net)
    # fastest link 24 GB/s: PCIe weight 5, UPI (10 GB/s) 12 = 5 x 24 / 10
    assert sorted(set(pm.link_weight.tolist())) == [5, 12] and pm.bandwidth == 24e9 * 5
    assert pm.formulation == "sets"


@pytest.mark.parametrize("name", ["l40-8", "h100-8"])
def test_cpsat_placement_matches_q2_and_keeps_groups_in_a_socket(name):
    net = Network.from_target(get_target(name))
    ev = _ev(name, {"a": 2, "b": 4}, _tp_sp(4))
    worst = [0, 4, 1, 5, 2, 6, 3, 7]          # every inner group across the sockets
    res = solve_placement(ev, net, time_limit_s=20.0, hint=worst)
    tm = TrafficModel(ev, net)
    chips = np.asarray(res.placement)
    assert tm.cost(res.placement)[0] <= tm.cost(worst)[0]
    if name == "l40-8":
        # optimum: each 4-GPU all-gather group inside one socket (PCIe-bound, not UPI-bound)
        sockets = {tuple(sorted({int(net.chips[c][2]) for c in chips[g]}))
                   for g in ev.collectives[0].replica_groups}
        assert sockets == {(0,), (1,)}
        assert tm.cost(res.placement)[0] < 0.5 * tm.cost(worst)[0]
    else:                                     # NVSwitch: every placement costs the same
        assert tm.cost(res.placement)[0] == pytest.approx(tm.cost(worst)[0])
    assert res.certificate.status == "OPTIMAL"


def test_ilp_axis_costs_come_from_the_fabric():
    from aoizora.formulation.collective_cost import default_axis_costs
    c = default_axis_costs(get_target("l40-8"), {"x": 2, "y": 4})
    # y: two 4-GPU rings, one per socket, on 24 GB/s PCIe; x: four cross-socket pairs at once
    # share the 10 GB/s UPI link: 2.5 GB/s each
    assert 1 / c.beta_s_per_byte["y"] == pytest.approx(24e9)
    assert 1 / c.beta_s_per_byte["x"] == pytest.approx(2.5e9)
    h = default_axis_costs(get_target("h100-16"), {"d": 2, "s": 8})
    assert 1 / h.beta_s_per_byte["s"] == pytest.approx(370.8e9)
    assert 1 / h.beta_s_per_byte["d"] == pytest.approx(8 * 48e9 / 8)
