"""A ``hint`` only names dims: the same program with and without hints gives the same IR (but for
the names), the same ILP layouts and Q1, and -- compiled for a TPU slice -- the same collectives.
The program is a joint text+video DiT (``benchmarks/joint_dit.py``) whose concatenations and slices
along the hinted sequence dim once made hinted plans compile to different programs."""

import collections

import pytest

from aoizora.extract.network import default_device_order
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.solvers.sharding import solve_sharding

from benchmarks.joint_dit import make

MESHES = ({"x": 8}, {"x": 2, "y": 4}, {"x": 2, "y": 2, "z": 2})


@pytest.fixture(scope="module")
def irs():
    out = {}
    for hints in (True, False):
        fn, args = make(hints=hints)
        out[hints] = (fn, args, build_ir(fn, *args))
    return out


def _by_position(ir, layout):
    """The layout's node specs and attention layouts in program order (keys shift with hints)."""
    specs = [(n.primitive, layout.node_specs.get(n.key)) for n in ir.nodes]
    att = [layout.attention_for(n.key) for n in ir.by_kind("attention")]
    return specs, att, layout.in_specs, layout.out_specs


def test_ir_has_no_hint_nodes_and_keeps_names(irs):
    (_, _, hinted), (_, _, plain) = irs[True], irs[False]
    assert [n.primitive for n in hinted.nodes] == [n.primitive for n in plain.nodes]
    assert [(t.shape, t.kind) for t in hinted.tensors.values()] == \
        [(t.shape, t.kind) for t in plain.tensors.values()]
    named = [t.names for t in hinted.tensors.values() if t.names]
    assert ["batch", "seq", "mlp"] in named and ["batch", "seq", "embed"] in named
    assert not any(t.names for t in plain.tensors.values())


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(map(str, m.values())))
def test_same_ilp_layouts_and_q1(irs, mesh):
    tg = get_target("v5e-8")
    got = {}
    for hints, (_, _, ir) in irs.items():
        r = solve_sharding(ir, tg, mesh, time_limit_s=30, seed=0)
        assert r.certificate.status == "OPTIMAL"
        got[hints] = (_by_position(ir, r.layout), r.best.predicted["total_s"])
    assert got[True][0] == got[False][0]
    assert got[True][1] == pytest.approx(got[False][1], rel=1e-12)


@pytest.mark.tpu_compiler
def test_same_compiled_collectives(irs):
    from aoizora.planner import compile_layout

    tg = get_target("v5e-8")
    mesh = {"x": 2, "y": 4}
    seen = {}
    for hints, (fn, args, ir) in irs.items():
        r = solve_sharding(ir, tg, mesh, time_limit_s=30, seed=0)
        ev = compile_layout(fn, args, tg, r.layout, default_device_order(tg, mesh))
        seen[hints] = collections.Counter(
            (c.kind, c.bytes, c.count, tuple(map(tuple, c.replica_groups))) for c in ev.collectives)
        assert seen[hints], "the layout communicates: the comparison must not be vacuous"
    assert seen[True] == seen[False]
