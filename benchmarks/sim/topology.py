"""The simulator's own model of a slice's ICI network: chips, directed links, routes, rings.

Written apart from the planner's ``aoizora.extract.network`` so that the yardstick does not share
its ring and route logic with the cost model it checks. The duplication is deliberate (issue
#47): a duplicate finder will pair this module with ``extract.network``; keep them apart, and
do not import one from the other. A fix found in one is checked against the other, not copied. The hardware facts it starts from are the
slice's shape, its wraparound axes and each device's physical chip coordinates (libtpu's topology
description, through ``aoizora.extract.targets.Target``, or any object with ``shape``, ``wrap``,
``chips`` and ``device_chip``); link bandwidth and hop latency are the simulator's own
(``benchmarks.sim.constants``) unless the caller gives them.

- Links: one directed link per (chip, axis, direction) whose neighbour exists; an axis of
  length n wraps (``n - 1 -> 0``) only when it has wraparound and n >= 3.
- Routes: dimension order (axis 0, then 1, then 2), the shorter way round a wrapped axis, the +1
  way on a tie (the collective expansion splits ties itself).
- Rings (``ring_through``), the simulator's own rule for the order a ring collective visits a
  group's chips (the compiler reorders a group along physical links when it can): a set of up
  to ``EXHAUSTIVE_UP_TO`` chips that is not a full box is searched exhaustively (depth first,
  neighbours by coordinate) for a cycle of single hops, then for a path of single hops; a larger
  set with neither takes the closed tour of fewest hops (the compiler picks the best order it
  can: among those, the first in coordinate order that can run both ways, else the first whose
  one-way steps load no directed link more than the others do); a
  larger set takes a nearest-neighbour tour (repeatedly step to the nearest unvisited member,
  fewest hops, ties by coordinate), started at each member in turn, those with the fewest
  neighbours inside the group first (a path's ends), at most ``MAX_STARTS`` starts; the first
  tour of single hops wins, else the tour of fewest total hops. The result is a *ring* when every step
  and the closing one are single hops (it can run both ways, on distinct links), a *line* when
  every step is a single hop but the closing one is not (one way; the closing step travels back
  along the line), else *scattered* (every step routed; both ways when the forward and backward
  steps share no directed link, else one way). A full box (every chip of a sub-box of the
  slice) is ordered directly: along its axis when it is one-dimensional (closing when that axis
  wraps across the whole slice); else, with the first axis I and the other axes walked as one
  snake path P, when |P| or |I| is even, the cycle that snakes over I[1:] along P and returns
  along I[0]; when both are odd (no cycle on a bipartite grid), a snake line.
Units: bytes/s, seconds.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np


MAX_STARTS = 16             # starts of the nearest-neighbour tour tried per chip set
EXHAUSTIVE_UP_TO = 8        # chip sets up to this size: every order searched for a cycle / path


class TopologyError(ValueError):
    """A chip or device outside the slice."""


@dataclasses.dataclass(frozen=True)
class Ring:
    order: tuple[int, ...]
    kind: str               # "ring", "line", "scattered", "pair", "single"


class SimNetwork:
    """Chips, directed links and routes of one slice (see module docstring)."""

    def __init__(self, shape: Sequence[int], wrap: Sequence[bool],
                 device_coords: Sequence[Sequence[int]], link_Bps: float, hop_latency_s: float,
                 name: str = ""):
        self.shape = tuple(int(s) for s in shape)
        self.wrap = tuple(bool(w) and int(s) >= 3 for w, s in zip(wrap, self.shape))
        self.name = name
        self.link_bandwidth_Bps = float(link_Bps)
        self.hop_latency_s = float(hop_latency_s)
        nd = len(self.shape)
        self.chips: list[tuple[int, ...]] = []
        self.chip_index: dict[tuple[int, ...], int] = {}
        dev = []
        for c in device_coords:
            c = tuple(int(v) for v in c[:nd])
            if any(not 0 <= v < s for v, s in zip(c, self.shape)):
                raise TopologyError(f"device at {c} is outside the {self.shape} slice")
            if c not in self.chip_index:
                self.chip_index[c] = len(self.chips)
                self.chips.append(c)
            dev.append(self.chip_index[c])
        if len(self.chips) != int(np.prod(self.shape)):
            raise TopologyError(f"device coordinates cover {len(self.chips)} of the "
                                f"{int(np.prod(self.shape))} chips of {self.shape}")
        self.device_chip = np.array(dev, dtype=np.int64)
        src, dst = [], []
        self.link_id: dict[tuple[int, int], int] = {}
        for a, c in enumerate(self.chips):
            for ax in range(nd):
                for d in (1, -1):
                    nb = self._step(c, ax, d)
                    if nb is not None and (a, self.chip_index[nb]) not in self.link_id:
                        self.link_id[(a, self.chip_index[nb])] = len(src)
                        src.append(a)
                        dst.append(self.chip_index[nb])
        self.link_src = np.array(src, dtype=np.int64)
        self.link_dst = np.array(dst, dtype=np.int64)
        self.link_bandwidth = np.full(len(src), self.link_bandwidth_Bps)
        self._routes: dict[tuple[int, int], list[int]] = {}
        self._rings: dict[frozenset, Ring] = {}

    @classmethod
    def of(cls, target: Any, link_Bps: float, hop_latency_s: float,
           network: Any = None) -> "SimNetwork":
        """The network of a Target; ``network``: an object describing the slice instead (its
        ``shape``, ``wrap``, ``chips``, ``device_chip`` and, when present, its
        ``link_bandwidth_Bps`` / ``hop_latency_s``), e.g. a hypothetical wraparound."""
        if network is not None:
            coords = [network.chips[int(c)] for c in network.device_chip]
            return cls(network.shape, network.wrap, coords,
                       getattr(network, "link_bandwidth_Bps", link_Bps),
                       getattr(network, "hop_latency_s", hop_latency_s),
                       getattr(network, "name", ""))
        return cls(target.shape, target.wrap, target.device_coords(), link_Bps, hop_latency_s,
                   target.name)

    # -- basics -------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.device_chip)

    @property
    def num_links(self) -> int:
        return len(self.link_src)

    def _step(self, c: tuple[int, ...], ax: int, d: int) -> tuple[int, ...] | None:
        v = c[ax] + d
        if not 0 <= v < self.shape[ax]:
            if not self.wrap[ax]:
                return None
            v %= self.shape[ax]
        return c[:ax] + (v,) + c[ax + 1:]

    def hops(self, a: int, b: int) -> int:
        h = 0
        for ax, n in enumerate(self.shape):
            d = abs(self.chips[a][ax] - self.chips[b][ax])
            h += min(d, n - d) if self.wrap[ax] else d
        return h

    def route(self, a: int, b: int) -> list[int]:
        """Link ids of the dimension-order route from chip a to chip b."""
        key = (a, b)
        got = self._routes.get(key)
        if got is None:
            cur, tgt, got = self.chips[a], self.chips[b], []
            for ax, n in enumerate(self.shape):
                delta = tgt[ax] - cur[ax]
                if delta == 0:
                    continue
                if self.wrap[ax]:
                    fwd = delta % n
                    d, k = (1, fwd) if fwd <= n - fwd else (-1, n - fwd)
                else:
                    d, k = (1 if delta > 0 else -1), abs(delta)
                for _ in range(k):
                    nxt = self._step(cur, ax, d)
                    got.append(self.link_id[(self.chip_index[cur], self.chip_index[nxt])])
                    cur = nxt
            self._routes[key] = got
        return list(got)

    # -- rings --------------------------------------------------------------------------------
    def ring_through(self, chips: Sequence[int]) -> Ring:
        """The order a ring collective visits these chips (module docstring); devices on one
        chip collapse to it. Depends only on the set of chips."""
        members: list[int] = []
        for c in chips:
            c = int(c)
            if not 0 <= c < len(self.chips):
                raise TopologyError(f"chip id {c} outside 0..{len(self.chips) - 1}")
            if c not in members:
                members.append(c)
        key = frozenset(members)
        if key in self._rings:
            return self._rings[key]
        if len(members) == 1:
            r = Ring(tuple(members), "single")
        elif len(members) == 2:
            r = Ring(tuple(sorted(members, key=lambda c: self.chips[c])), "pair")
        else:
            r = self._box(members) or (self._search(members) if len(members) <= EXHAUSTIVE_UP_TO
                                       else None) or self._greedy(members)
        self._rings[key] = r
        return r

    def _box(self, members: list[int]) -> Ring | None:
        coords = [self.chips[c] for c in members]
        lo = [min(c[ax] for c in coords) for ax in range(len(self.shape))]
        hi = [max(c[ax] for c in coords) for ax in range(len(self.shape))]
        span = [h - l + 1 for l, h in zip(lo, hi)]
        if int(np.prod(span)) != len(members):
            return None                                  # not a full box
        axes = [ax for ax in range(len(self.shape)) if span[ax] > 1]
        if len(axes) == 1:
            ax = axes[0]
            order = tuple(sorted(members, key=lambda c: self.chips[c][ax]))
            closes = self.wrap[ax] and span[ax] == self.shape[ax]
            return Ring(order, "ring" if closes else "line")
        # the other axes as one snake path (consecutive chips are neighbours)
        path = [()]
        for ax in reversed(axes[1:]):
            vals = list(range(lo[ax], hi[ax] + 1))
            path = [p + (v,) for i, p in enumerate(path) for v in (vals if i % 2 == 0 else
                                                                  vals[::-1])]
        inner = list(range(lo[axes[0]], hi[axes[0]] + 1))
        if len(path) % 2 and len(inner) % 2 == 0:       # make the path the even side
            return self._box_swap(lo, axes, members)
        def chip(i: int, p: tuple) -> int:
            c = list(lo)
            c[axes[0]] = i
            for ax, v in zip(reversed(axes[1:]), p):
                c[ax] = v
            return self.chip_index[tuple(c)]
        if len(path) % 2 == 0:
            # a cycle: snake over inner[1:] along the path, return along inner[0]
            seq = [chip(i, p) for j, p in enumerate(path)
                   for i in (inner[1:] if j % 2 == 0 else inner[:0:-1])]
            seq += [chip(inner[0], p) for p in reversed(path)]
        else:                                            # both sides odd: a snake line
            seq = [chip(i, p) for j, p in enumerate(path)
                   for i in (inner if j % 2 == 0 else inner[::-1])]
        return self._classify(tuple(seq))

    def _box_swap(self, lo: list[int], axes: list[int], members: list[int]) -> Ring:
        """A 2-axis box whose first axis is the even one: the same cycle with the axes swapped."""
        a0, a1 = axes[0], axes[1]
        n0 = max(self.chips[m][a0] for m in members) - lo[a0] + 1
        n1 = max(self.chips[m][a1] for m in members) - lo[a1] + 1
        def chip(i: int, j: int) -> int:
            c = list(lo)
            c[a1], c[a0] = lo[a1] + i, lo[a0] + j
            return self.chip_index[tuple(c)]
        seq = [chip(i, j) for j in range(n0) for i in (range(1, n1) if j % 2 == 0
                                                      else range(n1 - 1, 0, -1))]
        seq += [chip(0, j) for j in reversed(range(n0))]
        return self._classify(tuple(seq))

    def _search(self, members: list[int]) -> Ring | None:
        """A cycle, else a path, of single hops through all members (depth first)."""
        ms = sorted(members, key=lambda c: self.chips[c])
        adj = {a: [b for b in ms if b != a and self.hops(a, b) == 1] for a in ms}

        def dfs(path: list[int], seen: set, cycle: bool) -> list[int] | None:
            if len(path) == len(ms):
                return path if not cycle or self.hops(path[-1], path[0]) == 1 else None
            for b in adj[path[-1]]:
                if b not in seen:
                    seen.add(b)
                    got = dfs(path + [b], seen, cycle)
                    if got:
                        return got
                    seen.discard(b)
            return None
        got = dfs([ms[0]], {ms[0]}, True)
        if got:
            return Ring(tuple(got), "ring")
        for start in sorted(ms, key=lambda c: (len(adj[c]), self.chips[c])):
            got = dfs([start], {start}, False)
            if got:
                return Ring(tuple(got), "line")
        # scattered: the closed tour of fewest hops; among those, the first (in coordinate
        # order) whose two directions share no directed link, so it can run both ways
        tours: dict[int, list[tuple[int, ...]]] = {}
        for rest in itertools.permutations(ms[1:]):
            tour = (ms[0],) + rest
            h = sum(self.hops(tour[i], tour[(i + 1) % len(tour)]) for i in range(len(tour)))
            tours.setdefault(h, []).append(tour)
        shortest = tours[min(tours)]
        for tour in shortest:
            if self.ring_directions(Ring(tour, "scattered")) == 2:
                return Ring(tour, "scattered")
        return Ring(min(shortest, key=self._self_contention), "scattered")

    def _self_contention(self, tour: tuple[int, ...]) -> int:
        """How many of a one-way tour's steps cross its busiest directed link."""
        load: dict[int, int] = {}
        for i in range(len(tour)):
            for lid in self.route(tour[i], tour[(i + 1) % len(tour)]):
                load[lid] = load.get(lid, 0) + 1
        return max(load.values(), default=0)

    def _greedy(self, members: list[int]) -> Ring:
        def degree(c: int) -> int:
            return sum(1 for m in members if m != c and self.hops(c, m) == 1)
        starts = sorted(members, key=lambda c: (degree(c), self.chips[c]))[:MAX_STARTS]
        best = None
        for s in starts:
            left = sorted((m for m in members if m != s), key=lambda c: self.chips[c])
            order = [s]
            while left:
                nxt = min(left, key=lambda c: (self.hops(order[-1], c), self.chips[c]))
                left.remove(nxt)
                order.append(nxt)
            total = sum(self.hops(order[i], order[i + 1]) for i in range(len(order) - 1))
            if total == len(order) - 1:
                return self._classify(tuple(order))
            if best is None or total < best[0]:
                best = (total, tuple(order))
        return self._classify(best[1])

    def _classify(self, order: tuple[int, ...]) -> Ring:
        steps = [self.hops(order[i], order[i + 1]) for i in range(len(order) - 1)]
        if all(h == 1 for h in steps):
            return Ring(order, "ring" if self.hops(order[-1], order[0]) == 1 else "line")
        return Ring(order, "scattered")

    def ring_step_routes(self, ring: Ring) -> list[list[int]]:
        """Link ids of each step of a ring, the closing one last; a line's closing step travels
        back along the line."""
        o, k = ring.order, len(ring.order)
        if k < 2:
            return []
        steps = [self.route(o[i], o[i + 1]) for i in range(k - 1)]
        if ring.kind == "line":
            steps.append([self.link_id[(o[i], o[i - 1])] for i in range(k - 1, 0, -1)])
        else:
            steps.append(self.route(o[-1], o[0]))
        return steps

    def ring_directions(self, ring: Ring) -> int:
        """2 when a ring collective can run both ways at full speed (module docstring), else 1."""
        if ring.kind == "ring":
            return 2
        if ring.kind != "scattered":
            return 1
        o, k, used = ring.order, len(ring.order), set()
        for i in range(k):
            for j in ((i + 1) % k, (i - 1) % k):
                for lid in self.route(o[i], o[j]):
                    if lid in used:
                        return 1
                    used.add(lid)
        return 2
