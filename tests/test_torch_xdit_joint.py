"""xDiT's layouts of joint-attention models (text tokens joined to the video tokens before
attention: HunyuanVideo, CogVideoX) split the video-only tensors over sequence parallel, and the
text-only ones inside the joint blocks when the SP degree divides the text (``xdit_layout``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from aoizora.extract.frontends.torch.aten_ir import build_torch_ir  # noqa: E402
from aoizora.extract.frontends.torch.capture import capture  # noqa: E402
from aoizora.extract.targets import get_target  # noqa: E402
from aoizora.models.xdit import XDiTConfig, joint_parts, xdit_layout  # noqa: E402
from aoizora.runtime.torch_evidence import torch_evidence  # noqa: E402
from benchmarks.torch_models import build_on_meta  # noqa: E402


def _ir(name):
    model, args, kwargs = build_on_meta(name, small=True)
    ep = capture(model, args, kwargs)
    return ep, build_torch_ir(ep)


@pytest.fixture(scope="module")
def cogvideox():
    return _ir("cogvideox-5b")


@pytest.fixture(scope="module")
def hunyuan():
    return _ir("hunyuanvideo-13b")


def _dot_specs(ir, layout, length):
    """Specs of the dot outputs with a sequence dim of ``length`` (dims 1 .. -2)."""
    return [layout.node_specs[n.key] for n in ir.by_kind("dot")
            if any(d == length for d in ir.tensors[n.results[0]].shape[1:-1])]


@pytest.mark.parametrize("which,parts", [("cogvideox", (16, 192)), ("hunyuan", (16, 64))])
def test_joint_parts_are_text_and_video(which, parts, request):
    _, ir = request.getfixturevalue(which)
    assert joint_parts(ir) == parts


def test_wan_has_no_joint_parts():
    _, ir = _ir("wan2.1-1.3b")
    assert joint_parts(ir) is None


@pytest.mark.parametrize("which", ["cogvideox", "hunyuan"])
def test_video_only_tensors_are_split_over_sequence_parallel(which, request):
    ep, ir = request.getfixturevalue(which)
    text, video = joint_parts(ir)
    lay = xdit_layout(ir, XDiTConfig(cfg=2, ulysses=2))
    vids = _dot_specs(ir, lay, video)
    assert vids and all("ulysses" in spec for spec in vids)       # none left replicated
    texts = [s for n in ir.by_kind("dot")
             if text in ir.tensors[n.results[0]].shape[1:-1]
             and n.name_stack.startswith(("transformer_blocks.", "single_transformer_blocks."))
             for s in [lay.node_specs[n.key]]]
    assert all("ulysses" in spec for spec in texts)               # 2 divides 16 text tokens
    assert texts or which == "cogvideox"     # CogVideoX projects the joint tensor, not text
    ev = torch_evidence(ep, lay, get_target("h100-8"))
    assert ev.num_devices == 4 and ev.memory.fits


def test_text_stays_whole_when_sp_does_not_divide_it(hunyuan):
    """32-way SP divides the 64 video tokens, not the 16 text tokens (a layout only: not run)."""
    _, ir = hunyuan
    text, video = joint_parts(ir)
    lay = xdit_layout(ir, XDiTConfig(ulysses=32))
    assert all("ulysses" in spec for spec in _dot_specs(ir, lay, video))
    assert all("ulysses" not in spec for spec in _dot_specs(ir, lay, text))
