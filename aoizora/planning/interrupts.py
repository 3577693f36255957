"""SIGINT and SIGTERM during a planning run: stop, keep the best plan so far, leave nothing behind.

``handling_signals(stop, hard_exit)`` installs handlers for SIGINT and SIGTERM (main thread
only; the previous handlers and wakeup fd come back on exit). Each signal is seen twice:

- by a watcher thread at once, through ``signal.set_wakeup_fd`` (Python runs signal handlers
  only between bytecodes of the main thread, so not while it is inside a CP-SAT search or a
  compile): on the first signal while a plan runs (``Stop.active``) whose best is to be kept
  (``keeps_plan``: the API's ``plan`` and the CLI's plan command) it requests the stop
  (``solvers.stop.Stop.request``: CP-SAT searches stopped, solver processes killed, the compile
  queue abandoned); on a second signal, or a first one while no plan runs, it quits at once with
  ``hard_exit`` (the CLI: one line on stderr, children already killed, exit code 128 + the
  signal's number), after any ``critical`` block (a plan being saved) has ended;
- by the handler in the main thread, which raises ``Interrupted`` while ``Stop.raises`` (the
  planner's loop and annealing, which the planner then ends with the best plan so far), and
  without ``hard_exit`` raises KeyboardInterrupt on a second signal (the API's behaviour).

Installed before libtpu initialises, the handler also keeps libtpu's failure signal handler
(which prints a native stack dump on SIGTERM) off SIGTERM; installed after, it replaces it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
from typing import Iterator

from aoizora.solvers.stop import Interrupted, Stop

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}   # 128 + the signal's number


class SignalHandling:
    """The handlers of one run (module docstring). ``critical()``: a block a hard exit waits
    for (at most ``CRITICAL_WAIT_S``)."""

    CRITICAL_WAIT_S = 3.0

    def __init__(self, stop: Stop, hard_exit: bool):
        self.stop, self.hard_exit = stop, hard_exit
        self.received: list[str] = []    # signal names, as the watcher saw them
        self.quit_note = "quit"          # what a hard exit says after the signal's name
        # a first signal stops the plan and keeps its best (else, with hard_exit, it quits):
        # the API's plan() and the CLI's plan command; not compare, check, inspect, show
        self.keeps_plan = not hard_exit
        self._main_count = 0
        self._critical = threading.Lock()
        self._old: dict = {}
        self._old_fd = -1
        self._socks: tuple[socket.socket, socket.socket] | None = None
        self._watcher: threading.Thread | None = None

    # -- installing ----------------------------------------------------------------------------
    def install(self) -> bool:
        """Install the handlers; False (nothing done) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        r, w = socket.socketpair()
        r.setblocking(True)
        w.setblocking(False)
        self._socks = (r, w)
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self._handler)
        self._old_fd = signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, name="aoizora-signals",
                                         daemon=True)
        self._watcher.start()
        return True

    def uninstall(self) -> None:
        if self._socks is None:
            return
        signal.set_wakeup_fd(self._old_fd)
        for s, h in self._old.items():
            signal.signal(s, h)
        r, w = self._socks
        w.close()                       # the watcher's recv returns b"" and it ends
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
        r.close()
        self._socks = None

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A block (saving a plan) that a hard exit waits for."""
        with self._critical:
            yield

    # -- reacting ------------------------------------------------------------------------------
    def _handler(self, signum: int, frame) -> None:
        self._main_count += 1
        name = signal.Signals(signum).name
        if self._main_count == 1 and self.stop.active and self.keeps_plan:
            self.stop.request(name)     # (the watcher may not have yet: a race)
            if self.stop.raises:
                raise Interrupted(name)
            return
        if not self.hard_exit:
            raise KeyboardInterrupt
        # hard exit: the watcher quits, once a plan being saved (``critical``) is written

    def _watch(self) -> None:
        r = self._socks[0]
        while True:
            try:
                data = r.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in SIGNALS:
                    self._seen(signum)

    def _seen(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        # the first signal of a run (the main thread's handler may have taken it first and
        # ended the run already: then the stop is set)
        if len(self.received) == 1 and self.keeps_plan and (self.stop.active
                                                              or self.stop.is_set()):
            _say(f"aoizora: {name} received: stopping and keeping the best plan so far "
                 f"(send it again to quit at once)")
            self.stop.request(name)
        elif self.hard_exit:
            self.quit(signum)
        else:
            self.stop.request(name)

    def quit(self, signum: int) -> None:
        """Quit at once: the stop requested (solver processes killed), then, once no plan is
        being saved, one line on stderr and exit 128 + the signal's number (no cleanup that
        waits for a compile: ``os._exit``)."""
        name = signal.Signals(signum).name
        self.stop.request(name)
        got = self._critical.acquire(timeout=self.CRITICAL_WAIT_S)
        self.stop.quit_cleanups()       # temporary directories of solver runs
        try:
            _say(f"aoizora: {name} received: {self.quit_note}")
        finally:
            os._exit(EXIT_CODES.get(signum, 128 + signum))
            if got:  # pragma: no cover -- os._exit does not return
                self._critical.release()


def _say(line: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 -- a closed or broken stream must not stop the message
            pass
    try:
        os.write(2, (line + "\n").encode())
    except OSError:
        pass


@contextlib.contextmanager
def handling_signals(stop: Stop, hard_exit: bool = False) -> Iterator[SignalHandling]:
    """SIGINT and SIGTERM handled for the block (module docstring); outside the main thread
    nothing is installed (the handling is returned all the same)."""
    h = SignalHandling(stop, hard_exit)
    h.install()
    try:
        yield h
    finally:
        h.uninstall()
