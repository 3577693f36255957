"""A pool of threads serving a priority queue that can be held: the part the compile queue
(``compile_queue.CompileQueue``) and the screen (``screening.Screener``) share.

Items are taken least ``priority`` first, then first put (deterministic for equal priorities).
``hold(p)`` keeps every item of a priority above ``p`` from being taken until ``release()``: the
planner holds the layouts placed after the ILP's best until the ILPs have queued it, so the work
runs in the pricing order whatever the ILPs' speed. ``close()`` takes nothing more: the threads
end once their running item is done, and the items never taken are handed back to the owner.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from typing import Any, Callable


class HeldPool:
    """``slots`` daemon threads, each looping: take the next startable item, ``run(item)``.

    Args:
      slots: threads (items run at once); at least one.
      run: what a thread does with an item it took (outside the lock); its exceptions are the
        owner's to catch (an escaping one ends that thread).
      name: the threads' name prefix.
      on_take: called with the item while the lock is held, as it is taken (the owner's
        bookkeeping that must see the pool and its own state at one instant), or None.

    The pool's ``lock`` (a re-entrant ``threading.Condition``) is the owner's to share, so that
    its own state and the queue change together.
    """

    def __init__(self, slots: int, run: Callable[[Any], None], name: str,
                 on_take: Callable[[Any], None] | None = None):
        self.lock = threading.Condition()
        self._run, self._on_take = run, on_take
        self._pending: list = []                # heap of (priority, seq, item)
        self._hold: float | None = None
        self._seq = itertools.count()
        self.closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, slots))]
        for t in self._threads:
            t.start()

    def put(self, priority: float, item: Any) -> bool:
        """Queue ``item`` at ``priority``; False (not queued) once closed."""
        with self.lock:
            if self.closed:
                return False
            heapq.heappush(self._pending, (priority, next(self._seq), item))
            self.lock.notify()
        return True

    def hold(self, priority: float) -> None:
        """Take no item of a priority above ``priority`` until ``release()``."""
        with self.lock:
            self._hold = priority
            self.lock.notify_all()     # a hold raised may let a pending item start

    def release(self) -> None:
        with self.lock:
            self._hold = None
            self.lock.notify_all()

    def close(self) -> list[Any]:
        """Take nothing more; returns the items never taken, in the order they would have run."""
        with self.lock:
            self.closed = True
            pending = [item for _, _, item in sorted(self._pending)]
            self._pending.clear()
            self.lock.notify_all()
        return pending

    def join(self, wait_s: float | None = None) -> None:
        """Wait (up to ``wait_s`` per thread) for the threads to end; call after ``close``."""
        for t in self._threads:
            t.join(wait_s)

    def _startable(self) -> bool:
        return bool(self._pending) and (self._hold is None or self._pending[0][0] <= self._hold)

    def _work(self) -> None:
        while True:
            with self.lock:
                while not self._startable() and not self.closed:
                    self.lock.wait()
                if self.closed:
                    return
                _, _, item = heapq.heappop(self._pending)
                if self._on_take is not None:
                    self._on_take(item)
            self._run(item)
