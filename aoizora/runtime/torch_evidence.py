"""The evidence of a torch layout: what the sharded program issues, with no GPU.

``torch_evidence(ep, layout, target)`` runs the captured program laid out by ``layout``
(``aoizora.runtime.torch_layout.LayoutRunner``) on meta tensors, over a ``DeviceMesh`` of device
type "cuda" on a fake process group (``FakeStore``, ``init_process_group("fake")``: collectives
return at once, no device is touched), under ``CollectiveLog`` (torch's ``CommDebugMode``). A
mesh of type "cuda" matters: on a "cpu" mesh DTensor replaces an all-to-all by an all-gather
(gloo has none); on "cuda" it issues ``shard_dim_alltoall`` as it would on GPUs.

The evidence (``extract.evidence.Evidence``, ``fidelity="dtensor-fake-pg"``) has every collective
(kind, V bytes, replica groups of its mesh dimension), each op's compute at its shard shapes
(attention by ``formulation.flash_attention``, other ops by flops / bytes at the target's peak,
priced by Q2), and the memory per device: arguments (the local shards of parameters and
inputs) plus the peak of live activations in program order (``LayoutRunner.run``: each local
buffer counted once however many views read it, live until its last reader, plus the op's
redistributed operands and the flash-attention working set -- a liveness count, not an
allocator's), against the target's HBM per device. The outputs are live at the end, so they are
in that peak: ``temp_bytes`` is the peak less the outputs, and ``total_bytes`` = arguments +
peak.

The evidence is a function of the program, the layout (its name aside) and the target: it is
kept for the process (``_MEMO``, the last ``MEMO_SIZE``, keyed by ``capture.graph_digest``), so
a layout priced twice -- a plan's seed and the same configuration's row in ``compare_torch`` --
runs once; each call gets its own copy.

The fake process group is torch's process-wide state: ``torch_evidence`` starts one if there is
none and keeps it for the process (``fake_world``), and refuses to run inside a real one.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import logging
import math
import weakref

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from aoizora.extract.evidence import Evidence, MemoryUse
from aoizora.extract.frontends.torch.comm_evidence import (CollectiveLog, group_dims,
                                                          to_evidence)
from aoizora.formulation.flash_attention import flash_attention_seconds
from aoizora.formulation.layout import Layout
from aoizora.runtime.torch_layout import LayoutRunner

HBM_RESERVE = 0.9   # the share of HBM a plan may use (as the ILP's hbm_reserve of 0.1)
MEMO_SIZE = 64
_MEMO: "collections.OrderedDict[tuple, Evidence]" = collections.OrderedDict()
_DIGESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class TorchEvidenceError(RuntimeError):
    """The evidence cannot be collected (the message says why)."""


@contextlib.contextmanager
def fake_world(world_size: int):
    """A fake process group of at least ``world_size`` ranks (this process is rank 0).

    Started here when there is none, and kept for the rest of the process. A fake group that
    is too small is replaced by one of ``world_size`` ranks, and DTensor's caches are emptied
    then (``forget_dtensor_caches``): they keep the meshes of a world past
    ``destroy_process_group``, so a mesh equal to one of the destroyed world reached its dead
    group ("Could not resolve the process group registered under the name 3": 4, then 8, then
    4 devices in one process). ``end_fake_world`` ends it (before a real
    ``init_process_group`` in the same process).

    Raises:
        TorchEvidenceError: a real (not fake) process group is initialized."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        if dist.get_backend() != "fake":
            raise TorchEvidenceError("a process group is already initialized: collect evidence "
                                     "in a process without one (the planner's own)")
        if dist.get_world_size() >= world_size:
            yield
            return
        dist.destroy_process_group()
        forget_dtensor_caches()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    yield


def forget_dtensor_caches() -> None:
    """Empty DTensor's process-wide caches that hold meshes (and so process group names): the
    sharding propagation's (Python and C++ fast path), the redistribution planners and their
    transform plans, the mesh topology of its cost model."""
    from torch.distributed.tensor import _collective_utils, _redistribute
    from torch.distributed.tensor import debug as dtensor_debug

    dtensor_debug._clear_sharding_prop_cache()
    _redistribute.clear_redistribute_planner_cache()
    for fn in (getattr(_redistribute, "_gen_transform_infos", None),
               getattr(_redistribute, "_gen_transform_infos_non_cached", None),
               _collective_utils.MeshTopoInfo.build_from_mesh):
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def end_fake_world() -> None:
    """End the fake process group ``fake_world`` kept, if any (and DTensor's caches of its
    meshes, ``forget_dtensor_caches``)."""
    if dist.is_initialized() and dist.get_backend() == "fake":
        dist.destroy_process_group()
        forget_dtensor_caches()


def fake_mesh(mesh_axes: dict[str, int]) -> DeviceMesh:
    """A "cuda" DeviceMesh over the fake group's ranks, in logical order (module docstring)."""
    shape = tuple(mesh_axes.values())
    return DeviceMesh("cuda", torch.arange(math.prod(shape)).view(shape),
                      mesh_dim_names=tuple(mesh_axes))


def meta_inputs(ep) -> list:
    """Meta tensors shaped as the program's flattened inputs (parameters, buffers, inputs)."""
    out = []
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        v = by_name[spec.arg.name].meta.get("val")
        out.append(torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
                   if isinstance(v, torch.Tensor) else v)
    return out


def torch_evidence(ep, layout: Layout, target) -> Evidence:
    """Evidence of ``layout`` on ``target`` (module docstring). ``target``: an
    ``extract.targets.Target`` (its chip's peak, HBM bandwidth, HBM and clock are read).

    Raises:
        TorchEvidenceError: a process group is already initialized.
        aoizora.runtime.torch_layout.TorchLayoutError: the layout cannot run under DTensor."""
    from aoizora.extract.frontends.torch.capture import graph_digest

    if ep not in _DIGESTS:
        _DIGESTS[ep] = graph_digest(ep)
    key = (_DIGESTS[ep], repr(dataclasses.replace(layout, name="")), target.name)
    if key not in _MEMO:
        _MEMO[key] = _evidence(ep, layout, target)
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    _MEMO.move_to_end(key)
    return copy.deepcopy(_MEMO[key])


def _is_hopper(target) -> bool:
    """A GPU target of compute capability 9.x (FlashAttention-2's Hopper ceiling applies)."""
    if getattr(target, "family", "") != "gpu":
        return False
    from aoizora.extract.hardware.gpu import compute_capability

    try:
        return compute_capability(target.generation)[0] == 9
    except KeyError:
        return False


def _evidence(ep, layout: Layout, target) -> Evidence:
    chip = target.chip
    n = math.prod(layout.mesh_axes.values())
    trace: list = []

    hopper = _is_hopper(target)

    def attention_seconds(b, h, s, t, d):
        return flash_attention_seconds(b, h, s, t, d, chip.device_peak_flops,
                                       chip.device_hbm_bandwidth_Bps, hopper=hopper)

    quiet = logging.getLogger("torch.distributed.tensor._redistribute")
    level = quiet.level
    quiet.setLevel(logging.ERROR)   # its advice to flatten mesh dims, once per redistribution
    try:
        return _run(ep, layout, target, trace, attention_seconds, n)
    finally:
        quiet.setLevel(level)


def _run(ep, layout: Layout, target, trace: list, attention_seconds, n: int) -> Evidence:
    chip = target.chip
    with fake_world(n):
        mesh = fake_mesh(layout.mesh_axes)
        runner = LayoutRunner(ep, layout, mesh, device="meta", trace=trace,
                              attention_seconds=attention_seconds)
        with CollectiveLog(trace, where=lambda: runner.current):
            outs = runner.run(*meta_inputs(ep))
        groups = group_dims(trace, layout.mesh_axes)
        out_bytes = sum(o._local_tensor.numel() * o._local_tensor.element_size()
                        for o in outs if hasattr(o, "_local_tensor"))
    hbm = int(chip.device_hbm_bytes)
    memory = MemoryUse(argument_bytes=runner.argument_bytes, output_bytes=int(out_bytes),
                       temp_bytes=max(int(runner.peak_live_bytes) - int(out_bytes), 0),
                       hbm_bytes=hbm)
    memory.fits = memory.total_bytes <= HBM_RESERVE * hbm
    if not memory.fits:
        memory.oom_message = (f"{memory.total_bytes / 2**30:.2f} GiB per device (parameters and "
                              f"inputs {runner.argument_bytes / 2**30:.2f} GiB, peak live "
                              f"activations {runner.peak_live_bytes / 2**30:.2f} GiB at "
                              f"{runner.peak_node or '?'}) > "
                              f"{HBM_RESERVE:.0%} of {hbm / 2**30:.2f} GiB")
    warnings = [f"ran replicated (no DTensor rule): {f}" for f in runner.fallbacks]
    return to_evidence(trace, layout.mesh_axes, groups, target.name, memory,
                       float(chip.clock_hz), warnings)
