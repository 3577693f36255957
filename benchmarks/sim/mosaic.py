"""Read a Pallas/Mosaic TPU kernel from the compiled program: its grid, blocks and per-step work.

A ``custom-call`` with ``custom_call_target="tpu_custom_call"`` carries its Mosaic module as MLIR
bytecode (``backend_config.custom_call_config.body``, base64). What the compiler emitted is a
fact, so it is read here as the compiler wrote it: the kernel function (the one with
``iteration_bounds``) gives

- the grid (``iteration_bounds``) and which grid dimensions are "parallel";
- one window per blocked operand/result (``window_params[i].window_bounds``, element type from
  the function's memref argument) and its index map (``transform_indices``, a function of the
  grid indices): a window's block index changes whenever a grid index it depends on changes, so
  in row-major grid order it is copied ``prod(grid[:d + 1])`` times, d the innermost grid dim it
  depends on (once if it depends on none);
- per step, from the body's vector ops: MXU matmuls (``tpu.matmul``: m, k, n from the vector
  types), transcendental elements (exp, log, tanh, rsqrt, sqrt, divf) and other f32 vector
  element-operations (arith and reductions on vector types; a ``tpu.transpose`` /
  ``vector.transpose`` counts one element-operation per element: the compiled kernel moves the
  tile through the cross-lane unit vreg by vreg). Ops inside ``scf.if`` are counted as if
  taken; an ``scf.for`` body is counted once (a note says so).
- the part of that work inside a *gated* region: an ``scf.if`` of the kernel function whose
  region holds a ``tpu.matmul`` (``gated_matmuls``, ``gated_vpu_ops``, ``gated_eup_ops``).
  A block-sparse kernel (splash attention) puts its whole compute under such a branch
  (``pl.when(should_run)``) and skips it on grid steps whose block its mask leaves out; the
  caller says how many steps take it (``hlo_cost``).
- per window, whether its index map reads a scalar-prefetched (SMEM) operand
  (``Window.data_dependent``): splash's q/k/v/do windows name the next block to visit through
  its prefetched ``data_next`` table, so on a skipped step the block does not change and is
  not copied.
Units: elements, bytes.
"""

from __future__ import annotations

import base64
import dataclasses
import math
import re
from typing import Any

_TRANSPOSE_OPS = ("tpu.transpose", "vector.transpose")
_EUP_OPS = ("math.exp", "math.exp2", "math.log", "math.tanh", "math.rsqrt", "math.sqrt",
            "arith.divf", "tpu.reciprocal")
_FREE_OPS = ("arith.constant", "vector.shape_cast", "vector.load", "tpu.vector_store",
             "vector.broadcast", "tpu.iota", "vector.extract", "tpu.concatenate", "memref.load",
             "vector.store", "tpu.matmul")
_ITEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i8": 1, "i16": 2, "f64": 8, "i64": 8,
               "i1": 1, "f8E4M3FN": 1, "f8E5M2": 1}
_VEC = re.compile(r"vector<([0-9x]+)x([a-zA-Z0-9]+)>")
_MEMREF = re.compile(r"memref<((?:\d+x)*)([a-zA-Z][a-zA-Z0-9]*)(?:, #tpu\.memory_space<(\w+)>)?>")


class MosaicError(ValueError):
    """A tpu_custom_call whose Mosaic module cannot be read (the message says what)."""


@dataclasses.dataclass
class Window:
    shape: tuple[int, ...]
    item_bytes: int
    deps: frozenset[int]          # grid dims its block index depends on
    memory_space: str             # "vmem" for a pipelined block
    data_dependent: bool = False  # its index map reads a scalar-prefetched (SMEM) operand

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.item_bytes

    def copies(self, grid: tuple[int, ...]) -> int:
        """How many times the block is copied over the whole grid (module docstring)."""
        return math.prod(grid[:max(self.deps) + 1]) if self.deps else 1


@dataclasses.dataclass
class MosaicKernel:
    name: str
    grid: tuple[int, ...]
    parallel: tuple[bool, ...]
    windows: list[Window]
    matmuls: list[tuple[int, int, int]]     # (m, k, n) per step
    vpu_ops: float                          # f32 element-ops per step
    eup_ops: float                          # transcendental elements per step
    notes: list[str]
    gated_matmuls: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)
    gated_vpu_ops: float = 0.0              # the part of vpu_ops inside a gated scf.if
    gated_eup_ops: float = 0.0              # the part of eup_ops inside a gated scf.if

    @property
    def steps(self) -> int:
        return math.prod(self.grid) if self.grid else 1


def _body_text(ins: Any) -> str:
    cfg = ins.backend_config.get("custom_call_config") or {}
    body = cfg.get("body")
    if not body:
        raise MosaicError(f"{ins.name}: tpu_custom_call without a Mosaic body")
    from jax.extend.mlir import ir
    from jaxlib.mosaic.python import tpu

    ctx = ir.Context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    try:
        with ctx:
            mod = ir.Module.parse(base64.b64decode(body))
            return mod.operation.get_asm(print_generic_op_form=True)
    except Exception as e:  # bytecode of another MLIR version
        raise MosaicError(f"{ins.name}: cannot read its Mosaic module: "
                          f"{str(e).splitlines()[0]}") from e


def _split_funcs(text: str) -> list[str]:
    """The text of each ``func.func`` op (generic form: one op per line, regions indented)."""
    lines = text.splitlines()
    out, cur = [], None
    for ln in lines:
        if ln.strip().endswith('func.func"() ({'):
            cur = [ln]
            continue
        if cur is not None:
            cur.append(ln)
            if ln.lstrip().startswith("}) {") and "sym_name" in ln:
                out.append("\n".join(cur))
                cur = None
    return out


def _attr(func: str, key: str) -> str:
    tail = func.splitlines()[-1]
    m = re.search(re.escape(key) + r" = ", tail)
    return tail[m.end():] if m else ""


def _dims(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.split("x") if v)


def _deps(func: str, n_grid: int) -> frozenset[int]:
    """Grid dims the values returned by an index-map function depend on (SSA dataflow)."""
    m = re.search(r"\^bb0\(([^)]*)\)", func)
    if not m:
        return frozenset()
    args = re.findall(r"(%[\w.]+):", m.group(1))
    dep: dict[str, set[int]] = {a: ({i} if i < n_grid else set()) for i, a in enumerate(args)}
    ret: set[int] = set()
    for ln in func.splitlines()[1:]:
        ln = ln.strip()
        mm = re.match(r'(%[\w.]+)(?::\d+)? = "[\w.]+"\(([^)]*)\)', ln)
        if mm:
            d = set()
            for o in re.findall(r"%[\w.#]+", mm.group(2)):
                d |= dep.get(o.split("#")[0], set())
            dep[mm.group(1)] = d
        elif '.func.return"(' in ln:
            inner = ln[ln.index('return"(') + 8:ln.index(")")]
            for o in re.findall(r"%[\w.]+", inner):
                ret |= dep.get(o, set())
    return frozenset(ret)


def _op_work(ln: str) -> tuple[str, tuple | None, float, float]:
    """(op name, matmul (m, k, n) or None, VPU element-ops, EUP elements) of one op line."""
    m = re.search(r'"stable_mosaic\.([\w.]+)"|"(tpu\.[\w.]+|arith\.\w+|math\.\w+|vector\.\w+)"', ln)
    if not m:
        return "", None, 0.0, 0.0
    op = m.group(1) or m.group(2)
    if " : " not in ln:
        return op, None, 0.0, 0.0
    types = ln.rsplit(" : ", 1)[1]
    vecs = [(_dims(a), b) for a, b in _VEC.findall(types)]
    if not vecs:
        return op, None, 0.0, 0.0
    if op == "tpu.matmul" and len(vecs) >= 3:
        (lhs, _), (rhs, _), (out, _) = vecs[0], vecs[1], vecs[-1]
        el, er, eo = math.prod(lhs), math.prod(rhs), math.prod(out)
        k = round(math.sqrt(el * er / eo)) if eo else 0
        return op, (out[0] if len(out) > 1 else 1, k, out[-1]), 0.0, 0.0
    if op in _EUP_OPS:
        return op, None, 0.0, float(math.prod(vecs[-1][0]))
    if op in _TRANSPOSE_OPS:
        return op, None, float(math.prod(vecs[-1][0])), 0.0
    if op.startswith(("arith.", "math.", "vector.multi_reduction")) and op not in _FREE_OPS:
        return op, None, float(max(math.prod(v[0]) for v in vecs)), 0.0
    return op, None, 0.0, 0.0


def _body_work(func: str, notes: list[str]) -> tuple[list, float, float, list, float, float]:
    """Per-step work of the kernel function: (matmuls, VPU ops, EUP elements) of the whole body
    and of its gated part (module docstring). Regions are tracked from the generic form: a line
    ending in ``({`` opens one, a line starting with ``})`` closes it."""
    mm, vpu, eup = [], 0.0, 0.0
    per_if: dict[int, list] = {}          # outermost scf.if (line number) -> [mm, vpu, eup]
    stack: list[tuple[str, int]] = []     # open regions: (op, line of the op that opened it)
    for no, ln in enumerate(func.splitlines()):
        st = ln.strip()
        if st.startswith("})"):
            if stack:
                stack.pop()
            continue
        op, mat, v, e = _op_work(ln)
        if op == "scf.for":
            notes.append("an scf.for loop in the kernel body is counted once")
        outer_if = next((n for o, n in stack if o == "scf.if"), None)
        if mat is not None or v or e:
            if mat is not None:
                mm.append(mat)
            vpu, eup = vpu + v, eup + e
            if outer_if is not None:
                w = per_if.setdefault(outer_if, [[], 0.0, 0.0])
                if mat is not None:
                    w[0].append(mat)
                w[1] += v
                w[2] += e
        if st.endswith("({"):
            stack.append((op, no))
    gmm, gv, ge = [], 0.0, 0.0
    for w in per_if.values():
        if w[0]:
            gmm, gv, ge = gmm + w[0], gv + w[1], ge + w[2]
    return mm, vpu, eup, gmm, gv, ge


def parse_kernel(ins: Any) -> MosaicKernel:
    """The kernel of a ``tpu_custom_call`` instruction (``aoizora.extract.hlo.Instruction``)."""
    text = _body_text(ins)
    funcs = _split_funcs(text)
    main = next((f for f in funcs if "iteration_bounds" in f.splitlines()[-1]), None)
    if main is None:
        raise MosaicError(f"{ins.name}: no kernel function with iteration_bounds in its module")
    tail = main.splitlines()[-1]
    gm = re.search(r"iteration_bounds = array<i64(?::\s*([0-9, ]*))?>", tail)
    grid = tuple(int(v) for v in (gm.group(1) or "").split(",") if v.strip()) if gm else ()
    sem = re.findall(r"dimension_semantics<(\w+)>", tail)
    parallel = tuple(s == "parallel" for s in sem) or (False,) * len(grid)
    npf = int((re.search(r"scalar_prefetch = (\d+)", tail) or [0, 0])[1])
    sym = re.search(r'sym_name = "([\w.]+)"', tail)
    ftype = re.search(r"function_type = \((.*?)\) -> ", tail)
    memrefs = _MEMREF.findall(ftype.group(1)) if ftype else []
    by_name = {re.search(r'sym_name = "([\w.]+)"', f.splitlines()[-1]).group(1): f for f in funcs
               if re.search(r'sym_name = "([\w.]+)"', f.splitlines()[-1])}
    wparams = re.findall(r"\{(?:transform_indices = @([\w.]+), )?window_bounds = array<i64: "
                         r"([0-9, ]+)>", tail)
    notes: list[str] = []
    windows = []
    blocked = memrefs[npf:npf + len(wparams)]
    for (tname, wb), (_, dtype, space) in zip(wparams, blocked):
        shape = tuple(int(v) for v in wb.split(","))
        deps = _deps(by_name[tname], len(grid)) if tname in by_name else frozenset(range(len(grid)))
        data = tname in by_name and bool(re.search(r'memref\.load"\([^)]*\) : \(memref<[^>]*'
                                                   r'memory_space<smem>', by_name[tname]))
        windows.append(Window(shape, _ITEM_BYTES.get(dtype, 4), deps, space or "vmem", data))
    mm, vpu, eup, gmm, gvpu, geup = _body_work(main, notes)
    return MosaicKernel(sym.group(1) if sym else ins.name, grid, parallel, windows, mm, vpu, eup,
                        sorted(set(notes)), gmm, gvpu, geup)
