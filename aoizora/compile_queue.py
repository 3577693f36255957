"""The planner's compiles, one at a time on a background thread.

A compile (``realize`` + libtpu's ahead-of-time compile) is the slowest step of the loop and
releases the GIL in XLA, while the planner's other steps run elsewhere: the sharding ILPs in a
CBC process, the placement CP-SAT in OR-Tools' native code. So the planner submits compiles here
and goes on: the seed layouts compile while the first iteration's ILPs solve, and each layout
compiles while the one before it is placed and priced. On two cores that hides most of the
compile time behind the solvers instead of adding to it.

One compile runs at a time (a compile of a large model holds GiBs of host memory). Results come
back in the order the planner asks for them, so the plan is the same as with compiles in line,
given the same candidates. The time budget is checked when a compile *starts* (as the planner
did in line): once a compiled layout fits in HBM -- so that something will be priced -- a
compile starts only when ``expected_compile_s`` still fits before the deadline; the ones that do
not come back as ``Skipped``. A compile that ran while the planner said the cores were
``contended`` (the ILPs: CBC, and PuLP's model building, which holds the GIL) takes up to ~3x
longer than alone, so the expectation is the slowest compile that ran alone, or, before any
did, the fastest contended one.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


@dataclasses.dataclass
class Compiled:
    """What one compile gave: the evidence, or the one-line reason it failed."""

    evidence: Any = None
    error: str = ""
    seconds: float = 0.0
    started_s: float = 0.0           # when it started, in seconds since the queue's t0
    contended: bool = False          # it shared the cores with the ILPs


@dataclasses.dataclass
class Skipped:
    """A compile not started: the budget could not hold it (``reason`` says why)."""

    reason: str
    left_s: float
    before_first: bool = False       # no compile ran, and none will: the budget is spent


class CompileQueue:
    """``submit(compile_fn)`` -> a Future of ``Compiled`` or ``Skipped``. ``compile_fn()``
    returns the evidence (anything with ``.memory.fits``) or raises one of ``errors``, whose
    first line becomes ``Compiled.error``; any other exception propagates to ``result()``."""

    def __init__(self, deadline: float, t0: float, errors: tuple[type, ...] = ()):
        self.deadline, self.t0, self.errors = deadline, t0, errors
        self.times: list[tuple[float, bool]] = []   # (seconds, contended) per compile
        self.compiled = 0            # compiles finished (with evidence or an error)
        self.fitting = False         # some compiled layout fits in HBM
        self._contended, self._epoch = False, 0
        self._closed = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aoizora-compile")

    @property
    def expected_compile_s(self) -> float:
        """What the next compile is expected to take alone (seconds; 0 before any)."""
        alone = [t for t, c in self.times if not c]
        return max(alone) if alone else min((t for t, _ in self.times), default=0.0)

    def contended(self, on: bool) -> None:
        """The planner runs (``on``) or stops running work that competes with the compiles."""
        if on:
            self._epoch += 1
        self._contended = on

    def submit(self, compile_fn: Callable[[], Any]) -> Future:
        return self._pool.submit(self._run, compile_fn)

    def _run(self, compile_fn: Callable[[], Any]):
        left = self.deadline - time.perf_counter()
        if self._closed.is_set():
            return Skipped("the planner stopped", left)
        expected = self.expected_compile_s
        if self.fitting and left < 1.2 * expected + 1.0:
            return Skipped(f"time budget: {left:.1f} s left, a compile takes about "
                           f"{expected:.1f} s", left)
        if self.compiled == 0 and left <= 0:
            return Skipped("the time budget ran out before the first compile", left, True)
        t = time.perf_counter()
        contended, epoch = self._contended, self._epoch
        out = Compiled(started_s=t - self.t0)
        try:
            out.evidence = compile_fn()
        except self.errors as e:
            out.error = str(e).splitlines()[0]
        out.seconds = time.perf_counter() - t
        out.contended = contended or self._contended or epoch != self._epoch
        self.times.append((out.seconds, out.contended))
        self.compiled += 1
        if out.evidence is not None and out.evidence.memory.fits:
            self.fitting = True
        return out

    def close(self) -> None:
        """Skip what has not started and wait for a running compile (it cannot be interrupted)."""
        self._closed.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
