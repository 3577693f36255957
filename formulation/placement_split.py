"""Split on one group's chip set: lower bounds per chip set, for a proof over every placement.

Names as in ``formulation.placement_cpsat`` (``PlacementModel`` ``pm``): phases p with count_p,
overlap floor(O_p) = ``pm.O_units[p]``, per-phase items (cls, g, coef) with integer units
cu = ``pm.units(coef)``, permutes, and the analytic bound lbM[p] = ceil(lb[p] / unit_bytes)
(``placement_bounds.phase_link_lower_bounds``; units; valid for every placement; recomputed
here, not read from ``pm.lbM``, which a decomposition may raise with bounds of a narrower scope).
The level-1 objective in model units is, for a placement P (rank -> chip),

    MC(P) = sum_p count_p max(0, M_p(P) - floor(O_p), max_q M_q(P) - floor(O_q)),
    M_p(P) = max_l load_p(P)[l]   (q: p's sub-demand classes, ``placement_cpsat``),
    load_p(P)[l] = sum_{(cls, g, coef) in p} cu unit_cls(P(g))[l]
                 + sum_{permute pairs (s, t) in p} cu [l in route(P(s), P(t))]

(``model_cost_units``: the CP-SAT model's objective at P, exact integers; it over-states the
exposed seconds by < 1 unit per run of a phase, ``pm.rounding_units`` in all).

The split. Take a rank set g* (``split_group``: a ring group, k* = |g*| >= 3) and its complement
gc = ranks \\ g*. Every placement P puts g* on exactly one k*-subset S = P(g*) of the chips,
and gc on C \\ S (one rank per chip). So the placements partition into the classes
P(S) = {P : P(g*) = S} over the C(C, k*) sets S, and

    min_P MC(P) = min_S min_{P in P(S)} MC(P).

Lower bound of a class (``set_lower_bounds``); for P in P(S) and each phase p:
  fixed: the items on g* and on gc load the links exactly as
        fixed_p(S)[l] = sum_{(cls, g*, coef) in p} cu unit_cls(S)[l]
                      + sum_{(cls, gc, coef) in p} cu unit_cls(C \\ S)[l]
      (a group's loads depend only on its chip set: ``traffic.unit_loads``); every other item
      and permute adds a nonnegative load, so load_p(P) >= fixed_p(S) link by link and
      M_p(P) >= max_l fixed_p(S)[l] (= M_p(P) when p has only items on g* / gc: ``exact``);
  cut: for both directions d, delta_out(S) = {l : src_l in S, dst_l not in S} and delta_in(S)
      the reverse. Every flow from a chip of S to a chip off S uses a link of delta_out(S)
      (delta_in likewise), and given S the side of every rank is known (g* on S, gc off it).
      The crossing flows of the other items: a pair / all-to-all item on a group with n1 ranks
      in g* and n2 = |g| - n1 in gc: n1 n2 flows of cu each way; a permute pair (s, t) on
      different sides: one flow of cu its way; a ring item with n1, n2 > 0: >= 2 cu each way
      (a closed ring crosses the cut on >= 2 links, 1 unit each way on each; a line on >= 1
      link, 2 units each way; a scattered tour has >= 1 step out of S and >= 1 into S, with h
      each way per step or 2h one way). With F_d the sum of these and n_{d,f} the number of
      unsplittable crossing flows (pairs, all-to-all, permutes) of size f, and integer loads:
        M_p(P) >= ceil((F_d + sum_{l in delta_d(S)} fixed_p(S)[l]) / |delta_d(S)|),
        M_p(P) >= f ceil(n_{d,f} / |delta_d(S)|);
  analytic: M_p(P) >= lbM[p].
phase_lb[S][p] is the largest of these, and as max(0, . - floor(O_p)) is nondecreasing,

    LB(S) = sum_p count_p max(0, phase_lb[S][p] - floor(O_p)) <= MC(P)   for every P in P(S).

Hence for an incumbent with MC = U no class with LB(S) >= U holds a strictly better
placement; the solver (``solvers.placement_split``) closes each other class with the exact
pinned model (``PlacementModel(pin=(g*, S), formulation="sets")`` plus M[p] >= phase_lb[S][p]),
and min_S of the classes' bounds is a lower bound of min_P MC(P) over every placement.

Choice of g* (``split_group``): among groups of ring collectives (3 <= k < C: a group on every
chip has one class, the whole problem) whose sets number at most ``SPLIT_SETS_CAP``, the one
whose fixed items weigh most (sum_p count_p sum cu over items on g or its complement); ties to
the smallest sorted rank tuple. Deterministic.
No jax import (formulation layer).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Sequence

import numpy as np

from aoizora.formulation import placement_bounds
from aoizora.formulation.traffic import unit_loads

# Most chip sets S (C(C, k*)) the split enumerates: v5e-16's 8 of 16 chips: 12,870 (~1.5 s here).
SPLIT_SETS_CAP = 20_000


@dataclasses.dataclass
class SplitBound:
    group: tuple[int, ...]          # g*, sorted ranks
    sets: list[tuple[int, ...]]     # every k*-subset S of the chips, lexicographic
    lb_units: np.ndarray            # LB(S) per set, model units (int64)
    exact_phases: list[int]         # phases whose M_p is fixed by S alone
    phase_lb_units: np.ndarray      # [set, phase]: the bound of M_p(P) over P(S), units


def _complement(pm, g: int) -> int | None:
    rest = frozenset(range(pm.R)) - pm.groups[g]
    return pm._gid.get(rest)


def split_group(pm) -> int | None:
    """g* of the module docstring (an index into ``pm.groups``), or None when no ring group has
    at most ``SPLIT_SETS_CAP`` chip sets or the slice has several devices per chip."""
    if pm.net.num_devices != pm.net.num_chips:
        return None
    counts = [k.count for k in pm.traffic.phases]
    weight: dict[int, int] = {}
    for n, its in zip(counts, pm.items):
        for cls, g, coef in its:
            weight[g] = weight.get(g, 0) + n * pm.units(coef)
    best = None
    for g, grp in enumerate(pm.groups):
        k = len(grp)
        if k < 3 or k >= pm.C or math.comb(pm.C, k) > SPLIT_SETS_CAP:
            continue
        if not any(cls == "ring" and gg == g for its in pm.items for cls, gg, _ in its):
            continue
        gc = _complement(pm, g)
        w = weight.get(g, 0) + (weight.get(gc, 0) if gc is not None else 0)
        key = (-w, tuple(sorted(grp)))
        if best is None or key < best[0]:
            best = (key, g)
    return None if best is None else best[1]


def split_sets_count(pm) -> int:
    """C(C, k*): the chip sets ``set_lower_bounds`` enumerates (0 when ``split_group`` is None)."""
    g = split_group(pm)
    return 0 if g is None else math.comb(pm.C, len(pm.groups[g]))


def set_lower_bounds(pm, g: int) -> SplitBound:
    """LB(S) (module docstring) for every chip set S of group g, in ``pm``'s units, and the
    per-phase bounds it sums."""
    C, L = pm.C, pm.net.num_links
    k = len(pm.groups[g])
    gc = _complement(pm, g)
    sets = list(itertools.combinations(range(C), k))
    full = frozenset(range(C))
    mats: dict[tuple[str, bool], np.ndarray] = {}
    perm = None                              # index of C \ S when it is a k-set too
    if 2 * k == C:
        index = {S: i for i, S in enumerate(sets)}
        perm = np.array([index[tuple(sorted(full - set(S)))] for S in sets], dtype=np.int64)

    def mat(cls: str, comp: bool) -> np.ndarray:
        key = (cls, comp)
        if key not in mats:
            if comp and perm is not None:    # C \ S is itself a k-set: reuse its row
                mats[key] = mat(cls, False)[perm]
                return mats[key]
            rows = np.zeros((len(sets), L), dtype=np.int64)
            for i, S in enumerate(sets):
                T = tuple(sorted(full - set(S))) if comp else S
                rows[i] = unit_loads(cls, T, pm.net)[0]
            mats[key] = rows
        return mats[key]

    lbM = [int(math.ceil(b.link_bytes / pm.unit_bytes)) * pm.min_weight for b in
           placement_bounds.phase_link_lower_bounds(pm.ev, pm.net, pm.traffic)]
    # the cut delta+(S) (links S -> C \ S) and delta-(S) (links C \ S -> S), per set
    inS = np.zeros((len(sets), pm.net.num_nodes), dtype=bool)
    for i, S in enumerate(sets):
        inS[i, list(S)] = True
    src, dst = np.asarray(pm.net.link_src), np.asarray(pm.net.link_dst)
    cut_masks = (inS[:, src] & ~inS[:, dst], ~inS[:, src] & inS[:, dst])
    cut_sizes = [m.sum(axis=1) for m in cut_masks]
    side = np.zeros(pm.R, dtype=bool)
    side[list(pm.groups[g])] = True
    phase_lb = np.zeros((len(sets), len(pm.items)), dtype=np.int64)
    lb = np.zeros(len(sets), dtype=np.int64)
    exact = []
    for p, (key, its) in enumerate(zip(pm.traffic.phases, pm.items)):
        fixed = None
        others = bool(pm.permutes[p] and any(pairs for pairs, _ in pm.permutes[p]))
        # crossing flows, per direction (0: out of S, 1: into S): total units, and per flow
        # size f the number of indivisible flows of that size
        total = [0, 0]
        sizes: list[dict[int, int]] = [{}, {}]
        for cls, gg, coef in its:
            cu = pm.units(coef)
            if gg == g or (gc is not None and gg == gc):
                term = cu * mat(cls, gg != g)
                fixed = term if fixed is None else fixed + term
                continue
            others = True
            n1 = int(side[list(pm.groups[gg])].sum())
            n2 = len(pm.groups[gg]) - n1
            if not n1 or not n2:
                continue
            if cls in ("pair", "a2a"):             # n1 n2 flows of cu each way
                for d in (0, 1):
                    total[d] += n1 * n2 * cu
                    sizes[d][cu] = sizes[d].get(cu, 0) + n1 * n2
            elif cls == "ring":                    # >= 2 units cross each way
                total[0] += 2 * cu
                total[1] += 2 * cu
        for pairs, V in pm.permutes[p]:
            cu = pm.units(V)
            for s_, t_ in pairs:
                if side[s_] != side[t_]:
                    d = 0 if side[s_] else 1
                    total[d] += cu
                    sizes[d][cu] = sizes[d].get(cu, 0) + 1
        M = np.full(len(sets), lbM[p], dtype=np.int64)
        if fixed is not None:
            M = np.maximum(M, (fixed * pm.link_weight).max(axis=1) if L else 0)
        for d in (0, 1):
            if not total[d]:
                continue
            n_cut = cut_sizes[d]
            on_cut = (fixed * cut_masks[d]).sum(axis=1) if fixed is not None else 0
            safe = np.maximum(n_cut, 1)
            bound = -(-(total[d] + on_cut) // safe)          # ceil: integer loads
            for f, n in sizes[d].items():
                bound = np.maximum(bound, f * (-(-n // safe)))
            M = np.maximum(M, np.where(n_cut > 0, bound * pm.min_weight, 0))
        if fixed is not None and not others:
            exact.append(p)
        phase_lb[:, p] = M
        lb += key.count * np.maximum(0, M - int(pm.O_units[p]))
    return SplitBound(tuple(sorted(pm.groups[g])), sets, lb, exact, phase_lb)


def model_cost_units(pm, chip_of_rank: Sequence[int]) -> int:
    """MC(P): the level-1 objective of ``pm``'s CP-SAT model at placement P (rank -> chip), in
    units, computed from the loads directly (exact integers)."""
    return sum(key.count * e for key, e in
               zip(pm.traffic.phases, pm.exposed_units(phase_maxima(pm, chip_of_rank))))


def phase_maxima(pm, chip_of_rank: Sequence[int]) -> list[int]:
    """M_p(P) per phase (units, exact integers) at placement P (rank -> chip)."""
    p_ = [int(v) for v in chip_of_rank]
    net = pm.net
    out = []
    for p, its in enumerate(pm.items):
        load = np.zeros(net.num_links, dtype=np.int64)
        for cls, g, coef in its:
            S = tuple(sorted(p_[r] for r in pm.groups[g]))
            load += pm.units(coef) * unit_loads(cls, S, net)[0]
        for pairs, V in pm.permutes[p]:
            cu = pm.units(V)
            for s, t in pairs:
                for l in net.route(p_[s], p_[t]):
                    load[l] += cu
        out.append(int((load * pm.link_weight).max()) if len(load) else 0)
    return out
