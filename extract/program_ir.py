"""The partitioner IR: the traced program as a graph of ops with shapes, flops, bytes and the role
of every dimension. Plain dataclasses, no JAX objects, JSON in and out (another frontend can
produce the same IR).

A frontend builds it: JAX tracing in ``aoizora.extract.frontends.jax.ir_builder``
(``build_ir``).

Dimension roles are written as einsum-style *labels*: each dim of each operand and result gets a
label; a label shared by several tensors is one loop dimension of the op, and ``Node.roles`` says
what it is:

- ``dot_general`` / ``conv``: ``batch``, ``lhs_free``, ``rhs_free``, ``contracting``
  (``conv``: ``spatial`` dims are not shared between input and output);
- ``attention``: ``batch``, ``heads``, ``q_seq``, ``kv_seq``, ``head_dim`` (q [B,H,S,D], k/v [B,H,T,D];
  the marker's key mask, if any, is a fourth operand [B,T] labelled ``b``, ``t``, and
  ``params["mask"]`` is True: the representation of a found attention's mask);
  a differentiated attention's forward (``aoizora_attention_fwd``) is an ``attention`` node with a
  second result, the log-sum-exp lse [B,H,S] (``b``, ``h``, ``s``) its backward reads;
- ``attention_bwd`` (``aoizora_attention_bwd``, what ``jax.grad`` makes of an attention): the same
  roles; operands q, k, v, out, lse, do (out and do labelled like q, lse ``b``, ``h``, ``s``) and
  the forward's key mask, if any (seventh, ``b``, ``t``; ``params["mask"]``), results dq (like
  q), dk, dv (like k, v);
- ``elementwise``: ``aligned`` (one label per output dim; scalar operands have none);
- ``reduce``: ``kept`` and ``reduced`` (in the operand only);
- ``broadcast``: ``aligned``, ``new`` (output only), ``expanded`` (a size-1 operand dim that grows);
- ``transpose``: ``moved`` / ``aligned``;
- ``reshape``: ``aligned`` for dims kept as they are, else ``split`` / ``merged`` / ``regrouped`` with
  ``Node.groups`` giving which operand dims become which result dims;
- ``slice`` / ``concat`` / ``pad`` / ``cumulative`` / ``sort``: ``aligned``, and ``sliced`` (a dim whose
  size or order changes: the operand and result labels differ);
- ``stack``: ``aligned``, ``new`` (the stacked dim);
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

IR_VERSION = 2   # 2: hints are names on tensors, not nodes


class IRError(ValueError):
    """The program could not be traced or turned into an IR."""


# ---------------------------------------------------------------------------------------------
# data

@dataclasses.dataclass
class Tensor:
    id: str
    shape: list[int]
    dtype: str
    bytes: int
    kind: str                      # input | node | literal | const | scan_const | scan_carry |
                                   # scan_xs | scan_carry_out | scan_ys
    producer: str | None = None    # node key (kind "node")
    input_index: int | None = None # position among flattened input leaves (kind "input")
    path: str = ""                 # pytree path of an input / output leaf, e.g. "params/blocks/attn/wq"
    outer: str | None = None       # scan body input: the outer tensor it comes from
    loop_back: str | None = None   # scan_carry: the body tensor that becomes the next carry
    inner: str | None = None       # scan outer result: the body tensor it comes from
    scope: str = ""                # key of the scan this tensor lives in ("" = top level)
    value: float | None = None     # literal scalars
    repeat: int = 1                # scan body inputs: times bound per call (as the body's nodes)
    trip: int = 1                  # scan body inputs: the scan's length (1 for while: unknown)
    names: list[str | None] | None = None  # logical dim names from an ``aoizora_hint``, else
                                           # read from a found attention's roles (its q, k, v)
    checkpoint: str | None = None  # the ``checkpoint_name`` tag of this activation, if any


@dataclasses.dataclass
class Node:
    key: str
    primitive: str
    kind: str                      # dot, conv, elementwise, reduce, reshape, transpose, broadcast,
                                   # attention, attention_bwd, slice, concat, pad, gather, scatter,
                                   # cumulative, sort, source, opaque, unknown
    operands: list[str]            # tensor ids (literals included)
    results: list[str]
    flops: float                   # per execution, FLOP
    bytes: float                   # per execution: operands read + results written, bytes
    repeat: int = 1
    scope: str = ""
    operand_labels: list[list[str]] = dataclasses.field(default_factory=list)
    result_labels: list[list[str]] = dataclasses.field(default_factory=list)
    roles: dict[str, str] = dataclasses.field(default_factory=dict)
    groups: list[dict[str, list[int]]] = dataclasses.field(default_factory=list)  # reshape
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    name_stack: str = ""
    source: str = ""               # "file:line (function)"


@dataclasses.dataclass
class ProgramIR:
    nodes: list[Node]
    tensors: dict[str, Tensor]
    inputs: list[str]              # tensor ids of the flattened input leaves
    outputs: list[str]             # tensor ids of the flattened output leaves
    output_paths: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)   # how attention dims were read
    version: int = IR_VERSION
    state_aliases: list[list[int]] = dataclasses.field(default_factory=list)  # [out leaf, in leaf]

    # --- queries
    def node(self, key: str) -> Node:
        for n in self.nodes:
            if n.key == key:
                return n
        raise KeyError(key)

    def by_kind(self, kind: str) -> list[Node]:
        return [n for n in self.nodes if n.kind == kind]

    def edges(self) -> list[tuple[str, str, str]]:
        """(producer node key, consumer node key, tensor id) for every tensor passed node to node
        (through scan aliases: a body input resolves to the outer producer)."""
        out = []
        for n in self.nodes:
            for t in n.operands:
                src = self.source_node(t)
                if src is not None:
                    out.append((src, n.key, t))
        return out

    def source_node(self, tid: str) -> str | None:
        t = self.tensors[tid]
        seen = 0
        while t.kind != "node" and seen < 1000:
            nxt = t.inner or (t.outer if t.kind in ("scan_const", "scan_xs", "scan_carry") else None)
            if nxt is None:
                return None
            t = self.tensors[nxt]
            seen += 1
        return t.producer

    def consumers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            for t in n.operands:
                out.setdefault(t, []).append(n.key)
        return out

    def total_flops(self) -> float:
        return sum(n.flops * n.repeat for n in self.nodes)

    # --- JSON
    def to_json(self) -> dict[str, Any]:
        return {"version": self.version,
                "nodes": [dataclasses.asdict(n) for n in self.nodes],
                "tensors": {k: dataclasses.asdict(t) for k, t in self.tensors.items()},
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "output_paths": list(self.output_paths), "warnings": list(self.warnings),
                "state_aliases": [list(a) for a in self.state_aliases],
                "notes": list(self.notes)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProgramIR":
        return cls(nodes=[Node(**n) for n in d["nodes"]],
                   tensors={k: Tensor(**t) for k, t in d["tensors"].items()},
                   inputs=list(d["inputs"]), outputs=list(d["outputs"]),
                   output_paths=list(d.get("output_paths", [])),
                   warnings=list(d.get("warnings", [])), notes=list(d.get("notes", [])),
                   version=d.get("version", IR_VERSION),
                   state_aliases=[[int(o), int(i)] for o, i in d.get("state_aliases", [])])

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def loads(cls, s: str) -> "ProgramIR":
        return cls.from_json(json.loads(s))
