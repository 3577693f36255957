"""Run a PuLP MIP within a wall-clock deadline, with CBC or HiGHS.

``run_solver(prob, solver, time_limit_s, seed, threads)`` solves a PuLP problem (minimisation)
within `time_limit_s` seconds of wall clock, counted from the call: for CBC writing the MPS
file, the CBC process and reading its solution; for HiGHS the same (its MIP), or its model build
and the solve (the LP relaxation). It returns {status, objective, bound (model units, from the
solver: CBC's log "Lower bound", HiGHS's mip_dual_bound), time_s (wall clock), solver, detail}.
CBC and HiGHS are seeded (``seed``) and run on ``threads`` threads; ``available_solvers()`` says
which of the two PuLP can run.

CBC (``run_cbc``) runs as a process on a file (PuLP's MPS writer, the CBC binary, PuLP's
solution reader): CBC's -sec is the time left after the MPS file is written, less the reading
back (and CBC_STOP_S, CBC's own stop after -sec, writing its solution file); if CBC is still
running when only the reading back is left (its file read and root LP cannot be cut), the process
is killed and the answer is UNKNOWN (detail ``killed``). HiGHS's MIP (``run_highs``,
``_run_highs_process``) runs the same way, as a process on an MPS file (``highs_worker.py``),
killed when only the reading back is left: HiGHS does not check its time limit inside every step
of its MIP presolve. Its LP relaxation (``mip=False``, no presolve) runs in process: PuLP's
model builder, then HiGHS with time_limit = the time left after the build, less the reading
back; its objective is then a lower bound ("bound"; "objective" is None). The reading back is an
estimate: READBACK_S plus READBACK_S_PER_COLUMN per model column; CBC's -sec and HiGHS's time_limit
are never below MIN_CBC_SEC.

What may pass the limit: the MPS write or the LP relaxation's HiGHS build themselves (they are
not cut), and the reading back after a kill.

CBC_MIN_S_PER_NONZERO and HIGHS_LP_MIN_S_PER_NONZERO are the measured costs, per nonzero of the
model, of what a CBC run and HiGHS's LP relaxation cannot cut (see the comment at their
definition); ``aoizora.solvers.sharding.solve_model`` uses them to choose its path under a short
budget.

``ShardingSolveError`` is defined here because these runs raise it (no CBC binary, no highspy, an
unknown solver name); ``aoizora.solvers.sharding`` re-exports it with the rest of this module's
names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from functools import partial
from typing import Any

import pulp

from aoizora.solvers.budget import clock
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.stop import cancel_on_stop, clean_on_quit


class ShardingSolveError(ValueError):
    """The sharding ILP could not be solved as asked."""

    certificate: Certificate | None = None


def available_solvers() -> list[str]:
    out = []
    avail = pulp.listSolvers(onlyAvailable=True)
    if "PULP_CBC_CMD" in avail:
        out.append("cbc")
    if "HiGHS" in avail:
        out.append("highs")
    return out


# ---------------------------------------------------------------------------------------------
# solver backends

class _quiet_stdout:
    """Silence the C-level stdout (file descriptor 1) for a block."""

    def __enter__(self):
        import sys
        sys.stdout.flush()
        self.saved = os.dup(1)
        self.null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self.null, 1)

    def __exit__(self, *exc):
        os.dup2(self.saved, 1)
        os.close(self.saved)
        os.close(self.null)
        return False

def _cbc_bound(log: str) -> tuple[float | None, str]:
    """(best bound, result line) from CBC's log, in the model's (unscaled-constant-free) units."""
    res = re.search(r"Result - (.*)", log)
    result = res.group(1).strip() if res else ""
    lb = None
    m = re.search(r"Lower bound:\s+([-+0-9.eE]+)", log)
    if m:
        lb = float(m.group(1))
    return lb, result


# What a CBC run costs besides its search (the MPS write, CBC's file read, presolve and root LP,
# the reading back: what -sec cannot cut), per nonzero of the MPS file, 1.5 x the measured cost
# for a loaded machine; likewise HiGHS's LP relaxation in process (model build and the LP without
# presolve). Fitted on the three Wan 2.1 1.3B instances of benchmarks/sharding_vs_heuristics.py
# (benchmarks/results/sharding_vs_heuristics.md; the figures: benchmarks/results/lab_notes.md).
CBC_MIN_S_PER_NONZERO = 6.5e-6
HIGHS_LP_MIN_S_PER_NONZERO = 2.5e-6
READBACK_S = 0.02                    # reading a solution back: fixed part, seconds
READBACK_S_PER_COLUMN = 1.5e-6       # ... per model column (benchmarks/results/lab_notes.md)
CBC_STOP_S = 0.05                    # CBC's own stop after -sec: writing its (short) solution file
MIN_CBC_SEC = 0.01                   # CBC's -sec is never below this


def _objective_offset(prob: pulp.LpProblem) -> float:
    return float(prob.objective.constant) if prob.objective is not None else 0.0


def _run_until(args: list[str], deadline: float, **streams) -> tuple[int, bool]:
    """Run a solver process until `deadline` (a ``solvers.budget.clock()`` value); kill it if
    it is still running then, or when the run is stopped (``solvers.stop``: an interrupt) or
    an exception comes through the wait (then re-raised). Returns (return code, killed)."""
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, **streams)
    try:
        with cancel_on_stop(proc.kill, "a sharding ILP's solver process (killed)"):
            return proc.wait(timeout=max(0.0, deadline - clock())), False
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(), True
    except BaseException:   # an interrupt: no solver process is left behind
        proc.kill()
        proc.wait()
        raise


def run_cbc(prob: pulp.LpProblem, deadline: float, seed: int, threads: int) -> dict[str, Any]:
    """CBC on `prob` (through PuLP's MPS writer, CBC binary and solution reader) so that the run
    ends by `deadline` (a ``solvers.budget.clock()`` value): CBC's -sec is the time left after
    the MPS file is written, less the reading back; if CBC is still running when only the reading
    back is left (its file read and root LP cannot be cut), the process is killed and the answer
    is UNKNOWN (detail ``killed``)."""
    with warnings.catch_warnings():   # PuLP 3.3 marks its bundled CBC for removal in 4.0
        warnings.simplefilter("ignore", DeprecationWarning)
        cmd = pulp.PULP_CBC_CMD(msg=False, threads=threads)
    if not cmd.available():
        raise ShardingSolveError("PuLP's CBC binary is not available; install pulp with its CBC "
                                 "or use solver='highs'")
    name = f"PuLP {pulp.__version__}/CBC"
    detail: dict[str, Any] = {}
    was_none, dummy = prob.fixObjective()
    try:
        with tempfile.TemporaryDirectory() as d, clean_on_quit(partial(shutil.rmtree, d, True)):
            mps, sol, log = (os.path.join(d, f) for f in ("model.mps", "model.sol", "cbc.log"))
            t = clock()
            vs, vnames, cnames, _ = prob.writeMPS(mps, rename=1)
            detail["mps_write_s"] = round(clock() - t, 4)
            readback = READBACK_S + READBACK_S_PER_COLUMN * len(vs)
            sec = max(MIN_CBC_SEC, deadline - clock() - readback - CBC_STOP_S)
            detail["cbc_sec"] = round(sec, 4)
            args = [cmd.path, mps] + (["-max"] if prob.sense == pulp.LpMaximize else []) + [
                "-sec", f"{sec:.4f}", "-randomSeed", str(seed + 1), "-randomCbcSeed", str(seed + 1),
                "-threads", str(threads), "-timeMode", "elapsed", "-solve",
                "-printingOptions", "normal", "-solution", sol]
            t = clock()
            with open(log, "w") as f:
                rc, killed = _run_until(args, deadline - readback, stdout=f,
                                        stderr=subprocess.STDOUT)
            detail["cbc_process_s"] = round(clock() - t, 4)
            text = open(log).read() if os.path.exists(log) else ""
            lb, result = _cbc_bound(text)
            detail["cbc_result"] = result
            if killed or rc != 0 or not os.path.exists(sol):
                if killed:
                    detail["killed"] = ("CBC was still running when the wall-clock budget ran out "
                                        "(its file read and root LP cannot be cut); process killed")
                else:
                    detail["error"] = f"CBC exited with code {rc} and no solution file"
                return {"status": "UNKNOWN", "objective": None, "bound": None, "solver": name,
                        "detail": detail}
            status, values, _, _, _, sol_status = cmd.readsol_MPS(sol, prob, vs, vnames, cnames)
            prob.assignVarsVals(values)
            prob.assignStatus(status, sol_status)
    finally:
        prob.restoreObjective(was_none, dummy)
    obj = pulp.value(prob.objective) if prob.sol_status in (1, 2) else None
    offset = _objective_offset(prob)   # CBC's log leaves the objective's constant out; pulp's value has it
    if prob.status == 1 and prob.sol_status == 1 and ("optimal" in result.lower() or not result):
        st, bound = "OPTIMAL", obj
    elif obj is not None:
        st = "FEASIBLE"
        bound = lb + offset if lb is not None else None
        if lb is None:
            detail["bound_note"] = "CBC's log gave no lower bound for this stop"
    elif prob.status == -1 and "time" not in result.lower() and re.search(
            r"Problem is infeasible|proven infeasible|relaxation infeasible", text, re.IGNORECASE):
        st, bound = "INFEASIBLE", None
    else:
        st, bound = "UNKNOWN", (lb + offset if lb is not None else None)
    return {"status": st, "objective": obj, "bound": bound, "solver": name, "detail": detail}


def run_highs(prob: pulp.LpProblem, deadline: float, seed: int, threads: int, *, mip: bool = True,
              start: dict[str, float] | None = None) -> dict[str, Any]:
    """HiGHS on `prob`. mip=True: the MIP in a process of its own (``_run_highs_process``), killed
    at the deadline; ``start`` ({variable name: value}, some variables) is its MIP start. mip=False: the LP relaxation in process (PuLP's model builder, then HiGHS
    with time_limit = the time left after the build, less the reading back), without presolve
    (faster: benchmarks/results/lab_notes.md); its objective is then a lower bound
    ("bound"), "objective" is None."""
    if "HiGHS" not in pulp.listSolvers(onlyAvailable=True):
        raise ShardingSolveError("HiGHS is not available: pip install highspy (or use solver='cbc')")
    if mip:
        return _run_highs_process(prob, deadline, seed, threads, start)
    cmd = pulp.HiGHS(msg=False, mip=False, threads=threads, random_seed=seed, presolve="off")
    was_none, dummy = prob.fixObjective()
    try:
        with _quiet_stdout():   # highspy prints its banner before pulp turns its output off
            t = clock()
            cmd.createAndConfigureSolver(prob)
            cmd.buildSolverModel(prob)
            build_s = clock() - t
            readback = READBACK_S + READBACK_S_PER_COLUMN * len(prob.variables())
            limit = max(MIN_CBC_SEC, deadline - clock() - readback)
            prob.solverModel.setOptionValue("time_limit", float(limit))
            cmd.callSolver(prob)
            status, sol_status = cmd.findSolutionValues(prob)
            prob.assignStatus(status, sol_status)
    finally:
        prob.restoreObjective(was_none, dummy)
    h = prob.solverModel
    info = h.getInfo()
    ms = h.modelStatusToString(h.getModelStatus())
    name = f"PuLP {pulp.__version__}/HiGHS {h.version()} LP relaxation"
    detail: dict[str, Any] = {"highs_status": ms, "highs_build_s": round(build_s, 4),
                              "highs_time_limit_s": round(limit, 4)}
    if ms == "Optimal":
        return {"status": "OPTIMAL", "objective": None,
                "bound": info.objective_function_value + _objective_offset(prob), "solver": name,
                "detail": detail}
    st = "INFEASIBLE" if ms == "Infeasible" else "UNKNOWN"
    return {"status": st, "objective": None, "bound": None, "solver": name, "detail": detail}


def _run_highs_process(prob: pulp.LpProblem, deadline: float, seed: int, threads: int,
                       start: dict[str, float] | None = None) -> dict[str, Any]:
    """HiGHS's MIP on `prob` as a process on an MPS file (``highs_worker.py``), so that the run
    ends by `deadline` whatever HiGHS does: the worker gets the deadline less the reading back,
    and sets HiGHS's time_limit to what is left of it once it has read the file (less its own
    stop); a worker still running when only the reading back is left is killed, and the answer
    is UNKNOWN (detail ``killed``).
    HiGHS does not check its time limit inside every step of its MIP presolve (an instance:
    benchmarks/results/lab_notes.md)."""
    name = f"PuLP {pulp.__version__}/HiGHS"
    detail: dict[str, Any] = {}
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "highs_worker.py")
    was_none, dummy = prob.fixObjective()
    try:
        with tempfile.TemporaryDirectory() as d, clean_on_quit(partial(shutil.rmtree, d, True)):
            mps, out, err_path = (os.path.join(d, f) for f in ("model.mps", "result.json",
                                                                "worker.err"))
            t = clock()
            vs, vnames, _, _ = prob.writeMPS(mps, rename=1)
            detail["mps_write_s"] = round(clock() - t, 4)
            extra = []
            if start:
                with open(os.path.join(d, "start.json"), "w") as f:
                    json.dump({vnames[n]: v for n, v in start.items() if n in vnames}, f)
                extra = [f.name]
                detail["mip_start"] = len(start)
            readback = READBACK_S + READBACK_S_PER_COLUMN * len(vs)
            left = deadline - clock() - readback
            detail["highs_time_left_s"] = round(left, 4)
            # the worker's deadline on the epoch clock (another process: ``clock``'s reference
            # point is this process's): it sets HiGHS's limit once the file is read
            args = [sys.executable, worker, mps, out, f"{time.time() + left:.4f}", str(seed),
                    str(threads), *extra]
            t = clock()
            with open(err_path, "w") as f:
                rc, killed = _run_until(args, deadline - readback, stdout=subprocess.DEVNULL,
                                        stderr=f)
            detail["highs_process_s"] = round(clock() - t, 4)
            if killed or rc != 0 or not os.path.exists(out):
                if killed:
                    detail["killed"] = ("HiGHS was still running when the wall-clock budget ran "
                                        "out (past its own time limit); process killed")
                else:
                    tail = open(err_path, errors="replace").read().strip().splitlines()[-1:]
                    detail["error"] = (f"the HiGHS worker exited with code {rc}"
                                       + (f": {tail[0]}" if tail else ""))
                return {"status": "UNKNOWN", "objective": None, "bound": None, "solver": name,
                        "detail": detail}
            with open(out) as f:
                res = json.load(f)
    finally:
        prob.restoreObjective(was_none, dummy)
    name = f"PuLP {pulp.__version__}/HiGHS {res['version']}"
    ms = res["highs_status"]
    detail.update({"highs_status": ms, "mip_gap": res["mip_gap"],
                   "mip_node_count": res["mip_node_count"]})
    obj = None
    if res["values"]:
        by_new = res["values"]
        prob.assignVarsVals({v.name: by_new.get(vnames[v.name], 0.0) for v in vs})
        obj = pulp.value(prob.objective)
    offset = _objective_offset(prob)    # the MPS file leaves the objective's constant out
    bound = res["dual_bound"] + offset if res["dual_bound"] is not None else None
    if ms == "Optimal" and obj is not None:
        st, bound = "OPTIMAL", obj
    elif ms == "Infeasible":
        st, bound = "INFEASIBLE", None
    elif obj is not None:
        st = "FEASIBLE"
    else:
        st = "UNKNOWN"
    if bound is None and st != "INFEASIBLE":
        detail["bound_note"] = "HiGHS reported no finite dual bound for this stop"
    return {"status": st, "objective": obj, "bound": bound, "solver": name, "detail": detail}


def run_solver(prob: pulp.LpProblem, solver: str, time_limit_s: float, seed: int, threads: int
               ) -> dict[str, Any]:
    """Solve a PuLP problem (minimisation) within `time_limit_s` seconds of wall clock, counted
    from this call: for CBC writing the MPS file, the CBC process and reading its solution; for
    HiGHS building its model and the solve (``run_cbc``, ``run_highs``). Returns {status,
    objective, bound (model units, from the solver: CBC's log "Lower bound", HiGHS's
    mip_dual_bound), time_s (wall clock), solver, detail}. What may pass the limit: the MPS write
    or HiGHS build themselves (they are not cut), and the reading back after a kill."""
    t0 = clock()
    deadline = t0 + time_limit_s
    if solver == "cbc":
        r = run_cbc(prob, deadline, seed, threads)
    elif solver == "highs":
        r = run_highs(prob, deadline, seed, threads)
    else:
        raise ShardingSolveError(f"unknown solver {solver!r}; use 'cbc' or 'highs'")
    r["time_s"] = clock() - t0
    return r
