"""NVLink SHARP (NVLS) collectives on one NVSwitch box, priced the way NCCL's own tuner prices them.

With NVLS the NVSwitch does the reduction: each GPU sends its data into the switch once and reads
the reduced result back once (multicast), so no byte crosses a GPU's links twice as in a ring.
NCCL (NVIDIA/nccl) prices it from its NVLS "graph" and three tuning numbers. Source: NCCL
v2.30.7 (master of 2026; the ``nvlsEfficiency`` factor appeared in v2.28.3), read, not copied;
the numbers below are NCCL's, the code is this module's.

1. The graph (``src/graph/search.cc``, ``ncclTopoCompute`` with ``NCCL_TOPO_PATTERN_NVLS``): on
   one node with ``k`` GPUs it has ``channels = min(k, NCCL_MAX_NVLS_ARITY = 32)`` channels, GPU
   ``c`` the head of channel ``c``. A channel of per-channel speed ``s`` takes ``s`` of every
   GPU's NVLink bandwidth to the switch each way, ``2 s`` of its head's
   (``ncclTopoSearchTryNvls``), so with ``k`` channels each GPU needs ``(k + 1) s <= B`` (``B``:
   the GPU's NVLink bandwidth into the switch, GB/s, ``hardware.gpu``: H100 18 x 20.6 = 370.8).
   ``s`` is the first entry of ``SM90_SPEED_INTRA`` (``sm90SpeedArrayIntra``) that is at most
   ``B`` with ``s k <= B k / (k - 1)`` (the search's start, ``totalBw *= ndevs / (ndevs - 1)``
   for non-ring patterns) and, from there down, the first with ``(k + 1) s <= B``: ``bw_intra``.
   Pass 2 then raises ``bw_inter`` up the same array while ``bw_inter < 2 bw_intra`` (the NVLS
   branch of "See if we can increase bw"; no inter-node path to limit it on one node).
2. The bandwidth (``src/graph/tuning.cc``, ``ncclTopoTuneModel``), GB/s of nccl-tests bus
   bandwidth, per channel::

       intra = bw_intra x NVLS_EFFICIENCY x (channels - 1) / channels
               x 2                  all-reduce ("AllReduce pipelines two operations")
               x (k - 1) / k        all-gather, reduce-scatter
       per_channel = min(intra, bw_inter);   bus = channels x per_channel

   For all-reduce NCCL's algorithm bandwidth is ``bus x k / (2 (k - 1))``, i.e. ``bus`` is
   nccl-tests' busbw. For all-gather / reduce-scatter NCCL does not convert: ``bus`` is the
   bandwidth of the whole gathered buffer, so nccl-tests' busbw is ``bus x (k - 1) / k``.
3. The choice (``src/enqueue.cc``, ``topoGetAlgoInfo``): every enabled (algorithm, protocol) is
   timed ``latency + bytes / bandwidth`` and the fastest runs. ``nccl_collectives.nccl_algorithm``
   applies that rule to large messages (latency left out): the highest predicted busbw wins.

On h100-8: ``B`` = 370.8, ``s`` = 40 (50 would need 9 x 50 = 450 > 370.8), ``bw_inter`` = 60,
all-reduce ``8 x min(40 x 0.85 x 7/8 x 2, 60)`` = 476 GB/s (a ring: 370.8); all-gather ``8 x
min(40 x 0.85 x 7/8 x 7/8, 60) x 7/8`` = 182 GB/s, below the ring, so NCCL's tuner (and this
model) keeps the ring for all-gather and reduce-scatter on 8 H100s. Cross-check, the same graph
with NCCL v2.27.7's older formula (``bus = channels x min(bw_intra, bw_inter)``, algorithm
bandwidth ``5/6`` of it): 320 x 5/6 x 14/8 = 466.7 GB/s.

Where NVLS exists (``nvls_support``): GPUs of compute capability >= 9.0 on one NVSwitch
(``hardware.gpu.NVLS_MIN_COMPUTE_CAPABILITY``), 2 to 32 of them, on one host. Across hosts NCCL
runs NVLS only with CollNet (a SHARP network) and otherwise NVLSTree (NVLS inside each node, a
tree between nodes), which is not modelled here. Only Hopper's constants are kept (no Blackwell
target). This module has no jax import (formulation layer).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from aoizora.extract.hardware import gpu as G

# NCCL src/graph/search.cc (v2.30.7, unchanged since v2.21): sm90SpeedArrayIntra, GB/s per channel
SM90_SPEED_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
# NCCL src/graph/tuning.cc (v2.28.3 to v2.30.7): nvlsEfficiency, by compute capability major
NVLS_EFFICIENCY = {9: 0.85}
# NCCL src/include/device.h: NCCL_MAX_NVLS_ARITY
MAX_NVLS_ARITY = 32
NVLS_KINDS = ("all-reduce", "all-gather", "reduce-scatter")


class NvlsUnsupported(ValueError):
    """NCCL would not run NVLS on this group (the message says why)."""


@dataclasses.dataclass(frozen=True)
class NvlsGraph:
    """NCCL's NVLS graph of one node: channels and per-channel speeds (GB/s)."""

    channels: int
    bw_intra: float
    bw_inter: float


def nvls_graph(k: int, nvlink_GBps: float,
               speeds: Sequence[float] = SM90_SPEED_INTRA) -> NvlsGraph | None:
    """NCCL's NVLS graph for `k` GPUs each joined to the NVSwitch by `nvlink_GBps` each way
    (module docstring, step 1); None when no speed fits (NCCL then disables NVLS)."""
    channels = min(k, MAX_NVLS_ARITY)                # k <= 32 here: every GPU heads one channel
    B = round(nvlink_GBps, 3)                       # NCCL rounds link bandwidth to 1e-3 GB/s
    total = B * k / (k - 1)
    i = 0
    while i < len(speeds) - 1 and (speeds[i] > B or speeds[i] * channels > total):
        i += 1
    fits = lambda s: (channels + 1) * s <= B + 1e-9
    while i < len(speeds) - 1 and not fits(speeds[i]):
        i += 1
    if not fits(speeds[i]):
        return None
    intra = inter = speeds[i]
    while i > 0 and inter < 2 * intra:
        i -= 1
        inter = speeds[i]
    return NvlsGraph(channels, intra, inter)


def nvls_support(network, chips: Sequence[int]) -> float:
    """The NVLink bandwidth (bytes/s, each way) that joins every GPU of `chips` to their common
    NVSwitch, when NCCL would build an NVLS graph for the group (module docstring).

    Raises:
        NvlsUnsupported: not a switched GPU fabric, a GPU generation below compute capability
            9.0 (or without NCCL constants here), not 2..32 GPUs, several hosts, or GPUs not all
            on one NVSwitch."""
    chips = [int(c) for c in dict.fromkeys(chips)]
    gen = getattr(network, "generation", "")
    if not getattr(network, "has_switches", False) or gen not in G.GPUS:
        raise NvlsUnsupported(f"{getattr(network, 'name', '')}: not a GPU box")
    cc = G.compute_capability(gen)
    if cc < G.NVLS_MIN_COMPUTE_CAPABILITY or cc[0] not in NVLS_EFFICIENCY:
        raise NvlsUnsupported(f"{network.name}: {gen} (compute capability {cc[0]}.{cc[1]}) has "
                              f"no NVLink SHARP modelled (needs 9.x, an NVLink4 NVSwitch)")
    if not 2 <= len(chips) <= MAX_NVLS_ARITY:
        raise NvlsUnsupported(f"NVLS runs on 2..{MAX_NVLS_ARITY} GPUs, not {len(chips)}")
    if len({int(network.chip_host[c]) for c in chips}) > 1:
        raise NvlsUnsupported("GPUs on several hosts: NCCL runs NVLSTree there (not modelled)")
    C = network.num_chips
    uplinks = []
    for c in chips:
        up = [(int(network.link_dst[l]), float(network.link_bandwidth[l]))
              for l in range(network.num_links) if int(network.link_src[l]) == c
              and network.link_kind[l] == "nvlink" and int(network.link_dst[l]) >= C]
        if len(up) != 1:
            raise NvlsUnsupported(f"{network.node_label(c)} is not on exactly one NVSwitch")
        uplinks.append(up[0])
    if len({sw for sw, _ in uplinks}) != 1:
        raise NvlsUnsupported("the GPUs are not on one NVSwitch")
    return min(bw for _, bw in uplinks)


def nvls_busbw(network, chips: Sequence[int], kind: str) -> float:
    """nccl-tests' bus bandwidth (bytes/s) of NCCL's NVLS `kind` on `chips`, large messages
    (module docstring, step 2).

    Raises:
        NvlsUnsupported: see ``nvls_support``; or no NVLS graph fits the links.
        ValueError: a kind NCCL has no NVLS algorithm for (all-to-all)."""
    if kind not in NVLS_KINDS:
        raise ValueError(f"NCCL has no NVLS {kind}; it has {', '.join(NVLS_KINDS)}")
    B = nvls_support(network, chips) / 1e9
    k = len(dict.fromkeys(int(c) for c in chips))
    g = nvls_graph(k, B)
    if g is None:
        raise NvlsUnsupported(f"no NVLS channel speed fits {B:.1f} GB/s per GPU")
    eff = NVLS_EFFICIENCY[G.compute_capability(network.generation)[0]]
    intra = g.bw_intra * eff * (g.channels - 1) / g.channels
    intra *= 2.0 if kind == "all-reduce" else (k - 1) / k
    bus = g.channels * min(intra, g.bw_inter)
    if kind != "all-reduce":
        bus *= (k - 1) / k                           # NCCL's figure is the gathered buffer's
    return bus * 1e9
