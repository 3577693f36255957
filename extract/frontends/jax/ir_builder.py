"""The JAX frontend of the partitioner IR (``aoizora.extract.program_ir``): a traced JAX
program -> a ``ProgramIR``.

``build_ir(fn, *abstract_args)`` traces ``fn`` with ``jax.make_jaxpr`` and walks it with the
shared walk (``aoizora.extract.frontends.jax.jaxpr_walk``), so every node key is the walk's key (the realizer
constrains the output of the eqn with that key).

A ``hint`` (``aoizora_hint``, an identity that names dims) is not a node: its result *is* its
operand's tensor, and the names go on that tensor (``Tensor.names``, the first hint wins). So a
program with hints and the same program without them have the same nodes, tensors, strategies and
costs; only ``Tensor.names`` differ (a layout's ``rules`` read the hint eqns in the realizer).

A ``checkpoint_name`` (``jax.ad_checkpoint``'s ``name`` primitive, an identity that tags an
activation for rematerialization policies) is not a node either: its result is its operand's
tensor and the tag goes on that tensor (``Tensor.checkpoint``, the first tag wins).

A ``lax.scan`` body appears once; its nodes carry ``repeat`` = the product of enclosing lengths and
``scope`` = the scan's key. Its body inputs are tensors of their own with ``kind`` ``scan_const``,
``scan_carry`` (``outer`` = the initial value, ``loop_back`` = the body's carry output) or ``scan_xs``
(``outer`` = the stacked tensor; the body sees it without the leading dim); the scan's outer results
are tensors of kind ``scan_carry_out`` / ``scan_ys`` with ``inner`` = the body tensor (``scan_ys``
adds the leading stacked dim). Inlined calls (``jit``, checkpoint, custom_jvp/vjp) add no tensors:
their inner variables are the outer ones.

A ``while`` body is visited once with its repeat unchanged (the trip count is unknown at trace
time) and its condition is not walked, as in the shared walk.

*State*: when an element of the returned tuple has the pytree structure, shapes and dtypes of a
positional argument of two or more leaves (a training step's ``(state, batch) -> (new_state, loss)``), its leaves are
that argument's next value: ``ProgramIR.state_aliases`` lists ``[output leaf, input leaf]`` pairs,
so the planner can keep them in one layout (the next step's input is this step's output, and
the buffers can be donated).

Attention however it is written (``jax.nn.dot_product_attention``, Flax, einsum -> softmax ->
einsum, a hand-called splash kernel; :mod:`aoizora.extract.frontends.jax.attention_patterns`) is one node of kind ``attention`` keyed by the
region's last eqn (the p @ v ``dot_general``); the region's other eqns are not nodes. Its operands
are q, k, v (and the mask, if any) as the region reads them, in their own dim order: the labels
``b``, ``h``, ``s``/``t``, ``d`` mark the dims with those roles (more dims of one role get ``s1``,
``s2``..., role ``fused``, not split); ``params`` has ``scale``, ``pattern`` and the canonical
``shape`` [B, H, S, T, D] (and ``guesses``: the roles read by position, which the plan's words
repeat). ``ProgramIR.notes`` says, per such node, how its dims were read and which
were guessed; an attention-like chain that is not recognised is one line in ``warnings``.

A primitive the IR does not know becomes a node of kind ``unknown`` (replicated only); all of them
are listed in ``ProgramIR.warnings`` and one ``warnings.warn``; so is each direct ``pallas_call``
(a kernel that is not a full-mask splash call: one opaque node, replicated). Nothing is dropped.
"""

from __future__ import annotations

import math
import os
import warnings as _warnings
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal

from aoizora.extract.frontends.jax.attention_patterns import AttentionMatch, Patterns, find_attention
from aoizora.extract.frontends.jax.jaxpr_walk import INLINE_PRIMITIVES, sub_jaxpr, walk
from aoizora.extract.ir_labels import LABELERS
from aoizora.extract.program_ir import IRError, Node, ProgramIR, Tensor


# ---------------------------------------------------------------------------------------------
# primitive tables

ELEMENTWISE = frozenset("""
add sub mul div rem pow integer_pow max min neg sign floor ceil round is_finite abs exp exp2 log
log1p expm1 tanh logistic sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh sqrt rsqrt
cbrt erf erfc erf_inv lgamma digamma square reciprocal convert_element_type select_n clamp
and or not xor eq ne lt le gt ge nextafter copy copy_p real imag conj complex reduce_precision
stop_gradient shift_left shift_right_logical shift_right_arithmetic population_count
optimization_barrier add_any
""".split())
REDUCE = frozenset("reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor "
                   "argmax argmin".split())
SLICE = frozenset("slice dynamic_slice rev split".split())
CUMULATIVE = frozenset("cumsum cumprod cummax cummin cumlogsumexp".split())
SOURCE = frozenset("iota rng_bit_generator random_bits random_seed random_wrap random_unwrap "
                   "threefry2x32 rng_uniform".split())
OPAQUE = frozenset("pallas_call custom_call tpu_custom_call shard_map".split())
GATHER = frozenset("gather".split())
SCATTER = frozenset("scatter scatter-add scatter_add scatter_mul scatter_min scatter_max "
                    "dynamic_update_slice".split())

ATTENTION_NAME = "aoizora_attention"
ATTENTION_FWD_NAME = "aoizora_attention_fwd"    # the forward with its residuals (out, lse)
ATTENTION_BWD_NAME = "aoizora_attention_bwd"
# Attention backward FLOPs over forward FLOPs: 5 matmuls of the backward against 2 of the forward
# (Dao, "FlashAttention-2", arXiv 2307.08691, section 4.1 counts the backward pass as 2.5x the
# forward's FLOPs). The splash kernel's separate dq and dk/dv kernels recompute S = q k^T once more; that
# extra work is not counted here (the planner's attention calibration measures it).
ATTENTION_BWD_FLOPS_RATIO = 2.5
HINT_NAME = "aoizora_hint"
CHECKPOINT_NAME = "name"      # jax.ad_checkpoint.checkpoint_name's primitive
ALIAS_PRIMITIVES = frozenset({HINT_NAME, CHECKPOINT_NAME})   # identities: no node, no tensor


def _dtype_str(dt) -> str:
    return str(np.dtype(dt)) if not hasattr(dt, "name") else dt.name


def _nbytes(shape, dtype) -> int:
    try:
        item = np.dtype(dtype).itemsize
    except TypeError:
        item = 4
    return int(math.prod(shape)) * int(item)


def _path_str(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return "/".join(parts)


def _source(eqn) -> tuple[str, str]:
    try:
        from jax._src import source_info_util as siu
        name_stack = str(eqn.source_info.name_stack)
        fr = siu.user_frame(eqn.source_info.traceback)
        src = f"{short_path(fr.file_name)}:{fr.start_line} ({fr.function_name})" if fr else ""
        return name_stack, src
    except Exception:  # source info is best effort; the key still identifies the op
        return "", ""


def short_path(file_name: str) -> str:
    """`file_name` as its module path, the way an import names it: from the directory above its
    outermost package (the directories holding an ``__init__.py``), e.g.
    ``/home/me/src/aoizora/models/layers.py`` -> ``aoizora/models/layers.py``; a script outside
    any package by its base name. A plan read on another machine then says where an op comes
    from without the planning machine's checkout path."""
    head, parts = os.path.split(os.path.abspath(file_name))
    parts = [parts]
    while head and os.path.exists(os.path.join(head, "__init__.py")):
        head, pkg = os.path.split(head)
        parts.insert(0, pkg)
    return "/".join(parts)


def _json_param(v) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (tuple, list)):
        return [_json_param(x) for x in v]
    if isinstance(v, np.dtype) or hasattr(v, "dtype") and isinstance(v, type):
        return str(v)
    return str(v)


# ---------------------------------------------------------------------------------------------
# dim roles

def _labels(node: Node, eqn, op_shapes: list[list[int]], res_shapes: list[list[int]]) -> None:
    """Fill operand_labels / result_labels / roles (and a reshape's groups) of `node` by its kind
    (``LABELERS``); gather / scatter / source / opaque / unknown get no shared labels
    (replicated-only or free)."""
    labeler = LABELERS.get(node.kind)
    if labeler is None:
        ol, rl, roles = [[] for _ in op_shapes], [[] for _ in res_shapes], {}
    else:
        ol, rl, roles = labeler(node, eqn.params, op_shapes, res_shapes)
    node.operand_labels, node.result_labels, node.roles = ol, rl, roles




def _kind(name: str) -> str:
    if name == "dot_general":
        return "dot"
    if name == "conv_general_dilated":
        return "conv"
    if name in (ATTENTION_NAME, ATTENTION_FWD_NAME):
        return "attention"
    if name == ATTENTION_BWD_NAME:
        return "attention_bwd"
    if name in ELEMENTWISE:
        return "elementwise"
    if name in REDUCE:
        return "reduce"
    if name == "broadcast_in_dim":
        return "broadcast"
    if name == "transpose":
        return "transpose"
    if name == "reshape":
        return "reshape"
    if name == "squeeze":
        return "squeeze"
    if name in SLICE:
        return "slice"
    if name == "pad":
        return "pad"
    if name == "concatenate":
        return "concat"
    if name == "stack":
        return "stack"
    if name in CUMULATIVE:
        return "cumulative"
    if name == "sort":
        return "sort"
    if name in GATHER:
        return "gather"
    if name in SCATTER:
        return "scatter"
    if name in SOURCE:
        return "source"
    if name in OPAQUE or name.startswith("pallas") or "custom" in name:
        return "opaque"
    return "unknown"


def _flops(node: Node, eqn, op_shapes, res_shapes) -> float:
    kind = node.kind
    out_elems = sum(math.prod(s) for s in res_shapes)
    if kind == "dot":
        (lc, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(op_shapes[0][d] for d in lc)
        return 2.0 * math.prod(res_shapes[0]) * k
    if kind == "conv":
        dn = eqn.params["dimension_numbers"]
        rs = op_shapes[1]
        per_out = math.prod(rs[d] for d in dn.rhs_spec[1:])   # in-features/groups x kernel
        return 2.0 * math.prod(res_shapes[0]) * per_out
    if kind == "attention":
        b, h, s, d = op_shapes[0]
        t = op_shapes[1][2]
        return 4.0 * b * h * s * t * d
    if kind == "attention_bwd":
        b, h, s, d = op_shapes[0]
        t = op_shapes[1][2]
        return ATTENTION_BWD_FLOPS_RATIO * 4.0 * b * h * s * t * d
    if kind in ("reduce", "cumulative"):
        return float(math.prod(op_shapes[0])) if op_shapes else 0.0
    if kind == "opaque":
        ce = eqn.params.get("cost_estimate")
        if ce is not None and getattr(ce, "flops", None) is not None:
            return float(ce.flops)
        inner = eqn.params.get("jaxpr")
        if inner is not None:   # shard_map: the body's flops (per shard) times the shards
            mesh = eqn.params.get("mesh")
            shards = int(getattr(mesh, "size", 1) or 1)
            return _inner_flops(getattr(inner, "jaxpr", inner)) * shards
        return 0.0
    if kind in ("elementwise",):
        return float(out_elems)
    return 0.0


def _inner_flops(jaxpr) -> float:
    """FLOPs of every eqn of a (sub-)jaxpr, recursing into calls and loops (scan: times length)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        sub = sub_jaxpr(eqn)
        if sub is not None:
            mult = int(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1
            total += mult * _inner_flops(getattr(sub, "jaxpr", sub))
            continue
        shapes_in = [list(getattr(v.aval, "shape", ())) for v in eqn.invars]
        shapes_out = [list(getattr(v.aval, "shape", ())) for v in eqn.outvars]
        n = Node("", eqn.primitive.name, _kind(eqn.primitive.name), [], [], 0.0, 0.0)
        try:
            total += _flops(n, eqn, shapes_in, shapes_out)
        except Exception:  # an inner op we cannot count adds nothing (kept as the opaque node)
            pass
    return total


# ---------------------------------------------------------------------------------------------
# builder

class _Builder:
    def __init__(self, patterns: Patterns | None = None):
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.unknown: list[str] = []
        self._n = 0
        self.pat = patterns or Patterns({}, frozenset(), [])
        self.needed = self.pat.needed
        self.captured: dict[tuple[str, int], str] = {}   # (eqn key, operand) -> tensor id
        self.notes: list[str] = []
        self.kernels: list[str] = []    # direct pallas_call lines for ``warnings``

    def new(self, aval, kind, scope="", **kw) -> str:
        tid = f"t{self._n}"
        self._n += 1
        shape = [int(d) for d in getattr(aval, "shape", ())]
        dtype = _dtype_str(getattr(aval, "dtype", np.float32))
        self.tensors[tid] = Tensor(tid, shape, dtype, _nbytes(shape, dtype), kind, scope=scope, **kw)
        return tid

    def operand(self, env, v, scope) -> str:
        if isinstance(v, Literal):
            val = v.val
            try:
                fval = float(np.asarray(val).reshape(-1)[0]) if np.asarray(val).size == 1 else None
            except Exception:
                fval = None
            return self.new(v.aval, "literal", scope, value=fval)
        if v not in env:  # a const var of a closed jaxpr without a binding
            env[v] = self.new(v.aval, "const", scope)
        if env[v] is None:
            raise IRError("internal: a value inside a recognised attention is used outside it")
        return env[v]

    def maybe(self, env, v, scope) -> str | None:
        """operand(), or None for a value inside a recognised attention (only passed along)."""
        if not isinstance(v, Literal) and v in env and env[v] is None:
            return None
        return self.operand(env, v, scope)

    def run(self, jaxpr, env, prefix="", repeat=1, scope=""):
        consts = getattr(jaxpr, "consts", None)
        j = getattr(jaxpr, "jaxpr", jaxpr)
        if consts is not None:
            for cv in j.constvars:
                env.setdefault(cv, self.new(cv.aval, "const", scope))
        for i, eqn in enumerate(j.eqns):
            key = f"{prefix}{i}"
            name = eqn.primitive.name
            if name in INLINE_PRIMITIVES and sub_jaxpr(eqn) is not None:
                inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr", eqn.params.get("fun_jaxpr")))
                ij = getattr(inner, "jaxpr", inner)
                ienv = {}
                ops = [self.maybe(env, v, scope) for v in eqn.invars]
                for iv, t in zip(ij.invars, ops[len(ops) - len(ij.invars):]):
                    ienv[iv] = t
                self.run(inner, ienv, key + ".", repeat, scope)
                for ov, iv in zip(eqn.outvars, ij.outvars):
                    env[ov] = self.maybe(ienv, iv, scope)
            elif name == "scan":
                self._scan(eqn, env, key, repeat, scope)
            elif name == "while":
                self._while(eqn, env, key, repeat, scope)
            else:
                self._leaf(eqn, env, key, repeat, scope)

    def _scan(self, eqn, env, key, repeat, scope):
        p = eqn.params
        body = p["jaxpr"]
        bj = body.jaxpr
        nc, ncar = int(p["num_consts"]), int(p["num_carry"])
        length = int(p["length"])
        ops = [self.operand(env, v, scope) for v in eqn.invars]
        benv = {}
        carry_ids = []
        for k, (bv, outer) in enumerate(zip(bj.invars, ops)):
            kind = "scan_const" if k < nc else ("scan_carry" if k < nc + ncar else "scan_xs")
            benv[bv] = self.new(bv.aval, kind, key, outer=outer)
            if kind == "scan_carry":
                carry_ids.append(benv[bv])
        for t in benv.values():
            self.tensors[t].repeat, self.tensors[t].trip = repeat * length, length
        self.run(body, benv, key + ".", repeat * length, key)
        bouts = [self.operand(benv, v, key) for v in bj.outvars]
        for k, cid in enumerate(carry_ids):
            self.tensors[cid].loop_back = bouts[k]
        for k, ov in enumerate(eqn.outvars):
            kind = "scan_carry_out" if k < ncar else "scan_ys"
            env[ov] = self.new(ov.aval, kind, scope, inner=bouts[k])

    def _while(self, eqn, env, key, repeat, scope):
        p = eqn.params
        body = p["body_jaxpr"]
        bj = body.jaxpr
        cn, bn = int(p["cond_nconsts"]), int(p["body_nconsts"])
        ops = [self.operand(env, v, scope) for v in eqn.invars]
        body_ops = ops[cn:]
        benv = {}
        carry_ids = []
        for k, (bv, outer) in enumerate(zip(bj.invars, body_ops)):
            kind = "scan_const" if k < bn else "scan_carry"
            benv[bv] = self.new(bv.aval, kind, key, outer=outer)
            if kind == "scan_carry":
                carry_ids.append(benv[bv])
        for t in benv.values():
            self.tensors[t].repeat = repeat
        self.run(body, benv, key + ".", repeat, key)
        bouts = [self.operand(benv, v, key) for v in bj.outvars]
        for k, cid in enumerate(carry_ids):
            self.tensors[cid].loop_back = bouts[k]
        for k, ov in enumerate(eqn.outvars):
            env[ov] = self.new(ov.aval, "scan_carry_out", scope, inner=bouts[k])

    def _pattern(self, eqn, env, key, repeat, scope):
        """The attention node of a recognised region, at its last eqn (module docstring)."""
        m = self.pat.matches[key]
        node = _pattern_node(self, eqn, key, m, repeat, scope)
        for ov in eqn.outvars:       # a kernel's other results: its scratch, unused
            env[ov] = None
        tid = self.new(eqn.outvars[m.out_index].aval, "node", scope, producer=key)
        env[eqn.outvars[m.out_index]] = tid
        node.results.append(tid)
        node.bytes = float(sum(self.tensors[t].bytes for t in node.operands + node.results))
        node.name_stack, node.source = _source(eqn)
        b_, h_, s_, t_, d_ = m.shape
        self.notes.append(f"attention {key} ({m.source or node.source}): recognised, q "
                          f"{self.tensors[node.operands[0]].shape} read as batch {b_}, heads {h_}, "
                          f"sequence {s_} (keys {t_}), head dim {d_}, scale {m.scale:.4g}"
                          f"{', key mask' if m.mask else ''}"
                          f"{'; guessed: ' + '; '.join(m.guesses) if m.guesses else ''}")
        self.nodes.append(node)

    def _hint(self, eqn, env, scope):
        """An identity that names dims: its result is its operand's tensor (module docstring)."""
        (tid,) = [self.operand(env, v, scope) for v in eqn.invars]
        t = self.tensors[tid]
        if t.names is None and t.kind != "literal":
            t.names = list(eqn.params["names"])
        env[eqn.outvars[0]] = tid

    def _checkpoint_name(self, eqn, env, scope):
        """``checkpoint_name``: its result is its operand's tensor, tagged (module docstring)."""
        (tid,) = [self.operand(env, v, scope) for v in eqn.invars]
        t = self.tensors[tid]
        if t.checkpoint is None and t.kind != "literal":
            t.checkpoint = str(eqn.params["name"])
        env[eqn.outvars[0]] = tid

    def _leaf(self, eqn, env, key, repeat, scope):
        name = eqn.primitive.name
        if name == HINT_NAME:
            return self._hint(eqn, env, scope)
        if name == CHECKPOINT_NAME and len(eqn.invars) == 1 and "name" in eqn.params:
            return self._checkpoint_name(eqn, env, scope)
        if key in self.pat.skip or key in self.pat.matches:
            for k in range(len(eqn.invars)):
                if (key, k) in self.needed:
                    self.captured[(key, k)] = self.operand(env, eqn.invars[k], scope)
            if key in self.pat.skip:
                for ov in eqn.outvars:
                    env[ov] = None
                return None
            return self._pattern(eqn, env, key, repeat, scope)
        kind = _kind(name)
        ops = [self.operand(env, v, scope) for v in eqn.invars]
        node = Node(key=key, primitive=name, kind=kind, operands=ops, results=[], flops=0.0,
                    bytes=0.0, repeat=repeat, scope=scope)
        for ov in eqn.outvars:
            tid = self.new(ov.aval, "node", scope, producer=key)
            env[ov] = tid
            node.results.append(tid)
        op_shapes = [self.tensors[t].shape for t in ops]
        res_shapes = [self.tensors[t].shape for t in node.results]
        if kind in ("attention", "attention_bwd"):
            node.params["scale"] = float(eqn.params["scale"])
            node.params["mask"] = len(ops) > (3 if kind == "attention" else 6)
        else:
            for k, v in eqn.params.items():
                if k in ("jaxpr", "call_jaxpr", "body_jaxpr", "cond_jaxpr", "kernel"):
                    continue
                try:
                    node.params[k] = _json_param(v)
                except Exception:
                    node.params[k] = "?"
        try:
            _labels(node, eqn, op_shapes, res_shapes)
        except Exception as e:  # a known primitive in a form we did not expect: keep it, replicated
            self.unknown.append(f"{key} {name} (dim roles failed: {e})")
            node.kind = "unknown"
            node.operand_labels, node.result_labels, node.roles = [], [], {}
        node.flops = _flops(node, eqn, op_shapes, res_shapes)
        node.bytes = float(sum(self.tensors[t].bytes for t in ops if self.tensors[t].kind != "literal")
                           + sum(self.tensors[t].bytes for t in node.results))
        if kind == "unknown" and not any(u.startswith(f"{key} ") for u in self.unknown):
            self.unknown.append(f"{key} {name}")
        node.name_stack, node.source = _source(eqn)
        if name == "pallas_call":
            self.kernels.append(f"{name} {node.params.get('name', '?')} at {key}"
                                f"{' (' + node.source + ')' if node.source else ''}: a direct kernel "
                                "call is kept as one replicated op, not planned as attention")
        self.nodes.append(node)


_ROLE = {"b": "batch", "h": "heads", "s": "q_seq", "t": "kv_seq", "d": "head_dim"}
_NAME = {"b": "batch", "h": "heads", "s": "seq", "t": "seq", "d": "head_dim"}


def _group_labels(groups: list[list[int]], letters: str, rank: int, k: int) -> tuple[list[str], dict]:
    """Labels of an operand's dims from its canonical groups (module docstring)."""
    labels = [""] * rank
    roles: dict[str, str] = {}
    for g, letter in zip(groups, letters):
        for n, d in enumerate(g):
            lab = letter if n == 0 else f"{letter}{n}"
            labels[d] = lab
            roles[lab] = _ROLE.get(letter, "fused") if n == 0 else "fused"
    for d in range(rank):
        if not labels[d]:
            labels[d] = f"u{k}_{d}"   # operand k's dim outside every group (a mask's broadcast dims)
            roles[labels[d]] = "fused"
    return labels, roles


def _pattern_node(b: "_Builder", eqn, key: str, m: AttentionMatch, repeat: int, scope: str) -> Node:
    ops = [b.captured[m.q], b.captured[m.k], b.captured[m.v]]
    groups = [(m.q_groups, "bhsd"), (m.k_groups, "bhtd"), (m.v_groups, "bhtd")]
    if m.mask is not None:
        ops.append(b.captured[m.mask])
        groups.append((m.mask_groups, "bt"))
    node = Node(key=key, primitive="attention_pattern", kind="attention", operands=ops, results=[],
                flops=m.flops, bytes=0.0, repeat=repeat, scope=scope)
    roles: dict[str, str] = {}
    for k, (tid, (g, letters)) in enumerate(zip(ops, groups)):
        labs, r = _group_labels(g, letters, len(b.tensors[tid].shape), k)
        node.operand_labels.append(labs)
        roles.update(r)
    labs, r = _group_labels(m.out_groups, "bhsd", len(m.out_shape), 9)
    node.result_labels = [labs]
    roles.update(r)
    node.roles = {lab: roles[lab] for lab in sorted(roles)}
    for tid, labs in list(zip(ops, node.operand_labels))[:3]:   # names read, not hinted
        t = b.tensors[tid]
        if t.names is None and t.kind != "literal":
            t.names = [_NAME.get(lab) for lab in labs]
    node.params = {"scale": m.scale, "pattern": "splash kernel" if m.form == "splash" else
                   "dot_general-softmax-dot_general",
                   "shape": list(m.shape), "mask": m.mask is not None, "region": list(m.keys),
                   "guesses": list(m.guesses)}
    return node


def _arg_names(fn, n: int) -> list[str]:
    """Names of the first n positional parameters of fn (else "0", "1", ...)."""
    import inspect
    try:
        ps = [q.name for q in inspect.signature(fn).parameters.values()
              if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        ps = []
    return [ps[i] if i < len(ps) else str(i) for i in range(n)]


def state_aliases(abstract_args: tuple, out_shape) -> list[list[int]]:
    """[output leaf, input leaf] pairs: each element of a tuple/list output that matches a
    positional argument of two or more leaves (same pytree structure, shapes and dtypes; each
    argument used once). A single array is never taken for state: a block's output shaped like
    its input is not its next input."""
    if not isinstance(out_shape, (tuple, list)):
        return []

    def sig(tree):
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        return treedef, tuple((tuple(x.shape), np.dtype(x.dtype).name) for x in leaves), len(leaves)

    args = [sig(a) for a in abstract_args]
    starts = np.cumsum([0] + [a[2] for a in args]).tolist()
    out, used, pos = [], set(), 0
    for o in out_shape:
        so = sig(o)
        for i, sa in enumerate(args):
            if i not in used and so[2] > 1 and so[:2] == sa[:2]:
                used.add(i)
                out += [[pos + k, starts[i] + k] for k in range(so[2])]
                break
        pos += so[2]
    return out


def state_arguments(abstract_args: tuple, out_shape) -> tuple[int, ...]:
    """Positional arguments fed back as state (``state_aliases``' input side, by argument):
    the ones a compile can donate, so that its memory analysis counts the state once."""
    leaves = [len(jax.tree_util.tree_leaves(a)) for a in abstract_args]
    starts = np.cumsum([0] + leaves).tolist()
    taken = {i for _, i in state_aliases(tuple(abstract_args), out_shape)}
    return tuple(i for i, n in enumerate(leaves)
                 if n and all(starts[i] + k in taken for k in range(n)))


def build_ir(fn, *abstract_args) -> ProgramIR:
    """Trace `fn(*abstract_args)` (pytrees of ShapeDtypeStruct or arrays) into a ProgramIR."""
    try:
        closed = jax.make_jaxpr(fn)(*abstract_args)
    except Exception as e:
        raise IRError(f"could not trace the function: {type(e).__name__}: {str(e).splitlines()[0]} "
                      f"(check the abstract inputs' shapes and dtypes)") from e
    patterns = find_attention(closed)
    b = _Builder(patterns)
    leaves = jax.tree_util.tree_flatten_with_path(tuple(abstract_args))[0]
    j = closed.jaxpr
    if len(leaves) != len(j.invars):
        raise IRError(f"traced {len(j.invars)} inputs but the arguments have {len(leaves)} leaves")
    arg_names = _arg_names(fn, len(abstract_args))
    env = {}
    inputs = []
    for idx, ((path, _), v) in enumerate(zip(leaves, j.invars)):
        pth = _path_str(path)
        head, _, rest = pth.partition("/")
        if head.isdigit() and int(head) < len(arg_names):
            pth = arg_names[int(head)] + ("/" + rest if rest else "")
        tid = b.new(v.aval, "input", input_index=idx, path=pth)
        env[v] = tid
        inputs.append(tid)
    for cv in j.constvars:
        env[cv] = b.new(cv.aval, "const")
    b.run(j, env)
    outputs = [b.operand(env, v, "") for v in j.outvars]
    out_shape = jax.eval_shape(fn, *abstract_args)
    out_paths = [_path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(out_shape)[0]]
    for tid, pth in zip(outputs, out_paths):
        if not b.tensors[tid].path:
            b.tensors[tid].path = pth
    # the keys must be exactly the shared walk's keys, hints and checkpoint names aside (the
    # realizer relies on them)
    walk_keys = [w.key for w in walk(closed.jaxpr) if w.eqn.primitive.name not in ALIAS_PRIMITIVES
                 and w.key not in patterns.skip]
    ir_keys = [n.key for n in b.nodes]
    if walk_keys != ir_keys:
        raise IRError("internal: IR node keys differ from the shared walk's keys")
    warns = list(patterns.warnings) + list(dict.fromkeys(b.kernels))
    for w in warns:
        _warnings.warn(w, stacklevel=2)
    if b.unknown:
        warns.append(f"{len(b.unknown)} op(s) the IR does not understand are kept replicated-only: "
                     + ", ".join(b.unknown))
        _warnings.warn(warns[-1], stacklevel=2)
    return ProgramIR(nodes=b.nodes, tensors=b.tensors, inputs=inputs, outputs=outputs,
                     output_paths=out_paths, warnings=warns, notes=b.notes,
                     state_aliases=state_aliases(tuple(abstract_args), out_shape))
