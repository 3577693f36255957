"""The planner's compiles, one at a time on a background thread, in the order of priority.

A compile (``realize`` + libtpu's ahead-of-time compile) is the slowest step of the loop and
runs mostly in XLA's native code, while the planner's other steps run elsewhere: the sharding
ILPs in a CBC process, the placement CP-SAT in OR-Tools' native code. So the planner queues
compiles here and goes on: the seed layouts compile while the first iteration's ILPs solve,
and each layout compiles while the one before it is placed and priced.

- One compile runs at a time (a compile of a large model holds GiBs of host memory); the next is
  the pending one of least ``priority`` (then first submitted). The planner gives each layout
  its place in the pricing order, so the ILP's best, queued after the seeds, compiles next.
- The time budget is checked when a compile *starts*: once a compiled layout fits in HBM (so
  that something will be priced), a compile starts only when ``expected_compile_s`` still fits
  before the deadline; the ones that do not come back as ``Skipped``.
- ``expected_compile_s`` is the most CPU time a compile took: the process's CPU time over the
  compile less the planner's main thread's (``time.pthread_getcpuclockid``; the CBC process is
  not in it). Wall-clock would not do: beside the ILPs a compile takes 1.6-2.4x longer than
  alone on two cores (Wan 2.1 1.3B, v5e-16: 14.7 s against 9.0 s), while its CPU time is the
  same (measured: a compile of 10.2 s alone used 10.4 s of CPU; beside a busy main thread it
  took 8.3 s of wall-clock and 10.0 s of CPU).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable


@dataclasses.dataclass
class Compiled:
    """What one compile gave: the evidence, or the one-line reason it failed."""

    evidence: Any = None
    error: str = ""
    seconds: float = 0.0             # wall-clock
    cpu_s: float = 0.0               # CPU time of the compile (not the planner's main thread)
    started_s: float = 0.0           # when it started, in seconds since the queue's t0


@dataclasses.dataclass
class Skipped:
    """A compile not started: the budget could not hold it (``reason`` says why)."""

    reason: str
    left_s: float
    before_first: bool = False       # no compile ran, and none will: the budget is spent


class CompileQueue:
    """``submit(compile_fn, priority)`` -> a Future of ``Compiled`` or ``Skipped``.
    ``compile_fn()`` returns the evidence (anything with ``.memory.fits``) or raises one of
    ``errors``, whose first line becomes ``Compiled.error``; any other exception propagates to
    ``result()``. Use as a context manager, or call ``close()``."""

    def __init__(self, deadline: float, t0: float, errors: tuple[type, ...] = ()):
        self.deadline, self.t0, self.errors = deadline, t0, errors
        self.done: list[Compiled] = []  # every compile that ran, in order
        self.fitting = False         # some compiled layout fits in HBM
        try:                         # Linux (libtpu's platform); else wall-clock is used
            self._main_clock: int | None = time.pthread_getcpuclockid(
                threading.main_thread().ident)
        except (AttributeError, OSError):
            self._main_clock = None
        self._pending: list = []     # heap of (priority, seq, future, compile_fn)
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._work, name="aoizora-compile", daemon=True)
        self._worker.start()

    @property
    def compiled(self) -> int:
        return len(self.done)

    @property
    def expected_compile_s(self) -> float:
        """What the next compile is expected to take alone: the most CPU seconds one took."""
        return max((c.cpu_s for c in self.done), default=0.0)

    def submit(self, compile_fn: Callable[[], Any], priority: float = 0.0) -> Future:
        f: Future = Future()
        with self._cv:
            if self._closed:
                f.set_result(Skipped("the planner stopped", self.deadline - time.perf_counter()))
                return f
            heapq.heappush(self._pending, (priority, next(self._seq), f, compile_fn))
            self._cv.notify()
        return f

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                _, _, f, compile_fn = heapq.heappop(self._pending)
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(self._run(compile_fn))
            except BaseException as e:  # noqa: BLE001 -- handed to the waiting planner
                f.set_exception(e)

    def _run(self, compile_fn: Callable[[], Any]):
        left = self.deadline - time.perf_counter()
        if self._closed:
            return Skipped("the planner stopped", left)
        expected = self.expected_compile_s
        if self.fitting and left < 1.2 * expected + 1.0:
            return Skipped(f"time budget: {left:.1f} s left, a compile takes about "
                           f"{expected:.1f} s", left)
        if not self.done and left <= 0:
            return Skipped("the time budget ran out before the first compile", left, True)
        t, cpu, main = time.perf_counter(), time.process_time(), self._main_cpu()
        out = Compiled(started_s=t - self.t0)
        try:
            out.evidence = compile_fn()
        except self.errors as e:
            out.error = str(e).splitlines()[0]
        out.seconds = time.perf_counter() - t
        out.cpu_s = (max(0.0, (time.process_time() - cpu) - (self._main_cpu() - main))
                     if self._main_clock is not None else out.seconds)
        self.done.append(out)
        if out.evidence is not None and out.evidence.memory.fits:
            self.fitting = True
        return out

    def _main_cpu(self) -> float:
        return time.clock_gettime(self._main_clock) if self._main_clock is not None else 0.0

    def close(self) -> None:
        """Skip what has not started and wait for a running compile (it cannot be interrupted)."""
        with self._cv:
            self._closed = True
            for _, _, f, _ in self._pending:
                f.cancel()
            self._pending.clear()
            self._cv.notify_all()
        self._worker.join()

    def __enter__(self) -> "CompileQueue":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
