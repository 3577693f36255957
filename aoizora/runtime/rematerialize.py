"""Apply a plan's rematerialization (``Layout.remat``) to a training step.

The planner decides remat on the program as traced with every residual kept (a step whose
``fn.remat == "none"``); the layout then says, per activation name, "keep" | "recompute" |
"offload" (``aoizora.formulation.remat``). A program is *retraceable* when it carries the
protocol the built-in step has (``aoizora.models.training.train_step``):

- ``fn.remat``: the policy it was traced with ("none" for a decision to be offered);
- ``fn.with_remat(mapping) -> fn'``: the same step with every block under
  ``jax.checkpoint(policy=save_and_offload_only_these_names(...))`` for the mapping.

A user's step may carry the same two attributes (its blocks tagged with
``jax.ad_checkpoint.checkpoint_name``); without them the planner counts the residuals of the
program as traced and decides nothing, and ``realize`` refuses a layout with a remat.

``apply_remat(fn, args, layout)`` -> (fn', layout'): fn' = ``fn.with_remat(layout.remat)``, and
the layout's node keys (``node_specs``, ``reshard_from``, ``attention``) moved to fn''s keys by aligning the two
programs' walks (the shared walk of ``extract.frontends.jax.jaxpr_walk``): eqns matched in order by primitive
and result shapes (``difflib``); the backward's recomputed ops match nothing and are left to the
partitioner, except recomputed attentions, which take the layout of the forward attention of the
same shapes. Keys with no match are dropped (listed in ``RematApplied.dropped``).
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Sequence

import jax

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.formulation.layout import Layout
from aoizora.kernels.primitives import ATTENTIONS


class RematError(ValueError):
    """A layout's remat cannot be applied to this program."""


def retraceable(fn: Callable) -> bool:
    """Whether the planner may decide remat for ``fn`` (module docstring)."""
    return callable(getattr(fn, "with_remat", None)) and getattr(fn, "remat", None) == "none"


def _signature(eqn) -> tuple:
    return (eqn.primitive.name,) + tuple((tuple(v.aval.shape), str(v.aval.dtype))
                                         for v in eqn.outvars if hasattr(v.aval, "shape"))


def key_map(closed_a, closed_b) -> dict[str, str]:
    """Walk key of program a -> walk key of program b, for the eqns matched in order."""
    wa, wb = list(walk(closed_a.jaxpr)), list(walk(closed_b.jaxpr))
    sa, sb = [_signature(w.eqn) for w in wa], [_signature(w.eqn) for w in wb]
    out = {}
    sm = difflib.SequenceMatcher(None, sa, sb, autojunk=False)
    for blk in sm.get_matching_blocks():
        for i in range(blk.size):
            out[wa[blk.a + i].key] = wb[blk.b + i].key
    # recomputed attentions: the layout of an attention of the same signature
    by_sig = {}
    for w in wa:
        if w.eqn.primitive.name in ATTENTIONS:
            by_sig.setdefault(_signature(w.eqn), w.key)
    taken = set(out.values())
    for w in wb:
        if w.eqn.primitive.name in ATTENTIONS and w.key not in taken:
            src = by_sig.get(_signature(w.eqn))
            if src is not None:
                out.setdefault(f"recomputed:{w.key}", src)
    return out


@dataclasses.dataclass
class RematApplied:
    fn: Callable
    layout: Layout
    dropped: list[str]     # node keys of the layout with no counterpart in fn'


def apply_remat(fn: Callable, args: Sequence[Any], layout: Layout) -> RematApplied:
    """fn' and the layout on fn''s keys (module docstring); ``layout.remat`` None: as is."""
    if layout.remat is None:
        return RematApplied(fn, layout, [])
    if not callable(getattr(fn, "with_remat", None)):
        raise RematError(f"layout {layout.name or ''} rematerializes ({layout.remat}) but the "
                         f"program has no with_remat(mapping): build it with "
                         f"aoizora.models.training.train_step or give fn.with_remat "
                         f"(aoizora.runtime.rematerialize)")
    new_fn = fn.with_remat(dict(layout.remat))
    km = key_map(jax.make_jaxpr(fn)(*args), jax.make_jaxpr(new_fn)(*args))
    node_specs = {km[k]: v for k, v in layout.node_specs.items() if k in km}
    reshard_from = {km[k]: v for k, v in layout.reshard_from.items() if k in km}
    attention = {km[k]: v for k, v in layout.attention.items() if k in km}
    if "*" in layout.attention:
        attention["*"] = layout.attention["*"]
    for k, src in km.items():
        if k.startswith("recomputed:") and src in layout.attention:
            attention[k.split(":", 1)[1]] = layout.attention[src]
    dropped = sorted({k for k in [*layout.node_specs, *layout.attention]
                      if k != "*" and k not in km})
    new_layout = dataclasses.replace(layout, node_specs=node_specs, attention=attention,
                                     reshard_from=reshard_from, remat=None)
    return RematApplied(new_fn, new_layout, dropped)
