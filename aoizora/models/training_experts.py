"""Expert TRAINING configurations for Wan 2.1 (``models.training``), each as its authors publish
it: a Layout of the train step ``step(state, batch)`` plus the ``TrainConfig`` (remat) it runs
with. The baselines a training plan is compared with on v5p. n = chips of the target, B = the
global batch (videos per step).

- ``maxdiffusion`` (AI-Hypercomputer/maxdiffusion, Wan 2.1 training: README "Training on a Single
  VM", ``train_wan.py src/maxdiffusion/configs/base_wan_14b.yml ... remat_policy=
  'HIDDEN_STATE_WITH_OFFLOAD' per_device_batch_size=0.25 ici_data_parallelism=1
  ici_fsdp_parallelism=4 ici_tensor_parallelism=1`` on v5p-8 = 4 chips; config at commit 9716fc59
  "host offloading (#273)"): mesh ``fsdp = n`` (the yml's ``ici_fsdp_parallelism:
  -1``; data and tensor 1). ``logical_axis_rules``: activation_length -> fsdp (the token sequence
  split n ways), embed -> fsdp (every weight split on its model-width dim; AdamW's moments follow
  their weights: ZeRO-3), heads / mlp -> tensor (size 1: unsplit); ``activation_kv_length`` has no
  rule, so splash's keys/values are whole on every chip (gathered). ``remat_policy
  HIDDEN_STATE_WITH_OFFLOAD`` = ``save_and_offload_only_these_names(saved=[], offloaded=
  ["hidden_states", "self_attn", "cross_attn"], device -> pinned_host)``: here the self- and
  cross-attention outputs are offloaded (``attn_out``, ``cross_out``), everything else in the
  block recomputed; the block input ("hidden_states") is the scan's carry, which the scan keeps
  on device (maxdiffusion offloads it too: a difference of 2 x B x S x dim bytes per layer).
  ``flash_block_sizes`` of that commit (block_q 1024, block_kv 1024, block_kv_compute 256; the
  backward's dkv 1024 / 1024 / 256 and dq 1024 / 1024, unfused) as its splash wrapper runs them:
  each block at most the per-shard length (rounded up to 128), queries and keys padded to the
  blocks' multiples (``attention_flax._pad_data_for_flash``). ``LIBTPU_INIT_ARGS`` of the README (``MAXDIFFUSION_TRAIN_OPTIONS``: those
  libtpu 0.0.42.1 accepts as compile options, the 64 MiB scoped VMEM limit among them).
- ``fsdp_ulysses`` (FSDP / ZeRO-3 with Ulysses sequence parallelism: modelscope/DiffSynth-Studio
  ``examples/wanvideo/model_training/full/accelerate_config_zero3.yaml`` (DeepSpeed ZeRO stage 3,
  8 processes, bf16, no offload) with its USP config ``accelerate_config_zero2_usp.yaml``, and
  the Wan 2.1 repo's ``--dit_fsdp --ulysses_size n``): mesh ``sp = n``; every weight and both
  AdamW moments sharded over sp on their largest dim that n divides (ZeRO-3 / FSDP, all-gathered
  at use); tokens split over sp; self-attention Ulysses (heads over sp, all-to-all in and out);
  cross-attention queries split like the tokens. When the heads do not divide n, the Ulysses
  degree u is the largest divisor of n and the heads, and the other n / u ranks are data parallel
  (DeepSpeed: world = data x sequence parallel), mesh ``dp = n / u x sp = u``, the batch over dp
  (B must divide by it) and ZeRO-3 over all n; USP's ring is not used (the ring's splash
  backward is not differentiable here: "Higher-order AD not supported"). DiffSynth's ``use_gradient_checkpointing=True`` (its train.py default):
  every block recomputed in the backward (``remat="full"``). libtpu defaults, automatic tiles.
- ``dp_fsdp`` (data x FSDP: maxdiffusion's multi-host Wan training example,
  ``ici_data_parallelism=32 ici_fsdp_parallelism=4``): mesh ``data = n / f x fsdp = f`` with the
  published f = 4 where n >= 8 (f = n / 2 on fewer chips, so that there is a data axis); the batch
  split over data (B must divide by it), the sequence and the weights' width over fsdp as in
  ``maxdiffusion``, whose remat, tiles and options it keeps.
- ``fsdp_tp`` (FSDP x tensor parallel: maxdiffusion's ``ici_tensor_parallelism`` with its rules
  heads -> tensor, mlp -> tensor, embed -> fsdp, activation_length -> fsdp): mesh ``fsdp = n / t x
  tensor = t``, t the largest divisor of n at most n / 2 that divides the heads and the MLP
  width; q/k/v/fc1 split on their output dim and o/fc2 on their input dim over tensor (Megatron),
  every weight's width dim over fsdp; attention heads over tensor and queries over fsdp
  (keys/values gathered). maxdiffusion's remat, tiles and options.

A configuration is rejected (``TrainingExpert.reason``) when its mesh does not exist for n and the
model, when the batch does not divide its data axis, or when the training state alone (fp32
params and AdamW moments under the configuration's specs) exceeds the chip's HBM.

Padding: the video sequence is padded to 128 x (sequence degree) (16 for the small test models
whose sequence is shorter than that), as ``models.experts`` pads (``TrainConfig.pad_multiple``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.extract.targets import Target
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.models import registry, training
from aoizora.models import experts as E
from aoizora.kernels.attention_kernels import SPLASH_BLOCK
from aoizora.kernels.primitives import ATTENTION_BWD, ATTENTIONS, FORWARD_ATTENTIONS

TRAINING_EXPERTS = ("maxdiffusion", "fsdp_ulysses", "dp_fsdp", "fsdp_tp")
MAXDIFFUSION_STYLE = ("maxdiffusion", "dp_fsdp", "fsdp_tp")

SOURCES = {
    "maxdiffusion": "AI-Hypercomputer/maxdiffusion README (Wan 2.1 training, v5p-8) + "
                    "src/maxdiffusion/configs/base_wan_14b.yml @9716fc59",
    "fsdp_ulysses": "modelscope/DiffSynth-Studio examples/wanvideo/model_training/full/"
                    "accelerate_config_zero3.yaml + accelerate_config_zero2_usp.yaml; Wan2.1 "
                    "--dit_fsdp --ulysses_size",
    "dp_fsdp": "AI-Hypercomputer/maxdiffusion README (Wan 2.1 multi-host training: "
               "ici_data_parallelism=32 ici_fsdp_parallelism=4)",
    "fsdp_tp": "AI-Hypercomputer/maxdiffusion base_wan_14b.yml logical_axis_rules (heads, mlp -> "
               "tensor; embed, activation_length -> fsdp) with ici_tensor_parallelism > 1",
}

# maxdiffusion's HIDDEN_STATE_WITH_OFFLOAD in the names of ``wan.ACTIVATION_NAMES``
MAXDIFFUSION_REMAT = {"attn_out": "offload", "cross_out": "offload"}
# DiffSynth-Studio: use_gradient_checkpointing=True (each block recomputed)
DIFFSYNTH_REMAT = "full"
# flash_block_sizes of base_wan_14b.yml at 9716fc59: the forward's and the backward's (no
# use_fused_bwd_kernel key: maxdiffusion's default, unfused)
MAXDIFFUSION_TRAIN_TILES = {"block_q": 1024, "block_kv": 1024, "block_kv_compute": 256}
MAXDIFFUSION_TRAIN_BACKWARD = {"block_q_dkv": 1024, "block_kv_dkv": 1024,
                               "block_kv_dkv_compute": 256, "block_q_dq": 1024,
                               "block_kv_dq": 1024}
# The README's LIBTPU_INIT_ARGS for Wan training (v5p), as compile options.
MAXDIFFUSION_TRAIN_OPTIONS: dict[str, Any] = {
    "xla_tpu_enable_async_collective_fusion_fuse_all_gather": True,
    "xla_tpu_megacore_fusion_allow_ags": False,
    "xla_enable_async_collective_permute": True,
    "xla_tpu_enable_ag_backward_pipelining": True,
    "xla_tpu_enable_data_parallel_all_reduce_opt": True,
    "xla_tpu_data_parallel_opt_different_sized_ops": True,
    "xla_tpu_enable_async_collective_fusion": True,
    "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
    "xla_tpu_overlap_compute_collective_tc": True,
    "xla_enable_async_all_gather": True,
    "xla_tpu_scoped_vmem_limit_kib": 65536,
    "xla_tpu_enable_async_all_to_all": True,
    "xla_tpu_enable_all_experimental_scheduler_features": True,
    "xla_tpu_enable_scheduler_memory_pressure_tracking": True,
    "xla_tpu_host_transfer_overlap_limit": 24,
    "xla_tpu_aggressive_opt_barrier_removal": "ENABLED",
    "xla_lhs_prioritize_async_depth_over_stall": "ENABLED",
    "xla_should_allow_loop_variant_parameter_in_chain": "ENABLED",
    "xla_should_add_loop_invariant_op_in_chain": "ENABLED",
    "xla_max_concurrent_host_send_recv": 100,
    "xla_tpu_scheduler_percent_shared_memory_limit": 100,
    "xla_latency_hiding_scheduler_rerun": 2,
    "xla_tpu_use_minor_sharding_for_major_trivial_input": True,
    "xla_tpu_relayout_group_size_threshold_for_reduce_scatter": 1,
    "xla_tpu_assign_all_reduce_scatter_layout": True,
}
# options of that list libtpu 0.0.42.1 refuses as compile options, left out: none (all 25 are
# accepted together compiling a small program for v5p-8; benchmarks/results/lab_notes.md)
REFUSED_OPTIONS: tuple[str, ...] = ()


@dataclasses.dataclass
class TrainingExpert(E.Expert):
    """One expert training configuration (``models.experts.Expert``: unpacks as (name, layout,
    reason); fn, args: the train step and its abstract (state, batch) -- realize exactly this
    pair), with config: the TrainConfig it trains with (its remat); source: where the recipe is
    published."""

    config: Any = None
    source: str = ""

    @property
    def remat(self) -> Any:
        """The TrainConfig's remat: a policy name, or {activation name: choice} (JSON-ready)."""
        if self.config is None:
            return None
        r = getattr(self.config, "remat", "none")
        return dict(r) if isinstance(r, tuple) else r

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "source": self.source, "remat": self.remat,
                "optimizer_sharding": optimizer_sharding(self.args, self.layout)}


def train_config(remat: Any = "none", pad_multiple: int = 1) -> "training.TrainConfig":
    """A TrainConfig with ``remat`` when the training step has the knob (else without it)."""
    fields = {f.name for f in dataclasses.fields(training.TrainConfig)}
    kw: dict[str, Any] = {"pad_multiple": pad_multiple}
    if "remat" in fields:
        kw["remat"] = remat
    return training.TrainConfig(**kw)


def state_leaves(args) -> list[tuple[str, list[str], Any]]:
    """(part, param path keys, leaf) per flattened leaf of (state, batch): part "param" (the
    weights and their AdamW moments mu / nu: the keys are the weight's path in the params tree),
    "scalar" (step, count) or "data" (latents, context, key: keys = [name])."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(args)[0]:
        keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
        if keys[0] == "1":
            out.append(("data", keys[1:], leaf))
        elif "params" in keys[:2]:
            out.append(("param", keys[keys.index("params") + 1:], leaf))
        elif "mu" in keys or "nu" in keys:
            i = keys.index("mu") if "mu" in keys else keys.index("nu")
            out.append(("param", keys[i + 1:], leaf))
        else:
            out.append(("scalar", keys, leaf))
    return out


def state_bytes_per_chip(args, in_specs, mesh_axes: dict[str, int]) -> dict[str, float]:
    """Bytes per chip of the weights and of the AdamW moments (fp32) under ``in_specs``."""
    out = {"params": 0.0, "moments": 0.0}
    for (part, keys, leaf), spec, (path, _) in zip(state_leaves(args), in_specs,
                                                   jax.tree_util.tree_flatten_with_path(args)[0]):
        if part != "param":
            continue
        split = math.prod(mesh_axes[a] for e in (spec or ()) for a in
                          ((e,) if isinstance(e, str) else (e or ())))
        kind = "moments" if any(getattr(k, "name", None) in ("mu", "nu") for k in path) else "params"
        out[kind] += math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize / split
    return out


def optimizer_sharding(args, layout: Layout | None) -> str | None:
    """The AdamW moments' sharding in words: the fraction each chip holds."""
    if layout is None:
        return None
    n = math.prod(layout.mesh_axes.values())
    per = state_bytes_per_chip(args, layout.in_specs, layout.mesh_axes)["moments"]
    full = state_bytes_per_chip(args, [None] * len(layout.in_specs), layout.mesh_axes)["moments"]
    frac = full / per if per else float("inf")
    if frac < 1.01:
        return "replicated"
    return f"sharded: 1/{frac:.1f} of the moments per chip ({n} chips)"


# ---------------------------------------------------------------------------------------------

def attention_roles_train(fn, args) -> dict[str, str]:
    """Attention node key -> "self" | "cross" for every forward and backward attention of a train
    step (a backward node takes the role of the forward of its shapes)."""
    roles = {k: r for k, (r, _, _) in E.attention_nodes(fn, args).items()}
    closed = jax.make_jaxpr(fn)(*args)
    shapes: dict[tuple, str] = {}
    bwd = []
    for w in walk(closed.jaxpr):
        name = w.eqn.primitive.name
        if name not in ATTENTIONS:
            continue
        sig = tuple(tuple(v.aval.shape) for v in w.eqn.invars[:2])
        if name in FORWARD_ATTENTIONS:
            shapes[sig] = roles[w.key]
        else:
            bwd.append((w.key, sig))
    for key, sig in bwd:
        roles[key] = shapes.get(sig) or ("self" if sig[0][2] == sig[1][2] else "cross")
    return roles


def _mesh_of(name: str, model, n: int, batch: int):
    """(mesh axes, batch axes, sequence axes, tensor axis or None, description) or (None, reason)."""
    c = model.config
    if name == "maxdiffusion":
        return ({"fsdp": n}, (), ("fsdp",), None, f"fsdp {n}: sequence and weight width over fsdp")
    if name == "fsdp_ulysses":
        if c.heads % n == 0:
            return ({"sp": n}, (), ("sp",), None, f"ZeRO-3 over sp {n}, sequence split, Ulysses")
        u = max(d for d in range(1, n + 1) if n % d == 0 and c.heads % d == 0)
        if u == 1 or batch % (n // u):
            return None, (f"{c.heads} heads do not divide {n} chips: Ulysses {u} leaves data "
                          f"parallel {n // u}, which global batch {batch} does not divide")
        return ({"dp": n // u, "sp": u}, ("dp",), ("sp",), None,
                f"ZeRO-3 over dp {n // u} x sp {u}, batch over dp, Ulysses over sp")
    if name == "dp_fsdp":
        f = 4 if n >= 8 else n // 2
        if f < 1 or n % f or n // f < 2:
            return None, f"no data axis: {n} chips leave none beside fsdp"
        d = n // f
        if batch % d:
            return None, (f"global batch {batch} does not divide data-parallel degree {d} "
                          f"(= {n} chips / fsdp {f})")
        return ({"data": d, "fsdp": f}, ("data",), ("fsdp",), None,
                f"data {d} x fsdp {f} (batch over data; sequence and weight width over fsdp)")
    if name == "fsdp_tp":
        ts = [t for t in range(n // 2, 1, -1)
              if n % t == 0 and c.heads % t == 0 and c.ffn_dim % t == 0]
        if not ts:
            return None, (f"no tensor-parallel degree in 2..{n // 2} divides {n} chips, "
                          f"{c.heads} heads and MLP width {c.ffn_dim}")
        t = ts[0]
        return ({"fsdp": n // t, "tensor": t}, (), ("fsdp",), "tensor",
                f"fsdp {n // t} x tensor {t} (heads and MLP over tensor)")
    raise ValueError(f"unknown training expert {name!r}; known: {list(TRAINING_EXPERTS)}")


def _merge(a, b):
    """Spec a with b's axes where a leaves a dim unsplit and b does not reuse a's axes."""
    used = {x for e in a for x in ((e,) if isinstance(e, str) else (e or ()))}
    return tuple(x if x is not None else (y if y not in used else None) for x, y in zip(a, b))


def _param_spec(name: str, keys, shape, mesh: dict[str, int], width: int):
    if name == "fsdp_ulysses":     # ZeRO-3 over every rank (dp and sp)
        axes = tuple(mesh)
        return E.fsdp_spec(keys, shape, axes, math.prod(mesh.values()))
    spec = E.embed_spec(keys, shape, "fsdp", mesh["fsdp"], width)
    if "tensor" in mesh:
        spec = _merge(E.tp_spec(keys, shape, "tensor", mesh["tensor"]), spec)
    return spec


def _in_specs(name, args, mesh, batch_axes, width) -> list:
    out = []
    for part, keys, leaf in state_leaves(args):
        if part == "param":
            out.append(_param_spec(name, keys, leaf.shape, mesh, width))
        elif part == "data" and keys[0] in ("latents", "context") and batch_axes:
            out.append((batch_axes if len(batch_axes) > 1 else batch_axes[0],)
                       + (None,) * (leaf.ndim - 1))
        else:
            out.append(None)
    return out


def _attention(name, mesh, batch_axes, seq_axes, tensor, heads: int):
    bat = tuple(batch_axes)
    hx = (tensor,) if tensor else ()
    if name == "fsdp_ulysses":
        main = AttentionLayout(batch=bat, heads=("sp",))
    else:
        main = AttentionLayout(batch=bat, heads=hx, seq=tuple(seq_axes))
    return {"self": main, "cross": AttentionLayout(batch=bat, heads=hx, seq=tuple(seq_axes))}


def _with_tiles(a: AttentionLayout, sq: int, skv: int, mesh: dict[str, int]) -> AttentionLayout:
    """maxdiffusion's training blocks as its splash wrapper runs them (``attention_flax.
    _tpu_flash_attention`` at 9716fc59): the published blocks, forward and backward, each at most
    the per-shard length rounded up to 128; the wrapper pads queries and keys to multiples of
    the blocks (``_pad_data_for_flash``; ours: ``padded_lengths``, ``sharded_attention_bwd``)."""
    n_s = math.prod(mesh[x] for x in a.seq)
    lq, lkv = -(-sq // (n_s * 128)) * 128, -(-skv // 128) * 128
    fwd = {"block_q": min(MAXDIFFUSION_TRAIN_TILES["block_q"], lq),
           "block_kv": min(MAXDIFFUSION_TRAIN_TILES["block_kv"], lkv)}
    fwd["block_kv_compute"] = min(MAXDIFFUSION_TRAIN_TILES["block_kv_compute"], fwd["block_kv"])
    cap = {"block_q_dkv": lq, "block_q_dq": lq, "block_kv_dkv": lkv, "block_kv_dq": lkv}
    bwd = {k: min(v, cap.get(k, v)) for k, v in MAXDIFFUSION_TRAIN_BACKWARD.items()}
    bwd["block_kv_dkv_compute"] = min(bwd["block_kv_dkv_compute"], bwd["block_kv_dkv"])
    return a.with_tiles(**fwd, **bwd, use_fused_bwd_kernel=False)


def _remat_of(name: str):
    return DIFFSYNTH_REMAT if name == "fsdp_ulysses" else MAXDIFFUSION_REMAT


def build(name: str, model, wl, n: int, batch: int, block: int = SPLASH_BLOCK,
          remat: Any = None) -> TrainingExpert:
    """One expert for ``model`` (registry Model) at workload ``wl`` with global ``batch`` on n chips;
    ``remat``: the TrainConfig remat instead of the recipe's (e.g. "none": the step as traced with
    every residual kept, on which the planner decides the remat)."""
    got = _mesh_of(name, model, n, batch)
    if got[0] is None:
        return TrainingExpert(name, None, got[1], source=SOURCES[name])
    mesh, batch_axes, seq_axes, tensor, how = got
    seq_deg = math.prod(mesh[a] for a in seq_axes)
    pad = block * seq_deg
    config = train_config(_remat_of(name) if remat is None else remat, pad)
    fn = training.train_step(model, config)
    args = training.abstract_train_inputs(model, wl, batch, config)
    per_role = _attention(name, mesh, batch_axes, seq_axes, tensor, model.config.heads)
    roles = attention_roles_train(fn, args)
    attention = {k: per_role[r] for k, r in roles.items()}
    options = {}
    if name in MAXDIFFUSION_STYLE:
        options = {k: v for k, v in MAXDIFFUSION_TRAIN_OPTIONS.items() if k not in REFUSED_OPTIONS}
        lens = node_lengths(fn, args)
        attention = {k: _with_tiles(a, *lens[k], mesh) for k, a in attention.items()}
    rules = {"seq": tuple(seq_axes)}
    if batch_axes:
        rules["batch"] = tuple(batch_axes)
    if tensor:
        rules.update(heads=(tensor,), mlp=(tensor,))
    in_specs = _in_specs(name, args, mesh, batch_axes, model.config.dim)
    n_state = len(jax.tree.leaves(args[0]))
    out_specs = [s if s is not None else (None,) * leaf.ndim
                 for s, leaf in zip(in_specs[:n_state], jax.tree.leaves(args[0]))] + [()]
    layout = Layout(mesh_axes=mesh, in_specs=in_specs, out_specs=out_specs, attention=attention,
                    rules=rules, name=f"train-expert:{name}", compiler_options=options)
    return TrainingExpert(name, layout, how, pad, fn, args, config=config, source=SOURCES[name])


def node_lengths(fn, args) -> dict[str, tuple[int, int]]:
    """Attention node key (forward and backward) -> (query length, key length)."""
    closed = jax.make_jaxpr(fn)(*args)
    return {w.key: (w.eqn.invars[0].aval.shape[2], w.eqn.invars[1].aval.shape[2])
            for w in walk(closed.jaxpr) if w.eqn.primitive.name in ATTENTIONS}


def train_workload(m, workload, batch: int):
    """The Workload (a name of the model's or of the training grid, or a Workload) with ``batch``."""
    if int(batch) != batch or batch < 1:
        raise training.TrainingError(f"global batch {batch}: give 1 or more videos")
    if isinstance(workload, str):
        known = {w.name: w for w in (*m.workloads, *training.TRAIN_WORKLOADS)}
        if workload not in known:
            raise training.TrainingError(f"{m.name} has no training workload {workload!r}; "
                                         f"known: {sorted(known)}")
        workload = known[workload]
    return dataclasses.replace(workload, batch=int(batch))


def training_expert_layouts(model, workload, target: Target, batch: int = 1,
                            remat: Any = None) -> list[TrainingExpert]:
    """Every expert training configuration for ``model`` (name or Model) at ``workload`` (name or
    Workload) with global ``batch`` on ``target``: valid ones with Layout, TrainConfig and train
    step; rejected ones with the reason. ``remat``: every expert's step traced with this remat
    instead of its recipe's (``build``)."""
    return [training_expert(name, model, workload, target, batch, remat)
            for name in TRAINING_EXPERTS]


def training_expert(name: str, model, workload, target, batch: int = 1,
                    remat: Any = None) -> TrainingExpert:
    """Expert ``name`` of ``TRAINING_EXPERTS`` alone (``training_expert_layouts``' arguments):
    valid with its Layout, TrainConfig and train step, or rejected with the reason."""
    m = registry.get_model(model)
    if m.family != "wan":
        raise training.TrainingError(f"the built-in training step is Wan 2.1's; {m.name} is "
                                     f"{m.family}")
    wl = train_workload(m, workload, batch)
    tgt = target
    n = tgt.num_devices
    hbm = tgt.chip.device_hbm_bytes
    block = SPLASH_BLOCK if wl.tokens >= SPLASH_BLOCK * n else 16
    ex = build(name, m, wl, n, batch, block, remat)
    if ex.valid:
        b = state_bytes_per_chip(ex.args, ex.layout.in_specs, ex.layout.mesh_axes)
        need = b["params"] + b["moments"]
        if need > hbm:
            ex.layout, ex.reason = None, (
                f"the training state (fp32 weights and AdamW moments) needs "
                f"{need / 2**30:.2f} GiB per chip under {ex.reason}, more than the "
                f"{hbm / 2**30:.2f} GiB of HBM")
    return ex
