"""Validation on GPUs (issue 49): published, measured DiT latencies on multi-GPU boxes against Q2
on the same configuration rebuilt here.

    python -m benchmarks.gpu_validation              # price every row, write results/gpu_validation.*
    python -m benchmarks.gpu_validation --report     # the table again from the JSON only

Labels: ``measured`` is the publisher's figure (its URL and what it states are in each row);
``predicted`` is Q2 (``formulation.latency.predict_step``: the GPU network model and the
flash-attention kernel model, ``formulation.flash_attention``) on DTensor evidence of the
configuration under a fake process group (``runtime.torch_evidence``), in xDiT's device order
(``models.xdit.default_order``), on ``stream_layout``: the repo's ``models.xdit.xdit_layout``
plus the token stream sharded everywhere, as xDiT runs it (``xdit_layout`` alone, what
``aoizora.torch_compare.compare_torch`` prices, leaves the video stream of dual-stream blocks and
the residual stream replicated: its Q2 is reported beside, ``repo_layout_*``). Nothing ran on a
GPU here.

Every published figure below is a WHOLE RUN (text encoders, every denoising step, VAE decode,
and for the eager PyTorch figures the launch overheads) of ``steps`` steps. The headline is the
error of a predicted WHOLE RUN against it:

    predicted run = steps x Q2(one DiT step) + VAE decode + text encoders

with the VAE decode priced from its real graph by the same compute model as the DiT step, on
one GPU of the row's box (``benchmarks.pipeline_parts``: diffusers' decoder at the publisher's
latents, tiled / chunked as the publisher's code decodes; xDiT runs the VAE on one GPU's time
unless ``--use_parallel_vae``, which no published table states), and the text encoders by an
estimate that is under 1% of every run here (reported, ``encoders_estimate_s``, not added:
``pipeline_parts.NEGLIGIBLE``). ``measured / steps`` is still shown, as an UPPER BOUND of one
DiT step (``bound``), with the per-step error against it.

Beside ``predicted``, two diagnostics on the same evidence (not fitted either): ``xdit_collectives``
= Q2 less the all-gathers DTensor issues to slice / concatenate the joint [text, video] sequence
of diffusers' blocks (``joint_gather``: xDiT appends the replicated text locally, so it issues no
such collective; ring attention's key/value gathers are kept), and ``compute_s`` alone. The error is
(predicted - measured per step) / measured per step: a negative error up to the share of the
run outside the DiT is expected even from an exact DiT model. One constant was changed or fitted
on these rows: none; so every row is ``independent``.

Rows, and how each is rebuilt (model on the meta device from diffusers' classes at the
publisher's model config, ``benchmarks.torch_models`` for the configs):
- HunyuanVideo (13B) with xDiT Ulysses, official repo, 50 steps, 1280x720 and 960x960 at 129
  frames (latents 33 x 90 x 160 / 33 x 120 x 120: 118,800 video tokens either way, + 256 text
  tokens), batch 1 (HunyuanVideo is guidance-distilled: no CFG batch), on 1-8 H100 and 1-8 H20.
  H100: the HGX H100 board of ``h100-8`` (the publisher says "H100"; SXM with NVSwitch is
  assumed), k < 8 GPUs = k GPUs of that board. H20: no target in the repo and no NVIDIA
  datasheet; built here from its reported numbers (``H20``), Hopper NVLink4 as the H100's board.
- FLUX.1-dev (12B image DiT) with xDiT USP on 4 x H100, 1024 x 1024 (4,096 image + 256 text
  tokens: xDiT's flux example passes ``max_sequence_length=256``), 28 steps, batch 1
  (guidance-distilled), both published columns (eager PyTorch and torch.compile; Q2 prices
  neither's launches nor fusion: one model for both columns).
- ConsisID (identity-preserving text-to-video, a CogVideoX-5B transformer with face modules)
  with xDiT USP + CFG on 1-6 H100, 720 x 480, 49 frames, 50 steps: priced with CogVideoX-5B's
  transformer at its native shape (17,550 video + 226 text tokens), batch 2 (CFG). The model is
  approximate (ConsisID's face-feature cross-attentions and its 32 input channels are left out),
  so these rows are reported but kept out of the headline median.
- Sana 1600M at 4096 x 4096 (xDiT's sana.md: ``Sana_1600M_4Kpx_BF16_diffusers``, 20 steps) on
  1-8 A100 of an 8 x A100 NVLink box (``a100-8``; k < 8 GPUs of its board), every published
  combination of cfg, Ulysses, ring and PipeFusion: diffusers' ``SanaTransformer2DModel`` at
  the 4K config (``SANA_4K``), 16,384 image tokens, batch 2 (CFG). Its self-attention is linear
  (matmuls, no flash kernel: Ulysses and ring are both the sequence split of those matmuls
  here), PipeFusion is ``torch_compare.pipefusion_evidence``'s steady-state model (pp patches).

The headline median is over rows whose GPU and model are both the published ones (H100 rows of
HunyuanVideo and FLUX, A100 rows of Sana); medians over the built-H20 rows and the
approximate-model rows are given beside it, each for the whole run and for the per-step bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import git_state, machine_info, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "gpu_validation"

XDIT_HY = "https://github.com/xdit-project/xDiT/blob/main/docs/performance/hunyuanvideo.md"
XDIT_FLUX = "https://github.com/xdit-project/xDiT/blob/main/docs/performance/flux.md"
XDIT_CONSISID = "https://github.com/xdit-project/xDiT/blob/main/docs/performance/consisid.md"
XDIT_SANA = "https://github.com/xdit-project/xDiT/blob/main/docs/performance/sana.md"
SANA_4K_CONFIG = ("https://github.com/NVlabs/Sana/blob/main/configs/sana_config/4096ms/"
                  "Sana_1600M_img4096_bf16.yaml")
H20_SPECS = "https://willitrunai.com/es/gpus/h20-96gb"
FLUX_SCRIPT = ("https://github.com/xdit-project/xDiT/blob/8275240ce1f3bbeeb96bba6bb7115aaa879ff524/"
               "examples/flux_example.py")

# H20 (Hopper, sm_90): 148 TFLOP/s dense FP16/BF16, 96 GB HBM3 at 4.0 TB/s, NVLink4 900 GB/s
# both ways (18 links, as the H100 SXM). NVIDIA publishes no H20 datasheet; these are the
# numbers reported for it (H20_SPECS), a built target, not one of the repo's.
H20 = dict(device_kind="NVIDIA H20 (built from reported specs)", peak_bf16_flops=148e12,
           hbm_bytes=96 * 10**9, hbm_bandwidth_Bps=4.0e12)


@dataclasses.dataclass(frozen=True)
class Row:
    """One published, measured figure and the configuration it was measured on."""

    source: str
    states: str                 # what the publisher states (paraphrased, with the number)
    gpu: str                    # "h100" or "h20"
    gpus: int
    model: str                  # a key of MODELS
    config: dict                # XDiTConfig degrees
    steps: int
    measured_s: float           # the publisher's whole-run seconds
    same_gpu: bool = True       # the published GPU is one of the repo's targets' GPUs
    exact_model: bool = True    # the model priced is the published one
    note: str = ""


def _hy(res: str, gpu: str, n: int, run_s: float) -> Row:
    shape = "1280x720" if res == "720p" else "960x960"
    return Row(XDIT_HY, f"{shape}, 129 frames, 50 steps, Ulysses latency on {n} x "
                        f"{gpu.upper()}: {run_s:,.2f} s", gpu, n, f"hunyuanvideo-{res}",
               {"ulysses": n}, 50, run_s, same_gpu=gpu == "h100",
               note=("official HunyuanVideo repo with xDiT; " +
                     ("H20 target built here from reported specs" if gpu == "h20" else
                      "H100 SXM (HGX, NVSwitch) assumed")))


_FLUX = [("1 GPU", {}, 6.71, 4.30), ("Ulysses-2", {"ulysses": 2}, 4.38, 2.68),
         ("Ring-2", {"ring": 2}, 5.31, 2.60), ("Ulysses-2 x Ring-2", {"ulysses": 2, "ring": 2},
                                               5.19, 1.80),
         ("Ulysses-4", {"ulysses": 4}, 4.24, 1.63), ("Ring-4", {"ring": 4}, 5.11, 1.98)]
_CONSISID = [(6, 2, 3, 1, 44.89), (6, 3, 2, 1, 44.24), (6, 1, 3, 2, 35.78), (6, 3, 1, 2, 38.35),
             (4, 2, 1, 2, 41.37), (4, 1, 2, 2, 40.68), (3, 3, 1, 1, 53.57), (3, 1, 3, 1, 55.51),
             (2, 1, 2, 1, 70.19), (2, 2, 1, 1, 76.56), (2, 1, 1, 2, 59.72),
             (1, 1, 1, 1, 114.87)]
# xDiT's sana.md table: (GPUs, cfg, ulysses, ring, pp, seconds), 8 x A100 (NVLink)
_SANA = [(1, 1, 1, 1, 1, 17.551), (2, 1, 1, 1, 2, 11.276), (2, 1, 1, 2, 1, 11.447),
         (2, 1, 2, 1, 1, 10.175), (2, 2, 1, 1, 1, 8.365), (4, 2, 1, 1, 2, 5.599),
         (4, 2, 1, 2, 1, 5.702), (4, 2, 2, 1, 1, 5.803), (8, 2, 1, 1, 4, 4.050),
         (8, 2, 1, 2, 2, 4.091), (8, 2, 1, 4, 1, 4.003), (8, 2, 2, 1, 2, 4.201),
         (8, 2, 2, 2, 1, 3.991)]


def published_rows() -> list[Row]:
    """Every published figure priced here (module docstring)."""
    rows = []
    for gpu, by_n in (("h100", {1: 1904.08, 2: 925.04, 4: 514.08, 8: 337.58}),
                      ("h20", {1: 6639.17, 2: 3400.55, 4: 1762.86, 8: 940.97})):
        rows += [_hy("720p", gpu, n, s) for n, s in by_n.items()]
    for gpu, by_n in (("h100", {1: 1735.01, 2: 934.09, 3: 645.45, 6: 367.02}),
                      ("h20", {1: 6621.46, 2: 3400.55, 3: 2310.48, 6: 1214.67})):
        rows += [_hy("960", gpu, n, s) for n, s in by_n.items()]
    for label, cfg, eager, compiled in _FLUX:
        n = cfg.get("ulysses", 1) * cfg.get("ring", 1)
        for col, s in (("PyTorch", eager), ("torch.compile", compiled)):
            rows.append(Row(XDIT_FLUX, f"FLUX.1-dev, 28 steps, on 4xH100: {label}, {col} "
                                       f"{s:.2f} s", "h100", n, "flux-dev-1024", cfg, 28, s,
                            note=f"{col} column; 1024px assumed (the figure below the table "
                                 "says 1024px); H100 SXM (HGX, NVSwitch) assumed"))
    for n, uly, ring, cfg, s in _CONSISID:
        rows.append(Row(XDIT_CONSISID, f"720x480, 49 frames, 50 steps, {n} x H100, ulysses "
                                       f"{uly} ring {ring} cfg {cfg}: {s:.2f} s", "h100", n,
                        "cogvideox-5b", {"ulysses": uly, "ring": ring, "cfg": cfg}, 50, s,
                        exact_model=False,
                        note="ConsisID priced as CogVideoX-5B's transformer (its base; face "
                             "modules left out); H100 SXM (HGX, NVSwitch) assumed"))
    for n, cfg, uly, ring, pp, s in _SANA:
        rows.append(Row(XDIT_SANA, f"Sana_1600M_4Kpx_BF16_diffusers, 4096x4096, 20 steps, on "
                                   f"8xA100 (NVLink): cfg {cfg} ulysses {uly} ring {ring} pp "
                                   f"{pp}, {n} GPUs: {s:.3f} s", "a100", n, "sana-1600m-4k",
                        {"cfg": cfg, "ulysses": uly, "ring": ring, "pipefusion": pp}, 20, s,
                        note="HGX A100 board (NVSwitch, 12 NVLink3 links per GPU); k < 8 GPUs "
                             "of it" + ("; PipeFusion by torch_compare's steady-state model"
                                        if pp > 1 else "")))
    return rows


# ----------------------------------------------------------------------------- models

def _hunyuan(lat_hw: tuple[int, int]):
    """HunyuanVideo at 129 frames (33 latent frames) of ``lat_hw`` latents, batch 1
    (guidance-distilled: no CFG batch)."""
    from benchmarks.torch_models import BUILDERS

    return BUILDERS["hunyuanvideo-13b"](False, 1, (33,) + tuple(lat_hw))


FLUX_DEV = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38,
                attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))


def _flux():
    import torch
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(**FLUX_DEV).to(torch.bfloat16)
    # 1024 px / VAE 8 / packed 2x2 = 64 x 64 tokens; T5 text: xDiT's flux_example.py passes
    # max_sequence_length=256 (FLUX_SCRIPT)
    img, txt = 64 * 64, 256
    args = (torch.randn((1, img, 64), dtype=torch.bfloat16),
            torch.randn((1, txt, 4096), dtype=torch.bfloat16),
            torch.randn((1, 768), dtype=torch.bfloat16), torch.full((1,), 0.5),
            torch.zeros((img, 3)), torch.zeros((txt, 3)), torch.full((1,), 3.5))
    return model, args, {"return_dict": False}


SANA_4K = dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32,
               num_layers=20, num_cross_attention_heads=20, cross_attention_head_dim=112,
               cross_attention_dim=2240, caption_channels=2304, mlp_ratio=2.5, sample_size=128,
               patch_size=1, interpolation_scale=2)


def _sana():
    import torch
    from diffusers import SanaTransformer2DModel

    model = SanaTransformer2DModel(**SANA_4K).to(torch.bfloat16)
    b = 2                                # CFG: xDiT's cfg parallel splits this pair
    args = (torch.randn((b, 32, 128, 128), dtype=torch.bfloat16),
            torch.randn((b, 300, 2304), dtype=torch.bfloat16), torch.full((b,), 500.0))
    return model, args, {"return_dict": False}


def _cogvideox():
    from benchmarks.torch_models import build_on_meta
    return build_on_meta("cogvideox-5b", batch=2)


MODELS = {
    "hunyuanvideo-720p": ("HunyuanVideo 13B, 1280x720 129 frames: latents 16x33x90x160, "
                          "118,800 video + 256 text tokens, batch 1", lambda: _hunyuan((90, 160))),
    "hunyuanvideo-960": ("HunyuanVideo 13B, 960x960 129 frames: latents 16x33x120x120, "
                         "118,800 video + 256 text tokens, batch 1", lambda: _hunyuan((120, 120))),
    "flux-dev-1024": ("FLUX.1-dev 12B, 1024x1024: 4,096 image + 256 text tokens (xDiT's "
                      "flux_example.py: max_sequence_length=256), batch 1", _flux),
    "cogvideox-5b": ("CogVideoX-5B transformer, 720x480 49 frames: 17,550 video + 226 text "
                     "tokens, batch 2 (CFG)", _cogvideox),
    "sana-1600m-4k": ("Sana 1600M (SanaMS_1600M_P1_D20: 20 blocks, width 2240, 70 linear-"
                      "attention heads of 32, GLUMBConv FFN x2.5, " + SANA_4K_CONFIG + "), "
                      "4096x4096: DC-AE f32 latents 32x128x128, 16,384 image tokens, Gemma "
                      "text 300 tokens, batch 2 (CFG)", _sana),
}


def build(name: str):
    import torch

    with torch.device("meta"):
        return MODELS[name][1]()


# ----------------------------------------------------------------------------- targets

def box_target(gpu: str, n: int):
    """n GPUs of an HGX board (NVSwitch; NCCL's per-link bandwidth, 18 NVLink4 links per H100 /
    H20, 12 NVLink3 per A100): ``h100-8`` / ``a100-8`` themselves for 8; else the same board's
    links on n GPUs, H20 with its chip numbers (``H20``)."""
    from aoizora.extract.hardware import gpu as G
    from aoizora.extract.hardware.records import Fabric, Link
    from aoizora.extract.targets import get_target

    if gpu in ("h100", "a100") and n == 8:
        return get_target(f"{gpu}-8")
    chip = G.GPUS["a100" if gpu == "a100" else "h100"]
    if gpu == "h20":
        chip = dataclasses.replace(chip, **H20)
    sm, links_per, per = ("80", 12, G.SM80_NVLINK_Bps) if gpu == "a100" else \
        ("90", 18, G.SM90_NVLINK_Bps)
    gpus = tuple(f"gpu{i}" for i in range(n))
    src = (f"NCCL topo.h SM{sm}_NVLINK_BW x {links_per} links (as {'a100' if sm == '80' else 'h100'}"
           "-8); latency: NCCL tuning.cc hwLat NVLink Ring/Simple / 2")
    links = tuple(Link(g, "nvswitch", links_per * per, G.NVLINK_STEP_S / 2, "nvlink", src)
                  for g in gpus)
    fabric = Fabric(gpus, tuple((i,) for i in range(n)), ("nvswitch",), links,
                    f"{n} x {gpu.upper()} of an HGX board (NVSwitch, {links_per} NVLink links "
                    "per GPU)")
    return G.make_target(f"{gpu}-{n}-hgx(built)", chip, fabric)


# ----------------------------------------------------------------------------- pricing

STREAM = {"hunyuanvideo-720p": (1, (118_800, 119_056)), "hunyuanvideo-960": (1, (118_800, 119_056)),
          "flux-dev-1024": (1, (4_096, 4_352)), "cogvideox-5b": (2, (17_550, 17_776)),
          "sana-1600m-4k": (2, (16_384,))}


def stream_layout(ep, ir, config, lengths, batch: int):
    """xDiT's USP as it runs a joint-attention DiT: ``models.xdit.xdit_layout`` plus a spec on
    every [batch, tokens, width] activation of the program whose token length is the image /
    video stream's or the joint (text + video) sequence's (``lengths``): tokens on (ring,
    ulysses), the batch on cfg. ``xdit_layout`` shards only dot outputs of the joint length,
    so the video stream of a dual-stream block (HunyuanVideo's double blocks, FLUX's) and the
    residual stream (DTensor propagates a replicated add) run replicated on every device; xDiT
    splits the image tokens over the sequence-parallel group for the whole step. The text
    stream stays replicated, as in xDiT, except inside the joint sequence (sharded with it:
    the 256-512 text tokens are then counted once, not on every device)."""
    import torch

    from aoizora.models.xdit import xdit_layout

    lay = xdit_layout(ir, config)
    sizes = lay.mesh_axes
    seq = tuple(a for a in ("ring", "ulysses") if sizes.get(a, 1) > 1)
    seq_ax = None if not seq else seq[0] if len(seq) == 1 else seq
    cfg_ax = "cfg" if sizes.get("cfg", 1) > 1 else None
    if seq_ax is None:
        return lay
    specs = dict(lay.node_specs)
    by_fx = {k.split(".")[0]: k for k in specs}
    for node in ep.graph.nodes:
        v = node.meta.get("val") if node.op == "call_function" else None
        if not isinstance(v, torch.Tensor) or v.dim() != 3 or v.shape[1] not in lengths:
            continue
        key = by_fx.get(node.name, node.name)
        old = list(specs.get(key, (cfg_ax if v.shape[0] == batch else None, None, None)))
        old[1] = seq_ax
        specs[key] = tuple(old)
    return dataclasses.replace(lay, node_specs=specs, name=lay.name + " (+ token stream)")


def patch_bytes(ep, config, seq: int) -> float:
    """One PipeFusion patch's activations [B, S/M, D] per device of a stage (bf16), M = pp
    patches (xDiT's default), B the program's batch, D the widest [B, S, D] activation's width."""
    import torch

    b, d = 1, 0
    for node in ep.graph.nodes:
        v = node.meta.get("val") if node.op == "call_function" else None
        if isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[1] == seq:
            b, d = int(v.shape[0]), max(d, int(v.shape[2]))
    split = config.pipefusion * config.cfg * config.ring * config.ulysses
    return b * seq * d * 2 / split


def joint_gather(c) -> bool:
    """An all-gather DTensor issues to slice a sharded joint sequence into its text and video
    parts or to concatenate them (diffusers' dual- and single-stream blocks: ``cat`` / ``slice``
    of [text, video] along the tokens). xDiT never gathers there: each rank appends the whole
    text stream to its video shard locally (its joint-attention strategy)."""
    return c.kind == "all-gather" and re.match(r"(slice|cat)_\d", c.op_name or "") is not None


# ----------------------------------------------------------------------------- execution modes

# ATen ops that make a view (no kernel, no HBM traffic on a GPU) and pointwise ops a fusing
# compiler (Inductor) folds into a neighbouring kernel; by the op name of the FX node
VIEW_OPS = frozenset("""view _unsafe_view reshape flatten unflatten unsqueeze squeeze permute
transpose t expand slice select unbind split split_with_sizes chunk narrow alias detach as_strided
lift_fresh_copy""".split())
NORM_OPS = frozenset("layer_norm rms_norm group_norm native_layer_norm native_group_norm "
                     "cat stack".split())


def _stem(name: str) -> str:
    return re.sub(r"(_\d+)?(\..*)?$", "", name)


def execution_modes(ev) -> dict[str, Any]:
    """Two structural renderings of the same evidence (item 3 of the whole-run task; neither is
    the headline's Q2, which prices EVERY op, views included, at its bytes read and written):

    - ``unfused`` (eager PyTorch): every op that launches a kernel is its own kernel, reading its
      operands from and writing its result to HBM (``max(flops / peak, bytes / HBM)``, as Q2);
      views (``VIEW_OPS``: view, permute, slice, unbind, ...) are metadata and cost nothing.
      GPU time only: the CPU's per-kernel launch and dispatch time is not priced (its kernel
      count is reported, ``kernels``).
    - ``fused`` (torch.compile / Inductor): matmuls, convolutions and attention as in Q2; norms
      and concatenations one pass over their operands; every other pointwise op folded into a
      neighbouring kernel (no HBM traffic of its own); views free. A lower bound of what a
      fusing compiler leaves (it does not always fuse into matmul epilogues)."""
    from aoizora.extract.frontends.torch.ops import ELEMENTWISE

    unf, fus = [], []
    kernels = 0
    for o in ev.compute:
        stem = _stem(o.name)
        if o.kind in ("dot", "attention") or o.estimated_cycles is not None:
            unf.append(o), fus.append(o)
            kernels += o.count
            continue
        if stem in VIEW_OPS:
            z = dataclasses.replace(o, flops=0.0, bytes=0.0)
            unf.append(z), fus.append(z)
            continue
        kernels += o.count
        unf.append(o)
        fus.append(o if stem in NORM_OPS or stem not in ELEMENTWISE
                   else dataclasses.replace(o, flops=0.0, bytes=0.0))
    return {"unfused": dataclasses.replace(ev, compute=unf),
            "fused": dataclasses.replace(ev, compute=fus), "kernels": kernels}


def price(ep, ir, row: Row) -> dict[str, Any]:
    """Q2 of ``row``'s configuration (module docstring): seconds of one DiT step, on the layout
    of xDiT's USP over the whole token stream (``stream_layout``), and on the repo's
    ``xdit_layout`` alone (``repo_layout_*``: what ``compare_torch`` prices)."""
    from aoizora.extract.network import Network
    from aoizora.formulation.latency import predict_step
    from aoizora.models.xdit import XDiTConfig, default_order, xdit_layout
    from aoizora.runtime.torch_evidence import fake_world, torch_evidence
    from aoizora.torch_compare import pipefusion_evidence

    c = XDiTConfig(**row.config)
    inner = dataclasses.replace(c, pipefusion=1)
    tgt = box_target(row.gpu, row.gpus)
    if c.devices != tgt.num_devices:
        raise ValueError(f"{c.name}: {c.devices} devices on a {tgt.num_devices}-GPU target")
    net = Network.from_target(tgt)
    batch, lengths = STREAM[row.model]
    out = {"xdit_config": c.name, "flags": " ".join(c.flags()), "target": tgt.name,
           "target_description": tgt.fabric.description}
    for prefix, lay in (("", stream_layout(ep, ir, inner, lengths, batch)),
                        ("repo_layout_", xdit_layout(ir, inner))):
        with fake_world(max(8, tgt.num_devices)):
            ev = torch_evidence(ep, lay, tgt)
        modes = execution_modes(ev) if not prefix else {}
        if c.pipefusion > 1:        # torch_compare's steady-state model from a stage's evidence
            ev = pipefusion_evidence(ev, c, patch_bytes(ep, c, max(lengths)))
            for m in ("unfused", "fused"):
                if m in modes:
                    modes[m] = pipefusion_evidence(modes[m], c, patch_bytes(ep, c, max(lengths)))
        for m in ("unfused", "fused"):
            if m in modes:
                out[m + "_step_s"] = predict_step(modes[m], default_order(c), net).step_s
        if modes:
            out["kernels"] = modes["kernels"]
        q = predict_step(ev, default_order(c), net)
        out.update({prefix + "step_s": q.step_s, prefix + "compute_s": q.compute_s,
                    prefix + "communication_s": q.communication_s})
        if prefix:
            continue
        out.update(layout=lay.name, fits_hbm=bool(ev.memory.fits),
                   hbm_note=ev.memory.oom_message or "", fallbacks=ev.warnings)
        joint = [x for x in ev.collectives if joint_gather(x)]
        kept = dataclasses.replace(ev, collectives=[x for x in ev.collectives
                                                    if not joint_gather(x)])
        qx = predict_step(kept, default_order(c), net)
        out.update(xdit_collectives_step_s=qx.step_s,
                   xdit_collectives_communication_s=qx.communication_s,
                   joint_gathers=len(joint),
                   joint_gather_bytes=sum(x.bytes * x.count for x in joint))
    return out


def whole_run(r: dict) -> dict[str, Any]:
    """The predicted whole run of a priced record (module docstring): steps x step + VAE decode
    (+ the text encoders when they reach ``NEGLIGIBLE`` of it); {} for a record priced before the
    VAE was (no ``vae_decode_s``)."""
    from benchmarks.pipeline_parts import NEGLIGIBLE

    if r.get("step_s") is None or r.get("vae_decode_s") is None:
        return {}
    dit = r["steps"] * r["step_s"]
    run = dit + r["vae_decode_s"]
    enc = r.get("encoders_estimate_s") or 0.0
    added = enc >= NEGLIGIBLE * (run + enc)
    run += enc if added else 0.0
    out = {"predicted_dit_s": dit, "predicted_run_s": run, "encoders_added": added,
           "vae_share": r["vae_decode_s"] / run,
           "run_error": (run - r["measured_s"]) / r["measured_s"]}
    mode = execution_mode(r)
    if r.get(mode + "_step_s") is not None:
        mrun = run - dit + r["steps"] * r[mode + "_step_s"]
        out.update(mode=mode, mode_run_s=mrun,
                   mode_run_error=(mrun - r["measured_s"]) / r["measured_s"])
    return out


def execution_mode(r: dict) -> str:
    """Which structural rendering models the row's published column: ``fused`` for FLUX's
    torch.compile column; ``unfused`` (eager) for every other row -- FLUX's PyTorch column, the
    official HunyuanVideo repo, and xDiT's ConsisID and Sana scripts as committed
    (``COMPILE_FLAG`` commented out in ``examples/run_consisid_usp.sh`` at 970d5ce and
    ``examples/run.sh`` at 21dcdcf)."""
    return "fused" if r["note"].startswith("torch.compile column") else "unfused"


def table(records: list[dict]) -> dict[str, Any]:
    """Errors and medians of priced records (each a ``Row`` as a dict plus ``price``'s keys and
    ``pipeline_parts``' VAE / encoder keys). ``median_abs_error`` is over the whole-run errors
    (the headline; over the per-step bound errors for records priced before the VAE was:
    ``median_abs_error_is``); ``median_abs_step_bound_error`` over the per-step errors against
    measured / steps."""
    out = []
    for r in records:
        per = r["measured_s"] / r["steps"]
        pred = r.get("step_s")
        err = (pred - per) / per if pred else None
        independent = True      # no constant was fitted on any row
        group = ("headline" if r["same_gpu"] and r["exact_model"] else
                 "built-gpu" if not r["same_gpu"] else "approximate-model")
        rep, xc = r.get("repo_layout_step_s"), r.get("xdit_collectives_step_s")
        out.append({**r, "measured_step_bound_s": per, "error": err,
                    "repo_layout_error": (rep - per) / per if rep else None,
                    "xdit_collectives_error": (xc - per) / per if xc else None,
                    "independent": independent, "group": group, **whole_run(r)})

    # speedup over the series' 1-GPU row: of whole runs when they are priced (the measured
    # speedups are of whole runs), else of DiT steps
    series = lambda x: (x["source"], x["model"], x["gpu"], x["note"].split(";")[0])
    ones = {series(x): x for x in out if x["gpus"] == 1 and x.get("step_s")}
    for x in out:
        b = ones.get(series(x))
        if b is None or x["gpus"] == 1 or not x.get("step_s"):
            continue
        key = ("predicted_run_s" if x.get("predicted_run_s") and b.get("predicted_run_s")
               else "step_s")
        sm, sp = b["measured_s"] / x["measured_s"], b[key] / x[key]
        x.update(speedup_measured=sm, speedup_predicted=sp, speedup_error=sp / sm - 1,
                 speedup_of="whole run" if key == "predicted_run_s" else "DiT step")

    def med(g, key):
        e = [abs(x[key]) for x in out if x.get(key) is not None and x["independent"]
             and (g is None or x["group"] == g)]
        return (statistics.median(e), len(e)) if e else (None, 0)

    groups = ("headline", "built-gpu", "approximate-model", None)
    has_run = any(x.get("run_error") is not None for x in out)
    return {"rows": out,
            "median_abs_error": {g or "all": med(g, "run_error" if has_run else "error")
                                 for g in groups},
            "median_abs_error_is": "whole run" if has_run else "per-step bound",
            "median_abs_step_bound_error": {g or "all": med(g, "error") for g in groups},
            "median_abs_mode_run_error": {g or "all": med(g, "mode_run_error") for g in groups},
            "median_abs_error_xdit_collectives": {g or "all": med(g, "xdit_collectives_error")
                                                  for g in groups},
            "median_abs_speedup_error": {g or "all": med(g, "speedup_error") for g in groups}}


def _pct(v) -> str:
    return "n/a" if v is None else f"{v * 100:+.1f}%"


def _modes(r: dict) -> str:
    if r.get("unfused_step_s") is None:
        return "- | -"
    m = (f"{r['mode']}: {r['mode_run_s']:,.2f} ({_pct(r['mode_run_error'])})"
         if r.get("mode") else "-")
    return (f"{r['unfused_step_s']:.3f} / {r['fused_step_s']:.3f}; {r.get('kernels', 0):,} | "
            f"{m}")


def _speedup(r: dict) -> str:
    if r.get("speedup_error") is None:
        return "-"
    return (f"{r['speedup_measured']:.2f}x / {r['speedup_predicted']:.2f}x "
            f"({_pct(r['speedup_error'])})")


def markdown(doc: dict) -> list[str]:
    t = doc["table"]
    commit = doc["git"]["git_commit"][:12]
    run_is = t.get("median_abs_error_is", "per-step bound")
    lines = [
        "# GPU validation: published measured DiT latencies vs Q2 (issue 49)", "",
        "Measured = the publisher's figure (URL in each row); predicted = Q2 on DTensor "
        "evidence under a fake process group (GPU network model + flash-attention kernel "
        "model), in xDiT's device order. Nothing ran on a GPU here. `benchmarks/"
        f"gpu_validation.py`, commit {commit}"
        + (" (modified files: " + ", ".join(doc["git"]["git_modified_files"]) + ")"
           if doc["git"]["git_modified_files"] else "") + f", {doc['machine'].get('date', '')}"
        + (f", {doc['wall_s'] / 60:.0f} min on this machine" if doc.get("wall_s") else "") + ".",
        "",
        "Every published figure is a whole run of `steps` denoising steps (text encoders and VAE "
        "decode included). Predicted whole run = steps x Q2(one DiT step) + the VAE decode "
        "(priced from diffusers' decoder graph at the publisher's latents, tiled or chunked as "
        "the publisher's code decodes, by the same compute model as the DiT step, on one GPU: "
        "xDiT decodes on one GPU unless `--use_parallel_vae`, which no table states; "
        "`benchmarks/pipeline_parts.py`) + the text encoders (an estimate, under 1% of every "
        "run here: reported, not added); whole-run error = (predicted - measured) / measured. "
        "The per-step columns are kept: measured / steps is an UPPER BOUND of one DiT step "
        "(column 'measured bound'), step error = (predicted step - bound) / bound. No constant "
        "was fitted: every row is independent. Predicted step = Q2 on `stream_layout` (xDiT's "
        "USP over the whole token stream); the 'repo xdit_layout' column is Q2 on "
        "`aoizora.models.xdit.xdit_layout` alone (what `compare_torch` prices), which leaves the "
        "video stream of dual-stream blocks and the residual stream replicated. \"xDiT's "
        "collectives only\" is Q2 on the same evidence less the all-gathers DTensor issues to "
        "slice / concatenate the joint [text, video] sequence (`joint_gather`), which xDiT does "
        "locally. Scaling check: speedup = the series' 1-GPU figure / the row's figure, "
        "measured (the publisher's runs) against predicted (whole runs when priced), error = "
        "predicted / measured - 1; the compute error common to a series cancels in it.", ""]
    for g, label in (("headline", "published GPU and model (headline)"),
                     ("built-gpu", "H20 target built here from reported specs"),
                     ("approximate-model", "approximate model (ConsisID as CogVideoX-5B)"),
                     ("all", "all rows")):
        m, n = t["median_abs_error"][g]
        mb, _ = t.get("median_abs_step_bound_error", {}).get(g, (None, 0))
        mx, _ = t.get("median_abs_error_xdit_collectives", {}).get(g, (None, 0))
        ms, ns = t.get("median_abs_speedup_error", {}).get(g, (None, 0))
        mm, nm = t.get("median_abs_mode_run_error", {}).get(g, (None, 0))
        mode_txt = (f" Execution-mode rendering (views free; eager rows unfused, the "
                    f"torch.compile rows fused), whole run: {_pct(mm).lstrip('+')} over {nm} "
                    "rows (a diagnostic, not the headline)." if nm else "")
        lines.append(f"- Median |error| ({run_is}), {label}: **{_pct(m).lstrip('+')}** over {n} "
                     f"rows; per DiT step against the bound measured / steps: "
                     f"{_pct(mb).lstrip('+')} (Q2 with xDiT's collectives only: "
                     f"{_pct(mx).lstrip('+')}); scaling check, median |speedup error| over the "
                     f"series' 1-GPU row: {_pct(ms).lstrip('+')} over {ns} rows.{mode_txt}")
    lines += ["", "| # | source | box | model | config | measured whole run (s) | predicted "
                  "whole run (s) = steps x step + VAE | whole-run error | VAE decode (s, one "
                  "GPU) | measured (s/step, bound) | predicted (s/step) | step error | "
                  "compute / comm (s/step) | xDiT's collectives only: predicted (step error) | "
                  "repo xdit_layout: predicted (step error) | speedup over 1 GPU: measured / "
                  "predicted (error) | execution modes, s/step: unfused (eager) / fused (compile); "
                  "kernels per step | this row's mode: whole run (s, error) | independent | "
                  "note |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(t["rows"], 1):
        run = (f"{r['predicted_run_s']:,.2f} ({r['steps']} x {r['step_s']:.3f} + "
               f"{r['vae_decode_s']:.2f})" if r.get("predicted_run_s") else "n/a")
        lines.append(
            f"| {i} | [{r['source'].rsplit('/', 1)[-1]}]({r['source']}) | {r['gpus']} x "
            f"{r['gpu'].upper()} ({r.get('target', '?')}) | {r['model']} | "
            f"{r.get('xdit_config', r['config'])} | {r['measured_s']:,.2f} | {run} | "
            f"{_pct(r.get('run_error'))} | "
            f"{'n/a' if r.get('vae_decode_s') is None else format(r['vae_decode_s'], '.2f')} | "
            f"{r['measured_step_bound_s']:.3f} | "
            f"{r['step_s']:.3f} | {_pct(r['error'])} | "
            f"{r['compute_s']:.3f} / {r['communication_s']:.3f} | "
            f"{r['xdit_collectives_step_s']:.3f} ({_pct(r['xdit_collectives_error'])}) | "
            f"{r['repo_layout_step_s']:.3f} ({_pct(r['repo_layout_error'])}) | "
            f"{_speedup(r)} | {_modes(r)} | "
            f"{'yes' if r['independent'] else 'no'} | {r['group']}; {r['note']}"
            f"{'' if r.get('fits_hbm', True) else '; evidence: does not fit HBM (' + r['hbm_note'] + ')'}"
            f"{''.join('; ' + w[:120] for w in r.get('fallbacks') or [])}"
            f"; publisher: {r['states']} |")
    lines += ["", "Where the error is (from the rows above):", ""] + where(t["rows"])
    parts = {}
    for r in t["rows"]:
        if r.get("vae_decode_s") is not None:
            parts.setdefault((r["model"], r["gpu"]), r)
    if parts:
        lines += ["", "The parts outside the DiT (one GPU, `benchmarks/pipeline_parts.py`):", "",
                  "| model | GPU | VAE decode (s) | decoder calls | VAE TFLOP (of which conv / "
                  "matmul) | VAE bytes (TB, each op reading and writing HBM) | how the "
                  "publisher decodes | text encoders, estimate (s) | encoders |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for (model, gpu), r in parts.items():
            lines.append(
                f"| {model} | {gpu.upper()} | {r['vae_decode_s']:.3f} | {r['vae_calls']} | "
                f"{r['vae_flops'] / 1e12:,.1f} ({r['vae_dot_flops'] / 1e12:,.1f}) | "
                f"{r['vae_bytes'] / 1e12:.2f} | {r['vae_note']} ({r['vae_source']}) | "
                f"{r.get('encoders_estimate_s', 0):.4f} | {r.get('encoders', '')} |")
    lines += ["", "Models:"] + [f"- `{k}`: {v}" for k, v in doc["models"].items()]
    return lines


def where(rows: list[dict]) -> list[str]:
    """Per (model, GPU, published column): the 1-GPU row's error (compute alone: no collective)
    against the multi-GPU rows' median error and communication share, and the joint-sequence
    all-gathers (``joint_gather``) of the DTensor rendering; whole-run errors when priced."""
    out = []
    keys = dict.fromkeys((r["model"], r["gpu"], r["note"].split(";")[0]) for r in rows)
    for model, gpu, col in keys:
        rs = [r for r in rows if (r["model"], r["gpu"], r["note"].split(";")[0])
              == (model, gpu, col) and r["error"] is not None]
        one = [r for r in rs if r["gpus"] == 1]
        many = [r for r in rs if r["gpus"] > 1]
        if not many:
            continue
        med = statistics.median(r["error"] for r in many)
        comm = statistics.median(r["communication_s"] / r["step_s"] for r in many)
        jg = statistics.median(r.get("joint_gathers", 0) for r in many)
        xc = statistics.median(r["xdit_collectives_error"] for r in many
                               if r.get("xdit_collectives_error") is not None)
        runs = [r["run_error"] for r in many if r.get("run_error") is not None]
        run_txt = ""
        if runs:
            one_run = one[0].get("run_error") if one else None
            vae = statistics.median(r["vae_share"] for r in many if r.get("vae_share"))
            run_txt = (f" Whole run: 1 GPU {_pct(one_run)}, multi-GPU median "
                       f"{_pct(statistics.median(runs))} (range {_pct(min(runs))} to "
                       f"{_pct(max(runs))}); the VAE decode is {vae:.0%} of the predicted "
                       "multi-GPU run (median).")
        out.append(f"- {model} on {gpu.upper()} ({col}): per step, 1 GPU (compute only) "
                   f"{_pct(one[0]['error']) if one else 'n/a'}; {len(many)} multi-GPU rows: "
                   f"median error {_pct(med)}, communication {comm:.0%} of the predicted step "
                   f"(median), {jg:.0f} joint-sequence all-gathers per step (median), "
                   f"without them {_pct(xc)}.{run_txt}")
    return out


def outside_dit(model: str, gpu: str) -> dict[str, Any]:
    """The run's parts outside the DiT on one GPU of ``gpu`` (``benchmarks.pipeline_parts``):
    the VAE decode from its graph, the text encoders' estimate."""
    from benchmarks.pipeline_parts import encoder_estimate, vae_decode

    one = box_target(gpu, 1)
    return {**vae_decode(model, one),
            **encoder_estimate(model, one.chip.device_peak_flops,
                               one.chip.device_hbm_bandwidth_Bps)}


def run(only: set[str] | None = None) -> dict[str, Any]:
    from aoizora.extract.frontends.torch.aten_ir import build_torch_ir
    from aoizora.extract.frontends.torch.capture import capture

    start = time.perf_counter()
    rows = [r for r in published_rows() if not only or r.model in only]
    records = []
    parts: dict[tuple, dict] = {}
    for name in dict.fromkeys(r.model for r in rows):
        t0 = time.perf_counter()
        model, args, kwargs = build(name)
        ep = capture(model, args, kwargs)
        ir = build_torch_ir(ep)
        print(f"{name}: captured in {time.perf_counter() - t0:.0f} s", flush=True)
        for r in (r for r in rows if r.model == name):
            t1 = time.perf_counter()
            rec = {**dataclasses.asdict(r), **price(ep, ir, r)}
            if (r.model, r.gpu) not in parts:
                t2 = time.perf_counter()
                parts[r.model, r.gpu] = outside_dit(r.model, r.gpu)
                print(f"  VAE decode on one {r.gpu}: {parts[r.model, r.gpu]['vae_decode_s']:.3f}"
                      f" s ({time.perf_counter() - t2:.0f} s)", flush=True)
            rec.update(parts[r.model, r.gpu])
            rec["wall_s"] = time.perf_counter() - t1
            records.append(rec)
            print(f"  {r.gpus} x {r.gpu} {rec['xdit_config']}: predicted "
                  f"{rec['step_s']:.3f} s/step, measured bound "
                  f"{r.measured_s / r.steps:.3f} ({rec['wall_s']:.0f} s)", flush=True)
    return {"label": "measured = publisher's; predicted = Q2 on DTensor evidence (no GPU)",
            "git": git_state(), "machine": machine_info(),
            "models": {k: v[0] for k, v in MODELS.items()}, "table": table(records),
            "wall_s": time.perf_counter() - start}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--report", action="store_true", help="rewrite the .md from the JSON")
    p.add_argument("--models", default="", help="comma-separated MODELS keys (default all)")
    a = p.parse_args(argv)
    if a.report:
        doc = json.loads((RESULTS / f"{NAME}.json").read_text())
        doc["table"] = table(doc["table"]["rows"])      # errors and medians again
    else:
        doc = run(set(filter(None, a.models.split(","))) or None)
    write_results(str(RESULTS), NAME, doc, markdown(doc))
    print("\n".join(markdown(doc)[:12]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
