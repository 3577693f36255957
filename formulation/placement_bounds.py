"""Lower bounds on the placement objective that hold for every placement (no solver needed).

The level-1 objective of the placement problem (``formulation.traffic``, ``placement_cpsat``) is

    comm(P) = sum_p count_p * max(0, T_p(P) - O_p),     T_p(P) = max_l load_p(P)[l] / W

over the phases p (collectives in flight together), with W the one-way link bandwidth and O_p
the compute phase p hides behind. It is separable over phases, and x -> max(0, x / W - O_p) is
nondecreasing, so for any per-phase numbers ``lb[p] <= min_P max_l load_p(P)[l]``:

    min_P comm(P) >= sum_p count_p * min_P max(0, T_p(P) - O_p)
                  >= sum_p count_p * max(0, lb[p] / W - O_p)            (``comm_lower_bound``)

``phase_link_lower_bounds`` gives lb[p] (bytes) as the largest of these valid bounds, each true
for every placement of the traffic model (one device per chip, k = |g| distinct chips; several
devices per chip below):

  cut:  a ring collective c (all-gather / reduce-scatter / all-reduce, k >= 3) on group g puts
        at least one unit (``class_coefficient`` coef_c) on some link whatever chip set S it
        sits on (closed ring: 1 unit on every cycle link; line: 2; scattered tour: every step's
        route carries >= 1 unit); several ring collectives on the same g in one phase load the
        same links in proportion, so  lb >= sum_{c ring on g} coef_c.  A pair (k = 2) routes
        coef_c each way over >= 1 link:  lb >= sum_{c pair on g} coef_c.  A collective-permute
        pair (s, t), s != t, routes V = c.bytes over >= 1 link:  lb >= V.  An all-to-all on n
        ranks sends n - 1 flows of coef_c = V / n from each chip over its <= deg_max out-links:
        lb >= ceil((n - 1) / deg_max) coef_c  (flows are indivisible: one link carries >= that
        many).
  injection: a chip sends at least egress[r] bytes over its out-links (deg_max at most), where
        for the rank r it holds  egress[r] = sum_c e_c(r),  e_c = 2 coef_c for a ring collective
        (a closed ring sends 1 unit to each neighbour; a line's end sends 2 units one way, its
        middle 2 each way; a scattered tour sends >= 2 units), coef_c for a pair, (n - 1) coef_c
        for an all-to-all, V per permute pair with source r;  lb >= max_r egress[r] / deg_max.

Several devices per chip (v4, v7x): two devices of one chip talk without a link, so pairs,
all-to-alls and permutes may load no link. A ring collective c on a group g of k ranks sits on
s chips, s in ``ring_set_sizes(k)``; when every such s >= 2 it is a collective of s chips (a pair
or a ring, ``class_coefficient(kind, V, s)`` per unit, >= 1 unit on some link as above), and the
ring collectives on g in one phase share that s:  lb >= min_s sum_{c ring on g} coef_c(s).
No injection bound there (a rank's data may stay on its chip).

The decomposition bound (``solvers.placement_decomposition``) replaces lb[p] by CP-SAT's proven
bound of phase p solved alone when that is larger; this module is the part that costs nothing.
No jax import (formulation layer).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.traffic import (PermuteFlows, PhaseKey, TrafficModel,
                                         class_coefficient, collective_flows, ring_set_sizes)


@dataclasses.dataclass
class PhaseBound:
    key: PhaseKey
    link_bytes: Fraction          # lb[p]: every placement loads some link with >= this (one run)
    how: str                      # "cut" or "injection" (which bound gave lb[p])
    overlap_s: float              # O_p

    def exposed_s(self, bandwidth: float) -> float:
        """max(0, lb[p] / W - O_p): a lower bound of phase p's exposed seconds per run."""
        return max(0.0, float(self.link_bytes) / bandwidth - self.overlap_s)


def max_out_degree(network: Network) -> int:
    """The most links leaving one chip (switch nodes of a GPU fabric excluded)."""
    out = np.bincount(np.asarray(network.link_src), minlength=network.num_chips)
    return int(out[:network.num_chips].max())


def phase_link_lower_bounds(evidence: Evidence, network: Network,
                            traffic: TrafficModel | None = None) -> list[PhaseBound]:
    """lb[p] per phase of ``TrafficModel(evidence, network).phases`` (same order)."""
    tm = traffic or TrafficModel(evidence, network)
    deg = max_out_degree(network)
    if network.num_devices != network.num_chips:
        return _shared_chip_bounds(tm, network)
    out = []
    for key, cs, O in zip(tm.phases, tm.phase_collectives, tm.overlap_s):
        per_group: dict[tuple[frozenset, str], Fraction] = {}
        egress: dict[int, Fraction] = {}
        cut = Fraction(0)
        for f in collective_flows(cs):
            if isinstance(f, PermuteFlows):
                if f.pairs:
                    cut = max(cut, f.nbytes)
                for s, _ in f.pairs:
                    egress[s] = egress.get(s, Fraction(0)) + f.nbytes
                continue
            g, cls, coef = f.group, f.cls, f.coef
            if cls == "a2a":
                n = len(g)
                per_group[(g, cls)] = per_group.get((g, cls), Fraction(0)) + \
                    math.ceil((n - 1) / deg) * coef
                e = (n - 1) * coef
            else:
                per_group[(g, cls)] = per_group.get((g, cls), Fraction(0)) + coef
                e = 2 * coef if cls == "ring" else coef
            for r in g:
                egress[r] = egress.get(r, Fraction(0)) + e
        if per_group:
            cut = max(cut, max(per_group.values()))
        inj = max(egress.values(), default=Fraction(0)) / deg
        lb, how = (cut, "cut") if cut >= inj else (inj, "injection")
        out.append(PhaseBound(key, lb, how, float(O)))
    return out


def _shared_chip_bounds(tm: TrafficModel, network: Network) -> list[PhaseBound]:
    """lb[p] with several devices per chip (module docstring, "several devices per chip"): the
    ring cut over the chip-set sizes a group can take; 0 where every group may sit on one chip.

    Args:
        tm: the traffic model of the evidence on `network`.
        network: a slice whose chips hold several devices.

    Returns:
        One bound per phase of ``tm.phases``."""
    out = []
    for key, cs, O in zip(tm.phases, tm.phase_collectives, tm.overlap_s):
        per_group: dict[frozenset, list] = {}
        for f in collective_flows(cs):
            if not isinstance(f, PermuteFlows) and f.cls == "ring":
                per_group.setdefault(f.group, []).append(f)
        lb = Fraction(0)
        for g, fs in per_group.items():
            sizes = [s for s in ring_set_sizes(len(g), network) if s >= 2]
            if len(sizes) == len(ring_set_sizes(len(g), network)):
                lb = max(lb, min(sum(class_coefficient(f.kind, f.nbytes, s) for f in fs)
                                 for s in sizes))
        out.append(PhaseBound(key, lb, "cut" if lb else "none (a group may share a chip)",
                              float(O)))
    return out


def comm_lower_bound(evidence: Evidence, network: Network,
                     traffic: TrafficModel | None = None) -> float:
    """sum_p count_p max(0, lb[p] / W - O_p): seconds of exposed communication per step that
    no placement beats (valid over every placement)."""
    bw = float(network.link_bandwidth_Bps)
    return sum(b.key.count * b.exposed_s(bw)
               for b in phase_link_lower_bounds(evidence, network, traffic))
