"""Compile workers: a local worker process gives the in-process evidence and plan on the small
model; a worker that dies mid-compile costs that candidate, never the plan; Ray workers
(``pytest.importorskip("ray")``) give the local pool's plan and survive a killed worker. A plan
made twice with the evidence cache gives the same plan from the cache, and a corrupt entry is
reported in one line and recompiled."""

import functools
import os
import threading
import time

import pytest

from aoizora.builtin import builtin_job, expert_seed_layouts
from aoizora.planning.candidate_pricing import compile_job
from aoizora.planning.compile_queue import Compiled, CompileQueue
from aoizora.planning.compile_workers import (InlineWorkers, LocalWorkers, WorkersError, auto_slots,
                                     workers_for)
from aoizora.extract.aot_compile import CompileError
from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.planner import plan
from aoizora.runtime.realize import RealizeError
from aoizora.solvers.budget import Budget

pytestmark = pytest.mark.tpu_compiler


@pytest.fixture(scope="module")
def job():
    return builtin_job("wan2.1-small", "128p", 9, "v5e-4")


def _plan(job, **kw):
    """A short plan of the small model on v5e-4: two expert seeds and the ILP's best layout on
    one mesh, one iteration (no time limit binds there: the plan is repeatable)."""
    return plan(job.fn, *job.args, target=job.target, time_budget_s=240, top_k=1,
                max_iterations=1, meshes=[{"data": 2, "seq": 2}], placement_time_s=5,
                seed_layouts=expert_seed_layouts(job)[:2], **kw)


def _same_plan(a, b):
    assert a.layout.to_json() == b.layout.to_json()
    assert a.device_order == b.device_order
    assert a.predicted["step_s"] == pytest.approx(b.predicted["step_s"], rel=1e-9)


def _queue(workers):
    t0 = time.perf_counter()
    return CompileQueue(Budget.until(t0 + 600, t0), (CompileError, RealizeError), workers=workers)


def test_auto_slots_and_specs():
    assert auto_slots(cores=2, memory_bytes=64 * 1024**3) == 1
    assert auto_slots(cores=16, memory_bytes=13 * 1024**3) == 2     # memory binds
    assert auto_slots(cores=16, memory_bytes=1 << 40) == 8
    assert isinstance(workers_for("inline"), InlineWorkers)
    with pytest.raises(WorkersError, match="auto, inline"):
        workers_for("gpu-farm")
    with pytest.raises(WorkersError, match="local:N"):
        workers_for("local:0")


class _TwoSlots(InlineWorkers):
    slots = 2


def test_with_two_in_flight_compiles_start_in_priority_order():
    from types import SimpleNamespace as NS

    t0 = time.perf_counter()
    q = CompileQueue(Budget.until(t0 + 60, t0), (CompileError,), workers=_TwoSlots())
    started, running, peak, lock = [], [0], [0], threading.Lock()

    def job(p):
        def run():
            with lock:
                started.append(p)
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            return NS(memory=NS(fits=True), source="")
        return run

    q.hold(-1)                          # nothing starts until all four are queued
    fs = [q.submit(job(p), priority=p) for p in (3, 1, 2, 0)]
    q.release()
    got = [f.result() for f in fs]
    q.close()
    assert sorted(started[:2]) == [0, 1] and sorted(started[2:]) == [2, 3] and peak[0] == 2
    assert all(g.evidence is not None for g in got) and q.compiles_left() > 1


def test_a_local_worker_gives_the_in_process_evidence_and_survives_a_death(job):
    seed = expert_seed_layouts(job)[0]
    work = compile_job(seed.fn or job.fn, seed.args or job.args, job.target, seed.layout)
    here = work()
    pool = LocalWorkers(1)
    try:
        q = _queue(pool)
        dies = q.submit(functools.partial(os._exit, 3))          # the worker dies mid-job
        there = q.submit(work)
        lost, got = dies.result(), there.result()
        q.close()
        assert isinstance(lost, Compiled) and lost.evidence is None
        assert "died mid-compile" in lost.error and "\n" not in lost.error
        assert got.error == "" and got.evidence.to_json() | {"compile_s": 0} == \
            here.to_json() | {"compile_s": 0}
        assert q.counts == {"compiled": 1, "cached": 0, "failed": 1}
    finally:
        pool.close()


@pytest.fixture(scope="module")
def cold(job, tmp_path_factory):
    """The plan with every compile in a local worker process, into an evidence cache."""
    lines = []
    cache = EvidenceCache(tmp_path_factory.mktemp("cache"), report=lines.append)
    pool = LocalWorkers(1)
    try:
        return _plan(job, cache=cache, compile_workers=pool), cache, lines
    finally:
        pool.close()


def test_a_plan_from_a_local_pool_equals_the_in_process_plan(job, cold):
    """Its evidence is the in-process compile's (the test above, on one candidate); here the
    in-process planner on that evidence (the cache) makes the same plan."""
    pooled, cache, _ = cold
    assert pooled.compiles["workers"] == "local processes" and pooled.compiles["failed"] == 0
    here = _plan(job, cache=cache, compile_workers="inline")
    _same_plan(pooled, here)
    assert here.compiles["workers"] == "in-process" and here.compiles["compiled"] == 0


def test_a_worker_killed_mid_compile_costs_that_candidate_not_the_plan(job, cold):
    pool, killed = LocalWorkers(1), []

    def kill_the_first_worker():       # while it starts and runs its first job
        for _ in range(1200):
            pids = pool.worker_pids()
            if pids:
                time.sleep(0.3)   # real time: the worker process must be mid-compile
                os.kill(pids[0], 9)
                killed.append(pids[0])
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_first_worker, daemon=True)
    killer.start()
    try:
        survived = _plan(job, compile_workers=pool, cache=cold[1])
    finally:
        killer.join(timeout=5)
        pool.close()
    assert killed and survived.compiles["failed"] == 1 and survived.predicted["step_s"] > 0
    its = [c for r in survived.iterations for c in r["candidates"]]
    assert sum("died mid-compile" in (c.get("error") or "") for c in its) == 1


def test_a_warm_cache_gives_the_same_plan_and_a_corrupt_entry_is_recompiled(job, cold):
    first, cache, lines = cold
    n = first.compiles["compiled"]
    assert n >= 2 and first.compiles["cached"] == 0 and first.compiles["cache"] == cache.directory
    warm = _plan(job, cache=cache, compile_workers="inline")
    _same_plan(first, warm)
    assert warm.compiles["compiled"] == 0 and warm.compiles["cached"] == n
    its = [c for r in warm.iterations for c in r["candidates"]]
    assert its and all(c["evidence"] == "cache" for c in its)
    # the ILPs and placements no clock decided came back too (planning.solve_memo)
    assert warm.compiles["solver_answers_cached"] >= 2
    _, _, path = sorted(cache.entries())[0]
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    again = _plan(job, cache=cache, compile_workers="inline")
    _same_plan(first, again)
    assert again.compiles["compiled"] == 1 and again.compiles["cached"] == n - 1
    assert len(lines) == 1 and "corrupt entry" in lines[0] and "\n" not in lines[0]


def test_a_corrupt_solver_answer_is_reported_in_one_line_and_solved_again(job, cold):
    """The solver answers kept beside the evidence (``planning.solve_memo``) and the lowerings'
    records (``planning.lowering_memo``): every damaged record the plan reads is reported in one
    line, its ILP or placement solved again, its layout lowered again; the same plan, nothing
    compiled."""
    first, cache, lines = cold
    rec = [p for _, _, p in cache.entries(records=True) if p.endswith(".rec")]
    assert rec, "the cold plan kept no solver answer"
    for path in rec:
        with open(path, "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"XXXX")
    before = len(lines)
    again = _plan(job, cache=cache, compile_workers="inline")
    _same_plan(first, again)
    said = lines[before:]
    assert said and all("corrupt entry" in ln and "\n" not in ln for ln in said)
    # a solver's answer is solved again; a lowering's record (planning.lowering_memo) lowered
    assert {"solving again", "lowering again"} == {
        then for ln in said for then in ("solving again", "lowering again") if then in ln}
    assert again.compiles["compiled"] == 0 and not again.compiles.get("solver_answers_cached")


def test_ray_workers_give_the_local_pools_plan_and_survive_a_killed_worker(job):
    ray = pytest.importorskip("ray")
    from aoizora.planning.compile_workers import RayWorkers

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        workers = RayWorkers(max_retries=0)
        q = _queue(workers)
        lost = q.submit(functools.partial(os._exit, 3)).result()
        q.close()
        assert lost.evidence is None and "Ray compile worker was lost" in lost.error
        pool = LocalWorkers(1)
        try:
            local = _plan(job, compile_workers=pool)
        finally:
            pool.close()
        on_ray = _plan(job, compile_workers=workers)
    finally:
        if started:
            ray.shutdown()
    _same_plan(local, on_ray)
    assert on_ray.compiles["workers"] == "Ray tasks" and on_ray.compiles["failed"] == 0


@pytest.mark.parametrize("flags, says", [
    (["--compile-workers", "gpu-farm"], "--compile-workers 'gpu-farm': use auto"),
    (["--cache-dir", "FILE"], "--cache-dir: cache directory"),
])
def test_cli_refuses_bad_workers_and_cache_in_one_line(tmp_path, flags, says):
    import subprocess
    import sys

    (tmp_path / "FILE").write_text("x")
    r = subprocess.run([sys.executable, "-m", "aoizora", "plan", "--model", "wan2.1-small",
                        "--resolution", "128p", "--frames", "9", "--quiet", *flags],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
