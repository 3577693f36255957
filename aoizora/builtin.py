"""The built-in planning jobs: a model, a workload and a target -> the program to plan.

The program is one denoising step with classifier-free guidance (``models.registry.denoise_step``)
on abstract bf16 inputs. The video sequence is padded to a multiple of ``128 x devices`` so that
any split of the sequence over the target's devices gives every shard whole 128-token splash
blocks; the padding is part of the traced shapes, so every cost counts it. Small test models
(fewer tokens than that) use 16-token blocks. A spatial-temporal DiT (STDiT3) pads its frames and
its spatial tokens each to a multiple of the devices (its attentions run over one or the other;
the attention wrapper pads each to the kernel's blocks).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from aoizora.extract.targets import Target, get_target
from aoizora.models import registry, stdit
from aoizora.models.attention_kernels import SPLASH_BLOCK

DEFAULT_MODEL = "wan2.1-1.3b"
DEFAULT_RESOLUTION = "480p"
DEFAULT_FRAMES = 81
DEFAULT_TARGET = "v5e-8"


class WorkloadError(ValueError):
    """An unknown model or workload."""


@dataclasses.dataclass
class Job:
    model: Any                 # registry.Model
    workload: Any              # workloads.Workload
    target: Target
    pad_multiple: int
    fn: Callable
    args: tuple

    @property
    def padded_tokens(self) -> int:
        p = self.pad_multiple
        if self.model.family == "stdit":         # frames and spatial tokens padded each
            tp, sp = stdit.padded_grid(self.workload.grid, p)
            return tp * sp
        return -(-self.workload.tokens // p) * p

    def describe(self) -> str:
        w = self.workload
        return (f"{self.model.name} {w.name} ({w.width}x{w.height}, {w.frames} frames, "
                f"{w.tokens:,} tokens padded to {self.padded_tokens:,}) on {self.target.short_name}")


def builtin_job(model: str = DEFAULT_MODEL, resolution: str | None = DEFAULT_RESOLUTION,
                frames: int | None = DEFAULT_FRAMES, target: "str | Target" = DEFAULT_TARGET,
                workload: str | None = None, pad_multiple: int | None = None) -> Job:
    """The job; ``pad_multiple`` overrides the default padding (a plan records the one it used)."""
    try:
        m = registry.get_model(model)
    except ValueError as e:
        raise WorkloadError(str(e).splitlines()[0]) from None
    if workload is None:
        matches = [w for w in m.workloads
                   if (resolution is None or w.resolution == resolution)
                   and (frames is None or w.frames == int(frames))]
        if not matches:
            known = ", ".join(f"{w.resolution}/{w.frames}" for w in m.workloads)
            raise WorkloadError(f"{m.name} has no workload at {resolution} with {frames} frames; "
                                f"known (resolution/frames): {known}")
        wl = matches[0]
    else:
        try:
            wl = m.workload(workload)
        except ValueError as e:
            raise WorkloadError(str(e).splitlines()[0]) from None
    tgt = get_target(target)
    n = tgt.num_devices
    block = SPLASH_BLOCK if wl.tokens >= SPLASH_BLOCK * n else 16
    if m.family == "stdit":      # its sequences are the frames and the space: split each n ways
        block = 1
    pad = int(pad_multiple) if pad_multiple else block * n
    fn = registry.denoise_step(m, pad_multiple=pad)
    args = registry.abstract_inputs(m, wl)
    return Job(m, wl, tgt, pad, fn, tuple(args))


# The built-in seeds in the order they compile, the expert expected fastest first. The planner
# compiles the first seed while its first ILPs solve, then that seed's refinement, the second
# seed, the ILP's best, then the other seeds in this order, each followed by its refinement
# (``aoizora.pricing_order.pricing_rank``), so a short budget prices the first seeds only. The order
# is the experts' mean rank among the valid experts of each cell in the grid
# (benchmarks/results/grid.md, simulated): cfg2_context (maxdiffusion's published recipe, the
# CFG pair on data 2 and the sequence on context: ../shared/facts/practice.md) best in 25 of the
# 30 cells with a valid expert; cfg2_ulysses best in 3 and second in 18 of its 25; xDiT's
# Ulysses x ring (usp) best in 2 of its 9; context (maxdiffusion's default); Ulysses over every
# chip; tensor parallel; FSDP with the sequence split, last in most cells. Before, the second
# seed was context and then the ``EXPERTS`` order (fsdp_sp, tp_cfg, cfg2_ulysses): in the Wan
# 14B and HunyuanVideo cells, where 4-7 compiles fit in 240 s, cfg2_ulysses was rarely compiled,
# and in HunyuanVideo 720p-129f on v5e-16 it is the fastest expert (simulated). Dynamic sequence
# parallelism (dsp) is valid only for spatial-temporal DiTs, where it is the published recipe
# (Open-Sora / VideoSys), so it comes first there and changes nothing elsewhere.
SEED_ORDER = ("dsp", "cfg2_context", "cfg2_ulysses", "usp", "context", "ulysses", "tp_cfg", "fsdp_sp")


def expert_seed_layouts(job: Job) -> list:
    """Today's valid expert configurations as seeds for the planner (``plan(..., seed_layouts=
    ...)``) in ``SEED_ORDER``: each with its own program, padded only as much as its own split
    needs, and the padding recorded (``program={"pad_multiple": ...}``) so that a plan can
    rebuild it."""
    from aoizora.models.experts import expert_layouts
    from aoizora.planner import Seed

    valid = [ex for ex in expert_layouts(job.model, job.workload, job.target) if ex.valid]
    valid.sort(key=lambda ex: SEED_ORDER.index(ex.name))     # SEED_ORDER names every expert
    return [Seed(ex.layout, ex.fn, tuple(ex.args), {"pad_multiple": ex.pad_multiple})
            for ex in valid]
