"""The planner's compiles, on background threads through a pool of workers, in the order of
priority.

A compile (``realize`` + libtpu's ahead-of-time compile) is the slowest step of the loop and
runs mostly in XLA's native code, while the planner's other steps run elsewhere: the sharding
ILPs in a solver process (HiGHS or CBC), the placement CP-SAT in OR-Tools' native code. So the
planner queues compiles here and goes on: the seed layouts compile while the first iteration's
ILPs solve (the first seed alone: the planner waits for it to know what a compile costs,
``compiles_left``), and each layout compiles while the one before it is placed and priced.

- Up to ``workers.slots`` compiles run at once (``aoizora.planning.compile_workers``: in-process, one
  at a time, by default on a machine with room for one compile -- a compile of a large model
  holds GiBs of host memory and two cores; local worker processes; Ray tasks); each next to
  start is the pending one of least ``priority`` (then first submitted), so with N in flight
  the N of least priority run and the pricing order keeps its meaning: the planner waits for
  them in its order. A worker lost mid-compile (``WorkerLost``) costs that compile
  (``Compiled.error``), not the plan.
- A compile whose evidence came from the evidence cache (``Evidence.source == "cache"``,
  ``extract.evidence_cache``) is marked ``Compiled.cached``; it does not count as a compile
  alone below (its ``seconds`` are a lookup's): the compile time its entry recorded does,
  until a compile has run here. The planner gives each layout
  its place in the pricing order, so a layout queued later (the ILP's best, once the ILPs are
  solved) still compiles before the seeds placed after it.
- ``hold(p)`` keeps every compile of priority above ``p`` from starting until ``release()``:
  the planner holds the seeds placed after the ILP's best until the ILPs have queued it, so the
  compiles run in the pricing order whatever the ILPs' speed (without it the next seed takes the
  ILP's slot whenever the ILPs outlast the compile before).
- The time budget is checked when a compile *starts*: once a compiled layout fits in HBM (so
  that something will be priced), a compile starts only when ``expected_compile_s`` still fits
  before the budget's deadline less ``reserve_s`` (what the planner keeps for after its last
  compile), with the margin ``MARGINS["compile"]`` of ``solvers.budget``; the ones that do not
  come back as ``Skipped``.
- ``expected_compile_s`` is the longest a compile took *alone*: its wall-clock, with the part
  that ran while the planner said the cores were ``contended`` (the ILPs: the MIP solver and
  PuLP's model building) counted at half, the share of two cores the compile had then. Neither
  raw wall-clock nor CPU time would do on a 2-core machine (XLA compiles on both cores); the
  half count can be up to 25% short (benchmarks/results/lab_notes.md), which the margin below
  (1.2 x + 1 s) partly covers; a compile that then runs past the deadline is reported.
- With a compile count (``Budget.compiles``, ``plan(..., compiles=N)``), the count decides
  first: once a compiled layout fits in HBM, a compile starts only while fewer than N have
  finished (``compiles_left``); the time check above stays as a guard. The count is of compiles
  *finished*, never of one running, so ``compiles_left`` asked from another thread while a
  compile runs gives the same answer whenever it is asked. A compile the count did not start
  comes back as ``Skipped(..., clock=False)``: the count, not the machine, decided it.
- ``reserve_compiles`` (default 0) of a compile count are kept for later: a compile starts only
  while more than that many are left, and one that does not comes back as
  ``Skipped(..., budget=False)`` (the planner goes on). The loop keeps one in its first iteration
  with seeds, for the ILP's layout after the first feedback (``loop.feedback_reserve``), and
  releases it after.
- A compile of a program unlike the ones compiled so far can say so: ``submit(..., slower=f)``
  expects it to take ``f`` x ``expected_compile_s`` (a training seed's own step, with its
  authors' remat and host offload: ``seeds.SEED_PROGRAM_SLOWER``).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

from aoizora.planning.compile_workers import InlineWorkers, WorkerLost
from aoizora.planning.held_pool import HeldPool
from aoizora.solvers.budget import Budget, clock


@dataclasses.dataclass
class Compiled:
    """What one compile gave: the evidence, or the one-line reason it failed."""

    evidence: Any = None
    error: str = ""
    seconds: float = 0.0             # wall-clock
    contended_s: float = 0.0         # of which the planner said the cores were contended
    started_s: float = 0.0           # when it started, in seconds since the budget's start
    cached: bool = False             # the evidence came from the evidence cache (no compile)


@dataclasses.dataclass
class Skipped:
    """A compile not started: the budget could not hold it (``reason`` says why)."""

    reason: str
    before_first: bool = False       # no compile ran, and none will: the budget is spent
    budget: bool = True              # False: skipped by the submitter's ``unless``, not the budget
    clock: bool = True               # False: the compile count decided, not the clock


class CompileQueue:
    """``submit(compile_fn, priority)`` -> a Future of ``Compiled`` or ``Skipped``.
    ``compile_fn()`` returns the evidence (anything with ``.memory.fits``) or raises one of
    ``errors`` (or its worker is lost: ``WorkerLost``), whose first line becomes
    ``Compiled.error``; any other exception propagates to ``result()``. ``budget``: the planning
    run's (``solvers.budget.Budget``; its start is the queue's t0). ``workers``: where compiles
    run (``aoizora.planning.compile_workers``; default in-process, one at a time); the caller closes
    them. Call ``close()`` when done."""

    def __init__(self, budget: Budget, errors: tuple[type, ...] = (), reserve_s: float = 0.0,
                 workers: Any = None):
        self.budget, self.errors, self.reserve_s = budget, errors, reserve_s
        self.workers = workers if workers is not None else InlineWorkers()
        self.done: list[Compiled] = []  # every compile that ran, in order
        self.fitting = False         # some compiled layout fits in HBM
        self.reserve_compiles = 0    # of a compile count, kept for later (module docstring)
        self._contended_s = 0.0      # contended seconds up to _since (or up to now, if on)
        self._since: float | None = None
        self._running: dict[int, tuple[Future, float]] = {}   # per thread: a compile, since when
        self.abandoned: list[str] = []   # what ``abandon`` cut, in words
        # items: (future, job, unless); the pool's lock guards ``_running`` too
        self._pool = HeldPool(self.workers.slots, self._work, "aoizora-compile")
        self._cv = self._pool.lock

    @property
    def expected_compile_s(self) -> float:
        """What the next compile is expected to take alone (module docstring), seconds."""
        ran = [c.seconds - c.contended_s / 2 for c in self.done if not c.cached]
        if ran:
            return max(ran)
        return max((c.evidence.compile_s for c in self.done if c.cached), default=0.0)

    @property
    def counts(self) -> dict[str, int]:
        """Compiles that ran (``compiled``), evidence from the cache (``cached``), failures."""
        return {"compiled": sum(1 for c in self.done if not c.cached and c.evidence is not None),
                "cached": sum(1 for c in self.done if c.cached),
                "failed": sum(1 for c in self.done if c.evidence is None)}

    def compiles_left(self, slower: float = 1.0) -> int:
        """How many more compiles of ``slower`` x ``expected_compile_s`` fit before the deadline
        less ``reserve_s``, each with the margin ``1.2 x + 1 s`` the start check uses (module
        doc), times the compiles that run at once (``workers.slots``); a large number before the
        first compile has finished (nothing is known yet). With a compile count, at most what the
        count leaves after the compiles finished."""
        by_count = self.budget.compiles_left(len(self.done))
        by_time = (1 << 30 if not self.done else
                   self.budget.count("compile", self.expected_compile_s * slower,
                                     self.reserve_s) * self.workers.slots)
        return by_time if by_count is None else min(by_count, by_time)

    def contended(self, on: bool) -> None:
        """The planner starts (``on``) or stops work that competes with compiles for the cores."""
        now = clock()
        if on and self._since is None:
            self._since = now
        elif not on and self._since is not None:
            self._contended_s += now - self._since
            self._since = None

    def _contended_until(self, now: float) -> float:
        since = self._since
        return self._contended_s + (now - since if since is not None else 0.0)

    def submit(self, compile_fn: Callable[[], Any], priority: float = 0.0,
               unless: Callable[[], str] | None = None, slower: float = 1.0) -> Future:
        """Queue ``compile_fn`` at ``priority``; ``unless``, asked when it would start, returns
        a reason not to run it (then ``Skipped(reason, budget=False)``) or ""; ``slower``: the
        compile is expected to take that many times ``expected_compile_s`` (module docstring)."""
        f: Future = Future()
        job = functools.partial(self._run, compile_fn, slower)
        if not self._pool.put(priority, (f, job, unless)):
            f.set_result(Skipped("the planner stopped"))
        return f

    def hold(self, priority: float) -> None:
        """No compile of a priority above ``priority`` starts until ``release()``: one at or
        below it is still to be submitted (the planner's ILP layouts, while the ILPs solve)."""
        self._pool.hold(priority)

    def release(self) -> None:
        self._pool.release()

    def _work(self, item: tuple[Future, Callable[[], Any], Callable[[], str] | None]) -> None:
        """Run one compile the pool took (its Future settled, whatever happens)."""
        f, job, unless = item
        if not f.set_running_or_notify_cancel():
            return
        me = threading.get_ident()
        with self._cv:
            self._running[me] = (f, clock())
        try:
            why = unless() if unless is not None else ""
            out = Skipped(why, budget=False) if why else job()
        except BaseException as e:  # noqa: BLE001 -- handed to the waiting planner
            settle(f, error=e)
        else:
            settle(f, out)
        with self._cv:
            self._running.pop(me, None)

    def _run(self, compile_fn: Callable[[], Any], slower: float = 1.0):
        left = self.budget.left()
        if self._pool.closed:
            return Skipped("the planner stopped")
        expected = self.expected_compile_s * slower
        counted = self.budget.compiles_left(len(self.done))
        if self.fitting and counted == 0:
            return Skipped(f"compile budget: {self.budget.compiles} compile(s) done", clock=False)
        if self.fitting and counted is not None and counted <= self.reserve_compiles:
            return Skipped(f"compile budget: {counted} compile(s) kept for the ILP's layouts "
                           f"after feedback", budget=False)
        if self.fitting and self.compiles_left(slower) < 1:
            kept = f" ({self.reserve_s:.1f} s of it kept for after)" if self.reserve_s else ""
            return Skipped(f"time budget: {left:.1f} s left{kept}, a compile takes about "
                           f"{expected:.1f} s")
        if not self.done and left <= 0:
            return Skipped("the time budget ran out before the first compile", True)
        t = clock()
        c0 = self._contended_until(t)
        out = Compiled(started_s=t - self.budget.start)
        try:
            out.evidence = self.workers.run(compile_fn)
            out.cached = getattr(out.evidence, "source", "") == "cache"
        except (WorkerLost, *self.errors) as e:
            out.error = str(e).splitlines()[0]
        end = clock()
        out.seconds = end - t
        out.contended_s = min(out.seconds, self._contended_until(end) - c0)
        self.done.append(out)
        if out.evidence is not None and out.evidence.memory.fits:
            self.fitting = True
        return out

    def abandon(self, reason: str = "interrupted") -> None:
        """Stop waiting (an interrupt, ``solvers.stop``; callable from any thread): every
        pending compile and the running one come back at once as ``Skipped(reason)``. The
        running compile is native code and cannot be killed: it is abandoned, not awaited (its
        result is dropped; the thread is a daemon). ``abandoned`` says what was cut."""
        with self._cv:
            pending = [f for f, _, _ in self._pool.close()]
            running = list(self._running.values())
        for f in pending:
            settle(f, Skipped(reason, budget=False))
        for f, since in running:
            if not f.done():
                self.abandoned.append(f"a compile running for {clock() - since:.1f} s "
                                      f"(abandoned, not awaited)")
                settle(f, Skipped(reason, budget=False))
        if pending:
            self.abandoned.append(f"{len(pending)} queued compile(s) (not started)")

    def close(self, wait: bool = True) -> None:
        """Skip what has not started and, with ``wait``, wait for the running compiles (they
        cannot be interrupted; after ``abandon`` nothing waits for them)."""
        for f, _, _ in self._pool.close():
            f.cancel()
        if wait:
            self._pool.join()


def settle(f: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set ``f``'s outcome unless it has one (``CompileQueue.abandon`` settled it first)."""
    try:
        if error is not None:
            f.set_exception(error)
        else:
            f.set_result(result)
    except InvalidStateError:
        pass
