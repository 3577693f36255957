"""The parts of a published whole run outside the DiT (issue 49, ``benchmarks/gpu_validation``):
the VAE decode from its real graph, the text encoders by an estimate.

    vae_decode(model_key, target) -> dict     # seconds of the pipeline's VAE decode on one GPU

Every figure ``benchmarks/gpu_validation`` compares with is a whole run: text encoders, every
denoising step, VAE decode. This module prices the VAE decode with the compute pricing of the
DiT step: diffusers' decoder at the publisher's latent shape, built on the meta device from the
published config, captured (``extract.frontends.torch.capture``), run on one device under the
fake process group (``runtime.torch_evidence``), and priced by Q2's compute model
(``formulation.op_time.compute_seconds``): every convolution and matmul at its FLOPs over the
GPU's dense peak (the pricing the DiT's matmuls get: ``IssuedCompute`` kind "dot", FLOPs =
2 x output elements x input channels x kernel volume, what ``torch.utils.flop_counter`` reports),
every other op (group norm, SiLU, nearest upsampling, padding, adds) at its bytes read and
written over the HBM bandwidth, the mid-block attention by the flash-attention kernel model. No
constant is added or fitted here.

The decode is priced as the publisher's code runs it (tiles and frame chunks are counted; each
distinct tile shape is captured once and multiplied by its count):

- HunyuanVideo (official repo, ``hyvideo/vae/autoencoder_kl_causal_3d.py`` at
  Tencent-Hunyuan/HunyuanVideo fa14b00; ``--vae-tiling`` on by default, ``hyvideo/config.py``;
  ``--vae-precision fp16``): temporal tiles of 16 + 1 latent frames every 12 (``sample_tsize``
  64 / 4, overlap 0.25), each spatially tiled 32 x 32 latents every 24 (``sample_size`` 256 / 8,
  overlap 0.25); the decoder is diffusers' ``AutoencoderKLHunyuanVideo`` (its port) at the
  hunyuanvideo-community/HunyuanVideo ``vae`` config.
- FLUX.1-dev: ``AutoencoderKL`` (black-forest-labs/FLUX.1-dev ``vae`` config: 16 latent channels,
  no quant convs), 128 x 128 latents, whole (xDiT's flux example enables no tiling).
- ConsisID (CogVideoX-5B's VAE, ``AutoencoderKLCogVideoX`` at THUDM/CogVideoX-5b ``vae``
  config): not tiled (xDiT's ``run_consisid*.sh`` leave ``--enable_tiling`` commented out at the
  commit that published the table, 970d5ce); diffusers decodes 13 latent frames in chunks of 2
  (the first chunk takes the odd one: 3 + 5 x 2), each chunk's causal convolutions padded from
  the previous chunk's cache (the same shapes as the first chunk's replicate padding, so each
  chunk is captured without a cache).
- Sana 1600M 4K: ``AutoencoderDC`` (mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers, the config
  diffusers' ``scripts/convert_dcae_to_diffusers.py`` ``convert_ae`` builds), 128 x
  128 latents tiled as xDiT's ``examples/sana_example.py`` asks at the commit that published the
  table (21dcdcf: ``enable_tiling(tile_sample_min_width=1024, tile_sample_min_height=1024)``,
  the stride left at diffusers' 448 px): 32 x 32-latent tiles every 14 latents, 10 x 10 tiles.

Where the VAE runs: on ONE GPU's time in every published configuration. xDiT decodes on the
last data-parallel group unless ``--use_parallel_vae`` is given (``xfuser/config/args.py``:
``use_parallel_vae: bool = False``; ``xfuser/model_executor/pipelines/pipeline_flux.py``:
``if is_dp_last_group(): ... self.vae.decode(latents)``), and no published table states it
(``examples/run.sh`` leaves ``PARALLLEL_VAE`` commented out; ConsisID's examples assert it is
off); the official HunyuanVideo repo parallelizes only the transformer
(``hyvideo/inference.py``, ``parallelize_transformer``), each rank decoding the whole video.

Text encoders: an estimate (``encoder_estimate``), not added to the run when it is below 1% of
the predicted run -- for every row here it is (the module's ``ENCODERS`` and the gpu_validation
notes give the numbers).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

# published configs (diffusers' config.json of each repository's ``vae`` folder)
HY_VAE = dict(in_channels=3, out_channels=3, latent_channels=16,
              down_block_types=("HunyuanVideoDownBlock3D",) * 4,
              up_block_types=("HunyuanVideoUpBlock3D",) * 4,
              block_out_channels=(128, 256, 512, 512), layers_per_block=2, act_fn="silu",
              norm_num_groups=32, scaling_factor=0.476986, spatial_compression_ratio=8,
              temporal_compression_ratio=4, mid_block_add_attention=True)
FLUX_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32,
                sample_size=1024, scaling_factor=0.3611, shift_factor=0.1159,
                use_quant_conv=False, use_post_quant_conv=False)
COGVIDEOX_VAE = dict(in_channels=3, out_channels=3,
                     down_block_types=("CogVideoXDownBlock3D",) * 4,
                     up_block_types=("CogVideoXUpBlock3D",) * 4,
                     block_out_channels=(128, 256, 256, 512), latent_channels=16,
                     layers_per_block=3, act_fn="silu", norm_eps=1e-6, norm_num_groups=32,
                     temporal_compression_ratio=4, sample_height=480, sample_width=720,
                     scaling_factor=0.7)
DC_AE_VAE = dict(in_channels=3, latent_channels=32, attention_head_dim=32,
                 encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
                 decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
                 encoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
                 decoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
                 encoder_layers_per_block=(2, 2, 2, 3, 3, 3),
                 decoder_layers_per_block=(3, 3, 3, 3, 3, 3),
                 encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
                 decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
                 upsample_block_type="interpolate", downsample_block_type="Conv",
                 decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407)

VAE_SOURCES = {
    "hunyuanvideo": "https://huggingface.co/hunyuanvideo-community/HunyuanVideo/blob/main/vae/config.json; "
                    "tiling: https://github.com/Tencent-Hunyuan/HunyuanVideo/blob/main/hyvideo/vae/autoencoder_kl_causal_3d.py",
    "flux": "https://huggingface.co/black-forest-labs/FLUX.1-dev/blob/main/vae/config.json",
    "cogvideox": "https://huggingface.co/THUDM/CogVideoX-5b/blob/main/vae/config.json",
    "sana": "https://huggingface.co/mit-han-lab/dc-ae-f32c32-sana-1.0-diffusers (config as "
            "diffusers' scripts/convert_dcae_to_diffusers.py convert_ae builds it); tiling: "
            "https://github.com/xdit-project/xDiT/blob/21dcdcf1fbf427d2b8a39f37110efadc38ef9ed1/"
            "examples/sana_example.py, diffusers' DC-AE tiling (PR #10510: 512 / 448 px "
            "defaults)",
}


@dataclasses.dataclass(frozen=True)
class VaeSpec:
    family: str                 # hunyuanvideo | flux | cogvideox | sana
    latents: tuple              # the whole latent tensor the pipeline decodes
    dtype: str                  # "float16" | "bfloat16"
    note: str


VAES = {
    "hunyuanvideo-720p": VaeSpec("hunyuanvideo", (1, 16, 33, 90, 160), "float16",
                                 "official repo's tiled decode (fp16): 3 temporal x 4 x 7 "
                                 "spatial tiles"),
    "hunyuanvideo-960": VaeSpec("hunyuanvideo", (1, 16, 33, 120, 120), "float16",
                                "official repo's tiled decode (fp16): 3 temporal x 5 x 5 "
                                "spatial tiles"),
    "flux-dev-1024": VaeSpec("flux", (1, 16, 128, 128), "bfloat16", "whole 128x128 latents"),
    "cogvideox-5b": VaeSpec("cogvideox", (1, 16, 13, 60, 90), "bfloat16",
                            "frame chunks 3 + 5 x 2 latent frames, not tiled"),
    "sana-1600m-4k": VaeSpec("sana", (1, 32, 128, 128), "bfloat16",
                             "10 x 10 tiles of up to 32x32 latents (stride 14)"),
}


def _starts(n: int, stride: int) -> range:
    return range(0, n, stride)


def tiles(key: str) -> "collections.Counter[tuple]":
    """{latent shape of one decoder call: how many calls} of ``key``'s decode (module
    docstring), each shape as the decoder receives it."""
    spec = VAES[key]
    out: collections.Counter = collections.Counter()
    if spec.family == "hunyuanvideo":
        b, c, t, h, w = spec.latents
        t_min, t_stride = 16, 12                  # 64 // 4, int(16 * (1 - 0.25))
        s_min, s_stride = 32, 24                  # 256 // 8, int(32 * (1 - 0.25))
        for i in _starts(t, t_stride):
            tt = min(t, i + t_min + 1) - i
            for y in _starts(h, s_stride):
                for x in _starts(w, s_stride):
                    out[(b, c, tt, min(h, y + s_min) - y, min(w, x + s_min) - x)] += 1
    elif spec.family == "flux":
        out[spec.latents] += 1
    elif spec.family == "cogvideox":
        b, c, t, h, w = spec.latents
        fb = 2                                    # num_latent_frames_batch_size
        n = max(t // fb, 1)
        rem = t % fb
        for i in range(n):
            start = fb * i + (0 if i == 0 else rem)
            end = fb * (i + 1) + rem
            out[(b, c, end - start, h, w)] += 1
    elif spec.family == "sana":
        b, c, h, w = spec.latents
        m, s = 1024 // 32, 448 // 32
        for y in _starts(h, s):
            for x in _starts(w, s):
                out[(b, c, min(h, y + m) - y, min(w, x + m) - x)] += 1
    else:
        raise ValueError(spec.family)
    return out


def decoder_module(family: str, small: bool = False):
    """(module, dtype) of ``family``'s decode path on the current default device; ``small``: the
    same class at tiny widths (tests)."""
    import torch
    from diffusers import (AutoencoderDC, AutoencoderKL, AutoencoderKLCogVideoX,
                           AutoencoderKLHunyuanVideo)

    # the UNet-style VAEs at tiny widths: two blocks of the family's own kinds
    unet = {"hunyuanvideo": (AutoencoderKLHunyuanVideo, HY_VAE, "HunyuanVideo", torch.float16),
            "flux": (AutoencoderKL, FLUX_VAE, "", torch.bfloat16),
            "cogvideox": (AutoencoderKLCogVideoX, COGVIDEOX_VAE, "CogVideoX", torch.bfloat16)}
    if family in unet:
        cls, cfg, prefix, dtype = unet[family]
        down, up = ((f"{prefix}DownBlock3D", f"{prefix}UpBlock3D") if prefix
                    else ("DownEncoderBlock2D", "UpDecoderBlock2D"))
        tiny = dict(block_out_channels=(8, 16), down_block_types=(down,) * 2,
                    up_block_types=(up,) * 2, layers_per_block=1, norm_num_groups=4,
                    latent_channels=4)
        vae = cls(**({**cfg, **tiny} if small else cfg))
    elif family == "sana":
        tiny = dict(attention_head_dim=8,
                    encoder_block_types=("ResBlock", "EfficientViTBlock"),
                    decoder_block_types=("ResBlock", "EfficientViTBlock"),
                    encoder_block_out_channels=(8, 16), decoder_block_out_channels=(8, 16),
                    encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 1),
                    encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                    latent_channels=4)
        vae = AutoencoderDC(**({**DC_AE_VAE, **tiny} if small else DC_AE_VAE))
        dtype = torch.bfloat16
    else:
        raise ValueError(family)
    vae = vae.to(dtype)
    post = getattr(vae, "post_quant_conv", None)

    class Decode(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.post_quant_conv = post
            self.decoder = vae.decoder

        def forward(self, z):
            if self.post_quant_conv is not None:
                z = self.post_quant_conv(z)
            out = self.decoder(z)
            return out[0] if isinstance(out, tuple) else out

    return Decode(), dtype


def _single_layout(ep):
    from aoizora.formulation.layout import Layout

    n = len(ep.graph_signature.input_specs)
    return Layout(mesh_axes={"gpu": 1}, in_specs=[None] * n, name="one GPU")


_EPS: dict = {}


def tile_program(family: str, shape: tuple, small: bool = False):
    """The captured decoder call on ``shape`` latents (built on meta; kept for the process)."""
    import torch

    from aoizora.extract.frontends.torch.capture import capture

    key = (family, tuple(shape), small)
    if key not in _EPS:
        with torch.device("meta"):
            mod, dtype = decoder_module(family, small)
            z = torch.randn(shape, dtype=dtype)
        _EPS[key] = capture(mod, (z,))
    return _EPS[key]


def tile_evidence(family: str, shape: tuple, target, small: bool = False):
    """(evidence, exported program) of one decoder call on ``shape`` latents on one GPU of
    ``target`` (module docstring)."""
    from aoizora.runtime.torch_evidence import fake_world, torch_evidence

    ep = tile_program(family, shape, small)
    with fake_world(8):
        ev = torch_evidence(ep, _single_layout(ep), target)
    return ev, ep


_CACHE: dict = {}


def vae_decode(key: str, target) -> dict[str, Any]:
    """Seconds of ``key``'s VAE decode on one GPU of ``target`` (a 1-GPU target: its chip's peak
    and HBM bandwidth are used), with its FLOPs, bytes and tile count (module docstring)."""
    from aoizora.extract.network import Network
    from aoizora.formulation.op_time import compute_seconds

    spec = VAES[key]
    net = Network.from_target(target)
    total = flops = nbytes = conv_flops = 0.0
    calls = 0
    for shape, count in tiles(key).items():
        ck = (spec.family, shape, target.name)
        if ck not in _CACHE:
            ev, _ = tile_evidence(spec.family, shape, target)
            secs, warns = compute_seconds(ev, net)
            _CACHE[ck] = dict(
                s=secs, flops=sum(o.flops * o.count for o in ev.compute),
                bytes=sum(o.bytes * o.count for o in ev.compute),
                dot_flops=sum(o.flops * o.count for o in ev.compute if o.kind == "dot"),
                warnings=warns + list(ev.warnings))
        c = _CACHE[ck]
        total += count * c["s"]
        flops += count * c["flops"]
        nbytes += count * c["bytes"]
        conv_flops += count * c["dot_flops"]
        calls += count
    return {"vae_decode_s": total, "vae_flops": flops, "vae_bytes": nbytes,
            "vae_dot_flops": conv_flops, "vae_calls": calls, "vae_note": spec.note,
            "vae_source": VAE_SOURCES[spec.family]}


# ----------------------------------------------------------------------------- text encoders

@dataclasses.dataclass(frozen=True)
class Encoder:
    name: str
    params: float               # parameters (the model card's count)
    tokens: int                 # tokens per call, an upper bound where the pipeline pads less
    calls: int                  # forward passes per run (a CFG pipeline encodes its negative too)
    source: str


ENCODERS = {
    "hunyuanvideo": (
        Encoder("LLaVA-LLaMA-3-8B (llm)", 8.03e9, 256 + 95, 1,
                "Llama 3 8B model card (8.03B); HunyuanVideo hyvideo/config.py --text-len 256 + "
                "hyvideo/constants.py dit-llm-encode-video crop_start 95"),
        Encoder("CLIP ViT-L/14 text", 123e6, 77, 1, "openai/clip-vit-large-patch14 text tower; "
                "--text-len-2 77")),
    "flux": (
        Encoder("T5-XXL encoder", 4.76e9, 256, 1, "google/t5-v1_1-xxl encoder; xDiT "
                "examples/flux_example.py max_sequence_length=256 (8275240)"),
        Encoder("CLIP ViT-L/14 text", 123e6, 77, 1, "openai/clip-vit-large-patch14 text tower")),
    "cogvideox": (
        Encoder("T5-XXL encoder", 4.76e9, 226, 2, "google/t5-v1_1-xxl encoder; CogVideoX "
                "max_text_seq_length 226, prompt + negative prompt (CFG)"),),
    "sana": (
        Encoder("Gemma-2-2B", 2.61e9, 600, 1, "google/gemma-2-2b (2.61B); diffusers SanaPipeline "
                "max_sequence_length 300 + its complex human instruction (< 300 tokens)"),),
}


def encoder_estimate(key: str, peak_flops: float, hbm_bandwidth_Bps: float) -> dict[str, Any]:
    """An estimate of the text encoders' seconds on one GPU: each a dense stack of matmuls,
    2 x params x tokens FLOPs per call at the GPU's dense peak (the DiT's matmul pricing) or its
    bf16 weights read once per call at the HBM bandwidth, whichever is longer. An estimate, not
    a captured graph (module docstring)."""
    encs = ENCODERS[VAES[key].family]
    secs = sum(e.calls * max(2 * e.params * e.tokens / peak_flops,
                             2 * e.params / hbm_bandwidth_Bps) for e in encs)
    return {"encoders_estimate_s": secs,
            "encoders": "; ".join(f"{e.name} {e.params / 1e9:.2f}B x {e.tokens} tokens x "
                                  f"{e.calls} ({e.source})" for e in encs)}


NEGLIGIBLE = 0.01     # a part under 1% of the predicted run is reported, not added
