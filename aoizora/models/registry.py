"""The built-in models by name: configuration, parameter count, workloads, one denoising step.

``get_model(name)`` -> ``Model``; ``denoise_step(model, pad_multiple)`` -> ``step(params, latents,
timestep, text, text_uncond, guidance)``: ONE denoising step with classifier-free guidance -- the
conditional and unconditional inputs run as a batch of 2 through the DiT and are combined as the
samplers do: ``pred_uncond + guidance * (pred_cond - pred_uncond)``.
``abstract_inputs(model, workload)`` gives the step's arguments as ``jax.ShapeDtypeStruct`` (bf16
params and activations) for tracing and compiling without allocating; ``init_params`` gives real
random arrays (small configs).

Text inputs are dicts: Wan ``{"context": [B, 512, 4096]}`` (umT5); Open-Sora STDiT3
``{"context": [B, 300, 4096]}`` (T5-v1.1-XXL); HunyuanVideo
``{"context": [B, 256, 4096], "pooled": [B, 768]}`` (LLM hidden states + the CLIP-L vector).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from aoizora.models import config as C
from aoizora.models import hunyuan, layers, stdit, wan
from aoizora.models import workloads as W


class UnknownModelError(ValueError):
    """A model name that is not built in."""


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    family: str                        # "wan" | "hunyuan" | "stdit"
    config: Any                        # WanConfig | HunyuanConfig | STDiTConfig
    nominal_params: float              # the size in the name (parameters)
    workloads: tuple[W.Workload, ...]

    @property
    def param_specs(self) -> dict:
        return _impl(self).param_specs(self.config)

    @property
    def params(self) -> int:
        """Parameter count computed from the configuration (elements of the param pytree)."""
        return layers.count(self.param_specs)

    def workload(self, name: str) -> W.Workload:
        for w in self.workloads:
            if w.name == name:
                return w
        raise ValueError(f"{self.name} has no workload {name!r}; known: "
                         f"{[w.name for w in self.workloads]}")

    def text_shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        c = self.config
        out = {"context": (batch, c.text_len, c.text_dim)}
        if self.family == "hunyuan":
            out["pooled"] = (batch, c.clip_dim)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "family": self.family, "params": self.params,
                "nominal_params": self.nominal_params,
                "config": dataclasses.asdict(self.config),
                "workloads": [w.to_json() for w in self.workloads]}


def _impl(model: Model):
    return {"wan": wan, "hunyuan": hunyuan, "stdit": stdit}[model.family]


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("wan2.1-1.3b", "wan", C.WAN_1_3B, 1.3e9, tuple(W.WAN_480P)),
    Model("wan2.1-14b", "wan", C.WAN_14B, 14e9, tuple(W.WAN_480P + W.WAN_720P)),
    Model("hunyuanvideo-13b", "hunyuan", C.HUNYUAN_13B, 13e9, tuple(W.HUNYUAN)),
    Model("wan2.1-small", "wan", C.WAN_SMALL, 0.0, tuple(W.SMALL)),
    Model("hunyuanvideo-small", "hunyuan", C.HUNYUAN_SMALL, 0.0, tuple(W.SMALL)),
    Model("opensora-stdit3-xl", "stdit", C.STDIT3_XL, 1.1e9, tuple(W.OPENSORA)),
    Model("opensora-stdit3-small", "stdit", C.STDIT_SMALL, 0.0, tuple(W.OPENSORA_SMALL)),
)}
FULL_SIZE = ("wan2.1-1.3b", "wan2.1-14b", "hunyuanvideo-13b", "opensora-stdit3-xl")


def get_model(name: "str | Model") -> Model:
    if isinstance(name, Model):
        return name
    if name not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; built in: {sorted(MODELS)}")
    return MODELS[name]


def forward(model: Model, params, latents, timestep, text: dict, pad_multiple: int = 1,
            remat=None):
    """One DiT forward (no guidance): the model's prediction for ``latents``. ``remat`` (Wan
    only): a function applied to the per-block scan body (``wan.forward``)."""
    model = get_model(model)
    if remat is not None:
        if model.family != "wan":
            raise ValueError(f"remat is built into Wan's blocks only; {model.name} is {model.family}")
        return wan.forward(params, model.config, latents, timestep, text["context"], pad_multiple,
                           remat)
    if model.family in ("wan", "stdit"):
        return _impl(model).forward(params, model.config, latents, timestep, text["context"],
                                    pad_multiple)
    return hunyuan.forward(params, model.config, latents, timestep, text["context"], text["pooled"],
                           pad_multiple)


def denoise_step(model: "str | Model", pad_multiple: int = 1) -> Callable:
    """``step(params, latents, timestep, text, text_uncond, guidance) -> guided prediction``.

    latents [B, C, F, H, W] (C = 16; 4 for STDiT3); timestep [B] (0..1000); text / text_uncond
    dicts (see module doc);
    guidance a scalar. The conditional and unconditional inputs are one batch of 2B through the
    model; the output [B, 16, F, H, W] is ``uncond + guidance * (cond - uncond)``. The token
    sequence is zero-padded inside to a multiple of ``pad_multiple`` (STDiT3: the frames and the
    spatial tokens each, ``stdit`` module doc).
    """
    model = get_model(model)
    padded_length_check = layers.padded_length(1, pad_multiple)  # validates pad_multiple
    del padded_length_check

    def step(params, latents, timestep, text, text_uncond, guidance):
        b = latents.shape[0]
        x2 = jnp.concatenate([latents, latents], axis=0)
        t2 = jnp.concatenate([timestep, timestep], axis=0)
        txt2 = jax.tree.map(lambda c, u: jnp.concatenate([c, u], axis=0), text, text_uncond)
        pred = forward(model, params, x2, t2, txt2, pad_multiple)
        cond, uncond = pred[:b].astype(jnp.float32), pred[b:].astype(jnp.float32)
        return (uncond + guidance * (cond - uncond)).astype(latents.dtype)

    return step


def abstract_params(model: "str | Model", dtype=jnp.bfloat16):
    return layers.abstract(get_model(model).param_specs, dtype)


def abstract_inputs(model: "str | Model", workload: "str | W.Workload", dtype=jnp.bfloat16):
    """The step's arguments as ShapeDtypeStructs: (params, latents, timestep, text, text_uncond,
    guidance); params / latents / text in ``dtype`` (bf16), timestep and guidance f32."""
    model = get_model(model)
    wl = model.workload(workload) if isinstance(workload, str) else workload
    b = wl.batch
    sds = jax.ShapeDtypeStruct
    text = {k: sds(s, dtype) for k, s in model.text_shapes(b).items()}
    return (abstract_params(model, dtype), sds(wl.latent_shape(model.config.in_channels), dtype),
            sds((b,), jnp.float32), text, dict(text), sds((), jnp.float32))


def init_params(model: "str | Model", key, dtype=jnp.float32):
    """Real random parameters (use for the small configs; full sizes would allocate GBs)."""
    return layers.init(get_model(model).param_specs, key, dtype)


def random_inputs(model: "str | Model", workload: "str | W.Workload", key, dtype=jnp.float32):
    """Real random (latents, timestep, text, text_uncond, guidance) for ``workload``."""
    model = get_model(model)
    wl = model.workload(workload) if isinstance(workload, str) else workload
    k = jax.random.split(key, 8)
    b = wl.batch
    latents = jax.random.normal(k[0], wl.latent_shape(model.config.in_channels), dtype)
    timestep = jnp.full((b,), 500.0, jnp.float32)
    shapes = model.text_shapes(b)
    text = {n: jax.random.normal(k[1 + i], s, dtype) for i, (n, s) in enumerate(sorted(shapes.items()))}
    uncond = {n: jax.random.normal(k[4 + i], s, dtype) for i, (n, s) in enumerate(sorted(shapes.items()))}
    return latents, timestep, text, uncond, jnp.float32(5.0)


def models_table(include_small: bool = False) -> list[dict]:
    """For ``aoizora models --json``: name, params (count), nominal size, per workload tokens.
    The small test configurations are listed only with ``include_small``."""
    out = []
    for m in MODELS.values():
        if m.name not in FULL_SIZE and not include_small:
            continue
        out.append({"name": m.name, "family": m.family, "params": m.params,
                    "nominal_params": m.nominal_params,
                    "workloads": [{"name": w.name, "resolution": w.resolution, "frames": w.frames,
                                   "width": w.width, "height": w.height,
                                   "latent": [w.latent_frames, w.latent_height, w.latent_width],
                                   "tokens": w.tokens} for w in m.workloads]})
    return out
