"""One walk over a traced program, shared by the IR builder and the realizer, so both name the
same op with the same key.

Key convention: the eqns of the top-level jaxpr are numbered 0, 1, ...; an eqn inside the
sub-jaxpr of eqn ``i`` gets ``"i.j"`` (recursively, ``"i.j.k"``). Sub-jaxprs of call-like
primitives (``jit``, ``closed_call``, ``remat2``/checkpoint, ``custom_jvp_call``, ``custom_vjp_call``)
are inlined: their eqns are visited with ``repeat`` unchanged. The body of a ``scan`` is visited
once with ``repeat`` multiplied by the scan's length, so one op of a scanned layer is one key.
``while`` bodies are visited once with repeat unchanged (trip count unknown at trace time).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

INLINE_PRIMITIVES = frozenset({"jit", "pjit", "closed_call", "core_call", "remat2", "checkpoint",
                               "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})
LOOP_PRIMITIVES = frozenset({"scan", "while"})


@dataclasses.dataclass
class WalkedEqn:
    key: str            # see module docstring
    eqn: Any            # the jax JaxprEqn (only inside extract/aoizora; never stored in the IR)
    repeat: int         # times it runs per call (product of enclosing scan lengths)
    scope: str          # the key of the innermost enclosing scan, "" at top level


def sub_jaxpr(eqn) -> Any | None:
    """The (open) jaxpr a call-like or loop eqn runs, or None."""
    p = eqn.params
    for name in ("jaxpr", "call_jaxpr", "fun_jaxpr", "body_jaxpr"):
        if name in p:
            j = p[name]
            return getattr(j, "jaxpr", j)
    return None


def walk(jaxpr, prefix: str = "", repeat: int = 1, scope: str = "") -> Iterator[WalkedEqn]:
    """Yield every leaf eqn (not the call/loop wrappers themselves) with its key and repeat."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for i, eqn in enumerate(jaxpr.eqns):
        key = f"{prefix}{i}"
        name = eqn.primitive.name
        if name in INLINE_PRIMITIVES and sub_jaxpr(eqn) is not None:
            yield from walk(sub_jaxpr(eqn), key + ".", repeat, scope)
        elif name == "scan":
            yield from walk(eqn.params["jaxpr"], key + ".", repeat * int(eqn.params["length"]), key)
        elif name == "while":
            yield from walk(eqn.params["body_jaxpr"], key + ".", repeat, key)
        else:
            yield WalkedEqn(key, eqn, repeat, scope)
