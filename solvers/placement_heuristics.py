"""Heuristic placement searches: same inputs, same cost function, same budget as the CP-SAT solver.

Every search prices placements with ``formulation.traffic.TrafficModel.cost`` (lexicographic:
exposed communication seconds, then link bytes, then flow hops) and returns a
``PlacementResult`` (placement, Certificate with bound None unless an enumeration completed, Q2,
trace of (seconds since start, best objective in seconds)).

- ``exhaustive``: every placement (<= 8 devices), deduplicated by the evidence automorphisms
  (slabs of interchangeable logical axes ordered by smallest device; rank 0 fixed when the
  remaining shifts / reflections allow). A completed enumeration is a proof: status OPTIMAL,
  bound = objective.
- ``axis_orders``: the logical mesh axes mapped onto the physical axes and sub-axes in every
  order (each physical axis split into ordered factors, all factors permuted, consecutive factors
  merged into the logical axes; reflections are symmetries and omitted), deduplicated by the
  placement produced; plus JAX's default order when given. What a topology-aware planner does.
- ``random_search``: uniformly random placements (seeded).
- ``annealing``: simulated annealing over pairwise swaps of two ranks' devices, from the best of
  the start placements (default order / axis orders), seeded; ends with a greedy pass over all
  swaps (``swap_descent``).

Budgets. Random search and annealing take a time limit, but their schedules follow a count of
evaluations, not the clock: ``evaluation_budget(time_limit_s)`` = ``EVALUATIONS_PER_S`` x
``time_limit_s`` placements priced (random search) or swaps tried (annealing, whose temperature
cools geometrically over them: T_k = t_start (t_end / t_start)^(k / N) at swap k of N). So the same
inputs, seed and budget give the same answer on any machine that completes the count. The clock
only caps a run (annealing: 90% of the limit for the swaps, the rest for the greedy pass); a run
the clock cut records why in ``certificate.detail["cut"]`` and is then machine-dependent.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Callable, Sequence

import numpy as np

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation import symmetry
from aoizora.formulation.latency import predict_step
from aoizora.formulation.traffic import TrafficModel
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.axis_orders import axis_order_placements
from aoizora.solvers.placement_result import PlacementResult

EXHAUSTIVE_MAX_DEVICES = 8
# Evaluations per second of time limit (module docstring): about half what this machine prices
# on a 16-chip slice, room for a machine half as fast (benchmarks/results/lab_notes.md). Where
# pricing is slower (v5e-64 and larger slices) the clock cuts the run.
EVALUATIONS_PER_S = 250


def evaluation_budget(time_limit_s: float, max_evaluations: int | None = None) -> int:
    """The evaluations a random search or an annealing run makes in `time_limit_s` seconds of
    budget when the clock does not cut it: `max_evaluations` when given, else
    ``EVALUATIONS_PER_S`` x `time_limit_s`, at least 1."""
    if max_evaluations is not None:
        return int(max_evaluations)
    return max(1, int(round(EVALUATIONS_PER_S * float(time_limit_s))))


class HeuristicError(ValueError):
    """A search that cannot run on this instance (e.g. exhaustive on too many devices)."""


class _Best:
    def __init__(self, tm: TrafficModel, t0: float):
        self.tm, self.t0 = tm, t0
        self.cost: tuple | None = None
        self.placement: np.ndarray | None = None
        self.trace: list[tuple[float, float]] = []
        self.evaluated = 0

    def offer(self, p: np.ndarray, cost: tuple | None = None) -> tuple:
        c = cost if cost is not None else self.tm.cost(p)
        self.evaluated += 1
        if self.cost is None or c < self.cost:
            self.cost = c
            self.placement = np.array(p, dtype=np.int64)
            self.trace.append((time.perf_counter() - self.t0, c[0]))
        return c


def _result(name: str, best: _Best, ev: Evidence, net: Network, t0: float, budget: float,
            seed: int | None, proven: bool = False, detail: dict | None = None) -> PlacementResult:
    p = [int(v) for v in best.placement]
    q2 = predict_step(ev, p, net, best.tm)
    d = {"evaluated": best.evaluated, "link_bytes": best.cost[1], "hops": best.cost[2]}
    d.update(detail or {})
    cert = Certificate(name, "OPTIMAL" if proven else "FEASIBLE", q2.communication_s,
                       q2.communication_s if proven else None, time.perf_counter() - t0, "s",
                       seed, 1, budget, d)
    return PlacementResult(p, cert, q2, best.trace)


# ---------------------------------------------------------------------------------------------
def swap_descent(p, key, price: Callable[[np.ndarray], tuple], deadline: float,
                 max_evaluations: int | None = None) -> tuple[np.ndarray, tuple, int, int, str]:
    """First-improvement descent over rank swaps (i < j, in order) from placement `p` of key
    `key`: a swap is taken when ``price`` of it is smaller, until a whole pass improves nothing,
    `max_evaluations` swaps were priced, or `deadline` (``time.perf_counter()``) passes.
    Returns (placement, key, swaps priced, swaps taken, why it was cut -- "" when it converged)."""
    p = np.array(p, dtype=np.int64)
    evaluated = taken = 0
    improved, cut = True, ""
    while improved and not cut:
        improved = False
        for i, j in itertools.combinations(range(len(p)), 2):
            if max_evaluations is not None and evaluated >= max_evaluations:
                cut = f"evaluation cap ({max_evaluations})"
            elif time.perf_counter() > deadline:
                cut = "time limit"
            if cut:
                break
            q = p.copy()
            q[i], q[j] = q[j], q[i]
            k = price(q)
            evaluated += 1
            if k < key:
                p, key, improved = q, k, True
                taken += 1
    return p, key, evaluated, taken, cut


# ---------------------------------------------------------------------------------------------
def exhaustive(evidence: Evidence, network: Network, time_limit_s: float = 60.0) -> PlacementResult:
    """Every placement up to the evidence automorphisms (<= 8 devices)."""
    n = evidence.num_devices
    if n > EXHAUSTIVE_MAX_DEVICES:
        raise HeuristicError(f"exhaustive enumeration is for <= {EXHAUSTIVE_MAX_DEVICES} devices, "
                             f"this instance has {n}: use axis_orders / annealing / the CP-SAT solver")
    t0 = time.perf_counter()
    tm = TrafficModel(evidence, network)
    best = _Best(tm, t0)
    shape = [int(v) for v in evidence.mesh_axes.values()] or [1]
    sym = symmetry.fully_symmetric_axes(evidence)
    slabs = {ax: symmetry.axis_slabs(evidence, ax) for ax in sym}
    gens = [pi for ax, _, pi in symmetry._logical_candidates(evidence) if ax not in sym]
    orbit = symmetry.orbit_map(gens, n, 0)
    ids = np.arange(n).reshape(shape)
    slab0 = set(ids[tuple(0 if a in sym else slice(None) for a in range(len(shape)))]
                .ravel().tolist())
    fix0 = set(orbit) == slab0
    complete = True
    skipped = 0
    for perm in itertools.permutations(range(n)):
        if fix0 and perm[0] != 0:
            break                                    # permutations are in lexicographic order
        p = np.array(perm, dtype=np.int64)
        ok = True
        for ax in sym:
            mins = [min(int(p[r]) for r in s) for s in slabs[ax]]
            if any(a > b for a, b in zip(mins, mins[1:])):
                ok = False
                break
        if not ok:
            skipped += 1
            continue
        best.offer(p)
        if best.evaluated % 256 == 0 and time.perf_counter() - t0 > time_limit_s:
            complete = False
            break
    return _result("exhaustive", best, evidence, network, t0, time_limit_s, None,
                   proven=complete, detail={"complete": complete, "skipped_by_symmetry": skipped,
                                            "rank0_fixed": fix0, "ordered_axes": sym})


# ---------------------------------------------------------------------------------------------
def axis_orders(evidence: Evidence, network: Network, time_limit_s: float = 60.0,
                default: Sequence[int] | None = None) -> PlacementResult:
    """JAX's order `default` when given, then every axis-order placement until `time_limit_s`."""
    t0 = time.perf_counter()
    tm = TrafficModel(evidence, network)
    best = _Best(tm, t0)
    cands = axis_order_placements(network, list(evidence.mesh_axes.values()),
                                  deadline=t0 + time_limit_s)
    if default is not None:
        best.offer(np.asarray(default, dtype=np.int64))
    done = 0
    for p in cands:
        if time.perf_counter() - t0 > time_limit_s:
            break
        best.offer(p)
        done += 1
    return _result("axis orders", best, evidence, network, t0, time_limit_s, None,
                   detail={"candidates": len(cands), "evaluated_candidates": done})


# ---------------------------------------------------------------------------------------------
def random_search(evidence: Evidence, network: Network, time_limit_s: float = 5.0,
                  seed: int = 0, default: Sequence[int] | None = None,
                  max_evaluations: int | None = None) -> PlacementResult:
    """`max_evaluations` random placements (``evaluation_budget(time_limit_s)`` when None) after
    `default`, or fewer where `time_limit_s` passes first (``detail["cut"]``)."""
    t0 = time.perf_counter()
    tm = TrafficModel(evidence, network)
    best = _Best(tm, t0)
    rng = np.random.default_rng(seed)
    if default is not None:
        best.offer(np.asarray(default, dtype=np.int64))
    n = evidence.num_devices
    asked = evaluation_budget(time_limit_s, max_evaluations)
    done, cut = 0, ""
    while done < asked:
        if time.perf_counter() - t0 >= time_limit_s:
            cut = f"time limit after {done} of {asked} placements"
            break
        best.offer(rng.permutation(n))
        done += 1
    return _result("random search", best, evidence, network, t0, time_limit_s, seed,
                   detail={"evaluations_asked": asked, "cut": cut or None})


# ---------------------------------------------------------------------------------------------
def annealing_starts(network: Network, mesh_shape: Sequence[int],
                     default: Sequence[int]) -> list[list[int]]:
    """The starts the annealing search takes as a heuristic: ``default`` (JAX's device order),
    then every physical axis-order placement of the mesh (with several devices per chip their
    devices are one more axis; none where chips hold different numbers of devices)."""
    starts = [[int(v) for v in default]]
    try:
        starts += [[int(v) for v in p] for p in axis_order_placements(network, list(mesh_shape))]
    except ValueError:
        pass
    return starts


def annealing(evidence: Evidence, network: Network, time_limit_s: float = 5.0, seed: int = 0,
              starts: Sequence[Sequence[int]] | None = None, t_start: float = 0.05,
              t_end: float = 1e-4, max_evaluations: int | None = None) -> PlacementResult:
    """Simulated annealing over swaps: `max_evaluations` swaps (``evaluation_budget(time_limit_s)``
    when None) from the best of `starts`, temperatures relative to that start's objective, then
    the greedy pass over all swaps; the clock cuts the swaps at 90% of `time_limit_s` and the
    pass at `time_limit_s` (``detail["cut"]``)."""
    t0 = time.perf_counter()
    tm = TrafficModel(evidence, network)
    best = _Best(tm, t0)
    rng = np.random.default_rng(seed)
    n = evidence.num_devices
    cands = [np.asarray(s, dtype=np.int64) for s in (starts or [])] or [np.arange(n)]
    cur, cur_c = None, None
    for s in cands:
        c = best.offer(s)
        if cur_c is None or c < cur_c:
            cur, cur_c = s.copy(), c
    scale = max(cur_c[0], 1e-12)
    bscale = max(cur_c[1], 1.0)

    def energy(c):
        return c[0] / scale + 1e-6 * c[1] / bscale

    e_cur = energy(cur_c)
    asked = evaluation_budget(time_limit_s, max_evaluations)
    it, cuts = 0, []
    while n >= 2 and it < asked:
        if time.perf_counter() - t0 > 0.9 * time_limit_s:
            cuts.append(f"time limit after {it} of {asked} swaps")
            break
        T = t_start * (t_end / t_start) ** (it / asked)
        i, j = rng.choice(n, size=2, replace=False)
        cand = cur.copy()
        cand[i], cand[j] = cand[j], cand[i]
        c = best.offer(cand)
        e = energy(c)
        if e <= e_cur or rng.random() < math.exp(-(e - e_cur) / T):
            cur, cur_c, e_cur = cand, c, e
        it += 1
    # greedy polish: first-improvement over all swaps of the best
    *_, polish_cut = swap_descent(best.placement, best.cost, best.offer,
                                  deadline=t0 + time_limit_s)
    if polish_cut:
        cuts.append(f"greedy pass: {polish_cut}")
    return _result("annealing", best, evidence, network, t0, time_limit_s, seed,
                   detail={"iterations": it, "evaluations_asked": asked,
                           "cut": "; ".join(cuts) or None})


HEURISTICS: dict[str, Callable[..., PlacementResult]] = {
    "exhaustive": exhaustive, "axis_orders": axis_orders, "random": random_search,
    "annealing": annealing,
}
