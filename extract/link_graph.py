"""What every network shares, whatever the hardware family: chips (and switch nodes), directed
links with their bandwidth, a precomputed route table, and the queries the traffic model, Q2 and
the placement CP-SAT make of it (routes, link bytes of flows, ring steps and directions).

Families fill it: the TPU torus (`aoizora.extract.network.Network`) and the switched GPU fabric
(`aoizora.extract.switched_network.SwitchedNetwork`). A subclass sets ``chips``, ``device_chip``,
``link_src`` / ``link_dst`` / ``link_id``, ``link_bandwidth`` (one-way bytes/s per link),
``link_bandwidth_Bps`` (the reference: the chip's link), ``route_links`` / ``hops``,
``hop_latency_s``, and implements ``ring_through``.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


class NetworkError(ValueError):
    """A malformed network request (bad chip ids, shapes)."""


@dataclasses.dataclass(frozen=True)
class Ring:
    """The order in which a ring collective visits a group's chips.

    kind: "ring" (closes on physical links: bidirectional), "line" (a path on physical links:
    one direction), "scattered" (no path on physical links: fewest-hop tour, routed), "pair"
    (2 chips), "single" (1 chip)."""

    order: tuple[int, ...]
    kind: str


class LinkGraph:
    """The shared queries of a network (see the module docstring). ``has_switches``: whether
    links may end at switch nodes ``>= num_chips`` (a switched GPU fabric) or join chips only."""

    has_switches = False

    @property
    def num_chips(self) -> int:
        return len(self.chips)

    @property
    def num_devices(self) -> int:
        return len(self.device_chip)

    @property
    def num_links(self) -> int:
        return len(self.link_src)

    @property
    def num_nodes(self) -> int:
        """Chips plus switches (a torus has no switches)."""
        return self.num_chips

    def node_label(self, node: int) -> str:
        """A printable name of a node: the chip's coordinates."""
        return "x".join(map(str, self.chips[node]))

    def link_time_s(self, link_bytes: np.ndarray) -> np.ndarray:
        """Seconds each link needs for its bytes at the one-way link bandwidth."""
        return np.asarray(link_bytes, dtype=np.float64) / self.link_bandwidth_Bps

    # -- queries ------------------------------------------------------------------------------
    def route(self, a: int, b: int) -> list[int]:
        """Link ids of the dimension-order route from chip a to chip b."""
        row = self.route_links[a * self.num_chips + b]
        return [int(v) for v in row[row >= 0]]

    def link(self, lid: int) -> tuple[int, int]:
        return int(self.link_src[lid]), int(self.link_dst[lid])

    def flows_to_link_bytes(self, src: np.ndarray, dst: np.ndarray,
                            nbytes: np.ndarray) -> np.ndarray:
        """Per-link bytes of a batch of flows (chip src -> chip dst, bytes each), routed."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        nbytes = np.asarray(nbytes, dtype=np.float64)
        rows = self.route_links[src * self.num_chips + dst]            # (F, maxh)
        mask = rows >= 0
        w = np.broadcast_to(nbytes[:, None], rows.shape)[mask]
        return np.bincount(rows[mask], weights=w, minlength=self.num_links)

    def is_adjacent(self, a: int, b: int) -> bool:
        return (a, b) in self.link_id

    def graph(self):
        """The network as a networkx DiGraph (nodes: chip ids with `coords`; edges: `link`)."""
        import networkx as nx
        g = nx.DiGraph()
        for i, c in enumerate(self.chips):
            g.add_node(i, coords=c)
        for lid in range(self.num_links):
            g.add_edge(int(self.link_src[lid]), int(self.link_dst[lid]), link=lid)
        return g

    def distinct_chips(self, chips: Sequence[int]) -> list[int]:
        """``chips`` in their order without repeats (devices on one chip collapse).

        Raises:
          NetworkError: a chip id out of range.
        """
        order: list[int] = []
        for c in chips:
            c = int(c)
            if not 0 <= c < self.num_chips:
                raise NetworkError(f"chip id {c} out of range 0..{self.num_chips - 1}")
            if c not in order:
                order.append(c)
        return order

    def ring_step_routes(self, ring: Ring) -> list[list[int]]:
        """Link ids of each step ``order[i] -> order[i+1]`` (and the closing step) of a ring.

        A ``ring`` or ``scattered`` step is the dimension-order route; a ``line``'s closing step
        ``order[-1] -> order[0]`` travels back along the line (the path's links reversed), so a
        line's traffic stays on its own links whatever its shape (straight or bent)."""
        o = ring.order
        k = len(o)
        if k < 2:
            return []
        steps = [self.route(o[i], o[(i + 1) % k]) for i in range(k - 1)]
        if ring.kind == "line":
            steps.append([self.link_id[(o[i], o[i - 1])] for i in range(k - 1, 0, -1)])
        else:
            steps.append(self.route(o[-1], o[0]))
        return steps

    def ring_directions(self, ring: Ring) -> int:
        """How many directions a ring collective runs through ``ring``: 2 (both ways, half the
        data each) when it closes on physical links, or when it is ``scattered`` and its routed
        forward and backward steps use no directed link twice (they cannot slow each other);
        else 1 (a line, a pair, a scattered tour whose directions would contend)."""
        if ring.kind == "ring":
            return 2
        if ring.kind != "scattered":
            return 1
        o = ring.order
        k = len(o)
        used: set[int] = set()
        for i in range(k):
            for j in ((i + 1) % k, (i - 1) % k):
                for lid in self.route(o[i], o[j]):
                    if lid in used:
                        return 1
                    used.add(lid)
        return 2
