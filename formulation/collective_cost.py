"""Alpha-beta cost of collectives per logical mesh axis (Alpa's model; shared/facts/autosharding.md).

For one logical axis ``a`` of size ``n`` with coefficients ``alpha[a]`` (seconds) and ``beta[a]``
(seconds per byte), and ``V`` = bytes of the array across the group (the gathered / unreduced
size of what one group of ``n`` devices holds together):

- all-gather:     alpha + beta (n-1)/n V
- reduce-scatter: alpha + beta (n-1)/n V
- all-reduce:     alpha + 2 beta (n-1)/n V
- all-to-all:     alpha + beta (n-1)/n^2 V   (times ``all_to_all_penalty``, 1 by default)

A collective over several axes is priced as one collective per axis, one after the other (the sum);
each step's ``V`` is what that step moves.

Default coefficients (``default_axis_costs``, placement-oblivious): each logical axis's
all-gather routed on the target's network exactly as Q2 routes it (``formulation.traffic``,
``nccl_collectives.ring_link_bytes``), every group of the axis at once, under the default device
order (``jax.make_mesh``'s on a TPU slice, rank r on GPU r on a GPU box): beta = the most loaded
link's seconds per byte of (n-1)/n V, alpha = (n-1) x the longest route in hops x the hop
latency. So Q1 and Q2 agree on a collective's bandwidth at the default order; the solved
placement can only do better (the loop's feedback then measures it).

``AxisCosts`` is plain data so that the planner's loop can replace it with the effective bandwidth
it measured for a placement: ``beta_s_per_byte[a]`` for every collective on axis ``a``, and
``beta_by_kind[a][kind]`` where a kind was measured on its own (it then replaces beta for that
kind on that axis; ``kind`` one of "all-gather", "reduce-scatter", "all-reduce", "all-to-all").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from aoizora.extract.network import Network, default_device_order
from aoizora.formulation.nccl_collectives import ring_link_bytes


# The bytes term of each kind, per byte of V, on a group of n: the factors of the module docstring.
BYTES_FACTOR = {
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: (n - 1) / n,
    "all-reduce": lambda n: 2 * (n - 1) / n,
    "all-to-all": lambda n: (n - 1) / (n * n),
    # a ring of n - 1 permutes to the next device (ring attention's keys / values): each device
    # receives what an all-gather would bring, one shard per step
    "collective-permute": lambda n: (n - 1) / n,
}


@dataclasses.dataclass
class AxisCosts:
    sizes: dict[str, int]                 # logical axis -> devices along it
    alpha_s: dict[str, float]             # logical axis -> latency term, seconds
    beta_s_per_byte: dict[str, float]     # logical axis -> seconds per byte
    all_to_all_penalty: float = 1.0
    note: str = ""
    beta_by_kind: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    # --- single-axis collectives; V in bytes across the group, result in seconds
    def _ab(self, axis: str, kind: str) -> tuple[int, float, float]:
        if axis not in self.sizes:
            raise KeyError(f"unknown mesh axis {axis!r}; axes: {list(self.sizes)}")
        b = self.beta_by_kind.get(axis, {}).get(kind, self.beta_s_per_byte[axis])
        return self.sizes[axis], self.alpha_s[axis], b

    def cost(self, kind: str, axis: str, V: float) -> float:
        """alpha + beta x ``BYTES_FACTOR[kind](n)`` x V on ``axis`` (all-to-all: times its penalty)."""
        n, a, b = self._ab(axis, kind)
        if n <= 1 or V <= 0:
            return 0.0
        pen = self.all_to_all_penalty if kind == "all-to-all" else 1.0
        return a + pen * b * BYTES_FACTOR[kind](n) * V

    def all_gather(self, axis: str, V: float) -> float:
        return self.cost("all-gather", axis, V)

    def reduce_scatter(self, axis: str, V: float) -> float:
        return self.cost("reduce-scatter", axis, V)

    def all_reduce(self, axis: str, V: float) -> float:
        return self.cost("all-reduce", axis, V)

    def ring_permute(self, axis: str, V: float) -> float:
        """n - 1 permutes to the ring neighbour on ``axis`` moving ``V`` bytes in all: beta is
        the kind's own (``default_axis_costs``: one link, one direction), else the axis's."""
        return self.cost("collective-permute", axis, V)

    def all_to_all(self, axis: str, V: float) -> float:
        return self.cost("all-to-all", axis, V)

    def scaled(self, factor: dict[str, float]) -> "AxisCosts":
        """A copy with beta multiplied per axis (e.g. effective bandwidth measured by the planner)."""
        return dataclasses.replace(
            self, beta_s_per_byte={k: v * factor.get(k, 1.0) for k, v in self.beta_s_per_byte.items()},
            beta_by_kind={a: {k: v * factor.get(a, 1.0) for k, v in kinds.items()}
                          for a, kinds in self.beta_by_kind.items()})

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AxisCosts":
        return cls(**d)


def default_axis_costs(target, mesh_axes: dict[str, int]) -> AxisCosts:
    """Alpha-beta per logical axis of ``target``, routed on its network as Q2 routes collectives
    (``formulation.traffic``), under the default device order (``default_device_order``:
    ``jax.make_mesh``'s on a TPU slice, rank r on GPU r on a GPU box):

        beta[a]  = max_l load_l / bandwidth_l / ((n-1)/n V)
        load_l   = the bytes on directed link l when every group of axis a runs its all-gather of
                   V bytes at once (``nccl_collectives.ring_link_bytes``: the ring or line Q2
                   builds through the group's chips; groups that share a link add up)
        beta_by_kind[a]["all-to-all"] = max_l a2a_l / bandwidth_l / ((n-1)/n^2 V)
        a2a_l    = the same for every group's all-to-all of V / n bytes a rank (each ordered pair
                   a flow of V / n^2 on its routes, as Q2 routes the compiled all-to-all)
        alpha[a] = (n-1) x the group's longest route in hops x the hop latency

    So an axis whose groups close a ring on the torus gets two links, one laid along a line or
    whose pairs sit far apart under that order gets what Q2 would charge it there. An
    all-to-all is routed on its own: its pairs at distance 2 and more load the links a ring's
    neighbour sends do not (on a ring of 4, 4/3 of the all-gather's beta; of 8, 16/7). On a TPU
    slice, ``collective-permute`` (ring attention's neighbour sends) keeps one link in one
    direction (``ChipSpec.link_bandwidth_Bps`` is per link and direction).

    Args:
        target: a Target (TPU slice or GPU box).
        mesh_axes: logical axis -> size, in order (product = the target's devices).
    Returns:
        The AxisCosts."""
    net = Network.from_target(target)
    sizes = [int(v) for v in mesh_axes.values()]
    order = np.asarray(default_device_order(target, mesh_axes), dtype=np.int64)
    chips = net.device_chip[order].reshape(sizes or [1])
    V = 1 << 20
    alpha, beta = {}, {}
    by_kind: dict[str, dict[str, float]] = {}
    for i, (name, n) in enumerate(mesh_axes.items()):
        n = int(n)
        if n < 2:
            alpha[name], beta[name] = 0.0, 0.0
            continue
        groups = np.moveaxis(chips, i, -1).reshape(-1, n)
        loads = sum(ring_link_bytes(net, [int(c) for c in g], "all-gather", V) for g in groups)
        beta[name] = float(net.link_time_s(loads).max()) / ((n - 1) / n * V)
        a2a = sum(ring_link_bytes(net, [int(c) for c in g], "all-to-all", V // n) for g in groups)
        by_kind[name] = {"all-to-all": float(net.link_time_s(a2a).max()) / ((n - 1) / n ** 2 * V)}
        # an axis over the two devices of one chip (v4, v7x) crosses no link: 0 hops
        hops = max((int(net.hops[a, b]) for g in groups for a in g for b in g if a != b),
                   default=0)
        alpha[name] = (n - 1) * hops * float(net.hop_latency_s)
    if getattr(target, "fabric", None) is None:
        for name in mesh_axes:
            by_kind.setdefault(name, {})["collective-permute"] = \
                1.0 / float(target.chip.link_bandwidth_Bps)
    return AxisCosts(sizes={k: int(v) for k, v in mesh_axes.items()}, alpha_s=alpha,
                     beta_s_per_byte=beta, beta_by_kind=by_kind,
                     note=f"default for {target.name}: every group of an axis routed at once "
                          f"on the network, default device order")


def uniform_axis_costs(mesh_axes: dict[str, int], bandwidth_Bps: float, latency_s: float = 1e-6,
                       links: int = 1) -> AxisCosts:
    """The same line coefficients on every axis (tests and Alpa-style fixed costs)."""
    return AxisCosts(sizes={k: int(v) for k, v in mesh_axes.items()},
                     alpha_s={k: (v - 1) * latency_s for k, v in mesh_axes.items()},
                     beta_s_per_byte={k: 1.0 / (bandwidth_Bps * links) for k in mesh_axes})
