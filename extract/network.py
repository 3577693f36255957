"""The physical network of a TPU slice: chips, directed ICI links, dimension-order routes, rings.

Built from a `Target` (``Network.from_target``): its devices and their physical coordinates
(libtpu's topology), the chip's one-way link bandwidth and per-hop latency
(``shared/facts/tpu.md``), and wraparound exactly where the target has it.

Model
- Chips are numbered 0..C-1 in the order they first appear in ``target.devices()`` (for v5e this
  is x-fastest: chip ``i`` has coordinates ``(i % X, i // X)``). ``device_chip[d]`` is the chip of
  device ``d`` (v4 shows two devices per chip; two devices on one chip talk without a link).
- Links are directed: one per (chip, axis, direction) whose neighbour exists. On an axis of
  length ``n`` the neighbour of ``x`` in direction ``+1`` is ``x + 1`` (``0`` after ``n - 1``
  only when the axis wraps and ``n >= 3``; a wrapped axis of 2 adds no second link). Every link
  has the same one-way bandwidth ``link_bandwidth_Bps`` (bytes/s) and latency ``hop_latency_s``.
- Routing is dimension order: the transfer first moves along axis 0 to the destination's
  coordinate, then along axis 1, then axis 2. On a wrapped axis it takes the shorter direction;
  on a tie (distance exactly ``n / 2``) the ``+1`` direction (deterministic).
  ``route_links[a * C + b]`` holds the link ids of the route from chip ``a`` to chip ``b``,
  padded with -1 (a numpy table precomputed once: routing is in the pricing's inner loop);
  ``hops[a, b]`` its length.
- A ring through a group of chips (``ring_through``): the compiler reorders the members of a
  group along physical links. If the chips admit a cycle that uses only physical links (a
  Hamiltonian cycle of the induced subgraph, >= 3 chips) the ring *closes* and both directions
  are used; else if they admit a path on physical links the group is a *line* (one direction,
  the closing step travels back along the line); else the chips are *scattered*: no physical
  ring exists and the compiler's reordering is modelled as the tour of fewest hops (exhaustive
  for up to 7 chips, else nearest neighbour from the smallest chip id), every step routed by
  dimension order. The cycle / path is found by a deterministic depth-first search (neighbours in
  chip-id order; the cycle from the smallest chip id, a path from each possible start in id
  order), all of one set's searches at most ``_DFS_NODE_LIMIT`` nodes together (what they have
  not found by then counts as absent), so pricing a set is bounded work, the same on every
  machine; necessary conditions (connected; at most two chips of degree 1; on a bipartite
  grid, colour classes equal for a cycle, within one for a path) skip the searches that cannot
  succeed. For full boxes the ring is constructed directly. The ring depends only on the *set*
  of chips, never on the logical order.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from aoizora.extract.link_graph import LinkGraph, NetworkError, Ring
from aoizora.extract.switched_network import SwitchedNetwork

__all__ = ["LinkGraph", "Network", "NetworkError", "Ring", "SwitchedNetwork",
           "default_device_order", "default_device_order_source"]


# Node budget of the Hamiltonian cycle / path searches of one chip set that is not a full box,
# all its searches together (when each search had it, a 128-chip set of v5e-256 whose paths all
# start at one chip tried 127 starts: 13 s). Sets of up to 16 chips need at most 633 (every
# subset of 4x4 enumerated), so their rings do not depend on it.
_DFS_NODE_LIMIT = 200_000


class Network(LinkGraph):
    """Chips, directed links, dimension-order route table. See the module docstring."""

    def __init__(self, shape: Sequence[int], wrap: Sequence[bool], link_bandwidth_Bps: float,
                 hop_latency_s: float, device_coords: Sequence[Sequence[int]] | None = None,
                 name: str = "", peak_flops: float = 0.0, hbm_bandwidth_Bps: float = 0.0):
        self.shape = tuple(int(s) for s in shape)
        self.wrap = tuple(bool(w) for w in wrap)
        if len(self.shape) != len(self.wrap) or any(s < 1 for s in self.shape):
            raise NetworkError(f"network shape {self.shape} / wrap {self.wrap}: give one wrap "
                               "flag per axis and axes >= 1")
        self.name = name
        self.link_bandwidth_Bps = float(link_bandwidth_Bps)
        self.hop_latency_s = float(hop_latency_s)
        self.peak_flops = float(peak_flops)
        self.hbm_bandwidth_Bps = float(hbm_bandwidth_Bps)
        nd = len(self.shape)
        all_coords = [tuple(int(v) for v in c)
                      for c in itertools.product(*[range(s) for s in reversed(self.shape)])]
        all_coords = [tuple(reversed(c)) for c in all_coords]          # x fastest
        if device_coords is None:
            device_coords = all_coords
        device_coords = [tuple(int(v) for v in c[:nd]) for c in device_coords]
        chips: list[tuple[int, ...]] = []
        index: dict[tuple[int, ...], int] = {}
        dev_chip = []
        for c in device_coords:
            if c not in index:
                index[c] = len(chips)
                chips.append(c)
            dev_chip.append(index[c])
        if sorted(chips) != sorted(all_coords):
            raise NetworkError(f"device coordinates do not cover the {self.shape} slice")
        self.chips: list[tuple[int, ...]] = chips
        self.chip_index = index
        self.coords = np.array(chips, dtype=np.int64).reshape(len(chips), nd)
        self.device_chip = np.array(dev_chip, dtype=np.int64)
        self._build_links()
        self._build_routes()
        self._ring_cache: dict[frozenset, Ring] = {}

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_target(cls, target) -> "Network":
        """The network of a `aoizora.extract.targets.Target`: a torus for a TPU slice (device
        coordinates from libtpu), a `SwitchedNetwork` for a target with a fabric (GPUs)."""
        if getattr(target, "fabric", None) is not None:
            return SwitchedNetwork.from_target(target)
        c = target.chip
        return cls(target.shape, target.wrap, c.link_bandwidth_Bps, c.hop_latency_s,
                   device_coords=target.device_coords(), name=target.name,
                   peak_flops=c.device_peak_flops, hbm_bandwidth_Bps=c.device_hbm_bandwidth_Bps)

    def _neighbor(self, c: tuple[int, ...], axis: int, d: int) -> tuple[int, ...] | None:
        n = self.shape[axis]
        v = c[axis] + d
        if 0 <= v < n:
            pass
        elif self.wrap[axis] and n >= 3:
            v %= n
        else:
            return None
        return c[:axis] + (v,) + c[axis + 1:]

    def _build_links(self) -> None:
        src, dst, ax, dr = [], [], [], []
        self.link_id: dict[tuple[int, int], int] = {}
        for a, c in enumerate(self.chips):
            for axis in range(len(self.shape)):
                for d in (1, -1):
                    nb = self._neighbor(c, axis, d)
                    if nb is None:
                        continue
                    b = self.chip_index[nb]
                    if (a, b) in self.link_id:       # e.g. +1 and -1 reach the same chip
                        continue
                    self.link_id[(a, b)] = len(src)
                    src.append(a); dst.append(b); ax.append(axis); dr.append(d)
        self.link_src = np.array(src, dtype=np.int64)
        self.link_dst = np.array(dst, dtype=np.int64)
        self.link_axis = np.array(ax, dtype=np.int64)
        self.link_dir = np.array(dr, dtype=np.int64)
        self.link_bandwidth = np.full(len(src), self.link_bandwidth_Bps)
        self.adjacency: list[list[int]] = [sorted({int(b) for (a2, b) in self.link_id if a2 == a})
                                           for a in range(self.num_chips)]

    def _step_dir(self, axis: int, x: int, y: int) -> tuple[int, int]:
        """(direction, steps) to go from coordinate x to y on an axis."""
        n = self.shape[axis]
        if x == y:
            return 0, 0
        if self.wrap[axis] and n >= 3:
            fwd = (y - x) % n
            bwd = n - fwd
            return (1, fwd) if fwd <= bwd else (-1, bwd)
        return (1, y - x) if y > x else (-1, x - y)

    def _route(self, a: int, b: int) -> list[int]:
        cur = self.chips[a]
        tgt = self.chips[b]
        out = []
        for axis in range(len(self.shape)):
            d, k = self._step_dir(axis, cur[axis], tgt[axis])
            for _ in range(k):
                nxt = self._neighbor(cur, axis, d)
                out.append(self.link_id[(self.chip_index[cur], self.chip_index[nxt])])
                cur = nxt
        return out

    def _build_routes(self) -> None:
        C = self.num_chips
        routes = [self._route(a, b) for a in range(C) for b in range(C)]
        maxh = max((len(r) for r in routes), default=0)
        table = np.full((C * C, max(maxh, 1)), -1, dtype=np.int64)
        hops = np.zeros(C * C, dtype=np.int64)
        for i, r in enumerate(routes):
            table[i, :len(r)] = r
            hops[i] = len(r)
        self.route_links = table
        self.hops = hops.reshape(C, C)

    # -- rings --------------------------------------------------------------------------------
    def ring_through(self, chips: Sequence[int]) -> Ring:
        """The ring a collective runs through these chips (see module docstring).

        `chips` in the group's logical order (duplicates, i.e. devices on one chip, collapse)."""
        order = self.distinct_chips(chips)
        key = frozenset(order)
        cached = self._ring_cache.get(key)
        if cached is not None:
            return cached
        if len(order) == 1:
            r = Ring(tuple(order), "single")
        elif len(order) == 2:
            r = Ring(tuple(sorted(order)), "pair")
        else:
            r = (self._find_ring(sorted(order))
                 or Ring(self._fewest_hop_tour(sorted(order)), "scattered"))
        self._ring_cache[key] = r
        return r

    def _find_ring(self, members: list[int]) -> Ring | None:
        box = self._box_ring(members)
        if box is not None:
            return box
        mset = set(members)
        adj = {a: [b for b in self.adjacency[a] if b in mset] for a in members}
        can_cycle, starts = _hamiltonian_candidates(members, adj)
        budget = [_DFS_NODE_LIMIT]                     # shared by every search of this set
        if can_cycle:
            cyc = _ham_search(members, adj, budget, cycle=True)
            if cyc is not None:
                return Ring(tuple(cyc), "ring")
        # path: try every start that can begin one, in id order
        for s in starts:
            if budget[0] <= 0:
                break
            p = _ham_search(members, adj, budget, cycle=False, start=s)
            if p is not None:
                return Ring(tuple(p), "line")
        return None

    def _fewest_hop_tour(self, members: list[int]) -> tuple[int, ...]:
        """Closed tour through the chips with the fewest dimension-order hops (deterministic)."""
        H = self.hops
        def length(t):
            return sum(int(H[t[i], t[(i + 1) % len(t)]]) for i in range(len(t)))
        first, rest = members[0], members[1:]
        if len(members) <= 7:
            best = None
            for perm in itertools.permutations(rest):
                t = (first,) + perm
                key = (length(t), t)
                if best is None or key < best:
                    best = key
            return best[1]
        tour = [first]
        left = list(rest)
        while left:
            nxt = min(left, key=lambda b: (int(H[tour[-1], b]), b))
            tour.append(nxt)
            left.remove(nxt)
        return tuple(tour)

    def _box_ring(self, members: list[int]) -> Ring | None:
        """Constructive ring / line when the chips fill a box of intervals (no wrap needed)."""
        co = self.coords[members]
        lo, hi = co.min(axis=0), co.max(axis=0)
        ext = hi - lo + 1
        if int(np.prod(ext)) != len(members):
            return None
        big = [i for i, e in enumerate(ext) if e > 1]
        if len(big) == 1:                      # a straight line
            ax = big[0]
            seq = sorted(members, key=lambda m: self.chips[m][ax])
            n = self.shape[ax]
            closes = self.wrap[ax] and n >= 3 and ext[ax] == n
            return Ring(tuple(seq), "ring" if closes else "line")
        if len(big) == 2 and (ext[big[0]] % 2 == 0 or ext[big[1]] % 2 == 0):
            a0, a1 = big                       # boustrophedon over a1 (rows of a0), back on col 0
            if ext[a0] % 2 != 0:
                a0, a1 = a1, a0
            by = {tuple(self.chips[m][k] - lo[k] for k in range(len(lo))): m for m in members}
            def at(i0, i1):
                c = [0] * len(lo)
                c[a0], c[a1] = i0, i1
                return by[tuple(c)]
            n0, n1 = int(ext[a0]), int(ext[a1])
            seq = [at(i0, 0) for i0 in range(n0)]
            for i0 in reversed(range(n0)):
                cols = range(1, n1) if (n0 - 1 - i0) % 2 == 0 else reversed(range(1, n1))
                seq += [at(i0, i1) for i1 in cols]
            # seq: down column 0, then snake back through columns 1.. ; ends next to at(0, 0)
            return Ring(tuple(seq), "ring")
        return None


def _hamiltonian_candidates(members: list[int], adj: dict[int, list[int]]
                            ) -> tuple[bool, list[int]]:
    """Whether the induced graph can have a Hamiltonian cycle, and the members a Hamiltonian
    path can start from (in id order), by necessary conditions only: connected; at most two
    members of degree 1 (a path's ends: with two, it starts at one of them; with any, no
    cycle); when the graph is bipartite (every grid without an odd wrapped axis) with classes
    of sizes a and b, a cycle needs a == b and a path |a - b| <= 1, its ends both in the larger
    class when they differ, one in each when they do not (so with one member of degree 1, a
    start in its class is that member). A start or cycle ruled out here is one the search could
    not find; skipping it leaves the set's node budget to the others."""
    color = {members[0]: 0}
    queue, bipartite = [members[0]], True
    for a in queue:
        for b in adj[a]:
            if b not in color:
                color[b] = 1 - color[a]
                queue.append(b)
            elif color[b] == color[a]:
                bipartite = False
    if len(color) < len(members):                     # not connected
        return False, []
    ends = [m for m in members if len(adj[m]) == 1]
    if len(ends) > 2:
        return False, []
    can_cycle = not ends
    starts = ends if len(ends) == 2 else list(members)  # two ends: the path runs between them
    if bipartite:
        ones = sum(color.values())
        diff = (len(members) - ones) - ones             # class 0 minus class 1
        can_cycle = can_cycle and diff == 0
        if abs(diff) > 1:
            return False, []
        if diff:                                        # both ends in the larger class
            starts = [m for m in starts if color[m] == (0 if diff > 0 else 1)]
        elif len(ends) == 1:                            # the other end in the other class
            starts = [m for m in starts if m == ends[0] or color[m] != color[ends[0]]]
    return can_cycle, starts


def _ham_search(members: list[int], adj: dict[int, list[int]], budget: list[int], cycle: bool,
                start: int | None = None) -> list[int] | None:
    """Deterministic DFS for a Hamiltonian cycle (or path from `start`) in a small graph; each
    node visited takes one from ``budget[0]``, and the search fails when it runs out."""
    n = len(members)
    s = members[0] if start is None else start
    path = [s]
    seen = {s}

    def dfs() -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if len(path) == n:
            return (not cycle) or s in adj[path[-1]]
        for b in adj[path[-1]]:
            if b in seen:
                continue
            path.append(b); seen.add(b)
            if dfs():
                return True
            path.pop(); seen.discard(b)
        return False

    if any(len(adj[m]) == 0 for m in members):
        return None
    if cycle and any(len(adj[m]) < 2 for m in members):
        return None
    return list(path) if dfs() else None


# ---------------------------------------------------------------------------------------------
def default_device_order(target, mesh_axes: "dict[str, int] | Sequence[int]") -> list[int]:
    """JAX's default device order for a logical mesh on the target: device index (position in
    ``target.devices()``) of each logical rank, in ``mesh.devices.flat`` order.

    Uses ``jax.make_mesh(axis_shapes, axis_names, devices=target.devices())``, what a user gets
    by default. Where JAX refuses the devices (v4 shows two devices per chip, and JAX needs
    "megacore" devices) it falls back to ``jax.sharding.Mesh`` over the devices in id order, which
    is what a user building the mesh by hand gets; the docstring of the result's caller should say
    so (``default_device_order_source`` tells which)."""
    return _default_order(target, mesh_axes)[0]


def default_device_order_source(target, mesh_axes) -> str:
    """"jax.make_mesh" or "device id order" (see default_device_order)."""
    return _default_order(target, mesh_axes)[1]


def _default_order(target, mesh_axes) -> tuple[list[int], str]:
    if isinstance(mesh_axes, dict):
        names = tuple(mesh_axes.keys())
        shape = tuple(int(v) for v in mesh_axes.values())
    else:
        shape = tuple(int(v) for v in mesh_axes)
        names = tuple(f"axis_{i}" for i in range(len(shape)))
    n = int(np.prod(shape)) if shape else 1
    if target.family == "gpu":
        # rank r on GPU r: CUDA_VISIBLE_DEVICES order, what torch's init_device_mesh and
        # jax.make_mesh over GPU devices give
        if n != target.num_devices:
            raise NetworkError(f"logical mesh {shape} has {n} ranks but {target.name} has "
                               f"{target.num_devices} GPUs: use a mesh whose sizes multiply to that")
        return list(range(n)), "device id order"
    devices = target.devices()
    if n != len(devices):
        raise NetworkError(f"logical mesh {shape} has {n} ranks but {target.name} has "
                           f"{len(devices)} devices: use a mesh whose sizes multiply to that")
    import jax
    pos = {d.id: i for i, d in enumerate(devices)}
    try:
        mesh = jax.make_mesh(shape, names, devices=devices,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(shape))
        return [pos[d.id] for d in mesh.devices.flat], "jax.make_mesh"
    except (ValueError, NotImplementedError, AssertionError):
        return list(range(n)), "device id order"
