"""The planner's background compile queue: one compile at a time, results in submission order,
the budget checked when a compile starts, compile errors as one line, others propagated."""

import threading
import time
from types import SimpleNamespace as NS

import pytest

from aoizora.planning.compile_queue import Compiled, CompileQueue, Skipped
from aoizora.solvers.budget import Budget


class Boom(ValueError):
    pass


def _ev(fits=True):
    return NS(memory=NS(fits=fits))


def test_compiles_run_one_at_a_time_in_order_and_errors_are_one_line():
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))
    running, peak, order = [0], [0], []
    lock = threading.Lock()

    def job(i, fail=False):
        def run():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            order.append(i)
            with lock:
                running[0] -= 1
            if fail:
                raise Boom(f"no layout {i}\nsecond line")
            return _ev()
        return run

    fs = [q.submit(job(0)), q.submit(job(1, fail=True)), q.submit(job(2))]
    got = [f.result() for f in fs]
    q.close()
    assert order == [0, 1, 2] and peak[0] == 1
    assert all(isinstance(g, Compiled) for g in got)
    assert got[1].error == "no layout 1" and got[1].evidence is None
    assert got[0].evidence is not None and got[2].seconds > 0
    assert got[0].started_s <= got[1].started_s <= got[2].started_s
    assert len(q.done) == 3 and q.fitting and [c.seconds for c in q.done] == [g.seconds for g in got]


def test_a_compile_that_cannot_fit_the_budget_is_skipped_once_something_fits(frozen_clock):
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 0.35, t0), (Boom,))

    def slow():
        frozen_clock.sleep(0.3)
        return _ev()

    first, second = q.submit(slow), q.submit(slow)
    assert isinstance(first.result(), Compiled)
    s = second.result()     # < 0.05 s left < 1.2 x 0.3 s + 1 s
    q.close()
    assert isinstance(s, Skipped) and "time budget" in s.reason


def test_no_compile_starts_into_the_reserve(frozen_clock):
    """The time the planner keeps for after its last compile counts as spent."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 5.0, t0), (Boom,), reserve_s=4.0)

    def quick():
        frozen_clock.sleep(0.2)
        return _ev()

    first, second = q.submit(quick), q.submit(quick)
    assert isinstance(first.result(), Compiled)
    s = second.result()     # ~4.8 s left, 4 s kept: < 1.2 x 0.2 s + 1 s
    q.close()
    assert isinstance(s, Skipped) and "4.0 s of it kept for after" in s.reason
    # without the reserve the same compile starts
    q = CompileQueue(Budget.until(time.perf_counter() + 5.0, t0), (Boom,))
    first, second = q.submit(quick), q.submit(quick)
    assert isinstance(first.result(), Compiled) and isinstance(second.result(), Compiled)
    q.close()


def test_layouts_that_do_not_fit_keep_the_compiles_going_past_the_budget(frozen_clock):
    """Until a compiled layout fits in HBM nothing can be priced, so compiles go on."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 0.1, t0), (Boom,))

    def oom():
        frozen_clock.sleep(0.15)
        return _ev(fits=False)

    got = [q.submit(oom).result() for _ in range(2)]
    q.close()
    assert all(isinstance(g, Compiled) and not g.evidence.memory.fits for g in got)


def test_no_first_compile_past_the_deadline_and_other_exceptions_propagate():
    t0 = time.perf_counter()
    late = CompileQueue(Budget.until(t0 - 1, t0), (Boom,))
    assert isinstance(late.submit(_ev).result(), Skipped)
    late.close()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))

    def bug():
        raise KeyError("a bug, not a compile error")

    with pytest.raises(KeyError):
        q.submit(bug).result()
    q.close()


def test_close_skips_what_has_not_started():
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))
    gate, started = threading.Event(), threading.Event()
    first = q.submit(lambda: (started.set(), gate.wait(5), _ev())[2])
    rest = [q.submit(_ev) for _ in range(3)]
    assert started.wait(5)      # close() after the first has started (else it is cancelled too)
    threading.Timer(0.1, gate.set).start()
    q.close()
    assert isinstance(first.result(), Compiled)
    assert all(f.cancelled() or isinstance(f.result(), Skipped) for f in rest)


def test_the_next_compile_is_the_pending_one_of_least_priority():
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))
    gate, order = threading.Event(), []

    def job(i):
        def run():
            order.append(i)
            return _ev()
        return run

    first = q.submit(lambda: (gate.wait(5), _ev())[1], priority=0)
    fs = [q.submit(job(i), priority=i) for i in (5, 1, 3)]
    gate.set()
    assert isinstance(first.result(), Compiled)
    [f.result() for f in fs]
    q.close()
    assert order == [1, 3, 5]


def test_the_time_a_compile_shared_with_the_ilps_counts_at_half(frozen_clock):
    """A compile slowed by the ILPs beside it is not taken for one that needs that long alone:
    the part of it that overlapped the contended period counts at half."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))

    def take(s):
        def run():
            frozen_clock.sleep(s)
            return _ev()
        return run

    q.contended(True)
    beside = q.submit(take(0.4)).result()
    q.contended(False)
    assert beside.contended_s == pytest.approx(beside.seconds) == pytest.approx(0.4)
    assert q.expected_compile_s == pytest.approx(0.2)
    alone = q.submit(take(0.3)).result()
    assert alone.contended_s == 0.0
    assert q.expected_compile_s == pytest.approx(0.3)
    gate, mid, resume = threading.Event(), threading.Event(), threading.Event()

    def half_beside():           # 0.3 s beside the ILPs, then 0.5 s alone
        gate.wait(5)
        frozen_clock.sleep(0.3)
        mid.set()
        resume.wait(5)
        frozen_clock.sleep(0.5)
        return _ev()

    half = q.submit(half_beside)
    q.contended(True)
    gate.set()
    assert mid.wait(5)
    q.contended(False)          # the ILPs end while the compile runs
    resume.set()
    h = half.result()
    q.close()
    assert h.contended_s == pytest.approx(0.3) and h.seconds == pytest.approx(0.8)


def test_a_held_queue_starts_nothing_above_the_hold_until_released():
    """``hold(p)``: compiles at or below ``p`` run, those above wait, even with the worker idle,
    until ``release()``; a compile submitted meanwhile at or below ``p`` goes first."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))
    ran: list[int] = []

    def job(i):
        def run():
            ran.append(i)
            return _ev()
        return run

    q.hold(3)
    later = q.submit(job(4), priority=4)
    q.submit(job(1), priority=1).result(timeout=5)
    time.sleep(0.1)                      # the worker is idle: 4 is held
    assert ran == [1] and not later.done()
    q.submit(job(3), priority=3).result(timeout=5)
    assert ran == [1, 3] and not later.done()
    q.release()
    later.result(timeout=5)
    assert ran == [1, 3, 4]
    q.hold(0)                            # closing a held queue skips what waits
    held = q.submit(job(5), priority=5)
    q.close()
    assert held.cancelled() or isinstance(held.result(), Skipped)


def test_compiles_left_counts_what_the_budget_holds_with_the_start_margin():
    """Before any compile nothing is known (a large count); after one of 0.5 s alone, 10.5 s
    left less a 2 s reserve hold floor(8.5 / (1.2 x 0.5 + 1)) = 5, the same margin the start
    check uses."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 10.5, t0), (Boom,), reserve_s=2.0)
    assert q.compiles_left() > 1000
    q.done.append(Compiled(seconds=0.5))
    assert q.compiles_left() == 5
    q.done.append(Compiled(seconds=3.0, contended_s=2.0))     # 2 s alone: floor(8.5 / 3.4) = 2
    assert q.compiles_left() == 2
    q.budget.deadline = time.perf_counter() + 1.0
    assert q.compiles_left() == 0
    q.close()


def test_raising_the_hold_starts_what_it_now_allows():
    """A hold raised above a waiting compile lets it start with nothing else submitted (the
    planner raises the hold after the training seeds' refinements; where no seed could be
    refined, nothing else was ever submitted to wake the worker)."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))
    q.hold(0.5)
    waiting = q.submit(lambda: _ev(), priority=0.9)
    time.sleep(0.1)                      # the worker is idle: 0.9 is held
    assert not waiting.done()
    q.hold(4)
    assert isinstance(waiting.result(timeout=5), Compiled)
    q.close()


def test_a_compile_its_submitter_no_longer_wants_is_skipped_not_run():
    """``unless`` is asked when the compile would start: a reason skips it (not the budget's
    skip), "" runs it."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (Boom,))
    ran = []
    first = q.submit(lambda: _ev(fits=False))
    twin = q.submit(lambda: ran.append("twin") or _ev(),
                    unless=lambda: "" if first.result().evidence.memory.fits else "did not fit")
    other = q.submit(lambda: ran.append("other") or _ev(), unless=lambda: "")
    got = twin.result()
    assert isinstance(got, Skipped) and got.reason == "did not fit" and not got.budget
    assert isinstance(other.result(), Compiled) and ran == ["other"]
    q.close()


def test_a_compile_expected_slower_is_skipped_where_a_usual_one_starts(frozen_clock):
    """``slower``: a program expected to compile that many times as long as the longest so far
    (a training seed's own step) must fit the budget at that length."""
    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 5.0, t0), (Boom,))

    def half_second():
        frozen_clock.sleep(0.5)
        return _ev()

    first = q.submit(half_second)
    unusual = q.submit(half_second, slower=8.0)    # ~4.5 s left < 1.2 x 4 s + 1 s
    usual = q.submit(half_second)                  # 1.2 x 0.5 s + 1 s fits
    assert isinstance(first.result(), Compiled)
    s = unusual.result()
    assert isinstance(s, Skipped) and s.budget and "a compile takes about 4.0 s" in s.reason
    assert isinstance(usual.result(), Compiled)
    q.close()


def test_a_compile_count_decides_which_compiles_start_whatever_the_clock():
    """``Budget(compiles=N)``: once something fits, the (N+1)-th compile is skipped by the
    count (``clock=False``: repeatable), with hours of time left; before anything fits, the
    count does not stop the queue (nothing could be priced)."""
    q = CompileQueue(Budget(3600.0, compiles=2), (Boom,))
    fits = [False, True, True, True]
    fs = [q.submit(lambda f=f: _ev(f), priority=i) for i, f in enumerate(fits)]
    got = [f.result() for f in fs]
    q.close()
    assert [type(g).__name__ for g in got] == ["Compiled", "Compiled", "Skipped", "Skipped"]
    assert not got[2].clock and got[2].budget and "compile budget: 2" in got[2].reason
    assert q.compiles_left() == 0 and len(q.done) == 2


def test_compiles_left_counts_finished_compiles_only():
    q = CompileQueue(Budget(3600.0, compiles=3), (Boom,))
    assert q.compiles_left() == 3            # nothing finished: the count alone
    release, started = threading.Event(), threading.Event()

    def held():
        started.set()
        release.wait(5)
        return _ev()

    f = q.submit(held)
    started.wait(5)
    assert q.compiles_left() == 3            # one running: not yet counted
    release.set()
    f.result()
    assert q.compiles_left() == 2
    q.close()
    with pytest.raises(ValueError, match="whole number of compiles"):
        Budget(60.0, compiles=0)


def test_compiles_kept_for_later_are_not_started_until_released():
    """With a count of 3 and one kept, the third compile comes back skipped by the submitter's
    reason (the planner goes on); released, the next one runs."""
    q = CompileQueue(Budget(600.0, compiles=3), (Boom,))
    q.reserve_compiles = 1
    got = [q.submit(lambda: _ev()).result() for _ in range(3)]
    assert all(isinstance(g, Compiled) for g in got[:2])
    assert isinstance(got[2], Skipped) and not got[2].budget and "kept" in got[2].reason
    q.reserve_compiles = 0
    assert isinstance(q.submit(lambda: _ev()).result(), Compiled)
    last = q.submit(lambda: _ev()).result()
    q.close()
    assert isinstance(last, Skipped) and last.budget and not last.clock
