"""Solve the sharding ILP on a few-block proxy of a torch model, lay the full model out alike.

A DiT repeats one block (Wan 2.1 1.3B: 30 ``blocks``). The JAX frontend sees that loop once (a
``lax.scan`` body); ``torch.export`` unrolls it, and the ILP's memory rows grow with the square
of the unrolled program (Wan 1.3B: 4,315 IR nodes, over 8 minutes to build one mesh's ILP). So
``plan_torch`` solves the ILP on a proxy: the same model with its repeated blocks cut to
``PROXY_BLOCKS`` (a shallow copy sharing every other module; ``block_proxy``), and
``map_layout`` carries the proxy's layout to the full program: block j takes the layout of the
proxy's block min(j, PROXY_BLOCKS - 1), every other op and input its own. The evidence, the
placement and Q2 then run on the full program.

Ops are matched by (module path with the block index replaced, IR kind, key suffix, ordinal
among such ops of the same module): the FX names (``linear_5``) differ between the two graphs,
the order of ops inside one module does not.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from aoizora.formulation.layout import Layout

PROXY_BLOCKS = 2


def repeated_blocks(model) -> tuple[str, int] | None:
    """(attribute name, length) of the model's longest ``ModuleList`` of blocks of one type, or
    None when it has none longer than ``PROXY_BLOCKS``."""
    import torch

    best = None
    for name, mod in model.named_children():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) > PROXY_BLOCKS and \
                len({type(b) for b in mod}) == 1:
            if best is None or len(mod) > best[1]:
                best = (name, len(mod))
    return best


def block_proxy(model):
    """A shallow copy of ``model`` with its repeated blocks cut to ``PROXY_BLOCKS`` (sharing
    the other modules), or None when it has no repeated blocks (module docstring)."""
    import torch

    found = repeated_blocks(model)
    if found is None:
        return None
    name, _ = found
    proxy = copy.copy(model)
    proxy._modules = dict(model._modules)
    proxy._modules[name] = torch.nn.ModuleList(list(getattr(model, name))[:PROXY_BLOCKS])
    return proxy


def _norm(path: str, blocks: str) -> str:
    def sub(m):
        return f"{blocks}.{min(int(m.group(1)), PROXY_BLOCKS - 1)}"
    return re.sub(rf"^{re.escape(blocks)}\.(\d+)", sub, path)


def _signatures(ir, blocks: str) -> dict[str, tuple]:
    """IR node key -> its signature (module docstring)."""
    seen: dict[tuple, int] = {}
    out = {}
    for n in ir.nodes:
        suffix = n.key.split(".", 1)[1] if "." in n.key else ""
        raw = (n.name_stack, n.kind, suffix)
        k = seen.get(raw, 0)
        seen[raw] = k + 1
        out[n.key] = (_norm(n.name_stack, blocks), n.kind, suffix, k)
    return out


def map_layout(proxy_ir, full_ir, layout: Layout, blocks: str) -> Layout:
    """The proxy's ``layout`` carried to the full program (module docstring).

    Raises:
        KeyError: an input or op of the full program has no counterpart in the proxy."""
    by_sig = {sig: key for key, sig in _signatures(proxy_ir, blocks).items()}
    to_proxy = {key: by_sig[sig] for key, sig in _signatures(full_ir, blocks).items()
                if sig in by_sig}
    proxy_in = {proxy_ir.tensors[t].path: s for t, s in zip(proxy_ir.inputs, layout.in_specs)}
    in_specs = [proxy_in[_norm(full_ir.tensors[t].path, blocks)] for t in full_ir.inputs]
    node_specs = {k: layout.node_specs[p] for k, p in to_proxy.items() if p in layout.node_specs}
    attention = {k: layout.attention[p] for k, p in to_proxy.items() if p in layout.attention}
    missing = [n.key for n in full_ir.nodes if n.kind in ("dot", "attention")
               and n.key not in node_specs and to_proxy.get(n.key) in layout.node_specs]
    if missing:
        raise KeyError(f"ops without a counterpart in the proxy: {missing[:3]}")
    return Layout(mesh_axes=dict(layout.mesh_axes), in_specs=in_specs,
                  out_specs=None, node_specs=node_specs, attention=attention,
                  name=layout.name, compiler_options=dict(layout.compiler_options))


def proxy_note(found: tuple[str, int] | None) -> str:
    if found is None:
        return "the sharding ILP ran on the whole program (no repeated blocks found)"
    return (f"the sharding ILP ran on a {PROXY_BLOCKS}-block proxy of the model ({found[0]}: "
            f"{found[1]} blocks); its Q1 is the proxy's; block j took proxy block "
            f"min(j, {PROXY_BLOCKS - 1})'s layout")


__all__: list[Any] = ["block_proxy", "map_layout", "repeated_blocks", "proxy_note",
                      "PROXY_BLOCKS"]
