"""Placements from mapping the logical mesh axes onto the physical axes and sub-axes in every
order: what a topology-aware planner does, and the warm start of the CP-SAT placement solver
(``solvers.placement``) and of the heuristic searches (``solvers.placement_heuristics``)."""

from __future__ import annotations

import itertools
import time
from typing import Sequence

import numpy as np

from aoizora.extract.network import Network


def factorizations(n: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of n into factors >= 2 (n itself included; () for n == 1)."""
    if n == 1:
        return [()]
    out = []
    for f in range(2, n + 1):
        if n % f == 0:
            for rest in factorizations(n // f):
                out.append((f,) + rest)
    return out


def _device_grid(network: Network) -> np.ndarray:
    """The devices by physical coordinates: shape ``network.shape``, plus an axis of n devices
    per chip (in device id order) when every chip holds n > 1.

    Args:
        network: the slice.

    Returns:
        The device index at each position.

    Raises:
        ValueError: the chips hold different numbers of devices."""
    per = np.bincount(np.asarray(network.device_chip), minlength=network.num_chips)
    n = int(per.max())
    if int(per.min()) != n:
        raise ValueError("axis orders need the same number of devices on every chip")
    devs: dict[int, list[int]] = {}
    for d, c in enumerate(network.device_chip):
        devs.setdefault(int(c), []).append(d)
    grid = np.empty(tuple(network.shape) + ((n,) if n > 1 else ()), dtype=np.int64)
    for c, co in enumerate(network.chips):
        grid[co] = devs[c] if n > 1 else devs[c][0]
    return grid


def axis_order_placements(network: Network, mesh_shape: Sequence[int],
                          deadline: float | None = None) -> list[np.ndarray]:
    """Distinct placements from mapping logical axes onto physical axes / sub-axes in every order.

    Each physical axis is split into ordered factors (every ordered factorization), the factors
    are ordered so that consecutive ones multiply to the logical axes (orders that cannot are
    pruned as they are built), and the grid is transposed accordingly. Splits with fewer factors
    come first. `deadline` (``time.perf_counter()`` value): stop enumerating there (large slices
    have millions of orders) and return what was found. With n devices on every chip (v4, v7x)
    the devices of a chip are one more physical axis of size n, after the slice's axes.

    Raises:
        ValueError: the chips hold different numbers of devices."""
    grid = _device_grid(network)
    shape = grid.shape
    mesh_shape = [int(v) for v in mesh_shape if int(v) > 1] or [1]
    out: dict[bytes, np.ndarray] = {}
    combos = sorted(itertools.product(*[factorizations(s) for s in shape]),
                    key=lambda fs: (sum(len(f) for f in fs), fs))

    def orders(sizes: list[int], used: list[bool], prefix: list[int], ax: int, prod: int):
        if deadline is not None and time.perf_counter() > deadline:
            return
        if ax == len(mesh_shape):
            if len(prefix) == len(sizes):
                yield list(prefix)
            return
        for j, f in enumerate(sizes):
            if used[j] or mesh_shape[ax] % (prod * f):
                continue
            used[j] = True
            prefix.append(j)
            np_, nax = prod * f, ax
            if np_ == mesh_shape[ax]:
                np_, nax = 1, ax + 1
            yield from orders(sizes, used, prefix, nax, np_)
            prefix.pop()
            used[j] = False

    for facs in combos:
        if deadline is not None and time.perf_counter() > deadline:
            break
        sizes = [f for fs in facs for f in fs]
        if not sizes:
            p = grid.reshape(-1)
            out.setdefault(p.tobytes(), p)
            continue
        g = grid.reshape(sizes)
        for perm in orders(sizes, [False] * len(sizes), [], 0, 1):
            p = np.transpose(g, perm).reshape(-1)
            out.setdefault(p.tobytes(), p)
    return list(out.values())

