"""The order in which an iteration compiles and prices its layouts.

- ``diverse``: of the ILPs' layouts not compiled before (Q1 order), the ``top_k`` to compile:
  the best, then the best of the other kind (some attention's keys/values in a ring, or none:
  Q1 prices a ring's overlap least reliably) if Q1 puts it near the best, then the rest by Q1;
  a twin of a layout before it (every attention split the same way over axes of the same
  sizes, Q1 within ``TWIN_NEAR``) last.
- ``with_unproven_near``: right after the best, every other mesh's best layout that its ILP did
  not prove optimal, whose bound is below the best's Q1 and whose Q1 is within
  ``UNPROVEN_NEAR`` of it (the solver could not separate them, so a compile does).
- ``pricing_slots`` / ``pricing_rank``: the iteration's pricing order as an ordered list of
  named slots, and each compile's place in it, which is also its compile priority (``aoizora.planning.compile_queue``: least first), seeds and their refinements
  included (``aoizora.planning.seeds``); ``PricingItem``: one layout in that order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from aoizora.formulation.calibration import mesh_key
from aoizora.planning.candidate import attention_id
from aoizora.formulation.layout import Layout

UNPROVEN_NEAR = 0.01   # an unproven mesh's best layout this close to the best by Q1 compiles too
# the best layout of the other kv kind is compiled second if its Q1 is at most this far above
# the best's: about twice Q1's median error against the simulator (10.8%, q1_fidelity.md). In
# the ILP-only runs (ilp_only.md, tag a2a-routed) the other kind won at 15% above the best by
# Q1 and lost every time it was 27% or more above (a compile spent on a mesh Q1 put far behind)
DIVERSE_NEAR = 0.25
# a layout that runs every attention as one listed before it (``candidate.attention_id``) with a
# Q1 this close is its twin: on Wan 1.3B 41f v5e-16 the ILP's layouts on meshes 2x4x2 and
# 4x2x2 differed in three small inputs' specs and compiled to 164.4 and 164.5 ms (Q2)
TWIN_NEAR = 0.005


@dataclasses.dataclass(frozen=True)
class PricingItem:
    """One layout of an iteration, queued to compile and then placed and priced by Q2.

    Attributes:
      kind: ``"ilp"`` (a fresh ILP layout), ``"seed"`` (a seed as given), ``"refined"`` (a
        seed's refinement) or ``"retimed"`` (a training seed's retimed twin).
      index: the seed's place, from 1; for ``"ilp"`` the layout's place among the fresh ILP
        layouts, from 0.
      rank: its place in the pricing order, also its compile priority (``pricing_rank``).
      mesh: the logical mesh, axis name -> size.
      solution: the layout as a ``ShardingSolution`` (a seed's: ``seeds.seed_solution``).
      compiling: the Future of its compile (``CompileQueue.submit``).
      seed: the ``Seed`` it came from (its program), None for an ILP layout.
      q1_s: the ILP's Q1 seconds per step; inf for a seed and its derived layouts.
    """

    kind: str
    index: int
    rank: float
    mesh: dict[str, int]
    solution: Any
    compiling: Any
    seed: Any = None
    q1_s: float = math.inf


# The pricing order's named slots, in order. "ilp best" holds the ILP's best and its unproven
# near-ties, "ilp rest" the ILP's other fresh layouts; ("seed", i), ("refined", i) and
# ("retimed", i) are the i-th seed (from 1), its refinement and its retimed twin.
def pricing_slots(n_seeds: int, refinement_first: bool = False) -> list[tuple[str, int]]:
    """The slots of an iteration's pricing order, first to last (``pricing_rank``).

    Args:
      n_seeds: the seeds in this iteration (the first only; 0 later).
      refinement_first: the seeds are training seeds (``seeds.refinement_first``).

    Returns:
      ``(kind, i)`` pairs; ``("ilp best", 0)`` and ``("ilp rest", 0)`` stand for the ILP's
      layouts.
    """
    seeds = range(1, n_seeds + 1)
    if refinement_first:
        head = [("refined", 1), ("refined", 2), ("retimed", 2), ("retimed", 1), ("seed", 2),
                ("seed", 1)]
    else:   # a retimed twin (a training seed's) goes after its seed's refinement
        head = [("seed", 1), ("refined", 1), ("seed", 2), ("retimed", 1)]
    head = [(k, i) for k, i in head if i <= n_seeds]
    if n_seeds == 1 and not refinement_first:   # the ILP's best before the seed's twin
        head = head[:2] + [("ilp best", 0)] + head[2:]
    elif n_seeds:
        head.append(("ilp best", 0))
    tail = [(k, 2) for k in ("refined", "retimed") if not refinement_first and n_seeds >= 2]
    for i in seeds:
        if i >= 3:
            tail += [("seed", i), ("refined", i), ("retimed", i)]
    if not n_seeds:
        head = [("ilp best", 0)]
    return head + tail + [("ilp rest", 0)]


def pricing_rank(kind: str, i: int, n_seeds: int, lead: int = 1,
                 refinement_first: bool = False) -> float:
    """A compile's place in its iteration's pricing order, which is also its compile priority
    (``CompileQueue``: least first): its slot's place in ``pricing_slots``, plus a fraction
    that orders the ILP's layouts within their slot.

    With seeds: the first seed, its refinement, the second seed, the ILP's best (with its
    near-ties), the second seed's refinement, then each other seed followed by its refinement,
    then the ILP's other layouts. The seeds come in the order expected fastest first (the
    built-in ones: ``aoizora.builtin.SEED_ORDER``); chosen on the inference grid
    (benchmarks/results/grid.md; benchmarks/results/lab_notes.md). Without seeds: the ILP's
    best (with its near-ties), then the rest.

    ``refinement_first`` (training seeds, whose refinement always exists: it decides the remat,
    and carries the kernel model's tiles): the first two seeds' refinements, then the second
    seed, then the first: a 300 s budget holds one to three training compiles, and the second
    seed itself is the likelier third best. The retimed twins go after the refinements and
    before the seeds (the second's first): a twin runs its seed's own layout with the
    refinement's remat and tuned tiles, less recompute where HBM holds it, and the parameter
    layout is where the refinement's Q1 and Q2 disagreed. Chosen on the training grid
    (benchmarks/results/training_grid.md; benchmarks/results/lab_notes.md).
    Without ``refinement_first`` a retimed twin goes after its seed's refinement.

    Args:
      kind: ``"seed"``, ``"refined"`` or ``"retimed"`` (the i-th seed, its refinement, its
        retimed twin: ``aoizora.planning.seeds``), or ``"ilp"``.
      i: the seed's place (from 1), or for ``"ilp"`` the layout's place among the iteration's
        fresh ILP layouts (from 0), of which the first ``lead`` are the ILP's best and its
        unproven near-ties (``with_unproven_near``).
      n_seeds: the seeds in this iteration (the first only).
      lead: how many ILP layouts share the "ilp best" slot.
      refinement_first: the seeds are training seeds (``seeds.refinement_first``).

    Returns:
      The rank, a number: less is earlier.

    Raises:
      ValueError: no slot for ``(kind, i)`` with ``n_seeds`` seeds.
    """
    slots = pricing_slots(n_seeds, refinement_first)
    if kind == "ilp":
        if i < lead:
            return slots.index(("ilp best", 0)) + i / lead
        j = i - lead
        return slots.index(("ilp rest", 0)) + j / (j + 1)
    return float(slots.index((kind, i)))


def uses_ring(layout: Layout) -> bool:
    return any(a.kv == "ring" for a in layout.attention.values())


def diverse(ranked: list, k: int) -> list:
    """The `k` layouts to compile from `ranked` (Q1 order; each (Q1, mesh, solution)): the best,
    then the best of the other kind -- with some attention's keys/values in a ring, or all
    gathered (how much of a ring's traffic hides behind compute is what Q1 prices least
    reliably) -- if its Q1 is within ``DIVERSE_NEAR`` of the best's, then the rest by Q1, and
    last the twins (``TWIN_NEAR``) of layouts before them."""
    firsts, rest, twins, modes = [], [], [], set()
    seen: list[tuple[float, str]] = []
    for r in ranked:
        aid = attention_id(r[1], r[2].layout)
        if any(a == aid and abs(r[0] - q) <= TWIN_NEAR * abs(q) for q, a in seen):
            twins.append(r)
            continue
        seen.append((r[0], aid))
        sig = uses_ring(r[2].layout)
        near = not firsts or r[0] <= firsts[0][0] * (1.0 + DIVERSE_NEAR)
        (rest if sig in modes or not near else firsts).append(r)
        modes.add(sig)
    return (firsts + rest + twins)[:k]   # rest and twins keep ``ranked``'s Q1 order


def with_unproven_near(fresh: list, untried: list) -> list:
    """``fresh`` (the layouts to compile, best first) with, right after its best, the best layout
    of every other mesh whose ILP stopped at its time limit (not proven optimal) with a bound
    below the best's Q1 and a Q1 within ``UNPROVEN_NEAR`` of it.

    Such a layout ranks behind the best only by what its solver had time to find: its bound
    says that mesh may hold a better layout than the best, and Q1's own error against the
    compiled programs (tens of percent) dwarfs the difference, so one more compile decides.
    Where every ILP proves its optimum, nothing is added. Without it, Wan 2.1 14B 480p-21f on
    v5e-16 planned 3.6% slower than the Alpa-style baseline in two runs on a slow machine: the
    2x4x2 ILP stopped 0.39% from its bound with a layout 0.1% behind 4x2x2's by Q1, and was
    never compiled."""
    if not fresh:
        return fresh
    q_best, m_best = fresh[0][0], mesh_key(fresh[0][1])
    picked = {id(r[2]) for r in fresh}
    meshes = {m_best}
    near = []
    for r in untried:                    # Q1 order: a mesh's first entry is its best layout
        q1, m, sol = r
        if mesh_key(m) in meshes:
            continue
        meshes.add(mesh_key(m))
        c = sol.certificate
        if (id(sol) not in picked and not c.proven_optimal and c.bound is not None
                and c.bound < q_best and q1 <= q_best * (1.0 + UNPROVEN_NEAR)):
            near.append(r)
    return fresh[:1] + near + fresh[1:]
