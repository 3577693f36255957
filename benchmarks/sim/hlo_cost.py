"""The simulator's own price of every compute op of a compiled program (not the compiler's).

For each instruction of the scheduled HLO that runs on the TensorCore (fusions, convolutions,
dots, copies and transposes, kernels), seconds on one chip (``benchmarks.sim.constants``):

- XLA ops (a fusion, or a lone convolution / dot / copy): ``OP_LAUNCH_S + max(t_mxu, t_hbm,
  t_vpu, t_eup)`` (the compiler pipelines HBM copies, MXU and VPU work inside one op):
  t_mxu: each convolution / dot as (m x k) @ (k x n) with k and n padded to the MXU width and
  m to 8 (``kernel_model.matmul_flops``), over ``XLA_MXU_EFFICIENCY`` of the peak (fitted on one
  published matmul, ``constants``; a convolution's k is its input features times, per
  spatial dim, the window taps that meet real input: min(window, input x window / output),
  which prices XLA:TPU's batch-as-padded-spatial spelling of batched matmuls right), over the
  chip's peak; t_hbm: the bytes of the op's operands and result over HBM
  bandwidth, where an operand only sliced inside the fusion counts its slices, a result written
  by a dynamic-update-slice counts the update (also one output of a multi-output fusion: a
  scan's residual stacked into its [layers, ...] buffer writes one layer's slice in place), and
  the buffers of a collective fused in (an
  async collective fusion) count nothing (they move over ICI); t_vpu / t_eup:
  the elements of every other fused instruction (transcendentals on the EUP), as f32.
- Any other top-level instruction (copy, transpose, reduce, sort ...): its operand and result
  bytes over HBM bandwidth, plus ``OP_LAUNCH_S``.
- Pallas kernels (``tpu_custom_call``): splash attention forward kernels by
  ``kernel_model.splash_time_s`` with the shapes, block sizes (the kernel's ``xprof_metadata``)
  and mask density (visited kv blocks per q row in its grid) of the call; every other kernel by
  its grid, blocks and per-step work read from its Mosaic module (``benchmarks.sim.mosaic``,
  ``kernel_model.kernel_time``). A splash backward kernel (``splash_mha_dkv``, ``splash_mha_dq``)
  whose grid walks more blocks than its mask keeps (the fused dk/dv kernel of
  ``use_fused_bwd_kernel``: every (kv block, q block) pair) runs its gated compute (the
  ``scf.if`` holding its matmuls) on ``run = min(1, density x full / grid[-1])`` of its steps,
  density the mask density of the splash forward kernel of the same q shape and block sizes
  (its shrunk grid: visited kv blocks per q row over all), full the blocks along the grid's
  last axis; a window whose index map reads the prefetched block table is copied at most once
  per running step (``kernel_model.gated_kernel_time``). Without such a forward, every step
  counts as running (noted).
Units: seconds.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from benchmarks.sim.constants import OP_LAUNCH_S, XLA_MXU_EFFICIENCY, ChipModel
from benchmarks.sim.kernel_model import (StepWork, gated_kernel_time, kernel_time, matmul_flops,
                                         splash_time_s)
from benchmarks.sim.mosaic import MosaicError, parse_kernel

_FREE = {"parameter", "constant", "bitcast", "reshape", "tuple", "get-tuple-element", "broadcast",
         "slice", "dynamic-slice", "iota", "copy-start", "copy-done", "after-all", "partition-id",
         "replica-id", "bitcast-convert", "dynamic-update-slice", "concatenate", "pad", "transpose",
         "copy", "reverse", "gather", "scatter"}
_EUP = {"exponential", "log", "tanh", "rsqrt", "sqrt", "power", "divide", "logistic", "erf",
        "exponential-minus-one", "log-plus-one", "sine", "cosine", "cbrt"}
_SLICERS = {"dynamic-slice", "slice", "gather"}
# Top-level instructions that are not TensorCore work of their own: control flow, data movement
# between computations, collectives (priced on the network), bookkeeping.
_NOT_COMPUTE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call",
                "conditional", "after-all", "partition-id", "replica-id", "all-gather",
                "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                "ragged-all-to-all", "send", "recv", "opt-barrier", "add-dependency", "domain"}
_NO_COST_CALLS = {"AllocateBuffer", "ConcatBitcast", "AsyncCollectiveStart", "AsyncCollectiveDone",
                  "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "MoveToHost",
                  "MoveToDevice", "annotate_device_placement",
                  # TPU7x: the bookkeeping around a call offloaded to the SparseCore
                  "PrepareAsyncCallStart", "PrepareAsyncCallDone"}


def _mnk(ins: Any, comp: Any) -> tuple[int, int, int]:
    """(m, k, n) of a dot or convolution (batch dims folded into m)."""
    out = ins.shape.arrays()[0]
    if ins.opcode == "dot":
        lhs = comp.by_name[ins.operands[0]].shape
        rhs = comp.by_name[ins.operands[1]].shape
        lc = [int(v) for v in re.findall(r"\d+", ins.attrs.get("lhs_contracting_dims", ""))]
        rb = [int(v) for v in re.findall(r"\d+", ins.attrs.get("rhs_batch_dims", ""))]
        rc = [int(v) for v in re.findall(r"\d+", ins.attrs.get("rhs_contracting_dims", ""))]
        k = math.prod(lhs.dims[d] for d in lc) if lc else 1
        n = math.prod(v for i, v in enumerate(rhs.dims) if i not in rb and i not in rc) or 1
        return max(1, out.elements // n), k, n
    lhs = comp.by_name[ins.operands[0]].shape
    kernel = comp.by_name[ins.operands[1]].shape
    m = re.match(r"([^_]*)_([^-]*)->(.*)", ins.attrs.get("dim_labels", ""))
    if not m or len(m.group(2)) != len(kernel.dims) or "o" not in m.group(2):
        return max(1, out.elements), 1, 1
    ll, kl, ol = m.groups()
    n = kernel.dims[kl.index("o")]
    k = float(kernel.dims[kl.index("i")]) if "i" in kl else 1.0
    for d in kl:
        if d.isdigit():          # a spatial dim: real (input, tap) pairs per output position
            win = kernel.dims[kl.index(d)]
            size_in = lhs.dims[ll.index(d)] if d in ll else win
            size_out = out.dims[ol.index(d)] if d in ol else 1
            k *= min(win, size_in * win / max(size_out, 1))
    return max(1, out.elements // max(n, 1)), max(1, round(k)), n


_COLLECTIVE_OPS = {"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
                   "all-gather-start", "all-reduce-start", "collective-permute-start",
                   "all-to-all-start", "ragged-all-to-all"}


def _param_bytes(fcomp: Any, index: int, full: int, module: Any = None, depth: int = 0) -> int:
    """Bytes a fusion reads of its parameter ``index``: its slices if it is only sliced (also
    inside a nested fusion); none if it only feeds a collective fused in (moved over ICI, priced
    on the network) or passes through to the output; else all of it."""
    p = next((i for i in fcomp.instructions if i.opcode == "parameter"
              and i.operand_text.strip() == str(index)), None)
    if p is None:
        return full
    users = [i for i in fcomp.instructions if p.name in i.operands]
    if not users:
        return 0
    total = 0
    for u in users:
        if u.opcode in _COLLECTIVE_OPS or u.opcode == "tuple":
            continue
        if u.opcode in _SLICERS:
            total += u.shape.bytes
        elif u.opcode == "dynamic-update-slice" and u.operands[0] == p.name:
            continue
        elif u.opcode == "fusion" and module is not None and depth < 4 and u.called("calls"):
            inner = module.computation(u.called("calls")[0])
            total += sum(_param_bytes(inner, j, full, module, depth + 1)
                         for j, o in enumerate(u.operands) if o == p.name)
        else:
            return full
    return min(total, full)


class HloCoster:
    """Seconds per compute instruction of one HLO module on one chip (module docstring)."""

    def __init__(self, module: Any, chip: ChipModel):
        self.m = module
        self.chip = chip
        self.notes: list[str] = []
        self._fused: dict[str, tuple[float, float, float]] = {}
        self._fwd_splash: list[tuple[tuple, int, int, float]] | None = None
        self._kernels: dict[int, Any] = {}

    def _kernel(self, ins: Any) -> Any:
        """``mosaic.parse_kernel`` of a tpu_custom_call, parsed once per instruction."""
        if id(ins) not in self._kernels:
            self._kernels[id(ins)] = parse_kernel(ins)
        return self._kernels[id(ins)]

    def _fused_work(self, name: str) -> tuple[float, float, float]:
        """(padded MXU FLOPs, VPU element-ops, EUP elements) of a fused computation."""
        if name in self._fused:
            return self._fused[name]
        comp = self.m.computation(name)
        mx = vp = eu = 0.0
        for ins in comp.instructions:
            op = ins.opcode
            if op in ("dot", "convolution"):
                mx += matmul_flops(*_mnk(ins, comp), self.chip)
            elif op == "fusion":
                for c in ins.called("calls"):
                    a, b, e = self._fused_work(c)
                    mx, vp, eu = mx + a, vp + b, eu + e
            elif op in _EUP:
                eu += sum(a.elements for a in ins.shape.arrays())
            elif op not in _FREE and not ins.shape.is_tuple:
                vp += ins.shape.elements
        self._fused[name] = (mx, vp, eu)
        return self._fused[name]

    def _bytes(self, ins: Any, comp: Any) -> float:
        called = ins.called("calls") if ins.opcode == "fusion" else []
        fcomp = self.m.computation(called[0]) if called else None
        total = 0
        for i, o in enumerate(ins.operands):
            src = comp.by_name.get(o)
            if src is None:
                continue
            b = src.shape.bytes
            total += _param_bytes(fcomp, i, b, self.m) if fcomp is not None else b
        root = fcomp.root if fcomp is not None else None
        if root is not None and root.opcode == "dynamic-update-slice" and len(root.operands) > 1:
            total += fcomp.by_name[root.operands[1]].shape.bytes
        elif root is not None and root.opcode == "tuple":
            for o in root.operands:       # results written by the fusion's own compute only
                src = fcomp.by_name.get(o)
                if src is None or src.opcode == "parameter" or src.opcode in _COLLECTIVE_OPS:
                    continue
                if src.opcode == "dynamic-update-slice" and len(src.operands) > 1:
                    total += fcomp.by_name[src.operands[1]].shape.bytes   # in place: the update
                else:
                    total += src.shape.bytes
        else:
            total += ins.shape.bytes
        return float(total)

    def seconds(self, ins: Any, comp: Any) -> float:
        """Seconds of one run of instruction ``ins`` (in computation ``comp``)."""
        return self.terms(ins, comp)[0]

    def terms(self, ins: Any, comp: Any) -> tuple[float, str]:
        """(seconds of one run, what bounds it: "kernel" | "mxu" | "hbm" | "vpu" | "eup")."""
        if ins.opcode == "custom-call":
            return self._custom_call(ins, comp), "kernel"
        if ins.opcode == "fusion":
            kernels = [k for c in ins.called("calls") for k in self.m.computation(c).instructions
                       if k.opcode == "custom-call" and k.custom_call_target == "tpu_custom_call"]
            if kernels:
                return sum(self._custom_call(k, comp) for k in kernels), "kernel"
            mx = vp = eu = 0.0
            for c in ins.called("calls"):
                a, b, e = self._fused_work(c)
                mx, vp, eu = mx + a, vp + b, eu + e
        elif ins.opcode in ("dot", "convolution"):
            mx, vp, eu = matmul_flops(*_mnk(ins, comp), self.chip), 0.0, 0.0
        else:
            mx, vp, eu = 0.0, 0.0, 0.0
        ch = self.chip
        clock = ch.clock_hz * ch.device_cores
        t = {"mxu": mx / (ch.device_flops * XLA_MXU_EFFICIENCY),
             "hbm": self._bytes(ins, comp) / ch.device_hbm_Bps,
             "vpu": vp / (ch.vpu_f32_ops_per_cycle * clock),
             "eup": eu / (ch.eup_ops_per_cycle * clock)}
        bound = max(t, key=t.get)
        return OP_LAUNCH_S + t[bound], bound

    def _custom_call(self, ins: Any, comp: Any) -> float:
        if ins.custom_call_target in _NO_COST_CALLS:
            return 0.0
        if ins.custom_call_target != "tpu_custom_call":
            return OP_LAUNCH_S + self._bytes(ins, comp) / self.chip.device_hbm_Bps
        try:
            k = self._kernel(ins)
        except MosaicError as e:
            self.notes.append(f"{e}: priced on its bytes")
            return OP_LAUNCH_S + self._bytes(ins, comp) / self.chip.device_hbm_Bps
        self.notes.extend(n for n in k.notes if n not in self.notes)
        if "splash_mha_fwd" in k.name:
            got = self._splash(ins, comp, k)
            if got is not None:
                return got
        split = bool(k.parallel and k.parallel[0] and k.grid
                     and k.grid[0] % self.chip.device_cores == 0)
        blocks = [w for w in k.windows if w.memory_space == "vmem"]
        first = sum(w.bytes for w in blocks)
        run = self._splash_bwd_run_fraction(ins, comp, k) if k.gated_matmuls else 1.0
        if run >= 1.0:
            work = StepWork(
                mxu_flops=sum(matmul_flops(m, kk, n, self.chip) for m, kk, n in k.matmuls),
                vpu_ops=k.vpu_ops, eup_ops=k.eup_ops,
                dma_bytes=sum(w.bytes * w.copies(k.grid) for w in blocks) / k.steps,
                first_bytes=first)
            return kernel_time(self.chip, k.steps, work, split).seconds
        # A block-sparse grid (module docstring): the gated compute runs on run_steps steps; a
        # window that follows the prefetched block table is copied only when a run step moves it.
        run_steps = max(1.0, run * k.steps)
        every = sum(w.bytes * w.copies(k.grid) for w in blocks if not w.data_dependent) / k.steps
        data = sum(w.bytes * min(w.copies(k.grid), run_steps) for w in blocks if w.data_dependent)
        run_work = StepWork(
            mxu_flops=sum(matmul_flops(m, kk, n, self.chip) for m, kk, n in k.matmuls),
            vpu_ops=k.vpu_ops, eup_ops=k.eup_ops, dma_bytes=every + data / run_steps,
            first_bytes=first)
        ungated = [mm for mm in k.matmuls]
        for mm in k.gated_matmuls:
            ungated.remove(mm)
        skip_work = StepWork(
            mxu_flops=sum(matmul_flops(m, kk, n, self.chip) for m, kk, n in ungated),
            vpu_ops=k.vpu_ops - k.gated_vpu_ops, eup_ops=k.eup_ops - k.gated_eup_ops,
            dma_bytes=every)
        return gated_kernel_time(self.chip, k.steps, run_steps, run_work, skip_work,
                                 split).seconds

    def _forward_splash(self) -> list[tuple[tuple, int, int, float]]:
        """(q dims, block_q, block_kv, mask density) of every splash forward kernel of the
        module: density = visited kv blocks per q row (its grid's last extent) over all."""
        if self._fwd_splash is None:
            self._fwd_splash = []
            for c in self.m.computations.values():
                for ins in c.instructions:
                    if ins.opcode != "custom-call" or ins.custom_call_target != "tpu_custom_call":
                        continue
                    try:
                        k = self._kernel(ins)
                    except MosaicError:
                        continue
                    if "splash_mha_fwd" not in k.name:
                        continue
                    qkv = _qkv(ins, c)
                    md = _xprof(ins)
                    if qkv is None or not k.grid or "block_q" not in md or "block_kv" not in md:
                        continue
                    bkv = min(int(md["block_kv"]), qkv[1].dims[-2])
                    full = math.ceil(qkv[1].dims[-2] / bkv)
                    self._fwd_splash.append((tuple(qkv[0].dims), int(md["block_q"]),
                                             int(md["block_kv"]), min(1.0, k.grid[-1] / full)))
        return self._fwd_splash

    def _splash_bwd_run_fraction(self, ins: Any, comp: Any, k: Any) -> float:
        """Fraction of a splash backward kernel's grid steps that run its gated compute.

        A splash backward grid walks kv blocks by q blocks (dk/dv) or q blocks by kv blocks
        (dq); its last extent is the blocks visited per row: shrunk to the visited ones (the
        separate dq and dk/dv kernels) or all of them (the fused dk/dv kernel,
        ``use_fused_bwd_kernel``, which writes a dq block at every step). The mask is the
        forward's, so the blocks it keeps are the forward's: the fraction of steps that run is
        ``density x full / grid[-1]`` (at most 1), density the forward kernel's of the same q
        shape and block sizes (``_forward_splash``), full the blocks of the last grid axis. 1
        (every step counted as if taken) for any other kernel or without a matching forward
        (noted)."""
        name = k.name
        if "splash_mha_dkv" in name:
            keys = ("block_q_dkv", "block_kv_dkv")
        elif "splash_mha_dq" in name:
            keys = ("block_q_dq", "block_kv_dq")
        else:
            return 1.0
        md, qkv = _xprof(ins), _qkv(ins, comp)
        if qkv is None or not k.grid or any(x not in md for x in keys):
            return 1.0
        bq, bkv = int(md[keys[0]]), int(md[keys[1]])
        q_len, kv_len = qkv[0].dims[-2], qkv[1].dims[-2]
        full = math.ceil(q_len / min(bq, q_len)) if "dkv" in name else math.ceil(
            kv_len / min(bkv, kv_len))
        dens = [d for dims, fq, fkv, d in self._forward_splash()
                if dims == tuple(qkv[0].dims) and fq == bq and fkv == bkv]
        if not dens and k.grid[-1] >= full:          # un-shrunk grid, nothing to scale it by
            note = (f"{name}: no splash forward kernel of the same shape and blocks in the "
                    "program; its gated compute is counted on every grid step")
            if note not in self.notes:
                self.notes.append(note)
        if not dens:
            return 1.0
        return min(1.0, max(dens) * full / k.grid[-1])

    def _splash(self, ins: Any, comp: Any, k: Any) -> float | None:
        """A splash forward call through ``splash_time_s``; None when its operands are unusual."""
        big = [comp.by_name[o].shape for o in ins.operands if o in comp.by_name]
        big = [s for s in big if not s.is_tuple and len(s.dims) >= 3 and s.dtype in ("bf16", "f32")]
        if len(big) < 3:
            return None
        q, kk = big[-3], big[-2]
        md = _xprof(ins)
        bq = int(md.get("block_q", 512))
        bkv = int(md.get("block_kv", 512))
        bkc = int(md.get("block_kv_compute") or bkv)
        heads, q_len, d = q.dims[-3], q.dims[-2], q.dims[-1]
        kv_len = kk.dims[-2]
        batch = math.prod(q.dims[:-3]) if len(q.dims) > 3 else 1
        full = math.ceil(kv_len / min(bkv, kv_len))
        visited = k.grid[-1] if k.grid else full
        return splash_time_s(self.chip, q_len, kv_len, heads, d, batch, bq, bkv, bkc,
                             mask_density=min(1.0, visited / full))


def _qkv(ins: Any, comp: Any) -> tuple | None:
    """Shapes of a splash kernel's q, k, v operands: its first three bf16/f32 operands of rank
    3 or more (the scalar-prefetched block tables before them are int8/int32)."""
    big = [comp.by_name[o].shape for o in ins.operands if o in comp.by_name]
    big = [s for s in big if not s.is_tuple and len(s.dims) >= 3 and s.dtype in ("bf16", "f32")]
    return tuple(big[:3]) if len(big) >= 3 else None


def _xprof(ins: Any) -> dict:
    """The kernel's block sizes from its ``kernel_metadata`` (``xprof_metadata`` JSON)."""
    m = re.search(r'xprof_metadata"\s*:\s*"((?:[^"\\]|\\.)*)"', ins.attrs.get("frontend_attributes",
                                                                         ""))
    if not m:
        return {}
    try:
        return json.loads(json.loads(f'"{m.group(1)}"'))
    except (json.JSONDecodeError, TypeError):
        return {}


def _priced(module: Any, chip: ChipModel, notes: list[str]):
    """(instruction, seconds of one run, what bounds it) of every instruction of ``module`` that
    the coster prices; instructions it cannot price are noted in ``notes``."""
    c = HloCoster(module, chip)
    for comp in module.computations.values():
        for ins in comp.instructions:
            if ins.opcode in _NOT_COMPUTE or ins.opcode.endswith(("-start", "-done", "-update")):
                continue
            try:
                sec, bound = c.terms(ins, comp)
            except (KeyError, ValueError, IndexError) as e:
                notes.append(f"{ins.name}: cannot price ({e}); left to the evidence")
                continue
            yield ins, sec, bound
    notes.extend(c.notes)


def compute_seconds_by_name(module: Any, chip: ChipModel) -> tuple[dict[str, float], list[str]]:
    """Seconds of one run of every instruction of ``module`` that the coster prices, by name;
    and the notes the pricing made."""
    notes: list[str] = []
    out = {ins.name: sec for ins, sec, _ in _priced(module, chip, notes)}
    return out, notes


def compute_breakdown(module: Any, chip: ChipModel, runs: dict[str, int]) -> dict[str, float]:
    """Seconds per step of the compute ``module`` runs, by what they are: Pallas kernels by their
    name (splash forward; splash forward saving its residuals for a backward, a rematerialized
    one included; splash backward dq and dk/dv; other kernels), every other op by what bounds it
    (MXU, HBM, VPU, EUP). ``runs``: instruction name -> runs per step (the evidence's counts);
    instructions it does not name are not counted."""
    out: dict[str, float] = {}
    for ins, sec, bound in _priced(module, chip, []):
        n = runs.get(ins.name)
        if n:
            key = _kernel_role(ins.name) if bound == "kernel" else f"{bound}-bound ops"
            out[key] = out.get(key, 0.0) + sec * n
    return out


def _kernel_role(name: str) -> str:
    if "splash_mha_fwd" in name:
        return ("attention forward" if "no_residuals" in name
                else "attention forward with residuals (training; recomputed ones included)")
    if "splash_mha_dq" in name or "splash_mha_dkv" in name:
        return "attention backward (dq, dk/dv)"
    return "other kernels"
