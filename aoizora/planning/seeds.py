"""Seeds in the loop: given layouts (e.g. today's expert configurations) compiled, placed and
priced with the ILP's in the first iteration, and their refinements.

- ``queue_seed_compiles``: every seed's compile is queued when planning starts, each at its
  place in the pricing order (``pricing_order.pricing_rank``); those placed after the ILP's
  best are held (``CompileQueue.hold``) until the ILPs have queued it, so which layouts a
  budget leaves uncompiled does not depend on how long the ILPs took.
- ``refine_seeds``: each seed's refinement (``aoizora.planning.seed_refinement``: the ILP with the
  seed's attention fixed chooses the parameter layout around it, and a training seed's remat on
  its ``retraceable`` step), with the kernel model's attention tiles and backward blocks
  (``tiles.kernel_tiled``) instead of the seed's, solved before the meshes' ILPs and queued to
  compile right after its seed (training seeds, ``refinement_first``: the first seed's
  refinement before that seed, ``pricing_order.pricing_rank``); skipped when the ILP keeps the
  seed's parameter layout. A training seed's refinement that changes parameters also has a
  *retimed* twin: the seed's own parameter layout with the refinement's remat and tiles (the
  ILP's parameter layout is where Q1 and the compiled program disagree most), queued after the
  refinements (``pricing_rank`` "retimed"), and not compiled when its refinement, with the same
  remat, compiled and did not fit in HBM.
- ``first_compile_alone``: wait for the first seed's compile (the cores to itself; with
  ``refinement_first``, its refinement's), then say
  whether the budget still holds the ILP's best after the compiles ranked before it.
- ``seed_solution``: a seed layout dressed as a sharding solution (its certificate proves
  nothing about it).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from functools import partial
from typing import Any

import jax

from aoizora.planning import time_limits
from aoizora.planning.candidate import Seed
from aoizora.planning.candidate_pricing import compile_job
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.layout import Layout
from aoizora.planning.loop_state import IterationRecord, LoopState
from aoizora.planning.pricing_order import PricingItem, pricing_rank
from aoizora.planning.seed_refinement import RefinementError
from aoizora.solvers.budget import Budget, clock
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.sharding import ShardingSolution
from aoizora.solvers.stop import checkpoint
from aoizora.kernels.tiles import kernel_tiled


def seed_solution(layout: Layout, ilp_best: ShardingSolution | None) -> ShardingSolution:
    """A seed layout dressed as a sharding solution. Its certificate proves nothing about it: the
    ILP did not produce it; the ILP's own best (with its certificate) is kept in detail."""
    cert = Certificate(
        solver=f"seed ({layout.name or 'given layout'})", status="FEASIBLE", objective=None,
        bound=None, time_s=0.0, unit="s",
        detail={"seed": True, "note": "a given layout (seed), not an ILP solution; compiled and "
                                      "priced by Q2 like the ILP's",
                "ilp_best": ilp_best.certificate.to_json() if ilp_best else None})
    words = []
    for key, a in sorted(layout.attention.items()):
        parts = [f"{what} on {'+'.join(ax)}" for what, ax in
                 (("batch", a.batch), ("heads", a.heads), ("sequence", a.seq)) if ax]
        ring = ", keys/values in a ring" if a.kv == "ring" else ""
        words.append(f"attention: {', '.join(parts) or 'replicated'}{ring} [{key}]")
    words += [f"rule {name}: on {'+'.join(ax)}" for name, ax in sorted(layout.rules.items())]
    return ShardingSolution(layout=layout, certificate=cert, choice={}, words=words,
                            predicted={"total_s": math.inf}, peak_bytes=0.0)


def refinement_first(state: LoopState) -> bool:
    """Whether the first seed's refinement compiles before the first seed (training seeds:
    ``pricing_order.pricing_rank``)."""
    return bool(state.seeds) and state.seeds[0].retraceable is not None


# How much longer a training seed's own step (its authors' remat, activations offloaded to the
# host) is expected to compile than the layouts on the retraced step compiled before it
# (``CompileQueue.submit``'s ``slower``). Fitted on the training grid
# (benchmarks/results/training_grid/; the figures: benchmarks/results/lab_notes.md).
SEED_PROGRAM_SLOWER = 1.6


def queue_seed_compiles(state: LoopState) -> None:
    """Queue every seed's compile at its place in the first iteration's pricing order, those
    after the ILP's best held until the ILPs have queued it (module docstring); with
    ``refinement_first``, every seed is held until the seeds' refinements are queued; with
    screening (``planning.screening``: screens, not compiles, are queued here), every seed after
    the first seed's refinement, so that the first screens are the pricing order's first two."""
    seeds, prog, queue = state.seeds, state.program, state.compiles_to()
    first = refinement_first(state)
    if seeds and (first or state.screener is not None):
        queue.hold(pricing_rank("refined", 1, len(seeds), refinement_first=first))
    elif seeds and state.meshes:   # the seeds after the ILP's best wait for it
        queue.hold(pricing_rank("ilp", 0, len(seeds)))
    state.seed_compiles = [queue.submit(compile_job(
        sd.fn or prog.fn, sd.args if sd.args is not None else prog.args, prog.target, sd.layout,
        compile_fn=state.seams.compile_layout, cache=prog.cache),
        priority=pricing_rank("seed", i, len(seeds), refinement_first=first),
        slower=SEED_PROGRAM_SLOWER if first else 1.0)
        for i, sd in enumerate(seeds, 1)]


def refine_seeds(state: LoopState, ilp: Budget, rec: IterationRecord) -> list[PricingItem]:
    """Each seed's refinement (and a training seed's retimed twin), queued to compile at its
    place (``pricing_rank``), as ``PricingItem`` (kind "refined" or "retimed", the seed's place
    from 1, a ``Seed`` of the layout's program). A seed that cannot be refined, or that the ILP
    leaves as it is, is noted in ``rec``; none starts once ``ilp`` (the iteration's ILP share)
    has run out."""
    out = []
    irs: dict[int, Any] = {}
    for i, sd in enumerate(state.seeds, 1):
        checkpoint()
        if ilp.left() <= 0:
            rec.changes.append("seed refinement skipped: the time budget is kept for compiles")
            rec.time_limited.append(f"seed refinement of {sd.layout.name} and the seeds after "
                                       f"it: skipped to keep the budget for compiles")
            break
        ref, sfn, sargs = _refine(state, sd, ilp, irs, rec)
        if ref is None:
            continue
        c = ref.solution.certificate
        state.progress.solver(f"seed refinement {sd.layout.name}", c.status, c.objective, c.bound)
        first = refinement_first(state)
        rec.time_limited += time_limits.sharding(f"seed refinement of {sd.layout.name}", c)
        rec.refinements = (rec.refinements or []) + [ref.summary()]
        rec.changes.append(f"seed {sd.layout.name}: refined, the ILP lays out "
                              f"{ref.changed} parameter(s) otherwise around its attention"
                              + (" and chooses the remat" if sd.retraceable else ""))
        base = sd.retraceable or sd
        def queue(kind: str, layout: Layout, sol: ShardingSolution, unless=None):
            rank = pricing_rank(kind, i, len(state.seeds), refinement_first=first)
            f = state.compiles_to().submit(compile_job(sfn, sargs, state.program.target, layout,
                                               compile_fn=state.seams.compile_layout,
                                               cache=state.program.cache),
                                   priority=rank, unless=unless)
            out.append(PricingItem(kind, i, rank, dict(layout.mesh_axes), sol, f,
                                   seed=Seed(layout, base.fn, base.args, dict(base.program))))
            return f

        f = queue("refined", ref.layout, _refined_solution(sd, ref))
        if sd.retraceable is not None and ref.changed:
            twin = retimed(ref.layout, base.layout, sd.layout.name)
            queue("retimed", twin, _retimed_solution(sd, ref, twin),
                  unless=partial(_refinement_did_not_fit, f))
    if refinement_first(state) or state.screener is not None:
        # now the seeds after the ILP's best wait for it
        if state.meshes:
            state.compiles_to().hold(pricing_rank("ilp", 0, len(state.seeds)))
        else:
            state.compiles_to().release()
    return out


def _refine(state: LoopState, sd: Seed, ilp: Budget, irs: dict[int, Any], rec: IterationRecord):
    """(refinement or None, the seed's fn, its args); None noted in ``rec`` (not refinable, or
    the ILP keeps the seed's parameter layout). ``irs``: the traced IRs by program."""
    prog = state.program
    base = sd.retraceable or sd        # a training seed: its step as traced, the ILP's remat
    sfn = base.fn or prog.fn
    sargs = base.args if base.args is not None else prog.args
    try:
        sir = prog.ir if base.fn is None else irs.get(id(sfn)) or build_ir(sfn, *sargs)
        irs[id(sfn)] = sir
        n_params = len(jax.tree_util.tree_leaves(sargs[0])) if sargs else 0
        ref = state.seams.refine_seed(sir, prog.target, base.layout, range(n_params),
                                      time_limit_s=ilp.share_s("ilp_solve",
                                                               state.settings.ilp_time_s),
                                      seed=state.settings.seed,
                                      attention_scale=state.scales.attention or None,
                                      compute_scale=state.scales.compute,
                                      remat="decide" if sd.retraceable is not None else "stacks",
                                      solve=state.seams.solve_sharding)
    except RefinementError as e:
        rec.changes.append(f"seed {sd.layout.name}: not refined ({e})")
        return None, sfn, sargs
    if ref is None:
        rec.changes.append(f"seed {sd.layout.name}: the ILP keeps its parameter layout")
        return None, sfn, sargs
    # a refinement also takes the kernel model's attention tiles (forward and backward blocks)
    # instead of the seed's; its compile is the verdict, Q2 the judge, as for the rest of it
    ref = dataclasses.replace(ref, layout=kernel_tiled(ref.layout, sir, prog.target))
    return ref, sfn, sargs


def _refined_solution(sd: Seed, ref) -> ShardingSolution:
    sol = seed_solution(ref.layout, ref.solution)
    sol.certificate.detail["note"] = (
        "a seed refined by the sharding ILP: the seed's attention and activation layout, the "
        "parameter layout of the ILP's solution with that attention fixed (ilp_best: that "
        "ILP's certificate); compiled and priced by Q2 like the others")
    return dataclasses.replace(
        sol, words=[f"{ref.layout.name}: {sd.layout.name} with the ILP's parameter layout "
                    f"(its attention kept, the kernel model's tiles)"] + list(ref.solution.words))


def _refinement_did_not_fit(refined_compile) -> str:
    """Why a retimed twin is not compiled: its refinement (same remat) compiled and did not fit
    in HBM (Wan 2.1 14B 480p-21f b2 on v5p-8: both did not, and the two compiles, 158 and 120 s,
    took the budget the seed that fitted needed); "" otherwise."""
    if not refined_compile.done():
        return ""
    got = refined_compile.result()
    ev = getattr(got, "evidence", None)
    if ev is not None and not ev.memory.fits:
        return "its refinement, with the same remat, did not fit in HBM"
    return ""


def retimed(refined: Layout, own: Layout, name: str) -> Layout:
    """``refined`` (a training seed's refinement: the ILP's parameter layout, remat and the
    kernel model's tiles) with the parameter specs of ``own`` (the seed's layout on its
    retraceable step) back: the seed's layout with only its remat and tiles changed."""
    return dataclasses.replace(refined, in_specs=list(own.in_specs),
                               out_specs=None if own.out_specs is None else list(own.out_specs),
                               name=f"retimed:{name}")


def _retimed_solution(sd: Seed, ref, layout: Layout) -> ShardingSolution:
    sol = seed_solution(layout, ref.solution)
    sol.certificate.detail["note"] = (
        "a training seed retimed: its own layout with the remat its refinement's ILP chose and "
        "the kernel model's tiles (ilp_best: that ILP's certificate, which covers the "
        "refinement's parameter layout, not this one); compiled and priced by Q2 like the others")
    return dataclasses.replace(sol, words=[
        f"{layout.name}: {sd.layout.name}'s own parameter layout with its refinement's remat and "
        f"the kernel model's tiles"] + list(sol.words))


def first_compile_alone(state: LoopState, refined: list[PricingItem]) -> tuple[str, bool]:
    """Wait for the first compile of the pricing order (the first seed's; with training seeds
    the first refinement's, or the next queued where a seed has none), which so has the cores to
    itself, then say whether the
    first iteration's sharding ILPs are worth solving: ("", False) when the budget still holds
    the compiles ranked before the ILP's best (``pricing_rank``: the first seed's refinement and
    the second seed) and the ILP's best itself, else (why not, whether the clock decided it:
    False where the compile count did, which is repeatable).

    Until the first compile the planner cannot know what a compile costs. Solved beside it, the
    ILPs take one of the 2 cores and slow it, so that with a short budget the compiles ranked
    after it no longer fit (benchmarks/results/lab_notes.md). With a long budget the ILPs lose
    nothing by starting later: their layouts are not compiled before the seeds ranked ahead of
    them anyway (``CompileQueue.hold``), and their share (``ilp`` of ``solvers.budget``, of the
    budget left when the iteration started) moves by the time they waited. Where the seeds'
    refinements (small ILPs, solved before) outlast the first compile, nothing waits and nothing
    moves (a refinement may take its whole limit on a large model). The ILPs' share is not of
    what is left when they start: that gave them more time than the ILP's best could afford
    (benchmarks/results/lab_notes.md)."""
    seed_compiles, n_seeds, queue = state.seed_compiles, len(state.seeds), state.queue
    first = refinement_first(state)
    queued = [(pricing_rank("seed", i, n_seeds, refinement_first=first), f"seed {i}", f)
              for i, f in enumerate(seed_compiles, 1)]
    queued += [(r.rank, f"seed {r.index}'s {r.kind} layout", r.compiling) for r in refined]
    _, what, lead = min(queued, key=lambda q: q[0])   # the compile that runs first
    state.progress.stage(f"iteration 1: compiling {what} before the sharding ILPs")
    concurrent.futures.wait([lead])
    ilp_rank = pricing_rank("ilp", 0, n_seeds)
    ahead = [f for i, f in enumerate(seed_compiles, 1)
             if pricing_rank("seed", i, n_seeds, refinement_first=first) < ilp_rank]
    ahead += [r.compiling for r in refined if r.rank < ilp_rank]
    waiting = sum(1 for f in ahead if not f.done())
    room = queue.compiles_left()
    if room >= waiting + 1:
        return "", False
    counted = state.budget.compiles_left(len(queue.done))
    if counted is not None and counted <= room:    # the count decided, not the clock
        return (f"the compile budget ({state.budget.compiles}) holds {counted} more compile(s) "
                f"and the ILP's best would be compile {waiting + 1} after the first seed's"), False
    return (f"the time budget holds {room} more compile(s) of about "
            f"{queue.expected_compile_s:.1f} s and the ILP's best would be compile "
            f"{waiting + 1} after the first seed's"), True


def first_iteration_ilps(state: LoopState, ilp: Budget, rec: IterationRecord
                         ) -> tuple[list[PricingItem], str]:
    """The first iteration's seed cases before its ILPs: the seeds' refinements (small ILPs,
    solved first so that the first seed's refinement is queued before that seed has compiled),
    then, when there are meshes to solve, the wait for the first compile
    (``first_compile_alone``); the ILPs' share (``ilp``) moves by that wait.

    Args:
      state: the loop's state; ``state.seeds`` is not empty.
      ilp: the iteration's ILP share of the budget.
      rec: the iteration's record (refinements, skips and when the ILPs started are filed).

    Returns:
      (the refinements and retimed twins queued, why the ILPs are skipped: "" to solve them).
    """
    queue = state.queue
    refined = refine_seeds(state, ilp, rec)
    if not state.meshes:
        return refined, ""
    if state.screener is not None:    # nothing compiles before the ILP's layouts are screened
        return refined, _first_screen_alone(state, ilp, rec)
    queue.contended(False)
    waited = clock()
    skip, by_clock = first_compile_alone(state, refined)
    rec.ilps_started_s = round(state.budget.elapsed(), 3)
    ilp.extend(clock() - waited)   # the ILPs' share, shifted by the wait
    queue.contended(True)
    if skip:
        rec.changes.append(f"sharding ILPs skipped: {skip}")
        if by_clock:               # a compile count's skip is repeatable: not a time limit
            rec.time_limited.append(f"sharding ILPs of iteration 1: skipped ({skip})")
        state.progress.note(f"sharding ILPs skipped ({skip})")
    return refined, skip


def _first_screen_alone(state: LoopState, ilp: Budget, rec: IterationRecord) -> str:
    """With screening: wait for the pricing order's first screen, then say why the first
    iteration's ILPs are not solved ("" to solve them): the time budget alone (no compile count)
    cannot hold the ILPs' share, a screen of their best and a full compile of the screen's best
    (``Screener.room_for``). Filed in ``rec``; the ILPs' share moves by the wait."""
    queue = state.queue
    queue.contended(False)
    waited = clock()
    state.progress.stage("iteration 1: screening the first seed before the sharding ILPs")
    state.screener.wait_first()
    rec.ilps_started_s = round(state.budget.elapsed(), 3)
    ilp.extend(clock() - waited)
    queue.contended(True)
    skip = state.screener.room_for(ilp.left())
    if skip:
        skip = f"the time budget cannot hold them: {skip}"
        rec.changes.append(f"sharding ILPs skipped: {skip}")
        rec.time_limited.append(f"sharding ILPs of iteration 1: skipped ({skip})")
        state.progress.note(f"sharding ILPs skipped ({skip})")
    return skip


def seed_pricing_items(state: LoopState, refined: list[PricingItem],
                       ilp_best: ShardingSolution | None) -> list[PricingItem]:
    """The first iteration's seeds (their compiles queued by ``queue_seed_compiles``) and their
    refinements, to price with the ILP's layouts, in the order they compile.

    Args:
      state: the loop's state.
      refined: ``first_iteration_ilps``' refinements and twins.
      ilp_best: the ILP's best solution, kept in each seed's certificate; None without one.

    Returns:
      The seeds as ``PricingItem`` (kind "seed") followed by ``refined``.
    """
    n, first = len(state.seeds), refinement_first(state)
    return [PricingItem("seed", i, pricing_rank("seed", i, n, refinement_first=first),
                        dict(sd.layout.mesh_axes), seed_solution(sd.layout, ilp_best), f, seed=sd)
            for i, (sd, f) in enumerate(zip(state.seeds, state.seed_compiles), 1)] + refined
