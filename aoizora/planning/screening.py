"""The screen: every layout of an iteration priced from its early evidence before any full
compile, so that the full compiles go to the layouts the screen ranks best.

A full ahead-of-time compile of Wan 2.1 1.3B 480p-81f takes ~35-50 s on 2 cores, its early
evidence (``extract.early_evidence``: the same compile in a child process, stopped once libtpu's
HLO passes have written the module) ~5 s, with the full compile's collectives exactly
(benchmarks/results/early_evidence.md). With screening on (``plan(..., screen=True)``, the CLI's
default) the loop submits each layout (seeds, refinements, ILP layouts, at their places in the
pricing order, ``pricing_order.pricing_rank``) to a ``Screener`` instead of the compile queue;
``Screener.order`` then waits for the iteration's screens, ranks them and queues their full
compiles (``compile_queue.CompileQueue``) in that rank.

The screen price of layout L, from its early evidence E_L in JAX's default device order d_L
(``formulation.latency.predict_step`` with ``partial=True``, the names are Q2's):

    screen_s(L)     = compute_s + communication_s + latency_s
    compute_s       = sum_o count_o * t_o over E_L's compute ops, t_o by ``formulation.op_time``:
                      a splash kernel by the kernel model at its per-shard shapes and tiles,
                      any other op max(flops_o / peak_flops, bytes_o / hbm_bandwidth)
                      (early ops carry no cycles)
    communication_s = sum_p count_p * max(0, T_p - O_p)   (Q2's link-load term, exact
                      collectives, windows W_c priced with the t_o above)
    latency_s       = Q2's hop-latency term

How far screen_s is from Q2 (the same layouts' full compiles, default order; Wan 2.1 1.3B):
the collectives are exact, the splash kernels priced alike, but (1) ops the early module keeps
only with a cycle estimate (copies, broadcasts, reduces, slices) are absent: 1-26 ms a step on
the 480p-21f cell; (2) a fusion by its roofline is cheaper than the compiler's cycles: 1.06-1.21x
for flops-bound fusions, 0.7-2.8x for bytes-bound ones (layout changes, padding to tiles,
per-op overheads the roofline does not see). screen_s came out 3-30% below Q2 there, and on
480p-81f 6-16% below, not uniformly: it is a ranking device, not a prediction, and can misrank
layouts within ~10% of each other (the plan is still chosen by Q2 on the full compiles, so a
misrank costs a full compile's place in line, not a wrong price).

With an evidence cache the early evidence is kept there under the layout's lowering memo key
(``candidate_pricing.keep_early_evidence``): a re-plan screens from it without compiling, with
the same prices, so the same full-compile order and the same plan.

The order of the full compiles: ``screen_key(L) = (not fits_L, screen_s(L), rank_L)`` (least
first; fits_L: the dump's memory report within HBM, ``EarlyEvidence.dump_memory_bytes``, which
is at most ``memory_analysis()``'s total, so a layout it rejects would not fit either; a layout
whose screen failed sorts as fitting with screen_s = inf: after the priced layouts that fit,
before those that do not; it is still compiled if the budget holds it). Ties (and equal inputs) keep the pricing order: deterministic.

Which layouts are screened:
  - with a compile count (``Budget.compiles``): every one (the time budget a guard: a screen
    does not start once the budget is spent); the count, not the clock, decides what is
    compiled fully.
  - with the time budget alone: a screen starts (least ``priority`` first, ``SCREEN_SLOTS`` at
    once) only while the budget still holds it and one full compile of the screen's winner
    after it: ``left - reserve_s >= 1.2 x full_s + 1 s + early_s``, where ``full_s`` is the
    longest full compile alone so far (``CompileQueue.expected_compile_s``) or, before one has
    run, ``FULL_OVER_EARLY`` x the longest screen so far, and ``early_s`` the longest screen so
    far. The first screens start unconditionally. A layout not screened is not compiled
    (``Skipped``, a time limit). The queue always starts the first full compile (as without
    screening), so the screen's winner is compiled even where the estimate was short; the plan
    then says how far over budget it went.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from concurrent.futures import Future
from typing import Any, Callable

from aoizora.extract.early_evidence import EarlyEvidence, EarlyEvidenceError
from aoizora.extract.compiled_evidence import EvidenceError
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.planning.candidate_pricing import (CompileJob, cached_early_evidence,
                                                keep_early_evidence)
from aoizora.planning.compile_queue import CompileQueue, Skipped, settle
from aoizora.planning.held_pool import HeldPool
from aoizora.planning.pricing_order import PricingItem
from aoizora.solvers.budget import MARGINS, Budget, clock

# A full compile's wall-clock over its early evidence's, before a full compile has run (then
# the longest full compile alone is used): the median of 18 back-to-back pairs, 47.7 s / 4.8 s
# (benchmarks/results/early_evidence.md), rounded down since the screens here run beside the
# ILPs and each other and so take longer than alone. Conservative: in the planner on Wan 1.3B
# 480p-81f a full compile took 30-35 s against screens of 5.5-7.5 s (4-6x), so that a 60 s
# budget screens only the pricing order's first two layouts (benchmarks/results/
# screening_60s.md).
FULL_OVER_EARLY = 8.0
# Screens at once: an early compile is mostly the child's interpreter start, tracing and
# lowering, one core each; two share the 2-core machine.
SCREEN_SLOTS = 2


@dataclasses.dataclass(frozen=True)
class ScreenPrice:
    """A layout's screen price (module docstring), seconds, in JAX's default device order.

    Attributes:
      step_s: ``screen_s`` = compute_s + communication_s + latency_s.
      compute_s: its compute ops by op_time's kernel model or flops / bytes.
      communication_s: Q2's exposed link-load term.
      latency_s: Q2's hop-latency term.
      fits: the dump's memory report within the device's HBM.
      early_s: what the early evidence took, wall-clock.
    """

    step_s: float
    compute_s: float
    communication_s: float
    latency_s: float
    fits: bool
    early_s: float


def screen_price(early: EarlyEvidence, device_order: list[int], network: Network) -> ScreenPrice:
    """The screen price of one layout's early evidence in ``device_order`` (module docstring).

    Args:
      early: the layout's ``EarlyEvidence``.
      device_order: physical device ids per logical rank (JAX's default order, as compiled).
      network: the target's network (``Network.from_target``).

    Returns:
      The ``ScreenPrice``.

    Raises:
      ValueError, KeyError: evidence the traffic model cannot price.
    """
    q = predict_step(early.evidence, device_order, network, partial=True)
    return ScreenPrice(q.step_s, q.compute_s, q.communication_s, q.latency_s,
                       bool(early.evidence.memory.fits), early.seconds)


@dataclasses.dataclass
class Screen:
    """One layout's screen and its full compile to come.

    Attributes:
      job: its full compile (``candidate_pricing.CompileJob``).
      priority: its place in the pricing order (least screens first).
      full: the Future the loop waits on: the full compile's ``Compiled`` or a ``Skipped``.
      unless, slower: passed on to ``CompileQueue.submit`` with the full compile.
      price: the screen price, once screened.
      error: why the screen failed (one line), or "".
      skipped: why it was not screened (the budget), or "".
      clock_limited: the clock (not a count) decided ``skipped``.
      done: set once screened, failed or skipped.
    """

    job: CompileJob
    priority: float
    full: Future
    unless: Callable[[], str] | None = None
    slower: float = 1.0
    price: ScreenPrice | None = None
    error: str = ""
    skipped: str = ""
    clock_limited: bool = True
    done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def key(self, rank: float) -> tuple[bool, float, float]:
        """``screen_key`` (module docstring): (not fits, screen_s, rank); a failed screen
        sorts as screen_s = inf."""
        if self.price is None:
            return (False, math.inf, rank)
        return (not self.price.fits, self.price.step_s, rank)

    def summary(self, mesh: dict[str, int], order: int | None) -> dict[str, Any]:
        """What ``IterationRecord.screens`` keeps of it (seconds)."""
        p = self.price
        return {"mesh": dict(mesh), "layout": self.job.layout.name, "full_compile_order": order,
                "screen_step_s": p.step_s if p else None,
                "screen_compute_s": p.compute_s if p else None,
                "screen_communication_s": p.communication_s if p else None,
                "fits_hbm": p.fits if p else None,
                "early_s": round(p.early_s, 3) if p else None,
                "error": self.error or None, "skipped": self.skipped or None}


class Screener:
    """``submit`` takes what ``CompileQueue.submit`` takes and screens it on background threads
    (``SCREEN_SLOTS`` at once, least priority first, ``hold`` / ``release`` as the queue's);
    ``order`` ranks an iteration's screened layouts and queues their full compiles.

    Args:
      queue: the run's compile queue (full compiles, their count and expected time).
      budget: the run's budget.
      early_fn: the early evidence of (fn, args, target, layout, device order)
        (``Seams.early_evidence``: ``candidate_pricing.early_layout_evidence``).
      network: the target's network.
      slots: screens at once.
      price: the screen price of (early evidence, device order, network): ``screen_price``.
    """

    def __init__(self, queue: CompileQueue, budget: Budget, early_fn: Callable[..., EarlyEvidence],
                 network: Network, slots: int = SCREEN_SLOTS,
                 price: Callable[..., ScreenPrice] = screen_price):
        self.queue, self.budget, self.early_fn, self.network = queue, budget, early_fn, network
        self.price = price
        self.screens: dict[int, Screen] = {}    # by id of its ``full`` Future
        self._early_s: list[float] = []         # what each finished screen took
        self._cancel = threading.Event()        # set: running early compiles stop (``abandon``)
        # items: (Screen, slot in _early_s or None); the pool's lock guards _early_s too
        self._pool = HeldPool(slots, self._work, "aoizora-screen", on_take=self._taken)
        self._cv = self._pool.lock

    # -- the queue's interface -------------------------------------------------------------------
    def submit(self, compile_fn: CompileJob, priority: float = 0.0,
               unless: Callable[[], str] | None = None, slower: float = 1.0) -> Future:
        """Screen ``compile_fn`` (a ``CompileJob``) at ``priority``; the Future returned is its
        full compile's, settled once ``order`` has queued it (or skipped it)."""
        s = Screen(compile_fn, priority, Future(), unless, slower)
        with self._cv:
            self.screens[id(s.full)] = s
            if not self._pool.put(priority, [s, None]):
                s.skipped, s.clock_limited = "the planner stopped", False
                s.done.set()
        return s.full

    def hold(self, priority: float) -> None:
        """No screen of a priority above ``priority`` starts until ``release()``."""
        self._pool.hold(priority)

    def release(self) -> None:
        self._pool.release()

    @property
    def counts(self) -> dict[str, int]:
        """Layouts screened (priced), whose screen failed, and not screened (the budget)."""
        done = [s for s in self.screens.values() if s.done.is_set()]
        return {"screened": sum(1 for s in done if s.price is not None),
                "screen_failed": sum(1 for s in done if s.error),
                "screen_skipped": sum(1 for s in done if s.skipped)}

    # -- the screens -----------------------------------------------------------------------------
    def _taken(self, item: list) -> None:
        """As the pool takes a screen (its lock held): skip it if the budget cannot hold it,
        else count it as running, so the next check sees it."""
        s = item[0]
        s.skipped = self._why_not()
        if not s.skipped:
            self._early_s.append(0.0)
            item[1] = len(self._early_s) - 1

    def _work(self, item: list) -> None:
        s, slot = item
        try:
            if not s.skipped:
                self._screen(s, slot)
        finally:
            s.done.set()

    def _screen(self, s: Screen, slot: int) -> None:
        """Run and price ``s``'s early evidence; its error in one line if it fails."""
        j = s.job
        t = clock()
        try:
            early = cached_early_evidence(j)
            if early is None:
                early = self.early_fn(j.fn, j.args, j.target, j.layout, j.device_order,
                                      timeout_s=max(self.budget.left(), 1.0),
                                      cancel=self._cancel)
                keep_early_evidence(j, early)
            s.price = self.price(early, j.device_order, self.network)
        except Exception as e:  # noqa: BLE001 -- a failed screen costs its place, not the plan
            why = (str(e).strip().splitlines() or [""])[0][:300]
            s.error = f"{type(e).__name__}: {why}" if not isinstance(
                e, (EarlyEvidenceError, EvidenceError)) else why
        with self._cv:
            self._early_s[slot] = clock() - t

    def full_estimate_s(self) -> float | None:
        """What a full compile is expected to take alone (module docstring), seconds; None
        before anything is known. Called with ``_cv`` held."""
        if any(not c.cached for c in self.queue.done):
            return self.queue.expected_compile_s
        known = [e for e in self._early_s if e > 0]
        return FULL_OVER_EARLY * max(known) if known else None

    def _why_not(self, before_s: float = 0.0) -> str:
        """Why the next screen, after ``before_s`` seconds of other work, does not start
        (module docstring), or "". ``_cv`` held."""
        if self.budget.compiles is not None:         # the count decides; the clock a guard
            return "" if self.budget.left() > 0 else "time budget spent (the guard)"
        full = self.full_estimate_s()
        if full is None:
            return ""
        early = max(self._early_s, default=0.0)
        left = self.budget.left() - self.queue.reserve_s
        need = before_s + early + MARGINS["compile"].need_s(full)
        if left >= need:
            return ""
        return (f"time budget: {max(left, 0.0):.1f} s left, kept for a full compile of the "
                f"screen's best (about {full:.1f} s)")

    def room_for(self, seconds: float) -> str:
        """Why ``seconds`` of other work (the ILPs' share), then one more screen and a full
        compile of the screen's best, do not fit (``_why_not``), or ""."""
        with self._cv:
            return self._why_not(seconds)

    def wait_first(self) -> None:
        """Wait for the screen of least priority submitted so far (the pricing order's
        first)."""
        with self._cv:
            first = min(self.screens.values(), key=lambda s: s.priority, default=None)
        if first is not None:
            first.done.wait()

    # -- the order -------------------------------------------------------------------------------
    def order(self, todo: list[PricingItem], record: list[dict[str, Any]]) -> list[PricingItem]:
        """Wait for the screens of ``todo`` (an iteration's layouts, submitted here), queue the
        full compiles of those screened in ``screen_key`` order (module docstring) and settle
        the others as ``Skipped``.

        Args:
          todo: the iteration's items in the pricing order.
          record: where each screen's summary is appended (``IterationRecord.screens``).

        Returns:
          The items to price: the screened ones in screen order (``rank`` their place), then
          those not screened (their Future a ``Skipped``).
        """
        screens = [self.screens[id(t.compiling)] for t in todo]
        for s in screens:
            s.done.wait()
        ranked = sorted((p for p in zip(todo, screens) if not p[1].skipped),
                        key=lambda p: p[1].key(p[0].rank))
        out = []
        for k, (item, s) in enumerate(ranked):
            real = self.queue.submit(s.job, priority=k, unless=s.unless, slower=s.slower)
            real.add_done_callback(lambda f, s=s: _chain(f, s.full))
            out.append(dataclasses.replace(item, rank=float(k)))
            record.append(s.summary(item.mesh, k))
        for item, s in zip(todo, screens):
            if s.skipped:
                settle(s.full, Skipped(s.skipped, clock=s.clock_limited,
                                        budget=s.skipped != "the planner stopped"))
                out.append(item)
                record.append(s.summary(item.mesh, None))
        return out

    # -- the end ---------------------------------------------------------------------------------
    def abandon(self, reason: str = "interrupted") -> None:
        """Settle every screen's full compile not queued yet as ``Skipped(reason)`` (an
        interrupt, from any thread; does not wait): a running early compile stops, its child
        killed and its files removed (``close`` waits for that)."""
        self._cancel.set()
        self._stop_screens()
        for s in list(self.screens.values()):
            settle(s.full, Skipped(reason, budget=False))

    def close(self, wait_s: float = 10.0) -> None:
        """Start no more screens (those not started are skipped) and wait up to ``wait_s`` for
        the screen threads to end: nothing is left running or behind after the plan."""
        self._stop_screens()
        self._pool.join(wait_s)

    def _stop_screens(self) -> None:
        for s, _ in self._pool.close():
            s.skipped, s.clock_limited = "the planner stopped", False
            s.done.set()


def _chain(src: Future, dst: Future) -> None:
    """Settle ``dst`` as ``src`` was."""
    if src.cancelled():
        settle(dst, Skipped("the planner stopped", budget=False))
    elif src.exception() is not None:
        settle(dst, error=src.exception())
    else:
        settle(dst, src.result())


def describe(counts: dict[str, int], compiled: int) -> str:
    """One line for the plan's notes: how many layouts were screened, and compiled fully."""
    failed = f", {counts['screen_failed']} failed" if counts.get("screen_failed") else ""
    skipped = (f", {counts['screen_skipped']} not screened (time budget)"
               if counts.get("screen_skipped") else "")
    return (f"screened {counts.get('screened', 0)} layout(s) by early evidence{failed}{skipped}; "
            f"compiled {compiled} fully, in screen-price order")


__all__ = ["FULL_OVER_EARLY", "SCREEN_SLOTS", "ScreenPrice", "Screen", "Screener",
           "screen_price", "describe"]
