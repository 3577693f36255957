"""Workloads: one video request (resolution, frames) for one model, with its latent grid and tokens.

Latent grid: VAE stride 4 in time (F latent = (frames-1)/4 + 1) and 8 in space; tokens after the
(1, 2, 2) patch = F x (H/16) x (W/16) (``shared/facts/models.md``). ``pad_to`` gives the sequence
length the traced program really has when the sequence is padded to a multiple (as the Wan repo
pads for sequence parallelism); costs must be counted on the padded length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aoizora.models.layers import padded_length

VAE_STRIDE = (4, 8, 8)
PATCH = (1, 2, 2)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str             # e.g. "480p-81f"
    resolution: str       # e.g. "480p"
    width: int            # pixels
    height: int           # pixels
    frames: int           # video frames
    batch: int = 1        # videos per request (classifier-free guidance doubles it inside the step)

    @property
    def latent_frames(self) -> int:
        return (self.frames - 1) // VAE_STRIDE[0] + 1

    @property
    def latent_height(self) -> int:
        return self.height // VAE_STRIDE[1]

    @property
    def latent_width(self) -> int:
        return self.width // VAE_STRIDE[2]

    @property
    def grid(self) -> tuple[int, int, int]:
        """Token grid (t, h, w) after the patch."""
        return (self.latent_frames // PATCH[0], self.latent_height // PATCH[1],
                self.latent_width // PATCH[2])

    @property
    def tokens(self) -> int:
        """Video tokens per sample (unpadded)."""
        f, h, w = self.grid
        return f * h * w

    def latent_shape(self, channels: int = 16) -> tuple[int, int, int, int, int]:
        return (self.batch, channels, self.latent_frames, self.latent_height, self.latent_width)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "resolution": self.resolution, "width": self.width,
                "height": self.height, "frames": self.frames, "batch": self.batch,
                "latent_frames": self.latent_frames, "latent_height": self.latent_height,
                "latent_width": self.latent_width, "tokens": self.tokens}


def pad_to(tokens: int, multiple: int) -> int:
    """The sequence length after zero-padding ``tokens`` to a multiple of ``multiple``."""
    return padded_length(tokens, multiple)


RESOLUTIONS = {"480p": (832, 480), "720p": (1280, 720), "544p": (960, 544)}


def make(resolution: str, frames: int, batch: int = 1) -> Workload:
    if resolution not in RESOLUTIONS:
        raise ValueError(f"unknown resolution {resolution!r}; known: {sorted(RESOLUTIONS)}")
    w, h = RESOLUTIONS[resolution]
    return Workload(f"{resolution}-{frames}f", resolution, w, h, frames, batch)


WAN_480P = [make("480p", f) for f in (81, 41, 21)]
WAN_720P = [make("720p", f) for f in (81, 41, 21)]
HUNYUAN = [make("544p", 129), make("720p", 129)]
# Small: 9 frames at 128x128 -> 3 x 8 x 8 = 192 tokens (divisible by 2, 4, 8); at 112x112 ->
# 3 x 7 x 7 = 147 tokens (odd: a sequence split needs padding, as at 32,760 tokens).
SMALL = [Workload("tiny-9f", "128p", 128, 128, 9), Workload("tiny-odd-9f", "112p", 112, 112, 9)]


# Open-Sora 1.2 (hpcaitech/Open-Sora, configs/opensora-v1-2/inference/sample.py): its VAE encodes
# micro-clips of 17 frames (micro_frame_size) with 8x spatial and 4x temporal compression, each
# clip padded to a multiple of 4 frames first: 17 frames -> 5 latent frames, so 51 -> 15, 102 -> 30.
OPENSORA_MICRO_FRAMES = 17


@dataclasses.dataclass(frozen=True)
class OpenSoraWorkload(Workload):
    """A workload of Open-Sora 1.2's VAE: latent frames = 5 per full 17-frame micro-clip plus
    ceil(rest / 4) for a partial one; 8x spatial as above."""

    @property
    def latent_frames(self) -> int:
        full, rest = divmod(self.frames, OPENSORA_MICRO_FRAMES)
        return full * (-(-OPENSORA_MICRO_FRAMES // VAE_STRIDE[0])) + -(-rest // VAE_STRIDE[0])


# Open-Sora's published settings: sample.py's 240p 51 frames (240x426: its VAE gives 53 latent
# columns, which STDiT3 pads to the patch, 54 -- written here as 432 pixels), 480p (480x854 -> 107
# latent columns padded to 108 -> 864 pixels) and 720p (720x1280), 51 frames ("2s" at 24 fps).
# Tokens: 15 x 15 x 27 = 6,075; 15 x 30 x 54 = 24,300; 15 x 45 x 80 = 54,000.
OPENSORA = [OpenSoraWorkload("240p-51f", "240p", 432, 240, 51),
            OpenSoraWorkload("480p-51f", "480p", 864, 480, 51),
            OpenSoraWorkload("720p-51f", "720p", 1280, 720, 51)]
# Small: 17 frames at 128x128 -> 5 x 8 x 8 = 320 tokens; at 112x112 -> 5 x 7 x 7 = 245 (odd).
OPENSORA_SMALL = [OpenSoraWorkload("tiny-17f", "128p", 128, 128, 17),
                  OpenSoraWorkload("tiny-odd-17f", "112p", 112, 112, 17)]
