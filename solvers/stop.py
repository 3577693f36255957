"""A planning run's stop request: an interrupt (SIGINT, SIGTERM) asks the run to stop and keep
the best plan found so far.

``Stop`` is one run's request, set from any thread (``request``; the signal watcher of
``aoizora.planning.interrupts`` sets it). What runs in native code and cannot see a Python
exception (a CP-SAT search, a solver process) registers a canceller for its duration
(``cancel_on_stop(fn, what)``): ``request`` calls every canceller registered then (and one
registered later at once) and records ``what`` in ``Stop.cut``, so that the plan can say what the
interrupt cut (``Plan.time_limited``). While ``raises`` is on, the signal handler also raises
``Interrupted`` in the main thread, which unwinds the Python steps at once.

The run's ``Stop`` is found through a context variable (``current``, set by ``running``): the
planner sets it for the call, so the solvers do not take it as an argument. It is context-local
(a thread started by the run does not see it), not a global.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from typing import Callable, Iterator

from aoizora.solvers.budget import clock

__all__ = ["Interrupted", "Stop", "cancel_on_stop", "checkpoint", "clean_on_quit", "current",
           "running"]


class Interrupted(BaseException):
    """Raised in the main thread when a stop was requested (an interrupt): a BaseException, like
    KeyboardInterrupt, so that no ``except Exception`` swallows it. ``args[0]``: the reason."""


class Stop:
    """One run's stop request (module docstring)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.RLock()   # a signal handler may run while the main thread holds it
        self._cancels: dict[int, tuple[Callable[[], object], str]] = {}
        self._seq = itertools.count()
        self.reason = ""             # e.g. "SIGTERM"
        self.at: float | None = None  # when it was requested (``budget.clock``)
        self.cut: list[str] = []     # what the cancellers stopped, in words
        self._at_quit: dict[int, Callable[[], object]] = {}   # ``cleaning``'s, by key
        self.raises = False          # the signal handler raises Interrupted in the main thread
        self.active = False          # a run is going on that keeps its best when stopped

    def is_set(self) -> bool:
        return self._event.is_set()

    def since(self, t0: float) -> bool:
        """Whether the stop came at or after ``t0`` (a ``clock()`` value): it landed in a step
        that started then."""
        return self.at is not None and self.at >= t0

    def request(self, reason: str) -> None:
        """Ask the run to stop (idempotent; from any thread): every canceller registered is
        called once, and what it stopped recorded in ``cut``."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason, self.at = reason, clock()
            self._event.set()
            cancels = list(self._cancels.values())
            self._cancels.clear()
        for fn, what in cancels:
            self._fire(fn, what)

    def _fire(self, fn: Callable[[], object], what: str) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 -- a canceller that fails must not stop the others
            pass
        if what:
            self.cut.append(what)

    @contextlib.contextmanager
    def cancelling(self, fn: Callable[[], object], what: str = "") -> Iterator[None]:
        """Call ``fn`` if a stop comes while the block runs (at once if one came before)."""
        with self._lock:
            late = self._event.is_set()
            k = next(self._seq)
            if not late:
                self._cancels[k] = (fn, what)
        if late:
            self._fire(fn, what)
        try:
            yield
        finally:
            with self._lock:
                self._cancels.pop(k, None)

    @contextlib.contextmanager
    def cleaning(self, fn: Callable[[], object]) -> Iterator[None]:
        """Call ``fn`` if the process quits at once (``quit_cleanups``, a second signal) while
        the block runs: e.g. remove a temporary directory the block's own exit would remove."""
        with self._lock:
            k = next(self._seq)
            self._at_quit[k] = fn
        try:
            yield
        finally:
            with self._lock:
                self._at_quit.pop(k, None)

    def quit_cleanups(self) -> None:
        """Run every ``cleaning`` function registered now (the process is about to quit)."""
        with self._lock:
            fns = list(self._at_quit.values())
            self._at_quit.clear()
        for fn in fns:
            try:
                fn()
            except Exception:  # noqa: BLE001 -- quitting: each cleanup on its own
                pass

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """While the block runs, an interrupt raises ``Interrupted`` in the main thread."""
        before = self.raises
        self.raises = True
        try:
            if self.is_set():
                raise Interrupted(self.reason)
            yield
        finally:
            self.raises = before

    def check(self) -> None:
        """Raise ``Interrupted`` if a stop was requested."""
        if self.is_set():
            raise Interrupted(self.reason)

    def checkpoint(self) -> None:
        """Raise ``Interrupted`` if a stop was requested while ``raises`` is on: the signal
        handler's raise again, at a point where nothing swallows it. The handler's own raise
        can be lost: Python runs it at the main thread's next bytecode, which may be inside a
        gc callback or a ``__del__``, whose exceptions are printed and dropped."""
        if self.raises and self.is_set():
            raise Interrupted(self.reason)


_CURRENT: contextvars.ContextVar["Stop | None"] = contextvars.ContextVar("aoizora_stop",
                                                                         default=None)


def current() -> Stop | None:
    """The running plan's Stop in this context, or None."""
    return _CURRENT.get()


@contextlib.contextmanager
def running(stop: Stop) -> Iterator[Stop]:
    """Make ``stop`` the ``current`` one for the block."""
    token = _CURRENT.set(stop)
    try:
        yield stop
    finally:
        _CURRENT.reset(token)


def checkpoint() -> None:
    """``Stop.checkpoint`` on the current Stop; nothing when there is none. Long Python steps
    (a sharding ILP's stages, each mesh's ILP, each seed refinement) call it between parts."""
    stop = current()
    if stop is not None:
        stop.checkpoint()


@contextlib.contextmanager
def clean_on_quit(fn: Callable[[], object]) -> Iterator[None]:
    """``Stop.cleaning`` on the current Stop; nothing when there is none."""
    stop = current()
    if stop is None:
        yield
        return
    with stop.cleaning(fn):
        yield


@contextlib.contextmanager
def cancel_on_stop(fn: Callable[[], object], what: str = "") -> Iterator[None]:
    """``Stop.cancelling`` on the current Stop; nothing when there is none."""
    stop = current()
    if stop is None:
        yield
        return
    with stop.cancelling(fn, what):
        yield
