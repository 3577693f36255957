"""diffusers' video transformers at their published configurations, on the meta device (no
weights), with one CFG denoising step's inputs at each model's native 480p latent shape: what
the PyTorch cells of the GPU grid plan (``benchmarks/gpu_grid_torch.py``).

| model | diffusers class | config (published) | 480p video | latents | video tokens | text |
| wan2.1-1.3b | WanTransformer3DModel | Wan-AI/Wan2.1-T2V-1.3B-Diffusers | 832x480, 81 frames | 16x21x60x104 | 32,760 | umT5 512 |
| wan2.1-14b | WanTransformer3DModel | Wan-AI/Wan2.1-T2V-14B-Diffusers | 832x480, 81 frames | 16x21x60x104 | 32,760 | umT5 512 |
| hunyuanvideo-13b | HunyuanVideoTransformer3DModel | hunyuanvideo-community/HunyuanVideo | 832x480, 81 frames | 16x21x60x104 | 32,760 | LLaVA 256 + CLIP pooled |
| cogvideox-5b | CogVideoXTransformer3DModel | THUDM/CogVideoX-5b | 720x480, 49 frames | 13x16x60x90 | 17,550 | T5 226 |

The batch is 2: the conditional and unconditional halves of classifier-free guidance (CFG).
CogVideoX-5B's native length is 49 frames (13 latent frames; 81 is not one of its lengths); its
rotary embedding (cos, sin over the video tokens) is an input, as its pipeline computes it.
HunyuanVideo publishes 720p and 540p buckets, none at 480p: its cell is Wan's 832x480 (its VAE
compresses as Wan's, 4x in time and 8x in space, and its patch is 1x2x2: the same 32,760 video
tokens). HunyuanVideo is guidance-distilled (its guidance scale is an input, ``guidance``); the batch of 2
is kept for a like-for-like grid. ``small=True``: the same classes at tiny widths, two blocks and
tiny latents, for tests.
"""

from __future__ import annotations

from typing import Any, Callable

MODELS = ("wan2.1-1.3b", "wan2.1-14b", "hunyuanvideo-13b", "cogvideox-5b")

WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128,
                in_channels=16, out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960,
                num_layers=30, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
                rope_max_seq_len=1024)
WAN_14B = dict(WAN_1_3B, num_attention_heads=40, ffn_dim=13824, num_layers=40)
HUNYUAN = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
               num_layers=20, num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0,
               patch_size=2, patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True,
               text_embed_dim=4096, pooled_projection_dim=768, rope_theta=256.0,
               rope_axes_dim=(16, 56, 56))
COGVIDEOX_5B = dict(num_attention_heads=48, attention_head_dim=64, in_channels=16,
                    out_channels=16, flip_sin_to_cos=True, freq_shift=0, time_embed_dim=512,
                    text_embed_dim=4096, num_layers=42, sample_width=90, sample_height=60,
                    sample_frames=49, patch_size=2, temporal_compression_ratio=4,
                    max_text_seq_length=226, activation_fn="gelu-approximate",
                    timestep_activation_fn="silu", norm_elementwise_affine=True, norm_eps=1e-5,
                    spatial_interpolation_scale=1.875, temporal_interpolation_scale=1.0,
                    use_rotary_positional_embeddings=True)
SHAPES = {"wan2.1-1.3b": "832x480, 81 frames -> latents 16x21x60x104, 32,760 video tokens, "
                         "umT5 text 512 tokens",
          "wan2.1-14b": "832x480, 81 frames -> latents 16x21x60x104, 32,760 video tokens, "
                        "umT5 text 512 tokens",
          "hunyuanvideo-13b": "832x480, 81 frames -> latents 16x21x60x104, 32,760 video tokens "
                              "+ 256 text tokens (joint attention 33,016)",
          "cogvideox-5b": "720x480, 49 frames -> latents 13x16x60x90, 17,550 video tokens + "
                          "226 text tokens (joint attention 17,776)"}


def _small(cfg: dict, **over) -> dict:
    return {**cfg, **over}


def _wan(cfg: dict, small: bool, b: int):
    import torch
    from diffusers import WanTransformer3DModel

    if small:
        cfg = _small(cfg, num_attention_heads=4, attention_head_dim=16, in_channels=4,
                     out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128, num_layers=2,
                     rope_max_seq_len=64)
    model = WanTransformer3DModel(**cfg).to(torch.bfloat16)
    lat = (b, 4, 4, 8, 8) if small else (b, 16, 21, 60, 104)
    text = (b, 16, 32) if small else (b, 512, 4096)
    args = (torch.randn(lat, dtype=torch.bfloat16), torch.full((b,), 500.0),
            torch.randn(text, dtype=torch.bfloat16))
    return model, args, {"return_dict": False}


def _hunyuan(small: bool, b: int, latent: tuple[int, int, int] = (21, 60, 104)):
    """``latent``: (frames, height, width) of the latents (default the native 480p 81 frames)."""
    import torch
    from diffusers import HunyuanVideoTransformer3DModel

    cfg = HUNYUAN if not small else _small(
        HUNYUAN, in_channels=4, out_channels=4, num_attention_heads=4, attention_head_dim=16,
        num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=32,
        pooled_projection_dim=16, rope_axes_dim=(4, 6, 6))
    model = HunyuanVideoTransformer3DModel(**cfg).to(torch.bfloat16)
    lat = (b, 4, 4, 8, 8) if small else (b, 16) + tuple(latent)
    text = 16 if small else 256
    width = cfg["text_embed_dim"]
    args = (torch.randn(lat, dtype=torch.bfloat16), torch.full((b,), 500.0),
            torch.randn((b, text, width), dtype=torch.bfloat16),
            torch.ones((b, text), dtype=torch.bool),
            torch.randn((b, cfg["pooled_projection_dim"]), dtype=torch.bfloat16),
            torch.full((b,), 6000.0))
    return model, args, {"return_dict": False}


def _cogvideox(small: bool, b: int):
    import torch
    from diffusers import CogVideoXTransformer3DModel

    cfg = COGVIDEOX_5B if not small else _small(
        COGVIDEOX_5B, num_attention_heads=4, attention_head_dim=16, in_channels=4,
        out_channels=4, time_embed_dim=32, text_embed_dim=32, num_layers=2, sample_width=16,
        sample_height=16, sample_frames=9, max_text_seq_length=16)
    model = CogVideoXTransformer3DModel(**cfg).to(torch.bfloat16)
    f, h, w = (3, 16, 16) if small else (13, 60, 90)
    tokens = f * (h // 2) * (w // 2)
    args = (torch.randn((b, f, cfg["in_channels"], h, w), dtype=torch.bfloat16),
            torch.randn((b, cfg["max_text_seq_length"], cfg["text_embed_dim"]),
                        dtype=torch.bfloat16),
            torch.full((b,), 500, dtype=torch.long))
    rope = (torch.randn((tokens, cfg["attention_head_dim"])),
            torch.randn((tokens, cfg["attention_head_dim"])))
    return model, args, {"image_rotary_emb": rope, "return_dict": False}


BUILDERS: dict[str, Callable[[bool, int], Any]] = {
    "wan2.1-1.3b": lambda small, b: _wan(WAN_1_3B, small, b),
    "wan2.1-14b": lambda small, b: _wan(WAN_14B, small, b),
    "hunyuanvideo-13b": _hunyuan,
    "cogvideox-5b": _cogvideox,
}


def build_on_meta(name: str, small: bool = False, batch: int = 2):
    """(model, positional inputs, keyword inputs) on the meta device, bf16 (module docstring)."""
    import torch

    with torch.device("meta"):
        return BUILDERS[name](small, batch)
