"""The partitioner IR (``aoizora.extract.program_ir``) of a captured ATen graph.

``build_torch_ir(ep)`` walks a functional ``ExportedProgram`` (``capture.capture``) node by node
and writes the same records the JAX frontend writes, with the same dimension labels (the shared
``LABELERS``), so the sharding ILP, the placement CP-SAT and Q2 run on it unchanged:

- ``linear`` / ``mm`` / ``bmm`` / ``addmm`` / ``matmul`` are ``dot`` nodes; their dimension numbers
  (batch, contracting, free dims) are read from the op and its operand shapes (``linear``: the
  weight [N, K] contracts its dim 1 with the activation's last dim); a bias is an ``elementwise``
  add after the dot;
- ``scaled_dot_product_attention`` is one ``attention`` node (q, k, v as [B, H, S, D]);
- ``convolution`` (groups 1) is a ``conv`` node (torch's N, C, spatial... layout);
- ``layer_norm`` / ``rms_norm`` are a ``reduce`` over the normalized dims, a ``reshape`` that keeps
  them as size-1 dims and an ``elementwise`` (x, statistics, weight, bias);
- elementwise math, views, permutes, slices, ``slice_scatter``, ``cat``, ``unbind`` / ``split`` /
  ``chunk`` (one ``slice`` node per piece, plus a ``reshape`` for ``unbind``), ``expand`` and
  reductions map to the IR's kinds with their dims tracked;
- ops that only make a buffer (``empty_like``, ``arange``, ...) are ``source`` nodes.

An op the table does not know is a node of kind ``unknown`` (replicated only), listed in
``ProgramIR.warnings``. Node keys are the FX node names (``linear_5``; a second node made for
one op adds a suffix, ``rms_norm.stat``). Inputs are the graph's placeholders in order:
parameters and buffers (``Tensor.path`` their module path, ``blocks.0.attn1.to_q.weight``),
then the user inputs (``inputs/hidden_states``).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import types
from typing import Any, Callable

import torch
import torch.fx

from aoizora.extract.frontends.torch.ops import (ELEMENTWISE, FIRST_ONLY, REDUCES, RESHAPES,
                                                 SKIPPED, SOURCES, op_name)
from aoizora.extract.ir_labels import LABELERS
from aoizora.extract.program_ir import Node, ProgramIR, Tensor

class TorchIRError(ValueError):
    """The captured graph could not be turned into an IR."""


def _dtype(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _vals(node: torch.fx.Node) -> list:
    v = node.meta.get("val")
    if isinstance(v, (list, tuple)):
        return list(v)
    return [] if v is None else [v]


def _source(node: torch.fx.Node) -> tuple[str, str]:
    """(module path, "file:line (function)") of an FX node, best effort."""
    stack = node.meta.get("nn_module_stack") or {}
    path = ""
    if stack:
        path = list(stack.values())[-1][0]
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    src = ""
    for line in reversed(trace):
        line = line.strip()
        if line.startswith("File "):
            parts = line.split(",")
            fname = parts[0][5:].strip().strip('"').rsplit("/", 2)
            where = "/".join(fname[-2:])
            lineno = parts[1].strip().replace("line ", "") if len(parts) > 1 else "?"
            fn = parts[2].strip().replace("in ", "") if len(parts) > 2 else ""
            src = f"{where}:{lineno} ({fn})"
            break
    return path, src


@dataclasses.dataclass
class _Builder:
    tensors: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    nodes: list[Node] = dataclasses.field(default_factory=list)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    count: int = 0

    def tensor(self, shape, dtype: str, kind: str, **kw) -> str:
        tid = f"t{self.count}"
        self.count += 1
        shape = [int(d) for d in shape]
        item = torch.empty((), dtype=getattr(torch, dtype)).element_size() if dtype else 4
        self.tensors[tid] = Tensor(tid, shape, dtype, int(math.prod(shape)) * item, kind, **kw)
        return tid

    def literal(self, value) -> str:
        v = float(value) if isinstance(value, (int, float, bool)) else None
        return self.tensor([], "float32", "literal", value=v)

    def emit(self, key: str, fx: torch.fx.Node, kind: str, operands: list[str],
             outs: list[tuple[list[int], str]], params: dict[str, Any] | None = None,
             flops: float = 0.0) -> list[str]:
        """One IR node of ``kind`` (labels by the shared ``LABELERS``); returns its results."""
        path, src = _source(fx)
        node = Node(key=key, primitive=str(fx.target), kind=kind, operands=list(operands),
                    results=[], flops=float(flops), bytes=0.0, params=dict(params or {}),
                    name_stack=path, source=src)
        for shape, dt in outs:
            node.results.append(self.tensor(shape, dt, "node", producer=key))
        op_shapes = [self.tensors[t].shape for t in node.operands]
        res_shapes = [self.tensors[t].shape for t in node.results]
        labeler = LABELERS.get(kind)
        try:
            if labeler is not None:
                ol, rl, roles = labeler(node, node.params, op_shapes, res_shapes)
            else:
                ol, rl, roles = [[] for _ in op_shapes], [[] for _ in res_shapes], {}
        except Exception as e:  # noqa: BLE001 -- a form the labels do not fit: kept, replicated
            self.warnings.append(f"{key} {fx.target}: dim roles failed ({e}); kept replicated")
            node.kind, ol, rl, roles = "unknown", [], [], {}
        node.operand_labels, node.result_labels, node.roles = ol, rl, roles
        if kind == "elementwise" and not flops:
            node.flops = float(sum(math.prod(s) for s in res_shapes))
        node.bytes = float(sum(self.tensors[t].bytes for t in node.operands + node.results
                               if self.tensors[t].kind != "literal"))
        self.nodes.append(node)
        return node.results

    def arg(self, a) -> str:
        """The tensor id of an FX argument (a node's value), or a literal."""
        if isinstance(a, torch.fx.Node):
            got = self.env.get(a.name)
            if isinstance(got, str):
                return got
            raise TorchIRError(f"argument {a.name} is not a single tensor")
        return self.literal(a)

    def shape(self, tid: str) -> list[int]:
        return self.tensors[tid].shape


def _out(fx: torch.fx.Node) -> list[tuple[list[int], str]]:
    return [(list(v.shape), _dtype(v.dtype)) for v in _vals(fx) if isinstance(v, torch.Tensor)]


def _dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


# ------------------------------------------------------------------------------------------------
# op translations: (builder, fx node, op name) -> tensor id or list of tensor ids

def _elementwise(b: _Builder, fx, name):
    args = fx.args[:1] if name in FIRST_ONLY else fx.args
    if name == "copy":            # copy(dst, src): the values are src's
        args = fx.args[1:2]
    ops = [b.arg(a) for a in args if isinstance(a, torch.fx.Node)]
    ops = [t for t in ops if b.tensors[t].shape or len(ops) == 1]
    return b.emit(fx.name, fx, "elementwise", ops, _out(fx))[0]


def _reshape(b: _Builder, fx, name):
    return b.emit(fx.name, fx, "reshape", [b.arg(fx.args[0])], _out(fx))[0]


def _permute(b: _Builder, fx, name):
    x = b.arg(fx.args[0])
    r = len(b.shape(x))
    if name == "permute":
        perm = [_dim(d, r) for d in fx.args[1]]
    else:                       # transpose(x, d0, d1) / t(x)
        d0, d1 = (fx.args[1], fx.args[2]) if len(fx.args) > 2 else (0, 1)
        perm = list(range(r))
        perm[_dim(d0, r)], perm[_dim(d1, r)] = perm[_dim(d1, r)], perm[_dim(d0, r)]
    return b.emit(fx.name, fx, "transpose", [x], _out(fx), {"permutation": perm})[0]


def _expand(b: _Builder, fx, name):
    x = b.arg(fx.args[0])
    (o, _), = _out(fx)
    bd = list(range(len(o) - len(b.shape(x)), len(o)))
    return b.emit(fx.name, fx, "broadcast", [x], _out(fx), {"broadcast_dimensions": bd})[0]


def _slice(b: _Builder, fx, name):
    x = b.arg(fx.args[0])
    r = len(b.shape(x))
    if name == "slice_scatter":
        ops, dim = [x, b.arg(fx.args[1])], fx.args[2] if len(fx.args) > 2 else 0
    else:
        ops, dim = [x], fx.args[1] if len(fx.args) > 1 else 0
    return b.emit(fx.name, fx, "slice", ops, _out(fx), {"axis": _dim(dim, r)})[0]


def _select(b: _Builder, fx, name):
    """select(x, dim, i): a slice of size 1 on dim, then a reshape that drops it."""
    x = b.arg(fx.args[0])
    shape, dt = list(b.shape(x)), b.tensors[x].dtype
    dim = _dim(fx.args[1], len(shape))
    shape[dim] = 1
    (one,) = b.emit(f"{fx.name}.slice", fx, "slice", [x], [(shape, dt)], {"axis": dim})
    return b.emit(fx.name, fx, "reshape", [one], _out(fx))[0]


def _pieces(b: _Builder, fx, name):
    """unbind / split / split_with_sizes / chunk: one slice node per piece along dim."""
    x = b.arg(fx.args[0])
    shape = b.shape(x)
    dim = fx.args[1] if name == "unbind" else (fx.args[2] if len(fx.args) > 2 else 0)
    dim = _dim(fx.kwargs.get("dim", dim), len(shape))
    out = []
    for i, (o, odt) in enumerate(_out(fx)):
        piece = list(shape)
        piece[dim] = 1 if name == "unbind" else o[dim]
        (t,) = b.emit(f"{fx.name}.{i}", fx, "slice", [x], [(piece, odt)], {"axis": dim})
        if name == "unbind":
            (t,) = b.emit(f"{fx.name}.{i}.squeeze", fx, "reshape", [t], [(o, odt)])
        out.append(t)
    return out


def _cat(b: _Builder, fx, name):
    ops = [b.arg(a) for a in fx.args[0]]
    r = len(_out(fx)[0][0])
    dim = _dim(fx.args[1] if len(fx.args) > 1 else fx.kwargs.get("dim", 0), r)
    return b.emit(fx.name, fx, "concat", ops, _out(fx), {"axis": dim})[0]


def _reduce(b: _Builder, fx, name):
    x = b.arg(fx.args[0])
    r = len(b.shape(x))
    dims = fx.args[1] if len(fx.args) > 1 else fx.kwargs.get("dim")
    dims = list(range(r)) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
    axes = sorted(_dim(d, r) for d in dims)
    keep = [s for d, s in enumerate(b.shape(x)) if d not in axes]
    dt = _out(fx)[0][1]
    (t,) = b.emit(f"{fx.name}.reduce" if len(keep) != len(_out(fx)[0][0]) else fx.name, fx,
                  "reduce", [x], [(keep, dt)], {"axes": axes},
                  flops=float(math.prod(b.shape(x))))
    if len(keep) != len(_out(fx)[0][0]):           # keepdim: the reduced dims stay as 1s
        (t,) = b.emit(fx.name, fx, "reshape", [t], _out(fx))
    return t


def _norm(b: _Builder, fx, name):
    """layer_norm / rms_norm: statistics over the normalized (last) dims, then x, stats, w, b."""
    x = b.arg(fx.args[0])
    shape = b.shape(x)
    k = len(fx.args[1])
    axes = list(range(len(shape) - k, len(shape)))
    (st,) = b.emit(f"{fx.name}.stat", fx, "reduce", [x], [(shape[:-k], "float32")],
                   {"axes": axes}, flops=2.0 * math.prod(shape))
    (st1,) = b.emit(f"{fx.name}.keep", fx, "reshape", [st], [(shape[:-k] + [1] * k, "float32")])
    extra = [a for a in fx.args[2:4] if isinstance(a, torch.fx.Node)]
    ops = [x, st1] + [b.arg(a) for a in extra]
    res = b.emit(fx.name, fx, "elementwise", ops, _out(fx)[:1], flops=4.0 * math.prod(shape))
    return res[0] if len(_out(fx)) == 1 else res + [st, st]


def _dot_numbers(name: str, ls: list[int], rs: list[int]):
    """((lhs contracting, rhs contracting), (lhs batch, rhs batch)) of a torch matmul op."""
    lr, rr = len(ls), len(rs)
    if name == "linear" or (name == "matmul" and rr == 2):
        return (([lr - 1], [1 if name == "linear" else 0]), ([], []))
    if name in ("mm", "addmm"):
        return (([1], [0]), ([], []))
    if name in ("bmm", "baddbmm") or (name == "matmul" and lr == rr and lr >= 3):
        lb = list(range(lr - 2))
        return (([lr - 1], [rr - 2]), (lb, list(lb)))
    raise TorchIRError(f"{name} with operand ranks {lr}, {rr}")


def _dot(b: _Builder, fx, name):
    a_idx, w_idx = (1, 2) if name in ("addmm", "baddbmm") else (0, 1)
    lhs, rhs = b.arg(fx.args[a_idx]), b.arg(fx.args[w_idx])
    ls, rs = b.shape(lhs), b.shape(rhs)
    dn = _dot_numbers(name, ls, rs)
    (o, dt), = _out(fx)
    k = math.prod(ls[d] for d in dn[0][0])
    bias = fx.args[2] if name == "linear" and len(fx.args) > 2 else (
        fx.args[0] if name in ("addmm", "baddbmm") else None)
    key = f"{fx.name}.dot" if isinstance(bias, torch.fx.Node) else fx.name
    (t,) = b.emit(key, fx, "dot", [lhs, rhs], [(o, dt)], {"dimension_numbers": dn},
                  flops=2.0 * math.prod(o) * k)
    if isinstance(bias, torch.fx.Node):
        (t,) = b.emit(fx.name, fx, "elementwise", [t, b.arg(bias)], [(o, dt)])
    return t


def _conv(b: _Builder, fx, name):
    x, w = b.arg(fx.args[0]), b.arg(fx.args[1])
    groups = fx.args[-1] if name == "convolution" else (fx.args[6] if len(fx.args) > 6 else 1)
    if groups != 1:
        raise TorchIRError(f"{name} with groups={groups}")
    r = len(b.shape(x))
    spec = tuple(range(r))
    dn = types.SimpleNamespace(lhs_spec=spec, rhs_spec=spec, out_spec=spec)
    (o, dt), = _out(fx)
    per_out = math.prod(b.shape(w)[1:])
    bias = fx.args[2] if len(fx.args) > 2 else None
    key = f"{fx.name}.conv" if isinstance(bias, torch.fx.Node) else fx.name
    (t,) = b.emit(key, fx, "conv", [x, w], [(o, dt)], {"dimension_numbers": dn},
                  flops=2.0 * math.prod(o) * per_out)
    b.nodes[-1].params = {"dimension_numbers": "torch NC(spatial)", "groups": 1}
    if isinstance(bias, torch.fx.Node):
        bshape = [1] * r
        bshape[1] = b.shape(b.arg(bias))[0]
        (bb,) = b.emit(f"{fx.name}.bias", fx, "reshape", [b.arg(bias)], [(bshape, dt)])
        (t,) = b.emit(fx.name, fx, "elementwise", [t, bb], [(o, dt)])
    return t


def _attention(b: _Builder, fx, name):
    q, k, v = (b.arg(a) for a in fx.args[:3])
    qs, ks = b.shape(q), b.shape(k)
    if len(qs) != 4 or len(ks) != 4:
        raise TorchIRError(f"attention with q {qs}, k {ks}: expected [B, H, S, D]")
    mask = fx.args[3] if len(fx.args) > 3 else fx.kwargs.get("attn_mask")
    causal = bool(fx.args[5] if len(fx.args) > 5 else fx.kwargs.get("is_causal", False))
    scale = fx.kwargs.get("scale") or (fx.args[6] if len(fx.args) > 6 else None)
    B, H, S, D = qs
    T = ks[2]
    params = {"scale": float(scale) if scale else 1.0 / math.sqrt(D), "mask": False,
              "pattern": "aten.scaled_dot_product_attention", "shape": [B, H, S, T, D],
              "is_causal": causal}
    if isinstance(mask, torch.fx.Node):
        b.warnings.append(f"{fx.name}: the attention mask is not laid out (kept with keys)")
    b.notes.append(f"attention {fx.name}: scaled_dot_product_attention, q {qs} read as batch "
                   f"{B}, heads {H}, sequence {S} (keys {T}), head dim {D}")
    return b.emit(fx.name, fx, "attention", [q, k, v], _out(fx)[:1], params,
                  flops=4.0 * B * H * S * T * D)[0]


def _source_op(b: _Builder, fx, name):
    return b.emit(fx.name, fx, "source", [], _out(fx))[0]


def _unknown(b: _Builder, fx, name):
    ops = [b.arg(a) for a in fx.args if isinstance(a, torch.fx.Node)
           and isinstance(b.env.get(a.name), str)]
    b.warnings.append(f"{fx.name} {fx.target}: not known to the torch frontend; kept replicated")
    res = b.emit(fx.name, fx, "unknown", ops, _out(fx))
    return res[0] if len(res) == 1 else res


TABLE: dict[str, Callable] = {
    **{n: _elementwise for n in ELEMENTWISE}, **{n: _reshape for n in RESHAPES},
    **{n: _source_op for n in SOURCES}, **{n: _reduce for n in REDUCES},
    "permute": _permute, "transpose": _permute, "t": _permute, "expand": _expand,
    "slice": _slice, "slice_scatter": _slice, "narrow": _slice, "select": _select,
    "unbind": _pieces, "split": _pieces, "split_with_sizes": _pieces, "chunk": _pieces,
    "cat": _cat, "concat": _cat, "layer_norm": _norm, "rms_norm": _norm,
    "linear": _dot, "mm": _dot, "bmm": _dot, "addmm": _dot, "baddbmm": _dot, "matmul": _dot,
    "convolution": _conv, "conv1d": _conv, "conv2d": _conv, "conv3d": _conv,
    "scaled_dot_product_attention": _attention,
}


def _inputs(b: _Builder, ep) -> list[str]:
    ids = []
    for i, spec in enumerate(ep.graph_signature.input_specs):
        node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
        vals = _vals(node)
        if not vals or not isinstance(vals[0], torch.Tensor):
            continue
        v = vals[0]
        path = spec.target if spec.kind.name != "USER_INPUT" else f"inputs/{spec.arg.name}"
        tid = b.tensor(list(v.shape), _dtype(v.dtype), "input", input_index=len(ids), path=path)
        b.env[node.name] = tid
        ids.append(tid)
    return ids


def build_torch_ir(ep) -> ProgramIR:
    """The ProgramIR of a captured program (module docstring).

    Raises:
        TorchIRError: the graph has an op whose arguments the IR cannot follow."""
    b = _Builder()
    inputs = _inputs(b, ep)
    outputs: list[str] = []
    for fx in ep.graph.nodes:
        if fx.op == "call_function":
            if fx.target is operator.getitem:
                b.env[fx.name] = b.env[fx.args[0].name][fx.args[1]]
                continue
            name = op_name(fx.target)
            if name in SKIPPED or not _vals(fx):
                continue
            handler = TABLE.get(name, _unknown)
            try:
                b.env[fx.name] = handler(b, fx, name)
            except TorchIRError as e:
                b.warnings.append(f"{fx.name}: {e}; kept replicated")
                b.env[fx.name] = _unknown(b, fx, name)
        elif fx.op == "output":
            flat = torch.utils._pytree.tree_leaves(fx.args[0])
            outputs = [b.env[a.name] for a in flat if isinstance(a, torch.fx.Node)
                       and isinstance(b.env.get(a.name), str)]
    return ProgramIR(nodes=b.nodes, tensors=b.tensors, inputs=inputs, outputs=outputs,
                     output_paths=[f"out{i}" for i in range(len(outputs))],
                     warnings=b.warnings, notes=b.notes)
