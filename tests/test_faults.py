"""Faults injected where a user loses work (issue 51): a full disk under a save, SIGINT and SIGTERM
sent to a real ``aoizora plan`` mid-run, a second Ctrl-C, a compile worker that dies, two
planners writing one --out, interrupts inside a solver.

The subprocess tests plan the small built-in model for real (each compiles it a few times: about
20-40 s on 2 cores); they are marked ``tpu_compiler`` and ``faults``."""

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from aoizora.cli import main
from aoizora.planning.compile_queue import CompileQueue, Compiled, Skipped
from aoizora.extract import atomic_io
from aoizora.extract.atomic_io import atomic_open, atomic_write
from aoizora.plans import Plan, load_plan
from aoizora.solvers.budget import Budget
from aoizora.solvers.stop import Stop, cancel_on_stop, running

from test_cli_errors import _plan_json

JOB = ["--model", "wan2.1-small", "--resolution", "128p", "--frames", "9", "--target", "v5e-8"]


# -- atomic saves ----------------------------------------------------------------------------
def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_leaves_the_old_plan_whole(tmp_path, monkeypatch):
    """A save that fails half-way (ENOSPC at the rename, and at the write) leaves the old file
    byte for byte and no temporary file."""
    path = tmp_path / "plan.json"
    plan = Plan.from_json(_plan_json())
    plan.save(str(path))
    before = path.read_bytes()
    monkeypatch.setattr(atomic_io.os, "replace", _enospc)
    with pytest.raises(OSError, match="No space left"):
        plan.save(str(path))
    monkeypatch.undo()
    monkeypatch.setattr(atomic_io.os, "fsync", _enospc)
    with pytest.raises(OSError, match="No space left"):
        plan.save(str(path))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    assert load_plan(str(path)).to_json() == plan.to_json()


class _FullFile:
    """A file object whose writes fail after ``room`` bytes, as on a full disk."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, data):
        if len(data) > self.room:
            self.f.write(data[:self.room])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_write_cut_short_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    atomic_write(path, json.dumps({"old": list(range(1000))}))
    before = path.read_bytes()
    real = os.fdopen
    monkeypatch.setattr(atomic_io.os, "fdopen", lambda *a, **k: _FullFile(real(*a, **k), 100))
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, json.dumps({"new": list(range(5000))}))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_atomic_open_keeps_the_files_mode_and_writes_bytes(tmp_path):
    path = tmp_path / "picture.png"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    with atomic_open(path, "wb") as f:
        f.write(b"\x89PNG new")
    assert path.read_bytes() == b"\x89PNG new" and (os.stat(path).st_mode & 0o777) == 0o640


def test_a_failed_save_still_prints_the_plan_and_exits_2(tmp_path, capsys, monkeypatch):
    """The CLI's save step: the plan reaches stdout (JSON with --json), then one line, exit 2,
    and the file that was there is unchanged."""
    from aoizora import cli, planner

    out = tmp_path / "p.json"
    out.write_text("the previous plan\n")
    plan = Plan.from_json(_plan_json())
    monkeypatch.setattr(planner, "plan", lambda *a, **k: plan)
    monkeypatch.setattr(cli, "_job", lambda args: _FakeJob())
    monkeypatch.setattr("aoizora.builtin.expert_seed_layouts", lambda job: [])
    monkeypatch.setattr(atomic_io.os, "replace", _enospc)
    code = main(["plan", *JOB, "--quiet", "--json", "--out", str(out)])
    cap = capsys.readouterr()
    assert code == 2
    assert json.loads(cap.out)["status"] == plan.status       # the plan, on stdout
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "could not be saved" in err[0] and "No space left" in err[0]
    assert "Traceback" not in cap.err
    assert out.read_text() == "the previous plan\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


@pytest.mark.parametrize("fault", ["directory-removed", "file-too-large"])
def test_a_save_that_fails_at_the_end_of_a_run_still_prints_the_plan(tmp_path, capsys,
                                                                     monkeypatch, fault):
    """The --out directory removed while planning ran (checked writable at the start), or the
    process's file size limit hit (EFBIG): the summary is printed, then one line, exit 2."""
    from aoizora import cli, planner

    where = tmp_path / "out"
    where.mkdir()
    plan = Plan.from_json(_plan_json())

    def planned(*a, **k):
        if fault == "directory-removed":
            where.rmdir()
        else:
            monkeypatch.setattr(atomic_io.os, "fsync", lambda fd: (_ for _ in ()).throw(
                OSError(errno.EFBIG, os.strerror(errno.EFBIG))))
        return plan

    monkeypatch.setattr(planner, "plan", planned)
    monkeypatch.setattr(cli, "_job", lambda args: _FakeJob())
    monkeypatch.setattr("aoizora.builtin.expert_seed_layouts", lambda job: [])
    code = main(["plan", *JOB, "--quiet", "--out", str(where / "p.json")])
    cap = capsys.readouterr()
    assert code == 2 and cap.out.startswith("AoiZora plan for v5e:2x4")
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and "could not be saved" in err[0], err
    assert ("No such file or directory" if fault == "directory-removed"
            else "File too large") in err[0]
    assert "saved:" not in cap.out


class _FakeJob:
    fn, args, target = None, (), "v5e-8"

    def describe(self):
        return "a job"

    def program(self):
        return {}


def test_an_empty_out_is_refused(capsys):
    assert main(["plan", *JOB, "--out", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out: an empty path" in err


def test_two_writers_one_out_a_reader_never_sees_a_torn_plan(tmp_path):
    """Two processes save plans to one path over and over while this one reads it: every read
    is a whole plan, one of the two."""
    path = tmp_path / "p.json"
    a, b = _plan_json(), _plan_json()
    b["predicted"]["step_s"] = 2e-3
    Plan.from_json(a).save(str(path))
    code = ("import json, sys; from aoizora.plans import Plan; "
            "p = Plan.from_json(json.loads(sys.argv[1])); "
            "[p.save(sys.argv[2]) for _ in range(60)]")
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps(d), str(path)])
             for d in (a, b)]
    steps, reads = set(), 0
    while any(p.poll() is None for p in procs):
        steps.add(load_plan(str(path)).predicted["step_s"])
        reads += 1
    assert [p.wait() for p in procs] == [0, 0]
    steps.add(load_plan(str(path)).predicted["step_s"])
    assert reads > 0 and steps <= {1e-3, 2e-3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json"]


# -- the compile queue under an interrupt, a dead worker -------------------------------------
class _Ev:
    class memory:
        fits = True


def test_an_interrupt_abandons_the_running_compile_without_waiting():
    queue = CompileQueue(Budget(60.0))
    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(5)
        return _Ev()

    running_f = queue.submit(slow)
    pending_f = queue.submit(lambda: _Ev(), priority=1)
    started.wait(5)
    stop = Stop()
    with stop.cancelling(queue.abandon):
        stop.request("SIGINT")
    assert isinstance(running_f.result(timeout=0.1), Skipped)      # not awaited
    assert isinstance(pending_f.result(timeout=0.1), Skipped)
    assert queue.abandoned[0].startswith("a compile running for")
    queue.close(wait=False)
    release.set()


def test_a_killed_compile_worker_is_an_error_not_a_hang():
    """A compile that dies in its worker (here: the worker's job raises SystemExit, as a killed
    compile would end it) reaches the planner as an exception from result(), not a hang; the
    next compile still runs."""
    queue = CompileQueue(Budget(60.0))

    def killed():
        raise SystemExit("compile worker killed")

    f = queue.submit(killed)
    with pytest.raises(SystemExit, match="killed"):
        f.result(timeout=5)
    g = queue.submit(lambda: _Ev())
    assert isinstance(g.result(timeout=5), Compiled)
    queue.close()


def test_a_stop_kills_a_solver_process_at_once():
    """``mip_run._run_until``: a stop requested while a solver process runs kills it (it does not
    run to its deadline); the cut is recorded."""
    from aoizora.solvers.budget import clock
    from aoizora.solvers.mip_run import _run_until  # noqa: PLC2701 -- the unit under test

    stop = Stop()
    threading.Timer(0.05, stop.request, args=("SIGTERM",)).start()
    with running(stop):
        t = clock()
        rc, killed = _run_until([sys.executable, "-c", "import time; time.sleep(30)"],
                                clock() + 30)
    assert clock() - t < 5 and rc != 0 and not killed
    assert stop.cut == ["a sharding ILP's solver process (killed)"]


def test_an_interrupt_inside_cp_sat_stops_its_search_and_is_recorded():
    """A CP-SAT search the stop lands in returns early (StopSearch from another thread) and the
    Stop says what it cut."""
    from ortools.sat.python import cp_model

    from aoizora.solvers.cpsat_params import solve

    m = cp_model.CpModel()
    xs = [m.NewIntVar(0, 50, f"x{i}") for i in range(40)]
    m.AddAllDifferent(xs)
    m.Maximize(sum((i % 7) * x for i, x in enumerate(xs)) - sum(x * 0 for x in xs))
    s = cp_model.CpSolver()
    s.parameters.max_time_in_seconds = 60
    s.parameters.num_workers = 1
    stop = Stop()
    threading.Timer(0.3, stop.request, args=("SIGINT",)).start()
    with running(stop):
        t = time.perf_counter()
        solve(s, m)
    assert time.perf_counter() - t < 10
    assert stop.cut == ["a placement CP-SAT search (stopped early)"]
    assert not s.parameters.catch_sigint_signal


def test_a_quit_at_once_removes_the_solver_runs_temporary_directory(tmp_path):
    """A second signal quits with ``os._exit`` (no unwinding): the temporary directory of the
    solver run in progress is removed by the Stop's quit cleanups, not left behind."""
    import shutil
    import tempfile
    from functools import partial

    from aoizora.solvers.stop import clean_on_quit

    stop = Stop()
    with running(stop):
        d = tempfile.mkdtemp(dir=tmp_path)
        with clean_on_quit(partial(shutil.rmtree, d, True)):
            stop.quit_cleanups()          # what SignalHandling.quit runs before os._exit
            assert not os.path.exists(d)
    assert list(tmp_path.iterdir()) == []


def test_cancel_on_stop_without_a_run_does_nothing():
    with cancel_on_stop(lambda: pytest.fail("called")):
        pass


# -- plan files ------------------------------------------------------------------------------
def test_show_refuses_nan_and_never_prints_it(tmp_path, capsys):
    d = _plan_json()
    text = json.dumps(d).replace('"objective": 0.0002', '"objective": NaN')
    path = tmp_path / "nan.json"
    path.write_text(text)
    assert main(["show", str(path), "--json"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.startswith(
        "aoizora: error: certificates.placement.objective: nan is not a finite number")


# -- check: 1 only for a regression ---------------------------------------------------------
@pytest.mark.tpu_compiler
@pytest.mark.parametrize("command,flags,said", [
    ("check", "--xla_bogus_flag=1", "Unknown command line flag 'xla_bogus_flag'"),
    ("plan", "--xla_tpu_enable_async_collective_fusion=maybe", "Illegal value 'maybe'"),
])
def test_check_under_a_bad_libtpu_init_args_exits_2_in_one_line(tmp_path, command, flags, said):
    """libtpu exits 1 on an option it refuses, the code a CI gate reads as a regression: check
    (and plan) validate LIBTPU_INIT_ARGS first and exit 2 with libtpu's own line."""
    path = tmp_path / "plan.json"
    Plan.from_json(_plan_json()).save(str(path))
    env = {**os.environ, "LIBTPU_INIT_ARGS": flags}
    for argv in ([["check", str(path), *JOB]] if command == "check"
                 else [["plan", *JOB, "--quiet"]]):
        r = subprocess.run([sys.executable, "-m", "aoizora", *argv], capture_output=True,
                           text=True, env=env, timeout=300)
        assert r.returncode == 2, r.stderr[-1000:]
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"aoizora: error: LIBTPU_INIT_ARGS={flags!r}: libtpu refuses it (ERROR: "), lines
        assert said in lines[0] and r.stdout == ""


def test_check_without_libtpu_is_a_configuration_error(tmp_path, capsys, monkeypatch):
    from aoizora import builtin
    from aoizora.extract import targets

    path = tmp_path / "plan.json"
    Plan.from_json(_plan_json()).save(str(path))
    monkeypatch.setattr(targets, "libtpu_available", lambda: False)
    monkeypatch.setattr(builtin, "builtin_job", lambda *a, **k: pytest.fail("a job was built"))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("aoizora: error: libtpu is unavailable here")


# -- API inputs ------------------------------------------------------------------------------
def _api_plan(fn, *args, **kw):
    import aoizora

    kw.setdefault("target", "v5e-8")
    kw.setdefault("meshes", [{"x": 8}])
    with pytest.raises(aoizora.PlanningError) as e:
        aoizora.plan(fn, *args, **kw)
    msg = str(e.value)
    assert "\n" not in msg and msg
    return e.value


def _x(*shape):
    import jax
    import jax.numpy as jnp

    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_a_function_that_raises_while_traced_is_a_planning_error():
    def broken(x):
        raise RuntimeError("the model is broken")

    e = _api_plan(broken, _x(8, 128))
    assert e.kind == "trace"
    assert str(e).startswith("fn broken raised while traced for the abstract inputs "
                             "(RuntimeError: the model is broken)")


def test_numpy_on_a_tracer_says_to_use_jax_numpy():
    import numpy as np

    def uses_numpy(x):
        return np.sin(x)

    e = _api_plan(uses_numpy, _x(8, 128))
    assert e.kind == "trace" and str(e).startswith("fn uses_numpy raised while traced")
    assert "use jax.numpy, not numpy, on the traced values" in str(e)


@pytest.mark.parametrize("fn,what", [(None, "fn is a NoneType, not a function"),
                                     ("step", "fn is a str, not a function")])
def test_a_function_that_is_not_callable_is_named(fn, what):
    e = _api_plan(fn, _x(8, 128))
    assert e.kind == "input" and str(e).startswith(what)


@pytest.mark.parametrize("shape,bad", [((0, 128), "0"), ((8, 8.5), "8.5"), ((8, -1), "-1")])
def test_a_dimension_that_is_not_a_positive_integer_is_named(shape, bad):
    import jax.numpy as jnp

    e = _api_plan(lambda x: jnp.sin(x), _x(*shape))
    assert e.kind == "input"
    assert str(e).startswith(f"argument 0 has shape {shape}: dimension {bad} is not a positive "
                             f"integer")


@pytest.mark.parametrize("budget", ["60", None, True, [60]])
def test_a_budget_of_the_wrong_type_is_named(budget):
    import jax.numpy as jnp

    import aoizora

    e = _api_plan(lambda x: jnp.sin(x), _x(8, 128), time_budget_s=budget)
    assert isinstance(e, aoizora.BudgetError) and e.kind == "input"
    assert str(e).startswith(f"time_budget_s={budget!r}: give a positive, finite number")


@pytest.mark.tpu_compiler
def test_an_interrupt_inside_the_placement_cp_sat_is_in_time_limited(monkeypatch):
    """plan() as the API, in the main thread: a SIGINT that lands inside a CP-SAT search (once a
    candidate is priced) stops that search and the run; the plan comes back INTERRUPTED with
    the search named in ``time_limited`` (CP-SAT's own SIGINT handler would have swallowed it)."""
    import jax.numpy as jnp
    from ortools.sat.python import cp_model

    import aoizora
    from aoizora.models import registry as R

    m = R.get_model("wan2.1-small")
    fn = R.denoise_step(m, pad_multiple=128)
    args = R.abstract_inputs(m, m.workloads[0], dtype=jnp.float32)
    priced, sent = [], []
    solve = cp_model.CpSolver.Solve

    def interrupted_solve(self, *a, **k):
        if priced and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)             # the handler runs here, or right after the search
        return solve(self, *a, **k)

    monkeypatch.setattr(cp_model.CpSolver, "Solve", interrupted_solve)
    handler = signal.getsignal(signal.SIGINT)
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, top_k=2,
                     meshes=[{"x": 2, "y": 4}], max_iterations=2, on_candidate=priced.append)
    assert sent and signal.getsignal(signal.SIGINT) is handler     # handlers restored
    assert p.status == "INTERRUPTED" and len(priced) >= 1
    assert any(w.startswith("interrupted by SIGINT at ") and w.endswith(
        "a placement CP-SAT search (stopped early)") for w in p.time_limited), p.time_limited
    assert p.notes[0].startswith("INTERRUPTED")
    json.loads(json.dumps(p.to_json(), allow_nan=False))


@pytest.mark.tpu_compiler
def test_an_interrupt_during_the_final_recompile_abandons_it():
    """The plan's re-compile in its device order (the last step) runs on a thread of its own: a
    SIGINT during it returns the plan at once, INTERRUPTED, without waiting for the compile
    (here one that would take 60 s)."""
    import jax
    import jax.numpy as jnp

    import aoizora
    from aoizora.planning.candidate_pricing import compile_layout
    from aoizora.planning.seams import Seams

    def mlp(x, w):
        return jnp.tanh(x @ w) @ w.T

    args = (jax.ShapeDtypeStruct((256, 512), jnp.float32),
            jax.ShapeDtypeStruct((512, 512), jnp.float32))
    released, priced = threading.Event(), threading.Event()

    def endless_final_compile(*a, **k):   # the loop's one candidate compiles; the re-compile hangs
        if not priced.is_set():
            return compile_layout(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)
        released.wait(60)

    t = time.perf_counter()
    p = aoizora.plan(mlp, *args, target="v5e-8", time_budget_s=60, top_k=1,
                     meshes=[{"x": 8}], max_iterations=1, on_candidate=lambda c: priced.set(),
                     seams=Seams(compile_layout=endless_final_compile))
    released.set()
    assert p.status == "INTERRUPTED" and time.perf_counter() - t < 50
    assert any(w.endswith("the re-compile of the plan in its device order (abandoned, not "
                          "awaited)") for w in p.time_limited), p.time_limited
    assert not any("iteration" in w for w in p.time_limited if w.startswith("interrupted"))
    assert any(n.startswith("not re-compiled in the planned device order (interrupted during "
                            "it)") for n in p.notes)


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (aoizora's, once its CLI started)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(ln.split()[1], 16) for ln in f if ln.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.faults
def test_show_on_a_large_file_does_not_swallow_ctrl_c(tmp_path):
    """Ctrl-C while show reads a large plan (a 14 MiB iteration record: seconds of parsing)
    quits at once with one line, exit 130; before, JAX's garbage-collection callback swallowed
    the KeyboardInterrupt and show went on."""
    d = _plan_json()
    d["iterations"] = [{"candidates": [{"a": 1}] * 1_500_000}]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(d))
    p = subprocess.Popen([sys.executable, "-m", "aoizora", "show", str(path)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t = time.perf_counter()
    while not _catches_sigterm(p.pid) and p.poll() is None and time.perf_counter() - t < 60:
        time.sleep(0.01)
    time.sleep(0.5)   # real time: another process reads the file meanwhile
    if p.poll() is not None:
        pytest.skip("show finished before the signal could be sent")
    p.send_signal(signal.SIGINT)
    t = time.perf_counter()
    _, err = p.communicate(timeout=30)
    assert time.perf_counter() - t < 5.0
    assert p.returncode == 130, err
    assert err.strip().splitlines() == ["aoizora: SIGINT received: quit"]


# -- real planner runs under signals ---------------------------------------------------------
def _plan_until(out: str, cwd, pattern: str, timeout_s: float = 240.0):
    """A real ``aoizora plan`` of the small model in ``cwd``, its stdout in ``cwd``/../stdout.txt;
    returns (process, stderr lines so far) once a progress line contains ``pattern`` (or it
    exited, or ``timeout_s`` passed)."""
    stdout = open(cwd.parent / "stdout.txt", "w")
    tmp = cwd.parent / "tmp"      # its temporary files and directories (solver runs) go here
    tmp.mkdir()
    # --no-cache: these tests signal the planner while a compile runs (a cache hit is instant)
    p = subprocess.Popen([sys.executable, "-m", "aoizora", "plan", *JOB, "--out", out,
                          "--no-cache"],
                         cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp)})
    stdout.close()
    lines: list[str] = []
    seen = threading.Event()

    def read():
        for line in p.stderr:
            lines.append(line)
            if pattern in line:
                seen.set()
        seen.set()

    threading.Thread(target=read, daemon=True).start()
    seen.wait(timeout_s)
    return p, lines


def _finish(p, lines, cwd, within_s: float = 5.0):
    """(stdout, stderr, seconds the process took to exit from now)."""
    t = time.perf_counter()
    try:
        p.wait(timeout=within_s + 5)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"still running {within_s + 5:.0f} s after the signal")
    took = time.perf_counter() - t
    time.sleep(0.2)   # real time: the reader thread takes a process's last lines
    return (cwd.parent / "stdout.txt").read_text(), "".join(lines), took


def _nothing_left(pid: int, run) -> None:
    """No child process of ``pid``, no solver process, no temporary file or directory."""
    _no_children(pid, run.parent / "tmp")
    left = sorted(x.name for x in (run.parent / "tmp").iterdir())
    assert left == [], f"temporary files left behind: {left}"


def _no_children(pid: int, tmp) -> None:
    """No child of ``pid`` and no solver process of this run: one whose environment carries the
    run's ``TMPDIR`` (``_plan_until``; other tests' planners may run solvers meanwhile)."""
    left = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    assert left.strip() == "", f"processes left behind: {left}"
    solvers = subprocess.run(["pgrep", "-f", "highs_worker.py"], capture_output=True,
                             text=True).stdout.split()
    mark = f"TMPDIR={tmp}".encode()
    ours = []
    for s in solvers:
        try:
            with open(f"/proc/{s}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    ours.append(s)
        except OSError:          # it ended meanwhile
            pass
    assert ours == [], f"solver processes left behind: {ours}"


@pytest.mark.tpu_compiler
@pytest.mark.faults
def test_sigterm_mid_loop_saves_the_best_plan_marked_interrupted(tmp_path):
    """SIGTERM once the loop has priced a candidate: p.json holds the best plan so far, status
    INTERRUPTED, its notes and time_limited naming what was cut; exit 143 within 5 s; no
    traceback, no libtpu stack dump, no process left."""
    run = tmp_path / "run"
    run.mkdir()
    p, lines = _plan_until("p.json", run, "candidate 2/")
    assert p.poll() is None, "".join(lines)[-2000:]
    p.send_signal(signal.SIGTERM)
    out, err, took = _finish(p, lines, run)
    assert took < 5.0
    assert p.returncode == 143, err[-2000:]
    assert "Traceback" not in err and "SIGTERM received by PID" not in err
    assert "stack trace" not in err and "FailureSignalHandler" not in err
    plan = load_plan(str(run / "p.json"))
    assert plan.status == "INTERRUPTED"
    assert plan.notes[0].startswith("INTERRUPTED: the best plan found before the interrupt")
    assert any(w.startswith("interrupted by SIGTERM at ") for w in plan.time_limited)
    assert "INTERRUPTED" in out
    _nothing_left(p.pid, run)
    assert sorted(x.name for x in run.iterdir()) == ["p.json"]


@pytest.mark.tpu_compiler
@pytest.mark.faults
def test_sigint_20_s_in_leaves_a_plan_or_says_none_was_found(tmp_path):
    """The issue's case: Ctrl-C about 20 s into planning: either p.json holds a valid plan
    marked INTERRUPTED, or one line says that no plan was found yet (and the file is not
    there); exit 130 within 5 s, no traceback, nothing left behind."""
    run = tmp_path / "run"
    run.mkdir()
    p, lines = _plan_until("p.json", run, "no such line", timeout_s=20.0)
    assert p.poll() is None, "".join(lines)[-2000:]
    p.send_signal(signal.SIGINT)
    out, err, took = _finish(p, lines, run)
    assert took < 5.0 and p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "stack trace" not in err
    if (run / "p.json").exists():
        assert load_plan(str(run / "p.json")).status == "INTERRUPTED"
    else:
        said = [ln for ln in err.splitlines() if ln.startswith("aoizora:")]
        assert any("no plan found yet" in ln or "no plan saved" in ln for ln in said), said
    _nothing_left(p.pid, run)
    assert [x.name for x in run.iterdir()] in ([], ["p.json"])


@pytest.mark.tpu_compiler
@pytest.mark.faults
def test_sigint_while_screening_leaves_no_early_compile_behind(tmp_path):
    """Ctrl-C while the first layouts are screened (their compiles stopped early, each in a
    child process): exit 130 within 5 s, no child process or temporary file left."""
    run = tmp_path / "run"
    run.mkdir()
    p, lines = _plan_until("p.json", run, "screening the first seed")
    assert p.poll() is None, "".join(lines)[-2000:]
    p.send_signal(signal.SIGINT)
    out, err, took = _finish(p, lines, run)
    assert took < 5.0 and p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "stack trace" not in err
    _nothing_left(p.pid, run)


@pytest.mark.tpu_compiler
@pytest.mark.faults
def test_a_second_sigint_quits_at_once(tmp_path):
    """Ctrl-C twice while the first compile runs: the first asks the planner to stop, the
    second quits at once: one line, exit 130 within 5 s, the old file unchanged, nothing left."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "p.json").write_text("kept\n")
    p, lines = _plan_until("p.json", run, "iteration 1: compiling")
    assert p.poll() is None, "".join(lines)[-2000:]
    p.send_signal(signal.SIGINT)
    time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err, took = _finish(p, lines, run)
    assert took < 5.0 and p.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "stack trace" not in err
    said = [ln for ln in err.splitlines() if ln.startswith("aoizora:")]
    assert said[0].startswith("aoizora: SIGINT received: stopping"), said
    assert said[-1].startswith("aoizora: SIGINT received: quit at once") or (
        "no plan found yet" in said[-1]), said
    assert (run / "p.json").read_text() == "kept\n"
    _nothing_left(p.pid, run)
    assert sorted(x.name for x in run.iterdir()) == ["p.json"]


@pytest.mark.tpu_compiler
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")   # the dropped raise
def test_an_interrupt_whose_raise_was_swallowed_still_stops_before_the_next_ilp():
    """Python runs the SIGINT handler at the main thread's next bytecode, which may be inside a
    ``__del__`` or a gc callback (jax registers one): the handler's ``Interrupted`` is then
    printed and dropped. The run stops all the same at its next checkpoint: the second mesh's
    sharding ILP is never solved, and the run ends interrupted before any compile."""
    import jax
    import jax.numpy as jnp

    import aoizora
    from aoizora.planning.seams import Seams
    from aoizora.solvers.sharding import solve_sharding

    class SignalsInDel:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):        # the handler runs here, and its raise is dropped
                pass

    solved = []

    def solve_then_signal(*a, **k):
        solved.append(a[2])
        res = solve_sharding(*a, **k)
        SignalsInDel()                   # collected at once: __del__ runs, the raise is lost
        return res

    def mlp(x, w):
        return jnp.tanh(x @ w) @ w.T

    args = (jax.ShapeDtypeStruct((256, 512), jnp.float32),
            jax.ShapeDtypeStruct((512, 512), jnp.float32))
    with pytest.raises(aoizora.PlanningError, match="SIGINT"):
        aoizora.plan(mlp, *args, target="v5e-8", time_budget_s=60, top_k=1,
                     meshes=[{"x": 8}, {"x": 2, "y": 4}], max_iterations=1,
                     seams=Seams(solve_sharding=solve_then_signal))
    assert solved == [{"x": 8}], solved
