"""A layout: how one program is laid out on a logical mesh. Plain data, JSON in and out.

A *spec* is the layout of one tensor, one entry per dimension, in PartitionSpec spelling:
``None`` (replicated along that dim), ``"x"`` (split over mesh axis x) or ``("x", "y")`` (split over
both, x major). JSON spells tuples as lists.

``Layout.node_specs`` is keyed by IR node key (see ``aoizora.extract.frontends.jax.jaxpr_walk``): the output of
that node is constrained to the spec. ``Layout.attention`` is keyed the same way for attention
nodes (the ``aoizora_attention`` primitive); ``"*"`` is the default for every attention node.
``Layout.remat`` is the rematerialization of a training step's blocks the planner chose
(``aoizora.formulation.remat``): None (absent in the JSON) runs the program as traced, else a
mapping {activation name: "keep" | "recompute" | "offload"}. ``Layout.compiler_options`` are the libtpu options the layout is compiled with (in the JSON only
when set, as are an attention layout's tiles). ``Layout.rules`` maps logical dimension names
(``batch``, ``seq``, ``heads``, ``embed``, ``mlp``, ...,
the names a model writes on its ``aoizora_hint`` annotations) to mesh axes; a hint whose names
have rules is constrained to them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

Axes = Union[None, str, tuple[str, ...]]
Spec = tuple[Axes, ...]


def spec_to_json(spec: Spec | None) -> Any:
    if spec is None:
        return None
    return [list(a) if isinstance(a, tuple) else a for a in spec]


def spec_from_json(d: Any) -> Spec | None:
    if d is None:
        return None
    return tuple(tuple(a) if isinstance(a, list) else a for a in d)


def axes_of(a: Axes) -> tuple[str, ...]:
    """The mesh axes one spec entry uses, major first."""
    if a is None:
        return ()
    return (a,) if isinstance(a, str) else tuple(a)


@dataclasses.dataclass(frozen=True)
class AttentionLayout:
    """Layout of one attention op (q, k, v: [batch, heads, seq, head_dim]).

    batch / heads / seq: mesh axes the batch, the heads and the *query* sequence are split over.
    With ``kv="gather"`` keys and values are all-gathered along the sequence axes (context
    parallel); with ``kv="ring"`` they travel around a ring over the sequence axes instead.
    Ulysses is heads split over the axes the surrounding activations split the sequence on.

    block_q / block_kv / block_kv_compute: the splash kernel's tiles for this node (tokens per
    query block, per key/value block loaded from HBM, per key/value block computed at once);
    None: the automatic choice (``aoizora.kernels.attention_kernels.splash_blocks``). Rules
    (``tile_problems``): block_q a positive multiple of 8, block_kv and block_kv_compute positive
    multiples of 128, block_kv_compute dividing block_kv.

    block_q_dkv / block_kv_dkv / block_kv_dkv_compute, block_q_dq / block_kv_dq and
    use_fused_bwd_kernel: the blocks of its backward's kernels (a training step's; splash's own
    ``BlockSizes`` names: the dk/dv kernel's, the dq kernel's, or one fused dq-dk-dv kernel,
    which takes no dq blocks); None: the forward's blocks, unfused. Rules: every backward block
    a positive multiple of 128, block_kv_dkv_compute dividing block_kv_dkv.
    """

    batch: tuple[str, ...] = ()
    heads: tuple[str, ...] = ()
    seq: tuple[str, ...] = ()
    kv: str = "gather"
    block_q: int | None = None
    block_kv: int | None = None
    block_kv_compute: int | None = None
    block_q_dkv: int | None = None
    block_kv_dkv: int | None = None
    block_kv_dkv_compute: int | None = None
    block_q_dq: int | None = None
    block_kv_dq: int | None = None
    use_fused_bwd_kernel: bool | None = None

    @property
    def tiles(self) -> dict[str, Any]:
        """The tiles (forward and backward) this layout sets (absent: automatic)."""
        return {k: getattr(self, k) for k in ALL_TILE_FIELDS if getattr(self, k) is not None}

    @property
    def backward_tiles(self) -> dict[str, Any]:
        """The backward's blocks this layout sets."""
        return {k: getattr(self, k) for k in BACKWARD_TILE_FIELDS if getattr(self, k) is not None}

    def with_tiles(self, **tiles: Any) -> "AttentionLayout":
        return dataclasses.replace(self, **tiles)

    def to_json(self) -> dict[str, Any]:
        return {"batch": list(self.batch), "heads": list(self.heads), "seq": list(self.seq),
                "kv": self.kv, **self.tiles}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "AttentionLayout":
        return cls(tuple(d.get("batch", ())), tuple(d.get("heads", ())), tuple(d.get("seq", ())),
                   d.get("kv", "gather"), **{k: d.get(k) for k in ALL_TILE_FIELDS})


TILE_FIELDS = ("block_q", "block_kv", "block_kv_compute")
BACKWARD_TILE_FIELDS = ("block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute", "block_q_dq",
                        "block_kv_dq", "use_fused_bwd_kernel")
ALL_TILE_FIELDS = TILE_FIELDS + BACKWARD_TILE_FIELDS
_MULTIPLE = {"block_q": 8, **{k: 128 for k in ALL_TILE_FIELDS[1:-1]}}


def tile_problems(block_q: Any = None, block_kv: Any = None, block_kv_compute: Any = None,
                  **backward: Any) -> list[str]:
    """What is wrong with a set of splash tiles (None: automatic), one phrase per problem;
    ``backward``: the backward's blocks by their ``BACKWARD_TILE_FIELDS`` names."""
    unknown = sorted(set(backward) - set(BACKWARD_TILE_FIELDS))
    if unknown:
        return [f"unknown tile {unknown[0]!r}; known: {', '.join(ALL_TILE_FIELDS)}"]
    t = {"block_q": block_q, "block_kv": block_kv, "block_kv_compute": block_kv_compute,
         **backward}
    out = []
    for name, m in _MULTIPLE.items():
        v = t.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % m):
            out.append(f"{name} {v!r} is not a positive multiple of {m}")
    fused = t.get("use_fused_bwd_kernel")
    if fused is not None and not isinstance(fused, bool):
        out.append(f"use_fused_bwd_kernel {fused!r} is not true or false")
    for big, small in (("block_kv", "block_kv_compute"), ("block_kv_dkv", "block_kv_dkv_compute")):
        if not out and t.get(big) is not None and t.get(small) is not None \
                and t[big] % t[small]:
            out.append(f"{small} {t[small]} does not divide {big} {t[big]}")
    if fused and (t.get("block_q_dq") is not None or t.get("block_kv_dq") is not None):
        out.append("a fused backward kernel takes no dq blocks (block_q_dq, block_kv_dq)")
    return out


@dataclasses.dataclass
class Layout:
    mesh_axes: dict[str, int]                       # logical mesh: axis name -> size, in order
    in_specs: list[Spec | None]                     # per flattened input leaf (None: let XLA choose)
    out_specs: list[Spec | None] | None = None      # per flattened output leaf
    node_specs: dict[str, Spec] = dataclasses.field(default_factory=dict)
    attention: dict[str, AttentionLayout] = dataclasses.field(default_factory=dict)
    rules: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    name: str = ""                                  # e.g. "expert:ulysses" or "ilp"
    # libtpu / XLA options for compiling this layout (jax ``compile(compiler_options=...)``,
    # the same flags as LIBTPU_INIT_ARGS without the leading "--"), e.g.
    # {"xla_tpu_enable_async_collective_fusion": True}; empty: libtpu's defaults
    compiler_options: dict[str, bool | int | float | str] = dataclasses.field(default_factory=dict)
    # rematerialization of a training step's blocks (``formulation.remat``): None, the program
    # as traced; else {activation name: "keep" | "recompute" | "offload"} for the step's
    # ``with_remat`` (``aoizora.runtime.realize``); in the JSON only when set
    remat: dict[str, str] | None = None
    # node key -> the spec its output leaves in before ``node_specs`` reshards it: the
    # realizer constrains the output to this spec, then to ``node_specs[key]``, so the
    # reshard happens on that tensor, where the sharding ILP priced it (its switch points,
    # ``formulation.strategies``); in the JSON only when set
    reshard_from: dict[str, Spec] = dataclasses.field(default_factory=dict)

    def attention_for(self, key: str) -> AttentionLayout:
        return self.attention.get(key) or self.attention.get("*") or AttentionLayout()

    def to_json(self) -> dict[str, Any]:
        d = {
            "name": self.name, "mesh_axes": dict(self.mesh_axes),
            "in_specs": [spec_to_json(s) for s in self.in_specs],
            "out_specs": None if self.out_specs is None else [spec_to_json(s) for s in self.out_specs],
            "node_specs": {k: spec_to_json(v) for k, v in self.node_specs.items()},
            "attention": {k: v.to_json() for k, v in self.attention.items()},
            "rules": {k: list(v) for k, v in self.rules.items()},
        }
        if self.compiler_options:
            d["compiler_options"] = dict(self.compiler_options)
        if self.remat is not None:
            d["remat"] = dict(self.remat)
        if self.reshard_from:
            d["reshard_from"] = {k: spec_to_json(v) for k, v in self.reshard_from.items()}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Layout":
        return cls(
            mesh_axes=dict(d["mesh_axes"]),
            in_specs=[spec_from_json(s) for s in d["in_specs"]],
            out_specs=None if d.get("out_specs") is None else [spec_from_json(s) for s in d["out_specs"]],
            node_specs={k: spec_from_json(v) for k, v in d.get("node_specs", {}).items()},
            attention={k: AttentionLayout.from_json(v) for k, v in d.get("attention", {}).items()},
            rules={k: tuple(v) for k, v in d.get("rules", {}).items()},
            name=d.get("name", ""),
            compiler_options=dict(d.get("compiler_options", {})),
            remat=None if d.get("remat") is None else dict(d["remat"]),
            reshard_from={k: spec_from_json(v) for k, v in d.get("reshard_from", {}).items()},
        )
