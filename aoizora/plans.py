"""A plan: the logical mesh, the layout of every tensor and op, the physical chip of each logical
rank, the predicted step latency, and each solver's certificate. Saved as JSON, applied to JAX as a
Mesh plus jit shardings.

A plan carries a key (the function's fingerprint, its input shapes, the target), so that a cached
plan is reused for the same program and refused, with a clear message, for another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Callable

from aoizora.extract.atomic_io import atomic_write
from aoizora.formulation.calibration import Calibration, CalibrationError
from aoizora.formulation.layout import Layout, Spec
from aoizora.plan_schema import PLAN_FORMAT, PlanError, plan_error, validate_plan_json
from aoizora.prediction import Predicted
from aoizora.solvers.certificate import Certificate

__all__ = ["PLAN_FORMAT", "Plan", "PlanError", "PlanKey", "Predicted", "load_plan", "program_key"]


@dataclasses.dataclass(frozen=True)
class PlanKey:
    fingerprint: str                 # sha256 of the traced program (jaxpr text) and input shapes
    input_shapes: tuple[str, ...]    # "bf16[2,32760,1536]" per flattened input leaf
    target: str                      # canonical target name

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "input_shapes": list(self.input_shapes),
                "target": self.target}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PlanKey":
        return cls(d["fingerprint"], tuple(d["input_shapes"]), d["target"])


def finite_json(obj: Any) -> Any:
    """``obj`` (JSON-like: dicts, lists, numbers, strings) with every NaN or infinity replaced by
    None: for the free-form records a plan carries (iterations, calibration), so that the plan
    is strict JSON; the plan's own numbers are checked, not replaced (``Plan.save``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def _shape_str(x) -> str:
    import numpy as np

    return f"{np.dtype(x.dtype).name}[{','.join(map(str, x.shape))}]"


def program_key(fn: Callable, abstract_args: tuple, target: str) -> PlanKey:
    """The key of (fn, abstract_args, target): a digest of the traced jaxpr and the input shapes."""
    import jax

    leaves = jax.tree_util.tree_leaves(abstract_args)
    shapes = tuple(_shape_str(x) for x in leaves)
    avals = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract_args)
    text = str(jax.make_jaxpr(fn)(*avals))
    h = hashlib.sha256()
    h.update(text.encode())
    h.update(repr(shapes).encode())
    h.update(str(jax.tree_util.tree_structure(abstract_args)).encode())
    return PlanKey(h.hexdigest()[:32], shapes, target)


@dataclasses.dataclass
class Plan:
    """A plan for one program on one target: what ``aoizora.plan`` returns and ``load_plan``
    reads back. Applied with ``make_mesh`` and ``jit``; saved as JSON with ``save``.

    Attributes:
      key: the program's fingerprint, input shapes and target (``PlanKey``).
      target: the canonical target, e.g. ``"v5e:2x4"``.
      layout: the logical mesh, every input's and op's sharding, the attention layouts.
      device_order: the device id of each logical rank (``mesh.devices.flat``).
      device_coords: the physical chip coordinates of each logical rank.
      predicted: one step's latency predicted by Q2, seconds per step (``Predicted``).
      certificates: what each solver proved, by name (``"sharding"``, ``"placement"``):
        ``solvers.certificate.Certificate``, objective and bound in its ``unit``.
      iterations: the record of every iteration of the planner's loop (JSON objects).
      planning_time_s: wall-clock seconds the planning took.
      layout_in_words: the layout of the main ops, one sentence each.
      fits_hbm: whether the compiled program fits in each chip's HBM; None if not compiled.
      hbm_bytes_per_device: the compiled program's peak HBM per chip, bytes.
      status: ``"OPTIMAL"`` when both solvers proved their answers optimal.
      notes: what the planner wants the reader to know (one sentence each).
      program: the program variant planned (e.g. ``pad_multiple``).
      calibration: what the loop learned on this target, to warm-start the next plan.
      time_limited: what the time budget cut short (``aoizora.planning.time_limits``).
      compiler: the compiler's identity (``extract.aot_compile.compiler_identity``).
    """

    key: PlanKey
    target: str                                      # canonical target, e.g. "v5e:2x4"
    layout: Layout                                   # mesh axes, specs, attention layouts
    device_order: list[int]                          # device id of each logical rank (mesh.devices.flat)
    device_coords: list[tuple[int, ...]]             # physical chip coordinates of each logical rank
    predicted: Predicted                             # seconds per step by Q2 (a dict is converted)
    certificates: dict[str, Certificate]             # "sharding", "placement"
    iterations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    planning_time_s: float = 0.0
    layout_in_words: list[str] = dataclasses.field(default_factory=list)
    fits_hbm: bool | None = None
    hbm_bytes_per_device: int | None = None
    status: str = ""                                 # "OPTIMAL" when both solvers proved optimality
    notes: list[str] = dataclasses.field(default_factory=list)
    program: dict[str, Any] = dataclasses.field(default_factory=dict)  # variant, e.g. pad_multiple
    calibration: Calibration | None = None           # what the loop learned (warm start next time)
    time_limited: list[str] = dataclasses.field(default_factory=list)  # aoizora.planning.time_limits
    compiler: dict[str, str] = dataclasses.field(default_factory=dict)  # extract.aot_compile.compiler_identity
    # the planning run's compiles: "compiled" (ran), "cached" (evidence from the evidence cache),
    # "failed", "workers" (where they ran), "cache" (the cache directory, or None),
    # "solver_answers_cached" (sharding and placement answers from it: planning.solve_memo)
    compiles: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.predicted, Predicted):
            self.predicted = Predicted.from_json(self.predicted)

    # -- views -----------------------------------------------------------------------------------
    @property
    def mesh(self) -> dict[str, int]:
        """Logical mesh: axis name -> size, in order."""
        return dict(self.layout.mesh_axes)

    @property
    def in_shardings(self) -> list:
        """PartitionSpecs of the flattened inputs."""
        return [_pspec(s) for s in self.layout.in_specs]

    @property
    def out_shardings(self) -> list | None:
        """PartitionSpecs of the flattened outputs; None when the layout leaves them free."""
        if self.layout.out_specs is None:
            return None
        return [_pspec(s) for s in self.layout.out_specs]

    # -- applying ----------------------------------------------------------------------------------
    def make_mesh(self, devices=None):
        """A jax Mesh over real devices in the planned order (axis types Auto).

        Args:
          devices: defaults to ``jax.devices()``. Devices that carry physical ``coords`` (TPU)
            are matched by chip coordinates, so the plan lands on the chips it was priced for;
            others (CPU) are taken by id in the planned order.

        Returns:
          A ``jax.sharding.Mesh`` of the plan's axes.

        Raises:
          PlanError: fewer devices than the plan needs.
        """
        import jax
        import numpy as np
        from jax.sharding import AxisType, Mesh

        devices = list(jax.devices() if devices is None else devices)
        n = len(self.device_order)
        if len(devices) < n:
            raise PlanError(f"the plan needs {n} devices, {len(devices)} given")
        nd = len(self.device_coords[0]) if self.device_coords else 0
        by_coords = {}
        for d in devices:
            c = getattr(d, "coords", None)
            if c is not None and getattr(d, "core_on_chip", 0) == 0:
                by_coords[tuple(int(v) for v in c[:nd])] = d
        if by_coords and all(tuple(c) in by_coords for c in self.device_coords):
            ordered = [by_coords[tuple(c)] for c in self.device_coords]
        else:  # no coordinates (CPU): the same permutation, by device id
            by_id = sorted(devices, key=lambda d: d.id)
            ordered = [by_id[i] for i in self.device_order]
        names = tuple(self.layout.mesh_axes)
        shape = tuple(self.layout.mesh_axes.values())
        return Mesh(np.array(ordered, dtype=object).reshape(shape), names,
                    axis_types=(AxisType.Auto,) * len(names))

    def jit(self, fn: Callable, mesh, donate_argnums: tuple[int, ...] = ()):
        """``fn`` jitted with the plan's shardings on ``mesh``.

        With the plan's attention tiles (``layout.attention[...].block_*``) and, on a TPU mesh,
        its compiler options (``layout.compiler_options``, given to the compile as
        ``compiler_options``; the same flags as LIBTPU_INIT_ARGS).

        Args:
          fn: the program the plan was made for.
          mesh: a mesh from ``make_mesh``.
          donate_argnums: positional args whose buffers the step may reuse (a training step:
            ``(0,)``, its state; the caller must not use the donated arrays after the call).

        Returns:
          A function of ``fn``'s arguments; it traces and compiles on its first call.

        Raises:
          PlanError: (on the first call) the arguments are not the planned program's.
        """
        from aoizora.runtime.realize import realize

        cache: dict[str, Any] = {}

        def run(*args):
            if "f" not in cache:
                key = program_key(fn, args, self.target)
                self.check_key(key)
                realized = realize(fn, args, self.layout, mesh, donate_argnums=donate_argnums)
                cache["f"] = realized.runner()
            return cache["f"](*args)

        return run

    def check_key(self, key: PlanKey, *, ignore_target: bool = True) -> None:
        """Refuses another program.

        Args:
          key: the key of the program at hand (``program_key``).
          ignore_target: accept a key for another target (the layout runs there too).

        Returns:
          None.

        Raises:
          PlanError: other input shapes, another program, or (unless ``ignore_target``)
            another target; the message says to plan that program instead.
        """
        if key.input_shapes != self.key.input_shapes:
            raise PlanError(f"this plan is for inputs {list(self.key.input_shapes)[:3]}..., "
                            f"not {list(key.input_shapes)[:3]}...; plan this program instead")
        if key.fingerprint != self.key.fingerprint:
            raise PlanError("this plan was made for another program (fingerprint "
                            f"{self.key.fingerprint[:12]} != {key.fingerprint[:12]}); plan this program instead")
        if not ignore_target and key.target != self.key.target:
            raise PlanError(f"this plan is for {self.key.target}, not {key.target}; plan for that target")

    # -- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The plan file's JSON object (format ``PLAN_FORMAT``, read back by ``from_json``).

        Returns:
          A dict of JSON values; seconds are seconds, bytes are bytes.
        """
        return {
            "format": PLAN_FORMAT,
            "key": self.key.to_json(),
            "target": self.target,
            "mesh": self.mesh,
            "device_order": list(self.device_order),
            "device_coords": [list(c) for c in self.device_coords],
            "layout": self.layout.to_json(),
            "layout_in_words": list(self.layout_in_words),
            "predicted": finite_json(self.predicted.to_json()),
            "certificates": {k: finite_json(v.to_json()) for k, v in self.certificates.items()},
            "iterations": finite_json(self.iterations),
            "planning_time_s": self.planning_time_s,
            "fits_hbm": self.fits_hbm,
            "hbm_bytes_per_device": self.hbm_bytes_per_device,
            "status": self.status,
            "notes": list(self.notes),
            "program": dict(self.program),
            "calibration": finite_json(self.calibration.to_json()) if self.calibration else None,
            "time_limited": list(self.time_limited),
            "compiler": dict(self.compiler),
            "compiles": dict(self.compiles),
        }

    @classmethod
    def from_json(cls, d: Any, source: str | None = None) -> "Plan":
        """The plan of a JSON object, checked first (``plan_schema.validate_plan_json``).

        Args:
          d: the JSON object of a plan file (any format this version reads).
          source: the file it came from, named in the error's advice.

        Returns:
          The ``Plan``.

        Raises:
          PlanError: one line naming the first bad field and what to do.
        """
        validate_plan_json(d, source)
        try:
            calibration = (Calibration.from_json(d["calibration"])
                           if d.get("calibration") is not None else None)
        except CalibrationError as e:
            raise plan_error("calibration", str(e).split(";")[0], source) from None
        return cls(
            key=PlanKey.from_json(d["key"]), target=d["target"],
            layout=Layout.from_json(d["layout"]),
            device_order=[int(v) for v in d["device_order"]],
            device_coords=[tuple(int(x) for x in c) for c in d["device_coords"]],
            predicted=Predicted.from_json(d["predicted"]),
            certificates={k: Certificate.from_json(v) for k, v in d["certificates"].items()},
            iterations=list(d.get("iterations", [])),
            planning_time_s=float(d.get("planning_time_s", 0.0)),
            layout_in_words=list(d.get("layout_in_words", [])),
            fits_hbm=d.get("fits_hbm"), hbm_bytes_per_device=d.get("hbm_bytes_per_device"),
            status=d.get("status", ""), notes=list(d.get("notes", [])),
            program=dict(d.get("program", {})), calibration=calibration,
            time_limited=[str(w) for w in d.get("time_limited", [])],
            compiler={str(k): str(v) for k, v in d.get("compiler", {}).items()},
            compiles=dict(d.get("compiles", {})),
        )

    def save(self, path: str) -> None:
        """Writes the plan as JSON to ``path`` atomically (``extract.atomic_io``): a reader, or a
        failure half-way (a full disk), sees the old file or the new one, never a torn one.

        Args:
          path: the file to write.

        Returns:
          None.

        Raises:
            OSError: the file could not be written; the file at ``path`` is as it was.
            PlanError: the plan holds a number JSON cannot carry (NaN, infinity).
        """
        try:
            text = json.dumps(self.to_json(), indent=1, allow_nan=False)
        except ValueError as e:
            raise PlanError(f"the plan holds a number JSON cannot carry ({e}); this is a "
                            f"fault of aoizora's, please report it") from None
        atomic_write(path, text)


# A plan file is well under 1 MB (a v5p-128 plan with its iterations: about 0.3 MB); these caps
# refuse what no planner wrote before it costs seconds and GiBs to read (a 100 MB list: 22.5 s,
# 5.2 GB), or a RecursionError.
MAX_PLAN_BYTES = 16 * 1024 * 1024
MAX_PLAN_DEPTH = 64


def _depth(d: Any) -> int:
    """How deeply ``d`` (parsed JSON) nests lists and objects (iteratively: no recursion)."""
    deepest, todo = 0, [(d, 1)]
    while todo:
        x, k = todo.pop()
        if isinstance(x, (dict, list)):
            deepest = max(deepest, k)
            if k <= MAX_PLAN_DEPTH:
                todo += [(v, k + 1) for v in (x.values() if isinstance(x, dict) else x)]
    return deepest


def _read_json(path: str, redo: str) -> Any:
    """The JSON in ``path``, at most ``MAX_PLAN_BYTES`` and ``MAX_PLAN_DEPTH`` levels deep; a
    one-line PlanError otherwise (NaN and Infinity are read, then refused by the schema with the
    field named, ``plan_schema.validate_plan_json``)."""
    with open(path, "rb") as f:
        raw = f.read(MAX_PLAN_BYTES + 1)
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: larger than {MAX_PLAN_BYTES // 2**20} MiB, which no plan is; "
                        f"{redo}")
    text = raw.decode("utf-8")
    try:
        d = json.loads(text)
    except RecursionError:
        raise PlanError(f"{path}: nested deeper than a plan ever is (more than "
                        f"{MAX_PLAN_DEPTH} levels); {redo}") from None
    if _depth(d) > MAX_PLAN_DEPTH:
        raise PlanError(f"{path}: nested deeper than a plan ever is (more than "
                        f"{MAX_PLAN_DEPTH} levels); {redo}")
    return d


def load_plan(path: str) -> Plan:
    """Reads and checks a plan saved by ``Plan.save`` (or ``aoizora plan --out``).

    Args:
      path: the plan file.

    Returns:
      The ``Plan``.

    Raises:
      PlanError: a missing, unreadable, non-JSON, too large (``MAX_PLAN_BYTES``), too deeply
        nested (``MAX_PLAN_DEPTH``) or invalid file, in one line
        (``<field>: <what is wrong>; <what to do>``).
    """
    redo = f"make one with: aoizora plan --out {path}"
    try:
        d = _read_json(path, redo)
    except FileNotFoundError:
        raise PlanError(f"{path}: no plan file there; {redo}") from None
    except IsADirectoryError:
        raise PlanError(f"{path}: a directory, not a plan file; give a file from aoizora "
                        f"plan --out") from None
    except OSError as e:
        raise PlanError(f"{path}: cannot be read ({e.strerror}); check its permissions") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: not JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                        f"{redo}") from None
    except UnicodeDecodeError as e:
        raise PlanError(f"{path}: not JSON (not UTF-8 text at byte {e.start}); {redo}") from None
    return Plan.from_json(d, source=path)


def _pspec(spec: Spec | None):
    from jax.sharding import PartitionSpec as P

    return P() if spec is None else P(*spec)
