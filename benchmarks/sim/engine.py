"""Event-driven flow engine: transfers on directed links, shared max-min fairly.

A *transfer* moves ``bytes`` from one chip to another over a fixed route (a list of directed link
ids). It may not start before its ``release`` time nor before every transfer it depends on has
completed (``deps``: a ring step forwards the chunk it received in the previous step).

Timing of one transfer (cut-through, as ICI forwards packets without storing whole messages):
- from its start it *drains* its bytes at the rate the fair share gives it on every link of its
  route at once, the rate being recomputed at every event;
- when the last byte has left, it completes ``latency`` seconds later (hops x per-hop latency);
  the links are not held during that tail.
Alone on an uncontended route a transfer of b bytes over h hops thus takes b / W + h * lat.

Fair sharing (max-min, progressive filling), recomputed whenever a transfer starts or drains:
all unfrozen transfers grow at the same rate; the first link to fill (smallest
``capacity[l] / #unfrozen transfers on l``) freezes every transfer crossing it at that share; its
capacity is taken from the other links they cross; repeat until every transfer is frozen.
A transfer with no links (same chip) or zero bytes drains instantly.

Transfers are tagged with an integer ``tag`` (the collective they belong to) so that the caller can
ask when a tag's last transfer completes. Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

_TIME_TOL = 1e-12        # s: events closer than this are simultaneous
_BYTES_TOL = 1e-6        # bytes: a transfer with less than this left has drained


class EngineError(ValueError):
    """Inconsistent input to the flow engine (bad link id, dependency cycle, unknown tag)."""


def maxmin_rates(pair_flow: np.ndarray, pair_link: np.ndarray, n_flows: int,
                 capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates (bytes/s) of ``n_flows`` flows.

    ``pair_flow[k]`` crosses link ``pair_link[k]`` (local flow index 0..n_flows-1, global link id).
    ``capacity[l]`` is link l's bandwidth. Every flow must cross at least one link.
    Progressive filling: see the module docstring.
    """
    rate = np.zeros(n_flows)
    if n_flows == 0:
        return rate
    links, pl = np.unique(pair_link, return_inverse=True)
    capr = capacity[links].astype(float).copy()
    nl = len(links)
    pf = pair_flow
    alive = np.ones(len(pf), dtype=bool)
    flow_alive = np.ones(n_flows, dtype=bool)
    while True:
        cnt = np.bincount(pl[alive], minlength=nl)
        used = cnt > 0
        if not used.any():
            break
        share = np.full(nl, np.inf)
        share[used] = np.maximum(capr[used], 0.0) / cnt[used]
        m = share.min()
        bott = share <= m * (1.0 + 1e-9) + 1e-300
        hit = alive & bott[pl]
        frozen = np.zeros(n_flows, dtype=bool)
        frozen[pf[hit]] = True
        frozen &= flow_alive
        rate[frozen] = m
        sel = alive & frozen[pf]
        capr -= np.bincount(pl[sel], minlength=nl) * m
        alive &= ~sel
        flow_alive &= ~frozen
    return rate


class FlowEngine:
    """Transfers sharing directed links, advanced event by event (see module docstring).

    Usage: ``add(...)`` batches of transfers (release times >= ``now``), then ``run_until_tag``
    or ``run_until_time``, interleaved as a schedule is walked. ``now`` only moves forward.
    """

    def __init__(self, capacity: Sequence[float] | np.ndarray):
        self.capacity = np.asarray(capacity, dtype=float)
        self.num_links = len(self.capacity)
        self.now = 0.0
        n = 1024
        self._n = 0
        self.bytes = np.zeros(n)
        self.left = np.zeros(n)
        self.lat = np.zeros(n)
        self.release = np.zeros(n)
        self.start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.state = np.zeros(n, dtype=np.int8)     # 0 waiting, 1 draining, 2 tail, 3 done
        self.ndeps = np.zeros(n, dtype=np.int64)
        self.tag = np.zeros(n, dtype=np.int64)
        self.route_off = np.zeros(n + 1, dtype=np.int64)
        self._route: list[np.ndarray] = []
        self._route_flat = np.zeros(0, dtype=np.int64)
        self._route_dirty = False
        self.dependents: list[list[int]] = []
        self._release_heap: list[tuple[float, int]] = []
        self._active: list[int] = []                  # draining transfers
        self._tails: list[tuple[float, int]] = []     # heap of (tail_end, id)
        self._rates: np.ndarray | None = None
        self._active_arr = np.zeros(0, dtype=np.int64)
        self._pairs_flow = np.zeros(0, dtype=np.int64)
        self._pairs_link = np.zeros(0, dtype=np.int64)
        self.tag_left: dict[int, int] = {}
        self.tag_finish: dict[int, float] = {}
        self.tag_start: dict[int, float] = {}
        self.link_bytes = np.zeros(self.num_links)    # bytes carried per link
        self.link_busy = np.zeros(self.num_links)     # seconds with at least one transfer draining
        self.events = 0

    # ---------------------------------------------------------------- building
    def _grow(self, need: int) -> None:
        cap = len(self.bytes)
        if need <= cap:
            return
        new = max(need, 2 * cap)

        def g(a, fill):
            b = np.full(new, fill, dtype=a.dtype)
            b[:cap] = a
            return b
        self.bytes, self.left, self.lat = g(self.bytes, 0.0), g(self.left, 0.0), g(self.lat, 0.0)
        self.release, self.start = g(self.release, 0.0), g(self.start, np.nan)
        self.finish, self.state = g(self.finish, np.nan), g(self.state, 0)
        self.ndeps, self.tag = g(self.ndeps, 0), g(self.tag, 0)
        ro = np.zeros(new + 1, dtype=np.int64)
        ro[:cap + 1] = self.route_off
        self.route_off = ro

    def add(self, nbytes: Sequence[float], routes: Sequence[Sequence[int]],
            latency: Sequence[float], release: float, tag: int,
            deps: Sequence[Sequence[int]] | None = None) -> np.ndarray:
        """Add a batch of transfers; ``deps`` index *within this batch*. Returns their global ids."""
        k = len(nbytes)
        if not (len(routes) == len(latency) == k) or (deps is not None and len(deps) != k):
            raise EngineError("add(): nbytes, routes, latency and deps must have the same length")
        if release < self.now - _TIME_TOL:
            raise EngineError(f"add(): release {release} s is before the engine's time {self.now} s")
        base = self._n
        self._grow(base + k)
        ids = np.arange(base, base + k)
        self.bytes[ids] = nbytes
        self.left[ids] = nbytes
        self.lat[ids] = latency
        self.release[ids] = release
        self.state[ids] = 0
        self.tag[ids] = tag
        off = self.route_off[base]
        for i, r in enumerate(routes):
            r = np.asarray(r, dtype=np.int64)
            if len(r) and (r.min() < 0 or r.max() >= self.num_links):
                raise EngineError(f"add(): link id out of range 0..{self.num_links - 1}")
            self._route.append(r)
            off += len(r)
            self.route_off[base + i + 1] = off
        self._route_dirty = True
        self.dependents.extend([] for _ in range(k))
        nd = np.zeros(k, dtype=np.int64)
        if deps is not None:
            for i, ds in enumerate(deps):
                for d in ds:
                    if not 0 <= d < k or d == i:
                        raise EngineError(f"add(): bad dependency {d} of transfer {i} in a batch of {k}")
                    self.dependents[base + d].append(base + i)
                    nd[i] += 1
        self.ndeps[ids] = nd
        self._n = base + k
        self.tag_left[tag] = self.tag_left.get(tag, 0) + k
        self.tag_start.setdefault(tag, release)
        if k == 0:
            self.tag_finish.setdefault(tag, release)
        for i in np.nonzero(nd == 0)[0]:
            heapq.heappush(self._release_heap, (release, base + int(i)))
        return ids

    def _flat_routes(self) -> np.ndarray:
        if self._route_dirty:
            self._route_flat = (np.concatenate(self._route) if self._route
                                else np.zeros(0, dtype=np.int64))
            self._route_dirty = False
        return self._route_flat

    # ---------------------------------------------------------------- running
    def _start(self, i: int) -> None:
        self.start[i] = self.now
        nlinks = self.route_off[i + 1] - self.route_off[i]
        if self.left[i] <= _BYTES_TOL or nlinks == 0:
            self.left[i] = 0.0
            self._to_tail(i)
        else:
            self.state[i] = 1
            self._active.append(i)
            self._rates = None

    def _to_tail(self, i: int) -> None:
        self.state[i] = 2
        heapq.heappush(self._tails, (self.now + self.lat[i], i))

    def _complete(self, i: int) -> None:
        self.state[i] = 3
        self.finish[i] = self.now
        t = int(self.tag[i])
        self.tag_left[t] -= 1
        if self.tag_left[t] == 0:
            self.tag_finish[t] = self.now
        for d in self.dependents[i]:
            self.ndeps[d] -= 1
            if self.ndeps[d] == 0:
                heapq.heappush(self._release_heap, (max(self.release[d], self.now), d))

    def _rebuild_rates(self) -> None:
        act = np.asarray(self._active, dtype=np.int64)
        self._active_arr = act
        flat = self._flat_routes()
        lo = self.route_off[act]
        ln = self.route_off[act + 1] - lo
        local = np.repeat(np.arange(len(act)), ln)
        starts = np.repeat(lo - np.concatenate(([0], np.cumsum(ln)[:-1])), ln)
        idx = starts + np.arange(int(ln.sum()))
        self._pairs_flow = local
        self._pairs_link = flat[idx]
        self._rates = maxmin_rates(local, self._pairs_link, len(act), self.capacity)

    def _next_event_time(self) -> float:
        t = np.inf
        if self._release_heap:
            t = min(t, max(self._release_heap[0][0], self.now))
        if self._tails:
            t = min(t, self._tails[0][0])
        if self._active:
            if self._rates is None:
                self._rebuild_rates()
            act = self._active_arr
            with np.errstate(divide="ignore"):
                dt = self.left[act] / self._rates
            t = min(t, self.now + float(dt.min()))
        return t

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0 and self._active:
            act = self._active_arr
            moved = self._rates * dt
            self.left[act] -= moved
            self.link_bytes += np.bincount(self._pairs_link, weights=moved[self._pairs_flow],
                                           minlength=self.num_links)
            busy = np.zeros(self.num_links, dtype=bool)
            busy[self._pairs_link] = True
            self.link_busy[busy] += dt
        self.now = max(self.now, t)

    def _process_now(self) -> None:
        now = self.now
        # drained transfers (rates are None only right after a start: nothing drained since)
        if self._active and self._rates is not None:
            act = self._active_arr
            rel = self.left[act] <= np.maximum(_BYTES_TOL, 1e-9 * self.bytes[act])
            # a transfer within _TIME_TOL of draining counts as drained
            rel |= self.left[act] <= self._rates * _TIME_TOL
            if rel.any():
                drained = act[rel]
                self.left[drained] = 0.0
                keep = set(int(i) for i in act[~rel])
                self._active = [i for i in self._active if i in keep]
                self._rates = None
                for i in drained:
                    self._to_tail(int(i))
        # tails that end now and releases due now, until neither changes anything
        changed = True
        while changed:
            changed = False
            while self._tails and self._tails[0][0] <= now + _TIME_TOL:
                _, i = heapq.heappop(self._tails)
                self._complete(i)
                changed = True
            while self._release_heap and self._release_heap[0][0] <= now + _TIME_TOL:
                _, j = heapq.heappop(self._release_heap)
                self._start(j)
                changed = True

    def _step(self, limit: float = np.inf) -> bool:
        """Process the next event if it is at or before ``limit``; False when none is."""
        self._process_now()
        t = self._next_event_time()
        if t == np.inf or t > limit + _TIME_TOL:
            return False
        self._advance(t)
        self.events += 1
        self._process_now()
        return True

    def run_until_tag(self, tag: int) -> float:
        """Advance until every transfer tagged ``tag`` has completed; return that time (s)."""
        if tag not in self.tag_left:
            raise EngineError(f"run_until_tag(): no transfers tagged {tag}")
        while self.tag_left[tag] > 0:
            if not self._step():
                raise EngineError(f"transfers tagged {tag} can never complete (dependency cycle)")
        return self.tag_finish[tag]

    def run_until_time(self, t: float) -> None:
        """Advance to time ``t`` (s), processing every event before it."""
        while self._step(limit=t):
            pass
        if t > self.now:
            self._advance(t)

    def run_all(self) -> float:
        """Advance until nothing is left; return the time (s)."""
        while self._step():
            pass
        if (self.state[:self._n] != 3).any():
            raise EngineError("some transfers can never complete (dependency cycle)")
        return self.now
