"""The planner's loop: ILPs -> compiles -> placement and price -> feedback, until it settles.

One iteration (``aoizora.planner``'s module docstring has the whole story):
  1. ``ilp_step.solve_ilps``: every mesh's ILP layouts, ranked by Q1 (and in the first
     iteration the seeds' refinements);
  2. ``queue_compiles``: the layouts to price, in the pricing order (``pricing_order``; the
     seeds and refinements in the first iteration), each queued to compile at its place;
  3. ``price_candidates``: each compiled layout placed and priced by Q2
     (``candidate_pricing.place``); the least Q2 step so far is the best; a layout that does
     not fit in HBM is forbidden in its mesh's ILP;
  4. ``feedback.apply_feedback``: what the priced candidates change in the ILPs.
It stops when an iteration brings no new layout (the plan repeats), when no mesh has a layout
left, when a compile could not start for the budget, or after ``max_iterations``.
"""

from __future__ import annotations

import math

from aoizora.planning import time_limits
from aoizora.planning.candidate import Candidate, layout_id, mesh_str
from aoizora.planning.candidate_pricing import compile_job, levels_proven, place
from aoizora.planning.compile_queue import Skipped
from aoizora.planning.feedback import apply_feedback
from aoizora.formulation.calibration import mesh_key
from aoizora.planning.ilp_step import solve_ilps
from aoizora.planning.loop_state import IterationRecord, LoopState, new_record
from aoizora.planning_errors import BudgetError, PlanningError
from aoizora.planning.pricing_order import PricingItem, diverse, pricing_rank, with_unproven_near
from aoizora.planning.seeds import seed_pricing_items
from aoizora.planning.tile_retry import retile_overflowing
from aoizora.formulation.remat import REMAT_KEY, remat_key
from aoizora.solvers.stop import checkpoint


def iterate(state: LoopState) -> None:
    """Run the iterations; ``state.best``, ``state.stop_reason`` and ``state.iterations`` hold
    the outcome. Raises PlanningError / BudgetError when nothing can be priced."""
    for it in range(1, state.settings.max_iterations + 1):
        rec = new_record(it)
        state.iterations.append(rec)   # kept as it is if an interrupt ends the iteration
        seeded = it == 1 and bool(state.seeds)   # the first iteration's seed cases: ``seeds``
        state.queue.reserve_compiles = feedback_reserve(state, seeded)
        ranked, refined = solve_ilps(state, it, rec, seeded)
        if not ranked and not seeded:
            _nothing_ranked(state, it)
            break
        todo = queue_compiles(state, ranked, refined if seeded else None)
        if todo is None:
            state.stop_reason = "the ILP's best layouts repeat: the plan converged"
            rec.changes.append(state.stop_reason)
            break
        this_iter = price_candidates(state, it, todo, rec)
        apply_feedback(state, it, this_iter, rec)
        rec.best_q2_step_s = state.best.q2.step_s if state.best else None
        rec.elapsed_s = round(state.budget.elapsed(), 3)
        rec.completed = True
        if state.stop_reason:
            break
    else:
        state.stop_reason = f"{state.settings.max_iterations} iterations"


def feedback_reserve(state: LoopState, seeded: bool) -> int:
    """Compiles of a count budget the first iteration leaves for the ILP's layout after the
    first feedback: 1 with seeds and at least 3 compiles (and a second iteration allowed), else
    0. Seeds and their refinements would otherwise take every compile of a small count, so the
    ILP's corrected layout, what the feedback is for, was never priced."""
    n = state.budget.compiles
    return int(seeded and n is not None and n >= 3 and state.settings.max_iterations > 1)


def _nothing_ranked(state: LoopState, it: int) -> None:
    """No ILP layout on any mesh: an error in the first iteration when no layout fits in HBM,
    or when the budget ran out before anything was priced; else the loop stops."""
    if it == 1 and state.ilps.memory_errors:
        raise PlanningError(min(state.ilps.memory_errors, key=len))
    if not state.priced and state.budget.over():
        raise BudgetError(
            f"the time budget ({state.budget.total_s:g} s) is too small: the sharding ILP found "
            f"no layout within it on {state.program.target.name}, so nothing was compiled; "
            f"raise the budget")
    state.stop_reason = "no layout left to try on any mesh"


def distinct_untried(ranked: list, seen: set[str]) -> list:
    """The (Q1, mesh, solution) of ``ranked``, in its order, whose layout was not compiled yet
    (``seen``: ``layout_id``s) and not already listed: two ILP answers that differ only in
    choices the realized layout does not show (the k-best's second answer where no other kv
    way exists) are one program, compiled once."""
    out, ids = [], set(seen)
    for q1, m, sol in ranked:
        lid = layout_id(m, sol.layout)
        if lid not in ids:
            ids.add(lid)
            out.append((q1, m, sol))
    return out


def queue_compiles(state: LoopState, ranked: list, refined: list[PricingItem] | None
                   ) -> list[PricingItem] | None:
    """The iteration's layouts in the pricing order: the fresh ILP layouts (``diverse``,
    ``with_unproven_near``), and in the first iteration with seeds (``refined`` not None: the
    seeds' refinements) the seeds and their refinements (``seeds.seed_pricing_items``), every
    compile queued at its place (``pricing_rank``) to run in the background while the ones
    before it are placed and priced. None when there is nothing new to compile (the plan
    converged)."""
    prog, queue = state.program, state.compiles_to()
    ranked.sort(key=lambda r: (r[0], mesh_str(r[1])))
    untried = distinct_untried(ranked, state.seen)
    picked = diverse(untried, state.settings.top_k)
    fresh = with_unproven_near(picked, untried)
    lead = 1 + len(fresh) - len(picked)   # the best and its unproven near-ties
    if not fresh and refined is None:
        return None
    n_seeds = len(state.seeds) if refined is not None else 0
    todo = []
    for k, (q1, m, sol) in enumerate(fresh):
        rank = pricing_rank("ilp", k, n_seeds, lead)
        todo.append(PricingItem("ilp", k, rank, m, sol, queue.submit(
            compile_job(prog.fn, prog.args, prog.target, sol.layout, m,
                        compile_fn=state.seams.compile_layout, cache=prog.cache),
            priority=rank), q1_s=q1))
    queue.release()   # the ILP's layouts are queued: the seeds held after them may start
    if refined is not None:   # priced in the order they compile (``seeds.queue_seed_compiles``)
        todo += seed_pricing_items(state, refined, ranked[0][2] if ranked else None)
    todo.sort(key=lambda t: t.rank)
    if state.screener is None:
        return todo
    checkpoint()
    rec = state.iterations[-1]
    rec.screens = rec.screens or []
    state.progress.stage(f"iteration {rec.iteration}: screening {len(todo)} layout(s) by early "
                         f"evidence")
    todo = state.screener.order(todo, rec.screens)   # the full compiles in screen order
    state.progress.stage(f"iteration {rec.iteration}: compiling the screened layouts fully, "
                         f"best screen price first")
    return todo


def price_candidates(state: LoopState, it: int, todo: list[PricingItem], rec: IterationRecord
                     ) -> list[Candidate]:
    """Wait for each compile in ``todo``'s order, place and price it; returns the candidates
    priced. A compile the budget did not start stops the loop after this iteration (what
    compiled before it is still priced)."""
    this_iter: list[Candidate] = []
    for k, item in enumerate(todo, 1):
        m, sol, q1 = item.mesh, item.solution, item.q1_s
        what = (f"Q1 {q1 * 1e3:.3f} ms (predicted, placement-oblivious)" if math.isfinite(q1)
                else f"seed layout {sol.layout.name}")
        state.progress.candidate(k, len(todo), f"mesh {mesh_str(m)}, {what}; compiling for "
                                               f"{state.program.target.name}")
        state.stop.check()
        got = item.compiling.result()
        state.stop.check()            # an interrupt abandoned the compile
        if isinstance(got, Skipped):
            _skipped(state, m, sol, got, rec)
            continue
        state.seen.add(layout_id(m, sol.layout))
        got, sol = retile_overflowing(state, item, got, sol)
        state.seen.add(layout_id(m, sol.layout))
        cand = place(Candidate(it, dict(m), sol, seed=item.seed), got, state.program, state.budget,
                     state.settings, state.progress, state.seams.solve_placement,
                     state.seams.choose_by_step)
        rec.time_limited += time_limits.placement(
            f"placement of mesh {mesh_str(m)} {sol.layout.name}", cand.placement_cert,
            state.settings.placement_time_s)
        if state.on_candidate is not None:
            state.on_candidate(cand)
        _record(state, cand, rec)
        this_iter.append(cand)
    return this_iter


def _skipped(state: LoopState, m, sol, got: Skipped, rec: IterationRecord) -> None:
    if got.before_first:
        raise BudgetError(
            f"the time budget ({state.budget.total_s:g} s) ran out before the first compile "
            f"(the sharding ILPs took {rec.ilps_done_s:.1f} s); raise the budget")
    if not got.budget:               # the submitter's reason, not the budget's
        rec.changes.append(f"compile of mesh {mesh_str(m)} {sol.layout.name}: not started "
                           f"({got.reason})")
        return
    state.stop_reason = got.reason   # what compiled before it is still priced
    if not got.clock:                # the compile count decided: repeatable, not a time limit
        rec.changes.append(f"compile of mesh {mesh_str(m)} {sol.layout.name}: not started "
                           f"({got.reason})")
        return
    rec.time_limited.append(f"compile of mesh {mesh_str(m)} {sol.layout.name}: not "
                            f"started ({got.reason})")


def _record(state: LoopState, cand: Candidate, rec: IterationRecord) -> None:
    """File a priced candidate: over budget, forbidden in its ILP when it does not fit in HBM,
    the new best when its Q2 step is the least so far."""
    m, sol = cand.mesh_axes, cand.solution
    if not state.priced and state.budget.over():
        # a compile cannot be interrupted: the time is spent, so the first priced
        # candidate is returned (the plan says by how much the budget was exceeded)
        state.over_budget = (
            f"over budget: the first compile took {cand.compile_s:.1f} s and the candidate was "
            f"priced {-state.budget.left():.1f} s past the {state.budget.total_s:g} s budget")
    rec.candidates.append(cand.summary())
    if cand.fits is False and sol.choice and mesh_key(m) in state.mesh_state:
        # the (layout, remat) pair: a remat choice is cut with the layout (formulation.remat)
        state.mesh_state[mesh_key(m)].forbidden.append(
            {**sol.choice, REMAT_KEY: remat_key(sol.layout.remat)})
        rec.changes.append(f"mesh {mesh_str(m)} layout {sol.layout.name}"
                           f"{'' if sol.layout.remat is None else ' with its remat'}: does "
                           f"not fit in HBM -> forbidden in the ILP")
    if cand.q2 is None:
        return
    state.priced.append(cand)
    best = state.best
    if best is None or cand.q2.step_s < best.q2.step_s:
        if best is not None:
            rec.changes.append(
                f"new best: mesh {mesh_str(m)} {sol.layout.name}, Q2 "
                f"{cand.q2.step_s * 1e3:.3f} ms (was {best.q2.step_s * 1e3:.3f} ms)")
        state.best = cand
        # the reserve is for annealing the best's placement: none if it is proven
        state.queue.reserve_s = 0.0 if levels_proven(cand.placement_cert) else state.anneal_reserve
