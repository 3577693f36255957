"""The AoiZora reference simulator: one step of a compiled program on a target, under a placement.

It is the "simulated" column of every benchmark table. It prices the compiler's evidence
(``aoizora.extract.evidence.Evidence``, the compiled HLO) in more detail than the cost models the
solvers optimize and independently of them: it shares with them only what the compiler emitted
(the HLO parser and the evidence reader of ``aoizora.extract``) and the slice's physical
description (shape, wraparound, device coordinates); its compute model, constants, network
model (links, routes, the order of ring collectives: ``benchmarks.sim.topology``) and overlap
model are its own, and it imports nothing from ``aoizora.formulation``.

What it does
1. Compute: one TensorCore stream. Given the compiled program's HLO text (``hlo=``), every op is
   priced by the simulator's own model (``benchmarks.sim.hlo_cost``: MXU-bound versus HBM-bound
   with MXU padding, vector and transcendental work, launch overhead; Pallas kernels block by
   block from their grid, ``benchmarks.sim.mosaic`` and ``benchmarks.sim.kernel_model``; splash
   attention by ``kernel_model.splash_time_s``), with its own constants
   (``benchmarks.sim.constants``). That is the independent yardstick. Without the HLO (evidence
   JSON alone) it falls back to the compiler's ``estimated_cycles / clock_hz`` (else the roofline
   ``max(flops / peak, bytes / hbm_bandwidth)``; ``kernel_flops`` can supply an opaque kernel's
   flops), and the result's notes say the compute is then not independent of the compiler.
2. Collectives: each run is expanded into the per-step transfers the hardware makes
   (``benchmarks.sim.collectives``: rings of n-1 steps in the order ``benchmarks.sim.topology``
   gives a group's chips, both ways where the ring closes on physical links, pairwise
   all-to-all, permutes), each transfer routed hop by hop over directed
   links with per-hop latency, links shared max-min fairly among the transfers active at the same
   moment, rates recomputed at every start and end (``benchmarks.sim.engine``).
3. The schedule is walked in order. A collective's transfers are released when the stream
   reaches its start; the stream waits at its done until the last transfer has arrived. Sync
   collectives start and are waited for at once (they block); async ones overlap the compute
   scheduled between their start and done, and share links with every collective in flight.
   Order: the evidence's schedule positions (``Collective.start_index`` / ``done_index``,
   ``ComputeOp.index``) when it has them; else, from its phases: per phase (in phase order) the
   phase's collectives start together, sync ones are waited for, then the compute the compiler
   said overlaps the async ones (``overlap_cycles``, taken from the loop's compute, async dones in
   order of their overlap), then the async dones; the rest of the compute runs after.
4. Loops: ops are grouped by ``count`` (the trip-count product of the loops around them). A
   group's body is simulated once and its time multiplied by ``count``, which assumes the body is
   identical in every iteration (it is: the compiler emits one body per `while`). Groups are
   simulated one after the other (nothing in flight crosses a loop boundary).
5. Speed: the walk splits into *episodes* (from a start while nothing is in flight until nothing
   is in flight again); an episode's outcome depends only on its items (compute durations and
   collectives with their physical chips), so each distinct episode is simulated once and cached
   on the `Simulator`, also across placements. This changes no number.
6. The step ends when its last op does: ``step_s = sum over groups of count x body time``;
   ``compute_s`` is the compute alone; ``communication_s = step_s - compute_s`` is the exposed
   communication.

Placement: ``placement[r]`` is the device (position in ``target.devices()``) of logical rank r;
by default the device order the evidence was compiled under, else rank r on device r.

Host offload (``benchmarks.sim.host``): each transfer between HBM and host memory (an
offloading remat policy's async slices and copies to and from memory space S(5)) moves its bytes
over the chip's PCIe link, one link each way at ``ChipModel.host_Bps``, shared fairly among the
transfers in flight, released and waited for where the schedule starts and ends it, so the
compute between them overlaps it (the episodes of 5 include them).

Not simulated: the host (dispatching the program from Python), the reduction arithmetic of
reduce-scatter / all-reduce, HBM traffic of the
collectives (two devices of one chip, as on v4, exchange data at no cost), DMA engine limits beyond
the links, contention between ICI and compute, collectives in flight across a loop boundary, and
two-dimensional collective algorithms: a group spanning two physical axes runs as one ring through
its chips (the scaling book's "bandwidth divides by the number of axes" is not assumed).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import numpy as np

from aoizora.extract.evidence import Collective, ComputeOp, Evidence
from aoizora.extract.targets import Target, get_target
from benchmarks.sim.collectives import Expander
from benchmarks.sim.constants import chip_model
from benchmarks.sim.engine import FlowEngine
from benchmarks.sim.hlo_cost import compute_seconds_by_name
from benchmarks.sim.topology import SimNetwork

LABEL = "simulated (AoiZora reference simulator)"


class SimulatorError(ValueError):
    """Bad input to the simulator (placement not a permutation, evidence for another target)."""


@dataclasses.dataclass
class CollectiveTime:
    """One collective of the evidence, as simulated. Times in seconds, bytes in bytes."""

    name: str
    kind: str
    bytes: int
    count: int
    group_size: int
    num_groups: int
    is_async: bool
    algorithm: str          # e.g. "bidirectional ring", "unidirectional ring", "pairwise"
    time_s: float           # one run: from its start to its last transfer's arrival, in context
    exposed_s: float        # one run: how long the compute stream waited for it at its done
    total_exposed_s: float  # exposed_s x count


@dataclasses.dataclass
class LinkUse:
    """One directed ICI link's use over the step (busy: at least one transfer draining)."""

    src: list[int]          # physical chip coordinates
    dst: list[int]
    busy_s: float
    bytes: float
    utilization: float      # busy_s / step_s


@dataclasses.dataclass
class SimResult:
    """The simulated step. Seconds; marked with LABEL wherever it is shown."""

    label: str
    target: str
    placement: list[int]
    step_s: float
    compute_s: float
    communication_s: float                  # exposed: step_s - compute_s
    collectives: list[CollectiveTime]
    busiest_links: list[LinkUse]
    schedule: str                           # "positions" or "phases"
    loops: list[dict[str, Any]]             # per count group: count, body_s, compute_s
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SimResult":
        d = dict(d)
        d["collectives"] = [CollectiveTime(**c) for c in d.get("collectives", [])]
        d["busiest_links"] = [LinkUse(**l) for l in d.get("busiest_links", [])]
        return cls(**d)


# ---------------------------------------------------------------------------------------------
class Simulator:
    """A target's network and its caches; ``run`` simulates evidence under a placement."""

    def __init__(self, target: "str | Target", network: Any = None):
        """``network``: an object describing the slice instead of the target's own (``shape``,
        ``wrap``, ``chips``, ``device_chip``, optionally ``link_bandwidth_Bps`` and
        ``hop_latency_s``), e.g. ``aoizora.extract.network.Network`` of a hypothetical slice;
        only that description is read, the links, routes and rings are the simulator's own."""
        self.target = get_target(target)
        cm = chip_model(self.target.chip.generation)
        self.net = SimNetwork.of(self.target, cm.link_Bps, cm.hop_latency_s, network)
        self.expander = Expander(self.net)
        # the network's links, then this chip's PCIe link to its host, each way (to host, to
        # device): every chip of an SPMD program offloads alike, so one chip's links stand for all;
        # a device gets its share of them (two devices of a v4 / TPU7x chip share its PCIe link)
        self.host_links = (self.net.num_links, self.net.num_links + 1)
        host_Bps = cm.host_Bps / cm.devices_per_chip
        self.capacity = np.concatenate([np.asarray(self.net.link_bandwidth, dtype=float),
                                        [host_Bps, host_Bps]])
        self._host_latency_s = cm.hop_latency_s
        self._host: list = []
        self._episodes: dict[Any, tuple] = {}
        # bound the cache to about 40 MB of per-link arrays
        self._max_episodes = int(min(20000, max(256, 2.5e6 // max(1, self.net.num_links))))
        self._op_seconds: dict[str, float] = {}
        # the last HLO priced (the object given: text or module), its module and (op seconds,
        # notes): one program is often simulated under many placements; pricing its ops again
        # would give the same numbers
        self._hlo_priced: tuple[Any, Any, dict[str, float], list[str]] | None = None

    # -- compute --------------------------------------------------------------------------------
    def compute_seconds(self, op: ComputeOp, clock_hz: float) -> float:
        """Seconds of one run of a compute op (see module docstring, 1)."""
        if op.name in self._op_seconds:
            return self._op_seconds[op.name]
        if op.estimated_cycles is not None:
            return float(op.estimated_cycles) / clock_hz
        chip = self.target.chip
        return max(float(op.flops) / chip.device_peak_flops,
                   float(op.bytes) / chip.device_hbm_bandwidth_Bps)

    # -- placement ------------------------------------------------------------------------------
    def default_placement(self, evidence: Evidence) -> tuple[list[int], str]:
        """The device order the evidence was compiled under (its ``algorithms_device_order``,
        device ids mapped to positions in ``target.devices()``), else rank r on device r."""
        nranks = evidence.num_devices if evidence.mesh_axes else self._max_rank(evidence) + 1
        order = list(evidence.algorithms_device_order or [])
        if len(order) == nranks:
            try:
                pos = {int(d.id): i for i, d in enumerate(self.target.devices())}
                mapped = [pos[int(i)] for i in order]
                if len(mapped) == len(set(mapped)):
                    return mapped, "the device order the evidence was compiled under"
            except Exception:       # no libtpu here, or ids of another slice
                pass
        return list(range(nranks)), "rank r on device r"

    def rank_chips(self, evidence: Evidence, placement: Sequence[int] | None) -> np.ndarray:
        nranks = evidence.num_devices if evidence.mesh_axes else self._max_rank(evidence) + 1
        if placement is None:
            placement = self.default_placement(evidence)[0]
        placement = [int(p) for p in placement]
        nd = self.net.num_devices
        if len(placement) != nranks:
            raise SimulatorError(f"placement has {len(placement)} entries but the evidence has "
                                 f"{nranks} logical ranks: give one device id per rank")
        if len(set(placement)) != len(placement) or min(placement) < 0 or max(placement) >= nd:
            raise SimulatorError(f"placement {placement} is not a list of distinct device ids in "
                                 f"0..{nd - 1} of {self.target.name}")
        return self.net.device_chip[np.asarray(placement, dtype=np.int64)]

    @staticmethod
    def _max_rank(ev: Evidence) -> int:
        m = 0
        for c in ev.collectives:
            for g in c.replica_groups:
                m = max([m] + list(g))
            for s, t in c.source_target_pairs or []:
                m = max(m, s, t)
        return m

    # -- one collective alone -------------------------------------------------------------------
    def collective_seconds(self, c: Collective, rank_chip: np.ndarray) -> float:
        """Seconds of one run of ``c`` alone on the network."""
        eng = FlowEngine(self.capacity)
        nb, routes, lat, deps = self.expander.expand(c, rank_chip).arrays()
        eng.add(nb, routes, lat, 0.0, 0, deps)
        return eng.run_until_tag(0)

    # -- the step -------------------------------------------------------------------------------
    def run(self, evidence: Evidence, placement: Sequence[int] | None = None,
            top_links: int = 8, kernel_flops: "dict[str, float] | None" = None,
            hlo: Any = None) -> SimResult:
        """Simulate one step. ``hlo``: the compiled program's HLO text (``compiled.as_text()``) or
        a parsed ``HloModule``; its ops are then priced by the simulator's own compute model
        (module docstring, 1); host offload is priced only from the text (pass the same string
        object across placements: its pricing is cached on it). ``kernel_flops``: without ``hlo``, flops per run for compute ops
        (by name) that the evidence has no cycle estimate or flops for."""
        notes: list[str] = []
        self._op_seconds = {}
        self._host = []
        if hlo is not None:
            from aoizora.extract.hlo import parse_hlo_module
            if self._hlo_priced is None or self._hlo_priced[0] is not hlo:
                module = parse_hlo_module(hlo) if isinstance(hlo, str) else hlo
                self._hlo_priced = (hlo, module, *compute_seconds_by_name(
                    module, chip_model(self.target.chip.generation)))
            _, module, self._op_seconds, cnotes = self._hlo_priced
            notes += list(cnotes)
            if isinstance(hlo, str):
                from benchmarks.sim.host import host_transfers
                self._host, hnotes = host_transfers(
                    module, hlo, {o.name: (int(o.index), int(o.count)) for o in evidence.compute})
                notes += hnotes
            else:
                notes.append("HLO given parsed, without its text: host offload (memory spaces "
                             "are read from the text) not priced")
            missing = sorted({o.name for o in evidence.compute} - set(self._op_seconds))
            if missing:
                notes.append(f"{len(missing)} compute op(s) not priced by the simulator's model "
                             f"({', '.join(missing[:4])}): the compiler's estimate is used")
        else:
            notes.append("compute priced from the compiler's cycle estimates (no HLO given): "
                         "not independent of the compiler")
        ev = evidence
        if kernel_flops:
            ev = dataclasses.replace(ev, compute=[
                dataclasses.replace(o, flops=float(kernel_flops[o.name]))
                if o.estimated_cycles is None and not o.flops and o.name in kernel_flops else o
                for o in ev.compute])
        if ev.target and get_target(ev.target).name != self.target.name:
            raise SimulatorError(f"evidence was compiled for {ev.target} but the simulator's "
                                 f"target is {self.target.name}: use Simulator({ev.target!r})")
        if placement is None:
            placement, why = self.default_placement(ev)
            notes.append(f"placement not given: {why}")
        rank_chip = self.rank_chips(ev, placement)
        clock = ev.clock_hz or self.target.chip.clock_hz
        blind = [o for o in ev.compute if o.estimated_cycles is None and not o.flops
                 and o.name not in self._op_seconds
                 and o.kind == "custom-call" and o.custom_call_target == "tpu_custom_call"]
        if blind:
            notes.append(f"{len(blind)} opaque kernel(s) without a cycle estimate or flops in the "
                         f"evidence ({', '.join(sorted({o.name for o in blind})[:4])}): priced on "
                         "their bytes only, so their compute is likely underestimated")
        positions = _has_positions(ev)
        if self._host and not positions:
            notes.append(f"{len(self._host)} host transfer(s) not priced: the evidence has no "
                         "schedule positions")
            self._host = []
        counts = sorted({c.count for c in ev.collectives} | {o.count for o in ev.compute}
                        | {h.count for h in self._host})
        per_coll: dict[int, tuple[float, float, str]] = {}
        link_bytes = np.zeros(len(self.capacity))
        link_busy = np.zeros(len(self.capacity))
        host_time: dict[int, tuple[float, float, str]] = {}
        loops = []
        step = comp_total = 0.0
        for k in counts:
            cis = [i for i, c in enumerate(ev.collectives) if c.count == k]
            ops = [o for o in ev.compute if o.count == k]
            if positions:
                items = _items_from_positions(ev, cis, ops, self, clock)
                items += [((h.start_key, 0, len(ev.collectives) + j), "start",
                           len(ev.collectives) + j) for j, h in enumerate(self._host)
                          if h.count == k]
                items += [((h.done_key, 2, len(ev.collectives) + j), "done",
                           len(ev.collectives) + j) for j, h in enumerate(self._host)
                          if h.count == k]
                items.sort(key=lambda x: x[0])
            else:
                items = _items_from_phases(ev, cis, ops, self, clock, notes)
            body, comp, lb, lbusy = self._walk(ev, items, rank_chip, per_coll)
            for p in [p for p in per_coll if p >= len(ev.collectives)]:
                host_time[p - len(ev.collectives)] = per_coll.pop(p)
            step += k * body
            comp_total += k * comp
            link_bytes += k * lb
            link_busy += k * lbusy
            loops.append({"count": k, "body_s": body, "compute_s": comp,
                          "collectives": len(cis), "compute_ops": len(ops)})
            if k > 1:
                notes.append(f"ops with count {k}: body simulated once, time x {k} "
                             "(the body is identical in every iteration)")
        colls = []
        for i, c in enumerate(ev.collectives):
            t, ex, algo = per_coll.get(i, (0.0, 0.0, "none"))
            colls.append(CollectiveTime(c.name, c.kind, int(c.bytes), int(c.count), c.group_size,
                                        len(c.replica_groups), bool(c.is_async), algo, t, ex,
                                        ex * c.count))
        if self._host:
            hb = sum(h.bytes * h.count for h in self._host)
            hx = sum(host_time.get(j, (0, 0, ""))[1] * h.count for j, h in enumerate(self._host))
            notes.append(f"host offload: {len(self._host)} transfer(s), {hb / 1e9:.3f} GB per "
                         f"step over PCIe, {hx * 1e3:.3f} ms exposed")
        link_bytes, link_busy = link_bytes[:self.net.num_links], link_busy[:self.net.num_links]
        order = np.argsort(-link_busy, kind="stable")[:top_links]
        links = [LinkUse(list(self.net.chips[int(self.net.link_src[l])]),
                         list(self.net.chips[int(self.net.link_dst[l])]),
                         float(link_busy[l]), float(link_bytes[l]),
                         float(link_busy[l] / step) if step > 0 else 0.0)
                 for l in order if link_busy[l] > 0]
        return SimResult(LABEL, self.target.name, [int(p) for p in placement], step, comp_total,
                         max(0.0, step - comp_total), colls, links,
                         "positions" if positions else "phases", loops, notes)

    def _walk(self, ev: Evidence, items: list[tuple], rank_chip: np.ndarray,
              per_coll: dict[int, tuple[float, float, str]]):
        """Walk one loop body's items; returns (body_s, compute_s, link_bytes, link_busy).

        The items split into compute outside any collective and *episodes*: from a start while
        nothing is in flight to the moment nothing is in flight again. An episode's outcome
        depends only on its items (compute durations, collectives with their physical chips), so
        it is simulated once per distinct episode (cached on the Simulator, across placements)."""
        t = 0.0
        comp = 0.0
        lb = np.zeros(len(self.capacity))
        lbusy = np.zeros(len(self.capacity))
        i, n = 0, len(items)
        while i < n:
            typ, payload = items[i][1], items[i][2]
            if typ != "start":
                if typ == "compute":
                    t += payload
                    comp += payload
                i += 1
                continue
            j, open_ = i, set()
            while j < n:
                ty, p = items[j][1], items[j][2]
                if ty == "start":
                    open_.add(p)
                elif ty == "done":
                    open_.discard(p)
                j += 1
                if not open_:
                    break
            seg = items[i:j]
            local: dict[int, int] = {}
            for it in seg:
                if it[1] == "start" and it[2] not in local:
                    local[it[2]] = len(local)
            key = (tuple((it[1], it[2] if it[1] == "compute" else local[it[2]]) for it in seg
                         if it[1] == "compute" or it[2] in local),
                   tuple(self._signature(ev, ci, rank_chip) for ci in local))
            res = self._episodes.get(key)
            if res is None:
                res = self._run_episode(ev, seg, local, rank_chip)
                if len(self._episodes) >= self._max_episodes:
                    self._episodes.clear()
                self._episodes[key] = res
            end, ecomp, per, elb, ebusy = res
            t += end
            comp += ecomp
            for ci, k in local.items():
                per_coll[ci] = per[k]
            lb += elb
            lbusy += ebusy
            i = j
        return t, comp, lb, lbusy

    def _signature(self, ev: Evidence, ci: int, rank_chip: np.ndarray) -> tuple:
        """What a collective's transfers depend on: kind, bytes, groups and pairs as chips (a
        host transfer, ``ci`` past the collectives: its direction and bytes)."""
        if ci >= len(ev.collectives):
            h = self._host[ci - len(ev.collectives)]
            return ("host", h.to_host, float(h.bytes))
        c = ev.collectives[ci]
        nr = len(rank_chip)

        def chip(r: int) -> int:
            return int(rank_chip[r]) if 0 <= r < nr else -1 - r   # bad ranks fail in expand()
        groups = tuple(tuple(chip(r) for r in g) for g in c.replica_groups)
        pairs = tuple((chip(a), chip(b)) for a, b in (c.source_target_pairs or []))
        return (c.kind, float(c.bytes), groups if c.kind != "collective-permute" else (), pairs)

    def _run_episode(self, ev: Evidence, seg: list[tuple], local: dict[int, int],
                     rank_chip: np.ndarray):
        """Simulate one episode from stream time 0 with a fresh engine.

        Returns (end_s, compute_s, [(time_s, exposed_s, algorithm) per local collective],
        link_bytes, link_busy)."""
        eng = FlowEngine(self.capacity)
        t = comp = 0.0
        per: list = [None] * len(local)
        started: dict[int, float] = {}
        algos: dict[int, str] = {}
        for it in seg:
            typ, p = it[1], it[2]
            if typ == "compute":
                t += p
                comp += p
            elif typ == "start" and p >= len(ev.collectives):
                h = self._host[p - len(ev.collectives)]
                algos[p] = "PCIe to host" if h.to_host else "PCIe from host"
                link = self.host_links[0 if h.to_host else 1]
                eng.add([float(h.bytes)], [[link]], [self._host_latency_s], t, p)
                started[p] = t
            elif typ == "start":
                b = self.expander.expand(ev.collectives[p], rank_chip)
                algos[p] = b.algorithm
                nb, routes, lat, deps = b.arrays()
                eng.add(nb, routes, lat, t, p, deps)
                started[p] = t
            elif typ == "done" and p in started and per[local[p]] is None:
                tf = eng.run_until_tag(p)
                per[local[p]] = (tf - started[p], max(0.0, tf - t), algos[p])
                t = max(t, tf)
        eng.run_all()
        for p, ts in started.items():            # a start without a done: waited for at the end
            if per[local[p]] is None:
                tf = eng.tag_finish[p]
                per[local[p]] = (tf - ts, max(0.0, tf - t), algos[p])
                t = max(t, tf)
        return t, comp, per, eng.link_bytes.copy(), eng.link_busy.copy()


# ---------------------------------------------------------------------------------------------
def _has_positions(ev: Evidence) -> bool:
    return any(getattr(c, "start_index", 0) or getattr(c, "done_index", 0)
               for c in ev.collectives) or any(getattr(o, "index", 0) for o in ev.compute)


def _items_from_positions(ev, cis, ops, sim, clock) -> list[tuple]:
    """(sort key, type, payload): starts before compute before dones at one position."""
    items = []
    for ci in cis:
        c = ev.collectives[ci]
        s, d = int(c.start_index), int(c.done_index)
        if not c.is_async:
            d = s
        items.append(((s, 0, ci), "start", ci))
        items.append(((max(d, s), 2, ci), "done", ci))
    for j, o in enumerate(ops):
        items.append(((int(o.index), 1, j), "compute", sim.compute_seconds(o, clock)))
    items.sort(key=lambda x: x[0])
    return items


def _items_from_phases(ev, cis, ops, sim, clock, notes) -> list[tuple]:
    """Schedule synthesized from phases (module docstring, 3)."""
    pool = sum(sim.compute_seconds(o, clock) for o in ops)
    left = pool
    items = []
    phases: dict[int, list[int]] = {}
    for ci in cis:
        phases.setdefault(int(ev.collectives[ci].phase), []).append(ci)
    key = 0
    for p in sorted(phases):
        members = phases[p]
        for ci in members:
            items.append((key, "start", ci)); key += 1
        sync = [ci for ci in members if not ev.collectives[ci].is_async]
        asyn = sorted((ci for ci in members if ev.collectives[ci].is_async),
                      key=lambda ci: (ev.collectives[ci].overlap_cycles, ci))
        for ci in sync:
            items.append((key, "done", ci)); key += 1
        done_o = 0.0
        for ci in asyn:
            o = float(ev.collectives[ci].overlap_cycles) / clock
            take = min(max(0.0, o - done_o), left)
            if take > 0:
                items.append((key, "compute", take)); key += 1
                left -= take
                done_o += take
            if o - done_o > 1e-15 and left <= 0:
                notes.append(f"{ev.collectives[ci].name}: overlap_cycles exceed the compute "
                             "left in its loop; overlap capped")
            items.append((key, "done", ci)); key += 1
    if left > 0:
        items.append((key, "compute", left))
    return items


@functools.lru_cache(maxsize=16)
def _simulator(target_name: str) -> Simulator:
    return Simulator(target_name)


def simulate(evidence: Evidence, placement: Sequence[int] | None = None,
             target: "str | Target | None" = None, top_links: int = 8,
             kernel_flops: "dict[str, float] | None" = None, hlo: Any = None) -> SimResult:
    """Simulate one step of ``evidence`` with logical rank r on device ``placement[r]`` (a
    position in ``target.devices()``; default: the device order the evidence was compiled under,
    else rank r on device r) on ``target`` (default: the evidence's own). ``hlo``: the compiled
    program's HLO text, for the simulator's own compute model (``Simulator.run``)."""
    t = get_target(target if target is not None else evidence.target)
    return _simulator(t.name).run(evidence, placement, top_links=top_links,
                                  kernel_flops=kernel_flops, hlo=hlo)


def format_result(r: SimResult, top: int = 10) -> str:
    """A plain-text summary of a simulated step (milliseconds / microseconds)."""
    lines = [f"{r.label}: {r.target}, placement {r.placement}",
             f"step {r.step_s * 1e3:.3f} ms = compute {r.compute_s * 1e3:.3f} ms + exposed "
             f"communication {r.communication_s * 1e3:.3f} ms (schedule from {r.schedule})",
             "loops: " + ", ".join(f"{lp['count']} x {lp['body_s'] * 1e3:.3f} ms" for lp in r.loops),
             f"collectives by exposed time (top {top}):"]
    for c in sorted(r.collectives, key=lambda c: -c.total_exposed_s)[:top]:
        lines.append(f"  {c.name:<32} {c.kind:<18} {c.bytes:>12,} B x{c.count:<4} "
                     f"{c.num_groups}x{c.group_size:<3} {c.algorithm:<20} run {c.time_s * 1e6:9.1f} us"
                     f"  exposed {c.exposed_s * 1e6:9.1f} us  total {c.total_exposed_s * 1e3:8.3f} ms")
    lines.append("busiest links:")
    for l in r.busiest_links:
        lines.append(f"  {tuple(l.src)} -> {tuple(l.dst)}  busy {l.busy_s * 1e3:.3f} ms "
                     f"({100 * l.utilization:.1f}% of the step), {l.bytes / 1e9:.3f} GB")
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.simulator EVIDENCE.json [--hlo PROGRAM.hlo] [--placement 0,1,...]
    [--json]``."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description="Simulate one step of compiled evidence (JSON).")
    ap.add_argument("evidence", help="an Evidence JSON file (Evidence.dumps())")
    ap.add_argument("--placement", default=None,
                    help="device per logical rank, comma-separated (default: compiled order)")
    ap.add_argument("--target", default=None, help="default: the evidence's target")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--hlo", default=None, help="the compiled program's HLO text "
                    "(compiled.as_text()): compute priced by the simulator's own model")
    a = ap.parse_args(argv)
    with open(a.evidence) as f:
        ev = Evidence.loads(f.read())
    placement = None if a.placement is None else [int(v) for v in a.placement.split(",")]
    hlo = None
    if a.hlo is not None:
        with open(a.hlo) as f:
            hlo = f.read()
    r = simulate(ev, placement, a.target, hlo=hlo)
    print(json.dumps(r.to_json(), indent=1) if a.json else format_result(r))
    return 0


def simulate_collective(c: Collective, placement: Sequence[int], target: "str | Target") -> float:
    """Seconds of one run of one collective alone on ``target``, rank r on device placement[r]."""
    sim = _simulator(get_target(target).name)
    chips = sim.net.device_chip[np.asarray(placement, dtype=np.int64)]
    return sim.collective_seconds(c, chips)


if __name__ == "__main__":
    raise SystemExit(main())
