"""Step 1 of an iteration: the sharding ILPs of every candidate mesh, ranked by Q1.

For each mesh m (fewer axes first: smaller ILPs), the ILP (``solvers.sharding``) for its
``top_k`` best distinct layouts (the second run the other kv way, ``distinct="kv"``) under the
mesh's current collective costs, corrections and forbidden combinations (``MeshState``) and the
loop's attention and compute scales. The ILPs of one iteration share the budget's ``ilp``
share, each at most ``ilp_time_s`` (the ``ilp_solve`` share); a mesh whose last solve would
not fit in what is left is skipped (once something is ranked) and the skip recorded. An ILP
whose inputs did not change gives the same answer: it is memoized, not solved again.

In the first iteration with seeds, the seeds' refinements solve first (``aoizora.planning.seeds``), then
the ILPs wait for the first seed's compile and start only if the budget still holds the ILP's
best (``seeds.first_iteration_ilps``); their share moves by the time they waited.
"""

from __future__ import annotations

import math

from aoizora.planning import time_limits
from aoizora.planning.candidate import layout_id, mesh_str
from aoizora.formulation.calibration import mesh_key
from aoizora.formulation.strategies import Options
from aoizora.planning.loop_state import IterationRecord, LoopState
from aoizora.planning.pricing_order import PricingItem
from aoizora.planning.seeds import first_iteration_ilps
from aoizora.solvers.budget import Budget, clock
from aoizora.runtime.rematerialize import retraceable
from aoizora.solvers.sharding import MemoryBudgetError, ShardingProblem, ShardingSolveError
from aoizora.solvers.stop import checkpoint


def solve_ilps(state: LoopState, it: int, rec: IterationRecord, seeded: bool
               ) -> tuple[list, list[PricingItem]]:
    """(ranked, refined): every mesh's ILP layouts as (Q1 seconds, mesh, ShardingSolution), and
    with ``seeded`` (the first iteration with seeds) the seeds' refinements, solved first
    (``seeds.first_iteration_ilps``)."""
    queue, progress = state.queue, state.progress
    progress.stage(f"iteration {it}: sharding ILP on {len(state.meshes)} logical meshes")
    ranked: list = []
    # The ILPs may use up to their share of what is left, so that compiles still fit
    ilp = state.budget.child("ilp")
    queue.contended(True)
    refined, skip_ilps = first_iteration_ilps(state, ilp, rec) if seeded else ([], "")
    meshes_now = [] if skip_ilps else sorted(state.meshes, key=lambda m: (len(m), list(m.values())))
    for m in meshes_now:
        ranked += _solve_mesh(state, m, ilp, rec, bool(ranked))
    queue.contended(False)
    rec.ilps_done_s = round(state.budget.elapsed(), 3)
    return ranked, refined


def _solve_mesh(state: LoopState, m: dict[str, int], ilp: Budget, rec: IterationRecord,
                something_ranked: bool) -> list:
    """Mesh ``m``'s ILP layouts as (Q1, mesh, solution); [] when skipped (the budget, once
    ``something_ranked``) or when no layout fits or the solver found none (noted)."""
    checkpoint()
    progress, key = state.progress, mesh_key(m)
    ckey = state.ilp_inputs_key(m)
    expected = state.ilps.seconds.get(key, 0.0)  # what this mesh's ILP took last time
    if ckey not in state.ilps.answers and something_ranked and expected > ilp.left():
        rec.changes.append(f"mesh {mesh_str(m)}: ILP skipped, the time budget is kept "
                           f"for compiles")
        rec.time_limited.append(f"sharding ILP on mesh {mesh_str(m)}: skipped to keep "
                                   f"the budget for compiles")
        progress.note(f"mesh {mesh_str(m)}: ILP skipped (time budget)")
        return []
    limit = ilp.share_s("ilp_solve", state.settings.ilp_time_s)
    try:
        if ckey in state.ilps.answers:  # nothing changed for this mesh: same ILP, same answer
            res = state.ilps.answers[ckey]
        else:
            res = state.ilps.answers[ckey] = _solve(state, m, limit, rec)
    except MemoryBudgetError as e:
        state.ilps.memory_errors.append(str(e))
        progress.note(f"mesh {m}: {e}")
        return []
    except ShardingSolveError as e:
        progress.note(f"mesh {m}: {e}")
        return []
    c = res.certificate
    progress.solver(f"sharding ILP {mesh_str(m)}", c.status, c.objective, c.bound)
    _note_changed_best(state, m, res, rec)
    return [(float(sol.predicted.get("total_s", math.inf)), m, sol) for sol in res.all()]


def _solve(state: LoopState, m: dict[str, int], limit: float, rec: IterationRecord):
    """Solve mesh ``m``'s ILP within ``limit`` seconds; record its time and where a limit bound."""
    st, top_k = state.mesh_state[mesh_key(m)], state.settings.top_k
    t_ilp = clock()
    res = state.seams.solve_sharding(
        state.program.ir, state.program.target, m, ShardingProblem(
            axis_costs=st.costs, corrections=st.corrections, forbidden=st.forbidden or None,
            attention_scale=state.scales.attention or None,
            options=Options(compute_scale=state.scales.compute),
            remat="decide" if retraceable(state.program.fn) else "stacks"),
        k_best=top_k, distinct="kv", time_limit_s=limit, seed=state.settings.seed)
    state.ilps.seconds[mesh_key(m)] = clock() - t_ilp
    for k, sol in enumerate(res.all()):
        rec.time_limited += time_limits.sharding(
            f"sharding ILP on mesh {mesh_str(m)}"
            + (f" (layout {k + 1} of the {top_k} best)" if k else ""),
            sol.certificate)
    return res


def _note_changed_best(state: LoopState, m: dict[str, int], res, rec: IterationRecord) -> None:
    """Record when mesh ``m``'s best layout differs from its last (the feedback changed it)."""
    lid = layout_id(m, res.best.layout)
    prev = state.ilps.last_best.get(mesh_key(m))
    if prev is not None and prev[0] != lid:
        before, after = set(prev[1]), set(res.best.words)
        rec.decisions_changed.append({
            "mesh": dict(m), "why": "feedback: collective costs per axis and kind, "
                                    "compiled attention compute",
            "before": sorted(before - after), "after": sorted(after - before)})
        rec.changes.append(f"mesh {mesh_str(m)}: the ILP's best layout changed after the "
                           f"feedback ({len(after - before)} op layouts differ)")
    state.ilps.last_best[mesh_key(m)] = (lid, list(res.best.words))
