"""Today's expert configurations (``shared/facts/practice.md``) as Layouts: the baselines to beat.

``expert_layouts(model, workload, target)`` -> one :class:`Expert` per configuration, either with a
:class:`~aoizora.formulation.layout.Layout` or rejected with the reason. n = devices of the target.

- ``ulysses`` (xDiT / DeepSpeed-Ulysses): mesh ``sp=n``; activations sequence-split over sp;
  self-attention heads split over sp (all-to-all in and out); cross-attention queries stay
  sequence-split and attend to the whole text. Valid only when the heads divide n.
- ``context`` (maxdiffusion's default, ``ici_context_parallelism=-1``): mesh ``context=n``;
  activations and attention queries sequence-split; keys/values all-gathered.
- ``cfg2_context`` (maxdiffusion's recipe for 8 chips: data 2 x context 4): mesh
  ``data=2 x context=n/2``; the CFG pair (batch) on data, sequence on context, keys/values
  gathered; weights split on their embed dim over context (maxdiffusion: embed -> context).
- ``fsdp_sp`` (the Wan 2.1 repo): mesh ``sp=n``; every weight fully sharded over sp on its
  largest dim that divides (FSDP, all-gathered at use); activations sequence-split; self-attention
  Ulysses when the heads divide n, else a ring over all n (Wan repo: 1.3B on 8 = ring 8).
- ``tp_cfg`` (head / MLP tensor parallel x CFG): mesh ``cfg=2 x tp=n/2``; the CFG pair on cfg;
  heads and the MLP hidden split over tp (Megatron: q/k/v/fc1 column-split, o/fc2 row-split).
  Valid when the heads and the MLP width divide n/2.
- ``cfg2_ulysses`` (maxdiffusion's recipe with Ulysses inside context, "heads divisible by its
  degree"): mesh ``data=2 x context=n/2`` as ``cfg2_context`` (weights split on their embed dim
  over context), but the self-attention splits its heads over context (all-to-all in and out)
  instead of gathering keys/values. Valid when the heads divide n/2.
- ``usp`` (xDiT's unified sequence parallelism, Ulysses x ring, when the heads do not divide n):
  mesh ``ring=n/u x ulysses=u`` (xDiT: Ulysses groups the contiguous ranks, ring groups strided),
  u the largest Ulysses degree below n that divides the heads; activations sequence-split over
  both axes; self-attention heads over ulysses and keys/values in a ring over ring; weights
  replicated, as xDiT keeps them. Rejected when the heads divide n (that is ``ulysses``).
- ``dsp`` (Dynamic Sequence Parallelism, Open-Sora / VideoSys): only for spatial-temporal DiTs
  (``models.stdit``), whose experts ``models.stdit_experts`` builds (which of the above apply
  there and why); rejected for Wan and HunyuanVideo, whose tokens attend as one sequence.

The maxdiffusion configurations (``context``, ``cfg2_context``, ``cfg2_ulysses``) carry its
published libtpu options (``Layout.compiler_options``) and its splash tiles scaled to each
attention node's per-shard lengths (``kernels.recipes``); the others keep libtpu's defaults and
the automatic tiles (their authors publish none for TPU).

Mesh axes in ``jax.make_mesh`` order (``default_mesh``): that is the default device order a user
gets. Attention layouts are per attention node (keys of ``aoizora.extract.frontends.jax.jaxpr_walk``): the
video self-attention (HunyuanVideo's joint attention) takes the configuration's layout, the
cross-attention to the text keeps its queries split like the activations, and text-only
attention (HunyuanVideo's token refiner) splits only the batch.

A configuration whose weights alone (per device, under its in_specs) exceed the chip's HBM is
rejected with that reason (e.g. Wan 14B replicated for Ulysses on v5e: 26 GiB > 15.75 GiB);
whether the activations fit too is the compiler's verdict.

Padding: the video sequence is padded (as the Wan repo pads for sequence parallelism) to
``pad_multiple`` = 128 x (sequence degree) -- so every shard holds whole 128-token splash blocks
and the attention wrapper never pads again -- or 128 without a sequence split. The padded
program is ``Expert.fn``; its padding is part of every cost. The models mask the padded keys
(``primitives.attention``'s ``kv_mask``; STDiT3 per stage), so the padded program computes the
unpadded one on the real tokens; on TPU the mask reaches splash as segment ids, which mask
scores inside the key blocks and skip no block, so the padded blocks' work is still done and
priced (Q2's kernel model prices the kernel as before); the mask itself adds a little compiled
work (its segment ids; in a ring, one more small collective-permute per step).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.extract.targets import Target
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.models import registry, stdit_experts
from aoizora.models import workloads as W
from aoizora.kernels.attention_kernels import SPLASH_BLOCK
from aoizora.models.config import HunyuanConfig, WanConfig
from aoizora.kernels.primitives import FORWARD_ATTENTIONS, HINT
from aoizora.formulation.kernel_model import SCOPED_VMEM_BYTES
from aoizora.kernels.recipes import MAXDIFFUSION_OPTIONS, published_tiles

# the configurations that follow maxdiffusion's recipe: its libtpu options and splash tiles
MAXDIFFUSION = ("context", "cfg2_context", "cfg2_ulysses")
EXPERTS = ("ulysses", "context", "cfg2_context", "fsdp_sp", "tp_cfg", "cfg2_ulysses", "usp", "dsp")

# Layer roles by the param dict key that holds {"w", "b"} (both models' names).
_COLUMN = frozenset({"q", "k", "v", "qkv", "fc1", "linear1"})      # output dim = heads / mlp
_ROW = frozenset({"o", "proj", "fc2", "linear2"})                  # input dim = heads / mlp
_HEAD_NORMS = frozenset({"norm_q", "norm_k"})                       # Wan: RMS over the full dim


@dataclasses.dataclass
class Expert:
    """One expert configuration for a model, workload and target. Unpacks as (name, layout, reason).

    layout: None when rejected; reason: why rejected, or a one-line description when valid.
    fn, args: the program the layout is for (``denoise_step(model, pad_multiple)`` and its
    abstract inputs) -- realize exactly this pair.
    """

    name: str
    layout: Layout | None
    reason: str
    pad_multiple: int = 1
    fn: Callable | None = None
    args: tuple | None = None

    def __iter__(self):
        return iter((self.name, self.layout, self.reason))

    @property
    def valid(self) -> bool:
        return self.layout is not None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "valid": self.valid, "reason": self.reason,
                "pad_multiple": self.pad_multiple,
                "layout": None if self.layout is None else self.layout.to_json()}


def default_mesh(target, mesh_axes: dict[str, int]):
    """``jax.make_mesh`` over the target's devices (JAX's default device order) with Auto axes.

    target: a Target (its libtpu devices), or a list of devices (e.g. CPU)."""
    if isinstance(target, Target):
        devices = target.devices()
    else:
        devices = list(target)
    n = math.prod(mesh_axes.values())
    if n > len(devices):
        raise ValueError(f"mesh {dict(mesh_axes)} needs {n} devices, the target has {len(devices)}")
    return jax.make_mesh(tuple(mesh_axes.values()), tuple(mesh_axes.keys()),
                         axis_types=(AxisType.Auto,) * len(mesh_axes), devices=devices[:n])


# ---------------------------------------------------------------------------------------------
# the program's attention nodes and parameter paths

def attention_roles(fn, args) -> dict[str, str]:
    """Attention node key -> "self" (video / joint sequence), "cross" (video queries, text keys)
    or "text" (text-only), from the hint names on q and k (else from their lengths)."""
    return {k: role for k, (role, _, _) in attention_nodes(fn, args).items()}


def attention_nodes(fn, args) -> dict[str, tuple[str, int, int]]:
    """Attention node key -> (role as in ``attention_roles``, query length, key length)."""
    closed = jax.make_jaxpr(fn)(*args)
    producer: dict = {}
    roles: dict[str, tuple[str, int, int]] = {}
    for w in walk(closed.jaxpr):
        for v in w.eqn.outvars:
            producer[v] = w.eqn
        if w.eqn.primitive.name not in FORWARD_ATTENTIONS:
            continue
        names = []
        for v in w.eqn.invars[:2]:
            p = producer.get(v)
            names.append(p.params["names"][2] if p is not None and p.primitive.name == HINT else None)
        sq, skv = w.eqn.invars[0].aval.shape[2], w.eqn.invars[1].aval.shape[2]
        qn, kn = names
        if qn == "text":
            role = "text"
        elif qn == "seq" and kn == "seq":
            role = "self"
        elif qn == "seq":
            role = "cross"
        else:
            role = "self" if sq == skv else "cross"
        roles[w.key] = (role, sq, skv)
    return roles


def _path_keys(path) -> list[str]:
    return [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]


def _param_leaves(args):
    """(path keys, leaf) of every input leaf; params are under arg 0."""
    return [(_path_keys(p), leaf) for p, leaf in jax.tree_util.tree_flatten_with_path(args)[0]]


def _stacked(keys: list[str]) -> bool:
    return any("blocks" in k for k in keys)


def _fsdp_spec(keys, shape, axes: tuple[str, ...], n: int):
    """Shard the largest dim that n divides (not the layer dim of stacked block params)."""
    spec = [None] * len(shape)
    start = 1 if _stacked(keys) and len(shape) > 1 else 0
    dims = sorted(range(start, len(shape)), key=lambda d: -shape[d])
    for d in dims:
        if shape[d] % n == 0:
            spec[d] = axes if len(axes) > 1 else axes[0]
            return tuple(spec)
    return tuple(spec)


def _role(keys: list[str]) -> str | None:
    if len(keys) < 2 or not _stacked(keys):
        return None
    layer, leaf = keys[-2], keys[-1]
    if layer in _COLUMN and leaf in ("w", "b"):
        return "column"
    if layer in _ROW and leaf == "w":
        return "row"
    if layer in _HEAD_NORMS and leaf == "scale":
        return "head_norm"
    return None


def _tp_spec(keys, shape, axis: str, n: int):
    role = _role(keys)
    spec = [None] * len(shape)
    if role in ("column", "head_norm"):
        d = len(shape) - 1                  # out dim of w, the only non-layer dim of b / scale
    elif role == "row":
        d = len(shape) - 2                  # in dim of w
    else:
        return tuple(spec)
    if shape[d] % n == 0:
        spec[d] = axis
    return tuple(spec)


def _embed_spec(keys, shape, axis: str, n: int, width: int):
    """maxdiffusion: the embed dim (the model width) of each weight over ``axis``."""
    spec = [None] * len(shape)
    start = 1 if _stacked(keys) and len(shape) > 1 else 0
    cand = [d for d in range(start, len(shape)) if shape[d] == width]
    if not cand:
        return tuple(spec)
    d = cand[-1] if _role(keys) == "row" else cand[0]
    if shape[d] % n == 0:
        spec[d] = axis
    return tuple(spec)


# ---------------------------------------------------------------------------------------------

def _model_dims(model) -> tuple[int, int, int]:
    c = model.config
    if model.family == "wan":
        return c.heads, c.ffn_dim, c.dim
    return c.heads, c.mlp_dim, c.hidden


def weight_bytes_per_device(args, in_specs, mesh_axes: dict[str, int]) -> int:
    """Bytes of the parameters (arg 0) each device holds under ``in_specs``."""
    total = 0
    for (keys, leaf), spec in zip(_param_leaves(args), in_specs):
        if keys[0] != "0":
            continue
        split = 1
        for entry in spec or ():
            for a in ((entry,) if isinstance(entry, str) else (entry or ())):
                split *= mesh_axes[a]
        total += math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize // split
    return total


def _build(name, model, wl, n, dtype, block, unit="chips", generation=None):
    """(Layout | None, reason, pad_multiple, fn, args); ``generation`` (e.g. "v5e") bounds the
    maxdiffusion tiles by its scoped VMEM."""
    if model.family == "stdit":
        return stdit_experts.build(name, model, wl, n, dtype, unit, _param_leaves, _fsdp_spec)
    if name == "dsp":
        return None, ("no spatial and temporal attention stages to switch between: the video "
                      "tokens attend as one sequence"), 1, None, None
    heads, mlp, width = _model_dims(model)
    batch = 2 * wl.batch                           # the CFG pair runs as one batch
    if name in ("cfg2_context", "tp_cfg", "cfg2_ulysses"):
        if n % 2:
            return None, f"CFG parallel needs an even number of {unit}, the target has {n}", 1, None, None
        if batch % 2:
            return None, f"CFG parallel needs an even batch, the step runs {batch}", 1, None, None
    if name == "ulysses" and heads % n:
        return None, f"{heads} heads do not divide {n} {unit} (Ulysses splits heads over all {unit})", 1, None, None
    if name == "cfg2_ulysses" and heads % (n // 2):
        return None, (f"{heads} heads do not divide context degree {n // 2} (= {n} {unit} / CFG 2; "
                      f"Ulysses splits heads over context)"), 1, None, None
    if name == "usp":
        if heads % n == 0:
            return None, (f"{heads} heads divide {n} {unit}: Ulysses over all of them (ulysses), "
                          f"no ring needed"), 1, None, None
        degrees = [u for u in range(2, n) if n % u == 0 and heads % u == 0]
        if not degrees:
            return None, f"no Ulysses degree > 1 divides both {heads} heads and {n} {unit}", 1, None, None
    if name == "tp_cfg":
        tp = n // 2
        if heads % tp:
            return None, f"{heads} heads do not divide tensor-parallel degree {tp} (= {n} {unit} / CFG 2)", 1, None, None
        if mlp % tp:
            return None, f"MLP width {mlp} does not divide tensor-parallel degree {tp}", 1, None, None

    if name in ("ulysses", "context", "fsdp_sp"):
        ax = {"ulysses": "sp", "context": "context", "fsdp_sp": "sp"}[name]
        mesh = {ax: n}
        seq_deg, seq, bat = n, (ax,), ()
        rules = {"seq": (ax,)}
        if name == "ulysses" or (name == "fsdp_sp" and heads % n == 0):
            main = AttentionLayout(heads=(ax,))
            how = "Ulysses"
        elif name == "fsdp_sp":
            main = AttentionLayout(seq=(ax,), kv="ring")
            how = f"ring over {n} ({heads} heads do not divide {n})"
        else:
            main = AttentionLayout(seq=(ax,))
            how = "context parallel (keys/values gathered)"
        cross = AttentionLayout(seq=(ax,))
        text = AttentionLayout()
    elif name == "cfg2_context":
        mesh = {"data": 2, "context": n // 2}
        seq_deg, seq, bat = n // 2, ("context",), ("data",)
        rules = {"batch": ("data",), "seq": ("context",)}
        main = cross = AttentionLayout(batch=bat, seq=seq)
        text = AttentionLayout(batch=bat)
        how = f"CFG 2 x context {n // 2}"
    elif name == "tp_cfg":
        tp = n // 2
        mesh = {"cfg": 2, "tp": tp}
        seq_deg, bat = 1, ("cfg",)
        rules = {"batch": ("cfg",), "heads": ("tp",), "mlp": ("tp",)}
        main = cross = text = AttentionLayout(batch=bat, heads=("tp",))
        how = f"CFG 2 x tensor parallel {tp} (heads, MLP)"
    elif name == "cfg2_ulysses":
        mesh = {"data": 2, "context": n // 2}
        seq_deg, seq, bat = n // 2, ("context",), ("data",)
        rules = {"batch": ("data",), "seq": ("context",)}
        main = AttentionLayout(batch=bat, heads=seq)
        cross = AttentionLayout(batch=bat, seq=seq)
        text = AttentionLayout(batch=bat)
        how = f"CFG 2 x context {n // 2}, Ulysses attention"
    elif name == "usp":
        u = max(degrees)
        mesh = {"ring": n // u, "ulysses": u}
        seq_deg, seq = n, ("ring", "ulysses")
        rules = {"seq": seq}
        main = AttentionLayout(heads=("ulysses",), seq=("ring",), kv="ring")
        cross = AttentionLayout(seq=seq)
        text = AttentionLayout()
        how = f"Ulysses {u} x ring {n // u}"
    else:
        raise ValueError(f"unknown expert configuration {name!r}; known: {list(EXPERTS)}")

    pad = block * seq_deg
    fn = registry.denoise_step(model, pad)
    args = registry.abstract_inputs(model, wl, dtype)
    nodes = attention_nodes(fn, args)
    attention = {k: {"self": main, "cross": cross, "text": text}[r] for k, (r, _, _) in nodes.items()}
    options = {}
    if name in MAXDIFFUSION:
        options = dict(MAXDIFFUSION_OPTIONS)
        limit = SCOPED_VMEM_BYTES.get(generation)
        attention = {k: _with_published_tiles(a, nodes[k][1], nodes[k][2], mesh, limit)
                     for k, a in attention.items()}

    in_specs = []
    for keys, leaf in _param_leaves(args):
        shape = leaf.shape
        if keys[0] != "0":                     # latents, timestep, text, guidance: batch 1
            in_specs.append(None)
        elif name == "fsdp_sp":
            in_specs.append(_fsdp_spec(keys[1:], shape, ("sp",), n))
        elif name == "tp_cfg":
            in_specs.append(_tp_spec(keys[1:], shape, "tp", n // 2))
        elif name in ("cfg2_context", "cfg2_ulysses"):
            in_specs.append(_embed_spec(keys[1:], shape, "context", n // 2, width))
        else:
            in_specs.append(None)
    layout = Layout(mesh_axes=mesh, in_specs=in_specs, out_specs=None, attention=attention,
                    rules=rules, name=f"expert:{name}", compiler_options=options)
    return layout, how, pad, fn, args


def _with_published_tiles(a: AttentionLayout, sq: int, skv: int, mesh: dict[str, int],
                          vmem_limit: int | None) -> AttentionLayout:
    """``a`` with maxdiffusion's tiles scaled to its per-shard lengths (``recipes``)."""
    n_s = math.prod(mesh[x] for x in a.seq)
    r = n_s if a.kv == "ring" else 1
    return a.with_tiles(**published_tiles(-(-sq // n_s), -(-skv // r), vmem_limit))


def _as_model(model) -> "registry.Model":
    """A model name, a Model, or a bare WanConfig / HunyuanConfig (any built-in workload name)."""
    if isinstance(model, (WanConfig, HunyuanConfig)):
        family = "wan" if isinstance(model, WanConfig) else "hunyuan"
        known = {w.name: w for w in (*W.SMALL, *W.WAN_480P, *W.WAN_720P, *W.HUNYUAN)}
        return registry.Model(f"custom-{family}", family, model, 0.0, tuple(known.values()))
    return registry.get_model(model)


def expert_layouts(model, workload, target: Target, *, dtype=jnp.bfloat16,
                   block: int = SPLASH_BLOCK) -> list[Expert]:
    """Every expert configuration for ``model`` (name, Model, or WanConfig / HunyuanConfig) at ``workload`` (name or Workload)
    on ``target`` (a resolved Target; n = its devices): valid ones with their Layout and padded
    program, invalid ones with the reason (e.g. "12 heads do not divide 8 chips ...")."""
    model = _as_model(model)
    wl = model.workload(workload) if isinstance(workload, str) else workload
    tgt = target
    n = tgt.num_devices
    hbm = tgt.chip.device_hbm_bytes
    out = []
    for name in EXPERTS:
        unit = "chips" if tgt.chip.devices_per_chip == 1 else "devices"
        layout, reason, pad, fn, args = _build(name, model, wl, n, dtype, block, unit,
                                               tgt.chip.generation)
        if layout is not None:
            wb = weight_bytes_per_device(args, layout.in_specs, layout.mesh_axes)
            if wb > hbm:
                layout, reason = None, (f"weights need {wb / 2**30:.2f} GiB per device under {reason}, "
                                        f"more than the {hbm / 2**30:.2f} GiB of HBM")
        out.append(Expert(name, layout, reason, pad, fn, args))
    return out


# public names for the other expert modules (models.training_experts)
fsdp_spec = _fsdp_spec
embed_spec = _embed_spec
tp_spec = _tp_spec
