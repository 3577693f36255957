"""Compile a layout for the target, then place and price it: one candidate of the loop.

- ``compile_layout``: realize a layout as shardings (``aoizora.runtime.realize``) on the target's
  devices in a given order and compile it ahead of time with libtpu
  (``extract.aot_compile``); the evidence is what the compiler emitted (with a cache: found
  without lowering when this program and layout were lowered before, ``lowering_memo``).
- ``compile_job``: that compile in JAX's default device order, as the loop queues it
  (``aoizora.planning.compile_queue``): a ``CompileJob``.
- ``early_layout_evidence``: that compile stopped after libtpu's HLO passes
  (``extract.early_evidence``): the layout's collectives exactly, in seconds, without compute
  cycles (partial evidence; the loop's screen, ``aoizora.planning.screening``, prices it).
- ``place``: a compiled candidate's placement and price. A layout that does not fit in HBM is
  not placed. Else the placement CP-SAT (``solvers.placement``) runs on the budget's
  ``placement`` share, and among its answer, the placements it priced and JAX's default order
  the least Q2 step is kept after a swap descent (``solvers.placement_step.choose_by_step``, on
  the ``step_choice`` share: the latency term breaks link-load near-ties). So the candidate is
  never priced worse than the default order.
- ``levels_proven``: whether a placement is proven on every level CP-SAT optimizes.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax

from aoizora.planning.candidate import Candidate
from aoizora.planning.compile_queue import Compiled
from aoizora.extract.aot_compile import (compile_evidence, evidence_by_alias, keep_alias,
                                         target_mesh)
from aoizora.extract.early_evidence import EarlyEvidence, early_evidence
from aoizora.extract.evidence import Evidence
from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.extract.network import default_device_order
from aoizora.extract.frontends.jax.ir_builder import state_arguments
from aoizora.extract.targets import Target
from aoizora.formulation.latency import predict_step
from aoizora.formulation.layout import Layout
from aoizora.planning.lowering_memo import lowering_key, program_identity
from aoizora.planning.progress import Progress
from aoizora.runtime.realize import realize
from aoizora.solvers.budget import Budget
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.placement import LEVELS, solve_placement
from aoizora.solvers.placement_step import choose_by_step


def compile_layout(fn, args, tgt: Target, layout: Layout, device_order: Sequence[int],
                   compiler_options: dict[str, Any] | None = None,
                   cache: EvidenceCache | None = None) -> Evidence:
    """Realize `layout` on the target's devices in `device_order` and compile it ahead of time
    (``compiler_options``: libtpu options for this compile only, as ``compile_evidence`` takes;
    default the layout's own ``compiler_options``). State fed back (a training step's state,
    ``state_arguments``) is donated, as ``plan.jit(..., donate_argnums=...)`` runs it, so the
    memory analysis counts it once. ``cache``: the evidence cache to look the compile up in and
    store it to (``extract.evidence_cache``; None: always compile); its evidence is found
    without lowering when this program, layout and mesh were lowered before
    (``lowering_memo``)."""
    mesh = target_mesh(tgt, layout.mesh_axes, list(device_order))
    options = compiler_options or layout.compiler_options or None
    program, alias = _memo_key(cache, fn, args, tgt, layout, mesh, options)
    if alias is not None:
        ev = evidence_by_alias(cache, alias, tgt)
        if ev is not None:
            return ev
    realized = realize(fn, args, layout, mesh)
    donate = (program.donate_argnums if program is not None
              else state_arguments(tuple(args), jax.eval_shape(fn, *args)))
    ev = compile_evidence(realized.fn, realized.args, mesh=mesh, target=tgt,
                          donate_argnums=donate, compiler_options=options, cache=cache)
    if alias is not None:
        keep_alias(cache, alias, ev)
    return ev


def _memo_key(cache: EvidenceCache | None, fn, args, tgt: Target, layout: Layout, mesh,
              options: dict[str, Any] | None) -> tuple[Any, str | None]:
    """(the program's identity, its lowering memo key: ``lowering_memo``) for compiling
    ``layout`` on ``mesh`` with ``options``; (None, None) without a cache or when the program
    does not trace."""
    program = None if cache is None else program_identity(fn, args, layout.remat)
    alias = None if program is None else lowering_key(cache, program, layout, mesh, tgt, options)
    return program, alias


def early_layout_evidence(fn, args, tgt: Target, layout: Layout, device_order: Sequence[int],
                          compiler_options: dict[str, Any] | None = None,
                          **kw: Any) -> EarlyEvidence:
    """``compile_layout``'s compile of `layout` (no cache) run in a child process and stopped
    once libtpu has written the module after its HLO passes (``extract.early_evidence``).

    Args:
        fn, args, tgt, layout, device_order, compiler_options: as ``compile_layout`` takes them.
        kw: ``early_evidence``'s ``timeout_s``, ``keep_dump``, ``poll_s``.
    Returns:
        ``EarlyEvidence``: collectives as the full compile's evidence has them, no compute
        cycles, ``fidelity="tpu-hlo-passes"``, and the seconds it took.
    Raises:
        extract.early_evidence.EarlyEvidenceError: no module (the compile failed before it,
            with its one line; or the timeout)."""
    job = functools.partial(compile_layout, fn, args, tgt, layout, list(device_order),
                            compiler_options=compiler_options)
    return early_evidence(job, tgt, dict(layout.mesh_axes), list(device_order), **kw)


@dataclasses.dataclass(frozen=True)
class CompileJob:
    """One queued compile: ``compile_fn(fn, args, target, layout, device_order, cache=cache)``
    (the cache only when there is one, so a seam's compile need not take it), called with no
    arguments. Picklable: a compile worker may run it in another process
    (``aoizora.planning.compile_workers``), and the screen (``aoizora.planning.screening``)
    reads its program, layout and order to run the same compile stopped early.

    Attributes:
      compile_fn: ``compile_layout`` or the ``Seams``' one.
      fn, args: the program and its abstract arguments.
      target: the TPU slice.
      layout: the layout to compile.
      device_order: physical device ids per logical rank.
      cache: the evidence cache, or None.
    """

    compile_fn: Callable[..., Evidence]
    fn: Any
    args: Any
    target: Target
    layout: Layout
    device_order: list[int]
    cache: EvidenceCache | None = None

    def __call__(self) -> Evidence:
        return self.compile_fn(self.fn, self.args, self.target, self.layout, self.device_order,
                               **cache_kw(self.cache))


def early_key(job: "CompileJob") -> str | None:
    """The cache key of ``job``'s early evidence: its lowering memo key
    (``lowering_memo.lowering_key``: the program, layout, mesh, order, options, versions and the
    lowering code) under kind "early"; None without a cache or when the program does not trace."""
    if job.cache is None:
        return None
    mesh = target_mesh(job.target, job.layout.mesh_axes, list(job.device_order))
    _, alias = _memo_key(job.cache, job.fn, job.args, job.target, job.layout, mesh,
                         job.layout.compiler_options or None)
    return None if alias is None else job.cache.key({"kind": "early", "lowering": alias})


def cached_early_evidence(job: "CompileJob") -> EarlyEvidence | None:
    """``job``'s early evidence from its cache (``keep_early_evidence``), seconds 0; None on a
    miss (a corrupt entry is reported in one line and removed by the cache)."""
    key = early_key(job)
    hit = None if key is None else job.cache.get(key)
    if hit is None:
        return None
    ev = hit.evidence
    ev.source, ev.cache_key = "cache", key
    return EarlyEvidence(evidence=ev, seconds=0.0, module_s=0.0, lowered_s=None,
                         dump_memory_bytes=None, child_finished=True)


def keep_early_evidence(job: "CompileJob", early: EarlyEvidence) -> None:
    """Store ``early``'s evidence in ``job``'s cache under ``early_key`` (nothing without one),
    so that a re-plan screens the same layouts with the same prices without compiling."""
    key = early_key(job)
    if key is not None:
        job.cache.put(key, early.evidence)


def compile_job(fn, args, tgt: Target, layout: Layout, mesh_axes: dict[str, int] | None = None,
                compile_fn: Callable[..., Evidence] = compile_layout,
                cache: EvidenceCache | None = None) -> CompileJob:
    """``compile_fn`` (``compile_layout``, or the ``Seams``' one) of `layout` in JAX's default
    device order on `mesh_axes` (default the layout's mesh), to queue (``CompileJob``)."""
    m = layout.mesh_axes if mesh_axes is None else mesh_axes
    return CompileJob(compile_fn, fn, args, tgt, layout,
                      list(default_device_order(tgt, m)), cache)


def cache_kw(cache: EvidenceCache | None) -> dict[str, EvidenceCache]:
    """``{"cache": cache}`` when there is a cache, else ``{}``."""
    return {} if cache is None else {"cache": cache}


def place(cand: Candidate, got: Compiled, program, budget: Budget, settings,
          progress: Progress, solve: Callable = solve_placement,
          choose: Callable = choose_by_step) -> Candidate:
    """Place and price one compiled candidate (``got``: its ``compile_queue.Compiled``) on
    ``program``'s target and network (``loop_state.Program``) within ``budget``'s ``placement``
    and ``step_choice`` shares of ``settings.placement_time_s`` (``loop_state.Settings``, which
    also gives the solvers' ``seed`` and ``workers``). ``solve``, ``choose``: the placement
    solver and the choice by step (``Seams.solve_placement``, ``Seams.choose_by_step``)."""
    network = program.network
    order = default_device_order(program.target, cand.mesh_axes)
    cand.default_order = order
    cand.compile_s, cand.compile_started_s = got.seconds, got.started_s
    cand.cached = got.cached
    if got.error:
        cand.error = got.error
        progress.note(f"skipped: {cand.error}")
        return cand
    ev = cand.evidence = got.evidence
    cand.fits = ev.memory.fits
    if not ev.memory.fits:
        progress.note(f"does not fit in HBM: {ev.memory.oom_message[:120]}")
        return cand
    asked = settings.placement_time_s
    res = solve(ev, network, time_limit_s=budget.share_s("placement", asked),
                          seed=settings.seed, workers=settings.workers, hint=order)
    # CP-SAT certifies the link-load term; among its answer, the other placements it priced and
    # a swap descent, keep the least Q2 step (the latency term breaks link-load near-ties)
    cands = res.candidates + [order]
    names = ["priced by CP-SAT's warm start"] * len(res.candidates) + ["default order"]
    res = choose(ev, network, res, cands, names=names,
                 time_limit_s=budget.share_s("step_choice", asked))
    c = res.certificate
    how = "CP-SAT" if c.solver.startswith("CP-SAT") else c.solver   # e.g. annealing (too large)
    progress.solver(f"placement {how}", c.status, c.objective, c.bound)
    cand.q2_default = predict_step(ev, order, network)
    if res.placement is None:
        cand.placement, cand.placement_cert, cand.q2 = order, c, cand.q2_default
    else:
        cand.placement, cand.placement_cert, cand.q2 = res.placement, c, res.q2
    return cand      # never worse than the default order: it is among choose_by_step's candidates


def levels_proven(cert: Certificate | None) -> bool:
    """The placement is proven optimal on each level of CP-SAT's lexicographic objective (link
    load, link bytes, flow hops: ``solvers.placement.solve_placement``), not only the first."""
    if cert is None:
        return False
    levels = (cert.detail or {}).get("levels") or {}
    return cert.status == "OPTIMAL" and all(
        (levels.get(name) or {}).get("status") == "OPTIMAL"
        for name in LEVELS)
