"""The rules that read a softmax between two dots: a symbolic walk over a candidate region of
:mod:`aoizora.extract.frontends.jax.attention_patterns`, value by value, that keeps the scale, the mask and the
key dims, or raises ``NoMatch`` naming the op that breaks the chain (the rules are listed in that
module's docstring). Each value of the region gets a ``Form``: logits (``L``), their row maximum
(``M``), ``exp`` of the logits (``E``), its row sum (``S``) and reciprocal (``R``), probabilities
(``P``); ``Form.perm`` maps the value's dims to the logits' dims (None: a unit or broadcast dim).
"""

from __future__ import annotations

import dataclasses
import math

from aoizora.extract.frontends.jax.inlined_flow import PASS_PRIMS, Eq, Flow, is_literal, shape_of, unit_map

MASK_FILL_MAX = -1e4   # a mask's fill value must be at most this (exp underflows to 0 in f32)


class NoMatch(Exception):
    """A candidate region that breaks a rule at eqn ``key`` (primitive ``prim``): ``why``."""

    def __init__(self, key: str, prim: str, why: str):
        super().__init__(why)
        self.key, self.prim, self.why = key, prim, why




@dataclasses.dataclass
class Form:
    kind: str            # L (logits) | M (max) | E (exp) | S (sum) | R (1/sum) | P (probabilities)
    perm: list           # value dim -> logits dim, or None (a unit or broadcast dim)
    shifted: bool = False


class SoftmaxChain:
    def __init__(self, flow: Flow, qk: Eq, region: list[int]):
        self.flow, self.qk, self.region = flow, qk, region
        n = len(shape_of(qk.outs[0]))
        (lc, rc), (lb, rb) = qk.eqn.params["dimension_numbers"]
        nb = len(lb)
        nl = len(shape_of(qk.ins[0])) - len(lc) - len(lb)
        self.batch = list(range(nb))
        self.lfree = list(range(nb, nb + nl))
        self.rfree = list(range(nb + nl, n))
        self.lshape = shape_of(qk.outs[0])
        self.kdims: list[int] | None = None       # logits dims the softmax reduces
        self.scale = 1.0
        self.mask: tuple[int, int, bool, list] | None = None   # (eqn idx, operand, negated, perm)
        self.forms: dict = {qk.outs[0]: Form("L", list(range(n)))}

    def fail(self, e: Eq, why: str):
        raise NoMatch(e.key, e.eqn.primitive.name, why)

    def nonunit(self, dims) -> set[int]:
        return {d for d in dims if self.lshape[d] != 1}

    def set_k(self, e: Eq, reduced: set[int]):
        nu = self.nonunit(reduced)
        for side in (self.rfree, self.lfree):
            if nu and nu == self.nonunit(side) and reduced <= set(side) | {d for d in reduced if self.lshape[d] == 1}:
                if self.kdims is None:
                    self.kdims = list(side)
                elif self.kdims != list(side):
                    self.fail(e, "two softmax reductions over different dims")
                return
        self.fail(e, f"reduces logits dims {sorted(reduced)}, not one side's free dims (the keys)")

    def reduced_perm(self, e: Eq, f: Form) -> list:
        axes = [int(a) for a in e.eqn.params["axes"]]
        red = {f.perm[a] for a in axes if f.perm[a] is not None}
        self.set_k(e, red)
        return [d for i, d in enumerate(f.perm) if i not in axes]

    def aligned(self, big: Form, small: Form) -> bool:
        """small (a max / sum broadcast back) lines up with big on every dim but the key dims."""
        if len(big.perm) != len(small.perm) or self.kdims is None:
            return False
        for bd, sd in zip(big.perm, small.perm):
            if sd is None:
                if bd is not None and bd not in self.kdims and self.lshape[bd] != 1:
                    return False
            elif sd != bd:
                return False
        return True

    def run(self) -> Form:
        last = None
        for idx in self.region:
            e = self.flow.scope.eqns[idx]
            f = self.step(e)
            self.forms[e.outs[0]] = f
            last = f
        return last

    def side(self, v):
        return self.forms.get(v) if not is_literal(v) else None

    def step(self, e: Eq) -> Form:
        name, p = e.eqn.primitive.name, e.eqn.params
        ins = [self.side(v) for v in e.ins]
        forms = [f for f in ins if f is not None]
        if len(e.outs) != 1 or not forms:
            self.fail(e, "an op inside the softmax with several results or none of its values")
        if name in PASS_PRIMS or name == "stop_gradient":
            return _copy(forms[0])
        if name == "transpose":
            return Form(forms[0].kind, [forms[0].perm[s] for s in p["permutation"]], forms[0].shifted)
        if name in ("reshape", "squeeze", "expand_dims", "broadcast_in_dim"):
            return self.reshape_like(e, forms[0])
        if name == "reduce_max" and forms[0].kind == "L":
            return Form("M", self.reduced_perm(e, forms[0]))
        if name == "reduce_sum" and forms[0].kind == "E":
            return Form("S", self.reduced_perm(e, forms[0]))
        if name == "max" and forms[0].kind == "M" and len(forms) == 1:
            c = self.flow.static(e.ins[1] if ins[0] is not None else e.ins[0])
            if c is None or c != -math.inf:
                self.fail(e, "max of the row maximum with something other than -inf")
            return _copy(forms[0])
        if name == "exp" and forms[0].kind == "L":
            return Form("E", list(forms[0].perm))
        if name in ("mul", "div") and len(forms) == 1:
            return self.scaled(e, name, ins, forms[0])
        if name == "div" and [f.kind for f in ins] == ["E", "S"]:
            if not self.aligned(ins[0], ins[1]):
                self.fail(e, "the softmax normaliser is not the sum over the key dims")
            return Form("P", list(ins[0].perm))
        if name == "mul" and sorted(f.kind for f in forms) == ["E", "R"]:
            fe = next(f for f in forms if f.kind == "E")
            fr = next(f for f in forms if f.kind == "R")
            if not self.aligned(fe, fr):
                self.fail(e, "the softmax normaliser is not the sum over the key dims")
            return Form("P", list(fe.perm))
        if name == "sub" and ins[0] is not None and ins[0].kind == "L" and ins[1] is not None \
                and ins[1].kind == "M":
            if not self.aligned(ins[0], ins[1]):
                self.fail(e, "subtracts a maximum that is not over the key dims")
            return Form("L", list(ins[0].perm), True)
        if name in ("add", "sub") and len(forms) == 1 and forms[0].kind == "L":
            other = e.ins[1] if ins[0] is not None else e.ins[0]
            if self.flow.static(other) is None:
                self.fail(e, "adds a bias to the logits (the splash kernel takes no bias)")
            return _copy(forms[0])
        if name == "select_n" and len(forms) == 1 and forms[0].kind == "L":
            return self.masked(e, ins, forms[0])
        self.fail(e, f"{name} on {'/'.join(f.kind for f in forms)} is not a softmax step")

    def scaled(self, e, name, ins, f: Form) -> Form:
        if f.kind == "S" and name == "div" and ins[1] is f and self.flow.static(e.ins[0]) == 1.0:
            return Form("R", list(f.perm))
        if f.kind != "L" or f.shifted:
            self.fail(e, f"{name} of the {'shifted ' if f.shifted else ''}{f.kind} values by a constant")
        other = e.ins[1] if ins[0] is not None else e.ins[0]
        c = self.flow.static(other)
        if c is None:
            self.fail(e, f"{name} of the logits by a value not known at trace time")
        if name == "div" and ins[0] is None:
            self.fail(e, "divides a constant by the logits")
        self.scale *= (1.0 / c) if name == "div" else c
        return _copy(f)

    def masked(self, e, ins, f: Form) -> Form:
        if self.mask is not None:
            self.fail(e, "a second mask (combine masks before the attention)")
        if len(e.ins) != 3 or ins[0] is not None:
            self.fail(e, "select_n with the logits as predicate or more than two cases")
        which = 1 if ins[1] is None else 2
        fill = self.flow.static(e.ins[which])
        if fill is None or fill > MASK_FILL_MAX:
            self.fail(e, f"select_n of the logits with a fill that is not a large negative constant ({fill})")
        pred = e.ins[0]
        if len(shape_of(pred)) != len(f.perm):
            self.fail(e, "a mask that is not the logits' shape")
        self.mask = (e, 0, which == 2, list(f.perm))   # fill at case 1: pred True = masked
        return _copy(f)

    def reshape_like(self, e: Eq, f: Form) -> Form:
        src, dst = shape_of(e.ins[0]), shape_of(e.outs[0])
        if e.eqn.primitive.name == "broadcast_in_dim":
            bd = e.eqn.params["broadcast_dimensions"]
            perm = [None] * len(dst)
            for i, j in enumerate(bd):
                perm[j] = f.perm[i] if src[i] == dst[j] else None
            if f.kind in ("L", "E", "P") and any(perm[j] is None and dst[j] != 1 for j in range(len(dst))):
                self.fail(e, "broadcasts the logits along a new dim")
            return Form(f.kind, perm, f.shifted)
        m = unit_map(src, dst)
        if m is None:
            self.fail(e, "a reshape that regroups dims of the logits")
        perm = [None] * len(dst)
        for i, j in m.items():
            if j is not None:
                perm[j] = f.perm[i]
        return Form(f.kind, perm, f.shifted)


def _copy(f: Form) -> Form:
    return Form(f.kind, list(f.perm), f.shifted)


