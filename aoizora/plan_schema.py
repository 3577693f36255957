"""What a plan file must hold, checked when it is read: the JSON schema (pydantic models, strict:
no string is read as a number, no float as an integer) and the rules that tie its fields to the
target (a device order that is a permutation of the slice's devices, a mesh as large as the slice,
specs over the mesh's own axes).

Every violation is one ``PlanError`` whose text is one line ``<field>: <what is wrong>; <what to
do>``; ``<field>`` is the path in the file, e.g. ``predicted.step_s``, ``layout.in_specs[3]`` or
``layout.node_specs['97.113']``.

Rules beyond the types (n = the target's device count, ``Target.num_devices``; the chip count
except on v4, which shows two devices per chip):
- ``target`` and ``key.target`` name the same known slice;
- ``device_order`` is a permutation of 0..n-1; ``device_coords`` has one chip coordinate per
  entry, inside the slice's shape, each chip ``devices_per_chip`` times, and ``device_coords[i]``
  is the chip of device ``device_order[i]`` (libtpu's topology);
- ``layout.mesh_axes``: prod over axes of size = n; ``mesh``, when present, equals it;
- every axis in ``layout.in_specs``, ``out_specs``, ``node_specs``, ``reshard_from``, ``attention`` (batch, heads,
  seq) and ``rules`` is a mesh axis, at most once per spec; ``in_specs`` has one spec per entry
  of ``key.input_shapes``, of that input's rank (or null);
- ``layout.attention`` tiles (``block_q``, ``block_kv``, ``block_kv_compute``, and the
  backward's ``block_q_dkv`` ... ``use_fused_bwd_kernel``, optional): positive integers, block_q
  a multiple of 8, the other tiles multiples of 128, a compute block dividing its block, no dq
  blocks with a fused backward; ``layout.compiler_options``: names ``xla_...``, values
  bool, number or string; ``layout.remat`` (optional, a training step's rematerialization):
  activation name -> "keep" | "recompute" | "offload";
- numbers are finite everywhere (no NaN or infinity: strict JSON, ``plans.load_plan``);
- ``predicted``: ``step_s``, ``compute_s``, ``communication_s`` and every other ``*_s`` entry
  is a finite number >= 0 (seconds; the optional ones may be null).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError

from aoizora.extract.targets import LibtpuArgsError, Target, TargetError, get_target
from aoizora.formulation.layout import ALL_TILE_FIELDS, tile_problems

PLAN_FORMAT = "aoizora-plan/1"


class PlanError(ValueError):
    """A plan file that cannot be read, or a plan applied to the wrong program or target
    (``load_plan``, ``Plan.from_json``, ``Plan.jit``, ``Plan.check_key``).

    Args:
      message: one line, ``<field>: <what is wrong>; <what to do>`` for a file.
    """


def plan_error(field: str, problem: str, source: str | None = None) -> PlanError:
    """The one-line error ``<field>: <problem>; <what to do>`` for a plan read from `source`."""
    fix = (f"fix it in {source} or plan again: aoizora plan --out {source}" if source
           else "plan again: aoizora plan --out FILE")
    return PlanError(f"{field}: {problem}; {fix}")


# -- types -----------------------------------------------------------------------------------------
Seconds = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(strict=True, ge=0)]
AxisSize = Annotated[int, Field(strict=True, gt=0)]
AxisName = Annotated[str, Field(strict=True, min_length=1)]
Shape = Annotated[str, Field(strict=True, pattern=r"^\w+\[(\d+(,\d+)*)?\]$")]
Tile = Annotated[int, Field(strict=True, gt=0)]


def _option_value(v: Any) -> Any:
    """A compiler option's value: a bool, a number or a string (as LIBTPU_INIT_ARGS spells)."""
    if isinstance(v, (bool, int, float, str)):
        return v
    raise ValueError(f"a compiler option is a bool, a number or a string, not {v!r:.40}")


OptionValue = Annotated[Any, PlainValidator(_option_value)]


def _spec_entry(v: Any) -> Any:
    """One dimension of a spec: null, an axis name, or a list of axis names."""
    if v is None or (isinstance(v, str) and v):
        return v
    if isinstance(v, list) and all(isinstance(a, str) and a for a in v):
        return v
    raise ValueError(f"a spec entry is null, an axis name or a list of axis names, not {v!r:.40}")


SpecEntry = Annotated[Any, PlainValidator(_spec_entry)]
Spec = list[SpecEntry]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class KeyModel(_Strict):
    fingerprint: str
    input_shapes: list[Shape]
    target: str


class AttentionModel(_Strict):
    batch: list[AxisName] = []
    heads: list[AxisName] = []
    seq: list[AxisName] = []
    kv: Literal["gather", "ring"] = "gather"
    block_q: Tile | None = None
    block_kv: Tile | None = None
    block_kv_compute: Tile | None = None
    block_q_dkv: Tile | None = None
    block_kv_dkv: Tile | None = None
    block_kv_dkv_compute: Tile | None = None
    block_q_dq: Tile | None = None
    block_kv_dq: Tile | None = None
    use_fused_bwd_kernel: bool | None = None


class LayoutModel(_Strict):
    name: str = ""
    mesh_axes: dict[AxisName, AxisSize] = Field(min_length=1)
    in_specs: list[Spec | None]
    out_specs: list[Spec | None] | None = None
    node_specs: dict[str, Spec] = {}
    attention: dict[str, AttentionModel] = {}
    rules: dict[str, list[AxisName]] = {}
    compiler_options: dict[Annotated[str, Field(pattern=r"^xla_\w+$")], OptionValue] = {}
    remat: dict[Annotated[str, Field(pattern=r"^\w+$")],
                Literal["keep", "recompute", "offload"]] | None = None
    reshard_from: dict[str, Spec] = {}


class LinkModel(_Strict):
    """A link's end is a chip's coordinates, or a switch's name on a switched network (e.g.
    ``pcie_sw0`` of a GPU box)."""
    src: list[Count] | Annotated[str, Field(min_length=1)] = Field(alias="from")
    dst: list[Count] | Annotated[str, Field(min_length=1)] = Field(alias="to")
    seconds: Seconds


class PredictedModel(_Strict):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    step_s: Seconds
    compute_s: Seconds
    communication_s: Seconds
    latency_s: Seconds | None = None
    link_time_s: Seconds | None = None
    default_order_step_s: Seconds | None = None
    q1_step_s: Seconds | None = None
    model: str = ""
    kind: str = ""
    links: list[LinkModel] = []


class CertificateModel(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
    solver: str
    status: Literal["OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN"]
    objective: float | None
    bound: float | None
    time_s: Seconds
    unit: str = "s"
    seed: int | None = None
    workers: int | None = None
    time_limit_s: Seconds | None = None
    detail: dict[str, Any] = {}
    gap: float | None = None


class ProgramModel(_Strict):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)
    pad_multiple: AxisSize | None = None


class PlanModel(_Strict):
    format: Literal["aoizora-plan/1"]
    key: KeyModel
    target: str
    mesh: dict[AxisName, AxisSize] | None = None
    device_order: list[Count]
    device_coords: list[list[Count]]
    layout: LayoutModel
    layout_in_words: list[str] = []
    predicted: PredictedModel
    certificates: dict[str, CertificateModel]
    iterations: list[dict[str, Any]] = []
    planning_time_s: Seconds = 0.0
    fits_hbm: bool | None = None
    hbm_bytes_per_device: Count | None = None
    status: str = ""
    notes: list[str] = []
    program: ProgramModel = ProgramModel()
    calibration: dict[str, Any] | None = None
    time_limited: list[str] = []
    compiler: dict[str, str] = {}
    compiles: dict[str, Any] = {}


# -- checking ------------------------------------------------------------------------------------
def field_path(loc: tuple) -> str:
    """pydantic's error location as a path: ('layout', 'in_specs', 3) -> layout.in_specs[3];
    a key that is not a Python name in brackets: ('layout', 'node_specs', '97.113') ->
    layout.node_specs['97.113'] (others, field or key, after a dot: layout.rules.seq)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).isidentifier():
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out or "(the plan)"


def validate_plan_json(d: Any, source: str | None = None) -> PlanModel:
    """Check a plan's JSON (see the module docstring); a PlanError naming the first bad field."""
    if not isinstance(d, dict):
        raise plan_error("(the plan)", f"a JSON object is expected, not a {type(d).__name__}",
                         source)
    bad = _non_finite(d)
    if bad is not None:
        loc, v = bad
        raise plan_error(field_path(loc), f"{v} is not a finite number (a plan holds finite "
                         f"numbers only)", source)
    if d.get("format") != PLAN_FORMAT:
        raise plan_error("format", f"{d.get('format')!r} is not an AoiZora plan "
                         f"(expected {PLAN_FORMAT!r})", source)
    try:
        m = PlanModel.model_validate(d)
    except ValidationError as e:
        err = e.errors()[0]
        what = err["msg"].removeprefix("Value error, ")     # a message of ours: says the value
        what = what[:1].lower() + what[1:]
        said = err["type"] in ("missing", "value_error")
        got = "" if said else f" (got {err.get('input')!r:.60})"
        raise plan_error(field_path(err["loc"]), what + got, source) from None
    tgt = _target(m, source)
    _check_mesh(m, tgt, source)
    _check_device_order(m.device_order, tgt, source)
    _check_device_coords(m.device_coords, tgt, source)
    _check_order_matches_coords(m.device_order, m.device_coords, tgt, source)
    _check_in_specs(m, source)
    for field, spec in _specs(m.layout):
        _check_axes(field, spec, m.layout.mesh_axes, source)
    _check_tiles(m.layout, source)
    _check_predicted_seconds(m.predicted, source)
    return m


def _non_finite(d: Any) -> tuple[tuple, float] | None:
    """(location, value) of the first NaN or infinity in ``d`` (parsed JSON), in file order, or
    None; iterative, so any nesting is safe."""
    todo: list[tuple[tuple, Any]] = [((), d)]
    while todo:
        loc, x = todo.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return loc, x
        if isinstance(x, dict):
            todo += [(loc + (k,), v) for k, v in reversed(list(x.items()))]
        elif isinstance(x, list):
            todo += [(loc + (i,), v) for i, v in reversed(list(enumerate(x)))]
    return None


def _target(m: PlanModel, source: str | None) -> Target:
    def get(field: str, name: str) -> Target:
        try:
            return get_target(name)
        except TargetError:
            raise plan_error(field, f"unknown target {name!r}, not a slice that aoizora "
                             f"targets lists (spelled e.g. v5e:2x4 or v5e-8)", source) from None

    tgt = get("target", m.target)
    key_tgt = get("key.target", m.key.target)
    if key_tgt.name != tgt.name:
        raise plan_error("key.target", f"{m.key.target!r} is not the plan's target "
                         f"{m.target!r}", source)
    return tgt


def _check_mesh(m: PlanModel, tgt: Target, source: str | None) -> None:
    axes = m.layout.mesh_axes
    n = math.prod(axes.values())
    if n != tgt.num_devices:
        raise plan_error("layout.mesh_axes", f"{axes} has {n} ranks but {tgt.name} has "
                         f"{tgt.num_devices} devices (the sizes must multiply to "
                         f"{tgt.num_devices})", source)
    if m.mesh is not None and list(m.mesh.items()) != list(axes.items()):
        raise plan_error("mesh", f"{m.mesh} is not the layout's mesh {axes} "
                         f"(layout.mesh_axes)", source)


def _check_device_order(order: list[int], tgt: Target, source: str | None) -> None:
    n = tgt.num_devices
    if len(order) != n:
        raise plan_error("device_order", f"{len(order)} entries for the {n} devices of "
                         f"{tgt.name} (a permutation of 0..{n - 1} is needed)", source)
    for i, d in enumerate(order):
        if d >= n:
            raise plan_error(f"device_order[{i}]", f"device {d} is not one of {tgt.name}'s "
                             f"devices 0..{n - 1}", source)
    dup = [d for d, k in Counter(order).items() if k > 1]
    if dup:
        raise plan_error("device_order", f"device {dup[0]} appears {Counter(order)[dup[0]]} "
                         f"times (a permutation of 0..{n - 1} is needed)", source)


def _check_device_coords(coords: list[list[int]], tgt: Target, source: str | None) -> None:
    n, shape = tgt.num_devices, tgt.shape
    if len(coords) != n:
        raise plan_error("device_coords", f"{len(coords)} entries for the {n} devices of "
                         f"{tgt.name}", source)
    for i, c in enumerate(coords):
        if len(c) != len(shape) or any(v >= s for v, s in zip(c, shape)):
            raise plan_error(f"device_coords[{i}]", f"{c} is not a chip of the "
                             f"{'x'.join(map(str, shape))} slice {tgt.name}", source)
    per_chip = tgt.chip.devices_per_chip
    for c, k in Counter(tuple(c) for c in coords).items():
        if k != per_chip:
            raise plan_error("device_coords", f"chip {list(c)} is given for {k} entries, "
                             f"{tgt.name} has {per_chip} device(s) per chip", source)


def _check_order_matches_coords(order: list[int], coords: list[list[int]], tgt: Target,
                                source: str | None) -> None:
    """``device_coords[i]`` must be the chip of device ``device_order[i]`` on the target (what
    ``check`` compiles, by ids, is then what ``Plan.make_mesh`` deploys, by coordinates). The
    chips come from libtpu's topology; without libtpu the check is skipped."""
    try:
        chip_of = tgt.device_coords()
    except LibtpuArgsError:
        raise
    except TargetError:
        return
    for i, (d, c) in enumerate(zip(order, coords)):
        if tuple(c) != tuple(chip_of[d]):
            raise plan_error(f"device_coords[{i}]", f"{list(c)} is not the chip of device "
                             f"{d} (device_order[{i}]), which is at {list(chip_of[d])} on "
                             f"{tgt.name}: the two fields disagree", source)


def _rank(shape: str) -> int:
    dims = re.fullmatch(r"\w+\[(.*)\]", shape).group(1)
    return len(dims.split(",")) if dims else 0


def _check_in_specs(m: PlanModel, source: str | None) -> None:
    shapes, specs = m.key.input_shapes, m.layout.in_specs
    if len(specs) != len(shapes):
        raise plan_error("layout.in_specs", f"{len(specs)} specs for the {len(shapes)} inputs "
                         f"of key.input_shapes", source)
    for i, (shape, spec) in enumerate(zip(shapes, specs)):
        if spec is not None and len(spec) != _rank(shape):
            raise plan_error(f"layout.in_specs[{i}]", f"{len(spec)} entries for the input "
                             f"{shape} of rank {_rank(shape)}", source)


def _specs(layout: LayoutModel):
    """(field, spec entries) of every spec, attention layout and rule in the layout."""
    for i, s in enumerate(layout.in_specs):
        yield f"layout.in_specs[{i}]", s or []
    for i, s in enumerate(layout.out_specs or []):
        yield f"layout.out_specs[{i}]", s or []
    for k, s in layout.node_specs.items():
        yield field_path(("layout", "node_specs", k)), s
    for k, s in layout.reshard_from.items():
        yield field_path(("layout", "reshard_from", k)), s
    for k, a in layout.attention.items():
        for part in ("batch", "heads", "seq"):
            yield field_path(("layout", "attention", k, part)), [getattr(a, part)]
    for k, r in layout.rules.items():
        yield field_path(("layout", "rules", k)), [r]


def _check_axes(field: str, spec: list, mesh: dict[str, int], source: str | None) -> None:
    used = [a for entry in spec if entry is not None
            for a in ([entry] if isinstance(entry, str) else entry)]
    for a in used:
        if a not in mesh:
            raise plan_error(field, f"axis {a!r} is not a mesh axis (layout.mesh_axes: "
                             f"{', '.join(mesh)})", source)
    twice = [a for a, k in Counter(used).items() if k > 1]
    if twice:
        raise plan_error(field, f"axis {twice[0]!r} is used more than once", source)


def _check_tiles(layout: LayoutModel, source: str | None) -> None:
    for k, a in layout.attention.items():
        bad = tile_problems(**{f: getattr(a, f) for f in ALL_TILE_FIELDS})
        if bad:
            raise plan_error(field_path(("layout", "attention", k)), bad[0], source)


def _check_predicted_seconds(pr: PredictedModel, source: str | None) -> None:
    for k, v in (pr.model_extra or {}).items():
        if k.endswith("_s") and v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float))
                or not math.isfinite(v) or v < 0):
            raise plan_error(f"predicted.{k}", f"{v!r:.40} is not a finite number of seconds "
                             f">= 0", source)
