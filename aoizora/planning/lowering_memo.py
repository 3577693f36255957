"""Evidence found without lowering: each candidate's evidence key, kept under what decides its
lowered program.

The evidence cache keys a compile by its lowered program's StableHLO text
(``extract.aot_compile.evidence_key_parts``), so finding cached evidence costs realizing the
layout (a trace) and lowering it. That text is decided by what this module keys a record by:

  key(lowering) = SHA-256 of ("lowering", FORMAT, code, program, layout, jax configuration,
                  target, mesh axes, device order, platform, compiler options, donated
                  arguments, compiler identity)

- ``program``: ``program_identity``: the SHA-256 of the program as traced (the jaxpr's text, its
  constants, the input tree) and, under a layout's remat, of ``fn.with_remat(remat)`` as traced;
  traced once per program object (and remat) in a process;
- ``layout``: its JSON: every spec and rule, the attention layouts with their kernel tiles, the
  remat, the layout's compiler options;
- ``code``: a hash of the source that turns a layout into a lowered program (``LOWERING_CODE``:
  the realizer, the kernels, the models' remat, the jaxpr walk, ``aot_compile``, this module);
- ``jax configuration``: the flags that change how a traced program lowers (``JAX_CONFIG``);
- the rest: ``aot_compile.setting_key_parts`` (the evidence key's own, from the mesh built).

Its record (``EvidenceCache.get_record``) is ``{"evidence": <evidence key>}``, written after a
lowering (``aot_compile.keep_alias``). ``candidate_pricing.compile_layout`` looks
it up first (``aot_compile.evidence_by_alias``): on a hit the evidence is read without realizing
or lowering; on a miss, a corrupt record (reported in one line) or evidence gone, the layout is
lowered as without it. A changed input or changed code is another key: a miss, never a stale
hit. A program that does not trace has no identity: it is lowered (and its error raised) as
without this module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from typing import Any, Callable

import jax
import numpy as np

from aoizora.extract.aot_compile import setting_key_parts
from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.extract.frontends.jax.ir_builder import state_arguments
from aoizora.extract.targets import Target
from aoizora.formulation.layout import Layout
from aoizora.planning.solve_memo import source_fingerprint

FORMAT = 1          # the records' format; part of every key
LOWERING_CODE = ("extract", "formulation", "aoizora/runtime", "aoizora/kernels", "aoizora/models",
                 "aoizora/planning/candidate_pricing.py", "aoizora/planning/lowering_memo.py")
JAX_CONFIG = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
              "jax_threefry_partitionable", "jax_use_shardy_partitioner")
_KEPT = 64          # program identities kept in a process (then the oldest half is dropped)


@dataclasses.dataclass(frozen=True)
class ProgramIdentity:
    """A program's identity in a lowering's key (``digest``: module docstring) and the
    positional arguments it donates (its state fed back: ``ir_builder.state_arguments``)."""

    digest: str
    donate_argnums: tuple[int, ...]


_identities: dict[tuple[int, int, str], tuple[Any, Any, ProgramIdentity | None]] = {}
_lock = threading.Lock()


def program_identity(fn: Callable, args: Any, remat: "dict[str, str] | None" = None
                     ) -> ProgramIdentity | None:
    """``fn(*args)``'s identity under ``remat`` (a layout's), traced once per (``fn``, ``args``)
    object pair and remat in this process.

    Returns:
        None when it does not trace (or has a remat and no ``with_remat``): the caller lowers
        as without an identity, which raises the program's own error."""
    slot = (id(fn), id(args), json.dumps(remat, sort_keys=True))
    with _lock:
        got = _identities.get(slot)
    if got is not None and got[0] is fn and got[1] is args:
        return got[2]
    try:
        ident = _traced_identity(fn, args, remat)
    except Exception:       # noqa: BLE001 -- lowering raises the program's own error
        ident = None
    with _lock:
        if len(_identities) >= _KEPT:
            for old in list(_identities)[:_KEPT // 2]:
                del _identities[old]
        _identities[slot] = (fn, args, ident)
    return ident


def _traced_identity(fn: Callable, args: Any, remat: "dict[str, str] | None") -> ProgramIdentity:
    plain = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tuple(args))
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*plain)
    h = hashlib.sha256(str(jax.tree_util.tree_structure(plain)).encode())
    _hash_jaxpr(h, closed)
    if remat is not None:
        _hash_jaxpr(h, jax.make_jaxpr(fn.with_remat(remat))(*plain))
    return ProgramIdentity(h.hexdigest(), state_arguments(tuple(args), out_shape))


def _hash_jaxpr(h: Any, closed: Any) -> None:
    """Adds a closed jaxpr's text and its constants (values, shapes, dtypes) to ``h``."""
    h.update(str(closed).encode("utf-8"))
    for c in closed.consts:
        a = np.asarray(c)
        h.update(f"{a.shape}{a.dtype}".encode() + a.tobytes())


def lowering_key(cache: EvidenceCache, program: ProgramIdentity, layout: Layout, mesh: Any,
                 tgt: Target, compiler_options: "dict[str, Any] | None") -> str:
    """The record key of ``program`` lowered under ``layout`` on ``mesh`` for ``tgt`` with
    ``compiler_options`` (module docstring), in ``cache``'s key space (its reader's
    fingerprint included)."""
    return cache.key({
        "kind": "lowering", "format": FORMAT, "code": source_fingerprint(LOWERING_CODE),
        "program": program.digest, "layout": layout.to_json(),
        "jax_config": {name: str(getattr(jax.config, name, None)) for name in JAX_CONFIG},
        **setting_key_parts(mesh, tgt, compiler_options, program.donate_argnums)})
