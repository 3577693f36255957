"""The physical network: links, wraparound, dimension-order routes and rings, checked by hand."""

import itertools

import numpy as np
import pytest

from aoizora.extract import network as network_module
from aoizora.extract.network import Network, NetworkError, default_device_order
from aoizora.extract.targets import get_target


def net_of(name):
    return Network.from_target(get_target(name))


def cid(net, *coords):
    return net.chip_index[tuple(coords)]


def route_coords(net, a, b):
    """The route as the list of (from, to) chip coordinates."""
    return [(net.chips[net.link(l)[0]], net.chips[net.link(l)[1]]) for l in net.route(a, b)]


@pytest.mark.parametrize("name,chips,links", [
    # 2D mesh X x Y without wrap: 2 * (X-1) * Y + 2 * X * (Y-1) directed links
    ("v5e:2x2", 4, 8),          # 2*1*2 + 2*2*1
    ("v5e:2x4", 8, 20),         # 2*1*4 + 2*2*3
    ("v5e:4x4", 16, 48),        # 2*3*4 + 2*4*3
    ("v5e:16x16", 256, 1024),   # torus: 4 links per chip
    ("v5p:2x2x2", 8, 24),       # 3 axes x 4 lines x 2 directions
])
def test_link_counts(name, chips, links):
    net = net_of(name)
    assert (net.num_chips, net.num_links) == (chips, links)
    # every link joins chips one step apart on one axis
    d = np.abs(net.coords[net.link_src] - net.coords[net.link_dst])
    n = np.array(net.shape)
    step = np.where(d == n - 1, 1, d) if any(net.wrap) else d
    assert (step.sum(axis=1) == 1).all()


def test_wrap_exactly_where_the_target_says():
    t16 = net_of("v5e:16x16")
    assert t16.wrap == (True, True)
    assert t16.is_adjacent(cid(t16, 15, 3), cid(t16, 0, 3))
    assert t16.is_adjacent(cid(t16, 2, 0), cid(t16, 2, 15))
    t44 = net_of("v5e:4x4")
    assert not t44.is_adjacent(cid(t44, 3, 0), cid(t44, 0, 0))
    assert t44.hops[cid(t44, 0, 0), cid(t44, 3, 3)] == 6
    # 8x16: only the 16-long axis wraps
    t816 = Network((8, 16), get_target("v5e:8x16").wrap, 4.5e10, 1e-6)
    assert t816.wrap == (False, True)
    assert t816.is_adjacent(cid(t816, 0, 15), cid(t816, 0, 0))
    assert not t816.is_adjacent(cid(t816, 7, 0), cid(t816, 0, 0))


def test_routes_2x2_and_2x4_by_hand():
    net = net_of("v5e:2x2")
    # dimension order: x first, then y
    assert route_coords(net, cid(net, 0, 0), cid(net, 1, 1)) == [((0, 0), (1, 0)), ((1, 0), (1, 1))]
    assert route_coords(net, cid(net, 1, 1), cid(net, 0, 0)) == [((1, 1), (0, 1)), ((0, 1), (0, 0))]
    assert net.route(2, 2) == []
    net = net_of("v5e:2x4")
    assert route_coords(net, cid(net, 1, 0), cid(net, 0, 3)) == [
        ((1, 0), (0, 0)), ((0, 0), (0, 1)), ((0, 1), (0, 2)), ((0, 2), (0, 3))]
    assert net.hops.max() == 4 and net.hops.sum() == 2 * sum(
        abs(a[0] - b[0]) + abs(a[1] - b[1]) for i, a in enumerate(net.chips)
        for b in net.chips[i + 1:])


def test_routes_4x4_and_2x2x2_by_hand():
    net = net_of("v5e:4x4")
    assert route_coords(net, cid(net, 3, 1), cid(net, 1, 3)) == [
        ((3, 1), (2, 1)), ((2, 1), (1, 1)), ((1, 1), (1, 2)), ((1, 2), (1, 3))]
    net = net_of("v5p:2x2x2")
    assert route_coords(net, cid(net, 0, 0, 0), cid(net, 1, 1, 1)) == [
        ((0, 0, 0), (1, 0, 0)), ((1, 0, 0), (1, 1, 0)), ((1, 1, 0), (1, 1, 1))]
    assert net.hops.max() == 3


def test_routes_16x16_torus_shortest_direction_and_tie_break():
    net = net_of("v5e:16x16")
    # 0 -> 14 on x: two hops backwards over the wrap link
    assert route_coords(net, cid(net, 0, 0), cid(net, 14, 0)) == [
        ((0, 0), (15, 0)), ((15, 0), (14, 0))]
    # distance 8 either way: the +1 direction
    r = route_coords(net, cid(net, 0, 5), cid(net, 8, 5))
    assert len(r) == 8 and r[0] == ((0, 5), (1, 5))
    # x then y, y wraps: (3, 1) -> (5, 15): +2 on x, then -2 on y through the wrap
    assert route_coords(net, cid(net, 3, 1), cid(net, 5, 15)) == [
        ((3, 1), (4, 1)), ((4, 1), (5, 1)), ((5, 1), (5, 0)), ((5, 0), (5, 15))]
    assert net.hops.max() == 16


def test_flows_to_link_bytes():
    net = net_of("v5e:2x4")
    f = net.flows_to_link_bytes(np.array([cid(net, 0, 0)]), np.array([cid(net, 1, 2)]),
                                np.array([10.0]))
    assert f.sum() == 30.0 and sorted(f[f > 0].tolist()) == [10.0, 10.0, 10.0]


def test_rings_lines_and_scattered():
    net = net_of("v5e:4x4")
    sq = [cid(net, 0, 0), cid(net, 1, 0), cid(net, 0, 1), cid(net, 1, 1)]
    r = net.ring_through(sq)
    assert r.kind == "ring" and len(r.order) == 4
    o = r.order
    assert all(net.is_adjacent(o[i], o[(i + 1) % 4]) for i in range(4))
    col = [cid(net, 2, y) for y in range(4)]
    r = net.ring_through(col[::-1])
    assert r.kind == "line" and list(r.order) == col
    ell = [cid(net, 0, 0), cid(net, 1, 0), cid(net, 2, 0), cid(net, 2, 1)]
    assert net.ring_through(ell).kind == "line"
    diag = [cid(net, i, i) for i in range(4)]
    r = net.ring_through(diag)
    assert r.kind == "scattered" and list(r.order) == diag
    full = net.ring_through(range(16))
    assert full.kind == "ring" and sorted(full.order) == list(range(16))
    assert all(net.is_adjacent(full.order[i], full.order[(i + 1) % 16]) for i in range(16))
    assert net.ring_through([5, 9]).kind == "pair"
    # a full wrapped axis closes into a ring
    t = net_of("v5e:16x16")
    assert t.ring_through([cid(t, x, 3) for x in range(16)]).kind == "ring"
    assert t.ring_through([cid(t, x, 3) for x in range(8)]).kind == "line"
    with pytest.raises(NetworkError):
        net.ring_through([99])


def _brute_force_kind(net, chips):
    """The ring kind ("ring", "line" or "scattered") by trying every order of the chips."""
    first = chips[0]
    kind = "scattered"
    for perm in itertools.permutations(chips):
        if all(net.is_adjacent(perm[i], perm[i + 1]) for i in range(len(perm) - 1)):
            if perm[0] == first and net.is_adjacent(perm[-1], first):
                return "ring"
            kind = "line"
    return kind


@pytest.mark.parametrize("shape,wrap,max_chips", [
    ((2, 4), (False, False), 8),       # bipartite: the colour-class conditions apply
    ((3, 3), (True, True), 7),         # odd wrapped axes: not bipartite
])
def test_ring_kind_is_whether_a_cycle_or_path_exists(shape, wrap, max_chips):
    """The necessary conditions that skip searches never skip one that would succeed: on every
    chip set of a small grid the ring kind is what trying every order says."""
    net = Network(shape, wrap, 1e9, 1e-6)
    for k in range(3, max_chips + 1):
        for chips in itertools.combinations(range(net.num_chips), k):
            assert net.ring_through(chips).kind == _brute_force_kind(net, list(chips)), chips


def test_ring_search_budget_is_per_chip_set(monkeypatch):
    """All searches of one chip set share one node budget; what they have not found by then is
    absent (pricing a set is bounded work)."""
    net = net_of("v5e:4x4")
    ell = [cid(net, 0, 0), cid(net, 1, 0), cid(net, 2, 0), cid(net, 2, 1), cid(net, 1, 1)]
    assert net.ring_through(ell).kind == "line"
    monkeypatch.setattr(network_module, "_DFS_NODE_LIMIT", 3)
    assert net_of("v5e:4x4").ring_through(ell).kind == "scattered"
    monkeypatch.undo()
    # v5e-256: a 16x8 box less one chip, plus the chip across the wrap from column 10; its only
    # paths start at that chip, which 63 starts in id order come before
    t = net_of("v5e:16x16")
    box = [cid(t, x, y) for y in range(8) for x in range(16) if (x, y) != (5, 4)]
    assert t.ring_through(box + [cid(t, 10, 15)]).kind == "scattered"


def test_v4_two_devices_per_chip():
    net = net_of("v4:2x2x2")
    assert net.num_devices == 16 and net.num_chips == 8
    assert net.device_chip[0] == net.device_chip[1]
    assert net.hops[net.device_chip[0], net.device_chip[1]] == 0


def test_default_device_order_is_jax_make_mesh():
    t = get_target("v5e:2x4")
    # jax/_src/mesh_utils.py: the v5e 8-chip ring order (shared/facts/practice.md)
    assert default_device_order(t, {"a": 2, "b": 4}) == [0, 1, 2, 3, 7, 6, 5, 4]
    assert default_device_order(get_target("v5e:2x2"), (4,)) == [0, 1, 3, 2]
    assert default_device_order(get_target("v5e:4x4"), (4, 4)) == list(range(16))
    with pytest.raises(NetworkError, match="ranks"):
        default_device_order(t, (3, 3))


def test_default_order_falls_back_on_v4():
    """JAX refuses v4's two devices per chip; the fallback is device id order, and says so."""
    from aoizora.extract.network import default_device_order_source
    t = get_target("v4:2x2x2")
    assert default_device_order(t, (2, 8)) == list(range(16))
    assert default_device_order_source(t, (2, 8)) == "device id order"
