"""The planner's compiles, one at a time on a background thread, in the order of priority.

A compile (``realize`` + libtpu's ahead-of-time compile) is the slowest step of the loop and
runs mostly in XLA's native code, while the planner's other steps run elsewhere: the sharding
ILPs in a solver process (HiGHS or CBC), the placement CP-SAT in OR-Tools' native code. So the
planner queues compiles here and goes on: the seed layouts compile while the first iteration's
ILPs solve (the first seed alone: the planner waits for it to know what a compile costs,
``compiles_left``), and each layout compiles while the one before it is placed and priced.

- One compile runs at a time (a compile of a large model holds GiBs of host memory); the next is
  the pending one of least ``priority`` (then first submitted). The planner gives each layout
  its place in the pricing order, so a layout queued later (the ILP's best, once the ILPs are
  solved) still compiles before the seeds placed after it.
- ``hold(p)`` keeps every compile of priority above ``p`` from starting until ``release()``:
  the planner holds the seeds placed after the ILP's best until the ILPs have queued it, so the
  compiles run in the pricing order whatever the ILPs' speed (without it the next seed took the
  ILP's slot whenever the ILPs outlasted the compile before: Wan 2.1 14B on v5e-16, 97 s of
  ILPs beside 25-40 s compiles).
- The time budget is checked when a compile *starts*: once a compiled layout fits in HBM (so
  that something will be priced), a compile starts only when ``expected_compile_s`` still fits
  before the budget's deadline less ``reserve_s`` (what the planner keeps for after its last
  compile), with the margin ``MARGINS["compile"]`` of ``solvers.budget``; the ones that do not
  come back as ``Skipped``.
- ``expected_compile_s`` is the longest a compile took *alone*: its wall-clock, with the part
  that ran while the planner said the cores were ``contended`` (the ILPs: the MIP solver and
  PuLP's model building) counted at half, the share of two cores the compile had then. Neither
  raw wall-clock nor CPU time would do on this 2-core machine: beside the ILPs a compile of Wan
  2.1 1.3B for v5e-16 took 16.5 / 23.7 / 19.7 s (21 / 41 / 81 frames) against 9.0 / 13.1 /
  13.1 s alone, and XLA compiles on both cores (the 41-frame compile used 28.3 s of CPU).
  Counted at half, those are 8.3 / 11.9 / 9.9 s: up to 25% short, which the margin below
  (1.2 x + 1 s) partly covers; a compile that then runs past the deadline is reported.
- A compile of a program unlike the ones compiled so far can say so: ``submit(..., slower=f)``
  expects it to take ``f`` x ``expected_compile_s`` (a training seed's own step, with its
  authors' remat and host offload: ``seeds.SEED_PROGRAM_SLOWER``).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

from aoizora.solvers.budget import Budget, clock


@dataclasses.dataclass
class Compiled:
    """What one compile gave: the evidence, or the one-line reason it failed."""

    evidence: Any = None
    error: str = ""
    seconds: float = 0.0             # wall-clock
    contended_s: float = 0.0         # of which the planner said the cores were contended
    started_s: float = 0.0           # when it started, in seconds since the budget's start


@dataclasses.dataclass
class Skipped:
    """A compile not started: the budget could not hold it (``reason`` says why)."""

    reason: str
    before_first: bool = False       # no compile ran, and none will: the budget is spent
    budget: bool = True              # False: skipped by the submitter's ``unless``, not the budget


class CompileQueue:
    """``submit(compile_fn, priority)`` -> a Future of ``Compiled`` or ``Skipped``.
    ``compile_fn()`` returns the evidence (anything with ``.memory.fits``) or raises one of
    ``errors``, whose first line becomes ``Compiled.error``; any other exception propagates to
    ``result()``. ``budget``: the planning run's (``solvers.budget.Budget``; its start is the
    queue's t0). Call ``close()`` when done."""

    def __init__(self, budget: Budget, errors: tuple[type, ...] = (), reserve_s: float = 0.0):
        self.budget, self.errors, self.reserve_s = budget, errors, reserve_s
        self.done: list[Compiled] = []  # every compile that ran, in order
        self.fitting = False         # some compiled layout fits in HBM
        self._contended_s = 0.0      # contended seconds up to _since (or up to now, if on)
        self._since: float | None = None
        self._pending: list = []     # heap of (priority, seq, future, compile_fn, unless)
        self._hold: float | None = None   # no compile above this priority starts (``hold``)
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._running: tuple[Future, float] | None = None   # the compile running, since when
        self.abandoned: list[str] = []   # what ``abandon`` cut, in words
        self._worker = threading.Thread(target=self._work, name="aoizora-compile", daemon=True)
        self._worker.start()

    @property
    def expected_compile_s(self) -> float:
        """What the next compile is expected to take alone (module docstring), seconds."""
        return max((c.seconds - c.contended_s / 2 for c in self.done), default=0.0)

    def compiles_left(self, slower: float = 1.0) -> int:
        """How many more compiles of ``slower`` x ``expected_compile_s`` fit before the deadline
        less ``reserve_s``, each with the margin ``1.2 x + 1 s`` the start check uses (module
        doc); a large number before the first compile has finished (nothing is known yet)."""
        if not self.done:
            return 1 << 30
        return self.budget.count("compile", self.expected_compile_s * slower, self.reserve_s)

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
        with self._cv:
            if self._closed:
                f.set_result(Skipped("the planner stopped"))
                return f
            job = functools.partial(self._run, compile_fn, slower)
            heapq.heappush(self._pending, (priority, next(self._seq), f, job, unless))
            self._cv.notify()
        return f

    def hold(self, priority: float) -> None:
        """No compile of a priority above ``priority`` starts until ``release()``: one at or
        below it is still to be submitted (the planner's ILP layouts, while the ILPs solve)."""
        with self._cv:
            self._hold = priority
            self._cv.notify_all()     # a hold raised may let a pending compile start

    def release(self) -> None:
        with self._cv:
            self._hold = None
            self._cv.notify_all()

    def _startable(self) -> bool:
        return bool(self._pending) and (self._hold is None or self._pending[0][0] <= self._hold)

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._startable() and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                _, _, f, job, unless = heapq.heappop(self._pending)
            if not f.set_running_or_notify_cancel():
                continue
            with self._cv:
                self._running = (f, clock())
            try:
                why = unless() if unless is not None else ""
                out = Skipped(why, budget=False) if why else job()
            except BaseException as e:  # noqa: BLE001 -- handed to the waiting planner
                _settle(f, error=e)
            else:
                _settle(f, out)
            with self._cv:
                self._running = None

    def _run(self, compile_fn: Callable[[], Any], slower: float = 1.0):
        left = self.budget.left()
        if self._closed:
            return Skipped("the planner stopped")
        expected = self.expected_compile_s * slower
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
            out.evidence = compile_fn()
        except self.errors as e:
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
            self._closed = True
            pending = [f for _, _, f, _, _ in self._pending]
            self._pending.clear()
            running = self._running
            self._cv.notify_all()
        for f in pending:
            _settle(f, Skipped(reason, budget=False))
        if running is not None and not running[0].done():
            self.abandoned.append(f"a compile running for {clock() - running[1]:.1f} s "
                                  f"(abandoned, not awaited)")
            _settle(running[0], Skipped(reason, budget=False))
        if pending:
            self.abandoned.append(f"{len(pending)} queued compile(s) (not started)")

    def close(self, wait: bool = True) -> None:
        """Skip what has not started and, with ``wait``, wait for a running compile (it cannot
        be interrupted; after ``abandon`` nothing waits for it)."""
        with self._cv:
            self._closed = True
            for _, _, f, _, _ in self._pending:
                f.cancel()
            self._pending.clear()
            self._cv.notify_all()
        if wait:
            self._worker.join()


def _settle(f: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set ``f``'s outcome unless it has one (``CompileQueue.abandon`` settled it first)."""
    try:
        if error is not None:
            f.set_exception(error)
        else:
            f.set_result(result)
    except InvalidStateError:
        pass
