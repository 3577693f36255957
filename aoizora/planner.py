"""The planner: sharding ILP -> realize -> compile for the target -> evidence -> placement
CP-SAT -> price (Q2) -> feed the priced evidence back into the ILP -> solve again.

``plan()`` checks its inputs, traces the program, makes the run's one time budget
(``solvers.budget.Budget``: one clock, every step's limit a named share of it) and compile
queue, and hands one ``LoopState`` to the loop; then anneals the best placement with the time
left and assembles the plan. The steps, each a module of its own:

  1. ``aoizora.planning.ilp_step``: for each candidate logical mesh m, the sharding ILP
     (``solvers.sharding``) for its ``top_k`` best distinct layouts under the current axis
     costs, corrections, forbidden combinations and compute scales; every (m, layout) ranked by
     Q1 (placement-oblivious). The ILPs of one iteration share the budget's ``ilp`` share
     (smaller meshes first; a mesh whose last solve would not fit is skipped and the skip
     recorded). With seed layouts, the first iteration's ILPs start once the first seed has
     compiled alone, and only if the budget still holds the ILP's best after the compiles
     ranked before it (``aoizora.planning.seeds``).
  2. ``aoizora.planning.pricing_order`` and ``aoizora.planning.seeds``: the ``top_k`` best layouts not compiled
     before: the best, then the best of the other kind (some attention's keys/values in a ring,
     or none), then by Q1; right after the best, every other mesh's best layout its ILP did not
     prove optimal within 1% of it by Q1 with a bound below it. In the first iteration the seed
     layouts (e.g. today's expert configurations, each possibly with its own program variant)
     and their refinements (``aoizora.planning.seed_refinement``) come first: the first seed, its
     refinement, the second seed, the ILP's best, the second seed's refinement, then each
     other seed followed by its refinement, then the ILP's other layouts (``pricing_rank``).
  3. ``aoizora.planning.candidate_pricing``: each realized as shardings (``aoizora.runtime.realize``) on the
     target's devices in JAX's default order, compiled ahead of time with libtpu
     (``extract.aot_compile``), its evidence read. A layout that does not fit in HBM joins its
     mesh's forbidden combinations. Else the placement CP-SAT (``solvers.placement``, on the
     budget's ``placement`` share) places it; the least Q2 step among its answer, the
     placements it priced and a swap descent is kept; priced with Q2.
  4. ``aoizora.planning.feedback``: per mesh, from its best priced candidate, the collective costs per
     axis and kind; from every ILP layout compiled so far, the attention compute per node and
     kv mode and the other ops' compute, as factors on Q1's.
  5. ``aoizora.planning.loop``: stop when an iteration brings no new layout (the plan repeats), after
     ``max_iterations``, or when the time budget cannot fit another compile. Keep the best plan
     by Q2. ``aoizora.planning.final_annealing``: unless its placement is proven on every level (link
     load, link bytes, hops), the time left anneals it twice; the least Q2 step is kept.
  6. ``aoizora.planning.plan_assembly``: the Plan, with both certificates, every iteration's record and
     what the loop learned (``Plan.calibration``).

With ``compiles=N`` (``solvers.budget``) at most N candidate compiles run once one fits, the
time budget a guard: the count, not the machine's load, decides which layouts are priced.
The time budget bounds the whole call, compiles included; the next compile starts only when the
longest a compile took alone so far still fits (``CompileQueue.expected_compile_s``, with the
budget's ``compile`` margin) before the deadline less the ``reserve`` share, kept for the last
candidate's placement and the final annealing (none while the best placement so far is proven
on every level). When the budget cannot hold one compile, ``BudgetError``.

Compiles run one at a time on a background thread (``aoizora.planning.compile_queue``), in the pricing
order above: the first seed compiles alone (while the seeds' refinements solve), its
refinement then while the ILPs solve, and each layout while the one before it is placed and
priced. The seeds after the ILP's best are held until the ILPs have queued it
(``CompileQueue.hold``), so which layouts a budget leaves uncompiled does not depend on how
long the ILPs took. ``Plan.time_limited`` lists each place where a time limit did bind
(``aoizora.planning.time_limits``): where it is empty, the plan is repeatable.

With ``screen=True`` (``aoizora.planning.screening``; the CLI's default) every layout above goes
first to a screen: its compile stopped after libtpu's HLO passes (a few seconds), priced from
those exact collectives and the ops' flops / bytes and attention kernel model; the ILPs do not
wait for a first compile; once an iteration's layouts are screened, their full compiles are
queued in screen-price order (and priced in that order), so a budget that holds one full
compile spends it on the screen's best. ``Plan.compiles`` counts the layouts screened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

from aoizora.planning.candidate import Candidate, Seed
from aoizora.planning.candidate_pricing import compile_layout
from aoizora.planning.seams import Seams
from aoizora.planning.compile_workers import WorkersError, workers_for
from aoizora.extract.aot_compile import CompileError
from aoizora.extract.evidence_cache import CacheError, EvidenceCache, open_cache
from aoizora.planning.solve_memo import SolveMemo
from aoizora.extract.network import Network
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import Target, get_target
from aoizora.planning.final_annealing import anneal_best, anneal_reserve
from aoizora.formulation.calibration import Calibration
from aoizora.formulation.layout import Layout
from aoizora.formulation.meshes import candidate_meshes
from aoizora.planning.interrupts import handling_signals
from aoizora.planning.loop import iterate
from aoizora.planning.loop_state import LoopState, Program, Settings, mesh_states
from aoizora.planning.plan_assembly import assemble, interrupted_error, no_plan_error
from aoizora.planning_errors import BudgetError, PlanningError
from aoizora.plans import Plan, program_key
from aoizora.planning.progress import Progress
from aoizora.runtime.realize import RealizeError
from aoizora.planning.screening import Screener
from aoizora.planning.seeds import queue_seed_compiles
from aoizora.solvers import stop as stopping
from aoizora.solvers.budget import Budget
from aoizora.solvers.stop import Interrupted, Stop

__all__ = ["plan", "Seed", "Candidate", "compile_layout", "PlanningError", "BudgetError"]


def _budget_seconds(time_budget_s) -> float:
    if (isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float, np.number))
            or not math.isfinite(float(time_budget_s)) or time_budget_s <= 0):
        raise BudgetError(f"time_budget_s={time_budget_s!r}: give a positive, finite number of "
                          "seconds (int or float, e.g. 300)", kind="input")
    return float(time_budget_s)


def _budget(time_budget_s, compiles) -> Budget:
    """The run's budget: ``time_budget_s`` seconds, and at most ``compiles`` candidate compiles
    if given (``solvers.budget``). Raises BudgetError on a bad number."""
    seconds = _budget_seconds(time_budget_s)
    try:
        return Budget(seconds, compiles=compiles)
    except (TypeError, ValueError):
        raise BudgetError(f"compiles={compiles!r}: give a whole number of compiles, 1 or more, "
                          "or None (the time budget alone)", kind="input") from None


def _check_fn(fn) -> None:
    if not callable(fn):
        raise PlanningError(f"fn is a {type(fn).__name__}, not a function: pass the function to "
                            "plan (e.g. plan(step, params, x)), its inputs after it",
                            kind="input")


def _check_shapes(abstract_args) -> None:
    """Every argument leaf has a shape and dtype, and every dimension a positive integer."""
    for i, a in enumerate(abstract_args):
        for path, leaf in jax.tree_util.tree_flatten_with_path(a)[0]:
            where = f"argument {i}{jax.tree_util.keystr(path)}"
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                raise PlanningError(
                    f"{where} is of type {type(leaf).__name__}, which has no shape and dtype: pass "
                    "jax.ShapeDtypeStruct or arrays (bind static values into fn, e.g. with "
                    "functools.partial)", kind="input")
            bad = [d for d in tuple(leaf.shape) if isinstance(d, bool)
                   or not isinstance(d, (int, np.integer)) or d <= 0]
            if bad:
                raise PlanningError(
                    f"{where} has shape {tuple(leaf.shape)}: dimension {bad[0]!r} is not a "
                    "positive integer; give every dimension a size of 1 or more (a zero-size "
                    "input has nothing to shard)", kind="input")


def _check_plan_args(abstract_args, seed, workers, placement_time_s, ilp_time_s, top_k,
                     max_iterations) -> None:
    """Refuse, in one line that says what to pass, what ``plan`` cannot use."""
    for name, v, what in (("top_k", top_k, "the number of layouts to compile per iteration, 1 "
                           "or more (default 2)"),
                          ("max_iterations", max_iterations, "1 or more (default 4)"),
                          ("workers", workers, "a whole number of solver threads, 1 or more "
                           "(default 1)")):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise PlanningError(f"{name}={v!r}: give {what}", kind="input")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise PlanningError(f"seed={seed!r}: give a whole number (the solvers' seed, default 0)",
                            kind="input")
    for name, v in (("placement_time_s", placement_time_s), ("ilp_time_s", ilp_time_s)):
        if (isinstance(v, bool) or not isinstance(v, (int, float, np.number))
                or not math.isfinite(v) or v <= 0):
            raise PlanningError(f"{name}={v!r}: give a positive, finite number of seconds",
                                kind="input")
    _check_shapes(abstract_args)


def _calibration_of(calibration: "Calibration | Plan | None", target: Target
                    ) -> Calibration | None:
    """The calibration to start from (a plan's own, if a plan is given), checked for target."""
    if isinstance(calibration, Plan):
        if calibration.calibration is None:
            raise PlanningError("that plan records no calibration (made before calibrations were "
                                "recorded); re-plan it, or plan without calibration")
        calibration = calibration.calibration
    if calibration is not None:
        calibration.check_target(target.name)
    return calibration


def _learning_from(given: Calibration | None, target: Target) -> Calibration:
    """What the loop learns, starting as a copy of the calibration given
    (``formulation.calibration``)."""
    given = given or Calibration(target.name)
    return Calibration(target.name, dict(given.axis_costs),
                       {k: list(v) for k, v in given.kind_pool.items()},
                       {a: dict(m) for a, m in given.attention_scale.items()},
                       compute_pool=list(given.compute_pool))


def _open_cache(cache) -> EvidenceCache | None:
    try:
        return open_cache(cache)
    except CacheError as e:
        raise PlanningError(str(e), kind="input") from None


def _workers(spec):
    try:
        return workers_for(spec)
    except WorkersError as e:
        raise PlanningError(str(e), kind="input") from None


def _trace(fn, abstract_args, target: Target):
    """(the plan key, the partitioner IR) of ``fn(*abstract_args)``; a PlanningError of kind
    "trace" naming the function and its first error line when it raises while traced."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        return program_key(fn, abstract_args, target.name), build_ir(fn, *abstract_args)
    except Exception as e:  # noqa: BLE001 -- a user function that fails to trace
        first = (str(e).strip().splitlines() or [""])[0]
        hint = ("; use jax.numpy, not numpy, on the traced values" if "Tracer" in type(e).__name__
                or "Tracer" in first else "")
        raise PlanningError(f"fn {name} raised while traced for the abstract inputs "
                            f"({type(e).__name__}: {first[:200]}){hint}; fix the function or "
                            f"its inputs' shapes and dtypes", kind="trace") from e


def plan(fn: Callable, *abstract_args, target: "str | Target" = "v5e-8",
         time_budget_s: float = 300.0, seed: int = 0, top_k: int = 2,
         meshes: Sequence[dict[str, int]] | None = None, max_iterations: int = 4,
         placement_time_s: float = 10.0, ilp_time_s: float = 20.0, workers: int = 1,
         verify: bool = True, progress: Progress | None = None,
         on_candidate: Callable[[Candidate], None] | None = None,
         seed_layouts: Sequence["Layout | Seed"] = (),
         calibration: "Calibration | Plan | None" = None,
         cache: "EvidenceCache | str | bool | None" = None,
         compile_workers: "str | int | Any | None" = None, seams: Seams | None = None,
         compiles: int | None = None, screen: bool = False) -> Plan:
    """Plans ``fn(*abstract_args)`` for ``target``: a mesh, a layout and a device order.

    Every candidate layout is compiled ahead of time by XLA:TPU, placed by CP-SAT and priced by
    Q2 on the compiled program; the plan is the best by Q2 (nothing runs on a TPU).

    Args:
      fn: the program, a JAX function (e.g. one denoising step, or a training step).
      *abstract_args: its arguments, pytrees of ``jax.ShapeDtypeStruct`` or arrays.
      target: a TPU slice, e.g. ``"v5e-8"`` or ``"v5e:2x4"``, or a resolved ``Target``.
      time_budget_s: wall-clock seconds for the whole planning, compiles included.
      seed: the solvers' seed (a whole number); the same seed gives the same plan.
      top_k: layouts compiled per mesh and iteration.
      meshes: the logical meshes to consider (axis name -> size); None: every factorization
        of the chip count.
      max_iterations: rounds of the loop (ILP, compiles, feedback), 1 or more.
      placement_time_s: seconds one placement (CP-SAT) may take at most; the budget's shares
        (``solvers.budget``) cut it to the time left.
      ilp_time_s: seconds one sharding ILP may take at most, cut the same way.
      workers: solver threads.
      verify: re-compile the plan in its device order before returning it.
      progress: where the stages are reported; default a ``Progress`` on stderr.
      on_candidate: called with every compiled and priced ``Candidate`` (its evidence
        included), e.g. for benchmarks that re-price the candidates the planner tried.
      seed_layouts: known layouts of this same program (``Layout`` or ``Seed``, e.g. the
        experts' configurations), priced alongside the ILP's in the first iteration; the best
        by Q2 wins whichever produced it, and the plan says so.
      calibration: what an earlier plan's loop learned on this target (``Plan.calibration``,
        or the plan itself): the ILP starts from its collective costs and attention scales.
      cache: the evidence cache (``extract.evidence_cache.open_cache``: None, no cache; True,
        the user cache directory; a directory; an ``EvidenceCache``); compiles found there are
        not run again, and the plan counts them (``Plan.compiles``).
      compile_workers: where compiles run (``aoizora.planning.compile_workers.workers_for``:
        None or "auto", as many local processes as the machine holds -- in-process when that is
        one; "inline"; "local:N"; "ray"; "ray://HOST:PORT"; or a workers object, which the
        caller closes).
      seams: the planner's replaceable parts (``aoizora.planning.seams.Seams``: the compile,
        the compile queue, the placement and sharding solvers, the annealing), for tests and
        benchmarks; None: the real ones.
      compiles: at most this many candidate compiles (None: the time budget alone decides how
        many); the time budget is then a guard. The count, unlike the clock, does not depend on
        the machine's load: the same inputs, seed and ``compiles`` give the same plan wherever
        no time limit binds (``Plan.time_limited``).
      screen: screen every layout by its early evidence before compiling it fully, and compile
        fully in screen-price order (``aoizora.planning.screening``; the CLI's default); TPU
        targets only (elsewhere a note says it was not done).

    Interrupts (``aoizora.planning.interrupts``): called in the main thread, ``plan`` handles
    SIGINT and SIGTERM for its duration (the previous handlers come back after). The first ends
    planning where it is (a CP-SAT search stopped, a solver process killed, the running compile
    abandoned, not awaited) and returns the best plan so far with ``status`` "INTERRUPTED", its
    notes and ``time_limited`` naming what was cut; a second raises KeyboardInterrupt.

    Returns:
      The best ``Plan`` by Q2, with both solvers' certificates, ``Plan.predicted`` (seconds
      per step, predicted by Q2) and the record of every iteration.

    Raises:
      BudgetError: ``time_budget_s`` is not a positive, finite number of seconds, or too small
        for one compile of the program, or ``compiles`` is below 1 (a PlanningError of kind
        "budget").
      PlanningError: with ``kind`` (``aoizora.planning_errors``): "input" (an argument ``plan``
        cannot use, named), "trace" (``fn`` raised while traced), "interrupted" (an interrupt
        before anything was priced), "no_plan" (nothing compiled or fitting); one line, with
        what to do.
      TargetError: ``target`` names no known slice (``aoizora.extract.targets``).
      CalibrationError: ``calibration`` was measured on another target.
    """
    budget = _budget(time_budget_s, compiles)
    progress = progress or Progress()
    _check_fn(fn)
    tgt = get_target(target)
    _check_plan_args(abstract_args, seed, workers, placement_time_s, ilp_time_s, top_k,
                     max_iterations)
    calibration = _calibration_of(calibration, tgt)
    stop = stopping.current()
    with contextlib.ExitStack() as scope:
        if stop is None:    # called as the API: this call handles SIGINT / SIGTERM itself
            stop = scope.enter_context(stopping.running(Stop()))
            scope.enter_context(handling_signals(stop))
        stop.active = True
        scope.callback(setattr, stop, "active", False)
        progress.stage(f"tracing the program for {tgt.short_name} ({tgt.name}, "
                       f"{tgt.num_devices} devices)")
        try:
            with stop.raising():
                key, ir = _trace(fn, abstract_args, tgt)
        except Interrupted as e:
            stop.request(str(e))
            raise interrupted_error(stop, budget) from None
        mesh_list = [dict(m) for m in (meshes if meshes is not None
                                       else candidate_meshes(tgt.num_devices))]
        if not mesh_list and not seed_layouts:
            raise PlanningError("nothing to plan: meshes=[] and no seed_layouts; pass meshes=None "
                                "(every factorization of the chip count), a mesh, or a seed "
                                "layout", kind="input")
        seams = seams or Seams()
        evidence_cache = _open_cache(cache)
        memo = None
        if evidence_cache is not None:     # solver answers no clock decided, kept beside it
            memo = SolveMemo(evidence_cache)
            seams = dataclasses.replace(seams, solve_sharding=memo.sharding(seams.solve_sharding),
                                        solve_placement=memo.placement(seams.solve_placement),
                                        annealing=memo.annealing(seams.annealing),
                                        choose_by_step=memo.step_choice(seams.choose_by_step),
                                        refine_seed=memo.refinement(seams.refine_seed))
        pool = compile_workers if hasattr(compile_workers, "run") else _workers(compile_workers)
        if pool is not compile_workers:
            scope.callback(pool.close)
        queue = seams.compile_queue(budget, (CompileError, RealizeError),
                                    reserve_s=anneal_reserve(budget, placement_time_s),
                                    workers=pool)
        state = LoopState(
            program=Program(fn, abstract_args, tgt, Network.from_target(tgt), ir,
                            evidence_cache, memo),
            settings=Settings(seed, top_k, max_iterations, ilp_time_s, placement_time_s, workers),
            budget=budget, queue=queue, meshes=mesh_list,
            mesh_state=mesh_states(tgt, mesh_list, calibration or Calibration(tgt.name)),
            learned=_learning_from(calibration, tgt), progress=progress,
            seeds=[sd if isinstance(sd, Seed) else Seed(sd) for sd in seed_layouts],
            on_candidate=on_candidate, stop=stop, seams=seams,
            screener=_screener(screen, queue, budget, tgt, seams, progress))
        return _run(state, key, calibration, verify)


def _screener(screen: bool, queue, budget: Budget, tgt: Target, seams: Seams,
              progress: Progress) -> Screener | None:
    """The screen (``aoizora.planning.screening``) when ``screen`` is asked and the target is
    a TPU (early evidence reads libtpu's dump); None otherwise (noted)."""
    if not screen:
        return None
    if getattr(tgt, "family", "tpu") != "tpu":
        progress.note(f"no screening on {tgt.name}: early evidence reads libtpu's dump")
        return None
    return Screener(queue, budget, seams.early_evidence, Network.from_target(tgt))


def _run(state: LoopState, key, calibration, verify: bool) -> Plan:
    """The loop, the final annealing and the plan; an interrupt (``state.stop``) ends the loop
    or the annealing where it is and the plan is assembled from the best so far, marked
    INTERRUPTED (``plan_assembly``); a PlanningError of kind "interrupted" if there is none."""
    stop, queue, budget = state.stop, state.queue, state.budget
    screener = state.screener
    with stop.cancelling(queue.abandon), stop.cancelling(
            screener.abandon if screener is not None else _nothing):
        try:
            with stop.raising():
                # the seeds compile (in the background) while the first iteration's ILPs solve
                queue_seed_compiles(state)
                iterate(state)
        except Interrupted as e:
            stop.request(str(e))
        finally:
            if screener is not None:
                screener.close()
            queue.close(wait=not stop.is_set())
    if stop.is_set():
        queue.abandon()
        state.stop_reason = f"interrupted by {stop.reason}"
    if state.best is None:
        raise interrupted_error(stop, budget) if stop.is_set() else no_plan_error(state)
    annealed = ("", ["not run: interrupted"]) if stop.is_set() else _anneal(state)
    return assemble(state, key, calibration, verify and not stop.is_set(),
                    queue.expected_compile_s, annealed)


def _nothing() -> None:
    return None


def _anneal(state: LoopState) -> tuple[str, list[str]]:
    """``final_annealing.anneal_best``, undone if an interrupt cuts it (the best is kept as
    the loop left it)."""
    best, s = state.best, state.settings
    kept = (best.placement, best.placement_cert, best.q2)
    try:
        with state.stop.raising():
            return anneal_best(best, state.program.network, state.budget, s.placement_time_s,
                               s.seed, state.progress, state.seams.annealing,
                               state.seams.choose_by_step)
    except Interrupted as e:
        state.stop.request(str(e))
        best.placement, best.placement_cert, best.q2 = kept
        return "", ["cut by the interrupt; the placement before it kept"]
