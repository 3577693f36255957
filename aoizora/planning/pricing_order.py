"""The order in which an iteration compiles and prices its layouts.

- ``diverse``: of the ILPs' layouts not compiled before (Q1 order), the ``top_k`` to compile:
  the best, then the best of the other kind (some attention's keys/values in a ring, or none:
  Q1 prices a ring's overlap least reliably), then the rest by Q1.
- ``with_unproven_near``: right after the best, every other mesh's best layout that its ILP did
  not prove optimal, whose bound is below the best's Q1 and whose Q1 is within
  ``UNPROVEN_NEAR`` of it (the solver could not separate them, so a compile does).
- ``pricing_rank``: each compile's place in the iteration's pricing order, which is also its
  compile priority (``aoizora.planning.compile_queue``: least first), seeds and their refinements
  included (``aoizora.planning.seeds``).
"""

from __future__ import annotations

from aoizora.formulation.calibration import mesh_key
from aoizora.formulation.layout import Layout

UNPROVEN_NEAR = 0.01   # an unproven mesh's best layout this close to the best by Q1 compiles too


REFINED_FIRST_RANK = 0.5   # the first seed's refinement, when refinements compile first


def pricing_rank(kind: str, i: int, n_seeds: int, lead: int = 1,
                 refinement_first: bool = False) -> float:
    """A compile's place in its iteration's pricing order, which is also its compile priority
    (``CompileQueue``: least first). ``kind`` "seed", "refined" or "retimed": the i-th seed
    (1-based), its refinement, or its retimed twin (``aoizora.planning.seeds``: the seed's own parameter
    layout with its refinement's remat and tiles); "ilp": the i-th of the iteration's fresh ILP
    layouts (0-based), of which the first ``lead`` are the ILP's best and its unproven near-ties
    (``with_unproven_near``).
    ``n_seeds``: the seeds in this iteration (the first only).

    With seeds: the first seed, its refinement, the second seed, the ILP's best (with its
    near-ties), the second seed's refinement, then each other seed followed by its refinement,
    then the ILP's other layouts. The seeds come in the order expected fastest first (the
    built-in ones: ``aoizora.builtin.SEED_ORDER``). In the grid's 31 cells (benchmarks/results/
    grid.md, 240 s budget) the plan was the first seed in 17, its refinement in 13 and the ILP's
    best in one (with the order first seed, refinement, ILP's best, other seeds), and where a
    compile takes 50 s (HunyuanVideo 720p-129f on v5e-16) three compiles fit: the second seed
    (cfg2_ulysses, there the fastest expert, simulated) goes before the ILP's best. Without
    seeds: the ILP's best (with its near-ties), then the rest.

    ``refinement_first`` (training seeds, whose refinement always exists: it decides the remat,
    and carries the kernel model's tiles): the first two seeds' refinements, then the second
    seed, then the first. A training step's compile takes 60-170 s, so a 300 s budget holds one
    to three. In the training grid (``benchmarks/results/training_grid.md``, 2026-12-03) the
    first seed's refinement (maxdiffusion's) priced below that seed in every cell where both
    compiled, while the second's (FSDP x TP) priced above its seed (Wan 1.3B 480p-21f on
    v5p-16: 350 against 238 ms by Q2): the second seed itself is the likelier third best.
    The retimed twins go after the refinements and before the seeds (the second's first): a twin
    runs its seed's own layout with the refinement's remat and tuned tiles, less recompute where
    HBM holds it, and the parameter layout is where the refinement's Q1 and Q2 disagreed (Wan
    1.3B 480p-21f on v5p-16: FSDP x TP retimed 191 ms against its refinement's 203 by Q2).
    Without ``refinement_first`` a retimed twin goes after its seed's refinement."""
    if refinement_first and kind == "refined" and i <= 2:
        return REFINED_FIRST_RANK * (1 + (i - 1) / 2)
    if kind == "retimed":
        if refinement_first and i <= 2:
            return REFINED_FIRST_RANK * (1.6 + (2 - i) / 10)
        return 2 * i + 1.5
    if refinement_first and kind == "seed" and i == 2:
        return REFINED_FIRST_RANK * 1.8
    if kind == "ilp":
        if i < lead:
            return (4 if n_seeds >= 2 else 3 if n_seeds else 0) + i / lead
        return 2 * n_seeds + 1 + i
    if i == 1:
        return 1.0 + (kind == "refined")
    if i == 2:
        return 3.0 if kind == "seed" else 5.0
    return float(2 * i + (kind == "refined"))


def uses_ring(layout: Layout) -> bool:
    return any(a.kv == "ring" for a in layout.attention.values())


def diverse(ranked: list, k: int) -> list:
    """The `k` layouts to compile from `ranked` (Q1 order): the best, then the best of the other
    kind -- with some attention's keys/values in a ring, or all gathered (how much of a ring's
    traffic hides behind compute is what Q1 prices least reliably) -- then the rest by Q1."""
    firsts, rest, modes = [], [], set()
    for r in ranked:
        sig = uses_ring(r[2].layout)
        (rest if sig in modes else firsts).append(r)
        modes.add(sig)
    return (firsts + rest)[:k]


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
