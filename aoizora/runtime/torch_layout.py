"""Run a captured ATen program laid out by a plan's Layout, with DTensor.

``LayoutRunner(ep, layout, mesh)`` runs the functional ``ExportedProgram`` (from
``extract.frontends.torch.capture``) node by node on DTensors over ``mesh`` (a ``DeviceMesh``
whose dims are the layout's mesh axes, in order):

- every input (parameters, buffers, then the user inputs) is laid out by ``layout.in_specs``
  (``distribute_tensor`` with ``src_data_rank=None``: every rank slices its shard of the same
  full tensor, nothing is sent);
- every op runs as DTensor propagates it; the output of each dot, conv and attention the layout
  names (``layout.node_specs``, keyed by IR node key: the FX node name, ``linear_5`` or
  ``linear_5.dot``) is redistributed to its spec, as JAX's sharding constraints do; a linear
  whose operands are whole on an axis its spec splits the output on slices an operand there
  first (a local slice: no collective, 1/n of the compute);
- each ``scaled_dot_product_attention`` runs as the layout's attention says: q laid out
  [batch, heads, seq, -] on its axes, k and v on batch and heads with the whole key sequence
  (context parallel with gathered keys; Ulysses when the heads take the axes the surrounding
  activations split the sequence on: DTensor turns that redistribution into an all-to-all),
  then the local attention on each shard. A layout that passes keys in a ring is refused
  (``TorchLayoutError``): the runner has no ring attention;
- an op DTensor has no sharding rule for runs on the gathered tensors (replicated), and is named
  in ``fallbacks``.

The same runner gives the evidence (meta tensors, a fake process group, a mesh of device type
"cuda" so DTensor issues what it issues on GPUs: ``aoizora.runtime.torch_evidence``) and the
numbers (real tensors under gloo, ``aoizora.runtime.torch``). With a ``trace`` list it appends
each op's compute at its shard shapes (``IssuedCompute``) in program order and tracks the peak
of live local bytes.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
import torch.fx
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from aoizora.extract.frontends.torch.ops import SKIPPED, op_name
from aoizora.extract.frontends.torch.comm_evidence import IssuedCompute
from aoizora.formulation.layout import Layout, axes_of

DOTS = frozenset("linear mm bmm addmm baddbmm matmul".split())
CONVS = frozenset("convolution conv1d conv2d conv3d".split())


class TorchLayoutError(ValueError):
    """The layout cannot be run by DTensor (the message says which op and why)."""


def placements(spec, mesh_axes: dict[str, int]) -> list:
    """DTensor placements (one per mesh dim) of a PartitionSpec-style spec.

    Raises:
        TorchLayoutError: a dim split over axes out of mesh order (DTensor shards major first
            in mesh order), or an axis the mesh does not have."""
    names = list(mesh_axes)
    out = [Replicate() for _ in names]
    for d, entry in enumerate(spec or ()):
        axes = axes_of(entry)
        for a in axes:
            if a not in names:
                raise TorchLayoutError(f"mesh axis {a!r} is not in the mesh {mesh_axes}")
            out[names.index(a)] = Shard(d)
        idx = [names.index(a) for a in axes]
        if idx != sorted(idx):
            raise TorchLayoutError(f"dim {d} split over {axes}: DTensor takes the axes in mesh "
                                   f"order only")
    return out


def _local_nbytes(x) -> int:
    if isinstance(x, DTensor):
        x = x._local_tensor
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_local_nbytes(v) for v in x)
    return 0


def _storages(x) -> dict[int, int]:
    """{storage: bytes} of the local tensors in ``x`` (a view shares its base's storage)."""
    if isinstance(x, DTensor):
        x = x._local_tensor
    if isinstance(x, torch.Tensor):
        st = x.untyped_storage()
        return {st._cdata: st.nbytes()}
    out: dict[int, int] = {}
    if isinstance(x, (list, tuple)):
        for v in x:
            out.update(_storages(v))
    return out


def _module(fx) -> str:
    stack = fx.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _local_shape(x) -> list[int]:
    return list((x._local_tensor if isinstance(x, DTensor) else x).shape)


class LayoutRunner:
    """See the module docstring. ``device``: where ops that make new tensors put them (the
    captured graph names the capture's device, often meta); ``trace``: a list to append each
    op's ``IssuedCompute`` to (None: not recorded); ``attention_seconds``: (b, h, s, t, d) ->
    seconds, the kernel model for attention compute in the trace."""

    def __init__(self, ep, layout: Layout, mesh, *, device: str | torch.device = "cpu",
                 trace: list | None = None,
                 attention_seconds: Callable[..., float] | None = None):
        self.ep, self.layout, self.mesh = ep, layout, mesh
        self.device = torch.device(device)
        self.trace = trace
        self.attention_seconds = attention_seconds
        self.fallbacks: list[str] = []
        self.current = ""                 # the FX node being run (named on its collectives)
        self.peak_live_bytes = 0          # see ``run``
        self.peak_node = ""               # the op at which it peaks
        self.argument_bytes = 0
        self._transient: list = []        # what the op being run holds besides its output
        self.specs = {k.split(".")[0]: v for k, v in layout.node_specs.items()}
        if any(a.kv == "ring" for a in layout.attention.values()):
            raise TorchLayoutError("this layout passes attention keys/values in a ring; the "
                                   "torch runtime gathers them (plan with kv='gather')")

    # -- inputs ----------------------------------------------------------------------------------
    def _inputs(self, flat: list[torch.Tensor]) -> dict[str, Any]:
        specs = self.ep.graph_signature.input_specs
        if len(flat) != len(specs):
            raise TorchLayoutError(f"{len(flat)} inputs given, the program takes {len(specs)}")
        env = {}
        in_specs = list(self.layout.in_specs) + [None] * (len(specs) - len(self.layout.in_specs))
        for spec, x, s in zip(specs, flat, in_specs):
            if isinstance(x, torch.Tensor):
                pl = placements(s, self.layout.mesh_axes) if s is not None else \
                    [Replicate()] * self.mesh.ndim
                x = distribute_tensor(x, self.mesh, pl, src_data_rank=None)
                self.argument_bytes += _local_nbytes(x)
            env[spec.arg.name] = x
        return env

    def _value(self, a, env):
        if isinstance(a, torch.fx.Node):
            return env[a.name]
        if isinstance(a, torch.device):
            return self.device
        if isinstance(a, (list, tuple)):
            return type(a)(self._value(v, env) for v in a)
        return a

    def _wrap(self, x):
        """A plain tensor an op made (arange, a constant) as a replicated DTensor."""
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
            return DTensor.from_local(x, self.mesh, [Replicate()] * self.mesh.ndim,
                                      run_check=False)
        if isinstance(x, (list, tuple)):
            return type(x)(self._wrap(v) for v in x)
        return x

    # -- ops -------------------------------------------------------------------------------------
    def _attention(self, fx, args, kwargs):
        q, k, v = args[:3]
        al = self.layout.attention_for(fx.name)
        qspec = (al.batch or None, al.heads or None, al.seq or None, None)
        kvspec = (al.batch or None, al.heads or None, None, None)
        q = q.redistribute(self.mesh, placements(qspec, self.layout.mesh_axes))
        kvpl = placements(kvspec, self.layout.mesh_axes)
        k, v = k.redistribute(self.mesh, kvpl), v.redistribute(self.mesh, kvpl)
        rest = {kk: vv for kk, vv in kwargs.items() if kk in ("scale", "is_causal")}
        local = F.scaled_dot_product_attention(q.to_local(), k.to_local(), v.to_local(), **rest)
        b, h, s = local.shape[:3]
        self._transient += [q, k, v, 4 * b * h * s]     # + the flash kernel's logsumexp
        self._record_attention(fx.name, q, k)
        return DTensor.from_local(local, self.mesh, q.placements, run_check=False,
                                  shape=q.shape, stride=q.stride())

    def _record_attention(self, name, q, k) -> None:
        if self.trace is None:
            return
        b, h, s, d = _local_shape(q)
        t = _local_shape(k)[2]
        secs = self.attention_seconds(b, h, s, t, d) if self.attention_seconds else None
        self.trace.append(IssuedCompute(name, "attention", 4.0 * b * h * s * t * d,
                                        float(2 * q.to_local().element_size() * b * h * d
                                              * (s + t)), secs, "flash-attention model"))

    def _record(self, fx, name, args, out) -> None:
        if self.trace is None:
            return
        flops = 0.0
        if name in DOTS or name in CONVS:
            lhs = args[1] if name in ("addmm", "baddbmm") else args[0]
            w = args[2] if name in ("addmm", "baddbmm") else args[1]
            ls, ws = _local_shape(lhs), _local_shape(w)
            k = math.prod(ws[1:]) if name in CONVS else (
                ls[-1] if name != "mm" and name != "addmm" else ls[1])
            flops = 2.0 * math.prod(_local_shape(out)) * k
            kind = "dot"
        else:
            kind = "elementwise"
            flops = float(math.prod(_local_shape(out))) if isinstance(out, torch.Tensor) else 0.0
        nbytes = _local_nbytes([a for a in args if isinstance(a, torch.Tensor)]) + \
            _local_nbytes(out)
        self.trace.append(IssuedCompute(fx.name, kind, flops, float(nbytes)))

    def _slice_first(self, x, w, want):
        """(x, w, x's placements) with a whole operand sliced where the output is wanted split
        and would otherwise be computed whole on that mesh dim (x and w both whole there): x on
        the wanted leading dim, or w on its rows (N) for the wanted last dim. Replicate ->
        Shard is a local slice (no collective), and each shard then computes 1/n of the output
        instead of all of it before the node's redistribution slices it."""
        r = x.ndim
        xpl, wpl = list(x.placements), list(w.placements)
        nx, nw = list(xpl), list(wpl)
        for i, (xp, wp, op) in enumerate(zip(xpl, wpl, want)):
            if not (isinstance(xp, Replicate) and isinstance(wp, Replicate)
                    and isinstance(op, Shard)):
                continue
            if op.dim < r - 1:
                nx[i] = Shard(op.dim)
            elif op.dim == r - 1:
                nw[i] = Shard(0)
        if nx != xpl:
            x = x.redistribute(self.mesh, nx)
        if nw != wpl:
            w = w.redistribute(self.mesh, nw)
        return x, w, nx

    def _linear(self, x, w, want=None):
        """x @ w.T on each shard, laid out per mesh dim from the operands' placements (DTensor's
        own rule flattens x's leading dims, which it refuses when two of them are split): x split
        on a leading dim -> the output is; w split on its rows (N) -> the output's last dim is;
        both split on K -> a partial sum (reduced by the node's redistribution), unless the
        node's spec (``want``) splits a leading dim on that axis: then x is moved there first
        (an all-to-all, as Ulysses returns attention outputs); w split on N where x's leading
        dim takes the same axis, or on K where x is not -> w gathered. Where x and w are both
        whole on a mesh dim the node's spec splits the output on, the operand is sliced first
        (``_slice_first``: x on that leading dim, w on N), so the output is not computed whole."""
        r = x.ndim
        xpl = list(x.placements)
        if want is not None:      # x split on K where the output wants a leading dim split on
            moved = [Shard(wp.dim) if isinstance(xp, Shard) and xp.dim == r - 1 and
                     isinstance(wp, Shard) and wp.dim < r - 1 else xp
                     for xp, wp in zip(xpl, want)]
            if moved != xpl:      # that axis: one all-to-all of x, not a partial sum of the output
                x = x.redistribute(self.mesh, moved)
                xpl = moved
            x, w, xpl = self._slice_first(x, w, want)
        wpl, opl = list(w.placements), []
        for i, (px, pw) in enumerate(zip(xpl, wpl)):
            xs = px.dim if isinstance(px, Shard) else None
            ws = pw.dim if isinstance(pw, Shard) else None
            if xs == r - 1:
                wpl[i] = Shard(1)
                opl.append(Partial())
            elif xs is not None:
                wpl[i] = Replicate()
                opl.append(Shard(xs))
            elif ws == 0:
                opl.append(Shard(r - 1))
            else:
                wpl[i] = Replicate()
                opl.append(Replicate())
        w = w.redistribute(self.mesh, wpl)
        self._transient += [x, w]
        local = F.linear(x.to_local(), w.to_local())
        shape = tuple(x.shape[:-1]) + (w.shape[0],)
        return DTensor.from_local(local, self.mesh, opl, run_check=False, shape=shape,
                                  stride=torch.empty(shape, device="meta").stride())

    def _conv(self, args):
        """A convolution (groups 1) on each shard: per mesh dim, x split on its batch -> the
        output is; w split on its output channels (x not split) -> the output's channels are;
        anything else gathered first (DTensor's own rule computes wrong local shapes on meta
        tensors for a 3-d convolution: 24 channels of a 1536-channel output split 8 ways)."""
        x, w, b = args[0], args[1], args[2] if len(args) > 2 else None
        stride, padding, dilation = (list(args[3:6]) + [1, 0, 1][len(args[3:6]):])[:3]
        xpl, wpl, opl = [], [], []
        for px, pw in zip(x.placements, w.placements):
            if isinstance(px, Shard) and px.dim == 0:
                xpl.append(px), wpl.append(Replicate()), opl.append(Shard(0))
            elif isinstance(pw, Shard) and pw.dim == 0:
                xpl.append(Replicate()), wpl.append(pw), opl.append(Shard(1))
            else:
                xpl.append(Replicate()), wpl.append(Replicate()), opl.append(Replicate())
        x, w = x.redistribute(self.mesh, xpl), w.redistribute(self.mesh, wpl)
        self._transient += [x, w]
        bl = None
        if isinstance(b, DTensor):
            bl = b.redistribute(self.mesh, [Shard(0) if isinstance(p, Shard) and p.dim == 1
                                            else Replicate() for p in opl]).to_local()
        conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.ndim]
        local = conv(x.to_local(), w.to_local(), bl, stride, padding, dilation)
        ref = conv(torch.empty(x.shape, device="meta", dtype=local.dtype),
                   torch.empty(w.shape, device="meta", dtype=local.dtype), None, stride,
                   padding, dilation)
        return DTensor.from_local(local, self.mesh, opl, run_check=False, shape=ref.shape,
                                  stride=ref.stride())

    def _norm(self, name, args):
        """rms_norm / layer_norm of x split on a normalized dim: each shard's sums, all-reduced
        over the axes that split those dims (a [.., 1] statistic: what the ILP's partial
        reduction prices), then normalized on the shard (DTensor refuses the in-place add of
        its own decomposition there and would gather all of x). None when x is not split on
        the normalized dims (DTensor's own op runs)."""
        x, shape = args[0], list(args[1])
        k, r = len(shape), args[0].ndim
        split = [i for i, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim >= r - k]
        if not split:
            return None
        w = args[2] if len(args) > 2 else None
        b = args[3] if name == "layer_norm" and len(args) > 3 else None
        eps = args[-1] if isinstance(args[-1], float) else 1e-5
        dims = tuple(range(r - k, r))
        xl = x.to_local().float()
        stat_pl = [Partial() if i in split else (p if isinstance(p, Shard) else Replicate())
                   for i, p in enumerate(x.placements)]
        stat_shape = tuple(x.shape[:r - k]) + (1,) * k
        parts = [xl.pow(2).sum(dims, keepdim=True)]
        if name == "layer_norm":
            parts.insert(0, xl.sum(dims, keepdim=True))
        full = [DTensor.from_local(t, self.mesh, stat_pl, run_check=False, shape=stat_shape,
                                   stride=torch.empty(stat_shape, device="meta").stride())
                .redistribute(self.mesh, [Replicate() if isinstance(p, Partial) else p
                                          for p in stat_pl]).to_local() for t in parts]
        n = math.prod(shape)
        if name == "layer_norm":
            mean = full[0] / n
            y = (xl - mean) * torch.rsqrt(full[1] / n - mean * mean + eps)
        else:
            y = xl * torch.rsqrt(full[0] / n + eps)
        wpl = [Shard(p.dim - (r - k)) if isinstance(p, Shard) and p.dim >= r - k else Replicate()
               for p in x.placements]
        for extra in (w, b):
            if isinstance(extra, DTensor):
                e = extra.redistribute(self.mesh, wpl).to_local()
                y = y * e if extra is w else y + e
        return DTensor.from_local(y.to(x.dtype), self.mesh, x.placements, run_check=False,
                                  shape=x.shape, stride=x.stride())

    def _call(self, fx, name, args, kwargs):
        if name == "scaled_dot_product_attention":
            return self._attention(fx, args, kwargs)
        if name == "linear" and all(isinstance(a, DTensor) for a in args[:2]):
            spec = self.specs.get(fx.name)
            want = None if spec is None else placements(spec, self.layout.mesh_axes)
            out = self._linear(args[0], args[1], want)
            self._record(fx, name, args, out)
            if spec is not None:
                out = out.redistribute(self.mesh, placements(spec, self.layout.mesh_axes))
            if len(args) > 2 and isinstance(args[2], DTensor):
                out = out + args[2]
            return out
        groups = args[8] if name == "convolution" else (args[6] if len(args) > 6 else 1)
        if name in CONVS and groups == 1 and all(isinstance(a, DTensor) for a in args[:2]) \
                and not (name == "convolution" and args[6]):      # not a transposed one
            out = self._conv(args)
            self._record(fx, name, args, out)
            spec = self.specs.get(fx.name)
            if spec is not None:
                out = out.redistribute(self.mesh, placements(spec, self.layout.mesh_axes))
            return out
        if name in ("rms_norm", "layer_norm") and isinstance(args[0], DTensor):
            out = self._norm(name, args)
            if out is not None:
                self._record(fx, name, args, out)
                return out
        if name == "copy":            # copy(dst, src): src's values in dst's dtype
            out = args[1].to(args[0].dtype)
            self._record(fx, name, args, out)
            return out
        try:
            out = fx.target(*args, **kwargs)
        except (NotImplementedError, RuntimeError, AssertionError) as e:
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:100]
            self.fallbacks.append(f"{fx.name} {name}: {why}")
            try:
                full = [a.full_tensor() if isinstance(a, DTensor) else a for a in args]
                kfull = {kk: (vv.full_tensor() if isinstance(vv, DTensor) else vv)
                         for kk, vv in kwargs.items()}
                out = fx.target(*full, **kfull)
            except (NotImplementedError, RuntimeError, AssertionError) as e2:
                raise TorchLayoutError(
                    f"{fx.name} ({name}, {_module(fx)}): DTensor cannot run it as laid out "
                    f"({why}), nor on the gathered inputs "
                    f"({(str(e2).strip().splitlines() or ['?'])[0][:80]})") from None
        out = self._wrap(out)
        self._record(fx, name, args, out)
        spec = self.specs.get(fx.name)
        if spec is not None and isinstance(out, DTensor):
            out = out.redistribute(self.mesh, placements(spec, self.layout.mesh_axes))
        return out

    def run(self, *flat_inputs: torch.Tensor) -> list:
        """The program's flattened outputs (DTensors) for its flattened inputs: parameters and
        buffers in ``ep.graph_signature`` order, then the user inputs.

        Also counts ``peak_live_bytes``, the per-device peak of activations a real run holds
        (on top of ``argument_bytes``, the local shards of the inputs), in program order:

        - a buffer is counted once, by its *local* storage (``untyped_storage().nbytes()`` of
          the DTensor's local tensor: the shard, not the global tensor): views (``view``,
          ``permute``, ``expand``, ``unbind``, ``getitem`` of a split, a ``type_as`` to the same
          dtype) share their input's storage and add nothing; views of an argument add nothing;
        - a buffer is live from the op that makes it to the last op that reads it or any view
          of it (an op's inputs and its output are live together); ``getitem`` reads its tuple,
          the checks the capture keeps (``SKIPPED``: ``_assert_tensor_metadata`` ...) read
          nothing; the program's outputs stay live to the end;
        - during an op, its transients count too: the operands it redistributes (the gathered
          keys and values of an attention, a gathered weight) and, for an attention, the flash
          kernel's working set -- its output plus a float32 logsumexp [b, h, s] per shard, never
          the [s, t] scores (``formulation.flash_attention``).

        So peak = max over ops of (sum of live local buffers + that op's transients); with a
        layout sharding every activation n ways it is about 1/n of the replicated one.

        Raises:
            TorchLayoutError: the inputs do not match the program, or the layout cannot run."""
        env = self._inputs(list(flat_inputs))
        nodes = list(self.ep.graph.nodes)
        arg_keys = set()
        for fx in nodes:
            if fx.op == "placeholder" and fx.name in env:
                arg_keys.update(_storages(env[fx.name]))
        # the last op (by position) that reads each node; the output node keeps its operands
        last: dict[str, int] = {}
        for i, fx in enumerate(nodes):
            if fx.op == "call_function" and op_name(fx.target) in SKIPPED:
                continue
            for a in fx.all_input_nodes:
                last[a.name] = len(nodes) if fx.op == "output" else i
        dies: dict[int, list[str]] = {}
        for name, i in last.items():
            dies.setdefault(i, []).append(name)
        held: dict[int, int] = {}          # storage -> how many live nodes hold it
        size: dict[int, int] = {}
        keys_of: dict[str, list[int]] = {}
        total = 0
        outputs: list = []
        for i, fx in enumerate(nodes):
            if fx.op == "output":
                outputs = [env[a.name] for a in torch.utils._pytree.tree_leaves(fx.args[0])
                           if isinstance(a, torch.fx.Node)]
                break
            if fx.op != "call_function":
                continue
            self._transient = []
            if fx.target is operator.getitem:
                env[fx.name] = env[fx.args[0].name][fx.args[1]]
            else:
                name = op_name(fx.target)
                if name in SKIPPED:
                    env[fx.name] = None
                    continue
                self.current = f"{fx.name} ({_module(fx)})"
                args = self._value(fx.args, env)
                kwargs = {k: self._value(v, env) for k, v in fx.kwargs.items()}
                env[fx.name] = self._call(fx, name, args, kwargs)
            keys = {k: n for k, n in _storages(env[fx.name]).items() if k not in arg_keys}
            keys_of[fx.name] = list(keys)
            for k, nb in keys.items():
                if held.get(k, 0) == 0:
                    size[k] = nb
                    total += nb
                held[k] = held.get(k, 0) + 1
            extra, scratch = 0, {}
            for t in self._transient:
                if isinstance(t, int):
                    extra += t
                else:
                    scratch.update({k: nb for k, nb in _storages(t).items()
                                    if k not in arg_keys and held.get(k, 0) == 0})
            extra += sum(scratch.values())
            if total + extra > self.peak_live_bytes:
                self.peak_live_bytes, self.peak_node = total + extra, self.current
            for name in dies.get(i, []) + ([fx.name] if fx.name not in last else []):
                for k in keys_of.pop(name, ()):
                    held[k] -= 1
                    if held[k] == 0:
                        total -= size[k]
        return outputs
