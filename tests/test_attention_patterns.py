"""Attention written without AoiZora's marker -- jax.nn.dot_product_attention, einsum -> softmax ->
einsum, Flax -- is one attention node in the IR, runs in the node's layout when realized (8 CPU
devices: equal to the unsharded function), and compiles to the splash kernel for v5e-8; an
attention-like chain that is not recognised stays ordinary ops and is named in one warning."""

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from aoizora.extract.frontends.jax.attention_patterns import find_attention
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.kernels.attention_kernels import reference_attention, sharded_attention
from aoizora.models.experts import default_mesh
from aoizora.runtime.realize import realize

B, S, N, D = 2, 16, 4, 8
MESH = {"x": 2, "y": 4}


def _dpa(q, k, v, m):                        # [B, S, N, D] layout, mask [B, 1, 1, S]
    return jax.nn.dot_product_attention(q, k, v, mask=m[:, None, None, :])


def _dpa_nomask(q, k, v, m):
    return jax.nn.dot_product_attention(q, k, v)


def _einsum(q, k, v, m):                     # scale and key mask, softmax in f32
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
    s = jnp.where(m[:, None, None, :], s, -1e9)
    p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def _matmul_bhsd(q, k, v, m):                # [B, H, S, D] by transposes, hand-written softmax
    q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
    s = (q @ k.swapaxes(-1, -2)) * 0.5
    s = jnp.where(~m[:, None, None, :], -jnp.inf, s)
    e = jnp.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def _gqa(q, k, v, m):                        # two kv heads for four query heads
    return jax.nn.dot_product_attention(q, k[:, :, :2], v[:, :, :2], mask=m[:, None, None, :])


def _flax_linen(q, k, v, m):
    from flax import linen
    return linen.dot_product_attention(q, k, v, mask=m[:, None, None, :])


FORMS = {"dot_product_attention": (_dpa, True), "dot_product_attention_nomask": (_dpa_nomask, False),
         "einsum": (_einsum, True), "matmul_bhsd": (_matmul_bhsd, True), "gqa": (_gqa, True),
         "flax_linen": (_flax_linen, True)}


def _args(seed=0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(rng.normal(size=(B, S, N, D)), dtype) for _ in range(3))
    m = np.ones((B, S), bool)
    m[1, S - 5:] = False
    return q, k, v, jnp.asarray(m)


def _layout(al):
    return Layout(mesh_axes=dict(MESH), in_specs=[None] * 4, out_specs=None, node_specs={},
                  attention={"*": al})


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_is_one_attention_node_with_its_scale_and_mask(form):
    fn, masked = FORMS[form]
    ir = build_ir(fn, *_args())
    att = ir.by_kind("attention")
    assert len(att) == 1, f"{form}: {len(att)} attention nodes"
    n = att[0]
    assert not ir.by_kind("dot"), f"{form}: the q.k / p.v dots are still separate nodes"
    # grouped queries: the group dim joins the query sequence (rows attend independently)
    assert n.params["shape"] == ([B, 2, 2 * S, S, D] if form == "gqa" else [B, N, S, S, D])
    # flax.linen scales q before the q.k dot: outside the region, so the node's scale is 1
    want_scale = {"matmul_bhsd": 0.5, "flax_linen": 1.0}.get(form, 1 / math.sqrt(D))
    assert abs(n.params["scale"] - want_scale) < 1e-6
    assert n.params["mask"] == masked and len(n.operands) == 3 + masked
    if masked:   # read where the program has it: the [B, S] input, not its broadcast to the logits
        assert ir.tensors[n.operands[3]].kind == "input" and ir.tensors[n.operands[3]].shape == [B, S]
    assert all(math.prod(ir.tensors[r].shape) < B * N * S * S for nd in ir.nodes for r in nd.results)
    assert {n.roles[lab] for lab in ("b", "h", "s", "t", "d")} == \
        {"batch", "heads", "q_seq", "kv_seq", "head_dim"}
    assert any("guessed" in note and n.key in note for note in ir.notes)
    q_names = ir.tensors[n.operands[0]].names
    assert [q_names[n.operand_labels[0].index(lab)] for lab in "bhsd"] == \
        ["batch", "heads", "seq", "head_dim"]
    assert not ir.warnings


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("al", [AttentionLayout(batch=("x",), heads=("y",)),
                                AttentionLayout(heads=("x",), seq=("y",)),
                                AttentionLayout(batch=("x",), seq=("y",), kv="ring")],
                         ids=["batch_heads", "heads_seq", "ring"])
def test_realized_form_equals_the_unsharded_function_on_8_cpu_devices(form, al):
    fn, _ = FORMS[form]
    if form == "gqa" and al.heads:
        al = AttentionLayout(batch=al.batch, heads=("x",) if al.heads == ("x",) else (), seq=al.seq)
    args = _args()
    mesh = default_mesh(jax.devices()[:8], MESH)
    got = realize(fn, args, _layout(al), mesh).fn(*args)
    want = fn(*args)
    err = float(jnp.max(jnp.abs(got - want)))
    assert got.shape == want.shape and got.dtype == want.dtype
    assert err < 1e-5, f"{form} in {al.to_json()}: max abs error {err:.3g}"


def test_realized_bf16_attention_keeps_the_users_numerics():
    args = _args(dtype=jnp.bfloat16)
    mesh = default_mesh(jax.devices()[:8], MESH)
    got = realize(_dpa, args, _layout(AttentionLayout(batch=("x",), heads=("y",))), mesh).fn(*args)
    want = _dpa(*args)
    assert got.dtype == jnp.bfloat16
    assert float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32)))) < 2e-2


def _bias(q, k, v, m):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) + m[:, None, None, :].astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s), v)


def _causal(q, k, v, m):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def _escaping(q, k, v, m):
    p = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k))
    return jnp.einsum("bhqk,bkhd->bqhd", p, v), p


def _reused(q, k, v, m):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s), v) + s.mean()


@pytest.mark.parametrize("fn,op,why", [(_bias, "add", "bias"), (_causal, "select_n", "query"),
                                       (_escaping, "div", "result"),
                                       (_reused, "dot_general", "also used by reduce_sum")],
                         ids=["bias", "causal", "probabilities_returned", "logits_reused"])
def test_unrecognised_attention_like_chain_warns_once_naming_the_op(fn, op, why):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ir = build_ir(fn, *_args())
    lines = [str(w.message) for w in rec if "attention-like" in str(w.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert f"not recognised at {op} " in lines[0] and why in lines[0], lines[0]
    assert ir.warnings == lines
    assert not ir.by_kind("attention") and len(ir.by_kind("dot")) == 2


def test_two_blocks_sharing_one_traced_jaxpr_are_two_nodes():
    """jnp.where traces one inner jaxpr that both blocks call: each call site is its own region."""
    def two(q, k, v, m):
        return _einsum(_einsum(q, k, v, m), k, v, m)
    pats = find_attention(jax.make_jaxpr(two)(*_args()))
    assert len(pats.matches) == 2 and not pats.warnings
    assert not set(pats.skip) & set(pats.matches)


@pytest.mark.parametrize("al", [AttentionLayout(batch=("x",), heads=("y",)),
                                AttentionLayout(batch=("x",), seq=("y",), kv="ring")],
                         ids=["gather", "ring"])
def test_splash_interpret_takes_a_per_batch_key_mask(al):
    """The key mask as splash segment ids (interpret mode on CPU) equals the dense reference."""
    mesh = default_mesh(jax.devices()[:8], MESH)
    ks = jax.random.split(jax.random.PRNGKey(2), 3)
    q = jax.random.normal(ks[0], (2, 4, 64, 32))
    k, v = (jax.random.normal(kk, (2, 4, 60, 32)) for kk in ks[1:])
    mask = jnp.arange(60)[None, :] < jnp.array([[60], [37]])
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.2
    want = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.where(mask[:, None, None], s, -1e30)), v)
    for impl in ("splash", "reference"):
        got = jax.jit(lambda q, k, v, m: sharded_attention(
            q, k, v, layout=al, mesh=mesh, scale=0.2, impl=impl, interpret=True, kv_mask=m))(q, k, v, mask)
        err = float(jnp.max(jnp.abs(got - want)))
        assert err < 1e-5, f"{impl} with a key mask: max abs error {err:.3g}"
    assert float(jnp.max(jnp.abs(reference_attention(q, k, v, scale=0.2) - want))) > 1e-3


@pytest.mark.tpu_compiler
@pytest.mark.parametrize("form", ["dot_product_attention", "einsum"])
def test_found_attention_compiles_to_the_splash_kernel_for_v5e_8(form):
    fn, _ = FORMS[form]
    q, k, v, m = _args()
    sds = [jax.ShapeDtypeStruct((2, 256, 8, 64), jnp.bfloat16)] * 3 + [jax.ShapeDtypeStruct((2, 256), bool)]
    mesh = default_mesh("v5e-8", MESH)
    hlo = realize(fn, sds, _layout(AttentionLayout(batch=("x",), heads=("y",))), mesh).compile().as_text()
    assert "tpu_custom_call" in hlo, f"{form}: no splash kernel in the v5e-8 program"


def test_attention_in_a_scanned_layer_is_one_node_and_realizes_equal():
    def layers(ws, x, m):
        def layer(h, w):
            q, k, v = (jnp.einsum("bshd,de->bshe", h, w[i]) for i in range(3))
            return h + _einsum(q, k, v, m), None
        return jax.lax.scan(layer, x, ws)[0]
    q, _, _, m = _args()
    ws = jax.random.normal(jax.random.key(3), (2, 3, D, D)) / math.sqrt(D)
    ir = build_ir(layers, ws, q, m)
    (n,) = ir.by_kind("attention")
    assert n.scope and n.repeat == 2 and len(ir.by_kind("dot")) == 3
    mesh = default_mesh(jax.devices()[:8], MESH)
    lay = Layout(mesh_axes=dict(MESH), in_specs=[None] * 3, out_specs=None, node_specs={},
                 attention={n.key: AttentionLayout(batch=("x",), heads=("y",))})
    got = realize(layers, (ws, q, m), lay, mesh).fn(ws, q, m)
    assert float(jnp.max(jnp.abs(got - layers(ws, q, m)))) < 1e-5


def _direct_splash(mask_cls):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    def direct(q, k, v):
        kernel = sa.make_splash_mha(sa.MultiHeadMask([mask_cls((128, 128))] * 4),
                                    head_shards=1, q_seq_shards=1, interpret=True)
        return jax.vmap(kernel)(q * 0.125, k, v)
    return direct


def test_a_hand_called_full_mask_splash_kernel_is_an_attention_node_and_realizes_equal():
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    direct = _direct_splash(sa.FullMask)
    x = jax.ShapeDtypeStruct((2, 4, 128, 64), jnp.float32)
    ir = build_ir(direct, x, x, x)
    (n,) = ir.by_kind("attention")
    assert n.params["pattern"] == "splash kernel" and n.params["shape"] == [2, 4, 128, 128, 64]
    assert not ir.warnings and not ir.by_kind("opaque")
    q, k, v = (jax.random.normal(kk, (2, 4, 128, 64)) for kk in jax.random.split(jax.random.key(4), 3))
    mesh = default_mesh(jax.devices()[:8], MESH)
    lay = Layout(mesh_axes=dict(MESH), in_specs=[None] * 3, out_specs=None, node_specs={},
                 attention={n.key: AttentionLayout(batch=("x",), seq=("y",))})
    got = realize(direct, (q, k, v), lay, mesh).fn(q, k, v)
    assert float(jnp.max(jnp.abs(got - reference_attention(q, k, v, scale=0.125)))) < 1e-5


def test_a_hand_called_causal_splash_kernel_is_named_in_one_warning_line():
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    x = jax.ShapeDtypeStruct((2, 4, 128, 64), jnp.float32)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ir = build_ir(_direct_splash(sa.CausalMask), x, x, x)
    lines = [str(w.message) for w in rec if "pallas_call" in str(w.message)]
    assert len(lines) == 1 and "splash_mha_fwd" in lines[0] and "not planned as attention" in lines[0]
    assert [n.kind for n in ir.nodes if n.kind in ("opaque", "attention")] == ["opaque"]
    assert ir.warnings == lines


def test_found_attention_gets_a_ring_variant_on_its_own_key_dims():
    """q, k, v [B, S, N, D] and a key mask: the ring keeps k, v and the mask split on their key
    dim (dim 1 of k / v, the last of the mask), wherever the program has it."""
    from aoizora.extract.targets import get_target
    from aoizora.formulation.collective_cost import default_axis_costs
    from aoizora.formulation.strategies import Hardware, build_strategies

    x = jax.ShapeDtypeStruct((1, 1024, 4, 64), jnp.bfloat16)
    ir = build_ir(_dpa, x, x, x, jax.ShapeDtypeStruct((1, 1024), bool))
    (n,) = ir.by_kind("attention")
    tgt = get_target("v5e-4")
    g = build_strategies(ir, default_axis_costs(tgt, {"x": 4}), Hardware.from_chip(tgt.chip))
    ring = [s for s in g.groups[n.key].strategies if s.kv == "ring"]
    assert len(ring) == 1 and ring[0].labels == {"s": ("x",)}
    for k in (1, 2):
        assert ring[0].req[(n.key, k)] == ((), ("x",), (), ())
    assert ring[0].req[(n.key, 3)][n.operand_labels[3].index("t")] == ("x",)


def test_an_exp_between_two_dots_without_a_softmax_is_not_attention_like():
    def mlp(x, w1, w2):
        return jnp.exp(x @ w1) @ w2
    w = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        ir = build_ir(mlp, w, w, w)
    assert not rec and not ir.warnings and len(ir.by_kind("dot")) == 2


def test_a_hint_on_q_decides_heads_without_a_guess():
    """q [H, B, S, D] (heads first): by position heads would be B; the hint says otherwise."""
    from aoizora.kernels.primitives import hint

    def hinted(q, k, v, m):
        q, k, v = (hint(a.transpose(2, 0, 1, 3), "heads", "batch", "seq", "head_dim") for a in (q, k, v))
        s = jnp.einsum("hbqd,hbkd->hbqk", q, k)
        return jnp.einsum("hbqk,hbkd->hbqd", jax.nn.softmax(s), v)
    ir = build_ir(hinted, *_args())
    (n,) = ir.by_kind("attention")
    assert n.params["shape"] == [B, N, S, S, D]
    assert n.operand_labels[0] == ["h", "b", "s", "d"]
    assert "guessed" not in next(note for note in ir.notes if n.key in note)
