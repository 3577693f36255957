"""ATen op names by what the torch frontend makes of them (``aten_ir``), without importing JAX
(the torch runtime's worker processes read ``SKIPPED`` and ``op_name`` too)."""

from __future__ import annotations

import torch

ELEMENTWISE = frozenset("""
add sub mul div rsub neg abs exp exp2 log log1p expm1 sqrt rsqrt pow sin cos tan tanh sigmoid silu
gelu relu erf reciprocal where masked_fill clamp clamp_min clamp_max maximum minimum eq ne lt le gt
ge logical_and logical_or logical_not bitwise_and sign floor ceil round square mish softplus
_to_copy to clone contiguous alias detach lift_fresh_copy dropout copy type_as fill
""".split())
RESHAPES = frozenset("view _unsafe_view reshape flatten unflatten unsqueeze squeeze".split())
SOURCES = frozenset("""empty_like zeros_like ones_like full_like rand_like randn_like arange zeros
ones full empty empty_strided scalar_tensor randn rand""".split())
REDUCES = frozenset("mean sum amax amin prod var".split())
SKIPPED = frozenset("_assert_tensor_metadata _assert_async _assert_scalar sym_constrain_range "
                    "sym_constrain_range_for_size".split())
FIRST_ONLY = frozenset({"type_as", "copy", "to", "_to_copy", "dropout", "fill"})


def op_name(target) -> str:
    """The ATen op's base name (``aten.linear.default`` -> ``linear``)."""
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__
    return getattr(target, "__name__", str(target))
