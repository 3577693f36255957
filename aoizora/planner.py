"""The planner's loop: sharding ILP -> realize -> compile for the target -> evidence -> placement
CP-SAT -> price (Q2) -> feed the priced evidence back into the ILP -> solve again.

One iteration:
  1. For each candidate logical mesh m, solve the sharding ILP (``solvers.sharding``) for its
     ``top_k`` best distinct layouts under the current axis costs ``A[m]``, corrections ``C[m]``
     and forbidden combinations ``F[m]``. Rank every (m, layout) by Q1 (placement-oblivious).
     The ILPs of one iteration may use ``ILP_SHARE`` of the remaining budget (smaller meshes
     first; a mesh whose last solve would not fit is skipped and the skip recorded). With seed
     layouts, the first iteration's ILPs start once the first seed has compiled alone, and only
     if the budget still holds the ILP's best after the compiles ranked before it
     (``_first_compile_alone``).
  2. Take the ``top_k`` best layouts not compiled before: the best, then the best of the other
     kind (some attention's keys/values in a ring, or none; the ILP's second best is asked to
     run them the other way, ``distinct="kv"``: Q1 prices a ring's overlap least reliably),
     then by Q1; right after the best, every other mesh's best layout that its ILP did not
     prove optimal, whose bound is below the best's Q1 and whose Q1 is within 1% of it
     (``_with_unproven_near``: the solver could not separate them, so a compile does). In the
     first iteration the seed layouts (e.g. today's expert configurations, each possibly with
     its own program variant) and their refinements (``aoizora.seed_refinement``: the ILP with
     the seed's attention fixed chooses the parameter layout around it; skipped when it keeps
     the seed's; solved before the meshes' ILPs, each in under a second on Wan 2.1 1.3B) come
     first: the first seed, its refinement, the second seed, the ILP's best, the second seed's
     refinement, then each other seed followed by its refinement, then the ILP's other layouts
     (``_pricing_rank``, which says why). For each:
     realize it as shardings (``aoizora.realize``) on the target's devices in JAX's default
     order, compile ahead of time with libtpu (``extract.aot_compile``), read the evidence. A
     layout that does not fit in HBM joins ``F[m]``. Else solve the placement CP-SAT
     (``solvers.placement``); keep the least Q2 step among its answer, the placements it priced
     and a swap descent (``solvers.placement_step``: the latency term breaks link-load
     near-ties); price with Q2.
  3. Feedback, per mesh, from its best priced candidate:
       - collective costs (``formulation.axis_feedback``, which states the math): the effective
         bandwidth of every logical axis under the chosen placement; per axis and collective
         kind, what the step paid for that kind (its exposed share of the link time, from Q2);
         meshes with no compiled ILP layout yet take the kinds' costs measured on the others;
       - attention compute, from every ILP layout compiled so far (all meshes pooled): per
         attention node and kv mode (gathered, ring), the compiler's compute time over Q1's
         (``formulation.attention_calibration``; realize scopes each attention node so its
         compiled ops name it). Every mesh's ILP then scales its attention compute by it;
       - the compute of every other op, from every ILP layout compiled so far: one pooled
         factor, compiled over Q1's (``formulation.compute_calibration``; Q1 prices ops
         unfused), on every mesh's ILP (``Options.compute_scale``);
       - layouts that did not fit in HBM stay forbidden.
     Not yet: per-op corrections for the other ops and for communication the compiler added or
     removed against the ILP's assumptions (``corrections`` in the ILP is ready; mapping HLO
     collectives back onto ILP groups needs finer provenance than the shared layer code gives).
  4. Stop when an iteration brings no new layout (the plan repeats), after ``max_iterations``, or
     when the time budget cannot fit another compile. Keep the best plan by Q2. Unless its
     placement is proven on every level (link load, link bytes, hops), the time left anneals
     it twice, from a heuristic's usual starts (with CP-SAT's budget: what a heuristic search
     with the same budget would have) and from the placement kept (``placement_time_s``); the
     least Q2 step is kept. The annealing makes as many swaps as its budget buys whatever the
     clock says (``placement_heuristics.evaluation_budget``), the time left only capping it.

The time budget bounds the whole call, compiles included; the next compile starts only when the
longest a compile took alone so far still fits (``CompileQueue.expected_compile_s``) before the
deadline less a reserve for the last candidate's placement and that annealing (twice
``placement_time_s``, at most ``ANNEAL_RESERVE`` of the budget: ``_anneal_reserve``; none while
the best placement so far is proven on every level). When the budget cannot hold one compile,
``BudgetError``.

Compiles run one at a time on a background thread (``aoizora.compile_queue``), in the pricing
order above: the first seed compiles alone (while the seeds' refinements solve), its
refinement then while the ILPs solve, and each layout while the one before it is placed and
priced. Candidates are priced in that order, and
in the first iteration also compiled in it: the seeds after the ILP's best are held until the
ILPs have queued it (``CompileQueue.hold``), so which layouts a budget leaves uncompiled does
not depend on how long the ILPs took. ``Plan.time_limited`` lists each place where a time limit
did bind (``aoizora.time_limits``): where it is empty, the plan is repeatable.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import math
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from aoizora import time_limits
from aoizora.compile_queue import CompileQueue, Skipped
from aoizora.extract.aot_compile import (CompileError, compile_evidence, compiler_identity,
                                         target_mesh)
from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.program_ir import build_ir
from aoizora.extract.targets import Target, get_target
from aoizora.formulation.attention_calibration import (attention_samples,
                                                       compiled_attention_seconds,
                                                       fit_attention_scale,
                                                       scales)
from aoizora.formulation.calibration import Calibration, mesh_key
from aoizora.formulation.compute_calibration import compute_sample
from aoizora.formulation.axis_feedback import (effective_axis_costs, pool_kind_ratios,
                                              transferred_axis_costs)
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.latency import Q2, predict_step
from aoizora.formulation.layout import Layout
from aoizora.formulation.meshes import candidate_meshes
from aoizora.formulation.strategies import Options
from aoizora.plans import Plan, program_key
from aoizora.seed_refinement import RefinementError, refine_seed
from aoizora.progress import Progress
from aoizora.realize import RealizeError, realize
from aoizora.solvers.budget import Budget
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.placement import LEVELS, PlacementResult, solve_placement
from aoizora.solvers.placement_heuristics import annealing, annealing_starts, evaluation_budget
from aoizora.solvers.placement_step import choose_by_step
from aoizora.solvers.sharding import (MemoryBudgetError, ShardingProblem, ShardingSolution,
                                     ShardingSolveError, solve_sharding)


ILP_SHARE = 0.4   # of the remaining budget, per iteration, for the sharding ILPs
UNPROVEN_NEAR = 0.01   # an unproven mesh's best layout this close to the best by Q1 compiles too
ANNEAL_RESERVE = 0.1   # of the budget, at most: no compile starts into the reserve
RESERVE_PLACEMENTS = 2   # the reserve, in placement_time_s: the last compile's placement, then the
                         # final annealing from a heuristic's starts, each up to placement_time_s


class PlanningError(ValueError):
    """Planning cannot go on: a one-line reason and what to do."""


class BudgetError(PlanningError):
    """The time budget is too small for one compile of the program."""


@dataclasses.dataclass
class Seed:
    """A given layout to price alongside the ILP's, optionally of its own variant of the program
    (e.g. an expert configuration that pads the sequence less): ``fn`` / ``args`` default to the
    planned program; ``program`` says what differs (recorded in the plan, e.g. pad_multiple)."""

    layout: Layout
    fn: Callable | None = None
    args: tuple | None = None
    program: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Candidate:
    """One (mesh, layout) the loop compiled and priced."""

    iteration: int
    mesh_axes: dict[str, int]
    solution: ShardingSolution
    evidence: Evidence | None = None
    fits: bool | None = None
    placement: list[int] | None = None
    placement_cert: Certificate | None = None
    q2: Q2 | None = None
    q2_default: Q2 | None = None
    default_order: list[int] | None = None
    compile_s: float = 0.0
    compile_started_s: float | None = None   # seconds into planning (compiles run in background)
    error: str = ""
    seed: Seed | None = None          # set when the layout was given, not solved

    @property
    def q1_s(self) -> float:
        return float(self.solution.predicted.get("total_s", math.inf))

    def summary(self) -> dict[str, Any]:
        return {
            "mesh": dict(self.mesh_axes), "layout": self.solution.layout.name,
            "q1_s": self.q1_s if math.isfinite(self.q1_s) else None,
            "seed": self.seed.program if self.seed is not None else None, "fits_hbm": self.fits, "compile_s": round(self.compile_s, 3),
            "compile_started_s": (round(self.compile_started_s, 3)
                                  if self.compile_started_s is not None else None),
            "q2_step_s": self.q2.step_s if self.q2 else None,
            "q2_default_order_step_s": self.q2_default.step_s if self.q2_default else None,
            "placement_status": self.placement_cert.status if self.placement_cert else None,
            "error": self.error or None,
        }


def _layout_id(mesh_axes: dict[str, int], layout: Layout) -> str:
    d = layout.to_json()
    d.pop("name", None)
    return json.dumps([mesh_axes, d], sort_keys=True)


def _link_seconds(q2: Q2, network: Network) -> list[dict[str, Any]]:
    """Per directed link: seconds of traffic per step under the plan (sum over phases x runs)."""
    L = network.num_links
    tot = np.zeros(L)
    counts = {}
    for ph in q2.phases:     # the classes of one phase share its count (one loop body)
        counts[ph.phase] = max(counts.get(ph.phase, 0), ph.count)
    for phase, loads in q2.link_loads.items():
        n = max(counts.get(int(phase), 1), 1)
        tot += n * np.asarray(loads, dtype=float) / network.link_bandwidth_Bps
    out = []
    for lid in range(L):
        a, b = network.link(lid)
        out.append({"from": list(network.chips[a]), "to": list(network.chips[b]),
                    "seconds": float(tot[lid])})
    return out


def _check_plan_args(abstract_args, seed, workers, placement_time_s, ilp_time_s) -> None:
    """Refuse, in one line that says what to pass, what ``plan`` cannot use."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise PlanningError(f"seed={seed!r}: give a whole number (the solvers' seed, default 0)")
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise PlanningError(f"workers={workers!r}: give a whole number of solver threads, 1 or "
                            "more (default 1)")
    for name, v in (("placement_time_s", placement_time_s), ("ilp_time_s", ilp_time_s)):
        if not isinstance(v, (int, float, np.number)) or not math.isfinite(v) or v <= 0:
            raise PlanningError(f"{name}={v!r}: give a positive, finite number of seconds")
    for i, a in enumerate(abstract_args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                where = f"argument {i}{jax.tree_util.keystr(path)}"
                raise PlanningError(
                    f"{where} is of type {type(leaf).__name__}, which has no shape and dtype: pass "
                    "jax.ShapeDtypeStruct or arrays (bind static values into fn, e.g. with "
                    "functools.partial)")


def plan(fn: Callable, *abstract_args, target: "str | Target" = "v5e-8",
         time_budget_s: float = 300.0, seed: int = 0, top_k: int = 2,
         meshes: Sequence[dict[str, int]] | None = None, max_iterations: int = 4,
         placement_time_s: float = 10.0, ilp_time_s: float = 20.0, workers: int = 1,
         verify: bool = True, progress: Progress | None = None,
         on_candidate: Callable[[Candidate], None] | None = None,
         seed_layouts: Sequence["Layout | Seed"] = (),
         calibration: "Calibration | Plan | None" = None) -> Plan:
    """Plan ``fn(*abstract_args)`` for ``target`` within ``time_budget_s`` seconds (compiles
    included). ``abstract_args``: pytrees of ``jax.ShapeDtypeStruct`` or arrays. Returns the best
    plan by Q2 with both solvers' certificates and the record of every iteration.
    ``on_candidate``: called with every compiled and priced ``Candidate`` (its evidence included),
    e.g. for benchmarks that re-price the candidates the planner tried.
    ``seed_layouts``: known layouts of this same program (e.g. today's expert configurations)
    priced alongside the ILP's in the first iteration: each is compiled, placed by CP-SAT and
    priced by Q2 like the rest; the best by Q2 wins whichever produced it, and the plan says so.
    ``calibration``: what an earlier plan's loop learned on this target (``Plan.calibration``, or
    the plan itself): the ILP starts from its collective costs and attention scales instead of
    the defaults (``formulation.calibration``); a calibration from another target is refused."""
    t0 = time.perf_counter()
    if not math.isfinite(float(time_budget_s)) or time_budget_s <= 0:
        raise BudgetError(f"time budget {time_budget_s} s: give a positive, finite number of "
                          "seconds")
    deadline = t0 + float(time_budget_s)
    progress = progress or Progress()
    tgt = get_target(target)
    if int(top_k) != top_k or top_k < 1:
        raise PlanningError(f"top_k={top_k}: give the number of layouts to compile per "
                            "iteration, 1 or more (default 2)")
    if int(max_iterations) != max_iterations or max_iterations < 1:
        raise PlanningError(f"max_iterations={max_iterations}: give 1 or more (default 4)")
    _check_plan_args(abstract_args, seed, workers, placement_time_s, ilp_time_s)
    if isinstance(calibration, Plan):
        if calibration.calibration is None:
            raise PlanningError("that plan records no calibration (made before calibrations were "
                                "recorded); re-plan it, or plan without calibration")
        calibration = calibration.calibration
    if calibration is not None:
        calibration.check_target(tgt.name)
    progress.stage(f"tracing the program for {tgt.short_name} ({tgt.name}, {tgt.num_devices} devices)")
    key = program_key(fn, abstract_args, tgt.name)
    try:
        ir = build_ir(fn, *abstract_args)
    except Exception as e:  # noqa: BLE001 -- a user function that fails to trace
        raise PlanningError(f"cannot trace the program: {str(e).splitlines()[0]}") from e
    network = Network.from_target(tgt)
    mesh_list = [dict(m) for m in (meshes if meshes is not None
                                   else candidate_meshes(tgt.num_devices))]
    if not mesh_list and not seed_layouts:
        raise PlanningError("nothing to plan: meshes=[] and no seed_layouts; pass meshes=None "
                            "(every factorization of the chip count), a mesh, or a seed layout")
    # what the loop learns, starting from the calibration given (formulation.calibration)
    given = calibration or Calibration(tgt.name)
    learned = Calibration(tgt.name, dict(given.axis_costs),
                          {k: list(v) for k, v in given.kind_pool.items()},
                          {a: dict(m) for a, m in given.attention_scale.items()},
                          compute_pool=list(given.compute_pool))
    state = {}
    for m in mesh_list:
        default = default_axis_costs(tgt, m)
        costs = given.costs_for(m) or (transferred_axis_costs(default, given.kind_ratios)
                                       if given.kind_ratios else default)
        state[mesh_key(m)] = {"costs": costs, "corrections": {}, "forbidden": [], "default": default,
                           "measured": given.costs_for(m) is not None}
    iterations: list[dict[str, Any]] = []
    best: Candidate | None = None
    stop_reason = ""
    queue = CompileQueue(Budget.until(deadline, t0), (CompileError, RealizeError),
                         reserve_s=_anneal_reserve(time_budget_s, placement_time_s))
    seeds = [sd if isinstance(sd, Seed) else Seed(sd) for sd in seed_layouts]
    # the seeds compile (in the background) while the first iteration's ILPs solve
    # (priority = place in the first iteration's pricing order, ``_pricing_rank``)
    if seeds and mesh_list:   # the seeds after the ILP's best wait for it (``CompileQueue.hold``)
        queue.hold(_pricing_rank("ilp", 0, len(seeds)))
    seed_compiles = [queue.submit(functools.partial(
        compile_layout, sd.fn or fn, sd.args if sd.args is not None else abstract_args, tgt,
        sd.layout, default_device_order(tgt, sd.layout.mesh_axes)),
        priority=_pricing_rank("seed", i, len(seeds)))
        for i, sd in enumerate(seeds, 1)]
    try:
        best, stop_reason, over_budget = _iterate(
            fn, abstract_args, tgt, network, mesh_list, state, learned, seeds, seed_compiles,
            queue, ir, iterations, t0, deadline, time_budget_s, seed, top_k, max_iterations,
            ilp_time_s, placement_time_s, workers, progress, on_candidate)
    finally:
        queue.close()
    max_compile_s = queue.expected_compile_s

    annealed, anneal_limited = (
        _anneal_best(best, network, deadline, placement_time_s, seed, progress)
        if best is not None else ("", []))
    if best is None:
        errs = [c.get("error") for r in iterations for c in r["candidates"] if c.get("error")]
        oom = [c for r in iterations for c in r["candidates"] if c.get("fits_hbm") is False]
        if oom and not errs:
            raise PlanningError(f"no compiled layout fits in HBM on {tgt.name} "
                                f"({len(oom)} tried); use a larger slice or a smaller workload")
        raise PlanningError(f"no layout could be compiled and priced for {tgt.name}: "
                            f"{errs[0] if errs else stop_reason}")
    progress.stage(f"best: mesh {_mstr(best.mesh_axes)}, Q2 {best.q2.step_s * 1e3:.3f} ms "
                   f"(predicted); stopped: {stop_reason}")
    program: dict[str, Any] = {}
    if best.seed is not None and best.seed.fn is not None:
        fn, abstract_args = best.seed.fn, best.seed.args
        key = program_key(fn, abstract_args, tgt.name)
        program = dict(best.seed.program)
    if over_budget:
        stop_reason = f"{stop_reason}; {over_budget}"
    learned.source = {"program": key.fingerprint, "input_shapes": list(key.input_shapes),
                      "compiled": sum(1 for r in iterations for c in r["candidates"]
                                      if c.get("compile_s")),
                      "iterations": len(iterations),
                      "started_from": calibration.source if calibration is not None else None}
    time_limited = [w for r in iterations for w in r.pop("time_limited", [])]
    time_limited += [f"final annealing of the plan's placement{f' ({annealed})' if annealed else ''}"
                     f": {w}" for w in anneal_limited]
    return _finish(fn, abstract_args, tgt, network, key, best, iterations, stop_reason, t0,
                   deadline, verify, max_compile_s, progress, program, learned, time_limited)


def _iterate(fn, abstract_args, tgt, network, mesh_list, state, learned, seeds, seed_compiles,
             queue, ir, iterations, t0, deadline, time_budget_s, seed, top_k, max_iterations,
             ilp_time_s, placement_time_s, workers, progress, on_candidate):
    """The loop's iterations (the module docstring's steps 1-4); appends to ``iterations``.
    Updates ``learned`` (a ``Calibration``) with what it measures.
    Returns (best candidate or None, stop reason, over-budget note)."""
    kind_pool = learned.kind_pool            # kind -> [sum w r, sum w] (transferred_axis_costs)
    seen: set[str] = set()
    given_scale = learned.attention_scale    # from the calibration given, if any
    attention_scale = given_scale            # node / "*" -> kv mode -> factor on Q1
    attention_fit: list = []                 # the AttentionSamples it is fitted on
    compute_scale = learned.compute_scale    # factor on non-attention compute (compute_calibration)
    ilp_cache: dict[str, Any] = {}
    anneal_reserve = queue.reserve_s         # kept while the best placement is not proven
    ilp_seconds: dict[str, float] = {}
    last_best: dict[str, tuple[str, list[str]]] = {}   # mesh -> the ILP's last best layout
    priced: list[Candidate] = []
    memory_errors: list[str] = []
    over_budget = ""
    best: Candidate | None = None
    stop_reason = ""

    for it in range(1, max_iterations + 1):
        rec: dict[str, Any] = {"iteration": it, "candidates": [], "feedback": {}, "changes": [],
                               "decisions_changed": [], "time_limited": []}
        progress.stage(f"iteration {it}: sharding ILP on {len(mesh_list)} logical meshes")
        ranked: list[tuple[float, dict[str, int], ShardingSolution]] = []
        # The ILPs may use up to ILP_SHARE of what is left, so that compiles still fit; meshes
        # with fewer axes (smaller ILPs) go first.
        ilp_deadline = time.perf_counter() + ILP_SHARE * (deadline - time.perf_counter())
        queue.contended(True)
        refined = []
        if it == 1 and seeds:
            # the seeds' refinements first (each a small ILP, well under a second on Wan 2.1
            # 1.3B), so that the first seed's refinement is queued before that seed has compiled
            refined = _refine_seeds(seeds, fn, abstract_args, ir, tgt, attention_scale,
                                    compute_scale, ilp_deadline, ilp_time_s, seed, progress, rec,
                                    queue)
        skip_ilps = ""
        if it == 1 and seeds and mesh_list:
            queue.contended(False)
            waited = time.perf_counter()
            skip_ilps = _first_compile_alone(seed_compiles, refined, len(seeds), queue, progress)
            rec["ilps_started_s"] = round(time.perf_counter() - t0, 3)
            ilp_deadline += time.perf_counter() - waited   # the ILPs' share, shifted by the wait
            queue.contended(True)
            if skip_ilps:
                rec["changes"].append(f"sharding ILPs skipped: {skip_ilps}")
                rec["time_limited"].append(f"sharding ILPs of iteration 1: skipped ({skip_ilps})")
                progress.note(f"sharding ILPs skipped ({skip_ilps})")
        meshes_now = [] if skip_ilps else sorted(mesh_list, key=lambda m: (len(m), list(m.values())))
        for m in meshes_now:
            st = state[mesh_key(m)]
            ckey = json.dumps([m, st["costs"].to_json(), st["corrections"], st["forbidden"],
                               attention_scale, compute_scale], sort_keys=True, default=str)
            expected = ilp_seconds.get(mesh_key(m), 0.0)  # what this mesh's ILP took last time
            if (ckey not in ilp_cache and ranked
                    and time.perf_counter() + expected > ilp_deadline):
                rec["changes"].append(f"mesh {_mstr(m)}: ILP skipped, the time budget is kept "
                                      f"for compiles")
                rec["time_limited"].append(f"sharding ILP on mesh {_mstr(m)}: skipped to keep "
                                           f"the budget for compiles")
                progress.note(f"mesh {_mstr(m)}: ILP skipped (time budget)")
                continue
            limit = max(1.0, min(ilp_time_s, ilp_deadline - time.perf_counter()))
            try:
                if ckey in ilp_cache:  # nothing changed for this mesh: same ILP, same answer
                    res = ilp_cache[ckey]
                else:
                    t_ilp = time.perf_counter()
                    res = ilp_cache[ckey] = solve_sharding(
                        ir, tgt, m, ShardingProblem(
                            axis_costs=st["costs"], corrections=st["corrections"],
                            forbidden=st["forbidden"] or None,
                            attention_scale=attention_scale or None,
                            options=Options(compute_scale=compute_scale)),
                        k_best=top_k, distinct="kv", time_limit_s=limit, seed=seed)
                    ilp_seconds[mesh_key(m)] = time.perf_counter() - t_ilp
                    for k, sol in enumerate(res.all()):
                        rec["time_limited"] += time_limits.sharding(
                            f"sharding ILP on mesh {_mstr(m)}"
                            + (f" (layout {k + 1} of the {top_k} best)" if k else ""),
                            sol.certificate)
            except MemoryBudgetError as e:
                memory_errors.append(str(e))
                progress.note(f"mesh {m}: {e}")
                continue
            except ShardingSolveError as e:
                progress.note(f"mesh {m}: {e}")
                continue
            c = res.certificate
            progress.solver(f"sharding ILP {_mstr(m)}", c.status, c.objective, c.bound)
            lid = _layout_id(m, res.best.layout)
            prev = last_best.get(mesh_key(m))
            if prev is not None and prev[0] != lid:
                before, after = set(prev[1]), set(res.best.words)
                rec["decisions_changed"].append({
                    "mesh": dict(m), "why": "feedback: collective costs per axis and kind, "
                                            "compiled attention compute",
                    "before": sorted(before - after), "after": sorted(after - before)})
                rec["changes"].append(f"mesh {_mstr(m)}: the ILP's best layout changed after the "
                                      f"feedback ({len(after - before)} op layouts differ)")
            last_best[mesh_key(m)] = (lid, list(res.best.words))
            for sol in res.all():
                ranked.append((float(sol.predicted.get("total_s", math.inf)), m, sol))
        queue.contended(False)
        rec["ilps_done_s"] = round(time.perf_counter() - t0, 3)
        if not ranked and not (it == 1 and seeds):
            if it == 1 and memory_errors:
                raise PlanningError(min(memory_errors, key=len))
            if not priced and time.perf_counter() > deadline:
                raise BudgetError(
                    f"the time budget ({time_budget_s:g} s) is too small: the sharding ILP found "
                    f"no layout within it on {tgt.name}, so nothing was compiled; raise the budget")
            stop_reason = "no layout left to try on any mesh"
            iterations.append(rec)
            break
        ranked.sort(key=lambda r: (r[0], _mstr(r[1])))
        untried = [(q1, m, s) for q1, m, s in ranked if _layout_id(m, s.layout) not in seen]
        diverse = _diverse(untried, top_k)
        fresh = _with_unproven_near(diverse, untried)
        lead = 1 + len(fresh) - len(diverse)   # the best and its unproven near-ties
        if not fresh and not (it == 1 and seeds):
            stop_reason = "the ILP's best layouts repeat: the plan converged"
            rec["changes"].append(stop_reason)
            iterations.append(rec)
            break
        # (q1, mesh, solution, seed or None, its compile), in the pricing order: every compile
        # is queued now (priority: its place in that order, ``_pricing_rank``) and runs in the
        # background while the ones before it are placed and priced
        n_seeds = len(seeds) if it == 1 else 0
        ilp_best = ranked[0][2] if ranked else None
        ranks = [_pricing_rank("ilp", k, n_seeds, lead) for k in range(len(fresh))]
        todo = [(r, q1, m, sol, None, queue.submit(functools.partial(
                    compile_layout, fn, abstract_args, tgt, sol.layout,
                    default_device_order(tgt, m)), priority=r))
                for r, (q1, m, sol) in zip(ranks, fresh)]
        queue.release()   # the ILP's layouts are queued: the seeds held after them may start
        if it == 1:
            todo += [(_pricing_rank("seed", i, n_seeds), math.inf, dict(sd.layout.mesh_axes),
                      _seed_solution(sd.layout, ilp_best), sd, f)
                     for i, (sd, f) in enumerate(zip(seeds, seed_compiles), 1)]
            todo += [(_pricing_rank("refined", i, n_seeds), math.inf,
                      dict(rsd.layout.mesh_axes), sol, rsd, rf) for i, rsd, sol, rf in refined]
        todo = [t[1:] for t in sorted(todo, key=lambda t: t[0])]
        this_iter: list[Candidate] = []
        for k, (q1, m, sol, sd, compiling) in enumerate(todo, 1):
            what = (f"Q1 {q1 * 1e3:.3f} ms (predicted, placement-oblivious)" if math.isfinite(q1)
                    else f"seed layout {sol.layout.name}")
            progress.candidate(k, len(todo), f"mesh {_mstr(m)}, {what}; compiling for {tgt.name}")
            got = compiling.result()
            if isinstance(got, Skipped):
                if got.before_first:
                    raise BudgetError(
                        f"the time budget ({time_budget_s:g} s) ran out before the first compile "
                        f"(the sharding ILPs took {rec['ilps_done_s']:.1f} s); raise the budget")
                stop_reason = got.reason   # what compiled before it is still priced
                rec["time_limited"].append(f"compile of mesh {_mstr(m)} {sol.layout.name}: not "
                                           f"started ({got.reason})")
                continue
            seen.add(_layout_id(m, sol.layout))
            cand = _place(Candidate(it, dict(m), sol, seed=sd), got, tgt, network, deadline,
                          seed, workers, placement_time_s, progress)
            rec["time_limited"] += time_limits.placement(
                f"placement of mesh {_mstr(m)} {sol.layout.name}", cand.placement_cert,
                placement_time_s)
            if on_candidate is not None:
                on_candidate(cand)
            if not priced and time.perf_counter() > deadline:
                # a compile cannot be interrupted: the time is spent, so the first priced
                # candidate is returned (the plan says by how much the budget was exceeded)
                over_budget = (f"over budget: the first compile took {cand.compile_s:.1f} s and "
                               f"the candidate was priced {time.perf_counter() - deadline:.1f} s "
                               f"past the {time_budget_s:g} s budget")
            rec["candidates"].append(cand.summary())
            this_iter.append(cand)
            if cand.fits is False and sol.choice and mesh_key(m) in state:
                state[mesh_key(m)]["forbidden"].append(dict(sol.choice))
                rec["changes"].append(f"mesh {_mstr(m)} layout {sol.layout.name}: does not fit in "
                                      f"HBM -> forbidden in the ILP")
            if cand.q2 is not None:
                priced.append(cand)
                if best is None or cand.q2.step_s < best.q2.step_s:
                    if best is not None:
                        rec["changes"].append(
                            f"new best: mesh {_mstr(m)} {sol.layout.name}, Q2 "
                            f"{cand.q2.step_s * 1e3:.3f} ms (was {best.q2.step_s * 1e3:.3f} ms)")
                    best = cand
                    # the reserve is for annealing the best's placement: none if it is proven
                    queue.reserve_s = (0.0 if _levels_proven(cand.placement_cert)
                                       else anneal_reserve)
        # feedback: effective bandwidth per axis from each mesh's best priced candidate
        for m in mesh_list:
            mine = [c for c in this_iter if c.mesh_axes == m and c.q2 is not None
                    and not c.solution.certificate.detail.get("seed")]
            if not mine:
                continue
            c = min(mine, key=lambda c: c.q2.step_s)
            st = state[mesh_key(m)]
            st["costs"], detail = effective_axis_costs(c.evidence, c.placement, network,
                                                       st["costs"], c.q2)
            if detail:
                rec["feedback"][_mstr(m)] = detail
                for a, d in detail.items():
                    if "effective_bandwidth_Bps" in d:
                        rec["changes"].append(
                            f"mesh {_mstr(m)} axis {a}: effective bandwidth "
                            f"{d['effective_bandwidth_Bps'] / 1e9:.1f} GB/s under the best "
                            f"placement (ILP assumed {1 / d['beta_before_s_per_B'] / 1e9:.1f} GB/s)")
                    if d.get("by_kind"):
                        rec["changes"].append(
                            f"mesh {_mstr(m)} axis {a}: exposed cost per kind " + ", ".join(
                                f"{k} {v['exposed_share']:.2f} of its link time "
                                f"({1 / v['beta_s_per_B'] / 1e9:.1f} GB/s effective)"
                                for k, v in sorted(d["by_kind"].items())))
            pool_kind_ratios(kind_pool, detail, st["default"])
            st["measured"] = True
            learned.axis_costs[mesh_key(m)] = st["costs"]
        ratios = {k: sw / w for k, (sw, w) in sorted(kind_pool.items()) if w > 0}
        unmeasured = [m for m in mesh_list if not state[mesh_key(m)]["measured"]]
        if ratios and unmeasured:
            for m in unmeasured:
                st = state[mesh_key(m)]
                st["costs"] = transferred_axis_costs(st["default"], ratios)
            rec["feedback"]["transferred"] = {"meshes": [_mstr(m) for m in unmeasured],
                                              "ratio_to_default": ratios}
            rec["changes"].append(
                f"meshes {', '.join(_mstr(m) for m in unmeasured)} (no ILP layout compiled yet): "
                f"collective costs per kind from the compiled meshes, " + ", ".join(
                    f"{k} x{r:.2f}" for k, r in ratios.items()) + " of the default")
        # feedback: attention compute per node and kv mode, from every ILP layout compiled so far
        for c in this_iter:
            if c.evidence is not None and not c.solution.certificate.detail.get("seed"):
                attention_fit += attention_samples(
                    c.solution.attention, c.evidence, network,
                    f"it{it} {_mstr(c.mesh_axes)} {c.solution.layout.name}", q2=c.q2)
        # feedback: the compute of every other op, pooled over the ILP layouts compiled so far
        for c in this_iter:
            if (c.evidence is not None and c.q2 is not None
                    and not c.solution.certificate.detail.get("seed")
                    and "other_compute_s" in c.solution.predicted):
                smp = compute_sample(
                    c.solution.predicted["other_compute_s"], compute_scale, c.q2.compute_s,
                    sum(compiled_attention_seconds(c.evidence, network).values()),
                    f"it{it} {_mstr(c.mesh_axes)} {c.solution.layout.name}")
                if smp is not None:
                    learned.compute_pool[0] += smp.compiled_s
                    learned.compute_pool[1] += smp.q1_s
                    rec["feedback"].setdefault("compute", []).append(smp.to_json())
        if abs(learned.compute_scale - compute_scale) > 0.01 * compute_scale:
            rec["changes"].append(
                f"compute of the other ops: compiled {learned.compute_pool[0] * 1e3:.3f} ms against "
                f"Q1's {learned.compute_pool[1] * 1e3:.3f} ms (pooled) -> the ILP scales it by "
                f"{learned.compute_scale:.3f} (was {compute_scale:.3f})")
            compute_scale = learned.compute_scale
        fit = fit_attention_scale(attention_fit)
        fitted = scales(fit)     # replaces the given calibration's factor, node by node and mode
        merged = {a: {**given_scale.get(a, {}), **fitted.get(a, {})}
                  for a in sorted(set(given_scale) | set(fitted))}
        if merged != attention_scale:
            attention_scale = learned.attention_scale = merged
            rec["feedback"]["attention"] = fit
            for node, by_mode in fit.items():
                for mu, f in by_mode.items():
                    if node == "*":
                        continue
                    rec["changes"].append(
                        f"attention {node} (keys/values {'in a ring' if mu == 'ring' else 'gathered'})"
                        f": compiled compute {f['compiled_s'] * 1e3:.3f} ms against Q1's "
                        f"{f['q1_compute_s'] * 1e3:.3f} ms ({f['samples']} compiled) -> the ILP "
                        f"scales its compute by {f['scale']:.3f}")
        rec["best_q2_step_s"] = best.q2.step_s if best else None
        rec["elapsed_s"] = round(time.perf_counter() - t0, 3)
        iterations.append(rec)
        if stop_reason:
            break
    else:
        stop_reason = f"{max_iterations} iterations"
    return best, stop_reason, over_budget


def _uses_ring(layout: Layout) -> bool:
    return any(a.kv == "ring" for a in layout.attention.values())


def _diverse(ranked: list, k: int) -> list:
    """The `k` layouts to compile from `ranked` (Q1 order): the best, then the best of the other
    kind -- with some attention's keys/values in a ring, or all gathered (how much of a ring's
    traffic hides behind compute is what Q1 prices least reliably) -- then the rest by Q1."""
    firsts, rest, modes = [], [], set()
    for r in ranked:
        sig = _uses_ring(r[2].layout)
        (rest if sig in modes else firsts).append(r)
        modes.add(sig)
    return (firsts + rest)[:k]


def _with_unproven_near(fresh: list, untried: list) -> list:
    """``fresh`` (the layouts to compile, best first) with, right after its best, the best layout
    of every other mesh whose ILP stopped at its time limit (not proven optimal) with a bound
    below the best's Q1 and a Q1 within ``UNPROVEN_NEAR`` of it.

    Such a layout ranks behind the best only by what its solver had time to find: its bound
    says that mesh may hold a better layout than the best, and Q1's own error against the
    compiled programs (tens of percent) dwarfs the difference, so one more compile decides.
    Where every ILP proves its optimum, nothing is added. Without it, Wan 2.1 14B 480p-21f on
    v5e-16 planned 3.6% slower than the Alpa-style baseline in two runs on a slow machine
    (88e259d, dc203c1): the 2x4x2 ILP stopped 0.39% from its bound with a layout 0.1% behind
    4x2x2's by Q1, and was never compiled."""
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


def _refine_seeds(seeds, fn, abstract_args, ir, tgt, attention_scale, compute_scale,
                  ilp_deadline, ilp_time_s, seed, progress, rec, queue
                  ) -> list[tuple[int, Seed, ShardingSolution, Any]]:
    """Each seed's refinement (``aoizora.seed_refinement``), queued to compile right after its
    seed (``_pricing_rank``): [(the seed's place, 1-based; Seed of the refined layout, its
    solution, its compile)]. A seed that cannot be refined, or that the ILP leaves as it is, is
    noted in ``rec``; no refinement starts past the ILP deadline."""
    out = []
    irs: dict[int, Any] = {}
    for i, sd in enumerate(seeds, 1):
        if time.perf_counter() >= ilp_deadline:
            rec["changes"].append("seed refinement skipped: the time budget is kept for compiles")
            rec["time_limited"].append(f"seed refinement of {sd.layout.name} and the seeds after "
                                       f"it: skipped to keep the budget for compiles")
            break
        sfn = sd.fn or fn
        sargs = sd.args if sd.args is not None else abstract_args
        try:
            sir = ir if sd.fn is None else irs.get(id(sfn)) or build_ir(sfn, *sargs)
            irs[id(sfn)] = sir
            n_params = len(jax.tree_util.tree_leaves(sargs[0])) if sargs else 0
            ref = refine_seed(sir, tgt, sd.layout, range(n_params),
                              time_limit_s=max(1.0, min(ilp_time_s,
                                                        ilp_deadline - time.perf_counter())),
                              seed=seed, attention_scale=attention_scale or None,
                              compute_scale=compute_scale)
        except RefinementError as e:
            rec["changes"].append(f"seed {sd.layout.name}: not refined ({e})")
            continue
        if ref is None:
            rec["changes"].append(f"seed {sd.layout.name}: the ILP keeps its parameter layout")
            continue
        c = ref.solution.certificate
        progress.solver(f"seed refinement {sd.layout.name}", c.status, c.objective, c.bound)
        rec["time_limited"] += time_limits.sharding(f"seed refinement of {sd.layout.name}", c)
        rec.setdefault("refinements", []).append(ref.summary())
        rec["changes"].append(f"seed {sd.layout.name}: refined, the ILP lays out "
                              f"{ref.changed} parameter(s) otherwise around its attention")
        rsd = Seed(ref.layout, sd.fn, sd.args, dict(sd.program))
        sol = _seed_solution(ref.layout, ref.solution)
        sol.certificate.detail["note"] = (
            "a seed refined by the sharding ILP: the seed's attention and activation layout, the "
            "parameter layout of the ILP's solution with that attention fixed (ilp_best: that "
            "ILP's certificate); compiled and priced by Q2 like the others")
        sol = dataclasses.replace(
            sol, words=[f"{ref.layout.name}: {sd.layout.name} with the ILP's parameter layout "
                        f"(its attention kept)"] + list(ref.solution.words))
        f = queue.submit(functools.partial(
            compile_layout, sfn, sargs, tgt, ref.layout,
            default_device_order(tgt, ref.layout.mesh_axes)),
            priority=_pricing_rank("refined", i, len(seeds)))
        out.append((i, rsd, sol, f))
    return out


def _first_compile_alone(seed_compiles, refined, n_seeds: int, queue: CompileQueue,
                         progress: Progress) -> str:
    """Wait for the first seed's compile, which so has the cores to itself, then say whether the
    first iteration's sharding ILPs are worth solving: "" when the budget still holds the
    compiles ranked before the ILP's best (``_pricing_rank``: the first seed's refinement and
    the second seed) and the ILP's best itself, else why not.

    Until the first compile the planner cannot know what a compile costs. Solved beside it, the
    ILPs took one of the 2 cores: Wan 2.1 1.3B 480p-41f for v5e-16 compiled in 31.9 s beside
    25 s of ILPs against 17.6 s alone, and with a 60 s budget its refinement's compile no longer
    fitted, while the ILP's best, fourth in line, never could. With a long budget the ILPs lose
    nothing by starting later: their layouts are not compiled before the seeds ranked ahead of
    them anyway (``CompileQueue.hold``), and their deadline (``ILP_SHARE`` of the budget left
    when the iteration started) moves by the time they waited. Where the seeds' refinements
    (small ILPs, solved before) outlast the first compile, nothing waits and nothing moves:
    on Wan 2.1 14B each refinement may take its 20 s limit. (At ec95126 the ILPs took
    ``ILP_SHARE`` of what was left when they started, 72 s instead of 37 s after 59 s of
    refinements on Wan 14B 720p-21f for v5e-16, and the ILP's best no longer fitted.)"""
    progress.stage("iteration 1: compiling the first seed before the sharding ILPs")
    concurrent.futures.wait([seed_compiles[0]])
    ilp_rank = _pricing_rank("ilp", 0, n_seeds)
    ahead = [f for i, f in enumerate(seed_compiles, 1)
             if _pricing_rank("seed", i, n_seeds) < ilp_rank]
    ahead += [f for i, _, _, f in refined if _pricing_rank("refined", i, n_seeds) < ilp_rank]
    waiting = sum(1 for f in ahead if not f.done())
    room = queue.compiles_left()
    if room >= waiting + 1:
        return ""
    return (f"the time budget holds {room} more compile(s) of about "
            f"{queue.expected_compile_s:.1f} s and the ILP's best would be compile "
            f"{waiting + 1} after the first seed's")


def _pricing_rank(kind: str, i: int, n_seeds: int, lead: int = 1) -> float:
    """A compile's place in its iteration's pricing order, which is also its compile priority
    (``CompileQueue``: least first). ``kind`` "seed" or "refined": the i-th seed (1-based) or its
    refinement; "ilp": the i-th of the iteration's fresh ILP layouts (0-based), of which the first
    ``lead`` are the ILP's best and its unproven near-ties (``_with_unproven_near``).
    ``n_seeds``: the seeds in this iteration (the first only).

    With seeds: the first seed, its refinement, the second seed, the ILP's best (with its
    near-ties), the second seed's refinement, then each other seed followed by its refinement,
    then the ILP's other layouts. The seeds come in the order expected fastest first (the
    built-in ones: ``aoizora.builtin.SEED_ORDER``). In the grid's 31 cells (benchmarks/results/
    grid.md, 240 s budget) the plan was the first seed in 17, its refinement in 13 and the ILP's
    best in one (at cafe50a, the order first seed, refinement, ILP's best, other seeds), and
    where a compile takes 50 s (HunyuanVideo 720p-129f on v5e-16) three compiles fit: the second
    seed (cfg2_ulysses, there the fastest expert, simulated) goes before the ILP's best. Without
    seeds: the ILP's best (with its near-ties), then the rest."""
    if kind == "ilp":
        if i < lead:
            return (4 if n_seeds >= 2 else 3 if n_seeds else 0) + i / lead
        return 2 * n_seeds + 1 + i
    if i == 1:
        return 1.0 + (kind == "refined")
    if i == 2:
        return 3.0 if kind == "seed" else 5.0
    return float(2 * i + (kind == "refined"))


def _seed_solution(layout: Layout, ilp_best: ShardingSolution | None) -> ShardingSolution:
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


def _mstr(m: dict[str, int]) -> str:
    return "x".join(f"{k}{v}" for k, v in m.items())


def compile_layout(fn, args, tgt: Target, layout: Layout, device_order: Sequence[int],
                   compiler_options: dict[str, Any] | None = None) -> Evidence:
    """Realize `layout` on the target's devices in `device_order` and compile it ahead of time
    (``compiler_options``: libtpu options for this compile only, as ``compile_evidence`` takes)."""
    mesh = target_mesh(tgt, layout.mesh_axes, list(device_order))
    realized = realize(fn, args, layout, mesh)
    return compile_evidence(realized.fn, realized.args, mesh=mesh, target=tgt,
                            compiler_options=compiler_options)


def _place(cand: Candidate, got, tgt: Target, network: Network, deadline: float, seed: int,
           workers: int, placement_time_s: float, progress: Progress) -> Candidate:
    """Place and price one compiled candidate (``got``: its ``compile_queue.Compiled``)."""
    order = default_device_order(tgt, cand.mesh_axes)
    cand.default_order = order
    cand.compile_s, cand.compile_started_s = got.seconds, got.started_s
    if got.error:
        cand.error = got.error
        progress.note(f"skipped: {cand.error}")
        return cand
    ev = cand.evidence = got.evidence
    cand.fits = ev.memory.fits
    if not ev.memory.fits:
        progress.note(f"does not fit in HBM: {ev.memory.oom_message[:120]}")
        return cand
    limit = max(0.5, min(placement_time_s, (deadline - time.perf_counter()) * 0.25))
    res = solve_placement(ev, network, time_limit_s=limit, seed=seed, workers=workers, hint=order)
    # CP-SAT certifies the link-load term; among its answer, the other placements it priced and
    # a swap descent, keep the least Q2 step (the latency term breaks link-load near-ties)
    cands = res.candidates + [order]
    names = ["priced by CP-SAT's warm start"] * len(res.candidates) + ["default order"]
    res = choose_by_step(ev, network, res, cands, names=names,
                         time_limit_s=max(0.5, min(0.3 * placement_time_s,
                                                   0.1 * (deadline - time.perf_counter()))))
    c = res.certificate
    progress.solver("placement CP-SAT", c.status, c.objective, c.bound)
    cand.q2_default = predict_step(ev, order, network)
    if res.placement is None:
        cand.placement, cand.placement_cert, cand.q2 = order, c, cand.q2_default
    else:
        cand.placement, cand.placement_cert, cand.q2 = res.placement, c, res.q2
    return cand      # never worse than the default order: it is among choose_by_step's candidates


def _anneal_reserve(time_budget_s: float, placement_time_s: float) -> float:
    """The time no compile starts into while the best placement is not proven: enough for the
    last compiled candidate's placement and then the final annealing from a heuristic's starts,
    each up to ``placement_time_s`` (``RESERVE_PLACEMENTS`` of it), and at most ``ANNEAL_RESERVE``
    of the budget. With one ``placement_time_s`` only, the last candidate's placement took part
    of the annealing's time: Wan 14B 480p-41f on v5e-16 annealed for 8.8 s where the grid's
    annealing baseline, from the same starts, had 10 s, and found a placement 0.04% faster
    (simulated)."""
    return min(RESERVE_PLACEMENTS * float(placement_time_s), ANNEAL_RESERVE * float(time_budget_s))


def _anneal_best(best: Candidate, network: Network, deadline: float, placement_time_s: float,
                 seed: int, progress: Progress) -> tuple[str, list[str]]:
    """With the time left after the last compile: unless the best candidate's placement is
    proven on every level CP-SAT optimizes (``_levels_proven``), anneal twice: first from the
    starts a placement heuristic would take (the default order and every axis-order placement,
    ``solvers.placement_heuristics.annealing``'s usual starts) with the budget CP-SAT had on it
    (``time_limit_s`` of its certificate; a heuristic search "with the same budget"), then from
    the placement kept so far with ``placement_time_s``; keep the least Q2 step among the answer
    and both (``choose_by_step``). CP-SAT can stall above what swaps reach (Wan 14B on v5e-16),
    and a proof of the link-load level alone leaves the placements that tie on it unranked by
    the per-hop latency Q2 adds (Wan 14B 480p-41f on v5e-16: 4.3 ms of Q2 apart). Each run makes
    the swaps its budget buys (``placement_heuristics.evaluation_budget``), the time left only
    capping it, so the first run is the grid's annealing baseline itself (same evidence, starts,
    seed and budget) whenever the clock does not cut it. The loop's reserve
    (``_anneal_reserve``) holds the last candidate's placement and the heuristic's run; the
    heuristic's run goes first so that a shortfall (a compile over its expected time) falls on
    the second.
    Returns what it did, in words ("" when it did not run), and where the clock cut it (a run
    cut or not started, the final swap descent cut): ``Plan.time_limited``'s entries."""
    left = deadline - time.perf_counter() - 1.0
    cert = best.placement_cert
    if cert is None or _levels_proven(cert) or best.evidence is None:
        return "", []
    if left < 0.5:
        return "", [f"not run, {max(left, 0.0):.1f} s left"]
    ev = best.evidence
    heuristic_starts = annealing_starts(network, list(ev.mesh_axes.values()),
                                        best.default_order or range(ev.num_devices))
    runs = [("annealing from the heuristic starts", heuristic_starts,
             float(cert.time_limit_s or placement_time_s)),
            ("annealing from the placement kept", [best.placement], placement_time_s)]
    found, names, spent, limited, record = [], [], 0.0, [], []
    for name, starts, limit in runs:
        left = deadline - time.perf_counter() - 1.0
        if left < 0.5:
            limited.append(f"{name}: not run, {max(left, 0.0):.1f} s left")
            break
        sa = annealing(ev, network, time_limit_s=min(limit, left), seed=seed, starts=starts,
                       max_evaluations=evaluation_budget(limit))
        d = sa.certificate.detail
        if d.get("cut"):
            limited.append(f"{name}: cut at the {min(limit, left):.1f} s left ({d['cut']})")
        found.append(sa.placement)
        names.append(name)
        spent += sa.certificate.time_s
        record.append({"run": name, "budget_s": limit, "starts": len(starts),
                       "swaps_asked": d.get("evaluations_asked"), "swaps": d.get("iterations"),
                       "cut": d.get("cut"), "time_s": sa.certificate.time_s,
                       "step_s": sa.q2.step_s})
    res = PlacementResult(list(best.placement), cert, best.q2, [])
    res = choose_by_step(ev, network, res, found, names=names,
                         time_limit_s=max(0.2, min(2.0, deadline - time.perf_counter())))
    if res.certificate.detail["step_choice"].get("descent_cut") == "time limit":
        limited.append("the swap descent after it stopped at its time limit")
    res.certificate.detail["final_annealing"] = record
    did = (f"{spent:.1f} s ({len(found)} runs), Q2 {res.q2.step_s * 1e3:.3f} ms (was "
           f"{best.q2.step_s * 1e3:.3f} ms)")
    progress.note(f"placement not proven on every level: annealing for {did}")
    best.placement, best.placement_cert, best.q2 = res.placement, res.certificate, res.q2
    return did, limited


def _levels_proven(cert: Certificate) -> bool:
    """The placement is proven optimal on each level of CP-SAT's lexicographic objective (link
    load, link bytes, flow hops: ``solvers.placement.solve_placement``), not only the first."""
    levels = (cert.detail or {}).get("levels") or {}
    return cert.status == "OPTIMAL" and all(
        (levels.get(name) or {}).get("status") == "OPTIMAL"
        for name in LEVELS)


def _named_words(fn, args, words: list[str]) -> list[str]:
    """The ILP's words with each attention op named by its role (self / cross / text)."""
    from aoizora.models.experts import attention_roles

    roles = attention_roles(fn, args)
    out = []
    for w in words:
        head, _, rest = w.partition(":")
        key = w.rsplit(" [", 1)[-1].split()[0].rstrip("]") if " [" in w else ""
        if head == "attention" and roles.get(key):
            w = f"{roles[key]}-attention:{rest}"
        out.append(w)
    return out


def _finish(fn, args, tgt, network, key, best: Candidate, iterations, stop_reason, t0, deadline,
            verify, max_compile_s, progress, program, learned: Calibration,
            time_limited: list[str]) -> Plan:
    q2 = best.q2
    device_coords = [tuple(int(v) for v in network.chips[network.device_chip[d]])
                     for d in best.placement]
    notes = [f"stopped: {stop_reason}",
             "latencies are predictions of the Q2 link-load model on the compiled TPU program; "
             "nothing was run on a TPU", time_limits.summary(time_limited)]
    if learned.source.get("started_from") is not None:
        src = learned.source["started_from"]
        notes.append(f"started from a calibration ({src.get('compiled', '?')} compiles of program "
                     f"{str(src.get('program', '?'))[:12]}, input shapes "
                     f"{', '.join(src.get('input_shapes', [])[:1]) or '?'}...)")
    fits = best.fits
    if verify and (deadline - time.perf_counter()) > 1.2 * max_compile_s + 0.5:
        progress.stage("verifying: compiling the plan with its own device order")
        ev = compile_layout(fn, args, tgt, best.solution.layout, best.placement)
        fits = ev.memory.fits
        same = ev.placement_open() == {**best.evidence.placement_open()}
        notes.append(f"verified: compiles for {tgt.name} in the planned device order, "
                     f"{'fits' if fits else 'does NOT fit'} in HBM"
                     f"{'' if same else ' (evidence differs from the default-order compile)'}")
    else:
        notes.append("not re-compiled in the planned device order (time budget); HBM use is "
                     "placement-independent and was read from the default-order compile")
    certs = {"sharding": best.solution.certificate, "placement": best.placement_cert}
    proven = all(c is not None and c.status == "OPTIMAL" for c in certs.values())
    mem = best.evidence.memory
    predicted = {
        "step_s": q2.step_s, "compute_s": q2.compute_s, "communication_s": q2.communication_s,
        "latency_s": q2.latency_s, "link_time_s": q2.link_time_s, "model": q2.model,
        "kind": "predicted",
        "default_order_step_s": best.q2_default.step_s if best.q2_default else None,
        "q1_step_s": best.q1_s if math.isfinite(best.q1_s) else None,
        "links": _link_seconds(q2, network),
    }
    return Plan(
        key=key, target=tgt.name, layout=best.solution.layout, device_order=list(best.placement),
        device_coords=device_coords, predicted=predicted, certificates=certs,
        iterations=iterations, planning_time_s=time.perf_counter() - t0,
        layout_in_words=_named_words(fn, args, best.solution.words), fits_hbm=fits,
        hbm_bytes_per_device=int(mem.total_bytes), status="OPTIMAL" if proven else "NOT PROVEN",
        notes=notes, program=program, calibration=learned, time_limited=time_limited,
        compiler=compiler_identity())
