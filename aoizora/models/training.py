"""One training step of a built-in Wan 2.1 model: flow matching, ``jax.value_and_grad``, AdamW.

``train_step(model, config)`` -> ``step(state, batch) -> (new_state, loss)``:

- state = ``{"params": fp32 master weights, "opt_state": optax.adamw state (fp32 first and
  second moments mu, nu; an int32 count), "step": int32 []}``; the new state has the same pytree
  structure, shapes and dtypes (so its buffers can be donated and it can be fed back in);
- batch = ``{"latents": [B, 16, F, H, W] (VAE latents x_0), "context": [B, text_len, text_dim]
  (umT5 states), "key": uint32[2] (a raw PRNG key)}``; the step's randomness is
  ``fold_in(key, step)``, so a step is deterministic in (state, batch);
- mixed precision as practitioners run it: the loss casts the fp32 params to ``compute_dtype``
  (bf16) and runs the DiT in bf16 (its own f32 islands: norms, modulation, softmax accumulation);
  gradients come back fp32 through the casts; AdamW updates the fp32 params with fp32 moments.

Flow matching (rectified flow, as Wan 2.1 is trained; ``shared/facts/training.md``), per sample:
  u ~ U(0, 1);  t = shift * u / (1 + (shift - 1) * u)   (Wan's timestep shift, ``shift`` = 5.0, its
  text-to-video ``sample_shift`` default in ``generate.py``, applied to sigmas as in
  ``wan/utils/fm_solvers_unipc.py``);
  eps ~ N(0, I);  x_t = (1 - t) x_0 + t eps;  v = eps - x_0;
  loss = mean((model(x_t, 1000 t, context) - v)^2)    (the model's timestep is t times the 1000
  training timesteps, as the Wan samplers feed it).

Rematerialization (``TrainConfig.remat``), applied to each transformer block (the body of the
model's ``lax.scan``; one policy covers every layer):
  "none"  keep every residual of the block for the backward (no ``jax.checkpoint``);
  "full"  ``jax.checkpoint`` with nothing saveable: only the block's input is kept, its whole
          forward runs again in the backward;
  "dots"  save the matmuls without batch dims (``dots_with_no_batch_dims_saveable``, maxdiffusion's
          ``remat_policy="minimal"``-style), recompute the rest;
  {name: "keep" | "recompute" | "offload"}  per named activation of the block
          (``wan.ACTIVATION_NAMES``; names left out are recomputed), built into
          ``save_and_offload_only_these_names(names_which_can_be_saved=keep,
          names_which_can_be_offloaded=offload, offload_src="device", offload_dst="pinned_host")``.
A mapping is stored as a sorted tuple of (name, choice) pairs, so the config stays hashable;
``remat_choices(config.remat)`` gives it back as a dict.

The step carries ``step.remat`` (its policy) and ``step.with_remat(remat)`` (the same step under
another policy): the planner decides the remat of a step traced with ``remat="none"`` and
``plan.jit`` / ``realize`` run the chosen one (``aoizora.runtime.rematerialize``).

``abstract_train_inputs(model, workload, batch)`` gives (state, batch) as ``jax.ShapeDtypeStruct``
for tracing and planning without allocating; ``init_train_state`` / ``random_batch`` give real
arrays (small configurations).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from aoizora.models import registry
from aoizora.models import workloads as W
from aoizora.models.wan import ACTIVATION_NAMES

REMAT_POLICIES = ("none", "full", "dots")
REMAT_CHOICES = ("keep", "recompute", "offload")

NUM_TRAIN_TIMESTEPS = 1000   # Wan's scheduler: timesteps 0..1000 (num_train_timesteps)


class TrainingError(ValueError):
    """A training configuration or input that the built-in step cannot take."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """AdamW and flow-matching settings. Units: learning rate per step; the rest dimensionless."""
    learning_rate: float = 1e-5
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01
    shift: float = 5.0                    # Wan's timestep shift (t2v sample_shift)
    compute_dtype: Any = jnp.bfloat16     # forward/backward compute; params and moments stay fp32
    pad_multiple: int = 1                 # token sequence zero-padded to a multiple (sequence splits)
    remat: Any = "none"                   # "none" | "full" | "dots" | {activation name: choice}

    def __post_init__(self):
        object.__setattr__(self, "remat", normalize_remat(self.remat))
        if not self.learning_rate > 0 or not 0 <= self.b1 < 1 or not 0 <= self.b2 < 1:
            raise TrainingError(f"TrainConfig: learning_rate > 0 and 0 <= b1, b2 < 1 wanted; got "
                                f"{self.learning_rate}, {self.b1}, {self.b2}")
        if not self.shift > 0:
            raise TrainingError(f"TrainConfig: shift {self.shift} must be positive")

    def optimizer(self):
        import optax

        return optax.adamw(self.learning_rate, b1=self.b1, b2=self.b2, eps=self.eps,
                           weight_decay=self.weight_decay)


def normalize_remat(remat):
    """A policy name as is; a mapping as a sorted tuple of (name, choice). One-line errors."""
    if isinstance(remat, str):
        if remat not in REMAT_POLICIES:
            raise TrainingError(f"TrainConfig.remat {remat!r}: give one of {list(REMAT_POLICIES)} "
                                f"or a mapping {{activation name: {'|'.join(REMAT_CHOICES)}}}")
        return remat
    try:
        items = sorted(dict(remat).items())
    except (TypeError, ValueError):
        raise TrainingError(f"TrainConfig.remat {remat!r}: give one of {list(REMAT_POLICIES)} or a "
                            f"mapping {{activation name: {'|'.join(REMAT_CHOICES)}}}") from None
    for name, choice in items:
        if name not in ACTIVATION_NAMES:
            raise TrainingError(f"TrainConfig.remat: unknown activation {name!r}; Wan's block "
                                f"names {list(ACTIVATION_NAMES)}")
        if choice not in REMAT_CHOICES:
            raise TrainingError(f"TrainConfig.remat[{name!r}] = {choice!r}: give one of "
                                f"{list(REMAT_CHOICES)}")
    return tuple(items)


def remat_choices(remat) -> dict[str, str]:
    """Every block activation's choice under ``remat`` (a policy name or a mapping): "keep",
    "recompute" or "offload" ("dots" keeps the projections and fc1, recomputes the rest)."""
    remat = normalize_remat(remat)
    if remat == "none":
        return {n: "keep" for n in ACTIVATION_NAMES}
    if remat == "full":
        return {n: "recompute" for n in ACTIVATION_NAMES}
    if remat == "dots":
        dots = ("qkv", "proj_out", "cross_q", "cross_kv", "ffn_hidden")
        return {n: "keep" if n in dots else "recompute" for n in ACTIVATION_NAMES}
    return {n: dict(remat).get(n, "recompute") for n in ACTIVATION_NAMES}


def remat_wrapper(remat) -> Callable | None:
    """The function applied to each block's scan body for ``remat`` (None for "none")."""
    remat = normalize_remat(remat)
    if remat == "none":
        return None
    cp = jax.checkpoint_policies
    if remat == "full":
        policy = cp.nothing_saveable
    elif remat == "dots":
        policy = cp.dots_with_no_batch_dims_saveable
    else:
        choice = dict(remat)
        policy = cp.save_and_offload_only_these_names(
            names_which_can_be_saved=[n for n, c in choice.items() if c == "keep"],
            names_which_can_be_offloaded=[n for n, c in choice.items() if c == "offload"],
            offload_src="device", offload_dst="pinned_host")
    return lambda body: jax.checkpoint(body, policy=policy, prevent_cse=False)


def _wan(model) -> registry.Model:
    m = registry.get_model(model)
    if m.family != "wan":
        raise TrainingError(f"the built-in training step is Wan 2.1's; {m.name} is {m.family}")
    return m


def shifted_timesteps(u, shift: float):
    """Wan's shift of uniform u in [0, 1]: shift * u / (1 + (shift - 1) * u)."""
    return shift * u / (1.0 + (shift - 1.0) * u)


def flow_matching_loss(model, config: TrainConfig) -> Callable:
    """``loss(params, latents, context, u, eps) -> scalar f32`` (module docstring); u [B] in [0, 1]
    before the shift, eps shaped like the latents. params fp32, cast to ``config.compute_dtype``."""
    m = _wan(model)
    cdt = config.compute_dtype
    wrap = remat_wrapper(config.remat)

    def loss(params, latents, context, u, eps):
        p = jax.tree.map(lambda a: a.astype(cdt), params)
        x0 = latents.astype(jnp.float32)
        t = shifted_timesteps(u.astype(jnp.float32), config.shift)
        tb = t.reshape((-1,) + (1,) * (x0.ndim - 1))
        xt = (1.0 - tb) * x0 + tb * eps
        pred = registry.forward(m, p, xt.astype(cdt), t * NUM_TRAIN_TIMESTEPS,
                                {"context": context.astype(cdt)}, config.pad_multiple, wrap)
        target = eps - x0
        return jnp.mean(jnp.square(pred.astype(jnp.float32) - target))

    return loss


def train_step(model, config: TrainConfig | None = None) -> Callable:
    """``step(state, batch) -> (new_state, loss)``: one AdamW step on the flow-matching loss."""
    config = config or TrainConfig()
    loss_fn = flow_matching_loss(model, config)
    tx = config.optimizer()

    def step(state, batch):
        import optax

        latents = batch["latents"]
        key = jax.random.fold_in(batch["key"], state["step"])
        k_u, k_eps = jax.random.split(key)
        u = jax.random.uniform(k_u, (latents.shape[0],), jnp.float32)
        eps = jax.random.normal(k_eps, latents.shape, jnp.float32)
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], latents, batch["context"], u,
                                                  eps)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state, "step": state["step"] + 1}, loss

    # the planner's remat protocol (``aoizora.runtime.rematerialize``): the policy this step was traced
    # with, and the same step under another one
    step.remat = config.remat
    step.with_remat = lambda remat: train_step(model, dataclasses.replace(config, remat=remat))
    return step


def init_train_state(model, params, config: TrainConfig | None = None) -> dict:
    """The state of step 0 for fp32 ``params`` (AdamW moments zero)."""
    config = config or TrainConfig()
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)
    return {"params": params, "opt_state": config.optimizer().init(params),
            "step": jnp.zeros((), jnp.int32)}


# The training grid of issue #35: both sizes at 480p and 720p, 21/41/81 frames, global batch 1/2/4
# (the small test configuration trains on its own tiny workloads).
TRAIN_MODELS = ("wan2.1-1.3b", "wan2.1-14b")
TRAIN_WORKLOADS = tuple(W.WAN_480P + W.WAN_720P)
TRAIN_BATCHES = (1, 2, 4)


def training_grid() -> list[tuple[str, W.Workload]]:
    """(model name, workload with its global batch) for every training workload of the grid."""
    return [(m, dataclasses.replace(w, batch=b)) for m in TRAIN_MODELS for w in TRAIN_WORKLOADS
            for b in TRAIN_BATCHES]


def _workload(m: registry.Model, workload, batch: int) -> W.Workload:
    if int(batch) != batch or batch < 1:
        raise TrainingError(f"global batch {batch}: give 1 or more videos")
    if isinstance(workload, str):
        known = {w.name: w for w in (*m.workloads, *TRAIN_WORKLOADS)}
        if workload not in known:
            raise TrainingError(f"{m.name} has no training workload {workload!r}; known: "
                                f"{sorted(known)}")
        workload = known[workload]
    return dataclasses.replace(workload, batch=int(batch))


def abstract_train_inputs(model, workload, batch: int = 1, config: TrainConfig | None = None
                          ) -> tuple[dict, dict]:
    """(state, batch) of the step as ShapeDtypeStructs: fp32 params and moments, int32 step and
    count, bf16 latents and context (the data pipeline's dtype), uint32[2] key."""
    config = config or TrainConfig()
    m = _wan(model)
    wl = _workload(m, workload, batch)
    params = registry.abstract_params(m, jnp.float32)
    state = jax.eval_shape(lambda p: init_train_state(m, p, config), params)
    sds = jax.ShapeDtypeStruct
    c = m.config
    data = {"latents": sds(wl.latent_shape(c.in_channels), jnp.bfloat16),
            "context": sds((wl.batch, c.text_len, c.text_dim), jnp.bfloat16),
            "key": sds((2,), jnp.uint32)}
    return state, data


def random_batch(model, workload, key, batch: int = 1) -> dict:
    """A real batch for ``workload`` (small configurations): normal latents and context."""
    m = _wan(model)
    wl = _workload(m, workload, batch)
    k1, k2, k3 = jax.random.split(key, 3)
    c = m.config
    return {"latents": jax.random.normal(k1, wl.latent_shape(c.in_channels), jnp.bfloat16),
            "context": jax.random.normal(k2, (wl.batch, c.text_len, c.text_dim), jnp.bfloat16),
            "key": jax.random.bits(k3, (2,), jnp.uint32)}
