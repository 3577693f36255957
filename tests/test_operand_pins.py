"""An ILP layout pins a dot's operand to the spec the dot's strategy requires when the ILP
reshards it on the edge, so the partitioner reshards where the ILP priced it
(``solvers.sharding_layout.operand_pins``)."""

import itertools

import jax
import jax.numpy as jnp

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.strategies import Hardware, build_strategies
from aoizora.solvers.sharding_layout import _layout_spec, operand_pins, tensor_spec, to_layout

sds = jax.ShapeDtypeStruct


def _mlp_ir():
    def f(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2     # tanh follows dot 1; dot 2 reads tanh's output only
    return build_ir(f, sds((256, 512), jnp.bfloat16), sds((512, 1024), jnp.bfloat16),
                    sds((1024, 512), jnp.bfloat16))


def test_a_resharded_operand_is_pinned_to_what_its_dot_requires():
    ir = _mlp_ir()
    tgt = get_target("v5e-4")
    g = build_strategies(ir, default_axis_costs(tgt, {"x": 4}), Hardware.from_chip(tgt.chip))
    d1, d2 = (n for n in ir.by_kind("dot"))
    g1, g2 = g.group_of_node[d1.key], g.group_of_node[d2.key]
    h = d2.operands[0]
    producer = ir.tensors[h].producer
    assert producer != d1.key                    # the tanh, a follower in dot 1's group
    seen = {True: 0, False: 0}
    base = {gid: 0 for gid in g.groups}
    for i, j in itertools.product(range(len(g.groups[g1].strategies)),
                                  range(len(g.groups[g2].strategies))):
        choice = {**base, g1: i, g2: j}
        need = g.groups[g2].strategies[j].req.get((d2.key, 0))
        if need is None:
            continue
        pins = operand_pins(ir, g, choice)
        resharded = tensor_spec(ir, g, choice, h) != _layout_spec(need)
        seen[resharded] += 1
        assert (producer in pins) == resharded
        if resharded:
            assert pins[producer] == _layout_spec(need)
            assert to_layout(ir, g, choice).node_specs[producer] == _layout_spec(need)
        # a dot's own output is never overridden by a pin
        assert d1.key not in pins or to_layout(ir, g, choice).node_specs[d1.key] == \
            tensor_spec(ir, g, choice, d1.results[0])
    assert seen[True] and seen[False]            # both cases were exercised
