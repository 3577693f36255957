"""The traffic of collectives under a placement: flows as the hardware runs them, per-link loads.

A *placement* maps each logical rank ``r`` (position in the compiled mesh's ``devices.flat``, the
ids the evidence uses) to a device index ``placement[r]`` (position in ``target.devices()``);
``chip(r) = network.device_chip[placement[r]]``.

Flows of one collective ``c`` (V = ``c.bytes``, see ``aoizora.extract.evidence``), per replica
group with ``k`` distinct chips ``S`` (devices sharing a chip exchange data without links, so a
group of n ranks on k chips moves data only between its k chips):

- all-gather / reduce-scatter (``m = 1``) and all-reduce (``m = 2``: a reduce-scatter then an
  all-gather) run as a ring. The compiler reorders the group's members along physical links
  (``Network.ring_through``, deterministic):
    * ``ring`` (S has a cycle on physical links, k >= 3): bidirectional ring, half the data each
      way; each direction of each cycle link carries ``h = m (k-1) V / (2k)`` bytes;
    * ``line`` (S has a path on physical links): one-direction ring whose closing step travels
      back along the line; each direction of each path link carries ``2h = m (k-1) V / k``;
    * ``pair`` (k = 2): each chip sends ``m V / 2`` to the other, routed by dimension order;
    * ``scattered`` (no path on physical links): a ring along the fewest-hop tour of S, each
      step routed by dimension order: both ways (``h`` per step route and direction) when the
      forward and backward step routes use no directed link twice
      (``Network.ring_directions``), else one way, each step a flow of ``2h = m (k-1) V / k``.
  The loads of a group depend only on its set of chips S.
  (On a line of 4 this gives 3 V / 4 per link, on a closed ring V / 2 per link direction: the
  scaling book's figures, ``shared/facts/tpu.md``.)
- all-to-all: every ordered pair of ranks (i, j), i != j, in the group is a flow of ``V / n``
  (n = ranks in the group), routed by dimension order.
- collective-permute: each (source, target) pair is a flow of ``V``, routed.

Phases: the evidence's phases ``(phase, count)`` chain collectives whose windows intersect. Each
is priced as classes (``PhaseKey``, ``phase_classes``) whose collectives are in flight together,
so their link bytes add up: its sync (blocking) collectives; and its async ones in parts, each
part the async collective whose done comes first plus every other one started before that done
(all in flight at that moment), repeated on the rest (a chain of windows, e.g. a windowed
einsum's permutes, is not priced as one transfer hidden behind its shortest window). A phase
class's time is its most loaded link's bytes over that link's one-way bandwidth. Overlap: an
async part hides behind ``O`` seconds of compute, the compute scheduled between its first start
and its last done (``formulation.op_time.ScheduleSpans``: every op priced as Q2's compute prices
it, opaque kernels included; without schedule positions, ``min_c overlap_cycles_c /
clock_hz``); its members whose windows lie in a shorter span must also fit that span's compute
(``formulation.async_demand``: the sub-demand sets s, ``D = max_s T_s - O_s``, kept where they
can bind); a sync class hides behind nothing (O = 0, no D); exposed time
``max(0, T - O, D)``.
(A sync collective inside an async window thus costs its own transfer, not the window's
overlap; classes' bytes are not added, which under-states a link they share.)

Latency: a phase class also waits ``L = hop_latency x`` its critical path (``latency_hops`` of a
collective: steps x the longest step route): for an async part the longest of its collectives'
(in flight together), for a sync class the sum of its collectives' (each blocks the stream, so
they run one after another: e.g. 14 small all-gathers inside one async window of Wan 14B, each
a ring of 8 that pays 7 hops or more); Q2 adds it (``PhaseLoad.exposed_latency_s``).
The placement solvers' objective below is the link-load term; flow hops break its ties.

Cost of a placement (``TrafficModel.cost``), lexicographic:
  1. ``comm_s = sum_p count_p * max(0, T_p - O_p)`` (seconds, exposed communication);
  2. ``link_bytes = sum_p count_p * sum_l load_{p,l}`` (bytes crossing links);
  3. ``hops = sum_p count_p * sum_flows hops(flow)`` (link crossings of flows; a ring of k
     counts 2k, a line 2(k-1)).
This module has no jax import (formulation layer).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Iterator, Sequence

import numpy as np

from aoizora.extract.evidence import Collective, Evidence
from aoizora.extract.network import Network
from aoizora.formulation.async_demand import DemandSet, demand_sets
from aoizora.formulation.op_time import ScheduleSpans

RING_KINDS = ("all-gather", "reduce-scatter", "all-reduce")


class PlacementError(ValueError):
    """A placement that is not a permutation of the devices."""


@dataclasses.dataclass(frozen=True)
class PhaseKey:
    """One phase class: the evidence's (phase, count), its sync collectives or one part of its
    async ones (``phase_classes``)."""
    phase: int
    count: int
    sync: bool = False     # the phase's blocking collectives (priced apart from its async ones)
    part: int = 0          # which set of its async collectives in flight at one moment


def phase_classes(collectives: Sequence[Collective]) -> dict[PhaseKey, list[Collective]]:
    """The phase classes (module docstring, Phases): per evidence phase (phase, count), its sync
    collectives, and its async ones split by their schedule windows: the async collective whose
    done comes first, with every other one started before that done (all in flight at that
    moment), is a part; repeat on the rest. Without schedule positions, one part."""
    by_phase: dict[tuple[int, int], list[Collective]] = {}
    for c in collectives:
        by_phase.setdefault((int(c.phase), int(c.count)), []).append(c)
    out: dict[PhaseKey, list[Collective]] = {}
    for (ph, n), cs in by_phase.items():
        sync = [c for c in cs if not c.is_async]
        if sync:
            out[PhaseKey(ph, n, True)] = sync
        left = sorted((c for c in cs if c.is_async),
                      key=lambda c: (int(c.done_index), int(c.start_index), c.name))
        if left and not any(c.start_index or c.done_index for c in left):
            out[PhaseKey(ph, n, False)] = left
            continue
        part = 0
        while left:
            d = int(left[0].done_index)
            members = [left[0]] + [c for c in left[1:] if int(c.start_index) < d]
            out[PhaseKey(ph, n, False, part)] = members
            part += 1
            left = [c for c in left[1:] if int(c.start_index) >= d]
    return out


def check_placement(placement: Sequence[int], network: Network, n_ranks: int) -> np.ndarray:
    p = np.asarray(placement, dtype=np.int64)
    if p.shape != (n_ranks,) or sorted(p.tolist()) != list(range(network.num_devices)):
        raise PlacementError(
            f"placement must list a distinct device index (0..{network.num_devices - 1}) for each "
            f"of the {n_ranks} logical ranks; got {list(p)[:16]}")
    return p


def base_kind(kind: str) -> str:
    """The collective kind without an async suffix ("all-gather-start" -> "all-gather")."""
    return kind.removesuffix("-start").removesuffix("-done")


def ring_multiplier(kind: str) -> int:
    return 2 if kind == "all-reduce" else 1


def link_bytes_bound(c: Collective) -> float:
    """Bytes of ``c`` no link carries more of, under any placement (each flow crosses a link at
    most once): a permute n_pairs V; an all-to-all (n - 1) V per group of n; a ring kind
    m (k - 1) V per group of k (``ring_multiplier``)."""
    kind = base_kind(c.kind)
    if kind == "collective-permute":
        return float(c.bytes) * len(c.source_target_pairs or [])
    per_group = sum(max(len(g) - 1, 0) for g in c.replica_groups or [])
    m = 1 if kind == "all-to-all" else ring_multiplier(kind)
    return float(c.bytes) * m * per_group


def flow_class(kind: str, k: int) -> str:
    """How a group of k chips runs a collective: "none", "pair", "ring" (ring/line/scattered), "a2a"."""
    kind = base_kind(kind)
    if k < 2:
        return "none"
    if kind in RING_KINDS:
        return "pair" if k == 2 else "ring"
    if kind == "all-to-all":
        return "a2a"
    raise ValueError(f"collective kind {kind!r} is not priced per group")


def class_coefficient(kind: str, nbytes: int, k: int) -> Fraction:
    """Bytes per unit of `unit_loads` (exact): pair m V/2, ring h = m (k-1) V / (2k), a2a V/k."""
    cls = flow_class(kind, k)
    V = Fraction(int(nbytes))
    m = ring_multiplier(base_kind(kind))
    if cls == "pair":
        return m * V / 2
    if cls == "ring":
        return m * (k - 1) * V / (2 * k)
    if cls == "a2a":
        return V / k
    return Fraction(0)


@dataclasses.dataclass(frozen=True)
class GroupFlows:
    """The flows of one collective on one replica group ``group`` (ranks, k = |group| >= 2):
    flow class ``cls`` ("pair", "ring" or "a2a", ``flow_class``) and ``coef`` bytes per unit of
    ``unit_loads`` (``class_coefficient``, exact), both for k distinct chips; ``kind`` (base
    kind) and ``nbytes`` (V) give them for fewer chips (``class_coefficient(kind, nbytes, s)``:
    a ring group on s < k chips when a chip holds several of its devices)."""
    cls: str
    group: frozenset
    coef: Fraction
    kind: str = ""
    nbytes: int = 0


@dataclasses.dataclass(frozen=True)
class PermuteFlows:
    """The flows of one collective-permute: its (source, target) rank pairs with source !=
    target, each a flow of ``nbytes`` = V bytes (exact)."""
    pairs: tuple[tuple[int, int], ...]
    nbytes: Fraction


def collective_flows(collectives: Sequence[Collective]) -> Iterator[GroupFlows | PermuteFlows]:
    """The placement-independent flows of `collectives`, in their order: per collective-permute
    one ``PermuteFlows`` (also when no pair moves data), per other collective one ``GroupFlows``
    for each replica group whose flow class is not "none" (k >= 2), in the groups' order. What
    the placement bounds, the CP-SAT model and its size estimate read of a phase."""
    for c in collectives:
        kind = base_kind(c.kind)
        if kind == "collective-permute":
            yield PermuteFlows(tuple((int(s), int(t)) for s, t in (c.source_target_pairs or [])
                                     if s != t), Fraction(int(c.bytes)))
            continue
        for grp in c.replica_groups:
            g = frozenset(int(r) for r in grp)
            cls = flow_class(kind, len(g))
            if cls != "none":
                yield GroupFlows(cls, g, class_coefficient(kind, c.bytes, len(g)), kind,
                                 int(c.bytes))


def ring_set_sizes(k: int, network: Network) -> range:
    """Sizes s of the chip sets a group of k ranks can sit on.

    Args:
        k: the group's ranks.
        network: the slice (its ``device_chip``).

    Returns:
        k alone with one device per chip; with several, ceil(k / most devices of a chip) <= s
        <= min(k, chips), increasing."""
    if network.num_devices == network.num_chips:
        return range(k, k + 1)
    most = int(np.bincount(np.asarray(network.device_chip)).max())
    return range(-(-k // most), min(k, network.num_chips) + 1)


def unit_loads(cls: str, chips: Sequence[int], network: Network) -> tuple[np.ndarray, int]:
    """Integer load per link (in units of `class_coefficient`) and flow hops of one group whose
    ranks sit on `chips` (the group's order; for "a2a" one entry per rank)."""
    L = network.num_links
    out = np.zeros(L, dtype=np.int64)
    if cls == "none":
        return out, 0
    if cls == "a2a":
        ch = np.asarray(chips, dtype=np.int64)
        n = len(ch)
        ii, jj = np.nonzero(~np.eye(n, dtype=bool))
        src, dst = ch[ii], ch[jj]
        return _count_routes(network, src, dst), int(network.hops[src, dst].sum())
    ring = network.ring_through(chips)
    o = ring.order
    if ring.kind == "single":
        return out, 0
    if ring.kind == "pair":
        a, b = o
        return (_count_routes(network, np.array([a, b]), np.array([b, a])),
                int(network.hops[a, b] + network.hops[b, a]))
    if cls == "pair":          # ring kind over 2 ranks whose chips collapse: handled above
        raise ValueError("pair class needs 2 chips")
    if ring.kind in ("ring", "line"):
        k = len(o)
        edges = [(o[i], o[i + 1]) for i in range(k - 1)]
        if ring.kind == "ring":
            edges.append((o[-1], o[0]))
        per = 1 if ring.kind == "ring" else 2
        for a, b in edges:
            out[network.link_id[(a, b)]] += per
            out[network.link_id[(b, a)]] += per
        return out, 2 * len(edges)
    src = np.array(o)
    dst = np.roll(src, -1)
    if network.ring_directions(ring) == 2:      # scattered, both ways without contention
        both_src, both_dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        return (_count_routes(network, both_src, both_dst),
                int(network.hops[both_src, both_dst].sum()))
    return 2 * _count_routes(network, src, dst), int(network.hops[src, dst].sum())


def latency_hops(cls: str, kind: str, chips: Sequence[int], network: Network) -> int:
    """Hops on the critical path of one run of a group's collective: steps x the longest step.

    A ring of k chips runs ``m (k - 1)`` steps (m = 2 for all-reduce), each as long as its
    longest step route (``Network.ring_step_routes``: 1 hop on a closed ring, k - 1 for a line's
    closing step, the dimension-order route of a scattered tour); a pair runs m steps of its
    route; an all-to-all is one step as long as its longest pair route."""
    if cls == "none":
        return 0
    if cls == "a2a":
        ch = np.asarray(chips, dtype=np.int64)
        return int(network.hops[np.ix_(ch, ch)].max()) if len(ch) else 0
    ring = network.ring_through(chips)
    m = ring_multiplier(base_kind(kind))
    if ring.kind == "single":
        return 0
    if ring.kind == "pair":
        a, b = ring.order
        return m * int(max(network.hops[a, b], network.hops[b, a]))
    longest = max(len(r) for r in network.ring_step_routes(ring))
    return m * (len(ring.order) - 1) * longest


def _count_routes(network: Network, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    rows = network.route_links[src * network.num_chips + dst]
    return np.bincount(rows[rows >= 0], minlength=network.num_links).astype(np.int64)


def group_link_bytes(c: Collective, group_chips: Sequence[int],
                     network: Network) -> tuple[np.ndarray, int]:
    """Per-link bytes and flow hops of one replica group of a collective.

    `group_chips`: the chip of each rank of the group, in the group's order."""
    chips = [int(x) for x in group_chips]
    k = len(set(chips))
    kind = base_kind(c.kind)
    if kind in RING_KINDS:
        cls = flow_class(kind, k)
        coef = class_coefficient(kind, c.bytes, k)
        u, h = unit_loads(cls, chips, network)
    else:
        cls = flow_class(kind, len(chips))
        coef = class_coefficient(kind, c.bytes, len(chips))
        u, h = unit_loads(cls, chips, network)
    return u * float(coef), h


def collective_link_bytes(c: Collective, chip_of_rank: np.ndarray,
                          network: Network) -> tuple[np.ndarray, int]:
    """Per-link bytes (one run) and flow hops of collective `c` when rank r sits on chip_of_rank[r]."""
    if base_kind(c.kind) == "collective-permute":
        pairs = np.array(c.source_target_pairs or [], dtype=np.int64).reshape(-1, 2)
        src, dst = chip_of_rank[pairs[:, 0]], chip_of_rank[pairs[:, 1]]
        f = network.flows_to_link_bytes(src, dst, np.full(len(src), float(c.bytes)))
        return f, int(network.hops[src, dst].sum())
    total = np.zeros(network.num_links)
    hops = 0
    for g in c.replica_groups:
        f, h = group_link_bytes(c, chip_of_rank[np.asarray(g, dtype=np.int64)], network)
        total += f
        hops += h
    return total, hops


@dataclasses.dataclass
class PhaseLoad:
    key: PhaseKey
    collectives: list[str]             # names of the collectives in flight together
    link_bytes: np.ndarray             # bytes per link, one run of the phase
    link_s: float                      # T: most loaded link's bytes / its bandwidth (seconds)
    overlap_s: float                   # O: compute it can hide behind (seconds)
    hops: int                          # flow hops, one run
    latency_s: float = 0.0             # L: hop latency x the class's critical path (seconds)
    demand_s: float = 0.0              # D: max over sub-demand sets of T_s - O_s (async_demand)

    @property
    def exposed_s(self) -> float:
        """Exposed link time: max(0, T - O, D) (the placement solvers' objective, per run)."""
        return max(0.0, self.link_s - self.overlap_s, self.demand_s)

    @property
    def exposed_latency_s(self) -> float:
        """What the hop latency adds to the exposed time: max(0, T + L - O, D) - max(0, T - O, D)."""
        return (max(0.0, self.link_s + self.latency_s - self.overlap_s, self.demand_s)
                - self.exposed_s)


SCORE_MEMO = 4096   # placements whose scores a TrafficModel keeps (4 floats each)
GROUP_MEMO_BYTES = 64 << 20   # a TrafficModel's memo of replica groups' link loads, at most


class TrafficModel:
    """Evidence + network, precomputed once; prices placements (used by Q2 and every search)."""

    def __init__(self, evidence: Evidence, network: Network):
        self.evidence = evidence
        self.network = network
        self.n_ranks = evidence.num_devices
        if self.n_ranks != network.num_devices:
            raise PlacementError(f"evidence has {self.n_ranks} logical ranks but the network "
                                 f"{network.name or network.shape} has {network.num_devices} "
                                 "devices: price evidence compiled for this target")
        for c in evidence.collectives:
            if base_kind(c.kind) not in (
                    RING_KINDS + ("all-to-all", "collective-permute")):
                raise ValueError(f"collective {c.name}: unknown kind {c.kind!r}")
        groups = phase_classes(evidence.collectives)
        self.phases: list[PhaseKey] = sorted(groups, key=lambda k: (k.phase, k.count, k.sync,
                                                                    k.part))
        self.phase_collectives = [groups[k] for k in self.phases]
        clock = float(evidence.clock_hz or 0.0)
        spans = ScheduleSpans(evidence, network) if clock > 0 else None
        bmin = float(np.min(network.link_bandwidth)) if network.num_links else 1.0
        self.overlap_s: list[float] = []               # O per phase class, seconds
        self.demands: list[list[DemandSet]] = []       # its sub-demand sets (async_demand)
        for key, cs in zip(self.phases, self.phase_collectives):
            if clock > 0 and not key.sync:
                O, subs = demand_sets(
                    cs, lambda a, b, n=key.count: spans.seconds(a, b, n),
                    lambda c: float(c.overlap_cycles) / clock,
                    [link_bytes_bound(c) for c in cs], bmin)
            else:
                O, subs = 0.0, []
            self.overlap_s.append(O)
            self.demands.append(subs)
        self.bandwidth = network.link_bandwidth
        self._units: dict[tuple, tuple[np.ndarray, int]] = {}
        self._scores: dict[bytes, tuple[float, float, int, float]] = {}
        self._groups = [[[np.asarray(g, dtype=np.int64) for g in c.replica_groups] for c in cs]
                        for cs in self.phase_collectives]
        self._kinds = [[base_kind(c.kind) for c in cs] for cs in self.phase_collectives]
        self._group_memo: dict[tuple, tuple[np.ndarray, int, int]] = {}
        self._group_memo_max = max(1024, GROUP_MEMO_BYTES // (8 * max(1, network.num_links)))

    def _group(self, c: Collective, kind: str, chips: np.ndarray) -> tuple[np.ndarray, int, int]:
        """(link bytes, flow hops, critical-path hops) of one replica group of `c` (base kind
        `kind`) on `chips`: ``group_link_bytes`` and ``latency_hops``, which depend only on the
        kind, the bytes and the group's multiset of chips. Memoized by those (cleared when it
        would pass ``GROUP_MEMO_BYTES``); the unit loads and latencies under it by flow class and
        chips, shared across byte sizes."""
        key_chips = tuple(sorted(chips.tolist()))
        mk = (kind, c.bytes, key_chips)
        hit = self._group_memo.get(mk)
        if hit is not None:
            return hit
        k = len(set(key_chips)) if kind in RING_KINDS else len(key_chips)
        cls = flow_class(kind, k)
        u = self._units.get((cls, key_chips))
        if u is None:
            u = self._units[(cls, key_chips)] = unit_loads(cls, key_chips, self.network)
        lk = ("lat", cls, kind == "all-reduce", key_chips)
        lat = self._units.get(lk)
        if lat is None:
            lat = self._units[lk] = latency_hops(cls, kind, key_chips, self.network)
        hit = (u[0] * float(class_coefficient(kind, c.bytes, k)), u[1], lat)
        if len(self._group_memo) >= self._group_memo_max:
            self._group_memo.clear()
        self._group_memo[mk] = hit
        return hit

    def chip_of_rank(self, placement: Sequence[int]) -> np.ndarray:
        p = check_placement(placement, self.network, self.n_ranks)
        return self.network.device_chip[p]

    def phase_loads(self, placement: Sequence[int]) -> list[PhaseLoad]:
        chip = self.chip_of_rank(placement)
        out = []
        for key, cs, gs, kinds, ov, subs in zip(self.phases, self.phase_collectives, self._groups,
                                                self._kinds, self.overlap_s, self.demands):
            tot = np.zeros(self.network.num_links)
            own_bytes = [] if subs else None     # per collective, for the sub-demand sets
            hops = 0
            crit = 0
            for c, groups, kind in zip(cs, gs, kinds):
                before = tot.copy() if subs else None
                own = 0          # this collective's critical path, hops
                if kind == "collective-permute":
                    f, h = collective_link_bytes(c, chip, self.network)
                    tot += f
                    hops += h
                    pairs = np.array(c.source_target_pairs or [], dtype=np.int64).reshape(-1, 2)
                    if len(pairs):
                        own = int(self.network.hops[chip[pairs[:, 0]], chip[pairs[:, 1]]].max())
                else:
                    for g in groups:
                        f, h, lat = self._group(c, kind, chip[g])
                        tot += f
                        hops += h
                        if lat > own:
                            own = lat
                if subs:
                    own_bytes.append(tot - before)
                # blocking collectives run one after another: their latencies add up; the
                # collectives of an async part are in flight together: the longest counts
                crit = crit + own if key.sync else max(crit, own)
            t = float((tot / self.bandwidth).max()) if len(tot) else 0.0
            demand = max((float((sum(own_bytes[i] for i in d.members) / self.bandwidth).max())
                          - d.overlap_s for d in subs), default=0.0)
            out.append(PhaseLoad(key, [c.name for c in cs], tot, t, ov, hops,
                                 crit * self.network.hop_latency_s, demand))
        return out

    def cost(self, placement: Sequence[int]) -> tuple[float, float, int]:
        """(comm_s exposed, link_bytes, hops), all summed over phases x counts. Lexicographic."""
        return self.scores(placement)[:3]

    def scores(self, placement: Sequence[int]) -> tuple[float, float, int, float]:
        """(comm_s exposed, link_bytes, hops, latency_s exposed), summed over phases x counts;
        ``comm_s + latency_s`` is Q2's step minus its compute (the same for every placement).
        Memoized per placement (the last ``SCORE_MEMO`` placements priced)."""
        key = np.asarray(placement, dtype=np.int64).tobytes()
        memo = self._scores
        hit = memo.get(key)
        if hit is not None:
            return hit
        comm = 0.0
        lb = 0.0
        hops = 0
        lat = 0.0
        for pl in self.phase_loads(placement):
            n = pl.key.count
            comm += n * pl.exposed_s
            lb += n * float(pl.link_bytes.sum())
            hops += n * pl.hops
            lat += n * pl.exposed_latency_s
        if len(memo) >= SCORE_MEMO:
            memo.pop(next(iter(memo)))
        memo[key] = out = (comm, lb, hops, lat)
        return out


def mesh_axis_groups(mesh_shape: Sequence[int], axes: Sequence[int]) -> list[list[int]]:
    """Replica groups (logical ids, row-major ``devices.flat`` order) of a collective over the
    given axes of a logical mesh: ranks that differ only along `axes` form one group."""
    shape = [int(s) for s in mesh_shape]
    n = int(np.prod(shape))
    ids = np.arange(n).reshape(shape)
    axes = sorted(int(a) for a in axes)
    rest = [a for a in range(len(shape)) if a not in axes]
    t = np.transpose(ids, rest + axes)
    k = int(np.prod([shape[a] for a in axes])) if axes else 1
    return [row.tolist() for row in t.reshape(-1, k)]
