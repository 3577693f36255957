"""The built-in planning jobs: a model, a workload and a target -> the program to plan.

The program is one denoising step with classifier-free guidance (``models.registry.denoise_step``)
on abstract bf16 inputs. The video sequence is padded to a multiple of ``128 x devices`` so that
any split of the sequence over the target's devices gives every shard whole 128-token splash
blocks; the padding is part of the traced shapes, so every cost counts it. Small test models
(fewer tokens than that) use 16-token blocks.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from aoizora.extract.targets import Target, get_target
from aoizora.models import registry
from aoizora.models.experts import SPLASH_BLOCK

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
        return -(-self.workload.tokens // p) * p

    def describe(self) -> str:
        w = self.workload
        return (f"{self.model.name} {w.name} ({w.width}x{w.height}, {w.frames} frames, "
                f"{w.tokens:,} tokens padded to {self.padded_tokens:,}) on {self.target.short_name}")


def builtin_job(model: str = DEFAULT_MODEL, resolution: str | None = DEFAULT_RESOLUTION,
                frames: int | None = DEFAULT_FRAMES, target: "str | Target" = DEFAULT_TARGET,
                workload: str | None = None) -> Job:
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
    pad = block * n
    fn = registry.denoise_step(m, pad_multiple=pad)
    args = registry.abstract_inputs(m, wl)
    return Job(m, wl, tgt, pad, fn, tuple(args))


def expert_seed_layouts(job: Job) -> list:
    """Today's valid expert configurations as layouts of the job's own program, for the planner
    to price alongside the ILP's (``plan(..., seed_layouts=...)``). Each expert's layout is built
    for its own padding; its attention layouts are carried over to the job's program by role
    (self / cross / text attention), its input specs and rules as they are."""
    from aoizora.formulation.layout import Layout
    from aoizora.models.experts import attention_roles, expert_layouts

    job_roles = attention_roles(job.fn, job.args)
    out = []
    for ex in expert_layouts(job.model, job.workload, job.target):
        if not ex.valid:
            continue
        by_role = {}
        for key, role in attention_roles(ex.fn, ex.args).items():
            if key in ex.layout.attention:
                by_role.setdefault(role, ex.layout.attention[key])
        if any(r not in by_role for r in job_roles.values()):
            continue
        attention = {k: by_role[r] for k, r in job_roles.items()}
        out.append(Layout(mesh_axes=dict(ex.layout.mesh_axes), in_specs=list(ex.layout.in_specs),
                          out_specs=ex.layout.out_specs, node_specs={}, attention=attention,
                          rules=dict(ex.layout.rules), name=ex.layout.name))
    return out
