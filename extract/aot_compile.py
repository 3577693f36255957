"""Compile a candidate ahead of time for a target slice and read its evidence.

`compile_evidence(fn, args, mesh=..., target=...)` lowers and compiles `fn` on `mesh` (built from
`target_mesh`, i.e. from libtpu's devices for the target in some order) and returns `Evidence`:
- a compile-time ``RESOURCE_EXHAUSTED`` (the program does not fit in HBM) is a recorded outcome:
  ``memory.fits=False`` with the compiler's message, no collectives; one about a core's scratch
  memory (SMEM, VMEM: a kernel's blocks, not the layout's HBM use) is a ``CompileError``;
- ``compile_s`` is the wall time of ``.compile()`` (seconds; lowering excluded);
- on a mesh of CPU devices (the fallback when libtpu is unavailable, see `target_mesh`) the
  evidence is marked ``fidelity="cpu-low"``;
- inside ``with keeping_hlo(directory):`` (on any thread: the planner compiles on a background
  thread) each compile also writes its program's HLO text (``compiled.as_text()``) gzip'd into
  `directory`, and the evidence's ``hlo_path`` names the file (``read_hlo`` reads it back): for
  benchmarks that price the compiled program with a model of their own. Off by default.
- with ``cache=`` (an ``evidence_cache.EvidenceCache``) the lowered program is looked up first
  (``evidence_key_parts``: its StableHLO, the target, device order, options and compiler
  identity); a hit returns the stored evidence (``source="cache"``, ``compile_s`` of the compile
  that made it) without compiling, a miss compiles and stores it. Under ``keeping_hlo`` an entry
  without the HLO text is a miss (compiled again, and stored with it). The evidence's
  ``cache_key`` is its entry's key: ``keep_alias`` keeps it under a record key its caller derives
  from what decides the lowered text, and ``evidence_by_alias`` reads the evidence back from
  there without lowering.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import re
import threading
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Sequence

import numpy as np

from aoizora.extract.compiled_evidence import evidence_from_compiled
from aoizora.extract.evidence import Evidence, MemoryUse
from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.extract.hardware.gpu import COMPILER_OPTIONS as GPU_COMPILER_OPTIONS
from aoizora.extract.targets import Target, TargetError, libtpu_available


class CompileError(ValueError):
    """The candidate failed to trace, lower or compile for a reason other than HBM."""


_HLO_DIRS: list[str] = []          # the directories of the active ``keeping_hlo`` (innermost last)
_HLO_LOCK = threading.Lock()
_HLO_SEQ = itertools.count()


@contextlib.contextmanager
def keeping_hlo(directory: "str | os.PathLike[str]"):
    """While active, every ``compile_evidence`` (whichever thread runs it) writes its compiled
    program's HLO text gzip'd into `directory` (created if missing) and sets the evidence's
    ``hlo_path``. Nothing is kept in memory; the caller owns the files (e.g. a temporary
    directory removed once they have been read)."""
    d = os.fspath(directory)
    os.makedirs(d, exist_ok=True)
    with _HLO_LOCK:
        _HLO_DIRS.append(d)
    try:
        yield d
    finally:
        with _HLO_LOCK:
            _HLO_DIRS.remove(d)


def _hlo_dir() -> str | None:
    with _HLO_LOCK:
        return _HLO_DIRS[-1] if _HLO_DIRS else None


def kept_hlo_dir() -> str | None:
    """The directory of the innermost active ``keeping_hlo`` (None: HLO is not kept): a compile
    worker in another process keeps its HLO there too (``aoizora.planning.compile_workers``)."""
    return _hlo_dir()


def _keep_hlo(directory: str, text: str, tgt: Target) -> str:
    path = os.path.join(directory, f"{next(_HLO_SEQ):05d}-{tgt.short_name}.hlo.gz")
    with gzip.open(path, "wt", compresslevel=1, encoding="utf-8") as f:
        f.write(text)
    return path


def read_hlo(evidence: Evidence) -> str | None:
    """The HLO text kept for `evidence` (``keeping_hlo``), or None when none was kept or its file
    is gone."""
    path = getattr(evidence, "hlo_path", None)
    if not path or not os.path.exists(path):
        return None
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


COMPILER_PACKAGES = ("jax", "jaxlib", "libtpu")


def compiler_identity() -> dict[str, str]:
    """What compiles here: the versions of ``COMPILER_PACKAGES`` ("" when absent) and the
    ``LIBTPU_INIT_ARGS`` libtpu reads its options from ("" when unset). Evidence, and so every
    prediction made from it, depends on them."""
    out = {}
    for name in COMPILER_PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = ""
    out["LIBTPU_INIT_ARGS"] = os.environ.get("LIBTPU_INIT_ARGS", "")
    return out


def evidence_key_parts(lowered: Any, mesh: Any, tgt: Target,
                       compiler_options: "dict[str, Any] | None",
                       donate_argnums: Sequence[int] = ()) -> dict[str, Any]:
    """What decides a compile's evidence (``evidence_cache`` keys it): the SHA-256 of the lowered
    StableHLO text (program, shardings, kernel configs) and ``setting_key_parts``."""
    import hashlib

    text = lowered.as_text()
    return {"program": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            **setting_key_parts(mesh, tgt, compiler_options, donate_argnums)}


def setting_key_parts(mesh: Any, tgt: Target, compiler_options: "dict[str, Any] | None",
                      donate_argnums: Sequence[int] = ()) -> dict[str, Any]:
    """What decides a compile's evidence besides its program: the target, the mesh's device
    order, axes and platform, the per-compile options, the donated arguments, and the
    compiler's identity (``compiler_identity`` and ``XLA_FLAGS``)."""
    devs = list(mesh.devices.flat)
    return {
        "target": tgt.name, "mesh_axes": [[str(k), int(v)] for k, v in mesh.shape.items()],
        "device_order": [int(d.id) for d in devs],
        "platform": str(getattr(devs[0], "platform", "")),
        "compiler_options": sorted((str(k), str(v)) for k, v in (compiler_options or {}).items()),
        "donate_argnums": sorted(int(i) for i in donate_argnums),
        "compiler": {**compiler_identity(), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")},
    }


def cached_evidence(cache: EvidenceCache, key: str, tgt: Target) -> Evidence | None:
    """The evidence stored under ``key``, marked ``source="cache"`` (``cache_key``: ``key``);
    under ``keeping_hlo`` its HLO text is written there (``hlo_path``).

    Returns:
        None when the entry is absent, corrupt (the cache reports it in one line and removes
        it) or, under ``keeping_hlo``, kept without its HLO text."""
    keep = _hlo_dir()
    hit = cache.get(key)
    if hit is None or (keep is not None and hit.hlo_text is None):
        return None
    ev = hit.evidence
    ev.source, ev.cache_key = "cache", key
    if keep:
        ev.hlo_path = _keep_hlo(keep, hit.hlo_text, tgt)
    return ev


def keep_alias(cache: EvidenceCache, alias: str, evidence: Evidence) -> None:
    """Keep under the record key ``alias`` the key of the entry ``evidence`` was stored or found
    under (``{"evidence": evidence.cache_key}``), for ``evidence_by_alias`` to find it without
    lowering; nothing when it has none (compiled without a cache). Its caller keys ``alias`` by
    whatever decides the lowered text (``aoizora.planning.lowering_memo``)."""
    if evidence.cache_key:
        cache.put_record(alias, {"evidence": evidence.cache_key})


def evidence_by_alias(cache: EvidenceCache, alias: str, tgt: Target) -> Evidence | None:
    """The evidence an alias names (``keep_alias``), found without lowering.

    Args:
        alias: a record key of ``cache`` whose record is ``{"evidence": <evidence key>}``.
    Returns:
        ``cached_evidence`` of the key it names; None when there is no record, its record is
        corrupt (reported in one line ending "lowering again", removed) or names no key, or
        the evidence is gone: the caller lowers and compiles as without it."""
    record = cache.get_record(alias, then="lowering again")
    key = None if record is None else record.get("evidence")
    if not (isinstance(key, str) and re.fullmatch(r"[0-9a-f]{64}", key)):
        return None
    return cached_evidence(cache, key, tgt)


def compiler_differences(recorded: dict[str, str], current: dict[str, str] | None = None) -> list[str]:
    """``name recorded -> current`` for each entry of a recorded ``compiler_identity`` that
    differs from this machine's ([] when the record is empty: plans made before it was kept)."""
    current = compiler_identity() if current is None else current
    return [f"{k} {recorded[k] or '(none)'} -> {current.get(k) or '(none)'}"
            for k in recorded if recorded[k] != current.get(k, "")]


def target_mesh(target: Target, axes: "dict[str, int] | Sequence[tuple[str, int]]",
                device_order: Sequence[int] | None = None, *, allow_cpu: bool = True,
                platform: str | None = None) -> Any:
    """A `jax.sharding.Mesh` over the target's devices (Auto axes).

    `axes`: logical axis name -> size, in order (their product must be the device count).
    `device_order`: physical device ids per logical rank (default: by id). When libtpu is not
    available and `allow_cpu`, the mesh is built from the same number of CPU devices instead
    (the evidence then comes out as ``fidelity="cpu-low"``); ``platform="cpu"`` forces that
    fallback, ``platform="tpu"`` forbids it. A GPU target (``h100-8``, ...) compiles with XLA:GPU
    ahead of time over the jax CUDA plugin's devices (the ``gpu`` extra), and raises CompileError
    when that plugin is missing, unless ``platform="cpu"`` asks for the CPU fallback."""
    import jax

    tgt = target
    items = list(axes.items()) if isinstance(axes, dict) else [tuple(a) for a in axes]
    names = tuple(str(k) for k, _ in items)
    sizes = tuple(int(v) for _, v in items)
    n = int(np.prod(sizes)) if sizes else 1
    if n != tgt.num_devices:
        raise CompileError(f"mesh {dict(zip(names, sizes))} has {n} devices but {tgt.name} has "
                           f"{tgt.num_devices}; choose axis sizes whose product is {tgt.num_devices}")
    if platform not in (None, "tpu", "cpu", "gpu"):
        raise CompileError(f"platform {platform!r}: use 'tpu', 'gpu', 'cpu' or None (automatic)")
    if tgt.family == "gpu" and platform != "cpu":
        # XLA:GPU ahead of time (the jax CUDA plugin, extra `gpu`); no silent CPU fallback
        try:
            devs = {d.id: d for d in tgt.devices()}
        except TargetError as e:
            raise CompileError(f"cannot compile for {tgt.name}: {e}") from e
        return _mesh(devs, device_order, names, sizes, tgt)
    use_tpu = platform not in ("cpu", "gpu") and libtpu_available()
    if platform == "tpu" and not use_tpu:
        raise CompileError(f"libtpu is unavailable; cannot compile for {tgt.name} "
                           f"(install jax[tpu] or use platform='cpu')")
    if use_tpu:
        devs = {d.id: d for d in tgt.devices()}
    elif allow_cpu or platform == "cpu":
        cpus = jax.devices("cpu")
        if len(cpus) < n:
            raise CompileError(f"libtpu is unavailable and only {len(cpus)} CPU devices exist for "
                               f"the {n}-device fallback; set jax.config.update("
                               f"'jax_num_cpu_devices', {n}) before using jax")
        devs = {i: d for i, d in enumerate(cpus[:n])}
    else:
        raise CompileError(f"libtpu is unavailable; cannot compile for {tgt.name}")
    return _mesh(devs, device_order, names, sizes, tgt)


def _mesh(devs: dict, device_order, names: tuple, sizes: tuple, tgt: Target) -> Any:
    from jax.sharding import AxisType, Mesh

    order = list(device_order) if device_order is not None else sorted(devs)
    if sorted(order) != sorted(devs):
        raise CompileError(f"device_order {order} is not a permutation of the device ids "
                           f"{sorted(devs)} of {tgt.name}")
    arr = np.array([devs[i] for i in order], dtype=object).reshape(sizes)
    return Mesh(arr, names, axis_types=(AxisType.Auto,) * len(names))


def _as_sharding(mesh: Any, s: Any) -> Any:
    from jax.sharding import NamedSharding, PartitionSpec

    if isinstance(s, PartitionSpec):
        return NamedSharding(mesh, s)
    return s


def _tree_shardings(mesh: Any, tree: Any) -> Any:
    import jax
    from jax.sharding import PartitionSpec

    return jax.tree.map(lambda s: _as_sharding(mesh, s), tree,
                        is_leaf=lambda x: x is None or isinstance(x, PartitionSpec))


def compile_evidence(fn: Any, args: Sequence[Any], *, mesh: Any, target: Target,
                     in_shardings: Any = None, out_shardings: Any = None,
                     static_argnums: Sequence[int] = (), donate_argnums: Sequence[int] = (),
                     compiler_options: "dict[str, Any] | None" = None,
                     cache: EvidenceCache | None = None) -> Evidence:
    """Compile `fn(*args)` on `mesh` for `target` and return its Evidence.

    `args`: positional arguments as pytrees of `jax.ShapeDtypeStruct` (with or without a
    NamedSharding) or arrays. `in_shardings` / `out_shardings`: as for `jax.jit`; a bare
    `PartitionSpec` is taken on `mesh`. Raises CompileError when tracing, lowering or compiling
    fails for any reason other than running out of HBM (which is recorded, see module doc).
    `compiler_options`: XLA / libtpu options for this compile only, as for
    `jax.stages.Lowered.compile`, e.g.
    ``{"xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call": True}``; the evidence
    is then of the program compiled with them. `cache`: look the compile up first and store
    what it gives (module docstring); the evidence's ``cache_key`` is its entry's key."""
    import jax

    tgt = target
    jit_kw: dict[str, Any] = {}
    if in_shardings is not None:
        jit_kw["in_shardings"] = _tree_shardings(mesh, in_shardings)
    if out_shardings is not None:
        jit_kw["out_shardings"] = _tree_shardings(mesh, out_shardings)
    if static_argnums:
        jit_kw["static_argnums"] = tuple(static_argnums)
    if donate_argnums:
        jit_kw["donate_argnums"] = tuple(donate_argnums)
    try:
        with jax.set_mesh(mesh):
            lowered = jax.jit(fn, **jit_kw).lower(*args)
    except Exception as e:
        raise CompileError(f"cannot trace/lower {getattr(fn, '__name__', fn)} for {tgt.name}: "
                           f"{_first_line(e)}") from e
    compiler_options, dropped = _options_for(tgt, mesh, compiler_options)
    if cache is None:
        return _compile(fn, lowered, mesh, tgt, compiler_options, _hlo_dir(), dropped)
    key = cache.key(evidence_key_parts(lowered, mesh, tgt, compiler_options, donate_argnums))
    ev = cached_evidence(cache, key, tgt)
    if ev is None:
        keep = _hlo_dir()
        ev = _compile(fn, lowered, mesh, tgt, compiler_options, keep, dropped)
        cache.put(key, ev, read_hlo(ev) if keep else None)
        ev.cache_key = key
    return ev


def _options_for(tgt: Target, mesh: Any, compiler_options: "dict[str, Any] | None"
                 ) -> "tuple[dict[str, Any] | None, list[str]]":
    """The options one compile is given, and the TPU options dropped from them: on a GPU
    target compiled by XLA:GPU, ``GPU_COMPILER_OPTIONS`` under the caller's, without the
    ``xla_tpu_`` options a layout written for TPUs (an expert's, a recipe's) may carry."""
    if not (tgt.family == "gpu" and _platform(mesh) == "gpu"):
        return compiler_options, []
    dropped = sorted(k for k in (compiler_options or {}) if k.startswith("xla_tpu_"))
    return {**GPU_COMPILER_OPTIONS, **{k: v for k, v in (compiler_options or {}).items()
                                       if k not in dropped}}, dropped


def _compile(fn: Any, lowered: Any, mesh: Any, tgt: Target,
             compiler_options: "dict[str, Any] | None", keep: str | None,
             dropped: list[str]) -> Evidence:
    """``lowered.compile`` -> Evidence (``compile_evidence``'s compile and reading; ``dropped``:
    the options taken out, to which the compile adds any XLA:GPU does not know)."""
    t0 = time.perf_counter()
    try:
        compiled = _compile_dropping_unknown(lowered, compiler_options, dropped,
                                             tgt.family == "gpu")
    except Exception as e:
        msg = str(e)
        space = _scratch_space(msg)
        if space:
            raise CompileError(
                f"XLA cannot compile {getattr(fn, '__name__', fn)} for {tgt.name}: a kernel's "
                f"on-chip {space} overflows (not HBM; e.g. a Pallas kernel's block sizes): "
                f"{_oom_text(msg)[:300]}{_scratch_detail(msg)}") from e
        if "RESOURCE_EXHAUSTED" in msg:
            dt = time.perf_counter() - t0
            platform = _platform(mesh)
            return Evidence(
                target=tgt.name, mesh_axes=dict(mesh.shape), generation=tgt.generation,
                fidelity=platform if platform in ("tpu", "gpu") else "cpu-low",
                memory=MemoryUse(hbm_bytes=tgt.chip.device_hbm_bytes,
                                 fits=False, oom_message=_oom_text(msg)),
                clock_hz=tgt.chip.clock_hz, compile_s=dt,
                algorithms_device_order=[int(d.id) for d in mesh.devices.flat],
                warnings=[f"does not fit in HBM: {_oom_text(msg)}"])
        raise CompileError(f"XLA cannot compile {getattr(fn, '__name__', fn)} for {tgt.name}: "
                           f"{_first_line(e)}") from e
    dt = time.perf_counter() - t0
    text = compiled.as_text() if keep else None
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh, compile_s=dt, hlo_text=text)
    if dropped:
        ev.warnings.append(f"TPU options not given to XLA:GPU: {', '.join(sorted(dropped))}")
    if keep:
        ev.hlo_path = _keep_hlo(keep, text, tgt)
    return ev


def _compile_dropping_unknown(lowered: Any, options: "dict[str, Any] | None", dropped: list,
                              drop: bool) -> Any:
    """``lowered.compile(options)``; with `drop` (a GPU target), an option XLA:GPU does not know
    (a TPU layout's, e.g. ``xla_enable_async_all_reduce``) is removed, named in `dropped`, and
    the compile retried."""
    options = dict(options or {})
    while True:
        try:
            return lowered.compile(compiler_options=options or None)
        except Exception as e:
            m = re.search(r"No such compile option: '([^']+)'", str(e))
            if not (drop and m and m.group(1) in options):
                raise
            options.pop(m.group(1))
            dropped.append(m.group(1))


def _platform(mesh: Any) -> str:
    """The platform of the mesh's devices: "tpu", "gpu" (XLA:GPU ahead of time) or "cpu"."""
    return str(getattr(next(iter(mesh.devices.flat)), "platform", "tpu"))


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _scratch_detail(msg: str) -> str:
    """libtpu's line with the allocation's size and the limit ("Scoped allocation with size
    31.85M and limit 16.00M ...": it follows the RESOURCE_EXHAUSTED line), as " (...)"; "" when
    the message has none."""
    m = re.search(r"Scoped allocation with size [\d.]+[KMG]? and limit [\d.]+[KMG]?[^\n]*", msg)
    return f" ({m.group(0).strip()[:200]})" if m else ""


def _scratch_space(msg: str) -> str:
    """"SMEM" or "VMEM" when a RESOURCE_EXHAUSTED is about a core's scratch memory, not HBM
    ("Ran out of memory in memory space smem", "Allocation ... space=smem"), else ""."""
    line = _oom_text(msg) if "RESOURCE_EXHAUSTED" in msg else ""
    # libtpu 0.0.42.1 also says "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:" with the
    # "memory space vmem" line after it
    oom = re.search(r"CompileTimeScoped([SV]mem)Oom", line, re.IGNORECASE)
    if oom:
        return oom.group(1).upper()
    m = re.search(r"memory space ([sv]mem)\b|space=([sv]mem)\b", line, re.IGNORECASE)
    return (m.group(1) or m.group(2)).upper() if m and "HBM" not in line else ""


def _oom_text(msg: str) -> str:
    for line in msg.splitlines():
        if "RESOURCE_EXHAUSTED" in line:
            return line.strip()[:2000]
    return msg.strip().splitlines()[0][:2000]
