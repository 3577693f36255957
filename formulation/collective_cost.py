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

Default coefficients (``default_axis_costs``), placement-oblivious, from the target's chip numbers
(``shared/facts/tpu.md``): the logical axes are laid onto the physical axes the way
``jax.make_mesh`` does by default (the last logical axis first, onto the first physical axes; an
axis takes whole physical axes or a part of one). Then

- ``beta = 1 / (link bandwidth x links the axis can use)``: 2 links for a ring (the axis is one whole
  physical axis with wraparound: both directions); 1 for a line without wraparound (the scaling
  book's penalty: (n-1)/n V / W instead of V / 2W); k for an axis spread over k whole physical axes;
- ``alpha = hops x hop latency``: n/2 hops on a ring, n-1 on a line.

``AxisCosts`` is plain data so that the planner's loop can replace it with the effective bandwidth
it measured for a placement: ``beta_s_per_byte[a]`` for every collective on axis ``a``, and
``beta_by_kind[a][kind]`` where a kind was measured on its own (it then replaces beta for that
kind on that axis; ``kind`` one of "all-gather", "reduce-scatter", "all-reduce", "all-to-all").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from aoizora.extract.network import Network
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


def axis_physical_spans(phys_shape: tuple[int, ...], mesh_axes: dict[str, int]
                        ) -> dict[str, list[tuple[int, bool]]]:
    """Which physical axes each logical axis occupies under the default order: for each logical axis,
    a list of (physical axis index, whole axis?) it spans. Logical axes are taken last to first."""
    remaining = list(phys_shape)
    spans: dict[str, list[tuple[int, bool]]] = {}
    p = 0
    for name in reversed(list(mesh_axes)):
        need = int(mesh_axes[name])
        spans[name] = []
        while need > 1 and p < len(remaining):
            cap = remaining[p]
            if cap <= 1:
                p += 1
                continue
            if need >= cap and need % cap == 0:
                spans[name].append((p, remaining[p] == phys_shape[p]))
                need //= cap
                remaining[p] = 1
                p += 1
            elif cap % need == 0:
                spans[name].append((p, False))
                remaining[p] = cap // need
                need = 1
            else:  # does not tile: take the rest of this axis and continue
                spans[name].append((p, False))
                need = max(1, math.ceil(need / cap))
                remaining[p] = 1
                p += 1
    return spans


def default_axis_costs(target, mesh_axes: dict[str, int]) -> AxisCosts:
    """Alpha-beta coefficients per logical axis from a Target (see the module docstring; a
    switched GPU fabric: ``fabric_axis_costs``)."""
    if getattr(target, "fabric", None) is not None:
        return fabric_axis_costs(target, mesh_axes)
    chip = target.chip
    W = float(chip.link_bandwidth_Bps)
    spans = axis_physical_spans(tuple(target.shape), mesh_axes)
    alpha, beta = {}, {}
    for name, n in mesh_axes.items():
        sp = spans.get(name, [])
        ring = len(sp) == 1 and sp[0][1] and bool(target.wrap[sp[0][0]])
        if ring:
            links, hops = 2, n / 2.0
        else:
            links, hops = max(1, sum(1 for _, whole in sp if whole) or 1), max(n - 1, 0)
        beta[name] = 1.0 / (W * links)
        alpha[name] = hops * float(chip.hop_latency_s)
    # a permute to the ring neighbour sends over one link in one direction, whatever the axis
    # spans (``ChipSpec.link_bandwidth_Bps`` is per link and direction)
    permute = {name: {"collective-permute": 1.0 / W} for name in mesh_axes}
    return AxisCosts(sizes={k: int(v) for k, v in mesh_axes.items()}, alpha_s=alpha,
                     beta_s_per_byte=beta, beta_by_kind=permute,
                     note=f"default for {target.name}: logical axes on physical axes in make_mesh "
                          f"order; ring = 2 links, line = 1 link per physical axis spanned")


def fabric_axis_costs(target, mesh_axes: dict[str, int]) -> AxisCosts:
    """Alpha-beta per logical axis of a switched GPU fabric, from its links: rank r on GPU r
    (the default order), every group of an axis running its ring all-gather at once (their link
    loads add up: e.g. pairs across the sockets of l40-8 share the UPI link). ``beta`` = the
    slowest link's seconds per byte of ``(n-1)/n V``; ``alpha`` = (n-1) ring steps x the longest
    step's hops x the hop latency.

    Args:
        target: a Target with a ``fabric``.
        mesh_axes: logical axis -> size, in order (product = the target's GPUs).
    Returns:
        The AxisCosts."""
    net = Network.from_target(target)
    sizes = [int(v) for v in mesh_axes.values()]
    ids = np.arange(int(np.prod(sizes)) if sizes else 1).reshape(sizes or [1])
    V = 1 << 20
    alpha, beta = {}, {}
    for i, (name, n) in enumerate(mesh_axes.items()):
        n = int(n)
        if n < 2:
            alpha[name], beta[name] = 0.0, 0.0
            continue
        groups = np.moveaxis(ids, i, -1).reshape(-1, n)
        loads = sum(ring_link_bytes(net, [int(c) for c in g], "all-gather", V) for g in groups)
        t = float(net.link_time_s(loads).max())
        beta[name] = t / ((n - 1) / n * V)
        hops = max(int(net.hops[a, b]) for g in groups for a in g for b in g if a != b)
        alpha[name] = (n - 1) * hops * float(net.hop_latency_s)
    return AxisCosts(sizes={k: int(v) for k, v in mesh_axes.items()}, alpha_s=alpha,
                     beta_s_per_byte=beta,
                     note=f"default for {target.name}: rings of every group of an axis at once "
                          f"over the fabric's links, rank r on GPU r")


def uniform_axis_costs(mesh_axes: dict[str, int], bandwidth_Bps: float, latency_s: float = 1e-6,
                       links: int = 1) -> AxisCosts:
    """The same line coefficients on every axis (tests and Alpa-style fixed costs)."""
    return AxisCosts(sizes={k: int(v) for k, v in mesh_axes.items()},
                     alpha_s={k: (v - 1) * latency_s for k, v in mesh_axes.items()},
                     beta_s_per_byte={k: 1.0 / (bandwidth_Bps * links) for k in mesh_axes})
