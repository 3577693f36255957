"""Collectives expanded into the per-step transfers the hardware makes.

Input: one `Collective` (V = ``bytes``, see ``aoizora.extract.evidence``), the chip of every
logical rank under a placement, and the physical network (``aoizora.extract.network.Network``:
chips, directed links, dimension-order routes, the ring order through a group of chips).
Output: a `TransferBatch` for the flow engine (``benchmarks.sim.engine``): bytes, routed links,
latency (hops x per-hop latency) and dependencies of every transfer. Every replica group of the
collective runs at the same time, in one batch.

What is simulated, per replica group of n ranks (devices on chips; ranks on one chip exchange data
without links, a transfer with an empty route):

- all-gather, reduce-scatter: a ring of n-1 steps; all-reduce: a reduce-scatter then an all-gather
  on the same ring, 2(n-1) steps (the reduction's arithmetic is not timed).
  * Ring order: the compiler reorders a group along physical links; the order is the network's
    ``ring_through`` of the group's chips (a cycle on physical links if one exists: ``ring``; else
    a path: ``line``; else the logical order: ``scattered``). Ranks sharing a chip sit next to each
    other in the ring.
  * Directions: *bidirectional* (V/(2n) per transfer, one ring each way, running at once) when the
    ring closes on physical links (kind ``ring``: the group spans a full wrapped axis or its chips
    form a closed physical cycle), and also for a ``scattered`` ring whose routed forward and
    backward steps use no directed link twice (they cannot slow each other down);
    *one direction* (V/n per transfer) otherwise: a ``line`` (its closing step travels back along
    the line, ``Network.ring_step_routes``, also when the line bends), a ``pair`` (n = 2: each sends V/2 to the other), or a ``scattered`` ring whose two
    directions would contend.
  * Step s of direction d: rank at ring position k sends one chunk to position k+d over the
    dimension-order route. It depends on (i) the transfer that brought that chunk to k in step s-1
    (from position k-d) and (ii) k's own send of step s-1; there is no global barrier.
- all-to-all: every ordered pair (i, j), i != j, is a transfer of V/n, all at once, no
  dependencies. On a wrapped axis where both ways round are equally short (distance n/2), the
  transfer is split in halves, one each way (dimension-order routing with ties spread; the
  scaling book's AllToAll count assumes this balance).
- collective-permute: each (source, target) pair is a transfer of V, all at once.
Units: bytes, seconds.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from aoizora.extract.evidence import Collective

RING_KINDS = ("all-gather", "reduce-scatter", "all-reduce")


class CollectiveError(ValueError):
    """A collective the simulator cannot expand (unknown kind, ranks outside the placement)."""


class TransferBatch:
    """Transfers of one collective, in the flow engine's terms (deps index within the batch).

    Built from pieces (numpy arrays appended by the expansion); ``arrays()`` joins them."""

    def __init__(self) -> None:
        self._bytes: list[np.ndarray] = []
        self._flat: list[np.ndarray] = []
        self._lens: list[np.ndarray] = []
        self._lat: list[np.ndarray] = []
        self._deps: list[np.ndarray] = []
        self.n = 0
        self.algorithm = ""                  # e.g. "bidirectional ring", "pairwise"

    def append(self, nbytes: np.ndarray, flat: np.ndarray, lens: np.ndarray, lat: np.ndarray,
               deps: np.ndarray | None = None) -> None:
        """Add k transfers; ``deps`` (k, 2) indices within the whole batch, -1 for none."""
        k = len(nbytes)
        self._bytes.append(np.asarray(nbytes, dtype=float))
        self._flat.append(np.asarray(flat, dtype=np.int64))
        self._lens.append(np.asarray(lens, dtype=np.int64))
        self._lat.append(np.asarray(lat, dtype=float))
        self._deps.append(np.full((k, 2), -1, dtype=np.int64) if deps is None
                          else np.asarray(deps, dtype=np.int64))
        self.n += k

    def arrays(self):
        """(nbytes, (flat routes, lengths), latency, deps) for ``FlowEngine.add``."""
        if not self._bytes:
            z = np.zeros(0)
            zi = np.zeros(0, dtype=np.int64)
            return z, (zi, zi), z, np.zeros((0, 2), dtype=np.int64)
        return (np.concatenate(self._bytes), (np.concatenate(self._flat),
                np.concatenate(self._lens)), np.concatenate(self._lat),
                np.concatenate(self._deps))

    def __len__(self) -> int:
        return self.n


class Expander:
    """Turns collectives into transfer batches on one network (routes and rings cached)."""

    def __init__(self, network, tie_split: bool = True):
        self.net = network
        self.tie_split = tie_split
        self.lat = network.hop_latency_s
        self._routes: dict[tuple[int, int], list[tuple[np.ndarray, float]]] = {}
        self._rings: dict[tuple[int, ...], tuple[list[int], str]] = {}

    # -- routes -------------------------------------------------------------------------------
    def routes(self, a: int, b: int) -> list[tuple[np.ndarray, float]]:
        """The route(s) from chip a to chip b with the share of bytes each carries.

        One dimension-order route; with ``tie_split``, on a wrapped axis where both ways are
        equally short, each such axis is taken both ways (shares split equally)."""
        key = (a, b)
        got = self._routes.get(key)
        if got is not None:
            return got
        net = self.net
        if a == b:
            got = [(np.zeros(0, dtype=np.int64), 1.0)]
        else:
            base = np.asarray(net.route(a, b), dtype=np.int64)
            ties = self._tie_axes(a, b) if self.tie_split else []
            if not ties:
                got = [(base, 1.0)]
            else:
                got = []
                combos = list(itertools.product((1, -1), repeat=len(ties)))
                for dirs in combos:
                    got.append((self._dor_route(a, b, dict(zip(ties, dirs))), 1.0 / len(combos)))
        self._routes[key] = got
        return got

    def _tie_axes(self, a: int, b: int) -> list[int]:
        net = self.net
        ca, cb = net.chips[a], net.chips[b]
        out = []
        for ax, n in enumerate(net.shape):
            if net.wrap[ax] and n >= 3 and n % 2 == 0 and (cb[ax] - ca[ax]) % n == n // 2:
                out.append(ax)
        return out

    def _dor_route(self, a: int, b: int, forced: dict[int, int]) -> np.ndarray:
        """Dimension-order route with the direction forced on the given (tied) axes."""
        net = self.net
        cur = list(net.chips[a])
        tgt = net.chips[b]
        out = []
        for ax, n in enumerate(net.shape):
            if cur[ax] == tgt[ax]:
                continue
            if ax in forced:
                d, k = forced[ax], n // 2
            elif net.wrap[ax] and n >= 3:
                fwd = (tgt[ax] - cur[ax]) % n
                d, k = (1, fwd) if fwd <= n - fwd else (-1, n - fwd)
            else:
                d, k = (1, tgt[ax] - cur[ax]) if tgt[ax] > cur[ax] else (-1, cur[ax] - tgt[ax])
            for _ in range(k):
                nxt = list(cur)
                nxt[ax] = (cur[ax] + d) % n
                out.append(net.link_id[(net.chip_index[tuple(cur)], net.chip_index[tuple(nxt)])])
                cur = nxt
        return np.asarray(out, dtype=np.int64)

    def _single_route(self, a: int, b: int) -> np.ndarray:
        return np.asarray(self.net.route(a, b), dtype=np.int64)

    # -- rings --------------------------------------------------------------------------------
    def ring(self, chips: Sequence[int]) -> tuple[list[int], str]:
        """Ring order (positions into ``chips``) and direction mode for a group's chips.

        Mode: "bidirectional", "unidirectional" or "none" (one rank); the third item is the
        closing step's route of a line (back along the line), else None."""
        key = tuple(int(c) for c in chips)
        got = self._rings.get(key)
        if got is not None:
            return got
        n = len(key)
        if n <= 1:
            got = (list(range(n)), "none", None)
            self._rings[key] = got
            return got
        r = self.net.ring_through(key)
        # ranks in ring order of their chips; ranks on one chip stay together, in logical order
        by_chip: dict[int, list[int]] = {}
        for pos, c in enumerate(key):
            by_chip.setdefault(c, []).append(pos)
        order = [pos for c in r.order for pos in by_chip[c]]
        if n == 2 or self.net.ring_directions(r) == 1:
            mode = "unidirectional"
        else:                                   # closed ring, or scattered without contention
            mode = "bidirectional"
        closing = None
        if r.kind == "line":                    # the closing step travels back along the line
            closing = np.asarray(self.net.ring_step_routes(r)[-1], dtype=np.int64)
        got = (order, mode, closing)
        self._rings[key] = got
        return got

    # -- expansion ----------------------------------------------------------------------------
    def expand(self, c: Collective, rank_chip: np.ndarray) -> TransferBatch:
        """All transfers of one run of ``c``; ``rank_chip[r]`` is the chip of logical rank r."""
        nranks = len(rank_chip)

        def chip(r: int) -> int:
            if not 0 <= r < nranks:
                raise CollectiveError(f"collective {c.name}: logical rank {r} outside the "
                                      f"placement of {nranks} ranks")
            return int(rank_chip[r])

        out = TransferBatch()
        V = float(c.bytes)
        kind = c.kind
        for suffix in ("-start", "-done"):          # async spellings of the same collective
            if kind.endswith(suffix):
                kind = kind[: -len(suffix)]
        if kind == "collective-permute":
            pairs = c.source_target_pairs or []
            self._add_p2p(out, [chip(s) for s, _ in pairs], [chip(t) for _, t in pairs], V)
            out.algorithm = "permute"
            return out
        algos = set()
        for g in c.replica_groups:
            n = len(g)
            if n <= 1:
                continue
            chips = [chip(r) for r in g]
            if kind in RING_KINDS:
                algos.add(self._ring_batch(out, kind, chips, V))
            elif kind == "all-to-all":
                src = [chips[i] for i in range(n) for j in range(n) if i != j]
                dst = [chips[j] for i in range(n) for j in range(n) if i != j]
                self._add_p2p(out, src, dst, V / n)
                algos.add("pairwise")
            else:
                raise CollectiveError(f"collective {c.name}: unknown kind {c.kind!r}")
        out.algorithm = "+".join(sorted(algos)) if algos else "none"
        return out

    def _add_p2p(self, out: TransferBatch, src: Sequence[int], dst: Sequence[int],
                 nbytes: float) -> None:
        """Independent transfers src[i] -> dst[i] of ``nbytes`` each, routed (ties split)."""
        bs, flats, lens, lats = [], [], [], []
        for a, b in zip(src, dst):
            for route, share in self.routes(int(a), int(b)):
                bs.append(nbytes * share)
                flats.append(route)
                lens.append(len(route))
        if not bs:
            return
        lens_a = np.asarray(lens, dtype=np.int64)
        flat = np.concatenate(flats) if lens_a.sum() else np.zeros(0, dtype=np.int64)
        out.append(np.asarray(bs), flat, lens_a, lens_a * self.lat)

    def _ring_batch(self, out: TransferBatch, kind: str, chips: list[int], V: float) -> str:
        n = len(chips)
        order, mode, closing = self.ring(chips)
        if mode == "none":
            return "none"
        rc = [chips[p] for p in order]
        steps = (n - 1) * (2 if kind == "all-reduce" else 1)
        dirs = (1, -1) if mode == "bidirectional" else (1,)
        chunk = V / n / len(dirs)
        ks = np.arange(n)
        for d in dirs:
            hop = [self._single_route(rc[k], rc[(k + d) % n]) for k in range(n)]
            if closing is not None and d == 1 and rc[-1] != rc[0]:
                hop[-1] = closing
            lens1 = np.array([len(r) for r in hop], dtype=np.int64)
            flat1 = np.concatenate(hop) if lens1.sum() else np.zeros(0, dtype=np.int64)
            base = out.n                          # first transfer of this direction
            s_idx = np.repeat(np.arange(steps), n)
            k_idx = np.tile(ks, steps)
            prev = base + (s_idx - 1) * n
            deps = np.stack([prev + (k_idx - d) % n, prev + k_idx], axis=1)
            deps[s_idx == 0] = -1
            out.append(np.full(steps * n, chunk), np.tile(flat1, steps), np.tile(lens1, steps),
                       np.tile(lens1 * self.lat, steps), deps)
        return f"{mode} ring"
