"""The collectives a DTensor program issues, as AoiZora's evidence records.

``CollectiveLog`` is torch's ``CommDebugMode`` (it still counts every collective by kind and
module) that also records each functional collective the program issues, in program order,
with its input's shape and dtype and its process group: ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_reduce``, ``all_to_all_single`` and DTensor's
``shard_dim_alltoall``. Run the sharded program under it with a fake process group
(``torch.testing._internal.distributed.fake_pg.FakeStore``, ``init_process_group("fake")``) on
meta tensors, and the program's communication is read without a device or a byte moved.

``to_evidence`` turns a log into ``extract.evidence.Evidence``: each collective with its kind,
V bytes (the larger side per device: the gathered result of an all-gather, the operand of a
reduce-scatter, the buffer of an all-reduce or all-to-all), and its replica groups in logical
ids (positions in the flattened device mesh: every group of the mesh dimension its process
group spans, as every rank issues the same collective). Each collective is its own phase, sync
(DTensor's redistributions block), at its position among the compute ops in program order.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

from aoizora.extract.evidence import Collective, ComputeOp, Evidence, MemoryUse

# functional op name -> (evidence kind, index of the group name argument)
COLLECTIVE_OPS = {
    "all_gather_into_tensor": ("all-gather", 2),
    "reduce_scatter_tensor": ("reduce-scatter", 3),
    "all_reduce": ("all-reduce", 2),
    "all_to_all_single": ("all-to-all", 3),
    "shard_dim_alltoall": ("all-to-all", 3),
}


@dataclasses.dataclass
class IssuedCollective:
    """One collective as the program issued it (rank 0's view)."""

    op: str                    # functional op name, e.g. "all_gather_into_tensor"
    kind: str                  # evidence kind, e.g. "all-gather"
    shape: list[int]           # the input's local shape
    dtype: str
    group_name: str
    group_size: int
    module: str = ""           # the op (FX node) or module it was issued in

    @property
    def bytes(self) -> int:
        """V (module docstring)."""
        n = int(math.prod(self.shape)) * torch.empty((), dtype=getattr(torch, self.dtype)
                                                     ).element_size()
        return n * self.group_size if self.kind == "all-gather" else n


@dataclasses.dataclass
class IssuedCompute:
    """One op's compute at its shard shapes (filled by the program's runner)."""

    name: str
    kind: str                  # "dot", "attention", "elementwise", ...
    flops: float
    bytes: float
    seconds: float | None = None   # a kernel model's time, when it has one (attention)
    kernel: str = ""               # which model priced ``seconds``


class CollectiveLog(CommDebugMode):
    """``CommDebugMode`` that also records every collective (module docstring).

    ``trace`` is shared with the program's runner, which appends ``IssuedCompute`` records, so
    collectives and compute keep one program order; ``where()`` names the op being run (default:
    CommDebugMode's module tracker)."""

    def __init__(self, trace: list | None = None, where: Callable[[], str] | None = None):
        super().__init__()
        self.trace = [] if trace is None else trace
        self.where = where or (lambda: getattr(self.advanced_module_tracker, "name", ""))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not any(t == DTensor for t in types) and not isinstance(
                func, torch._ops.HigherOrderOperator):
            name = func._overloadpacket.__name__
            if name in COLLECTIVE_OPS and args and isinstance(args[0], torch.Tensor):
                kind, gi = COLLECTIVE_OPS[name]
                group = str(args[gi] if len(args) > gi else (kwargs or {}).get("group_name"))
                size = int(args[1]) if name in ("all_gather_into_tensor",) else (
                    int(args[2]) if name == "reduce_scatter_tensor" else 0)
                self.trace.append(IssuedCollective(
                    name, kind, list(args[0].shape), str(args[0].dtype).replace("torch.", ""),
                    group, size, self.where()))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def collectives(self) -> list[IssuedCollective]:
        return [r for r in self.trace if isinstance(r, IssuedCollective)]


def mesh_dim_groups(mesh_shape: Sequence[int], dim: int) -> list[list[int]]:
    """Every group of logical ids along mesh dimension ``dim`` (ids: the flattened mesh)."""
    ids = np.arange(int(np.prod(mesh_shape))).reshape(tuple(mesh_shape))
    moved = np.moveaxis(ids, dim, -1)
    return moved.reshape(-1, mesh_shape[dim]).tolist()


def group_dims(trace: Sequence[Any], mesh_axes: dict[str, int]) -> dict[str, int]:
    """Process group name -> the mesh dimension it spans, for every collective in ``trace``: the
    dimension whose group through rank 0 has the group's ranks (logical ids are ranks here).
    A group that is no mesh dimension's is left out (``to_evidence`` then refuses it)."""
    import torch.distributed as dist

    shape = list(mesh_axes.values())
    by_ranks = {}
    for d in range(len(shape)):
        for g in mesh_dim_groups(shape, d):
            if 0 in g:
                by_ranks[tuple(g)] = d
    out = {}
    for r in trace:
        if isinstance(r, IssuedCollective) and r.group_name not in out:
            pg = dist.distributed_c10d._resolve_process_group(r.group_name)
            ranks = tuple(dist.get_process_group_ranks(pg))
            if ranks in by_ranks:
                out[r.group_name] = by_ranks[ranks]
    return out


def to_evidence(trace: Sequence[Any], mesh_axes: dict[str, int], group_dims: dict[str, int],
                target: str, memory: MemoryUse, clock_hz: float,
                warnings: Sequence[str] = ()) -> Evidence:
    """The Evidence of one run's ``trace`` (module docstring).

    Args:
        trace: ``IssuedCollective`` and ``IssuedCompute`` records in program order.
        mesh_axes: the logical mesh the program ran on (axis name -> size, in order).
        group_dims: process group name -> the mesh dimension it spans.
        target: the target's canonical name; memory: the run's memory use;
        clock_hz: the clock that turns a kernel model's seconds into ``estimated_cycles``.
    Raises:
        ValueError: a collective on a group that is not one mesh dimension's."""
    shape = list(mesh_axes.values())
    colls, comp = [], []
    for i, r in enumerate(trace):
        if isinstance(r, IssuedCollective):
            if r.group_name not in group_dims:
                raise ValueError(f"collective {r.op} on process group {r.group_name}, which is "
                                 f"not one dimension of the mesh {mesh_axes}")
            d = group_dims[r.group_name]
            if not r.group_size:
                r.group_size = shape[d]
            colls.append(Collective(
                name=f"{r.op}.{len(colls)}", kind=r.kind, dtype=r.dtype, bytes=r.bytes,
                replica_groups=mesh_dim_groups(shape, d), phase=len(colls),
                op_name=r.module, start_index=i, done_index=i))
        else:
            cycles = None if r.seconds is None else r.seconds * clock_hz
            comp.append(ComputeOp(name=r.name, kind=r.kind, estimated_cycles=cycles,
                                  flops=r.flops, bytes=r.bytes, index=i,
                                  custom_call_target=r.kernel))
    return Evidence(target=target, mesh_axes=dict(mesh_axes), fidelity="dtensor-fake-pg",
                    collectives=colls, compute=comp, memory=memory,
                    flops=float(sum(c.flops for c in comp)),
                    bytes_accessed=float(sum(c.bytes for c in comp)), clock_hz=clock_hz,
                    warnings=list(warnings))
