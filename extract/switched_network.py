"""The network of a switched GPU box or cluster: GPUs and switches as nodes, directed links of
their own bandwidth, fewest-hop routes, and NCCL-style rings.

Built from a GPU `Target`'s `Fabric` (``Network.from_target`` dispatches here). The same
interface as the TPU torus (`aoizora.extract.network.Network`), so the traffic model, Q2 and the
placement CP-SAT price it unchanged:

- Nodes: chips (GPUs) ``0..C-1`` in device-id order, then the fabric's switches ``C..N-1``
  (``node_names``). ``chips`` holds each GPU's coordinates in the target's hierarchy grid.
- Links are directed, two per duplex fabric link, each with its own one-way bandwidth
  (``link_bandwidth``, bytes/s) and latency (``link_latency``, s). ``link_bandwidth_Bps`` is the
  fastest link's, the reference of lower bounds (bytes on some link / the fastest bandwidth
  never over-state a time) and of the CP-SAT's integer link weights; pricing divides each link's
  bytes by its own bandwidth.
- Routes: the fewest-hop path between two GPUs that passes through switches only (never through
  a third GPU), found by breadth-first search over links in fabric order (deterministic; on a
  tree it is the only path). ``route_links`` / ``hops`` as for the torus.
- Rings (``ring_through``): NCCL's ring visits a group's GPUs in the order of the hierarchy
  (outermost level first: node or socket, then switch, then GPU), so each tree link is crossed
  once each way. It is ``ring`` when consecutive GPUs (and the last and first) share direct
  links (NVLink bridges), else ``scattered``: every step routed through the switches, and run in
  one direction when the two directions would share a GPU's uplink (``ring_directions``), as an
  NCCL ring does.
- ``generation``: the GPUs' generation (``hardware.gpu.GPUS``; "" when built without a target).
- ``chip_host``: the host (node) of each GPU, from the fabric's ``host_axis`` (all 0 on one
  host): NCCL's tree runs a chain inside a host and a tree between hosts.
- Uniform per-hop latency ``hop_latency_s`` (Q2's latency term counts hops): the chip's, half of
  NCCL's Ring/Simple step latency on its first-hop fabric (``hardware.gpu``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from aoizora.extract.link_graph import LinkGraph, NetworkError, Ring


class SwitchedNetwork(LinkGraph):
    """GPUs, switches and directed links of their own bandwidth. See the module docstring."""

    has_switches = True

    def __init__(self, fabric, name: str = "", hop_latency_s: float = 0.0, peak_flops: float = 0.0,
                 hbm_bandwidth_Bps: float = 0.0, generation: str = ""):
        coords = [tuple(int(v) for v in c) for c in fabric.coords]
        nd = len(coords[0])
        self.shape = tuple(max(c[k] for c in coords) + 1 for k in range(nd))
        self.wrap = (False,) * nd
        self.name = name
        self.generation = generation
        self.hop_latency_s = float(hop_latency_s)
        self.peak_flops = float(peak_flops)
        self.hbm_bandwidth_Bps = float(hbm_bandwidth_Bps)
        self.chips = coords
        self.chip_index = {c: i for i, c in enumerate(coords)}
        if len(self.chip_index) != len(coords):
            raise NetworkError(f"{name}: two GPUs share coordinates")
        self.coords = np.array(coords, dtype=np.int64).reshape(len(coords), nd)
        self.device_chip = np.arange(len(coords), dtype=np.int64)
        ha = fabric.host_axis
        self.chip_host = (self.coords[:, ha].copy() if ha is not None
                          else np.zeros(len(coords), dtype=np.int64))
        self.node_names = list(fabric.gpus) + list(fabric.switches)
        self._build_fabric_links(fabric)
        self.link_bandwidth_Bps = float(self.link_bandwidth.max())
        self._build_fabric_routes()
        self._ring_cache: dict[frozenset, Ring] = {}

    @classmethod
    def from_target(cls, target) -> "SwitchedNetwork":
        """The network of a GPU `Target` (its `Fabric`)."""
        c = target.chip
        return cls(target.fabric, name=target.name, hop_latency_s=c.hop_latency_s,
                   peak_flops=c.device_peak_flops, hbm_bandwidth_Bps=c.device_hbm_bandwidth_Bps,
                   generation=c.generation)

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    def node_label(self, node: int) -> str:
        """The fabric name of a node (GPU or switch)."""
        return self.node_names[node]

    def _build_fabric_links(self, fabric) -> None:
        idx = {n: i for i, n in enumerate(self.node_names)}
        src, dst, bw, lat, kind = [], [], [], [], []
        self.link_id: dict[tuple[int, int], int] = {}
        for l in fabric.links:
            if l.a not in idx or l.b not in idx:
                raise NetworkError(f"{self.name}: link {l.a} - {l.b} names an unknown node")
            for a, b in ((idx[l.a], idx[l.b]), (idx[l.b], idx[l.a])):
                if (a, b) in self.link_id:
                    raise NetworkError(f"{self.name}: two links {l.a} - {l.b}")
                self.link_id[(a, b)] = len(src)
                src.append(a); dst.append(b); bw.append(l.bandwidth_Bps)
                lat.append(l.latency_s); kind.append(l.kind)
        self.link_src = np.array(src, dtype=np.int64)
        self.link_dst = np.array(dst, dtype=np.int64)
        self.link_axis = np.full(len(src), -1, dtype=np.int64)
        self.link_dir = np.zeros(len(src), dtype=np.int64)
        self.link_bandwidth = np.array(bw, dtype=np.float64)
        self.link_latency = np.array(lat, dtype=np.float64)
        self.link_kind = kind
        C = self.num_chips
        self.adjacency = [sorted({b for (a2, b) in self.link_id if a2 == a and b < C})
                          for a in range(C)]
        self._out: list[list[int]] = [[] for _ in self.node_names]
        for lid, a in enumerate(src):
            self._out[a].append(lid)

    def _bfs_routes(self, a: int) -> list[list[int]]:
        """Fewest-hop link paths from chip a to every chip, transiting switches only."""
        C = self.num_chips
        prev: dict[int, int] = {a: -1}
        q = deque([a])
        while q:
            u = q.popleft()
            if u != a and u < C:
                continue                              # GPUs are endpoints, never transit
            for lid in self._out[u]:
                v = int(self.link_dst[lid])
                if v not in prev:
                    prev[v] = lid
                    q.append(v)
        out = []
        for b in range(C):
            if b not in prev:
                raise NetworkError(f"{self.name}: no path from {self.node_names[a]} to "
                                   f"{self.node_names[b]}")
            path, v = [], b
            while v != a:
                lid = prev[v]
                path.append(lid)
                v = int(self.link_src[lid])
            out.append(path[::-1])
        return out

    def _build_fabric_routes(self) -> None:
        C = self.num_chips
        routes = [r for a in range(C) for r in self._bfs_routes(a)]
        maxh = max((len(r) for r in routes), default=0)
        table = np.full((C * C, max(maxh, 1)), -1, dtype=np.int64)
        hops = np.zeros(C * C, dtype=np.int64)
        for i, r in enumerate(routes):
            table[i, :len(r)] = r
            hops[i] = len(r)
        self.route_links = table
        self.hops = hops.reshape(C, C)

    def ring_through(self, chips) -> Ring:
        """NCCL's ring through these GPUs (see the module docstring); duplicates collapse."""
        order = self.distinct_chips(chips)
        key = frozenset(order)
        hit = self._ring_cache.get(key)
        if hit is not None:
            return hit
        o = tuple(sorted(order, key=lambda c: (tuple(reversed(self.chips[c])), c)))
        if len(o) <= 2:
            r = Ring(o, "single" if len(o) == 1 else "pair")
        elif all((o[i], o[(i + 1) % len(o)]) in self.link_id for i in range(len(o))):
            r = Ring(o, "ring")
        else:
            r = Ring(o, "scattered")
        self._ring_cache[key] = r
        return r

    def link_time_s(self, link_bytes: np.ndarray) -> np.ndarray:
        """Seconds each link needs for its bytes (each at its own bandwidth)."""
        return np.asarray(link_bytes, dtype=np.float64) / self.link_bandwidth
