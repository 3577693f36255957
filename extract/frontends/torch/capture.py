"""Capture a PyTorch module as an ATen graph, without weights.

``capture(model, args, kwargs)`` runs ``torch.export.export(model, args, kwargs, strict=False)``
and then ``run_decompositions({})``: an empty decomposition table functionalizes the graph (an
in-place write such as diffusers' RoPE ``out[..., 0::2] = ...`` becomes ``slice_scatter``) and
keeps every op it can, so ``aten.linear`` stays a linear and
``aten.scaled_dot_product_attention`` stays one node (q, k, v as [B, H, S, D]).

Build the model and its example inputs on the meta device (``with torch.device("meta"):``) and
nothing is allocated: Wan 2.1 1.3B at 480p, 81 frames captures in about 6 s on one CPU core.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import torch


class CaptureError(ValueError):
    """The module could not be exported (the message says what torch.export refused)."""


def capture(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any] | None = None):
    """The functional ATen ``ExportedProgram`` of ``model(*args, **kwargs)``.

    Raises:
        CaptureError: torch.export failed; the first line of its reason is kept."""
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"model is a {type(model).__name__}: pass a torch.nn.Module")
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    try:
        ep = torch.export.export(model, args, kwargs=dict(kwargs or {}), strict=False)
        return ep.run_decompositions({})
    except Exception as e:  # noqa: BLE001 -- any export failure is one line for the user
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CaptureError(f"torch.export could not capture the model: {first}") from e


def graph_digest(ep) -> str:
    """A digest of the captured graph and its input shapes, the same whether it was captured on
    meta tensors or with weights (device arguments are left out): a plan's fingerprint."""
    text = re.sub(r"device\(type='[a-z]+'(, index=\d+)?\)", "device", str(ep.graph))
    h = hashlib.sha256(text.encode())
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        v = by_name[spec.arg.name].meta.get("val")
        h.update(repr((spec.arg.name, tuple(getattr(v, "shape", ())), str(getattr(v, "dtype", ""))))
                 .encode())
    return h.hexdigest()[:32]


def input_shapes(ep) -> tuple[str, ...]:
    """``dtype[d0,d1,...]`` of every flattened tensor input (parameters, buffers, the user's)."""
    shapes = []
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        v = by_name[spec.arg.name].meta.get("val")
        if v is not None and hasattr(v, "shape"):
            shapes.append(f"{str(v.dtype).replace('torch.', '')}[{','.join(map(str, v.shape))}]")
    return tuple(shapes)
