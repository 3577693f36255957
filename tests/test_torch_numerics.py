"""A planned, sharded Wan transformer (diffusers' ``WanTransformer3DModel``, 2 layers, tiny
dims) runs in 4 processes under gloo and matches the unsharded model: the ILP's plan and two of
xDiT's configurations (Ulysses x tensor parallel, CFG x Ulysses), each laid out by DTensor
(``aoizora.runtime.torch``). Tolerance: float32, |sharded - unsharded| <= 1e-4 + 1e-4 |ref|."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from aoizora.extract.frontends.torch.capture import capture  # noqa: E402
from aoizora.planning.torch_planner import plan_torch  # noqa: E402
from aoizora.models.xdit import XDiTConfig, xdit_layout  # noqa: E402

WORLD = 4
from tiny_models import TINY_WAN  # noqa: E402


def tiny_wan():
    """The tiny model with seeded weights and its inputs (batch 2: a CFG pair)."""
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(**TINY_WAN).eval()
    inputs = (torch.randn(2, 4, 4, 8, 8), torch.tensor([500, 500]), torch.randn(2, 16, 32))
    return model, inputs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_planned_sharded_wan_matches_unsharded(tmp_path):
    model, inputs = tiny_wan()
    with torch.no_grad():
        ref = model(*inputs, return_dict=False)[0]
    ep = capture(model, inputs, {"return_dict": False})
    plans = {
        "ilp": plan_torch(ep, inputs, "v5e-4", meshes=[{"x": 2, "y": 2}], top_k=1,
                          max_candidates=1, time_budget_s=60),
        "ulysses_tp": plan_torch(ep, inputs, "v5e-4", meshes=[], time_budget_s=60, seed_layouts=[
            functools.partial(xdit_layout, config=XDiTConfig(ulysses=2, tp=2))]),
        "cfg_ulysses": plan_torch(ep, inputs, "v5e-4", meshes=[], time_budget_s=60, seed_layouts=[
            functools.partial(xdit_layout, config=XDiTConfig(cfg=2, ulysses=2))]),
    }
    assert plans["ulysses_tp"].mesh == {"ulysses": 2, "tp": 2}
    for name, p in plans.items():
        p.save(str(tmp_path / f"plan_{name}.json"))
    torch.export.save(ep, str(tmp_path / "program.pt2"))
    torch.save(inputs, str(tmp_path / "inputs.pt"))
    worker = os.path.join(os.path.dirname(__file__), "torch_numerics_worker.py")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, worker, str(r), str(WORLD), str(port),
                               str(tmp_path)], stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(e[-2000:] for e in errs)
    for name in plans:
        got = torch.load(str(tmp_path / f"out_plan_{name}.json.pt"))
        assert got["out"].shape == ref.shape
        assert torch.allclose(got["out"], ref, atol=1e-4, rtol=1e-4), (
            name, float((got["out"] - ref).abs().max()))
        # the norms of tensor-parallel q and k ran split (a [.., 1] all-reduce), not gathered
        assert not [f for f in got["fallbacks"] if "norm" in f], (name, got["fallbacks"])
