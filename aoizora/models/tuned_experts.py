"""Expert configurations with the knobs their users turn: each expert's layout (mesh, specs,
attention layout) as published, under other settings of three knobs. What each setting is:

- ``remat`` (training only; ``TrainConfig.remat`` of ``models.training``): ``published`` (the
  recipe's: maxdiffusion's HIDDEN_STATE_WITH_OFFLOAD, DiffSynth's full checkpointing), and
  maxdiffusion's named ``remat_policy`` values (``GradientCheckpointType`` of
  ``src/maxdiffusion/models/gradient_checkpoint.py``) in Wan's activation names:
    ``none``                          NONE: no remat, every activation kept;
    ``full``                          FULL: each block recomputed in the backward;
    ``matmul_without_batch``          MATMUL_WITHOUT_BATCH (``checkpoint_dots_with_no_batch_dims``):
                                      the projections' and fc1's outputs kept (``"dots"``);
    ``offload_matmul_without_batch``  OFFLOAD_MATMUL_WITHOUT_BATCH: those same outputs offloaded
                                      to host memory, the rest recomputed;
    ``hidden_state_with_offload``     HIDDEN_STATE_WITH_OFFLOAD: the attention outputs offloaded
                                      (maxdiffusion's README recipe);
  and ``keep_what_fits:K`` (K = 1..len(``KEEP_LADDER``)): every activation kept but the first K
  groups of ``KEEP_LADDER`` (the largest per token first), recomputed. The tuner
  (``aoizora.expert_tuning``) tries the rungs in order and stops at the first that fits in HBM:
  what a user does who keeps what fits.
- ``blocks``: ``published`` (the recipe's splash blocks, or the automatic ones where it
  publishes none) or ``shard`` (``tiles.kernel_tiled``: blocks sized to each attention node's
  per-shard lengths by the kernel model, forward and backward, the fused dq-dk-dv backward
  where the model prices it lower): a choice any expert could make.
- ``options``: ``published`` (the recipe's libtpu options: maxdiffusion's ``LIBTPU_INIT_ARGS``,
  or libtpu's defaults for recipes that publish none) or ``maxdiffusion`` (maxdiffusion's
  published options on a recipe that has none: the only TPU recipe that publishes any) or
  ``libtpu_default`` (no options, on a recipe that has some); on TPU also ``no_windowed_einsum``
  (the published options and MaxText's two inference settings that keep XLA from turning a
  gathered matmul into a windowed einsum, ``formulation.compiler_settings.TPU_OPTIONS``: what the
  planner compiles its own layouts with).

``variant(job, expert_name, knobs)`` builds the program (train step or denoising step, padded
as the expert pads) and the layout for one setting; ``None`` when the expert is not valid for
the job, or a knob does not apply (remat on inference). Every variant keeps the expert's mesh,
parameter specs and attention layout: only the knobs change.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable

from aoizora.formulation.layout import Layout
from aoizora.models import experts as E
from aoizora.models import training_experts as T
from aoizora.formulation.compiler_settings import TPU_OPTIONS
from aoizora.kernels.recipes import MAXDIFFUSION_OPTIONS

PUBLISHED = "published"
NO_WINDOWED_EINSUM = "no_windowed_einsum"

# maxdiffusion's named remat policies, in Wan's activation names (module docstring)
_DOTS = ("qkv", "proj_out", "cross_q", "cross_kv", "ffn_hidden")
REMAT_POLICIES: dict[str, Any] = {
    "none": "none",
    "full": "full",
    "matmul_without_batch": "dots",
    "offload_matmul_without_batch": {n: "offload" for n in _DOTS},
    "hidden_state_with_offload": dict(T.MAXDIFFUSION_REMAT),
}
# keep what fits: the activations given up first, in this order (per token: fc1's output is
# the MLP width, q/k/v three times the model width, the others the model width; cross_kv is the
# text's, the smallest)
KEEP_LADDER: tuple[tuple[str, ...], ...] = (
    ("ffn_hidden",), ("qkv",), ("residual", "proj_out"), ("attn_out", "cross_out"),
)
KEEP_WHAT_FITS = "keep_what_fits"
BLOCKS = (PUBLISHED, "shard")


@dataclasses.dataclass(frozen=True)
class Knobs:
    """One setting of the three knobs (module docstring)."""

    remat: str = PUBLISHED
    blocks: str = PUBLISHED
    options: str = PUBLISHED

    def label(self) -> str:
        """e.g. "remat none, blocks shard, options published"."""
        return f"remat {self.remat}, blocks {self.blocks}, options {self.options}"


@dataclasses.dataclass
class Variant:
    """An expert's layout under ``knobs``: the program to compile (``fn``, ``args``: realize
    exactly this pair), its layout, and what the program is (``program``: pad_multiple, remat)."""

    expert: str
    knobs: Knobs
    fn: Callable
    args: tuple
    layout: Layout
    program: dict[str, Any]


def keep_what_fits(rung: int) -> dict[str, str]:
    """Rung ``rung`` (1-based) of keep-what-fits: the first ``rung`` groups of ``KEEP_LADDER``
    recomputed, every other activation kept. Raises ValueError outside 1..len(KEEP_LADDER)."""
    if not 1 <= rung <= len(KEEP_LADDER):
        raise ValueError(f"keep-what-fits rung {rung}: give 1..{len(KEEP_LADDER)}")
    from aoizora.models.wan import ACTIVATION_NAMES

    dropped = {n for group in KEEP_LADDER[:rung] for n in group}
    return {n: "recompute" if n in dropped else "keep" for n in ACTIVATION_NAMES}


def remat_value(label: str) -> Any:
    """The ``TrainConfig.remat`` of a remat label (module docstring); ValueError if unknown."""
    if label in REMAT_POLICIES:
        return REMAT_POLICIES[label]
    if label.startswith(KEEP_WHAT_FITS + ":"):
        return keep_what_fits(int(label.split(":", 1)[1]))
    raise ValueError(f"remat {label!r}: give {PUBLISHED}, one of {sorted(REMAT_POLICIES)} or "
                     f"{KEEP_WHAT_FITS}:K")


def remat_labels(task: str) -> list[str]:
    """The remat settings the tuner tries for ``task`` (none for inference), published first."""
    if task != "train":
        return [PUBLISHED]
    return [PUBLISHED, *REMAT_POLICIES]


def option_labels(published: dict[str, Any], family: str = "tpu") -> list[str]:
    """The options settings to try for a recipe whose published options are ``published``, on a
    target of ``family`` (module docstring), published first."""
    if family != "tpu":
        return [PUBLISHED]
    return [PUBLISHED, NO_WINDOWED_EINSUM, "libtpu_default" if published else "maxdiffusion"]


def _options(knob: str, published: dict[str, Any], task: str) -> dict[str, Any]:
    if knob == PUBLISHED:
        return dict(published)
    if knob == "libtpu_default":
        return {}
    if knob == "maxdiffusion":
        return dict(T.MAXDIFFUSION_TRAIN_OPTIONS if task == "train" else MAXDIFFUSION_OPTIONS)
    if knob == NO_WINDOWED_EINSUM:
        return {**published, **TPU_OPTIONS}
    raise ValueError(f"options {knob!r}: give {PUBLISHED}, {NO_WINDOWED_EINSUM}, libtpu_default "
                     f"or maxdiffusion")


def _expert(job, name: str, remat: Any = None):
    """The job's expert ``name`` (training: its step under ``remat``, None for the recipe's)."""
    if getattr(job, "task", "denoise") == "train":
        return T.training_expert(name, job.model, job.workload, job.target, job.batch, remat)
    else:
        exs = E.expert_layouts(job.model, job.workload, job.target)
    return next((e for e in exs if e.name == name), None)


def variant(job, name: str, knobs: Knobs, vmem_fraction: float = 1.0) -> Variant | None:
    """Expert ``name`` of ``job`` (``builtin.Job``) under ``knobs``; None when the expert is not
    valid for the job or remat is asked of an inference job. ``vmem_fraction``: blocks ``shard``
    within that fraction of the scoped VMEM (``kernels.tiles.kernel_tiled``). Raises ValueError
    for an unknown knob setting."""
    task = getattr(job, "task", "denoise")
    if task != "train" and knobs.remat != PUBLISHED:
        return None
    remat = None if knobs.remat == PUBLISHED else remat_value(knobs.remat)
    ex = _expert(job, name, remat)
    if ex is None or not ex.valid:
        return None
    layout = ex.layout
    if knobs.blocks == "shard":
        from aoizora.extract.frontends.jax.ir_builder import build_ir
        from aoizora.kernels.tiles import kernel_tiled

        with warnings.catch_warnings():     # ops kept replicated: the IR's warning, not ours
            warnings.simplefilter("ignore")
            ir = build_ir(ex.fn, *ex.args)
        layout = kernel_tiled(layout, ir, job.target, vmem_fraction)
    elif knobs.blocks != PUBLISHED:
        raise ValueError(f"blocks {knobs.blocks!r}: give one of {list(BLOCKS)}")
    layout = dataclasses.replace(
        layout, compiler_options=_options(knobs.options, ex.layout.compiler_options, task),
        name=f"{ex.layout.name or name} [{knobs.label()}]")
    program = {"pad_multiple": ex.pad_multiple}
    if task == "train":
        program["remat"] = getattr(ex, "remat", None)
    return Variant(name, knobs, ex.fn, ex.args, layout, program)
