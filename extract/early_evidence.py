"""Early evidence: a layout's collectives read from the module after libtpu's HLO passes, with the
compile stopped before the LLO backend.

An ahead-of-time compile spends a fraction of a second in libtpu's HLO passes and most of its
time in the backend, and the module after the HLO passes already holds every collective as the
full compile's evidence has it; what the backend adds is the per-op cycle estimates (Q2's
compute), the collective algorithms, the cost analysis and the final memory figure
(benchmarks/results/lab_notes.md, "evidence without the LLO backend?" and "early evidence").
No compile option stops libtpu there, so ``early_evidence`` compiles in a child process with an
XLA dump and stops the child itself:

- the child (a fresh interpreter, ``sys.executable``) runs the pickled (cloudpickle) compile job
  (the planner's: ``candidate_pricing.compile_layout`` of a program, layout and device order;
  ``candidate_pricing.early_layout_evidence``), with
  ``XLA_FLAGS="<the caller's> --xla_dump_to=DIR --xla_dump_hlo_as_text"``;
- libtpu writes ``module_NNNN.<name>.after_optimizations.txt`` (the module after the HLO passes),
  then its ``-buffer-assignment``, ``-buffer-assignment-values``, ``-live-range`` and
  ``-memory-usage-report`` files and then ``after_optimizations_after_buffer_assignment.txt``,
  all on the compile's thread one after the other (a file that exists may still be being
  written); the parent polls DIR and, once that last file exists (so the module and the memory
  report before it are closed), kills the child (SIGKILL, by its pid) and reads the module with
  ``compiled_evidence.evidence_from_hlo_text``.

The evidence is partial and says so: ``fidelity="tpu-hlo-passes"`` (``FIDELITY``), and a first
warning naming what it lacks. Its collectives (kinds, bytes, groups, runs, async, schedule
positions, phases) are those of the full compile's evidence of the same layout, every field but
``overlap_cycles`` (0 here: no cycle estimates), as ``benchmarks/early_evidence.py`` checks;
its compute ops have no ``estimated_cycles`` (flops and bytes from shapes; the ops that only
move data, which a full compile's evidence keeps by their cycle estimates, are kept by their
bytes: ``compiled_evidence.DATA_MOVEMENT``; other such ops are absent); ``algorithms`` is empty
(written by the backend); ``flops``, ``bytes_accessed`` are 0 and ``optimal_seconds`` None (no
``cost_analysis``). Memory: the ``MemoryUse`` byte fields are 0; ``EarlyEvidence.
dump_memory_bytes`` is the memory report's total of the default memory space (HBM) after the HLO
passes' buffer assignment, which is not ``memory_analysis()``'s total (no generated code, known
only after code generation), and ``memory.fits`` is that total against the device's HBM: an
approximation.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from aoizora.extract.compiled_evidence import evidence_from_hlo_text
from aoizora.extract.evidence import Evidence, MemoryUse

FIDELITY = "tpu-hlo-passes"
DUMP_FLAGS = ("--xla_dump_hlo_as_text",)      # with --xla_dump_to=DIR
_MODULE = "after_optimizations.txt"
_REPORT = "after_optimizations-memory-usage-report.txt"   # written after the module
_DONE = "after_optimizations_after_buffer_assignment.txt"  # written after the report: both closed
_NUMBER = re.compile(r"module_(\d+)\.")
_TOTAL = re.compile(r"Memory Space: default \(color=0\)\s*\nTotal bytes: (\d+)")


class EarlyEvidenceError(RuntimeError):
    """No module after the HLO passes: the child failed (its last error line), finished without
    writing one, wrote more than one, or none appeared within the timeout."""


@dataclasses.dataclass
class EarlyEvidence:
    """What ``early_evidence`` returns.

    Attributes:
        evidence: the partial evidence (fidelity ``FIDELITY``; module docstring).
        seconds: wall time from the child's start to the module read (the child killed).
        module_s: ... to the module and its memory report written (``_DONE`` seen).
        lowered_s: ... to the module before optimization written (None if not seen).
        dump_memory_bytes: the memory report's total of the default memory space (None when
            absent); not ``memory_analysis()``'s total.
        child_finished: the child had ended by itself before it was stopped.
        module_path: the module's file when the dump was kept (``keep_dump``), else "".
    """

    evidence: Evidence             # fidelity FIDELITY: collectives exact, no compute cycles
    seconds: float                 # wall: child started -> module read (the child killed)
    module_s: float                # wall: child started -> module and memory report written
    lowered_s: float | None        # wall: child started -> module before optimization written
    dump_memory_bytes: int | None  # the memory report's default-space total (not memory_analysis)
    child_finished: bool           # the child had ended by itself before it was stopped
    module_path: str = ""          # the module's file, when the dump was kept (``keep_dump``)


def early_evidence(compile_job: Callable[[], Any], target: Any, mesh_axes: dict[str, int],
                   device_order: Sequence[int], *, timeout_s: float = 600.0,
                   keep_dump: "str | os.PathLike[str] | None" = None,
                   poll_s: float = 0.02, cancel: Any = None) -> EarlyEvidence:
    """The early evidence of a compile (module docstring): ``compile_job`` run in a child process
    with an XLA dump, the child stopped once libtpu has written the module after the HLO passes.

    Args:
        compile_job: a zero-argument callable, picklable with cloudpickle, that compiles one
            program ahead of time with libtpu in the process that calls it (its result is not
            used): the planner's ``candidate_pricing.compile_job``, a partial of
            ``compile_layout`` (``candidate_pricing.early_layout_evidence`` builds it).
        target: the resolved TPU ``Target`` it compiles for; ``mesh_axes``: its mesh (axis ->
            size, in order); ``device_order``: physical device ids per logical rank, as compiled.
        timeout_s: how long to wait for the module (seconds from the child's start).
        keep_dump: a directory to keep the dump in (``module_path`` names the module there);
            default a temporary directory, removed.
        poll_s: how often the dump directory is looked at (seconds).
        cancel: an event (``is_set()``), e.g. a ``threading.Event``: once set, the wait stops,
            the child is killed and the work directory removed (``EarlyEvidenceError``).
    Returns:
        ``EarlyEvidence``: the partial evidence (``compile_s``: ``seconds``) and its timings.
    Raises:
        EarlyEvidenceError: a target that is not a TPU, libtpu unavailable in the child, the
            child failed before the module (e.g. a lowering error: its one line), finished
            without one (e.g. out of HBM before buffer assignment), compiled more than one
            program, the timeout passed, or ``cancel`` was set.
        compiled_evidence.EvidenceError: the module holds something the reader cannot price.
    """
    if getattr(target, "family", "tpu") != "tpu":
        raise EarlyEvidenceError(f"early evidence reads libtpu's dump; {target.name} is not a "
                                 f"TPU target")
    work = tempfile.mkdtemp(prefix="aoizora-early-")
    try:                                             # a kept dump is outside ``work``
        dump = os.fspath(keep_dump) if keep_dump is not None else os.path.join(work, "dump")
        t0, module, lowered_s, module_s, finished = _run_child(compile_job, work, dump,
                                                               timeout_s, poll_s, cancel)
        with open(module, encoding="utf-8") as f:
            text = f.read()
        with open(module[:-len(_MODULE)] + _REPORT, encoding="utf-8") as f:
            m = _TOTAL.search(f.read())
        mem = int(m.group(1)) if m else None
        ev = _evidence(text, target, mesh_axes, device_order, mem)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.perf_counter() - t0
    ev.compile_s = seconds
    return EarlyEvidence(evidence=ev, seconds=seconds, module_s=module_s, lowered_s=lowered_s,
                         dump_memory_bytes=mem, child_finished=finished,
                         module_path=module if keep_dump is not None else "")


def _run_child(compile_job: Callable[[], Any], work: str, dump: str, timeout_s: float,
               poll_s: float, cancel: Any = None) -> tuple[float, str, float | None, float, bool]:
    """Start the child on ``compile_job`` with its dump in ``dump``, wait for the module
    (``_wait_for_module``) and kill the child (SIGKILL; it is waited for on every path);
    (start time, then what ``_wait_for_module`` returns)."""
    import cloudpickle

    os.makedirs(dump, exist_ok=True)
    blob = os.path.join(work, "job.pkl")
    with open(blob, "wb") as f:
        cloudpickle.dump(compile_job, f)
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), f"--xla_dump_to={dump}",
                                 *DUMP_FLAGS]).strip()
    out_path, err_path = os.path.join(work, "child.out"), os.path.join(work, "child.err")
    t0 = time.perf_counter()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from aoizora.extract.early_evidence import _child; _child()",
             blob], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
    try:
        return (t0, *_wait_for_module(proc, dump, t0, timeout_s, poll_s, err_path, out_path,
                                      cancel))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()


def _wait_for_module(proc: subprocess.Popen, dump: str, t0: float, timeout_s: float,
                     poll_s: float, err_path: str, out_path: str, cancel: Any = None
                     ) -> tuple[str, float | None, float, bool]:
    """Poll ``dump`` until one program's module and memory report are closed (``_DONE`` exists);
    (its module's path, seconds to the module before optimization, seconds to ``_DONE``, whether
    the child had ended). ``cancel`` set: EarlyEvidenceError."""
    lowered_s = None
    while True:
        if cancel is not None and cancel.is_set():
            raise EarlyEvidenceError("cancelled: the planner stopped")
        finished = proc.poll() is not None      # read before the directory: no race with it
        if lowered_s is None and glob.glob(os.path.join(dump, "module_*.before_optimizations.txt")):
            lowered_s = time.perf_counter() - t0
        done = sorted(glob.glob(os.path.join(dump, "module_*." + _DONE)))
        numbers = {_NUMBER.search(os.path.basename(p)).group(1) for p in
                   glob.glob(os.path.join(dump, "module_*.before_optimizations.txt"))}
        if len(numbers) > 1:
            raise EarlyEvidenceError(f"the child compiled {len(numbers)} programs "
                                     f"({sorted(numbers)}); early evidence expects one")
        if done:
            module = done[0][:-len(_DONE)] + _MODULE
            missing = [p for p in (module, done[0][:-len(_DONE)] + _REPORT)
                       if not os.path.exists(p)]
            if missing:
                raise EarlyEvidenceError(f"{os.path.basename(done[0])} written without "
                                         f"{', '.join(map(os.path.basename, missing))}")
            return module, lowered_s, time.perf_counter() - t0, finished
        if finished:
            raise EarlyEvidenceError(_child_failure(proc.returncode, err_path, out_path))
        if time.perf_counter() - t0 > timeout_s:
            raise EarlyEvidenceError(f"no module after the HLO passes in {dump} within "
                                     f"{timeout_s:.0f} s (lowered: "
                                     f"{'yes' if lowered_s is not None else 'no'})")
        time.sleep(poll_s)


def _child_failure(code: int, err_path: str, out_path: str) -> str:
    with open(out_path, encoding="utf-8", errors="replace") as f:
        said = [l for l in f.read().splitlines() if l.startswith("EARLY ")]
    if said:
        return said[-1][len("EARLY "):]
    with open(err_path, encoding="utf-8", errors="replace") as f:
        lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    errs = [l for l in lines if re.search(r"Error|error:|RESOURCE_EXHAUSTED", l)]
    last = (errs or lines or ["no output"])[-1]
    return f"the compile child exited ({code}) before the module after the HLO passes: {last[:400]}"


def _evidence(text: str, target: Any, mesh_axes: dict[str, int], device_order: Sequence[int],
              mem: int | None) -> Evidence:
    hbm = target.chip.device_hbm_bytes
    ev = evidence_from_hlo_text(text, target=target.name, mesh_axes=dict(mesh_axes),
                                device_order=[int(d) for d in device_order],
                                clock_hz=target.chip.clock_hz, fidelity=FIDELITY,
                                generation=target.generation, data_movement=True)
    ev.memory = MemoryUse(hbm_bytes=int(hbm), fits=mem is None or mem <= hbm)
    mem_s = (f"the HLO passes' buffer assignment puts {mem} B in HBM (not memory_analysis(): "
             f"no generated code), fits judged on that" if mem is not None
             else "no memory report; fits not judged")
    ev.warnings.insert(0, f"partial evidence ({FIDELITY}): read from the module after the HLO "
                          f"passes, the compile stopped before libtpu's backend; no compute cycle "
                          f"estimates (overlap cycles 0), no collective algorithms, no cost "
                          f"analysis; memory: {mem_s}")
    return ev


def _child() -> None:
    """The child's side: compile the pickled job (libtpu writes the dump); the parent kills it
    once the module it wants is written. A line ``EARLY <why>`` on stdout says why it stopped
    without one."""
    import cloudpickle

    from aoizora.extract.targets import libtpu_available, prepare_libtpu_env

    prepare_libtpu_env()         # libtpu's environment first, as ``import aoizora`` sets it
    if not libtpu_available():
        print("EARLY libtpu is unavailable in the compile child: early evidence needs libtpu's "
              "ahead-of-time compiler", flush=True)
        sys.exit(3)
    with open(sys.argv[1], "rb") as f:
        job = cloudpickle.load(f)
    try:
        ev = job()
    except Exception as e:  # noqa: BLE001 -- reported to the parent in one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"EARLY the compile failed before the module after the HLO passes: "
              f"{type(e).__name__}: {first[:400]}", flush=True)
        sys.exit(4)
    if not ev.memory.fits:
        print(f"EARLY the compile ran out of HBM before the module after the HLO passes: "
              f"{ev.memory.oom_message[:300]}", flush=True)
    else:
        print("EARLY the compile finished but wrote no module after the HLO passes "
              "(is XLA_FLAGS's --xla_dump_to honoured?)", flush=True)
    sys.exit(5)


__all__ = ["EarlyEvidence", "EarlyEvidenceError", "FIDELITY", "early_evidence"]
