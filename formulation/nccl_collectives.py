"""NCCL-style collectives over a network's links: ring, tree and all-to-all, as bus bandwidth.

What nccl-tests reports (``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests): for a collective of
``S`` bytes per rank over ``n`` ranks taking ``t`` seconds, ``algbw = S / t`` and
``busbw = algbw x f``, ``f = 2 (n - 1) / n`` for all-reduce and ``(n - 1) / n`` for all-gather,
reduce-scatter and all-to-all. The model prices one run as its most loaded link's bytes over that
link's own one-way bandwidth (the link-load model Q2 uses):

- ``ring``: the flows of ``formulation.traffic`` (``Network.ring_through``: on a switched fabric
  NCCL's ring order, one direction, each step routed through the switches) -- what Q2 prices
  for every all-gather, reduce-scatter and all-reduce;
- ``tree`` (all-reduce only, NCCL's default across nodes): inside each host
  (``SwitchedNetwork.chip_host``; a TPU slice counts as one) a chain in ring order, and between the nodes' first GPUs a double binary
  tree (two trees, half the data each, each node a leaf in one and inner in the other; on two
  nodes: each node the root of one tree). Each chain or tree edge carries the data up (reduce)
  and down (broadcast): ``S`` (chain) or ``S / 2`` per tree each way;
- ``a2a``: every ordered pair a flow of ``S / n``, routed (``traffic.unit_loads``).

- ``nvls`` (all-reduce, all-gather, reduce-scatter; one NVSwitch host of compute capability
  >= 9.0): NVLink SHARP, the switch reduces. Not a link load: NCCL's own tuner formula
  (``formulation.nvls``, NCCL v2.30.7), on the GPUs' NVLink bandwidth into the switch.

``nccl_algorithm`` picks what NCCL's tuner would run for a large message: its rule is the lowest
predicted ``latency + bytes / bandwidth`` over the enabled algorithms (``src/enqueue.cc``); with
latency left out (large messages) and one bus factor per kind, that is the highest busbw among
``ring``, ``tree`` (all-reduce across hosts) and ``nvls`` (where ``nvls_support`` allows it). On
one host the tree is no candidate: NCCL's tuner prices a tree all-reduce at ``0.92`` of its
graph's bandwidth (``src/graph/tuning.cc``, ``busBw * .92``) with the ring's channel count
(``src/init.cc`` gives trees and rings the same ``nChannels``), so where its two graphs find one
speed large single-host all-reduces run the ring (approximate where they differ); this module's
in-host tree is a link-load chain, not NCCL's tree graph, and is not used to decide. On h100-8 the pick is NVLS for all-reduce (476 vs 370.8 GB/s) and the ring for
all-gather / reduce-scatter (NVLS 182 GB/s in NCCL's own model).
This module has no jax import (formulation layer).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from aoizora.extract.network import Network
from aoizora.formulation.nvls import NVLS_KINDS, NvlsUnsupported, nvls_busbw
from aoizora.formulation.traffic import class_coefficient, flow_class, unit_loads

BUS_FACTOR = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
              "reduce-scatter": lambda n: (n - 1) / n, "all-to-all": lambda n: (n - 1) / n}


def ring_link_bytes(network: Network, chips: Sequence[int], kind: str,
                    nbytes: int) -> np.ndarray:
    """Per-link bytes of one ring collective (or an all-to-all) of `nbytes` per rank on `chips`,
    as Q2 prices it (``traffic.unit_loads`` x ``class_coefficient``). For all-gather `nbytes` is
    the gathered (output) size, for reduce-scatter the input, as in the evidence."""
    k = len(chips)
    cls = flow_class(kind, k)
    u, _ = unit_loads(cls, list(chips), network)
    return u * float(class_coefficient(kind, nbytes, k))


def tree_link_bytes(network: Network, chips: Sequence[int], nbytes: int) -> np.ndarray:
    """Per-link bytes of NCCL's tree all-reduce of `nbytes` on `chips` (module docstring)."""
    order = list(network.ring_through(chips).order)
    host = getattr(network, "chip_host", None)
    nodes: dict[int, list[int]] = {}
    for c in order:
        nodes.setdefault(int(host[c]) if host is not None else 0, []).append(c)
    heads = [members[0] for members in nodes.values()]
    src, dst, size = [], [], []
    for members in nodes.values():                       # chain: S up and S down per edge
        for a, b in zip(members, members[1:]):
            src += [a, b]; dst += [b, a]; size += [nbytes, nbytes]
    if len(heads) > 1:
        for tree in _double_binary_tree(len(heads)):
            for parent, child in tree:
                a, b = heads[parent], heads[child]
                src += [a, b]; dst += [b, a]; size += [nbytes / 2, nbytes / 2]
    if not src:
        return np.zeros(network.num_links)
    return network.flows_to_link_bytes(np.array(src), np.array(dst), np.array(size, float))


def _double_binary_tree(n: int) -> list[list[tuple[int, int]]]:
    """Two spanning trees over nodes 0..n-1 as (parent, child) edges: a binary tree in heap
    order and its mirror (node i -> n-1-i), NCCL's two trees (each node a leaf in one of them
    when n is even). n = 2: 0 -> 1 and 1 -> 0."""
    first = [((i - 1) // 2, i) for i in range(1, n)]
    second = [(n - 1 - p, n - 1 - c) for p, c in first]
    return [first, second]


ALGORITHMS = ("ring", "tree", "nvls", "auto")


def candidate_busbw(network: Network, chips: Sequence[int], kind: str,
                    nbytes: int = 1 << 30) -> dict[str, float]:
    """busbw (bytes/s) of every algorithm NCCL's tuner weighs for `kind` on `chips` (module
    docstring): ``ring`` always (all-to-all: its own pattern, under that name), ``tree`` for an
    all-reduce across hosts, ``nvls`` where ``formulation.nvls.nvls_support`` allows it."""
    out = {"ring": predicted_busbw(network, chips, kind, "ring", nbytes)}
    host = getattr(network, "chip_host", None)
    if kind == "all-reduce" and host is not None and len({int(host[c]) for c in chips}) > 1:
        out["tree"] = predicted_busbw(network, chips, kind, "tree", nbytes)
    if kind in NVLS_KINDS:
        try:
            out["nvls"] = nvls_busbw(network, chips, kind)
        except NvlsUnsupported:
            pass
    return out


def nccl_algorithm(network: Network, chips: Sequence[int], kind: str,
                   nbytes: int = 1 << 30) -> str:
    """The algorithm NCCL's tuner would pick for a large message: the highest busbw of
    ``candidate_busbw`` (the lowest predicted time; ties keep ring, then tree)."""
    c = candidate_busbw(network, chips, kind, nbytes)
    return max(c, key=lambda a: (c[a], -list(c).index(a)))


def predicted_busbw(network: Network, chips: Sequence[int], kind: str,
                    algorithm: str = "ring", nbytes: int = 1 << 30) -> float:
    """nccl-tests' bus bandwidth (bytes/s) the model predicts for one collective of `nbytes`
    per rank on `chips` (large messages: latency left out).

    Args:
        network: the links (a TPU torus or a GPU fabric).
        chips: the chips of the group (>= 2).
        kind: "all-reduce", "all-gather", "reduce-scatter" or "all-to-all".
        algorithm: "ring" or "tree" (tree: all-reduce only; link loads), "nvls" (NCCL's NVLS
            formula, ``formulation.nvls``), or "auto" (``nccl_algorithm``'s pick); all-to-all
            is its own pattern under "ring".
    Returns:
        busbw in bytes/s.
    Raises:
        ValueError: an unknown kind or algorithm, or fewer than 2 chips.
        NvlsUnsupported: "nvls" on a group NCCL would not run NVLS on."""
    n = len(chips)
    if n < 2 or kind not in BUS_FACTOR or algorithm not in ALGORITHMS:
        raise ValueError(f"predicted_busbw({kind!r}, {algorithm!r}) on {n} chips: give >= 2 "
                         f"chips, a kind in {sorted(BUS_FACTOR)} and algorithm in {ALGORITHMS}")
    if algorithm == "auto":
        return max(candidate_busbw(network, chips, kind, nbytes).values())
    if algorithm == "nvls":
        return nvls_busbw(network, chips, kind)
    if algorithm == "tree":
        if kind != "all-reduce":
            raise ValueError("NCCL's tree runs all-reduce only")
        f = tree_link_bytes(network, chips, nbytes)
    else:
        f = ring_link_bytes(network, chips, kind, nbytes)
    t = float(network.link_time_s(f).max())
    return nbytes / t * BUS_FACTOR[kind](n)
