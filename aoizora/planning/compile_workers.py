"""Where the planner's compiles run: in-process, in local worker processes, or as Ray tasks.

A compile job is a picklable callable that returns the evidence (``candidate_pricing.
compile_job``: a ``CompileJob``, ``compile_layout`` with the program, the layout, the device order
and the evidence cache). ``CompileQueue`` (``aoizora.planning.compile_queue``) runs up to ``slots`` of them at
once, each through ``run(job)``, which blocks until the job's evidence is back:

- ``InlineWorkers``: one slot, the job runs on the queue's own thread (the behaviour before
  pools; what ``auto`` gives on a machine with room for one compile);
- ``LocalWorkers(n)``: ``n`` slots, each a worker process of its own (``spawn``: a fresh
  interpreter, JAX initialised there; the environment, so ``LIBTPU_INIT_ARGS`` and ``XLA_FLAGS``,
  is the parent's), the job sent with cloudpickle (the built-in programs are closures). One
  process per slot, so a worker that dies (killed, out of host memory) costs the job it ran
  (``WorkerLost``) and its slot is restarted; the other slots go on;
- ``RayWorkers(address)``: jobs are Ray tasks (``ray.remote``, ``max_retries`` for a worker's
  loss), the evidence comes back through Ray's object store. The runtime environment carries
  ``LIBTPU_INIT_ARGS``, ``XLA_FLAGS`` and ``AOIZORA_CACHE``, and for a cluster (an address) pins
  jax, jaxlib and libtpu to this machine's versions (``pip``); each task reports its compiler
  identity, and evidence from a worker whose identity differs is refused (``WorkerLost``, one
  line). ``slots``: the cluster's CPUs divided by ``cpus_per_task``.

``workers_for(spec)`` reads the CLI's ``--compile-workers``: ``auto`` (default; ``auto_slots``:
as many as the cores and available memory hold, ``InlineWorkers`` when that is one), ``inline``,
``local`` or ``local:N`` or a number, ``ray`` (a local Ray instance, or the one ``RAY_ADDRESS``
names), ``ray://HOST:PORT`` (a cluster).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import threading
from typing import Any, Callable

PER_COMPILE_BYTES = 6 * 1024 ** 3     # host memory a Wan 2.1 1.3B 81f compile may take (about)
CORES_PER_COMPILE = 2                 # XLA compiles on two cores (28.3 s CPU in 14 s wall)
RAY_MAX_RETRIES = 1                   # a Ray task is retried once after its worker dies


class WorkerLost(RuntimeError):
    """A compile worker died or answered with another compiler: that candidate is lost, not the
    plan (``CompileQueue`` records it as the candidate's error)."""


class WorkersError(ValueError):
    """A ``--compile-workers`` value that cannot be used (one line: what to pass)."""


def available_memory_bytes() -> int:
    """The host's available memory (``MemAvailable`` of /proc/meminfo; else all of it)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return PER_COMPILE_BYTES


def auto_slots(cores: int | None = None, memory_bytes: int | None = None) -> int:
    """Compiles this machine holds at once: ``cores // CORES_PER_COMPILE`` and
    ``memory // PER_COMPILE_BYTES``, the lesser, at least 1."""
    cores = cores if cores is not None else len(os.sched_getaffinity(0)) \
        if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem = memory_bytes if memory_bytes is not None else available_memory_bytes()
    return max(1, min(cores // CORES_PER_COMPILE, mem // PER_COMPILE_BYTES))


class InlineWorkers:
    """One slot: the job runs on the calling thread."""

    slots = 1
    name = "in-process"

    def run(self, job: Callable[[], Any]) -> Any:
        return job()

    def close(self) -> None:
        pass


def run_pickled(blob: bytes) -> tuple[str, Any, dict[str, str]]:
    """A worker's side: unpickle a job (cloudpickle), run it; returns ("ok", evidence) or
    ("raise", the exception), and the worker's compiler identity."""
    import cloudpickle

    from aoizora.extract.aot_compile import compiler_identity

    job, keep = cloudpickle.loads(blob)
    try:
        if keep:
            from aoizora.extract.aot_compile import keeping_hlo
            with keeping_hlo(keep):
                out = ("ok", job())
        else:
            out = ("ok", job())
    except Exception as e:  # noqa: BLE001 -- handed back to the planner as it was raised
        out = ("raise", e)
    return out[0], out[1], compiler_identity()


def _pack(job: Callable[[], Any]) -> bytes:
    import cloudpickle

    from aoizora.extract.aot_compile import kept_hlo_dir

    return cloudpickle.dumps((job, kept_hlo_dir()))


def _unpack(result: tuple[str, Any, dict[str, str]], where: str) -> Any:
    from aoizora.extract.aot_compile import compiler_differences

    kind, value, identity = result
    diff = compiler_differences(identity)
    if diff:
        raise WorkerLost(f"{where} compiles with another compiler ({'; '.join(diff)}); its "
                         f"evidence is not used: install the same versions there")
    if kind == "raise":
        raise value
    return value


def _init_worker(num_cpu_devices: int) -> None:
    import jax

    from aoizora.extract.targets import prepare_libtpu_env

    prepare_libtpu_env()
    if num_cpu_devices:
        jax.config.update("jax_num_cpu_devices", num_cpu_devices)


class LocalWorkers:
    """``n`` worker processes on this machine, one job each at a time (module docstring)."""

    name = "local processes"

    def __init__(self, n: int):
        if int(n) != n or n < 1:
            raise WorkersError(f"{n!r} local compile workers: give 1 or more")
        self.slots = int(n)
        self._lock = threading.Lock()
        self._free = [self._new() for _ in range(self.slots)]
        self._busy: list[cf.ProcessPoolExecutor] = []

    def _new(self) -> cf.ProcessPoolExecutor:
        import jax

        ncpu = int(jax.config.jax_num_cpu_devices or 0)
        return cf.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                      initializer=_init_worker, initargs=(max(ncpu, 0),))

    def worker_pids(self) -> list[int]:
        """The worker processes alive now (e.g. for a test that kills one)."""
        with self._lock:
            pools = self._free + self._busy
        return [pr.pid for p in pools for pr in (getattr(p, "_processes", None) or {}).values()]

    def run(self, job: Callable[[], Any]) -> Any:
        with self._lock:
            pool = self._free.pop()
            self._busy.append(pool)
        replacement = None
        try:
            result = pool.submit(run_pickled, _pack(job)).result()
        except cf.process.BrokenProcessPool as e:
            pool.shutdown(wait=False, cancel_futures=True)
            replacement = self._new()
            raise WorkerLost(f"the compile worker process died mid-compile ({e or 'killed'}); "
                             f"that candidate is lost, a new worker takes its place") from None
        finally:
            with self._lock:
                self._busy.remove(pool)
                self._free.append(replacement or pool)
        return _unpack(result, "a local compile worker")

    def close(self) -> None:
        with self._lock:
            pools, self._free = self._free, []
        for p in pools:
            p.shutdown(wait=True, cancel_futures=True)


def ray_runtime_env(pin: bool) -> dict[str, Any]:
    """The Ray tasks' runtime environment: libtpu's and XLA's options and the cache location of
    this process; with ``pin``, jax, jaxlib and libtpu at this machine's versions (``pip``)."""
    from aoizora.extract.aot_compile import compiler_identity

    env = {k: os.environ[k] for k in ("LIBTPU_INIT_ARGS", "XLA_FLAGS", "AOIZORA_CACHE",
                                      "JAX_PLATFORMS") if os.environ.get(k)}
    out: dict[str, Any] = {"env_vars": env}
    if pin:
        ident = compiler_identity()
        out["pip"] = [f"{name}=={ident[name]}" for name in ("jax", "jaxlib", "libtpu")
                      if ident.get(name)]
    return out


class RayWorkers:
    """Compiles as Ray tasks (module docstring). ``address``: None for a local instance (or the
    one already started in this process, or ``RAY_ADDRESS``), ``ray://HOST:PORT`` for a
    cluster.

    Raises:
        WorkersError: ray is not installed (``pip install 'aoizora[ray]'``)."""

    name = "Ray tasks"

    def __init__(self, address: str | None = None, cpus_per_task: float = 1.0,
                 max_retries: int = RAY_MAX_RETRIES):
        try:
            import ray
        except ImportError:
            raise WorkersError("--compile-workers ray needs Ray: pip install 'aoizora[ray]'") \
                from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, runtime_env=ray_runtime_env(pin=address is not None),
                     log_to_driver=False, configure_logging=False)
        self.slots = max(1, int(ray.cluster_resources().get("CPU", 1) // cpus_per_task))
        self._task = ray.remote(num_cpus=cpus_per_task, max_retries=max_retries)(run_pickled)

    def run(self, job: Callable[[], Any]) -> Any:
        ray = self._ray
        ref = self._task.remote(_pack(job))
        try:
            result = ray.get(ref)
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.TaskUnschedulableError, ray.exceptions.RaySystemError) as e:
            raise WorkerLost(f"the Ray compile worker was lost mid-compile "
                             f"({type(e).__name__}); that candidate is lost") from None
        return _unpack(result, "a Ray compile worker")

    def close(self) -> None:
        pass        # the Ray instance is the caller's (or ends with this process)


def workers_for(spec: "str | int | None") -> Any:
    """The workers ``spec`` names (module docstring).

    Raises:
        WorkersError: an unknown spec, or ray missing."""
    s = "auto" if spec is None else str(spec).strip().lower()
    if s == "auto":
        n = auto_slots()
        return InlineWorkers() if n == 1 else LocalWorkers(n)
    if s == "inline":
        return InlineWorkers()
    if s == "local":
        return LocalWorkers(auto_slots())
    if s.startswith("local:") or s.isdigit():
        n = s.split(":", 1)[-1]
        if not n.isdigit() or int(n) < 1:
            raise WorkersError(f"--compile-workers {spec}: give local:N with N >= 1")
        return LocalWorkers(int(n))
    if s == "ray":
        return RayWorkers(None)
    if s.startswith("ray://"):
        return RayWorkers(str(spec).strip())
    raise WorkersError(f"--compile-workers {spec!r}: use auto, inline, local, local:N, N, ray "
                       f"or ray://HOST:PORT")
