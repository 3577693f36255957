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
ask when a tag's last transfer completes. Everything is kept in numpy arrays; the work per event is
a few vector operations over the transfers waiting, draining and in their latency tail.
Units: bytes, seconds, bytes/s.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_TIME_TOL = 1e-12        # s: events closer than this are simultaneous
_BYTES_TOL = 1e-6        # bytes: a transfer with less than this left has drained
_MAX_DEPS = 2


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
    nl = len(capacity)
    capr = np.array(capacity, dtype=float)
    none = np.full(nl, np.inf)
    pf, pl = pair_flow, pair_link
    while len(pf):
        cnt = np.bincount(pl, minlength=nl)
        share = np.divide(capr, cnt, out=none.copy(), where=cnt > 0)
        m = max(float(share.min()), 0.0)
        bott = share <= m * (1.0 + 1e-9)
        frozen = np.zeros(n_flows, dtype=bool)
        frozen[pf[bott[pl]]] = True
        rate[frozen] = m
        sel = frozen[pf]
        capr -= np.bincount(pl[sel], minlength=nl) * m
        keep = ~sel
        pf, pl = pf[keep], pl[keep]
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
        self._n = 0
        n = 256
        self.bytes = np.zeros(n)
        self.left = np.zeros(n)
        self.lat = np.zeros(n)
        self.release = np.zeros(n)
        self.start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.tail_end = np.full(n, np.inf)
        self.state = np.zeros(n, dtype=np.int8)     # 0 waiting, 1 draining, 2 tail, 3 done
        self.tag = np.zeros(n, dtype=np.int64)
        self.deps = np.full((n, _MAX_DEPS), -1, dtype=np.int64)
        self.route_off = np.zeros(n + 1, dtype=np.int64)
        self.route_flat = np.zeros(1024, dtype=np.int64)
        self._blocked = np.zeros(0, dtype=np.int64)   # waiting for a dependency
        self._pending = np.zeros(0, dtype=np.int64)   # dependencies met, waiting for release
        self._recheck = False                          # something completed: re-test _blocked
        self._active = np.zeros(0, dtype=np.int64)
        self._tails = np.zeros(0, dtype=np.int64)
        self._rates: np.ndarray | None = None
        self._pairs_flow = np.zeros(0, dtype=np.int64)
        self._pairs_link = np.zeros(0, dtype=np.int64)
        self.tag_left: dict[int, int] = {}
        self.tag_finish: dict[int, float] = {}
        self.link_bytes = np.zeros(self.num_links)    # bytes carried per link
        self.link_busy = np.zeros(self.num_links)     # seconds with at least one transfer draining
        self.events = 0

    # ---------------------------------------------------------------- building
    def _grow(self, need: int, need_route: int) -> None:
        cap = len(self.bytes)
        if need > cap:
            new = max(need, 2 * cap)

            def g(a, fill):
                b = np.full((new,) + a.shape[1:], fill, dtype=a.dtype)
                b[:cap] = a
                return b
            self.bytes, self.left, self.lat = g(self.bytes, 0.0), g(self.left, 0.0), g(self.lat, 0.0)
            self.release, self.start = g(self.release, 0.0), g(self.start, np.nan)
            self.finish, self.tail_end = g(self.finish, np.nan), g(self.tail_end, np.inf)
            self.state, self.tag = g(self.state, 0), g(self.tag, 0)
            self.deps = g(self.deps, -1)
            ro = np.zeros(new + 1, dtype=np.int64)
            ro[:cap + 1] = self.route_off
            self.route_off = ro
        rcap = len(self.route_flat)
        if need_route > rcap:
            rf = np.zeros(max(need_route, 2 * rcap), dtype=np.int64)
            rf[:rcap] = self.route_flat
            self.route_flat = rf

    def add(self, nbytes, routes, latency, release: float, tag: int, deps=None) -> np.ndarray:
        """Add a batch of transfers; returns their global ids.

        ``routes``: a list of link-id sequences, or a pair ``(flat, lengths)`` of arrays.
        ``deps``: per transfer, up to two indices *within this batch* (a list of lists, or an
        int array of shape (k, 2) padded with -1)."""
        nbytes = np.asarray(nbytes, dtype=float)
        k = len(nbytes)
        if isinstance(routes, tuple):
            flat, lens = (np.asarray(routes[0], dtype=np.int64),
                          np.asarray(routes[1], dtype=np.int64))
        else:
            lens = np.array([len(r) for r in routes], dtype=np.int64)
            flat = (np.concatenate([np.asarray(r, dtype=np.int64) for r in routes])
                    if k and lens.sum() else np.zeros(0, dtype=np.int64))
        latency = np.asarray(latency, dtype=float)
        if len(lens) != k or len(latency) != k or int(lens.sum()) != len(flat):
            raise EngineError("add(): nbytes, routes and latency must describe the same transfers")
        if len(flat) and (flat.min() < 0 or flat.max() >= self.num_links):
            raise EngineError(f"add(): link id out of range 0..{self.num_links - 1}")
        if release < self.now - _TIME_TOL:
            raise EngineError(f"add(): release {release} s is before the engine's time {self.now} s")
        if deps is None:
            d = np.full((k, _MAX_DEPS), -1, dtype=np.int64)
        elif isinstance(deps, np.ndarray):
            d = deps.astype(np.int64).reshape(k, _MAX_DEPS)
        else:
            d = np.full((k, _MAX_DEPS), -1, dtype=np.int64)
            for i, ds in enumerate(deps):
                if len(ds) > _MAX_DEPS:
                    raise EngineError(f"add(): at most {_MAX_DEPS} dependencies per transfer")
                d[i, :len(ds)] = ds
        if ((d >= k) | (d < -1)).any() or (d == np.arange(k)[:, None]).any():
            raise EngineError("add(): a dependency must index another transfer of the batch")
        base = self._n
        roff = int(self.route_off[base])
        self._grow(base + k, roff + len(flat))
        ids = np.arange(base, base + k)
        self.bytes[ids] = nbytes
        self.left[ids] = nbytes
        self.lat[ids] = latency
        self.release[ids] = release
        self.state[ids] = 0
        self.tag[ids] = tag
        self.deps[ids] = np.where(d >= 0, d + base, -1)
        self.route_flat[roff:roff + len(flat)] = flat
        self.route_off[base + 1:base + k + 1] = roff + np.cumsum(lens)
        self._n = base + k
        has_dep = (d >= 0).any(axis=1)
        self._blocked = np.concatenate([self._blocked, ids[has_dep]])
        self._pending = np.concatenate([self._pending, ids[~has_dep]])
        self.tag_left[tag] = self.tag_left.get(tag, 0) + k
        if k == 0:
            self.tag_finish.setdefault(tag, release)
        return ids

    # ---------------------------------------------------------------- running
    def _rebuild_rates(self) -> None:
        act = self._active
        lo = self.route_off[act]
        ln = self.route_off[act + 1] - lo
        tot = int(ln.sum())
        local = np.repeat(np.arange(len(act)), ln)
        starts = np.repeat(lo - (np.cumsum(ln) - ln), ln)
        self._pairs_flow = local
        self._pairs_link = self.route_flat[starts + np.arange(tot)]
        self._rates = maxmin_rates(local, self._pairs_link, len(act), self.capacity)

    def _settle(self) -> None:
        """Apply everything that happens at ``now`` (drains, tail ends, starts) until stable."""
        now = self.now
        while True:
            changed = False
            if len(self._active) and self._rates is not None:
                act = self._active
                rel = (self.left[act] <= np.maximum(_BYTES_TOL, 1e-9 * self.bytes[act])) | \
                      (self.left[act] <= self._rates * _TIME_TOL)
                if rel.any():
                    dr = act[rel]
                    self.left[dr] = 0.0
                    self.state[dr] = 2
                    self.tail_end[dr] = now + self.lat[dr]
                    self._tails = np.concatenate([self._tails, dr])
                    self._active = act[~rel]
                    self._rates = None
                    changed = True
            if len(self._tails):
                te = self.tail_end[self._tails]
                m = te <= now + _TIME_TOL
                if m.any():
                    done = self._tails[m]
                    self._tails = self._tails[~m]
                    self.state[done] = 3
                    self.finish[done] = now
                    self._recheck = True
                    tg = self.tag[done]
                    if (tg == tg[0]).all():
                        tags, cnt = [int(tg[0])], [len(tg)]
                    else:
                        u, c_ = np.unique(tg, return_counts=True)
                        tags, cnt = u.tolist(), c_.tolist()
                    for t, c in zip(tags, cnt):
                        self.tag_left[t] -= c
                        if self.tag_left[t] == 0:
                            self.tag_finish[t] = now
                    changed = True
            if self._recheck and len(self._blocked):
                b = self._blocked
                ok = self._deps_done(b)
                if ok.any():
                    self._pending = np.concatenate([self._pending, b[ok]])
                    self._blocked = b[~ok]
            self._recheck = False
            if len(self._pending):
                w = self._pending
                ok = self.release[w] <= now + _TIME_TOL
                if ok.any():
                    st = w[ok]
                    self._pending = w[~ok]
                    self.start[st] = now
                    nl = self.route_off[st + 1] - self.route_off[st]
                    instant = (self.left[st] <= _BYTES_TOL) | (nl == 0)
                    if instant.any():
                        it = st[instant]
                        self.left[it] = 0.0
                        self.state[it] = 2
                        self.tail_end[it] = now + self.lat[it]
                        self._tails = np.concatenate([self._tails, it])
                    dr = st[~instant]
                    if len(dr):
                        self.state[dr] = 1
                        self._active = np.concatenate([self._active, dr])
                        self._rates = None
                    changed = True
            if not changed:
                return

    def _deps_done(self, w: np.ndarray) -> np.ndarray:
        d = self.deps[w]
        return ((d < 0) | (self.state[np.maximum(d, 0)] == 3)).all(axis=1)

    def _next_event_time(self) -> float:
        t = np.inf
        if len(self._pending):
            t = min(t, max(float(self.release[self._pending].min()), self.now))
        if len(self._tails):
            t = min(t, float(self.tail_end[self._tails].min()))
        if len(self._active):
            if self._rates is None:
                self._rebuild_rates()
            t = min(t, self.now + float((self.left[self._active] / self._rates).min()))
        return t

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0 and len(self._active):
            if self._rates is None:
                self._rebuild_rates()
            moved = self._rates * dt
            self.left[self._active] -= moved
            self.link_bytes += np.bincount(self._pairs_link, weights=moved[self._pairs_flow],
                                           minlength=self.num_links)
            busy = np.zeros(self.num_links, dtype=bool)
            busy[self._pairs_link] = True
            self.link_busy[busy] += dt
        self.now = max(self.now, t)

    def _step(self, limit: float = np.inf) -> bool:
        """Process the next event if it is at or before ``limit``; False when none is."""
        self._settle()
        t = self._next_event_time()
        if t == np.inf or t > limit + _TIME_TOL:
            return False
        self._advance(t)
        self.events += 1
        self._settle()
        return True

    def run_until_tag(self, tag: int) -> float:
        """Advance until every transfer tagged ``tag`` has completed; return that time (s)."""
        if tag not in self.tag_left:
            raise EngineError(f"run_until_tag(): no transfers tagged {tag}")
        self._settle()
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

    @property
    def idle(self) -> bool:
        return not (len(self._blocked) or len(self._pending) or len(self._active)
                    or len(self._tails))
