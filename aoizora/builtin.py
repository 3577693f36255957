"""The built-in planning jobs: a model, a workload and a target -> the program to plan.

``task="denoise"`` (the default) is one denoising step, below; ``task="train"`` is one training
step of a Wan 2.1 model (``models.training``: flow matching, AdamW, fp32 state) with a global
``batch`` of videos, on abstract (state, batch) inputs, padded as below; its seeds are the expert
training configurations (``models.training_experts``), each with its own remat. Before a training
job is built, two checks (``TrainFitError``, one line): the videos must give every chip at least
one 16-token block of queries (``check_train_batch``), and the training state must fit in HBM
fully sharded over every chip (``check_train_fits``: how many GiB are missing per chip, and what
would fit: more chips, AdamW moments offloaded to the host, a smaller batch).

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
from aoizora.kernels.attention_kernels import SPLASH_BLOCK

DEFAULT_MODEL = "wan2.1-1.3b"
DEFAULT_RESOLUTION = "480p"
DEFAULT_FRAMES = 81
DEFAULT_TARGET = "v5e-8"


TASKS = ("denoise", "train")


class WorkloadError(ValueError):
    """An unknown model or workload."""


class TrainFitError(WorkloadError):
    """A training job that no layout can run: too few tokens for the chips, or a state that does
    not fit in HBM however it is sharded."""


@dataclasses.dataclass
class Job:
    model: Any                 # registry.Model
    workload: Any              # workloads.Workload
    target: Target
    pad_multiple: int
    fn: Callable
    args: tuple
    task: str = "denoise"
    batch: int = 1                 # training: global batch (videos per step)
    remat: Any = None              # training: TrainConfig.remat of the program (None: default)

    @property
    def padded_tokens(self) -> int:
        p = self.pad_multiple
        if self.model.family == "stdit":         # frames and spatial tokens padded each
            tp, sp = stdit.padded_grid(self.workload.grid, p)
            return tp * sp
        return -(-self.workload.tokens // p) * p

    def describe(self) -> str:
        w = self.workload
        what = f"training, batch {self.batch}, " if self.task == "train" else ""
        return (f"{self.model.name} {what}{w.name} ({w.width}x{w.height}, {w.frames} frames, "
                f"{w.tokens:,} tokens padded to {self.padded_tokens:,}) on {self.target.short_name}")

    def program(self) -> dict:
        """What a plan records to rebuild this program (``Plan.program``)."""
        out: dict = {"pad_multiple": self.pad_multiple}
        if self.task == "train":
            out.update(task="train", batch=self.batch)
            if self.remat is not None:
                out["remat"] = self.remat
        return out


def builtin_job(model: str = DEFAULT_MODEL, resolution: str | None = DEFAULT_RESOLUTION,
                frames: int | None = DEFAULT_FRAMES, target: "str | Target" = DEFAULT_TARGET,
                workload: str | None = None, pad_multiple: int | None = None, *,
                task: str = "denoise", batch: int = 1, remat: Any = None) -> Job:
    """The job; ``pad_multiple`` overrides the default padding (a plan records the one it used).
    ``task="train"``: the training step with global ``batch`` and ``remat`` (None: the
    TrainConfig default)."""
    if task not in TASKS:
        raise WorkloadError(f"task {task!r}: give one of {list(TASKS)}")
    try:
        m = registry.get_model(model)
    except ValueError as e:
        raise WorkloadError(str(e).splitlines()[0]) from None
    if task == "train" and m.family != "wan":
        raise WorkloadError(f"training is built in for Wan 2.1 only; {m.name} is {m.family}")
    wl = _workload_of(m, resolution, frames, workload, task)
    tgt = get_target(target)
    n = tgt.num_devices
    block = SPLASH_BLOCK if wl.tokens >= SPLASH_BLOCK * n else 16
    if m.family == "stdit":      # its sequences are the frames and the space: split each n ways
        block = 1
    pad = int(pad_multiple) if pad_multiple else block * n
    if task == "train":
        return _train_job(m, wl, tgt, pad, int(batch), remat)
    fn = registry.denoise_step(m, pad_multiple=pad)
    args = registry.abstract_inputs(m, wl)
    return Job(m, wl, tgt, pad, fn, tuple(args))


def _workload_of(m, resolution, frames, workload, task):
    from aoizora.models import training

    pool = list(m.workloads)
    if task == "train":
        pool += [w for w in training.TRAIN_WORKLOADS if w.name not in {x.name for x in pool}]
    if workload is None:
        matches = [w for w in pool
                   if (resolution is None or w.resolution == resolution)
                   and (frames is None or w.frames == int(frames))]
        if not matches:
            known = ", ".join(f"{w.resolution}/{w.frames}" for w in pool)
            raise WorkloadError(f"{m.name} has no workload at {resolution} with {frames} frames; "
                                f"known (resolution/frames): {known}")
        return matches[0]
    for w in pool:
        if w.name == workload:
            return w
    raise WorkloadError(f"{m.name} has no workload {workload!r}; known: {[w.name for w in pool]}")


def _train_job(m, wl, tgt: Target, pad: int, batch: int, remat) -> Job:
    import dataclasses as dc

    from aoizora.models import training
    from aoizora.models.training_experts import train_config

    if batch < 1:
        raise WorkloadError(f"--batch {batch}: give 1 or more videos")
    wl = dc.replace(wl, batch=batch)
    check_train_batch(m, wl, tgt, batch)
    check_train_fits(m, wl, tgt, batch)
    config = train_config(remat if remat is not None else "none", pad)
    fn = training.train_step(m, config)
    args = training.abstract_train_inputs(m, wl, batch, config)
    return Job(m, wl, tgt, pad, fn, tuple(args), task="train", batch=batch, remat=remat)


MIN_BLOCK = 16   # the smallest splash query block a chip can be given (tokens)


def check_train_batch(m, wl, tgt: Target, batch: int) -> None:
    """TrainFitError when ``batch`` videos give fewer 16-token query blocks than chips: every
    layout splits the batch and the sequence over the chips, and one of them would get none."""
    n = tgt.num_devices
    blocks = batch * -(-wl.tokens // MIN_BLOCK)
    if blocks < n:
        need = -(-n // -(-wl.tokens // MIN_BLOCK))
        raise TrainFitError(
            f"--batch {batch} divides into no layout on {tgt.short_name}: {batch} x {wl.tokens:,} "
            f"tokens give {blocks} query blocks of {MIN_BLOCK} for {n} chips; give --batch {need} "
            f"or more, more frames, or a smaller target")


STATE_BYTES_PER_PARAM = 16   # fp32 weights, fp32 gradients, AdamW's fp32 mu and nu
MOMENT_BYTES_PER_PARAM = 8


def train_memory_floor(m, wl, batch: int, n: int) -> dict[str, float]:
    """Bytes per chip no layout of the training step goes below on n chips: the state (16 bytes
    per parameter) fully sharded, and the bf16 block inputs every block keeps for the backward
    under full remat (batch x tokens x width x layers x 2 bytes), split n ways."""
    c = m.config
    state = m.params * STATE_BYTES_PER_PARAM / n
    acts = batch * wl.tokens * c.dim * c.layers * 2 / n
    return {"state": state, "activations": acts, "moments": m.params * MOMENT_BYTES_PER_PARAM / n}


def check_train_fits(m, wl, tgt: Target, batch: int) -> None:
    """TrainFitError (one line) when the floor of ``train_memory_floor`` exceeds the chip's HBM:
    how many GiB are missing per chip and what would fit."""
    from aoizora.extract.targets import standard_targets

    n, hbm = tgt.num_devices, tgt.chip.device_hbm_bytes
    f = train_memory_floor(m, wl, batch, n)
    need = f["state"] + f["activations"]
    if need <= hbm:
        return
    gib = 2 ** 30
    fits = []
    bigger = [t for t in standard_targets() if t.chip.generation == tgt.chip.generation
              and t.num_devices > n and sum(train_memory_floor(m, wl, batch, t.num_devices)
                                            [k] for k in ("state", "activations")) <= hbm]
    if bigger:
        fits.append(f"{min(bigger, key=lambda t: t.num_devices).short_name}")
    if need - f["moments"] <= hbm:
        fits.append(f"the AdamW moments offloaded to the host ({f['moments'] / gib:.1f} GiB per "
                    f"chip)")
    per_video = f["activations"] / batch
    b = int((hbm - f["state"]) // per_video) if per_video else 0
    if 1 <= b < batch:
        fits.append(f"--batch {b}")
    raise TrainFitError(
        f"training {m.name} {wl.name} batch {batch} fits no layout on {tgt.short_name}: at least "
        f"{need / gib:.1f} GiB per chip (state {f['state'] / gib:.1f} GiB fully sharded over {n} "
        f"chips, 16 bytes per parameter; block inputs {f['activations'] / gib:.1f} GiB under full "
        f"remat) against {hbm / gib:.1f} GiB of HBM: {(need - hbm) / gib:.1f} GiB missing per "
        f"chip; would fit: {', '.join(fits) or 'none of more chips of this generation, offload, a smaller batch'}")


# The built-in seeds in the order they compile, the expert expected fastest first. The planner
# compiles the first seed while its first ILPs solve, then that seed's refinement, the second
# seed, the ILP's best, then the other seeds in this order, each followed by its refinement
# (``aoizora.planning.pricing_order.pricing_rank``), so a short budget prices the first seeds only. The order
# is the experts' mean rank among the valid experts of each cell in the grid, fitted on
# benchmarks/results/grid.md (simulated; the ranks: benchmarks/results/lab_notes.md):
# cfg2_context (maxdiffusion's published recipe, the CFG pair on data 2 and the sequence on
# context), cfg2_ulysses, xDiT's Ulysses x ring (usp), context (maxdiffusion's default), Ulysses
# over every chip, tensor parallel, FSDP with the sequence split. Dynamic sequence parallelism
# (dsp) is valid only for spatial-temporal DiTs, where it is the published recipe (Open-Sora /
# VideoSys), so it comes first there and changes nothing elsewhere.
SEED_ORDER = ("dsp", "cfg2_context", "cfg2_ulysses", "usp", "context", "ulysses", "tp_cfg", "fsdp_sp")


def expert_seed_layouts(job: Job) -> list:
    """The seeds of ``job``: the expert configurations of its task (``_inference_seeds``,
    ``training_seed_layouts``)."""
    if job.task == "train":
        return training_seed_layouts(job)
    return _inference_seeds(job)


# the training experts in the order they compile: maxdiffusion's published recipe first, FSDP x
# TP next, Ulysses with full remat last; fitted on benchmarks/results/training_grid.md (the
# ranks: benchmarks/results/lab_notes.md)
TRAIN_SEED_ORDER = ("maxdiffusion", "fsdp_tp", "dp_fsdp", "fsdp_ulysses")


def training_seed_layouts(job: Job) -> list:
    """The valid expert training configurations (``models.training_experts``) as seeds, each with
    its own train step (its remat and padding), recorded in ``program``; each with its
    ``retraceable`` twin (the same layout on its step traced with every residual kept), on which
    the seed's refinement lets the ILP choose the remat (``aoizora.planning.seed_refinement``)."""
    from aoizora.models.training_experts import training_expert_layouts
    from aoizora.planner import Seed

    def seeds(remat=None) -> dict:
        exs = training_expert_layouts(job.model, job.workload, job.target, job.batch, remat)
        return {ex.name: Seed(ex.layout, ex.fn, tuple(ex.args),
                              {"pad_multiple": ex.pad_multiple, "task": "train",
                               "batch": job.batch, "remat": ex.remat})
                for ex in exs if ex.valid}

    own, twins = seeds(), seeds("none")
    return [dataclasses.replace(own[name], retraceable=twins.get(name))
            for name in TRAIN_SEED_ORDER if name in own]


def _inference_seeds(job: Job) -> list:
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
