"""The demand sets of an async part: which transfers must finish inside which span of compute.

An async part ``P`` (``formulation.traffic.phase_classes``) is a set of async collectives in
flight together; collective ``c`` starts at schedule position ``start_c`` and must be done at
``done_c``. For a span ``[s, d]`` of the schedule (``s`` a member's start, ``d`` a member's done)

    S(s, d) = {c in P : start_c >= s and done_c <= d}      (the members whose windows lie in it)
    O(s, d) = span(s, d, n)                                (``op_time.ScheduleSpans``: the
                                                            compute scheduled strictly inside,
                                                            seconds per run of the phase)

S's bytes must cross the links within O(s, d) of compute, so the stream stalls by at least
``T(S) - O(s, d)``, ``T(S)`` the most loaded link's time of S's bytes together (they share the
links). The part's exposed time is the largest such stall, the demand bound of
earliest-deadline-first scheduling on one shared resource:

    E_P = max(0, max_{s, d} T(S(s, d)) - O(s, d)).

The *full set* is the span ``[min_c start_c, max_c done_c]``: every member, and the smallest O of
any span that holds them all (``overlap_s``; the part's O_p). The others are *sub-demand sets*
(``DemandSet``), kept only when they can bind for some placement:

    UB(S) / b_min > O(s, d),   UB(S) = sum_{c in S} ub_c,
    ub_c >= the bytes of c on any one link under any placement (``traffic.link_bytes_bound``),

and not dominated (the full set, or a kept set S' with S ⊆ S' and O' <= O). Without schedule
positions the part keeps one window, ``O_P = min_c overlap_cycles_c / clock_hz``, and no
sub-demand sets. This module has no jax import (formulation layer).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from aoizora.extract.evidence import Collective


@dataclasses.dataclass(frozen=True)
class DemandSet:
    """Members (indices into the part's collectives) that must move their bytes within
    ``overlap_s`` seconds of compute (one run of the phase)."""
    members: tuple[int, ...]
    overlap_s: float


def demand_sets(members: Sequence[Collective], span: Callable[[int, int], float | None],
                fallback_s: Callable[[Collective], float], ub: Sequence[float],
                slowest_bandwidth: float) -> tuple[float, list[DemandSet]]:
    """(O of the full set, the sub-demand sets that can bind), see the module docstring.

    Args:
      members: the async part's collectives (one phase class).
      span: (start, done) -> compute seconds strictly inside, per run; None when none lies
        inside or the evidence has no schedule positions.
      fallback_s: a collective's own window when ``span`` has none for it (its
        ``overlap_cycles / clock_hz``).
      ub: ub_c per member, bytes (the pruning bound).
      slowest_bandwidth: the slowest link's one-way bandwidth, bytes/s (for the pruning bound).

    Returns:
      The full set's overlap seconds and the kept sub-demand sets, in a deterministic order.
    """
    cs = list(members)
    if not cs:
        return 0.0, []
    if not any(c.start_index or c.done_index for c in cs):
        return min(fallback_s(c) for c in cs), []
    lo = min(int(c.start_index) for c in cs)
    hi = max(int(c.done_index) for c in cs)
    full = span(lo, hi)
    if full is None:
        full = min(fallback_s(c) for c in cs)
    found: dict[tuple[int, ...], float] = {}
    starts = sorted({int(c.start_index) for c in cs})
    dones = sorted({int(c.done_index) for c in cs})
    for s in starts:
        for d in dones:
            if d <= s or (s, d) == (lo, hi):
                continue
            inside = tuple(i for i, c in enumerate(cs)
                           if int(c.start_index) >= s and int(c.done_index) <= d)
            if not inside or len(inside) == len(cs):
                continue
            o = span(s, d)
            if o is None:
                o = fallback_s(cs[inside[0]]) if len(inside) == 1 else 0.0
            if sum(ub[i] for i in inside) / slowest_bandwidth <= o:
                continue                       # cannot bind under any placement
            if inside not in found or o < found[inside]:
                found[inside] = o
    kept = []
    for mem, o in sorted(found.items(), key=lambda kv: (kv[1], kv[0])):
        if o >= full or any(set(mem) <= set(k.members) and k.overlap_s <= o for k in kept):
            continue                           # dominated by the full set or a kept one
        kept.append(DemandSet(mem, o))
    return full, kept
