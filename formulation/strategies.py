"""Sharding strategies of every op of a ProgramIR on a logical mesh, merged Alpa-style into groups.

A *spec* here is one tuple of mesh axes per tensor dim (``()`` = replicated along that dim, axes
in mesh order, major first). A *strategy* of an op assigns each mesh axis to at most one of the op's
dim labels (``ProgramIR`` einsum labels) or to none (replicated along that axis):

- ``dot`` / ``conv``: batch, lhs-free (rows), rhs-free (columns) and contracting labels; an axis on a
  contracting label leaves a partial sum, reduced by an all-reduce (output not split on that axis)
  or a reduce-scatter onto an output dim (output split on it) -- the node's own communication;
- ``attention``: batch, heads and query sequence (keys/values are required gathered along the
  kv sequence, so a split query sequence is context parallel with kv gathered on the edge); with
  the query sequence split, also the ring variant (``kv="ring"``): keys/values split like the
  queries and passed around the sequence axes, overlapped with compute (its compute: the
  kernels plus the ring's own memory passes, ``formulation.ring_overhead``). A key mask (labels
  ``b``, ``t``: the marker's fourth operand, or a found attention's) is split like the keys:
  on the batch axes, gathered along the key sequence, or split on it in a ring;
  A differentiated forward's second result, the log-sum-exp [B,H,S], is laid out like the
  output's first three dims;
- ``attention_bwd`` (the backward of an attention, q, k, v, out, lse, do -> dq, dk, dv): the
  forward's batch, heads and query-sequence strategies with keys/values gathered (the splash
  kernel's dq and dk/dv kernels inside one ``shard_map``); dq, out, lse and do are laid out like
  q, dk / dv (and the key mask the backward reads, if any) like the gathered k / v, and with the query sequence split over
  axes A each device holds a partial dk / dv (its queries' share), summed by an all-reduce
  over A -- the node's own communication;
- the replicated strategy is always present.

Attention compute may be scaled by ``attention_scale[node][kv]`` (node key, or ``"*"`` for every
node the map does not name; the planner's feedback, ``formulation.attention_calibration``):
gathered ``scale * compute + comm``, ring ``max(scale * compute, comm)``; ``Strategy.compute``
keeps the unscaled compute. The compute of every other op is scaled by
``Options.compute_scale`` (default 1; the planner's feedback,
``formulation.compute_calibration``: Q1's unfused per-op compute against the compiler's fused
program).

An axis may go on a label whose size it does not divide only with ``Options.allow_padding``
(intermediates only, never program inputs): the shard is ``ceil(size/n)`` and the padded work is
counted. It is off by default because the realizer (``aoizora.runtime.realize``) and ``shard_map``
attention accept only dividing specs; pad the program instead (the models' ``pad_multiple``).

*Groups* (Alpa's shrinking): anchors -- dot, conv, attention, program inputs, scan carries,
sources (iota, broadcast literals), and ops the IR cannot split (unknown, opaque, gather, scatter:
replicated only) -- own a strategy variable. Every other op (elementwise, reduce, reshape,
transpose, broadcast, slice, concat, ...) *follows* its largest operand and joins that
operand's group (among equals, one not made by a broadcast): its output spec is derived from
the operand's spec, and the costs of the edges
inside a group (reshards to other operands, gathers a reshape or slice cannot avoid, all-reduces of
partial reductions) fold into the group's per-strategy cost. Strategies of a group whose specs
coincide on everything the rest of the program sees are merged (the cheaper one kept).

*Switch points*: a join -- an elementwise op whose output (rank >= 2, at least
``Options.switch_min_bytes``) combines full-size, not broadcast, tensors of two or more groups (a residual
add: the stream and a block's output) -- computes in the group it follows, and its output gets a
group of its own (kind ``"switch"``, id ``sw:<node>``) offering every spec P_sw; the edge from the
join (operand ``SWITCH_EDGE``) costs ``reshard_cost(have -> P_sw)``, and later readers follow the
switch group. A residual stream may so change spec between blocks for one reshard (DSP's switch
from frames to space between an STDiT3 spatial and temporal block), where one spec for the whole
stream makes every block reshard in and out of it. The layout realizes a changed spec with two
constraints on the join's output (``Layout.reshard_from``), so the reshard is where it was priced.

Costs, seconds per call: compute of one shard ``max(flops_shard / peak_flops,
bytes_shard / hbm_bandwidth)`` (unfused: every op reads its operands and writes its results;
on a TPU a dot's ``flops_shard`` padded to the MXU at its shard shape and over the MXU's
measured efficiency, ``formulation.matmul_time``) plus own communication, times the node's ``repeat``. Resharding a tensor from spec P to spec Q
(``reshard_cost``): per mesh axis, kept -> nothing; split in P, not in Q -> all-gather; split on
another dim in Q -> all-to-all; not in P, split in Q -> slicing (free); via ``AxisCosts``.

State (``ProgramIR.state_aliases``, a training step's new state): an edge from the group that
makes each state output to its input's group, priced as resharding the output into the input's
spec at the end of the step (the layout realizes it so: the output gets its input's spec), as a
scan's loop-back carry is.

Scanned stacks: a scan's body sees one slice of each stacked operand (``scan_xs``: the stack
without its leading dim). A strategy that splits a stack's leading dim, directly on a program
input or through the ops it follows (a training step casts its fp32 parameter stacks to bf16
before the layer scan), would make every iteration gather the whole stack to slice its layer
(on Wan 2.1 1.3B, v5p-16, fsdp2 x tensor4: 34.9 GiB of all-gathers per step from the ILP's
layer-split parameters); Q1 has no term for it. So a group keeps no strategy that splits the
leading dim of a stack some scan slices (``_keep_stacks_whole``), unless it has no other.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from aoizora.formulation.attention_tiles import AttentionShape, best_tiles, chip_of
from aoizora.formulation.collective_cost import AxisCosts
from aoizora.formulation.matmul_time import MXU_EFFICIENCY, padding_factor
from aoizora.formulation.prefetch import PREFETCH_ROOM, prefetch_room
from aoizora.formulation.ring_overhead import ring_overhead_seconds

Spec = tuple[tuple[str, ...], ...]

ANCHOR_KINDS = frozenset({"dot", "conv", "attention", "attention_bwd"})
ATTENTION_KINDS = frozenset({"attention", "attention_bwd"})   # compute scaled as attention
REPLICATED_KINDS = frozenset({"unknown", "opaque", "gather", "scatter"})
FOLLOW_KINDS = frozenset({"elementwise", "reduce", "reshape", "transpose", "broadcast", "slice",
                          "pad", "concat", "cumulative", "sort", "squeeze", "stack"})
SWITCH_EDGE = -4             # Edge.operand of the edge into a switch point from its join
RING_BLOCK = 128   # splash attention's key block: a ring shard must hold whole blocks
SHARDABLE_ROLES = {"dot": ("batch", "lhs_free", "rhs_free", "contracting"),
                   "conv": ("batch", "rhs_free", "contracting"),
                   "attention": ("batch", "heads", "q_seq"),
                   "attention_bwd": ("batch", "heads", "q_seq")}


class StrategyError(ValueError):
    """The IR or mesh cannot be turned into strategies."""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """Per-device numbers the costs use. Units: FLOP/s, bytes/s, bytes, Hz. ``generation`` and
    ``clock_hz`` (a TPU's, e.g. "v5e", 1.5e9) let attention be priced by the splash kernel model
    (``formulation.attention_tiles``); without them attention is priced by its roofline."""
    peak_flops: float
    hbm_bandwidth_Bps: float
    hbm_bytes: int
    generation: str = ""
    clock_hz: float = 0.0

    @classmethod
    def from_chip(cls, chip) -> "Hardware":
        """One device's numbers of ``chip`` (a ``ChipSpec``: its figures split over the devices
        a chip shows as)."""
        return cls(float(chip.device_peak_flops), float(chip.device_hbm_bandwidth_Bps),
                   int(chip.device_hbm_bytes),
                   str(getattr(chip, "generation", "") or ""), float(getattr(chip, "clock_hz", 0.0)))

    def kernel_chip(self):
        """The kernel model's chip for these numbers, or None (no generation / clock)."""
        if not self.generation or self.clock_hz <= 0:
            return None
        return chip_of(self.generation, self.peak_flops, self.hbm_bandwidth_Bps, self.clock_hz)


@dataclasses.dataclass
class Strategy:
    name: str                                   # e.g. "m0:x n2:y" or a spec "(x,_,y)"
    specs: dict[str, Spec]                      # spec of every tensor produced in the group
    req: dict[tuple[str, int], Spec]            # (node key, operand index) -> spec it needs (cross-group)
    cost: float = 0.0                           # seconds per call (compute + own comm + inner edges)
    comm: float = 0.0                           # the communication part of `cost`, seconds
    words: str = ""                             # "heads on y, sequence on x"
    labels: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # anchor labels
    kv: str = "gather"                          # attention: keys/values "gather"ed or in a "ring"
    compute: float = 0.0                        # attention: Q1's unscaled compute part of `cost`
    tiles: dict[str, int] | None = None         # attention: the splash tiles Q1 priced it with


@dataclasses.dataclass
class Group:
    id: str                                     # anchor node key, "in:<tid>", "carry:<tid>", "const:<tid>"
    kind: str                                   # anchor kind, or "input" / "carry" / "const" / "source"
    anchor: str                                 # node key or tensor id
    members: list[str]                          # node keys merged into the group (anchor first)
    strategies: list[Strategy]


@dataclasses.dataclass
class Edge:
    """A tensor passed from one group to another: cost[p][q] for producer spec p, required spec q."""
    producer: str                               # group id
    consumer: str                               # group id
    tensor: str                                 # tensor id as the consumer sees it
    node: str                                   # consumer node key ("" for a carry loop)
    operand: int
    p_of: list[int]                             # producer strategy -> index into p_specs
    q_of: list[int]                             # consumer strategy -> index into q_specs
    p_specs: list[Spec]
    q_specs: list[Spec]
    cost: list[list[float]]                     # seconds per call (times repeat)


@dataclasses.dataclass
class StrategyGraph:
    mesh_axes: dict[str, int]
    groups: dict[str, Group]
    edges: list[Edge]
    group_of_node: dict[str, str]
    origin: dict[str, tuple[str, str, tuple[str, ...]]]  # tensor -> (group, base tensor, transforms)
    notes: list[str] = dataclasses.field(default_factory=list)
    prefetch_room: float = 0.0      # rho of Q1's prefetch overlap (``formulation.prefetch``)

    def num_strategies(self) -> int:
        return sum(len(g.strategies) for g in self.groups.values())

    def order(self) -> list[str]:
        """Group ids in the order the IR made them (inputs and nodes in program order): the
        order of the ILP's variables and of every search over groups. It does not depend on how
        node keys are spelled, so two programs that differ only in identity eqns (``hint``s,
        which shift the walk's keys) give the same model and break ties the same way."""
        return list(self.groups)


# ---------------------------------------------------------------------------------------------
# spec arithmetic

def _itemsize(t) -> int:
    n = math.prod(t.shape) if t.shape else 1
    return max(1, t.bytes // n) if n else 1


def shard_bytes(t, spec: Spec, sizes: dict[str, int]) -> float:
    """Bytes one device holds of tensor t under spec (padded shards rounded up)."""
    if not t.shape:
        return float(t.bytes)
    n = _itemsize(t)
    for d, s in enumerate(t.shape):
        p = math.prod(sizes[a] for a in spec[d]) if d < len(spec) else 1
        n *= -(-s // p)
    return float(n)


def replicated(rank: int) -> Spec:
    return tuple(() for _ in range(rank))


def spec_str(spec: Spec) -> str:
    return "(" + ",".join("+".join(a) if a else "_" for a in spec) + ")"


def reshard_cost(t, src: Spec, dst: Spec, ac: AxisCosts, dtensor: bool = False) -> float:
    """Seconds to turn tensor t from spec src into spec dst (see the module docstring);
    ``dtensor``: as DTensor's ``redistribute`` does it (``dtensor_reshard_cost``)."""
    if src == dst or not t.shape:
        return 0.0
    if dtensor:
        return dtensor_reshard_cost(t, src, dst, ac)
    sizes = ac.sizes

    def where(spec, a):
        for d, axes in enumerate(spec):
            if a in axes:
                i = axes.index(a)
                return d, axes[:i + 1]
        return None, None

    cur = dict()  # axis -> dim, current sharding
    for d, axes in enumerate(src):
        for a in axes:
            cur[a] = d
    per_dev = shard_bytes(t, src, sizes)
    cost = 0.0
    gathers = []
    for a in list(cur):
        ds, ps = where(src, a)
        dd, pd = where(dst, a)
        if dd is None:
            gathers.append(a)
        elif dd != ds or ps != pd:
            cost += ac.all_to_all(a, per_dev * sizes[a])
    for a in gathers:   # gather one axis after the other; V = the group's gathered array
        per_dev *= sizes[a]
        cost += ac.all_gather(a, per_dev)
    return cost


def dtensor_steps(src: Spec, dst: Spec, sizes: dict[str, int]) -> list[tuple[str, str]]:
    """(kind, mesh axis) of each step DTensor's ``redistribute`` takes from spec src to spec dst
    (a torch program's reshards: ``aoizora.runtime.torch_layout``), as its
    ``_gen_transform_infos`` plans them: kind "all-gather" (Shard -> Replicate), "all-to-all"
    (Shard(d) -> Shard(e)) or "slice" (Replicate -> Shard, no communication). Each axis is one
    placement (axes sharding one dim nest in mesh order). First, innermost axis to outermost: an
    axis whose target is ``Shard(d)`` while the axes before it that shard d differ between source
    and target is replicated instead (its nested shard cannot move); then, outermost to
    innermost, the placements still to reach. So removing an outer axis from a dim
    (``(x, y) -> (y,)``) gathers the dim over y and then x, and slices it over y again."""
    names = [a for a in sizes if sizes[a] > 1]

    def place(spec: Spec) -> dict[str, int | None]:
        out: dict[str, int | None] = {a: None for a in names}
        for d, axes in enumerate(spec):
            for a in axes:
                if a in out:
                    out[a] = d
        return out

    cur, tgt = place(src), place(dst)
    steps = []

    def move(a: str, to: int | None) -> None:
        kind = "slice" if cur[a] is None else "all-gather" if to is None else "all-to-all"
        steps.append((kind, a))
        cur[a] = to

    for i in reversed(range(len(names))):
        a, to = names[i], tgt[names[i]]
        if to is not None and [b for b in names[:i] if cur[b] == to] != \
                [b for b in names[:i] if tgt[b] == to]:
            to = None
        if cur[a] != to:
            move(a, to)
    for a in names:
        if cur[a] != tgt[a]:
            move(a, tgt[a])
    return steps


def dtensor_reshard_cost(t, src: Spec, dst: Spec, ac: AxisCosts) -> float:
    """Seconds of DTensor's ``redistribute`` from spec src to spec dst (``dtensor_steps``): an
    all-gather over an axis grows the shard by its size, V = the gathered array of the group; an
    all-to-all keeps it; a slice shrinks it for free."""
    per_dev = shard_bytes(t, src, ac.sizes)
    cost = 0.0
    for kind, a in dtensor_steps(src, dst, ac.sizes):
        n = ac.sizes[a]
        if kind == "all-gather":
            per_dev *= n
            cost += ac.all_gather(a, per_dev)
        elif kind == "all-to-all":
            cost += ac.all_to_all(a, per_dev * n)
        else:
            per_dev /= n
    return cost


def all_specs(shape: list[int], axes: dict[str, int], allow_padding: bool,
              forbid_dims: tuple[int, ...] = ()) -> list[Spec]:
    """Every spec of a tensor: each mesh axis on one dim (that it divides) or on none."""
    names = [a for a in axes if axes[a] > 1]
    out = []
    for choice in itertools.product(range(-1, len(shape)), repeat=len(names)):
        spec = [[] for _ in shape]
        ok = True
        for a, d in zip(names, choice):
            if d < 0:
                continue
            if d in forbid_dims:
                ok = False
                break
            spec[d].append(a)
        if not ok:
            continue
        for d, s in enumerate(shape):
            p = math.prod(axes[a] for a in spec[d])
            if p > 1 and (s % p != 0 and not (allow_padding and s >= p)):
                ok = False
                break
        if ok:
            out.append(tuple(tuple(x) for x in spec))
    return out


# ---------------------------------------------------------------------------------------------
# building

@dataclasses.dataclass
class Options:
    allow_padding: bool = False           # intermediates may be split unevenly (padded shards)
    max_strategies: int = 400             # per anchor, after merging (replicated always kept)
    compute_scale: float = 1.0            # factor on the compute of every op but attention
    fusion: bool = True                   # followers priced as fused chains (module docstring)
    dtensor: bool = False                 # reshards as DTensor's redistribute does them (torch)
    prefetch_room: float = PREFETCH_ROOM  # rho of the prefetch overlap (``formulation.prefetch``;
                                          # 0 when the axis costs hold a measured exposure)
    switch_points: bool = True            # a join's output may change spec (module docstring)
    switch_min_bytes: int = 1 << 20       # joins with a smaller output get no switch point


class _Builder:
    def __init__(self, ir, ac: AxisCosts, hw: Hardware, opts: Options,
                 attention_scale: dict[str, dict[str, float]] | None = None):
        self.ir, self.ac, self.hw, self.opts = ir, ac, hw, opts
        self.attention_scale = dict(attention_scale or {})
        self.sizes = ac.sizes
        self.T = ir.tensors
        self.groups: dict[str, Group] = {}
        self.group_of_node: dict[str, str] = {}
        self.origin: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self.pending: list[tuple[str, str, str, int, int]] = []  # (tensor, consumer grp, node, op idx, repeat)
        self.switches: list[tuple[str, str, tuple, int]] = []  # (tensor, switch grp, its origin, repeat)
        self.notes: list[str] = []
        self.scan_xs_outers = {t.outer for t in self.T.values() if t.kind == "scan_xs"}
        self._sb: dict[tuple[str, Spec], float] = {}
        self._node_kind = {n.key: n.kind for n in ir.nodes}
        self._chip = hw.kernel_chip()
        self._fused_in, self._fused_out = fused_tensors(ir) if opts.fusion else (set(), set())

    # --- tensor origins
    def resolve(self, tid: str):
        if tid in self.origin:
            return self.origin[tid]
        t = self.T[tid]
        if t.kind == "literal":
            return None
        if t.kind == "node":
            gid = self.group_of_node.get(t.producer)
            return None if gid is None else self.origin.get(tid)
        if t.kind in ("scan_xs", "scan_const"):
            o = self.resolve(t.outer)
            if o is None:
                return None
            r = (o[0], o[1], o[2] + (("drop0",) if t.kind == "scan_xs" else ()))
        elif t.kind in ("scan_carry_out", "scan_ys"):
            o = self.resolve(t.inner)
            if o is None:
                return None
            r = (o[0], o[1], o[2] + (("add0",) if t.kind == "scan_ys" else ()))
        else:
            return None
        self.origin[tid] = r
        return r

    def spec_of(self, tid: str, k: int) -> Spec:
        return self._spec_at(self.resolve(tid), tid, k)

    def _spec_at(self, o, tid: str, k: int) -> Spec:
        """Tensor ``tid``'s spec under strategy k of the group of origin ``o``."""
        if o is None:
            return replicated(len(self.T[tid].shape))
        gid, base, tr = o
        spec = self.groups[gid].strategies[k].specs[base]
        for x in tr:
            spec = spec[1:] if x == "drop0" else ((),) + spec
        return spec

    # --- groups
    def source_group(self, gid, kind, tid, forbid0=False, allow_padding=False):
        t = self.T[tid]
        specs = all_specs(t.shape, self.sizes, allow_padding, (0,) if forbid0 else ())
        strats = [Strategy(spec_str(s), {tid: s}, {}, words=f"{spec_str(s)}") for s in specs]
        self.groups[gid] = Group(gid, kind, tid, [], strats)
        self.origin[tid] = (gid, tid, ())

    def single_group(self, gid, kind, tid):
        t = self.T[tid]
        s = replicated(len(t.shape))
        self.groups[gid] = Group(gid, kind, tid, [], [Strategy("replicated", {tid: s}, {})])
        self.origin[tid] = (gid, tid, ())

    def compute_time(self, n, flops_frac: float, bytes_dev: float,
                     assign: dict[str, tuple[str, ...]] | None = None) -> float:
        """Seconds of node ``n`` on one device: max(flops, bytes) over the device's peak and HBM
        bandwidth; a dot split as ``assign`` at its MXU-padded flops over the MXU's measured
        efficiency (``formulation.matmul_time``), on a TPU with a kernel chip."""
        flops = n.flops * flops_frac
        if n.kind == "dot" and assign is not None and self._chip is not None:
            shard = {lab: -(-s // math.prod(self.sizes[a] for a in assign.get(lab, ())))
                     for lab, s in self.label_sizes(n).items()}
            flops *= padding_factor(shard, n.roles, self.hw.generation) / MXU_EFFICIENCY
        t = max(flops / self.hw.peak_flops, bytes_dev / self.hw.hbm_bandwidth_Bps)
        return t if n.kind in ATTENTION_KINDS else t * self.opts.compute_scale

    def attention_kernel(self, n, assign, ring: bool):
        """(seconds per call, tiles) of attention node ``n`` split as ``assign`` by the splash
        kernel model at its per-shard shape with the tiles it would get
        (``formulation.attention_tiles.best_tiles``); None when the model cannot price it (no
        kernel chip, no feasible tile, a split that does not divide)."""
        if self._chip is None:
            return None
        dims = self.attention_dims(n)
        if dims is None:
            return None
        b, h, sq, skv, d, e = dims
        n_b, n_h, n_s = (math.prod(self.sizes[a] for a in assign.get(lab, ()))
                         for lab in ("b", "h", "s"))
        if b % n_b or h % n_h:
            return None
        c = best_tiles(AttentionShape(b, h, sq, skv, d, e), n_b, n_h, n_s, ring, self._chip)
        if c is None:
            return None
        return c.seconds, {"block_q": c.block_q, "block_kv": c.block_kv,
                           "block_kv_compute": c.block_kv_compute}

    def attention_dims(self, n) -> tuple[int, int, int, int, int, int] | None:
        """(batch, heads, q_len, kv_len, head_dim, bytes per element) of attention node ``n``;
        None when its shapes do not say."""
        q, k = self.T[n.operands[0]], self.T[n.operands[1]]
        e = max(q.bytes // max(math.prod(q.shape), 1), 1)
        if "shape" in n.params:
            b, h, sq, skv, d = (int(v) for v in n.params["shape"])
        elif len(q.shape) == 4 and len(k.shape) == 4:
            b, h, sq, d, skv = q.shape[0], q.shape[1], q.shape[2], q.shape[3], k.shape[2]
        else:
            return None
        return b, h, sq, skv, d, e

    def ring_overhead(self, n, assign, p: int) -> float:
        """Seconds per call a ring of ``p`` devices adds around node ``n``'s kernels split as
        ``assign`` (``formulation.ring_overhead``); 0 when the shapes do not say."""
        dims = self.attention_dims(n)
        if dims is None:
            return 0.0
        b, h, sq, skv, d, e = dims
        n_b, n_h = (math.prod(self.sizes[a] for a in assign.get(lab, ())) for lab in ("b", "h"))
        lead = -(-b // n_b) * -(-h // n_h)
        return ring_overhead_seconds(p, lead, -(-sq // p), -(-skv // p), d, e,
                                     self.hw.hbm_bandwidth_Bps)

    def label_sizes(self, n) -> dict[str, int]:
        out = {}
        for k, labs in enumerate(n.operand_labels):
            shp = self.T[n.operands[k]].shape
            for d, lab in enumerate(labs):
                if d < len(shp):
                    out.setdefault(lab, shp[d])
        for k, labs in enumerate(n.result_labels):
            shp = self.T[n.results[k]].shape
            for d, lab in enumerate(labs):
                out.setdefault(lab, shp[d])
        return out

    def anchor(self, n):
        roles_ok = SHARDABLE_ROLES[n.kind]
        lsz = self.label_sizes(n)
        labels = [lab for lab, r in n.roles.items() if r in roles_ok and lab in lsz]
        names = [a for a in self.sizes if self.sizes[a] > 1]   # a size-1 axis splits nothing
        strategies = []
        for choice in itertools.product([None] + labels, repeat=len(names)):
            assign: dict[str, tuple[str, ...]] = {}
            for a, lab in zip(names, choice):
                if lab is not None:
                    assign[lab] = assign.get(lab, ()) + (a,)
            ok, frac = True, 1.0
            for lab, axes in assign.items():
                p = math.prod(self.sizes[a] for a in axes)
                s = lsz[lab]
                if s % p and not (self.opts.allow_padding and s >= p):
                    ok = False
                    break
                frac *= -(-s // p) / s
            if not ok:
                continue
            if n.kind == "attention_bwd":
                strategies.append(self._attention_bwd_variant(n, assign, frac))
            else:
                strategies.extend(self._anchor_variants(n, assign, frac))
        self._add_node_group(n, strategies)

    def _attention_bwd_variant(self, n, assign, frac):
        """The backward of an attention with batch / heads / query sequence split as ``assign``
        and keys/values gathered: q, do and dq split alike; k, v, dk, dv split on batch and heads
        only; dk and dv all-reduced over the query-sequence axes (module docstring)."""
        q_spec = tuple(assign.get(lab, ()) for lab in n.operand_labels[0])
        kv_spec = tuple(assign.get(lab, ()) if lab != "t" else () for lab in n.operand_labels[1])
        req = {0: q_spec, 1: kv_spec, 2: kv_spec, 3: q_spec, 4: q_spec[:3], 5: q_spec}
        for k in range(6, len(n.operands)):     # the key mask: split like the keys' batch
            req[k] = tuple(assign.get(lab, ()) if lab != "t" else () for lab in n.operand_labels[k])
        req = {k: sp for k, sp in req.items() if self.T[n.operands[k]].kind != "literal"}
        outs = {n.results[0]: q_spec, n.results[1]: kv_spec, n.results[2]: kv_spec}
        bytes_dev = sum(shard_bytes(self.T[n.operands[k]], sp, self.sizes) for k, sp in req.items()) \
            + sum(shard_bytes(self.T[r], sp, self.sizes) for r, sp in outs.items())
        comp = self.compute_time(n, frac, bytes_dev)
        partial = sum(shard_bytes(self.T[r], kv_spec, self.sizes) for r in n.results[1:])
        comm = sum(self.ac.all_reduce(a, partial) for a in assign.get("s", ()))
        name = " ".join(f"{lab}:{'+'.join(ax)}" for lab, ax in sorted(assign.items())) or "replicated"
        words = _words(n, assign, (), [])
        if assign.get("s"):
            words += f", dk/dv all-reduced over {'+'.join(assign['s'])}"
        s = Strategy(name, outs, {}, comp * self._scale(n.key, "gather") + comm, comm, words,
                     dict(assign), compute=comp)
        s._req_local = req  # type: ignore[attr-defined]
        return s

    def _anchor_variants(self, n, assign, frac):
        """One strategy per way of resolving the partial sums of contracting axes."""
        out_t = self.T[n.results[0]]
        out_spec = tuple(assign.get(lab, ()) for lab in n.result_labels[0])
        req = {}
        for k, labs in enumerate(n.operand_labels):
            if self.T[n.operands[k]].kind == "literal":
                continue
            spec = tuple(assign.get(lab, ()) for lab in labs)
            req[k] = spec
        partial = [a for lab, axes in assign.items() if n.roles.get(lab) == "contracting" for a in axes]
        bytes_dev = sum(shard_bytes(self.T[n.operands[k]], s, self.sizes) for k, s in req.items()) \
            + shard_bytes(out_t, out_spec, self.sizes)
        comp = self.compute_time(n, frac, bytes_dev, assign)
        tiles = None
        if n.kind == "attention":
            kern = self.attention_kernel(n, assign, ring=False)
            if kern is not None:
                comp, tiles = kern
        options: list[list[tuple[str, int | None]]] = []
        for a in partial:
            opts = [("ar", None)]
            for d, lab in enumerate(n.result_labels[0]):
                if out_t.shape[d] % (math.prod(self.sizes[b] for b in out_spec[d]) * self.sizes[a]) == 0:
                    opts.append(("rs", d))
            options.append(opts)
        variants = []
        for combo in itertools.product(*options) if options else [()]:
            spec = [list(x) for x in out_spec]
            comm = 0.0
            for a, (how, d) in zip(partial, combo):
                if how == "rs":
                    spec[d].append(a)
            spec_t = tuple(tuple(sorted(x, key=list(self.sizes).index)) for x in spec)
            if any(out_t.shape[d] % math.prod(self.sizes[b] for b in spec_t[d]) for d in range(len(spec_t))):
                continue   # two reduce-scatters onto one dim that together do not divide it
            # reduce one axis after the other; V = the partial array the group holds
            cur = list(out_spec)
            for a, (how, d) in zip(partial, combo):
                V = shard_bytes(out_t, tuple(tuple(x) for x in cur), self.sizes)
                if how == "ar":
                    comm += self.ac.all_reduce(a, V)
                else:
                    comm += self.ac.reduce_scatter(a, V)
                    cur[d] = tuple(cur[d]) + (a,)
            name = " ".join(f"{lab}:{'+'.join(axes)}" for lab, axes in sorted(assign.items())) or "replicated"
            if partial:
                name += " " + ",".join(f"{a}:{'ar' if h == 'ar' else f'rs{d}'}" for a, (h, d) in zip(partial, combo))
            words = _words(n, assign, combo, partial)
            scaled = comp * self._scale(n.key, "gather") if n.kind == "attention" else comp
            s = Strategy(name, self._outs(n, spec_t), {}, scaled + comm, comm, words, dict(assign),
                         compute=comp if n.kind == "attention" else 0.0, tiles=tiles)
            s._req_local = req  # type: ignore[attr-defined]
            variants.append(s)
        if n.kind == "attention" and assign.get("s"):
            ring = self._ring_variant(n, assign, req, frac, out_t, out_spec)
            if ring is not None:
                variants.append(ring)
        return variants

    def _ring_variant(self, n, assign, req, frac, out_t, out_spec):
        """Attention with keys/values split like the queries and passed around a ring over the
        sequence axes: each device receives what an all-gather would bring, one shard per step,
        overlapped with the attention of the shard it holds (cost = max(compute, ring traffic),
        compute = the kernels plus the ring's combine, carry copies and log-sum-exp slice:
        ``formulation.ring_overhead``). Offered only when every kv shard is a whole number of 128-token splash blocks."""
        axes = assign["s"]
        p = math.prod(self.sizes[a] for a in axes)
        # keys, values (and a key mask) split on their key-sequence dim (label "t"): dim 2 of
        # the marker's [B,H,T,D]; wherever it is for an attention found in the program
        ring_ops = [k for k in range(1, len(n.operands)) if k in req and "t" in n.operand_labels[k]]
        k1 = n.operand_labels[1]
        skv = int(n.params["shape"][3]) if "shape" in n.params else self.T[n.operands[1]].shape[k1.index("t")]
        if skv % (p * RING_BLOCK):
            return None
        kv_req = {k: tuple(axes if lab == "t" else req[k][d] for d, lab in enumerate(n.operand_labels[k]))
                  for k in ring_ops}
        req2 = dict(req)
        req2.update(kv_req)
        per = sum(shard_bytes(self.T[n.operands[k]], kv_req[k], self.sizes) for k in ring_ops)
        comm = 0.0
        for a in axes:
            per *= self.sizes[a]
            comm += self.ac.ring_permute(a, per)
        bytes_dev = sum(shard_bytes(self.T[n.operands[k]], sp, self.sizes) for k, sp in req2.items()) \
            + shard_bytes(out_t, out_spec, self.sizes)
        comp = self.compute_time(n, frac, bytes_dev)
        tiles = None
        kern = self.attention_kernel(n, assign, ring=True)
        if kern is not None:
            comp, tiles = kern
        comp += self.ring_overhead(n, assign, p)
        name = " ".join(f"{lab}:{'+'.join(ax)}" for lab, ax in sorted(assign.items())) + " kv:ring"
        words = _words(n, assign, (), []) + ", keys/values in a ring"
        scaled = comp * self._scale(n.key, "ring")
        s = Strategy(name, self._outs(n, out_spec), {}, max(scaled, comm), comm, words,
                     dict(assign), kv="ring", compute=comp, tiles=tiles)
        s._req_local = req2  # type: ignore[attr-defined]
        return s

    def _outs(self, n, out_spec) -> dict:
        """An anchor's result specs: its output's, and a differentiated attention's log-sum-exp
        [B,H,S] split like the output's first three dims."""
        outs = {n.results[0]: out_spec}
        if n.kind == "attention" and len(n.results) > 1:
            outs[n.results[1]] = tuple(out_spec[:3])
        return outs

    def _scale(self, key: str, kv: str) -> float:
        mine = self.attention_scale.get(key, {})
        return float(mine[kv] if kv in mine else self.attention_scale.get("*", {}).get(kv, 1.0))

    def replicated_node(self, n):
        s = Strategy("replicated", {r: replicated(len(self.T[r].shape)) for r in n.results}, {})
        s._req_local = {k: replicated(len(self.T[t].shape)) for k, t in enumerate(n.operands)  # type: ignore
                        if self.T[t].kind != "literal"}
        bytes_dev = sum(self.T[t].bytes for t in n.operands if self.T[t].kind != "literal") + \
            sum(self.T[t].bytes for t in n.results)
        s.cost = self.compute_time(n, 1.0, bytes_dev)
        s.words = "replicated"
        self._add_node_group(n, [s])

    def source_node(self, n):
        """An op without tensor operands (iota, a broadcast literal): any output spec, no traffic."""
        r = n.results[0]
        t = self.T[r]
        strats = []
        for spec in all_specs(t.shape, self.sizes, self.opts.allow_padding):
            frac = shard_bytes(t, spec, self.sizes) / max(t.bytes, 1)
            s = Strategy(spec_str(spec), {rr: (spec if rr == r else replicated(len(self.T[rr].shape)))
                                         for rr in n.results}, {})
            s._req_local = {k: replicated(len(self.T[x].shape)) for k, x in enumerate(n.operands)  # type: ignore
                            if self.T[x].kind != "literal"}
            s.cost = self.compute_time(n, frac, frac * n.bytes)
            s.words = spec_str(spec)
            strats.append(s)
        self._add_node_group(n, strats)

    def _add_node_group(self, n, strategies):
        gid = n.key
        for s in strategies:
            s.cost *= n.repeat
            s.comm *= n.repeat
            s.compute *= n.repeat
        self.groups[gid] = Group(gid, n.kind, n.key, [n.key], strategies)
        self.group_of_node[n.key] = gid
        for r in n.results:
            self.origin[r] = (gid, r, ())
        self._register_consumption(n, gid)

    def _register_consumption(self, n, gid):
        """Turn each strategy's local operand requirements into req (cross-group) or inner costs."""
        g = self.groups[gid]
        for k, tid in enumerate(n.operands):
            if self.T[tid].kind == "literal":
                continue
            o = self.resolve(tid)
            if o is None:
                continue
            if o[0] == gid:
                memo: dict[tuple[Spec, Spec], float] = {}
                for kk, s in enumerate(g.strategies):
                    need = s._req_local.get(k)  # type: ignore[attr-defined]
                    if need is None:
                        continue
                    have = self.spec_of(tid, kk)
                    if (have, need) not in memo:
                        memo[(have, need)] = reshard_cost(self.T[tid], have, need, self.ac,
                                                          self.opts.dtensor) * n.repeat
                    c = memo[(have, need)]
                    s.cost += c
                    s.comm += c
            else:
                for s in g.strategies:
                    need = s._req_local.get(k)  # type: ignore[attr-defined]
                    if need is not None:
                        s.req[(n.key, k)] = need
                self.pending.append((tid, gid, n.key, k, n.repeat))

    # --- followers
    def follow(self, n, f: int):
        tid = n.operands[f]
        gid = self.resolve(tid)[0]
        g = self.groups[gid]
        memo: dict[Spec, tuple] = {}   # many strategies give the operand the same spec
        for kk, s in enumerate(g.strategies):
            have = self.spec_of(tid, kk)
            if have not in memo:
                out_specs, req_local, comm, frac = self._derive(n, f, have)
                bytes_dev = sum(self.sbytes(n.operands[k], sp) for k, sp in req_local.items()
                                if n.operands[k] not in self._fused_in) \
                    + sum(self.sbytes(r, sp) for r, sp in zip(n.results, out_specs)
                          if r not in self._fused_out)
                c = (self.compute_time(n, frac, bytes_dev) + comm) * n.repeat
                memo[have] = (out_specs, req_local, c, comm * n.repeat)
            out_specs, req_local, c, cm = memo[have]
            for r, sp in zip(n.results, out_specs):
                s.specs[r] = sp
            s._req_local = dict(req_local)  # type: ignore[attr-defined]
            s.cost += c
            s.comm += cm
        g.members.append(n.key)
        self.group_of_node[n.key] = gid
        for r in n.results:
            self.origin[r] = (gid, r, ())
        # the followed operand needs exactly what it has (gathers are in `comm`); others via req
        for s in g.strategies:
            s._req_local.pop(f, None)  # type: ignore[attr-defined]
        self._register_consumption(n, gid)

    def sbytes(self, tid: str, spec: Spec) -> float:
        key = (tid, spec)
        v = self._sb.get(key)
        if v is None:
            v = self._sb[key] = shard_bytes(self.T[tid], spec, self.sizes)
        return v

    def _derive(self, n, f, have: Spec):
        """Output specs, required operand specs, own communication and work fraction of follower n
        when its operand f has spec `have`."""
        sizes = self.sizes
        labs_f = n.operand_labels[f] if f < len(n.operand_labels) else []
        lmap: dict[str, tuple[str, ...]] = {}
        for d, lab in enumerate(labs_f):
            if d < len(have) and have[d]:
                lmap[lab] = have[d]
        comm = 0.0
        src_t = self.T[n.operands[f]]
        out_labels = n.result_labels
        partial_axes: list[str] = []
        dropped: list[str] = []
        extra: dict[int, dict[int, tuple[str, ...]]] = {}   # reshape: result dim -> axes
        if n.kind == "reshape":
            res_t = self.T[n.results[0]]
            extra[0] = {}
            for gi, grp in enumerate(n.groups):
                gin, gout = grp["in"], grp["out"]
                nz_in = [d for d in gin if src_t.shape[d] != 1]
                nz_out = [d for d in gout if res_t.shape[d] != 1]
                if len(nz_in) == 1 and len(nz_out) == 1 and labs_f[nz_in[0]] == out_labels[0][nz_out[0]]:
                    continue   # aligned: the label carries over
                for d in gin:
                    lab = labs_f[d]
                    if lab not in lmap:
                        continue
                    axes = lmap.pop(lab)
                    if nz_in and d == nz_in[0] and nz_out:
                        od = nz_out[0]
                        p = math.prod(sizes[a] for a in axes)
                        if res_t.shape[od] % p == 0:
                            extra[0][od] = axes
                            continue
                    dropped.extend(axes)
        for lab in list(lmap):
            role = n.roles.get(lab, "aligned")
            if role in ("sliced", "expanded", "unit", "regrouped", "split", "merged"):
                dropped.extend(lmap.pop(lab))
            elif role == "reduced":
                partial_axes.extend(lmap.pop(lab))
        # gathers the op cannot avoid: the operand is gathered along those axes
        if dropped:
            cur = [tuple(a for a in axes if a not in dropped) for axes in have]
            per = shard_bytes(src_t, tuple(cur), sizes)
            for a in dropped:
                comm += self.ac.all_gather(a, per)
        out_specs = []
        for k, labs in enumerate(out_labels):
            spec = [lmap.get(lab, ()) for lab in labs]
            for d, axes in extra.get(k, {}).items():
                spec[d] = axes
            out_specs.append(tuple(tuple(x) for x in spec))
        if partial_axes and n.results:
            per = shard_bytes(self.T[n.results[0]], out_specs[0], sizes)
            for a in partial_axes:
                comm += self.ac.all_reduce(a, per)
        req_local = {}
        for k, tid in enumerate(n.operands):
            t = self.T[tid]
            if t.kind == "literal":
                continue
            if k == f:
                req_local[k] = tuple(tuple(a for a in axes if a not in dropped) for axes in have)
                continue
            labs = n.operand_labels[k] if k < len(n.operand_labels) else []
            if len(labs) != len(t.shape):
                req_local[k] = replicated(len(t.shape))
            else:
                req_local[k] = tuple(lmap.get(lab, ()) if n.roles.get(lab) not in ("expanded",) else ()
                                     for lab in labs)
        # fraction of the work one device does: what remains split of the operand it follows
        kept = req_local.get(f, replicated(len(src_t.shape)))
        frac = shard_bytes(src_t, kept, sizes) / max(src_t.bytes, 1)
        return out_specs, req_local, comm, frac

    # --- driver
    def build(self) -> StrategyGraph:
        ir, T = self.ir, self.T
        for tid in ir.inputs:
            self.source_group(f"in:{tid}", "input", tid, forbid0=tid in self.scan_xs_outers)
        for tid, t in T.items():
            if t.kind == "const":
                self.single_group(f"const:{tid}", "const", tid)
        carries = []
        for n in ir.nodes:
            # body inputs of a scan become visible when its first node is reached
            for tid in n.operands:
                self._ensure_body_input(tid, carries)
            tens = [k for k, t in enumerate(n.operands) if T[t].kind != "literal"
                    and self.resolve(t) is not None]
            if n.kind in ANCHOR_KINDS:
                self.anchor(n)
            elif n.kind in REPLICATED_KINDS:
                self.replicated_node(n)
            elif n.kind == "source" or not tens:
                self.source_node(n)
            elif n.kind in FOLLOW_KINDS:
                f = max(tens, key=lambda k: (T[n.operands[k]].bytes, not self._expanded(n.operands[k]), -k))
                joined = self._joined_groups(n, tens)
                self.follow(n, f)
                if self.opts.switch_points and len(joined) > 1:
                    self.switch_point(n)
            else:
                self.replicated_node(n)
        for tid in ir.outputs:
            self.resolve(tid)
        self._keep_stacks_whole()
        self._prune()
        edges = self._edges(carries)
        return StrategyGraph(dict(self.sizes), self.groups, edges, self.group_of_node, self.origin,
                             self.notes, prefetch_room(self.ir, self.ac, self.opts.prefetch_room))

    def _joined_groups(self, n, tens) -> set[str]:
        """The groups whose full-size, real (not broadcast) tensors elementwise op ``n`` joins
        (a residual add joins the stream and a block's output); empty for other ops and for
        outputs under ``Options.switch_min_bytes``."""
        res = self.T[n.results[0]] if n.results else None
        if n.kind != "elementwise" or len(n.results) != 1 or res is None or len(res.shape) < 2 \
                or res.bytes < self.opts.switch_min_bytes:
            return set()
        return {self.resolve(n.operands[k])[0] for k in tens
                if list(self.T[n.operands[k]].shape) == list(res.shape)
                and not self._expanded(n.operands[k])}

    def switch_point(self, n):
        """A group of its own for the output of join ``n``: any spec, reached from the spec the
        join computes in by one reshard (an edge, ``_edges``); later readers follow it."""
        tid = n.results[0]
        gid = f"sw:{n.key}"
        self.switches.append((tid, gid, self.origin[tid], n.repeat))
        self.source_group(gid, "switch", tid, allow_padding=self.opts.allow_padding)

    def _expanded(self, tid: str) -> bool:
        """A tensor made by broadcasting (or a source op): follow real data before it."""
        t = self.T[tid]
        if t.kind != "node":
            return False
        kind = self._node_kind.get(t.producer)
        return kind in ("broadcast", "source")

    def _ensure_body_input(self, tid, carries):
        t = self.T[tid]
        if tid in self.origin or t.kind != "scan_carry":
            if t.kind in ("scan_xs", "scan_const"):
                self._ensure_body_input(t.outer, carries)
            return
        self._ensure_body_input(t.outer, carries)
        self.source_group(f"carry:{tid}", "carry", tid, allow_padding=self.opts.allow_padding)
        carries.append(tid)

    def _keep_stacks_whole(self):
        """Drop each strategy that splits the leading dim of a scanned stack (module docstring:
        Scanned stacks), where its group keeps another."""
        for tid in sorted(self.scan_xs_outers):
            o = self.resolve(tid)
            if o is None or not self.T[tid].shape:
                continue
            g = self.groups[o[0]]
            whole = [k for k in range(len(g.strategies)) if not self.spec_of(tid, k)[0]]
            if whole and len(whole) < len(g.strategies):
                g.strategies = [g.strategies[k] for k in whole]

    def _prune(self):
        """Merge strategies of a group that look the same from outside; cap the count."""
        for g in self.groups.values():
            best: dict[Any, Strategy] = {}
            order = []
            for s in g.strategies:
                sig = (tuple(sorted(s.specs.items())), tuple(sorted(s.req.items())))
                if sig not in best:
                    order.append(sig)
                    best[sig] = s
                elif s.cost < best[sig].cost - 1e-15:
                    best[sig] = s
            strats = [best[k] for k in order]
            if len(strats) > self.opts.max_strategies:
                rep = [s for s in strats if all(not a for sp in s.specs.values() for a in sp)]
                rest = sorted((s for s in strats if s not in rep), key=lambda s: s.cost)
                strats = rep + rest[: self.opts.max_strategies - len(rep)]
                self.notes.append(f"group {g.id}: kept the {self.opts.max_strategies} cheapest strategies")
            g.strategies = strats
            for s in g.strategies:
                if hasattr(s, "_req_local"):
                    del s._req_local

    def _edges(self, carries) -> list[Edge]:
        edges = []
        for tid, cg, node, k, rep in self.pending:
            edges.append(self._edge(tid, cg, node, k, rep,
                                    [s.req[(node, k)] for s in self.groups[cg].strategies]))
        for c in carries:
            t = self.T[c]
            gid = f"carry:{c}"
            mine = [s.specs[c] for s in self.groups[gid].strategies]
            outer_rep = max(1, t.repeat // max(t.trip, 1))
            if self.resolve(t.outer) is not None:
                edges.append(self._edge(t.outer, gid, "", -1, outer_rep, mine))
            if t.loop_back and self.resolve(t.loop_back) is not None:
                edges.append(self._edge(t.loop_back, gid, "", -2, t.repeat, mine))
        for tid, gid, src, rep in self.switches:
            mine = [st.specs[tid] for st in self.groups[gid].strategies]
            edges.append(self._edge(tid, gid, "", SWITCH_EDGE, rep, mine, origin=src))
        # state fed back (ProgramIR.state_aliases): the output in the layout of its input
        for o, i in getattr(self.ir, "state_aliases", ()):
            out_t, gid = self.ir.outputs[o], f"in:{self.ir.inputs[i]}"
            if gid in self.groups and self.resolve(out_t) is not None:
                mine = [s.specs[self.ir.inputs[i]] for s in self.groups[gid].strategies]
                edges.append(self._edge(out_t, gid, "", -3, 1, mine))
        return [e for e in edges if e is not None]

    def _edge(self, tid, cg, node, k, rep, q_list, origin=None):
        o = origin or self.resolve(tid)
        pg = o[0]
        P = self.groups[pg]
        p_list = [self._spec_at(o, tid, kk) for kk in range(len(P.strategies))]
        p_specs = sorted(set(p_list))
        q_specs = sorted(set(q_list))
        pi = {s: i for i, s in enumerate(p_specs)}
        qi = {s: i for i, s in enumerate(q_specs)}
        t = self.T[tid]
        cost = [[reshard_cost(t, a, b, self.ac, self.opts.dtensor) * rep for b in q_specs]
                for a in p_specs]
        if pg == cg:   # a carry fed from its own group: fold into the node costs
            G = self.groups[cg]
            for kk, s in enumerate(G.strategies):
                c = cost[pi[p_list[kk]]][qi[q_list[kk]]]
                s.cost += c
                s.comm += c
            return None
        return Edge(pg, cg, tid, node, k, [pi[s] for s in p_list], [qi[s] for s in q_list],
                    p_specs, q_specs, cost)


def _words(n, assign, combo, partial) -> str:
    role_words = {"batch": "batch", "lhs_free": "rows", "rhs_free": "columns", "contracting":
                  "contracting", "heads": "heads", "q_seq": "sequence", "spatial": "spatial"}
    parts = []
    for lab, axes in sorted(assign.items()):
        r = n.roles.get(lab, lab)
        what = role_words.get(r, r) if n.kind in ATTENTION_KINDS else f"{role_words.get(r, r)}({lab})"
        parts.append(f"{what} on {'+'.join(axes)}")
    for a, (how, d) in zip(partial, combo):
        parts.append(f"partial sum over {a} by " + ("all-reduce" if how == "ar" else f"reduce-scatter to dim {d}"))
    kind = {"attention": "attention", "attention_bwd": "attention backward"}.get(n.kind, n.kind)
    return f"{kind}: " + (", ".join(parts) if parts else "replicated")


def fused_tensors(ir) -> tuple[set[str], set[str]]:
    """(read free, written free): tensors a follower reads from another follower (the compiler
    fuses the chain: the operand stays on chip), and tensors a follower makes that only
    followers consume and the program does not return (never written to HBM). A chain of
    followers then pays HBM once for what enters it and once for what leaves it."""
    kinds = {n.key: n.kind for n in ir.nodes}
    follower_made = {tid for tid, t in ir.tensors.items()
                     if t.kind == "node" and kinds.get(t.producer) in FOLLOW_KINDS}
    cons = ir.consumers()
    outs = set(ir.outputs)
    written_free = {tid for tid in follower_made
                    if tid not in outs and cons.get(tid)
                    and all(kinds.get(c) in FOLLOW_KINDS for c in cons[tid])}
    return follower_made, written_free


def build_strategies(ir, axis_costs: AxisCosts, hardware: Hardware,
                     options: Options | None = None,
                     attention_scale: dict[str, dict[str, float]] | None = None) -> StrategyGraph:
    """Groups, strategies and edges of `ir` on the mesh `axis_costs.sizes`. attention_scale:
    attention node key (or "*") -> kv mode ("gather" | "ring") -> factor on Q1's attention
    compute (module docstring)."""
    if not axis_costs.sizes or len(axis_costs.sizes) > 3:
        raise StrategyError(f"the logical mesh needs 1 to 3 axes, got {axis_costs.sizes}")
    bad = {k: v for k, v in (attention_scale or {}).items()
           if not isinstance(v, dict) or any(mu not in ("gather", "ring") or not isinstance(
               f, (int, float)) or not (f > 0 and math.isfinite(f)) for mu, f in v.items())}
    if bad:
        raise StrategyError(f"attention_scale {bad}: give {{node key or '*': {{'gather' | 'ring': "
                            f"factor}}}} with positive finite factors")
    cs = (options or Options()).compute_scale
    if not (isinstance(cs, (int, float)) and cs > 0 and math.isfinite(cs)):
        raise StrategyError(f"Options.compute_scale={cs!r}: give a positive finite factor")
    return _Builder(ir, axis_costs, hardware, options or Options(), attention_scale).build()
