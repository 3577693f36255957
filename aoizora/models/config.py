"""Model configurations: Wan 2.1 (Wan-Video/Wan2.1, ``wan/configs/``) and HunyuanVideo
(Tencent/HunyuanVideo, ``hyvideo/modules/models.py``) at their published sizes, plus small
configurations with the same structure for tests on CPU (``shared/facts/models.md``).

All dims are counts of elements; ``patch`` is (time, height, width) in latent pixels.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class WanConfig:
    dim: int                 # hidden (embed) width
    ffn_dim: int             # FFN hidden width
    heads: int               # attention heads; head_dim = dim // heads
    layers: int              # transformer blocks
    text_len: int = 512      # umT5 tokens (padded to this length)
    text_dim: int = 4096     # umT5-XXL width
    freq_dim: int = 256      # sinusoidal timestep embedding width
    in_channels: int = 16    # VAE latent channels
    out_channels: int = 16
    patch: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def rope_dims(self) -> tuple[int, int, int]:
        """Head-dim split over (t, h, w) as Wan does: d - 4*(d//6), 2*(d//6), 2*(d//6)."""
        d = self.head_dim
        return (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))

    def __post_init__(self):
        if self.dim % self.heads:
            raise ValueError(f"WanConfig: dim {self.dim} must be a multiple of heads {self.heads}")
        if any(r % 2 for r in self.rope_dims):
            raise ValueError(f"WanConfig: head_dim {self.head_dim} gives odd RoPE dims {self.rope_dims}")


@dataclasses.dataclass(frozen=True)
class HunyuanConfig:
    hidden: int = 3072
    heads: int = 24
    mlp_ratio: float = 4.0
    double_blocks: int = 20
    single_blocks: int = 40
    text_len: int = 256          # LLM text tokens
    text_dim: int = 4096         # LLM hidden states width
    clip_dim: int = 768          # pooled CLIP-L vector width
    refiner_blocks: int = 2      # the token refiner on the text (SingleTokenRefiner depth)
    freq_dim: int = 256
    in_channels: int = 16
    out_channels: int = 16
    patch: tuple[int, int, int] = (1, 2, 2)
    rope_dims: tuple[int, int, int] = (16, 56, 56)
    rope_theta: float = 256.0
    guidance_embed: bool = True  # the released model is guidance-distilled (guidance_in)
    embedded_guidance: float = 6.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_dim(self) -> int:
        return int(self.hidden * self.mlp_ratio)

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"HunyuanConfig: hidden {self.hidden} must be a multiple of heads {self.heads}")
        if sum(self.rope_dims) != self.head_dim or any(r % 2 for r in self.rope_dims):
            raise ValueError(f"HunyuanConfig: RoPE dims {self.rope_dims} must be even and sum to "
                             f"head_dim {self.head_dim}")


WAN_1_3B = WanConfig(dim=1536, ffn_dim=8960, heads=12, layers=30)
WAN_14B = WanConfig(dim=5120, ffn_dim=13824, heads=40, layers=40)
# Same structure, small: 8 heads so heads split 2/4/8 ways; head_dim 32 -> RoPE dims (12, 10, 10).
WAN_SMALL = WanConfig(dim=256, ffn_dim=512, heads=8, layers=2, text_len=32, text_dim=128)

HUNYUAN_13B = HunyuanConfig()
HUNYUAN_SMALL = HunyuanConfig(hidden=256, heads=8, double_blocks=2, single_blocks=2, text_len=32,
                              text_dim=128, clip_dim=64, rope_dims=(8, 12, 12))


@dataclasses.dataclass(frozen=True)
class STDiTConfig:
    """Open-Sora 1.2's STDiT3 (hpcaitech/Open-Sora, ``opensora/models/stdit/stdit3.py``,
    ``STDiT3-XL/2``; ``configs/opensora-v1-2/inference/sample.py``): ``depth`` pairs of blocks,
    each a spatial block then a temporal block (self-attention + cross-attention + MLP each)."""

    hidden: int = 1152
    heads: int = 16
    depth: int = 28              # spatial blocks = temporal blocks = depth
    mlp_ratio: float = 4.0
    text_len: int = 300          # T5 tokens (model_max_length)
    text_dim: int = 4096         # T5-v1.1-XXL width (caption_channels)
    freq_dim: int = 256          # sinusoidal timestep / fps embedding width
    in_channels: int = 4         # Open-Sora 1.2 VAE latent channels
    out_channels: int = 4        # pred_sigma=False
    patch: tuple[int, int, int] = (1, 2, 2)
    fps: float = 24.0            # the fps conditioning the sampler passes (sample.py: fps = 24)
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_dim(self) -> int:
        return int(self.hidden * self.mlp_ratio)

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"STDiTConfig: hidden {self.hidden} must be a multiple of heads {self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"STDiTConfig: head_dim {self.head_dim} must be even (temporal RoPE pairs)")
        if self.hidden % 4:
            raise ValueError(f"STDiTConfig: hidden {self.hidden} must be a multiple of 4 (2D sin-cos)")


STDIT3_XL = STDiTConfig()
# Same structure, small: 8 heads of 32, 2 block pairs.
STDIT_SMALL = STDiTConfig(hidden=256, heads=8, depth=2, text_len=32, text_dim=128)
