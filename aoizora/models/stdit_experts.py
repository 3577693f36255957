"""The expert configurations for a spatial-temporal DiT (``models.stdit``, Open-Sora's STDiT3),
where each block attends over space within each frame and over time at each spatial position.

The sequence of today's video experts is frames x space (frame-major), so a sequence split over n
devices (n dividing the padded frames) is a split of the frames. Per configuration (n = devices):

- ``dsp`` (Dynamic Sequence Parallelism, Open-Sora / VideoSys, arXiv 2403.10266): mesh ``sp=n``;
  spatial blocks split the frames over sp, temporal blocks split the space over sp, the switch
  between them an all-to-all (the partitioner's, between the stages' differently split hints);
  each self-attention splits only its batch (frames x batch, resp. space x batch), so it runs
  locally; the cross-attention queries stay split like the tokens. Weights replicated.
- ``ulysses`` (xDiT / DeepSpeed-Ulysses; Open-Sora 1.2's own sequence parallelism): mesh
  ``sp=n``; tokens split on the frames in both stages; spatial and temporal self-attention split
  their heads over sp (all-to-all in and out); the cross-attention keeps its queries split in
  spatial blocks and splits its heads in temporal blocks (their queries are space-major there,
  as Open-Sora's sequence-parallel cross-attention does). Valid when the heads divide n.
- ``context`` (maxdiffusion's default): mesh ``context=n``; tokens split on the frames; every
  attention splits its own query sequence (space, frames, tokens) and gathers keys/values.
- ``fsdp_sp``: as ``ulysses`` with every weight fully sharded over sp (FSDP); ring attention
  when the heads do not divide n.

Rejected (one line each, in ``build``): ``cfg2_context``, ``cfg2_ulysses``, ``tp_cfg`` (they split
the CFG pair, which sits inside each attention's folded batch minor to the frames / the space, so
the split is not a contiguous split of that batch); ``usp`` (as for the other families: not needed
when the heads divide n; not defined for these alternating attentions otherwise).

Attention layouts are per attention node, by the role its q hint names (``stdit_roles``).

Cost note: padding is to a multiple of n only (frames and space), so a cross-attention whose
queries (frames x space) are split n ways has shards that are not whole splash query blocks; the
attention wrapper then pads the global query sequence (240p: 6,528 -> 7,168 on 8 chips) and the
partitioner shifts rows between neighbouring shards with collective-permutes, in every
configuration that splits those queries (DSP, and the others in spatial blocks). Padding the
space further so that every shard holds whole 128-query blocks (240p on 8 chips: 405 -> 448
spatial tokens) would instead add about 10% to every op.
"""

from __future__ import annotations

from typing import Callable

import jax

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.models import registry
from aoizora.kernels.primitives import FORWARD_ATTENTIONS, HINT

# the name on dim 2 of an attention's q hint (models.stdit) -> its role
ROLE_OF_NAME = {"space": "spatial", "frames": "temporal", "sseq": "cross_spatial",
                "tseq": "cross_temporal"}
CFG_SPLIT = ("cfg2_context", "cfg2_ulysses", "tp_cfg")


class STDiTExpertError(ValueError):
    """A program whose attention nodes are not the spatial-temporal DiT's."""


def stdit_roles(fn, args) -> dict[str, str]:
    """Attention node key -> "spatial" | "temporal" | "cross_spatial" | "cross_temporal", from the
    hint name on the sequence dim of each attention's q."""
    closed = jax.make_jaxpr(fn)(*args)
    producer: dict = {}
    roles: dict[str, str] = {}
    for w in walk(closed.jaxpr):
        for v in w.eqn.outvars:
            producer[v] = w.eqn
        if w.eqn.primitive.name not in FORWARD_ATTENTIONS:
            continue
        p = producer.get(w.eqn.invars[0])
        name = p.params["names"][2] if p is not None and p.primitive.name == HINT else None
        if name not in ROLE_OF_NAME:
            raise STDiTExpertError(f"attention {w.key}: q's sequence is named {name!r}, not one of "
                                   f"{sorted(ROLE_OF_NAME)} (is this a models.stdit program?)")
        roles[w.key] = ROLE_OF_NAME[name]
    return roles


def _attention(name: str, ax: str, heads_split: bool) -> dict[str, AttentionLayout]:
    """Per role: the attention layout of configuration ``name`` on mesh axis ``ax``."""
    a = (ax,)
    if name == "dsp":
        return {"spatial": AttentionLayout(batch=a), "temporal": AttentionLayout(batch=a),
                "cross_spatial": AttentionLayout(seq=a), "cross_temporal": AttentionLayout(seq=a)}
    if name == "context":
        return {r: AttentionLayout(seq=a) for r in ROLE_OF_NAME.values()}
    main = AttentionLayout(heads=a) if heads_split else AttentionLayout(seq=a, kv="ring")
    return {"spatial": main, "temporal": main, "cross_spatial": AttentionLayout(seq=a),
            "cross_temporal": AttentionLayout(heads=a) if heads_split else AttentionLayout(seq=a)}


def build(name: str, model, wl, n: int, dtype, unit: str, param_leaves: Callable,
          fsdp_spec: Callable):
    """(Layout | None, reason, pad_multiple, fn, args) of configuration ``name`` for an STDiT.
    ``param_leaves(args)`` -> [(path keys, leaf)]; ``fsdp_spec(keys, shape, axes, n)`` -> spec."""
    heads = model.config.heads
    if name in CFG_SPLIT:
        return None, ("splits the CFG pair, which the spatial / temporal attentions fold inside "
                      "their batch minor to the frames / the space: not a contiguous split of "
                      "it"), 1, None, None
    if name == "usp":
        why = (f"{heads} heads divide {n} {unit}: Ulysses over all of them (ulysses), no ring "
               f"needed" if heads % n == 0 else
               "xDiT's Ulysses x ring is not defined for alternating spatial / temporal attention")
        return None, why, 1, None, None
    if name == "ulysses" and heads % n:
        return None, f"{heads} heads do not divide {n} {unit} (Ulysses splits heads over all {unit})", 1, None, None
    if name not in ("dsp", "ulysses", "context", "fsdp_sp"):
        raise ValueError(f"unknown expert configuration {name!r} for a spatial-temporal DiT")
    ax = "context" if name == "context" else "sp"
    heads_split = heads % n == 0
    if name == "dsp":
        rules = {"frames": (ax,), "sframes": (ax,), "tspace": (ax,), "sbatch": (ax,), "tbatch": (ax,)}
        how = f"DSP over {n}: frames split in spatial blocks, space in temporal blocks (all-to-all between)"
    else:
        rules = {"frames": (ax,), "sframes": (ax,), "tframes": (ax,)}
        how = {"ulysses": "Ulysses (heads split in both attentions), frames split",
               "context": "context parallel (queries split along each attention's sequence, "
                          "keys/values gathered), frames split",
               "fsdp_sp": "FSDP weights, frames split, " + ("Ulysses" if heads_split else
                                                           f"ring over {n}")}[name]
    pad = n
    fn = registry.denoise_step(model, pad)
    args = registry.abstract_inputs(model, wl, dtype)
    per_role = _attention(name, ax, heads_split)
    attention = {k: per_role[r] for k, r in stdit_roles(fn, args).items()}
    in_specs = []
    for keys, leaf in param_leaves(args):
        if keys[0] == "0" and name == "fsdp_sp":
            in_specs.append(fsdp_spec(keys[1:], leaf.shape, ("sp",), n))
        else:
            in_specs.append(None)
    layout = Layout(mesh_axes={ax: n}, in_specs=in_specs, out_specs=None, attention=attention,
                    rules=rules, name=f"expert:{name}")
    return layout, how, pad, fn, args
