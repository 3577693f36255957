"""The partitioner IR of a small DiT-like block: dim roles, the scan body once, attention, hints,
unknown primitives, JSON round-trip."""

import json
import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.program_ir import IRError, ProgramIR
from aoizora.kernels.primitives import attention, hint

B, S, D, H, F, L = 2, 16, 32, 4, 64, 3


def block(x, p):
    x = hint(x, "batch", "seq", "embed")
    h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    q = (h @ p["wq"]).reshape(B, S, H, D // H).transpose(0, 2, 1, 3)
    k = (h @ p["wk"]).reshape(B, S, H, D // H).transpose(0, 2, 1, 3)
    v = (h @ p["wv"]).reshape(B, S, H, D // H).transpose(0, 2, 1, 3)
    o = attention(q, k, v).transpose(0, 2, 1, 3).reshape(B, S, D)
    x = x + o @ p["wo"]
    y = jax.nn.gelu(x @ p["w1"], approximate=True) @ p["w2"]
    return x + y


def dit(params, x):
    def body(c, p):
        return block(c, p), None
    x, _ = jax.lax.scan(body, x, params["blocks"])
    return x @ params["head"]


def abstract():
    bf = jnp.bfloat16
    blocks = {n: jax.ShapeDtypeStruct((L, D, D), bf) for n in ("wq", "wk", "wv", "wo")}
    blocks["w1"] = jax.ShapeDtypeStruct((L, D, F), bf)
    blocks["w2"] = jax.ShapeDtypeStruct((L, F, D), bf)
    params = {"blocks": blocks, "head": jax.ShapeDtypeStruct((D, 8), bf)}
    return params, jax.ShapeDtypeStruct((B, S, D), bf)


@pytest.fixture(scope="module")
def ir():
    return build_ir(dit, *abstract())


def test_keys_are_the_shared_walks(ir):
    closed = jax.make_jaxpr(dit)(*abstract())
    assert [n.key for n in ir.nodes] == [w.key for w in walk(closed.jaxpr)
                                         if w.eqn.primitive.name != "aoizora_hint"]


def test_dot_roles(ir):
    dots = ir.by_kind("dot")
    assert len(dots) == 7  # q k v o w1 w2 in the body, head outside
    body = [d for d in dots if d.scope]
    assert len(body) == 6 and all(d.repeat == L for d in body)
    qproj = body[0]
    # [B,S,D] @ [D,D]: rows B and S, contracting D, columns D
    assert qproj.operand_labels[0] == ["m0", "m1", "k0"] and qproj.operand_labels[1] == ["k0", "n1"]
    assert qproj.result_labels[0] == ["m0", "m1", "n1"]
    assert qproj.roles == {"m0": "lhs_free", "m1": "lhs_free", "k0": "contracting", "n1": "rhs_free"}
    assert qproj.flops == 2 * B * S * D * D
    head = [d for d in dots if not d.scope][0]
    assert head.repeat == 1 and head.flops == 2 * B * S * D * 8


def test_attention_and_hint(ir):
    (att,) = ir.by_kind("attention")
    assert att.repeat == L and att.scope
    assert [ir.tensors[t].shape for t in att.operands] == [[B, H, S, D // H]] * 3
    assert att.roles == {"b": "batch", "h": "heads", "s": "q_seq", "t": "kv_seq", "d": "head_dim"}
    assert att.flops == 4 * B * H * S * S * (D // H)
    assert not ir.by_kind("hint"), "a hint is a name on a tensor, not a node"
    (carry,) = [t for t in ir.tensors.values() if t.kind == "scan_carry"]
    assert carry.names == ["batch", "seq", "embed"]   # the hint names the carry itself


def test_reshape_transpose_reduce_roles(ir):
    rs = [n for n in ir.by_kind("reshape") if ir.tensors[n.results[0]].shape == [B, S, H, D // H]][0]
    assert rs.groups == [{"in": [0], "out": [0]}, {"in": [1], "out": [1]}, {"in": [2], "out": [2, 3]}]
    assert rs.roles["i2"] == "split"
    merge = [n for n in ir.by_kind("reshape") if ir.tensors[n.results[0]].shape == [B, S, D]][0]
    assert merge.groups[-1] == {"in": [2, 3], "out": [2]} and merge.roles["i2"] == "merged"
    tr = ir.by_kind("transpose")[0]
    assert tr.params["permutation"] == [0, 2, 1, 3]
    assert tr.result_labels[0] == [tr.operand_labels[0][i] for i in (0, 2, 1, 3)]
    red = [n for n in ir.by_kind("reduce") if n.scope][0]
    assert red.roles["e2"] == "reduced" and red.result_labels[0] == ["e0", "e1"]


def test_scan_tensors(ir):
    T = ir.tensors
    carries = [t for t in T.values() if t.kind == "scan_carry"]
    xs = [t for t in T.values() if t.kind == "scan_xs"]
    assert len(carries) == 1 and carries[0].shape == [B, S, D] and carries[0].trip == L
    assert T[carries[0].outer].kind == "input" and T[carries[0].loop_back].kind == "node"
    assert len(xs) == 6
    for t in xs:   # the body sees one layer's weight
        assert T[t.outer].shape == [L] + t.shape
    paths = sorted(T[t].path for t in ir.inputs)
    assert "params/blocks/wq" in paths and "x" in paths and "params/head" in paths
    # edges pass through the scan: the head's dot reads the body's last residual add
    head = [d for d in ir.by_kind("dot") if not d.scope][0]
    src = ir.source_node(head.operands[0])
    assert src is not None and ir.node(src).scope


def test_json_round_trip(ir):
    s = ir.dumps()
    back = ProgramIR.loads(s)
    assert back.to_json() == ir.to_json()
    assert json.loads(s)["nodes"][0]["key"] == ir.nodes[0].key


def test_unknown_primitive_kept_replicated_with_one_warning():
    p = Primitive("mystery_op")
    p.def_impl(lambda x: x)
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    mlir.register_lowering(p, mlir.lower_fun(lambda x: x, multiple_results=False))

    def f(x):
        y = p.bind(x) * 2
        return p.bind(y).sum()

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ir = build_ir(f, jax.ShapeDtypeStruct((4, 8), jnp.float32))
    msgs = [str(x.message) for x in w if "does not understand" in str(x.message)]
    assert len(msgs) == 1 and "mystery_op" in msgs[0]
    unk = ir.by_kind("unknown")
    assert len(unk) == 2 and len(ir.warnings) == 1
    assert all(not any(n.operand_labels) and not any(n.result_labels) and not n.roles for n in unk)
    assert len(ir.nodes) == 4  # nothing dropped


def test_trace_failure_is_a_clear_error():
    with pytest.raises(IRError, match="could not trace"):
        build_ir(lambda x: x @ x, jax.ShapeDtypeStruct((3, 4), jnp.float32))


def test_opaque_shard_map_counts_its_flops():
    from jax.sharding import AxisType, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4], axis_types=(AxisType.Auto,))

    def f(a, b):
        return jax.shard_map(lambda a, b: jnp.tanh(a @ b), mesh=mesh, in_specs=(P("x"), P()),
                             out_specs=P("x"))(a, b)

    ir = build_ir(f, jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((4, 4), jnp.float32))
    (n,) = ir.nodes
    assert n.kind == "opaque" and n.primitive == "shard_map"
    assert n.flops == 4 * (2 * 2 * 4 * 4 + 2 * 4)   # per shard: dot + tanh, times 4 shards
    assert not ir.warnings


def test_sources_are_module_paths_not_the_checkouts(ir):
    """An op's source names its file as an import would (from the outermost package), not by
    the planning machine's absolute path: plan files carry these words to other machines."""
    att = ir.by_kind("attention")[0]
    assert att.source.startswith("aoizora/kernels/primitives.py:"), att.source
    dot = ir.by_kind("dot")[0]
    assert dot.source.startswith("test_program_ir.py:") and "(block)" in dot.source, dot.source
    assert not any(n.source.startswith("/") for n in ir.nodes)
