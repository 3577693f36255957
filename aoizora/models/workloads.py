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
