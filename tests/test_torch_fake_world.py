"""One process collects DTensor evidence on 4, then 8, then 4 devices again (as the GPU grid
goes from 8- to 16-GPU cells): the fake process group grows, and DTensor's caches of the
smaller world's meshes do not reach its destroyed groups (``fake_world``)."""

from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import torch.distributed as dist  # noqa: E402

from aoizora.extract.frontends.torch.aten_ir import build_torch_ir  # noqa: E402
from aoizora.extract.frontends.torch.capture import capture  # noqa: E402
from aoizora.extract.targets import get_target  # noqa: E402
from aoizora.models.xdit import XDiTConfig, xdit_layout  # noqa: E402
from aoizora.runtime import torch_evidence as te  # noqa: E402
from benchmarks.torch_models import build_on_meta  # noqa: E402


def test_evidence_on_4_then_8_then_4_devices_in_one_process(monkeypatch):
    monkeypatch.setattr(te, "_MEMO", collections.OrderedDict())    # every call runs
    model, args, kwargs = build_on_meta("wan2.1-1.3b", small=True)
    ep = capture(model, args, kwargs)
    ir = build_torch_ir(ep)
    te.end_fake_world()
    tgt = get_target("v5e-8")
    four, eight = XDiTConfig(cfg=2, ulysses=2), XDiTConfig(cfg=2, ulysses=4)
    first = te.torch_evidence(ep, xdit_layout(ir, four), tgt)
    assert dist.get_world_size() == 4
    assert te.torch_evidence(ep, xdit_layout(ir, eight), tgt).num_devices == 8
    assert dist.get_world_size() == 8
    again = te.torch_evidence(ep, xdit_layout(ir, four), get_target("v5e-4"))
    assert again.num_devices == 4 and dist.get_world_size() == 8
    assert [c.kind for c in again.collectives] == [c.kind for c in first.collectives]
