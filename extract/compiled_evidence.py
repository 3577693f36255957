"""Evidence from a compiled program: the scheduled HLO read into `Evidence` (logical ids).

The walk starts at ENTRY and follows the schedule. A ``while`` body, a ``call`` and the branches
of a ``conditional`` are walked where they are called (inlined into one flattened schedule, so
positions are comparable across computations); a ``while`` multiplies the count of everything in
its body by its trip count, read from the loop condition (``compare(counter, constant)``, the
counter's start value from the loop's init tuple and its step from the body's increment) or from a
``known_trip_count`` in the loop's backend_config. Fused computations are searched for collectives
too, because XLA:TPU hides them there:

- ``collective(...)`` at top level: a sync collective; ``X-start`` / ``X-done`` and
  ``async-start`` / ``async-done``: an async collective from start to done (sync when XLA:GPU
  marks the start ``collective_backend_config.is_sync``); ``call-start`` / ``call-done`` of a
  computation holding one collective likewise (libtpu on TPU7x offloads collectives to the
  SparseCore so: ``async_execution_thread="sparsecore"``);
- a ``fusion`` whose computation ends in ``custom-call AsyncCollectiveStart`` /
  ``AsyncCollectiveDone``: the start / done of the collective inside (matched by ``channel_id``);
  fusions in between that contain the same channel (``async_collective_fusion``) are the compute
  it is fused with;
- a ``fusion`` calling ``all-reduce-scatter...``: an all-reduce followed by a dynamic slice, which
  is how the TPU compiler spells a reduce-scatter (kind ``reduce-scatter``).

Per collective: V bytes = the larger of its operand and result bytes (per device), logical replica
groups (all spellings, `replica_groups.py`), permute pairs, count (product of the trip counts
around it), async or not, its start..done window in the flattened schedule, the compute cycles
scheduled strictly inside that window (``overlap_cycles``, counted per run of the collective),
and metadata (op_name, file:line). Collectives whose windows intersect share a ``phase``
(connected runs of overlapping windows, numbered in schedule order); a sync collective is a
window of one position, so it has a phase of its own unless it runs inside an async window.

The compiler's ``collective_algorithm_config`` is the only device-order-dependent part: it is
moved into ``Evidence.algorithms`` (keyed by collective name) and appears nowhere else.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from typing import TYPE_CHECKING, Any, Iterable

from aoizora.extract.evidence import COLLECTIVE_KINDS, Collective, ComputeOp, Evidence, MemoryUse
from aoizora.extract.hlo import (Computation, HloModule, HloParseError, Instruction,
                                 parse_hlo_module)
from aoizora.extract.replica_groups import parse_replica_groups, parse_source_target_pairs

if TYPE_CHECKING:
    from aoizora.extract.targets import Target


class EvidenceError(ValueError):
    """The compiled program holds something the evidence reader cannot price (named)."""


SYNC_OPS = {
    "all-gather": "all-gather", "all-reduce": "all-reduce", "reduce-scatter": "reduce-scatter",
    "all-to-all": "all-to-all", "ragged-all-to-all": "all-to-all",
    "collective-permute": "collective-permute",
}
ASYNC_START = {k + "-start": v for k, v in SYNC_OPS.items()}
ASYNC_DONE = {k + "-done": v for k, v in SYNC_OPS.items()}
# Collective-like opcodes this reader does not price: a clear error instead of a silent zero.
# asynchronous wrappers: a start, its updates, its done
_GENERIC_ASYNC = ("async-start", "async-update", "async-done", "call-start", "call-update",
                  "call-done")
UNSUPPORTED = {"collective-broadcast", "send", "recv", "send-done", "recv-done"}
_PASS_THROUGH = {"copy", "bitcast", "convert", "reshape"}
# Bookkeeping custom calls of XLA:TPU that do no arithmetic.
_NO_COST_CALLS = {"AllocateBuffer", "ConcatBitcast", "AsyncCollectiveStart", "AsyncCollectiveDone",
                  "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost",
                  "MoveToDevice", "annotate_device_placement", "PrepareAsyncCallStart",
                  "PrepareAsyncCallDone"}


@dataclasses.dataclass
class _Open:
    coll: Collective
    instr: Instruction          # the collective instruction (sync spelling or -start)
    comp: Computation           # the computation holding `instr`
    outer: Instruction | None   # the fusion / async-start wrapping it, if any


# ---------------------------------------------------------------------------------------------
# Shapes -> bytes and flops


def _operand_bytes(ins: Instruction, comp: Computation) -> int:
    total = 0
    for o in ins.operands:
        src = comp.by_name.get(o)
        if src is None:
            raise EvidenceError(f"HLO line {ins.line_no}: operand %{o} of %{ins.name} not found "
                                f"in {comp.name}")
        total += src.shape.bytes
    return total


_SLICING = ("dynamic-slice", "slice", "gather")


def _parameter(comp: Computation, k: int) -> str:
    """The name of ``comp``'s parameter number ``k`` ("" if it has none)."""
    return next((i.name for i in comp.instructions
                 if i.opcode == "parameter" and i.operand_text.strip() == str(k)), "")


def _read_bytes(module: HloModule, comp: Computation, param: str, full: int,
                depth: int = 0) -> int:
    """Bytes a fused computation reads of its parameter ``param`` (``full`` bytes): the slices'
    when every use slices it (dynamic-slice, slice, gather: e.g. one layer's weights of a stack
    in a scanned loop), what a nested fusion reads of it, else all of it."""
    total = 0
    for u in comp.instructions:
        if param not in u.operands:
            continue
        if u.opcode in _SLICING and u.operands[0] == param:
            total += u.shape.bytes
        elif u.opcode == "fusion" and depth < 8 and u.called("calls"):
            inner = module.computation(u.called("calls")[0])
            total += sum(_read_bytes(module, inner, _parameter(inner, k), full, depth + 1)
                         for k, o in enumerate(u.operands) if o == param)
        else:
            return full
    return min(total, full) if total else full


def _fusion_bytes(module: HloModule, ins: Instruction, comp: Computation) -> int:
    """A fusion's HBM bytes from shapes: what it reads of each operand (``_read_bytes``) and its
    result; ``_operand_bytes`` + result where the fused computation is not at hand."""
    called = ins.called("calls")
    if not called:
        return _operand_bytes(ins, comp) + ins.shape.bytes
    fcomp = module.computation(called[0])
    total = ins.shape.bytes
    for k, o in enumerate(ins.operands):
        src = comp.by_name.get(o)
        if src is None:
            raise EvidenceError(f"HLO line {ins.line_no}: operand %{o} of %{ins.name} not found "
                                f"in {comp.name}")
        total += _read_bytes(module, fcomp, _parameter(fcomp, k), src.shape.bytes)
    return total


def _conv_flops(ins: Instruction, comp: Computation) -> float:
    """2 x output elements x contraction length, for dot and convolution."""
    if ins.opcode == "dot":
        lhs = comp.by_name[ins.operands[0]].shape
        cdims = [int(v) for v in re.findall(r"\d+", ins.attrs.get("lhs_contracting_dims", ""))]
        k = math.prod(lhs.dims[d] for d in cdims) if cdims else 1
        return 2.0 * ins.shape.elements * k
    if ins.opcode == "convolution":
        kernel = comp.by_name[ins.operands[1]].shape
        labels = ins.attrs.get("dim_labels", "")
        m = re.match(r"[^_]*_([^-]*)->", labels)
        if not m or "o" not in m.group(1):
            raise EvidenceError(f"HLO line {ins.line_no}: cannot read dim_labels {labels!r}")
        o_size = kernel.dims[m.group(1).index("o")]
        out = ins.shape.arrays()[0]
        return 2.0 * out.elements * kernel.elements / max(o_size, 1)
    return 0.0


# ---------------------------------------------------------------------------------------------
# Loops


def _resolve(comp: Computation, name: str) -> Instruction | None:
    ins = comp.by_name.get(name)
    while ins is not None and ins.opcode in _PASS_THROUGH and len(ins.operands) == 1:
        ins = comp.by_name.get(ins.operands[0])
    return ins


def _int_constant(ins: Instruction | None) -> int | None:
    if ins is None or ins.opcode != "constant":
        return None
    t = ins.operand_text.strip()
    return int(t) if re.fullmatch(r"-?\d+", t) else None


def _gte_index(ins: Instruction | None, comp: Computation) -> int | None:
    """Tuple index k when `ins` is get-tuple-element(parameter(0)), index=k."""
    if ins is None or ins.opcode != "get-tuple-element":
        return None
    src = comp.by_name.get(ins.operands[0])
    if src is None or src.opcode != "parameter":
        return None
    return int(ins.attrs.get("index", "-1"))


def _counter_step(body: Computation, name: str, k: int) -> int | None:
    """The counter's increment per iteration: a chain of add/subtract of constants from
    get-tuple-element(param, k) (an unrolled loop adds several times)."""
    step = 0
    ins = _resolve(body, name)
    for _ in range(64):
        if ins is None:
            return None
        if _gte_index(ins, body) == k:
            return step
        if ins.opcode not in ("add", "subtract") or len(ins.operands) != 2:
            return None
        x, c = (_resolve(body, o) for o in ins.operands)
        if _int_constant(c) is not None:
            step += _int_constant(c) * (1 if ins.opcode == "add" else -1)
            ins = x
        elif ins.opcode == "add" and _int_constant(x) is not None:
            step += _int_constant(x)
            ins = c
        else:
            return None
    return None


def while_trip_count(module: HloModule, loop: Instruction, comp: Computation) -> tuple[int | None, str]:
    """Trip count of a ``while``; (None, reason) when it cannot be read."""
    ktc = loop.backend_config.get("known_trip_count")
    if isinstance(ktc, dict) and str(ktc.get("n", "")).lstrip("-").isdigit():
        return int(ktc["n"]), ""
    conds = loop.called("condition")
    bodies = loop.called("body")
    if not conds or not bodies:
        return None, "while without condition/body"
    cond = module.computation(conds[0])
    body = module.computation(bodies[0])
    root = _resolve(cond, cond.root.name)
    if root is None or root.opcode != "compare" or len(root.operands) != 2:
        return None, f"condition {cond.name} is not compare(counter, constant)"
    direction = root.attrs.get("direction", "")
    a, b = (_resolve(cond, o) for o in root.operands)
    k, limit = _gte_index(a, cond), _int_constant(b)
    if k is None or limit is None:
        k, limit = _gte_index(b, cond), _int_constant(a)
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    if k is None or limit is None:
        return None, f"condition {cond.name} does not compare a loop counter with a constant"
    init_t = _resolve(comp, loop.operands[0]) if loop.operands else None
    if init_t is None or init_t.opcode != "tuple" or k >= len(init_t.operands):
        return None, f"the init of {loop.name} is not a tuple"
    init = _int_constant(_resolve(comp, init_t.operands[k]))
    broot = body.root
    if broot.opcode != "tuple" or k >= len(broot.operands):
        return None, f"body {body.name} does not return a tuple"
    step = _counter_step(body, broot.operands[k], k)
    if init is None or not step:
        return None, f"cannot read the start or step of the counter of {loop.name}"
    span = limit - init
    if direction == "LT":
        n = math.ceil(span / step) if step > 0 else None
    elif direction == "LE":
        n = math.floor(span / step) + 1 if step > 0 else None
    elif direction == "GT":
        n = math.ceil(-span / -step) if step < 0 else None
    elif direction == "GE":
        n = math.floor(-span / -step) + 1 if step < 0 else None
    elif direction == "NE":
        n = span // step if span % step == 0 and span // step >= 0 else None
    else:
        n = None
    if n is None:
        return None, f"loop {loop.name}: counter from {init} step {step} {direction} {limit} does not end"
    return max(int(n), 0), ""


# ---------------------------------------------------------------------------------------------
# The walk


_SHAPE = re.compile(r"\b(bf16|f16|f32|f8e4m3fn|f8e5m2)\[([0-9,]+)\]")


_TILE = {k: re.compile(r'"' + k + r'"\s*:\s*(\d+)')
         for k in ("block_q", "block_kv", "block_kv_compute", "block_q_dkv", "block_kv_dkv",
                   "block_kv_dkv_compute", "block_q_dq", "block_kv_dq")}
_ELEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f8e4m3fn": 1, "f8e5m2": 1}
# splash kernel kind (its op_name) -> (its metadata's tile keys, the uniform names they get)
_SPLASH_KINDS = {
    "splash_mha_fwd": ("fwd", ("block_q", "block_kv", "block_kv_compute")),
    "splash_mha_dkv": ("dkv", ("block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute")),
    "splash_mha_dq": ("dq", ("block_q_dq", "block_kv_dq")),
}


def _splash_kind(ins: Instruction) -> tuple[str, tuple[str, ...]] | None:
    label = ins.metadata.get("op_name", "") + " " + ins.name
    for marker in ("splash_mha_dkv", "splash_mha_dq", "splash_mha_fwd"):
        if marker in label:
            return _SPLASH_KINDS[marker]
    return _SPLASH_KINDS["splash_mha_fwd"] if "splash" in ins.name else None


def _splash_operands(ins: Instruction, kind: str):
    """(dtype, q dims, k dims, fused) of a splash kernel's operands, None if unreadable: forward
    q, k, v are its last three floating operands, a backward kernel's its first three; fused:
    a dk/dv kernel with a result one rank above q (it writes dq too)."""
    text = ins.attrs.get("operand_layout_constraints", "") or ins.operand_text
    shapes = [(dt, [int(v) for v in dims.split(",")]) for dt, dims in _SHAPE.findall(text)]
    shapes = [(dt, sh) for dt, sh in shapes if len(sh) >= 3]
    if len(shapes) < 3:
        return None
    qi, ki = (-3, -2) if kind == "fwd" else (0, 1)
    (dt, q), (_, k) = shapes[qi], shapes[ki]
    results = ins.shape.tuple_shapes if ins.shape.is_tuple else (ins.shape,)
    fused = kind == "dkv" and any(len(r.dims) == len(q) + 1 for r in results)
    return dt, q, k, fused


def splash_kernel_info(ins: Instruction) -> dict[str, int]:
    """A splash kernel's kind, tiles and per-shard shapes, {} for any other kernel: ``kind``
    "fwd" | "dq" | "dkv" (from its op_name), block_q / block_kv (/ block_kv_compute) from the
    kernel's own ``kernel_metadata`` (``xprof_metadata`` in its frontend_attributes; the
    backward kernels' block_q_dq ... block_kv_dkv_compute under these uniform names), ``fused``
    (1 when the dk/dv kernel also writes dq: a result one rank above q), lead (product of q's
    leading dims: batch x heads), lq, lkv (query / key lengths as the kernel sees them: padded),
    head_dim, dtype_bytes from its q and k operands."""
    got = _splash_kind(ins)
    if got is None:
        return {}
    kind, keys = got
    meta = ins.attrs.get("frontend_attributes", "").replace('\\"', '"')
    raw = {k: int(m.group(1)) for k in keys if (m := _TILE[k].search(meta))}
    ops = _splash_operands(ins, kind)
    if len(raw) < len(keys) or ops is None:
        return {}
    dt, q, k, fused = ops
    tiles = dict(zip(("block_q", "block_kv", "block_kv_compute"), (raw[k] for k in keys)))
    out = {"kind": kind, **tiles, "lead": int(math.prod(q[:-2])), "lq": q[-2], "lkv": k[-2],
           "head_dim": q[-1], "dtype_bytes": _ELEM_BYTES[dt]}
    if kind == "dkv":
        out["fused"] = int(fused)
    return out


# FLOPs per (lead x Lq x Lkv x D) of each splash kernel: 2 per multiply-add of its matmuls
# (forward: q k^T, p v; dq: q k^T, do v^T, ds k; dk/dv: k q^T, p^T do, v do^T, ds^T q, + ds k fused)
_SPLASH_FLOPS = {"fwd": 4, "dq": 6, "dkv": 8}


def attention_kernel_flops(ins: Instruction) -> float:
    """FLOPs of a Pallas splash-attention kernel (forward, dq or dk/dv), which the compiler does
    not estimate: ``_SPLASH_FLOPS[kind] * lead * Sq * Skv * d`` from its q and k operands
    ([..., heads, S, d]; a fused dk/dv kernel 10). 0 for any other kernel."""
    got = _splash_kind(ins)
    if got is None:
        return 0.0
    ops = _splash_operands(ins, got[0])
    if ops is None:
        return 0.0
    _, q, k, fused = ops
    return (_SPLASH_FLOPS[got[0]] + 2 * fused) * math.prod(q[:-2]) * q[-2] * k[-2] * q[-1]


def _cost_estimate(ins: Instruction) -> dict:
    """A kernel's own cost estimate (flops, bytes_accessed) from its backend config, if any."""
    cfg = ins.backend_config
    ccc = cfg.get("custom_call_config") if isinstance(cfg.get("custom_call_config"), dict) else {}
    return cfg.get("cost_estimate") or ccc.get("cost_estimate") or {}


def _kernel_flops(ins: Instruction) -> float:
    """FLOPs of a custom-call kernel: the splash attention count (the backward kernels' own cost
    estimates count a fraction of their matmuls), else its own cost estimate."""
    return attention_kernel_flops(ins) or float(_cost_estimate(ins).get("flops", 0) or 0)


def _marked_sync(ins: Instruction) -> bool:
    """XLA:GPU spells every collective as a start / done pair and marks the ones it runs
    synchronously (nothing scheduled in between overlaps them) ``collective_backend_config``
    ``is_sync: true``; those are sync collectives."""
    cfg = ins.backend_config if isinstance(ins.backend_config, dict) else {}
    cbc = cfg.get("collective_backend_config")
    return isinstance(cbc, dict) and cbc.get("is_sync") in (True, "true")


# Ops that only move data, kept without a cycle estimate when ``data_movement`` is asked
# (``evidence_from_hlo_module``): priced by their bytes, read and written
DATA_MOVEMENT = ("copy", "transpose", "reduce", "broadcast", "pad", "concatenate", "slice",
                 "dynamic-slice", "dynamic-update-slice", "convert", "select", "reverse")


class _Walker:
    def __init__(self, module: HloModule, num_devices: int, data_movement: bool = False):
        self.m = module
        self.n = num_devices
        self.data_movement = data_movement
        self.pos = 0
        self.collectives: list[Collective] = []
        self.compute: list[ComputeOp] = []
        self.algorithms: dict[str, dict[str, Any]] = {}
        self.warnings: list[str] = list(module.warnings)
        self.pending: dict[Any, _Open] = {}
        self._coll_cache: dict[str, list[tuple[Instruction, Computation]]] = {}
        self._fused_cache: dict[str, tuple[float, float]] = {}   # (flops, kernel bytes)

    # -- helpers
    def _collectives_in(self, comp_name: str) -> list[tuple[Instruction, Computation]]:
        """Collective instructions in a fused computation and the fusions nested in it."""
        if comp_name not in self._coll_cache:
            comp = self.m.computation(comp_name)
            out: list[tuple[Instruction, Computation]] = []
            for ins in comp.instructions:
                if ins.opcode in SYNC_OPS or ins.opcode in ASYNC_START:
                    out.append((ins, comp))
                elif ins.opcode in UNSUPPORTED:
                    raise EvidenceError(f"HLO line {ins.line_no}: {ins.opcode} (%{ins.name}) is not "
                                        f"supported by the evidence reader")
                if ins.opcode == "fusion":
                    for c in ins.called("calls"):
                        out.extend(self._collectives_in(c))
            self._coll_cache[comp_name] = out
        return self._coll_cache[comp_name]

    def _fused_cost(self, comp_name: str) -> tuple[float, float]:
        """(FLOPs, kernel HBM bytes) of a fused computation, nested fusions included. FLOPs: its
        dots and convolutions and the kernels fused into it (libtpu fuses a Pallas kernel with a
        collective into an async collective fusion when
        ``xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call`` is set; such a fusion
        carries no cycle estimate, so the kernel must be counted here). Kernel bytes: each fused
        kernel's own estimate, else its operands and results; 0 when no kernel is fused."""
        if comp_name not in self._fused_cache:
            comp = self.m.computation(comp_name)
            f = by = 0.0
            for ins in comp.instructions:
                f += _conv_flops(ins, comp)
                if ins.opcode == "fusion":
                    for c in ins.called("calls"):
                        cf, cb = self._fused_cost(c)
                        f, by = f + cf, by + cb
                elif ins.opcode == "custom-call":
                    kf = _kernel_flops(ins)
                    if kf:
                        est = _cost_estimate(ins).get("bytes_accessed")
                        f += kf
                        by += float(est) if est else float(_operand_bytes(ins, comp)
                                                           + ins.shape.bytes)
            self._fused_cache[comp_name] = (f, by)
        return self._fused_cache[comp_name]

    def _fused_flops(self, comp_name: str) -> float:
        return self._fused_cost(comp_name)[0]

    def _new_collective(self, name: str, kind: str, ins: Instruction, comp: Computation,
                        outer: Instruction | None, count: int, is_async: bool,
                        home: Computation, out_shape: Any = None) -> Collective:
        """A Collective from instruction `ins` (in `comp`); `outer` wraps it, `home` schedules it."""
        in_b = _operand_bytes(ins, comp)
        out = ins.shape if out_shape is None else out_shape
        out_bytes = out.bytes
        arrays = out.arrays()
        dtype = arrays[-1].dtype if arrays else ""
        if kind == "collective-permute":
            pairs = parse_source_target_pairs(ins.attrs.get("source_target_pairs", "{}"), self.n)
            ids = sorted({i for p in pairs for i in p})
            groups = [ids]
        else:
            pairs = None
            groups = parse_replica_groups(ins.attrs.get("replica_groups"), self.n)
        md = ins.metadata
        src_ins = ins
        if not md.get("op_name") and outer is not None:
            md, src_ins = outer.metadata, outer
        coll = Collective(name=name, kind=kind, dtype=dtype, bytes=int(max(in_b, out_bytes)),
                          replica_groups=groups, source_target_pairs=pairs, count=count,
                          is_async=is_async, computation=home.name,
                          op_name=md.get("op_name", ""), source=self.m.source(src_ins))
        for carrier in (ins, outer):
            if carrier is not None and carrier.backend_config is not None \
                    and carrier.backend_config_unreadable:
                self._note(f"HLO line {carrier.line_no}: the backend_config of {carrier.name} is "
                           f"not JSON; its algorithm choice is unknown")
        cfg = None
        for carrier in (ins, outer):
            if carrier is not None and "collective_algorithm_config" in carrier.backend_config:
                cfg = carrier.backend_config["collective_algorithm_config"]
                break
        if cfg is not None:
            self.algorithms[name] = cfg
        return coll

    def _open(self, key: Any, op: _Open) -> None:
        if key in self.pending:
            raise EvidenceError(f"HLO: collective {key} started twice without a done "
                                f"({op.coll.name})")
        op.coll.start_index = self.pos
        self.pending[key] = op

    def _close(self, key: Any, done: Instruction) -> None:
        op = self.pending.pop(key, None)
        if op is None:
            raise EvidenceError(f"HLO line {done.line_no}: %{done.name} finishes a collective "
                                f"that was never started ({key})")
        op.coll.done_index = self.pos
        self.collectives.append(op.coll)

    def _add_compute(self, ins: Instruction, comp: Computation, count: int,
                     flops: float = 0.0) -> None:
        cyc = ins.estimated_cycles
        if ins.backend_config_unreadable:
            self._note(f"HLO line {ins.line_no}: the backend_config of {ins.name} is not JSON; its "
                       f"cycle estimate is unknown")
        by = 0.0
        if cyc is None:
            # a fusion holding a kernel and a collective: the kernel's bytes, not the fusion's
            # operands (they include the collective's buffers, moved over ICI, not by the kernel)
            kb = (sum(self._fused_cost(c)[1] for c in ins.called("calls"))
                  if ins.opcode == "fusion" else 0.0)
            by = kb or float(_fusion_bytes(self.m, ins, comp) if ins.opcode == "fusion"
                             else _operand_bytes(ins, comp) + ins.shape.bytes)
        self.compute.append(ComputeOp(
            name=ins.name, kind=ins.opcode, estimated_cycles=cyc,
            flops=float(flops) if cyc is None else 0.0, bytes=by, count=count,
            computation=comp.name, op_name=ins.metadata.get("op_name", ""),
            custom_call_target=ins.custom_call_target, index=self.pos))

    # -- the walk
    def walk(self, comp_name: str, count: int, stack: tuple[str, ...] = ()) -> None:
        if comp_name in stack:
            raise EvidenceError(f"HLO: computation {comp_name} calls itself")
        comp = self.m.computation(comp_name)
        stack = stack + (comp_name,)
        for ins in comp.instructions:
            self.pos += 1
            op = ins.opcode
            if op == "while":
                trip, why = while_trip_count(self.m, ins, comp)
                if trip is None:
                    self.warnings.append(f"while {ins.name}: trip count unknown ({why}); its body "
                                         f"is counted once")
                    trip = 1
                for c in ins.called("condition"):
                    self.walk(c, count * (trip + 1), stack)
                for c in ins.called("body"):
                    self.walk(c, count * trip, stack)
            elif op == "call":
                for c in ins.called("to_apply") or ins.called("calls"):
                    self.walk(c, count, stack)
            elif op == "conditional":
                branches = ins.called("branch_computations") or (
                    ins.called("true_computation") + ins.called("false_computation"))
                self.warnings.append(f"conditional {ins.name}: all {len(branches)} branches are "
                                     f"counted as if each ran")
                for c in branches:
                    self.walk(c, count, stack)
            elif op in SYNC_OPS:
                coll = self._new_collective(ins.name, SYNC_OPS[op], ins, comp, None, count,
                                            False, comp)
                coll.start_index = coll.done_index = self.pos
                self.collectives.append(coll)
            elif op in ASYNC_START:
                placeholder = Collective(name=ins.name, kind=ASYNC_START[op], dtype="", bytes=0,
                                         replica_groups=[], count=count, is_async=True,
                                         computation=comp.name)
                self._open(ins.name, _Open(placeholder, ins, comp, None))
            elif op in ASYNC_DONE:
                start = ins.operands[0] if ins.operands else ""
                op_ = self.pending.get(start)
                if op_ is None:
                    raise EvidenceError(f"HLO line {ins.line_no}: %{ins.name} has no matching start")
                coll = self._new_collective(start, ASYNC_DONE[op], op_.instr, op_.comp, None,
                                            op_.coll.count, not _marked_sync(op_.instr), op_.comp,
                                            out_shape=ins.shape)
                coll.start_index = op_.coll.start_index
                op_.coll = coll
                self._close(start, ins)
            elif op in _GENERIC_ASYNC:
                self._generic_async(ins, comp, count)
            elif op == "fusion":
                self._fusion(ins, comp, count)
            elif op in UNSUPPORTED:
                raise EvidenceError(f"HLO line {ins.line_no}: {op} (%{ins.name}) is not supported by "
                                    f"the evidence reader")
            elif op == "custom-call":
                self._custom_call(ins, comp, count)
            elif op in ("convolution", "dot"):
                self._add_compute(ins, comp, count, _conv_flops(ins, comp))
            elif ins.estimated_cycles is not None or (self.data_movement
                                                      and op in DATA_MOVEMENT):
                self._add_compute(ins, comp, count)

    def _custom_call(self, ins: Instruction, comp: Computation, count: int) -> None:
        """A kernel (e.g. Pallas): cycles or the kernel's own cost estimate, else bytes only."""
        cfg = ins.backend_config
        ccc = cfg.get("custom_call_config") if isinstance(cfg.get("custom_call_config"), dict) else {}
        est = _cost_estimate(ins)
        flops = _kernel_flops(ins)
        self._add_compute(ins, comp, count, flops)
        op = self.compute[-1]
        op.kernel = splash_kernel_info(ins)
        if est.get("bytes_accessed"):
            op.bytes = float(est["bytes_accessed"])
        target = ins.custom_call_target
        if op.estimated_cycles is None and not est and not flops and target not in _NO_COST_CALLS:
            self._note(f"custom-call {target} ({ins.name}, x{count}): the compiler gives no cycle "
                       f"or flop estimate; only its operand/result bytes are recorded")
        if ccc.get("has_communication") in (True, "true"):
            self._note(f"custom-call {target} ({ins.name}) communicates inside the kernel; that "
                       f"traffic is not in the collectives")

    def _note(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    def _generic_async(self, ins: Instruction, comp: Computation, count: int) -> None:
        """``async-start`` / ``-update`` / ``-done``, and the asynchronous calls ``call-start`` /
        ``-update`` / ``-done`` (libtpu on TPU7x runs a collective offloaded to the SparseCore
        as one: ``call-start(...), async_execution_thread="sparsecore", to_apply=%comp`` whose
        computation holds the collective). One wrapping a collective is that collective, async
        from start to done; one wrapping other work is compute."""
        op = ins.opcode
        if op in ("async-start", "call-start"):
            called = ins.called("calls") or ins.called("to_apply")
            inner = [c for name in called for c in self._collectives_in(name)]
            if not inner:
                self._add_compute(ins, comp, count)
                return
            if len(inner) != 1:
                raise EvidenceError(f"HLO line {ins.line_no}: async-start %{ins.name} wraps "
                                    f"{len(inner)} collectives")
            c_ins, c_comp = inner[0]
            kind = SYNC_OPS.get(c_ins.opcode)
            if kind is None:
                raise EvidenceError(f"HLO line {ins.line_no}: async-start wraps {c_ins.opcode}")
            coll = self._new_collective(ins.name, kind, c_ins, c_comp, ins, count, True, comp)
            self._open(ins.name, _Open(coll, c_ins, c_comp, ins))
        else:
            start = ins.operands[0] if ins.operands else ""
            if start not in self.pending:
                return  # an async wrapper of non-collective work
            if op in ("async-update", "call-update"):
                self.pending[ins.name] = self.pending.pop(start)
            else:
                self._close(start, ins)

    def _fusion(self, ins: Instruction, comp: Computation, count: int) -> None:
        called = ins.called("calls")
        inner = [c for name in called for c in self._collectives_in(name)]
        if not inner:
            flops = sum(self._fused_flops(c) for c in called)
            self._add_compute(ins, comp, count, flops)
            return
        fcomp = self.m.computation(called[0])
        root = fcomp.root
        target = root.custom_call_target if root.opcode == "custom-call" else ""
        chans = {}
        for c_ins, c_comp in inner:
            ch = c_ins.attrs.get("channel_id")
            key = ("channel", ch) if ch is not None else ("instr", c_ins.name)
            chans[key] = (c_ins, c_comp)
        if target == "AsyncCollectiveStart":
            for key, (c_ins, c_comp) in chans.items():
                kind = self._kind(c_ins, fcomp, ins)
                coll = self._new_collective(ins.name if len(chans) == 1 else c_ins.name, kind,
                                            c_ins, c_comp, ins, count, True, comp)
                self._open(key, _Open(coll, c_ins, c_comp, ins))
            return
        if target == "AsyncCollectiveDone":
            for key in chans:
                self._close(key, ins)
            return
        # A collective inside an ordinary fusion: fused with compute (async collective fusion),
        # or a collective spelled as a fusion (all-reduce-scatter).
        for key, (c_ins, c_comp) in chans.items():
            if key in self.pending:
                self.pending[key].coll.fused_with.append(ins.name)
                continue
            kind = self._kind(c_ins, fcomp, ins)
            is_async = "async_collective_fusion_config" in c_ins.backend_config
            name = ins.name if len(chans) == 1 else c_ins.name
            coll = self._new_collective(name, kind, c_ins, c_comp, ins, count, is_async, comp)
            coll.start_index = coll.done_index = self.pos
            if is_async:
                coll.fused_with.append(ins.name)
                if ins.estimated_cycles is not None:
                    coll.overlap_cycles = ins.estimated_cycles
            self.collectives.append(coll)
        if ins.estimated_cycles is not None or any(self._fused_flops(c) for c in called):
            self._add_compute(ins, comp, count, sum(self._fused_flops(c) for c in called))

    @staticmethod
    def _kind(c_ins: Instruction, fcomp: Computation, outer: Instruction) -> str:
        kind = SYNC_OPS.get(c_ins.opcode) or ASYNC_START.get(c_ins.opcode)
        if kind is None:
            raise EvidenceError(f"HLO line {c_ins.line_no}: unknown collective {c_ins.opcode}")
        emitter = str(outer.backend_config.get("collective_algorithm_config", {}).get("emitter", ""))
        if kind == "all-reduce" and (fcomp.name.startswith("all-reduce-scatter")
                                     or "ReduceScatter" in emitter):
            return "reduce-scatter"
        return kind


def _assign_phases(colls: list[Collective]) -> None:
    order = sorted(range(len(colls)), key=lambda i: (colls[i].start_index, colls[i].done_index))
    phase = -1
    end = -1
    for i in order:
        c = colls[i]
        if c.start_index > end:
            phase += 1
            end = c.done_index
        else:
            end = max(end, c.done_index)
        c.phase = phase


def _assign_overlap(colls: list[Collective], compute: list[ComputeOp]) -> None:
    ops = sorted(compute, key=lambda c: c.index)
    idx = [c.index for c in ops]
    for c in colls:
        if c.done_index <= c.start_index + 1:
            continue
        lo = bisect.bisect_right(idx, c.start_index)
        hi = bisect.bisect_left(idx, c.done_index)
        tot = 0.0
        for op in ops[lo:hi]:
            if op.estimated_cycles is not None:
                tot += op.estimated_cycles * op.count / max(c.count, 1)
        c.overlap_cycles = tot


def evidence_from_hlo_module(module: HloModule, *, target: str, mesh_axes: dict[str, int],
                             device_order: Iterable[int] = (), clock_hz: float = 0.0,
                             fidelity: str = "tpu", generation: str = "",
                             data_movement: bool = False) -> Evidence:
    """Evidence (collectives, compute, schedule) from a parsed HLO module.

    ``data_movement``: also keep the ops that only move data (``DATA_MOVEMENT``: copies,
    transposes, reduces, ...) that carry no cycle estimate, with their operand and result bytes:
    for a module read before the backend (``extract.early_evidence``), where no op has cycles and
    these would otherwise be missing (a full compile's evidence keeps them by their cycles).

    Memory, cost analysis and compile time are left for the caller (see `evidence_from_compiled`)."""
    n = math.prod(mesh_axes.values()) if mesh_axes else module.num_partitions * module.replica_count
    if module.num_partitions * module.replica_count != n:
        raise EvidenceError(f"HLO module {module.name} runs on {module.num_partitions} partitions x "
                            f"{module.replica_count} replicas but the mesh has {n} devices")
    w = _Walker(module, n, data_movement)
    w.walk(module.entry, 1)
    if w.pending:
        raise EvidenceError(f"HLO: collectives started but never finished: {sorted(map(str, w.pending))}")
    colls = sorted(w.collectives, key=lambda c: (c.start_index, c.name))
    unknown = {c.kind for c in colls} - set(COLLECTIVE_KINDS)
    if unknown:
        raise EvidenceError(f"HLO: unknown collective kinds {sorted(unknown)}")
    _assign_phases(colls)
    _assign_overlap(colls, w.compute)
    return Evidence(target=target, mesh_axes=dict(mesh_axes), generation=generation,
                    fidelity=fidelity, collectives=colls, compute=w.compute, clock_hz=clock_hz,
                    algorithms=w.algorithms, algorithms_device_order=list(device_order),
                    warnings=w.warnings)


def evidence_from_hlo_text(text: str, **kw: Any) -> Evidence:
    """`evidence_from_hlo_module` on HLO text."""
    return evidence_from_hlo_module(parse_hlo_module(text), **kw)


# ---------------------------------------------------------------------------------------------
# From a jax Compiled object


def _cost(compiled: Any) -> tuple[float, float, float | None]:
    try:
        ca = compiled.cost_analysis()
    except Exception:  # some backends have no cost analysis
        return 0.0, 0.0, None
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else {}
    ca = ca or {}
    opt = ca.get("optimal_seconds")
    opt = float(opt) if opt is not None and float(opt) >= 0 else None
    return float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0)), opt


def memory_use(compiled: Any, hbm_bytes: int) -> MemoryUse:
    """`compiled.memory_analysis()` per device against the device's HBM (bytes)."""
    ma = compiled.memory_analysis()
    mu = MemoryUse(argument_bytes=int(ma.argument_size_in_bytes),
                   output_bytes=int(ma.output_size_in_bytes),
                   temp_bytes=int(ma.temp_size_in_bytes),
                   alias_bytes=int(ma.alias_size_in_bytes),
                   generated_code_bytes=int(ma.generated_code_size_in_bytes),
                   hbm_bytes=int(hbm_bytes))
    mu.fits = mu.total_bytes <= hbm_bytes
    return mu


def compiled_device_order(compiled: Any, mesh: Any = None) -> list[int]:
    """Physical device ids per logical rank of a compiled program."""
    try:
        leaves = [s for s in _flatten(compiled.input_shardings) if hasattr(s, "_device_assignment")]
        if leaves:
            return [int(d.id) for d in leaves[0]._device_assignment]
    except Exception:
        pass
    if mesh is not None:
        return [int(d.id) for d in mesh.devices.flat]
    return []


def _flatten(x: Any) -> list:
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in _flatten(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flatten(v)]
    return [x]


def evidence_from_compiled(compiled: Any, *, target: "Target", mesh: Any, compile_s: float = 0.0,
                           fidelity: str | None = None, hlo_text: str | None = None) -> Evidence:
    """Evidence of a `jax.stages.Compiled` for `target` (a resolved ``Target``: the caller
    resolves a name with ``targets.get_target``), compiled on `mesh`.
    ``hlo_text``: ``compiled.as_text()`` when the caller already has it (read once)."""
    tgt = target
    platform = str(getattr(next(iter(mesh.devices.flat)), "platform", "tpu"))
    if fidelity is None:
        fidelity = platform if platform in ("tpu", "gpu") else "cpu-low"
    module = parse_hlo_module(hlo_text if hlo_text is not None else compiled.as_text())
    order = compiled_device_order(compiled, mesh)
    ev = evidence_from_hlo_module(module, target=tgt.name, mesh_axes=dict(mesh.shape),
                                  device_order=order, clock_hz=tgt.chip.clock_hz,
                                  fidelity=fidelity, generation=tgt.generation)
    hbm = tgt.chip.device_hbm_bytes
    ev.memory = memory_use(compiled, hbm)
    ev.flops, ev.bytes_accessed, ev.optimal_seconds = _cost(compiled)
    ev.compile_s = float(compile_s)
    if fidelity == "cpu-low":
        ev.warnings.append(f"low fidelity: compiled on the {platform} backend, not XLA:TPU "
                           f"(no async collectives, no cycle estimates)")
    return ev


__all__ = ["EvidenceError", "HloParseError", "evidence_from_compiled", "evidence_from_hlo_module",
           "evidence_from_hlo_text", "memory_use", "while_trip_count", "compiled_device_order"]
