"""The plan from the loop's best candidate: layout, device order, Q2's prediction, both
solvers' certificates, the record of every iteration, where a time limit bound, what the loop
learned (``Plan.calibration``), and notes.

When the best is a seed with its own program variant, the plan is for that program (its key,
``Plan.program``). With ``verify`` and time left for one more compile (the budget's ``verify``
margin), the plan is compiled again in its own device order and its HBM fit read from that
compile. Before that, a plan whose attention has no tiles yet gets the kernel model's tiles
(``_tile``): compiled in the plan's device order, kept when Q2 prices them lower, and that
compile is then the verification. The plan's status is OPTIMAL only when both certificates
(sharding, placement) are; INTERRUPTED when an interrupt ended the run
(``aoizora.planning.interrupts``): the best plan found by then, its notes and ``time_limited``
naming what the interrupt cut (the solver it stopped, the compiles abandoned, the iterations,
annealing and re-compile not run).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from aoizora.planning.screening import describe
from aoizora.planning import time_limits
from aoizora.planning.candidate import Candidate, mesh_str
from aoizora.planning.candidate_pricing import cache_kw
from aoizora.extract.aot_compile import CompileError, compiler_identity
from aoizora.extract.network import Network
from aoizora.formulation.calibration import Calibration
from aoizora.formulation.latency import Q2, predict_step
from aoizora.planning.loop_state import LoopState
from aoizora.models.experts import attention_roles
from aoizora.planning_errors import PlanningError
from aoizora.plans import Plan, Predicted, program_key
from aoizora.runtime.realize import RealizeError
from aoizora.solvers.budget import Budget
from aoizora.solvers.stop import Interrupted, Stop
from aoizora.kernels.tiles import choose_tiles, laid_out_shapes, untiled


def no_plan_error(state: LoopState) -> PlanningError:
    """Why no candidate was priced, in one line."""
    its, tgt = state.iterations, state.program.target
    errs = [c.get("error") for r in its for c in r.candidates if c.get("error")]
    oom = [c for r in its for c in r.candidates if c.get("fits_hbm") is False]
    if oom and not errs:
        return PlanningError(f"no compiled layout fits in HBM on {tgt.name} "
                             f"({len(oom)} tried); use a larger slice or a smaller workload")
    return PlanningError(f"no layout could be compiled and priced for {tgt.name}: "
                         f"{errs[0] if errs else state.stop_reason}")


def interrupted_error(stop: Stop, budget: Budget) -> PlanningError:
    """The one line for an interrupt that came before any layout was priced (nothing to save)."""
    at = f" at {stop.at - budget.start:.1f} s" if stop.at is not None else ""
    return PlanningError(f"interrupted by {stop.reason or 'a signal'}{at}, before any layout "
                         f"was compiled and priced: no plan found yet, nothing saved; run "
                         f"again with a budget it can finish in", kind="interrupted")


def interrupted_cuts(state: LoopState, verifying: bool = False) -> list[str]:
    """What an interrupt cut, in words (``Plan.time_limited`` entries): the solver it stopped,
    the compiles abandoned, the iterations and steps not run; with ``verifying``, it came
    during the plan's re-compile in its device order (the loop and annealing had ended)."""
    stop, its = state.stop, state.iterations
    at = stop.at - state.budget.start if stop.at is not None else state.budget.elapsed()
    head = f"interrupted by {stop.reason} at {at:.1f} s"
    cut = list(stop.cut) + list(state.queue.abandoned)
    if verifying:
        cut.append("the re-compile of the plan in its device order (abandoned, not awaited)")
        return [f"{head}: {c}" for c in cut]
    out = [f"{head}: {c}" for c in cut]
    left = state.settings.max_iterations - len(its)
    if left > 0:
        out.append(f"{head}: iteration {len(its)} ended early, {left} more not run")
    else:
        out.append(f"{head}: the last iteration ended early")
    out.append(f"{head}: the final annealing and the re-compile in the planned device order "
               f"not run")
    return out


def assemble(state: LoopState, key, calibration: Calibration | None, verify: bool,
             max_compile_s: float, annealed: tuple[str, list[str]]) -> Plan:
    """The plan of ``state.best`` (module docstring). ``key``: the planned program's key;
    ``calibration``: the one the run started from; ``max_compile_s``: the longest compile alone;
    ``annealed``: what the final annealing did and where the clock cut it."""
    best, prog, learned = state.best, state.program, state.learned
    state.progress.stage(f"best: mesh {mesh_str(best.mesh_axes)}, Q2 "
                         f"{best.q2.step_s * 1e3:.3f} ms (predicted); stopped: "
                         f"{state.stop_reason}")
    fn, args, program = prog.fn, prog.args, {}
    if best.seed is not None and best.seed.fn is not None:
        fn, args = best.seed.fn, best.seed.args
        key = program_key(fn, args, prog.target.name)
        program = dict(best.seed.program)
    stopped_before = state.stop.is_set()
    vnotes: list[str] = []
    fits = _checked_fit(state, fn, args, verify, max_compile_s, vnotes)
    stop_reason = state.stop_reason
    interrupted = (interrupted_cuts(state, verifying=not stopped_before)
                   if state.stop.is_set() else [])
    if interrupted:
        stop_reason = interrupted[0].split(":")[0]
    if state.over_budget:
        stop_reason = f"{stop_reason}; {state.over_budget}"
    its = state.iterations
    learned.source = {"program": key.fingerprint, "input_shapes": list(key.input_shapes),
                      "compiled": sum(1 for r in its for c in r.candidates
                                      if c.get("compile_s")),
                      "iterations": len(its),
                      "started_from": calibration.source if calibration is not None else None}
    did, anneal_limited = annealed
    time_limited = [w for r in its for w in r.time_limited]
    time_limited += [f"final annealing of the plan's placement{f' ({did})' if did else ''}"
                     f": {w}" for w in anneal_limited if not interrupted]
    time_limited += interrupted
    notes = _notes(stop_reason, learned, time_limited, state.program.target.family)
    if interrupted:
        notes.insert(0, "INTERRUPTED: the best plan found before the interrupt; cut: "
                     + "; ".join(w.split(": ", 1)[1] for w in interrupted))
    if state.budget.compiles is not None:
        notes.append(f"budget: {state.budget.compiles} candidate compile(s), "
                     f"{state.budget.total_s:g} s of wall clock as a guard")
    if state.screener is not None:
        notes.append(describe(state.screener.counts, state.queue.counts["compiled"]))
    ir = state.program.ir
    if ir is not None:   # what the IR could not read (ops kept replicated, attention not taken)
        notes += [f"program: {w}" for w in (*getattr(ir, "warnings", ()), *getattr(ir, "notes", ()))]
    return _plan(state, key, fn, args, fits, notes + vnotes, program, time_limited)


def _checked_fit(state: LoopState, fn, args, verify: bool, max_compile_s: float,
                 notes: list[str]) -> bool | None:
    """The plan's HBM fit: from its re-compile in its device order (``_tile``, else
    ``_verify``) when ``verify`` and the budget holds one, else the default-order compile's
    (noted). The re-compile runs on a thread of its own and an interrupt abandons it
    (``Stop.raising``): the best is then kept as it was before it."""
    best = state.best
    if not (verify and state.budget.fits("verify", max_compile_s)):
        why = "interrupted" if state.stop.is_set() else "time budget"
        notes.append(f"not re-compiled in the planned device order ({why}); HBM use is "
                     "placement-independent and was read from the default-order compile")
        return best.fits
    kept = (best.solution.layout, best.evidence, best.q2, best.q2_default)
    try:
        with state.stop.raising():
            return best.fits if _tile(state, fn, args, notes) else _verify(state, fn, args,
                                                                          notes)
    except Interrupted as e:
        state.stop.request(str(e))
        best.solution.layout, best.evidence, best.q2, best.q2_default = kept
        notes.append("not re-compiled in the planned device order (interrupted during it); HBM "
                     "use is placement-independent and was read from the default-order compile")
        return best.fits


def _abandonable(compile_fn):
    """``compile_fn()`` on a daemon thread, waited for so that an interrupt (``Interrupted`` in
    the main thread) cuts the wait: the compile, native code, is abandoned, not awaited."""
    done: Future = Future()

    def run():
        try:
            done.set_result(compile_fn())
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting planner
            done.set_exception(e)

    threading.Thread(target=run, name="aoizora-verify", daemon=True).start()
    return done.result()


def _notes(stop_reason: str, learned: Calibration, time_limited: list[str],
           family: str = "tpu") -> list[str]:
    hw = family.upper()
    notes = [f"stopped: {stop_reason}",
             f"latencies are predictions of the Q2 link-load model on the compiled {hw} program "
             f"(XLA:{hw} ahead of time); nothing was run on a {hw}",
             time_limits.summary(time_limited)]
    if learned.source.get("started_from") is not None:
        src = learned.source["started_from"]
        notes.append(f"started from a calibration ({src.get('compiled', '?')} compiles of program "
                     f"{str(src.get('program', '?'))[:12]}, input shapes "
                     f"{', '.join(src.get('input_shapes', [])[:1]) or '?'}...)")
    return notes


def _tile(state: LoopState, fn, args, notes: list[str]) -> bool:
    """The plan's attention tiles (``aoizora.kernels.tiles.choose_tiles``): the kernel model's best
    tiles for each attention node, and blocks for each attention backward node, at its
    per-shard shapes, compiled in the planned device order (a VMEM / SMEM overflow makes the
    choice again within less VMEM) and priced by Q2; kept when they fit and price lower than
    the plan's tiles (automatic, or a seed's: its authors'), which makes that compile the
    plan's verification (True). No attention, or tiles that do not compile or price higher:
    nothing changes (False)."""
    best, prog = state.best, state.program
    layout = best.solution.layout
    if prog.ir is None or prog.target.family != "tpu":
        return False            # splash tiles are TPU kernels; XLA:GPU picks its own attention
    shapes, backward = laid_out_shapes(layout, prog.ir)
    if not shapes and not backward:
        return False
    base = untiled(layout)
    if choose_tiles(base, shapes, prog.target, backward=backward) == layout:
        # the candidate was compiled and compared with the kernel model's tiles already (the
        # ILP prices and lays out attention with them): no second compile to find them again
        tiles = sorted({str(a.tiles) for a in layout.attention.values()})
        notes.append(f"attention tiles {'; '.join(tiles)}: the plan was compiled and compared "
                     f"with them (the kernel model's, chosen before the comparison)")
        return False
    compiled = {}

    def check(candidate):   # the compiler's verdict (VMEM / SMEM); its evidence kept
        compiled["ev"] = _abandonable(lambda: state.seams.compile_layout(
            fn, args, prog.target, candidate, best.placement, **cache_kw(prog.cache)))
        state.final_evidence.append(compiled["ev"])

    state.progress.stage("choosing attention tiles: compiling the plan with them in its order")
    try:
        tiled = choose_tiles(base, shapes, prog.target, check=check, backward=backward)
    except (CompileError, RealizeError) as e:
        notes.append(f"attention tiles not used: {str(e).splitlines()[0][:160]}")
        return False
    if tiled in (base, layout) or "ev" not in compiled:
        return False
    ev = compiled["ev"]
    q2 = predict_step(ev, best.placement, prog.network)
    if not ev.memory.fits or q2.step_s >= best.q2.step_s:
        notes.append(f"attention tiles not used: {q2.step_s * 1e3:.3f} ms (Q2) with them, "
                     f"{best.q2.step_s * 1e3:.3f} ms without"
                     f"{'' if ev.memory.fits else '; they do not fit in HBM'}")
        return False
    tiles = sorted({str(a.tiles) for a in tiled.attention.values()})
    notes.append(f"attention tiles {'; '.join(tiles)}: "
                 f"{best.q2.step_s * 1e3:.3f} -> {q2.step_s * 1e3:.3f} ms (Q2); verified: "
                 f"compiles for {prog.target.name} in the planned device order, fits in HBM")
    best.solution.layout, best.evidence, best.q2 = tiled, ev, q2
    if best.q2_default is not None and getattr(best, "default_order", None):
        best.q2_default = predict_step(ev, best.default_order, prog.network)
    return True


def _verify(state: LoopState, fn, args, notes: list[str]) -> bool:
    """Compile the plan in its own device order; whether it fits in HBM (noted)."""
    best, tgt = state.best, state.program.target
    state.progress.stage("verifying: compiling the plan with its own device order")
    ev = _abandonable(lambda: state.seams.compile_layout(
        fn, args, tgt, best.solution.layout, best.placement, **cache_kw(state.program.cache)))
    state.final_evidence.append(ev)
    fits = ev.memory.fits
    same = ev.placement_open() == {**best.evidence.placement_open()}
    notes.append(f"verified: compiles for {tgt.name} in the planned device order, "
                 f"{'fits' if fits else 'does NOT fit'} in HBM"
                 f"{'' if same else ' (evidence differs from the default-order compile)'}")
    return fits


def _plan(state: LoopState, key, fn, args, fits, notes: list[str], program: dict[str, Any],
          time_limited: list[str]) -> Plan:
    best, network, tgt = state.best, state.program.network, state.program.target
    q2 = best.q2
    device_coords = [tuple(int(v) for v in network.chips[network.device_chip[d]])
                     for d in best.placement]
    certs = {"sharding": best.solution.certificate, "placement": best.placement_cert}
    proven = all(c is not None and c.status == "OPTIMAL" for c in certs.values())
    return Plan(
        key=key, target=tgt.name, layout=best.solution.layout, device_order=list(best.placement),
        device_coords=device_coords, predicted=_predicted(best, q2, network),
        certificates=certs, iterations=[r.to_json() for r in state.iterations],
        planning_time_s=state.budget.elapsed(),
        layout_in_words=named_words(fn, args, best.solution.words), fits_hbm=fits,
        hbm_bytes_per_device=int(best.evidence.memory.total_bytes),
        status=("INTERRUPTED" if state.stop.is_set() else "OPTIMAL" if proven
                else "NOT PROVEN"), notes=notes, program=program,
        calibration=state.learned, time_limited=time_limited, compiler=compiler_identity(),
        compiles=compile_counts(state))


def compile_counts(state: LoopState) -> dict[str, Any]:
    """The run's compiles (``Plan.compiles``): how many ran, came from the evidence cache or
    failed (the compile queue's, plus the plan's own tile and verification compiles), where
    they ran, the cache directory, and how many solver answers came from it
    (``solver_answers_cached``: ``planning.solve_memo``)."""
    out: dict[str, Any] = dict(state.queue.counts)
    if state.screener is not None:
        out.update(state.screener.counts)
    for ev in state.final_evidence:
        out["cached" if getattr(ev, "source", "") == "cache" else "compiled"] += 1
    out["workers"] = getattr(state.queue.workers, "name", "in-process")
    cache = state.program.cache
    out["cache"] = cache.directory if cache is not None else None
    memo = state.program.memo
    if memo is not None:
        out["solver_answers_cached"] = memo.hits
    return out


def _predicted(best: Candidate, q2: Q2, network: Network) -> Predicted:
    return Predicted.from_json({
        "step_s": q2.step_s, "compute_s": q2.compute_s, "communication_s": q2.communication_s,
        "latency_s": q2.latency_s, "link_time_s": q2.link_time_s, "model": q2.model,
        "kind": "predicted",
        "default_order_step_s": best.q2_default.step_s if best.q2_default else None,
        "q1_step_s": best.q1_s if math.isfinite(best.q1_s) else None,
        "links": link_seconds(q2, network),
    })


def link_seconds(q2: Q2, network: Network) -> list[dict[str, Any]]:
    """Per directed link: seconds of traffic per step under the plan (sum over phases x runs)."""
    L = network.num_links
    tot = np.zeros(L)
    counts = {}
    for ph in q2.phases:     # the classes of one phase share its count (one loop body)
        counts[ph.phase] = max(counts.get(ph.phase, 0), ph.count)
    for phase, loads in q2.link_loads.items():
        n = max(counts.get(int(phase), 1), 1)
        tot += n * network.link_time_s(np.asarray(loads, dtype=float))
    out = []
    for lid in range(L):
        a, b = network.link(lid)
        out.append({"from": _node(network, a), "to": _node(network, b),
                    "seconds": float(tot[lid])})
    return out


def _node(network: Network, node: int) -> list | str:
    """A link end for the plan file: a chip's coordinates, or a switch's fabric name."""
    return list(network.chips[node]) if node < network.num_chips else network.node_label(node)


def named_words(fn, args, words: list[str]) -> list[str]:
    """The ILP's words with each attention op named by its role (self / cross / text)."""
    roles = attention_roles(fn, args)
    out = []
    for w in words:
        head, _, rest = w.partition(":")
        key = w.rsplit(" [", 1)[-1].split()[0].rstrip("]") if " [" in w else ""
        if head == "attention" and roles.get(key):
            w = f"{roles[key]}-attention:{rest}"
        out.append(w)
    return out
