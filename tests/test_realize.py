"""realize(): a layout becomes a running (8 CPU devices) and compiling (v5e-8, ahead of time) program
that computes what the unsharded function computes; the splash wrapper matches the reference."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.kernels.attention_kernels import sharded_attention, splash_attention
from aoizora.kernels.primitives import attention, hint, reference_attention
from aoizora.runtime.realize import RealizeError, realize

H = 8
FAST = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}  # CPU -O0


def make_toy(n_heads: int = H):
    def toy(params, x):
        return _toy(params, x, n_heads)
    return toy


def _toy(params, x, n_heads):
    """Two scanned attention + MLP layers over x [B, S, E], with hints."""
    b, s, e = x.shape
    x = hint(x, "batch", "seq", "embed")

    def heads(t):
        return hint(t.reshape(b, s, n_heads, e // n_heads).transpose(0, 2, 1, 3), "batch", "heads", "seq", "head_dim")

    def layer(h, w):
        q, k, v = heads(h @ w["wq"]), heads(h @ w["wk"]), heads(h @ w["wv"])
        a = attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, s, e)
        h = h + a @ w["wo"]
        m = hint(jax.nn.gelu(h @ w["w1"]), "batch", "seq", "mlp")
        h = hint(h + m @ w["w2"], "batch", "seq", "embed")
        return h, None

    h, _ = jax.lax.scan(layer, x, params["layers"])
    return h @ params["out"]


toy = make_toy()


def toy_args(b, s, e, f, layers=2, dtype=jnp.float32):
    def sds(*shape):
        return jax.ShapeDtypeStruct(shape, dtype)
    lw = {"wq": sds(layers, e, e), "wk": sds(layers, e, e), "wv": sds(layers, e, e),
          "wo": sds(layers, e, e), "w1": sds(layers, e, f), "w2": sds(layers, f, e)}
    return ({"layers": lw, "out": sds(e, e)}, sds(b, s, e))


def concrete(abstract, seed=0):
    leaves, tree = jax.tree_util.tree_flatten(abstract)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    vals = [jax.random.normal(k, a.shape, a.dtype) * (a.shape[-1] ** -0.5 if len(a.shape) > 2 else 1.0)
            for k, a in zip(keys, leaves)]
    return jax.tree_util.tree_unflatten(tree, vals)


def param_specs(abstract, spec_of):
    """in_specs by input path: spec_of(path_string, leaf) -> spec or None."""
    return [spec_of(jax.tree_util.keystr(p), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]]


def auto_mesh(devices, shape, names):
    return Mesh(np.array(devices).reshape(shape), names, axis_types=(AxisType.Auto,) * len(shape))


def first_key(fn, abstract, prim, inside_scan=True):
    closed = jax.make_jaxpr(fn)(*abstract)
    for w in walk(closed.jaxpr):
        if w.eqn.primitive.name == prim and (bool(w.scope) == inside_scan):
            return w.key
    raise AssertionError(prim)


MESH = {"x": 2, "y": 4}


def context_layout(abstract):
    """Sequence over y, batch over x; keys/values gathered; weights replicated."""
    specs = param_specs(abstract, lambda p, a: ("x", "y", None) if p == "[1]" else None)
    return Layout(MESH, specs, [("x", "y", None)], rules={"batch": ("x",), "seq": ("y",)},
                  attention={"*": AttentionLayout(batch=("x",), seq=("y",))}, name="context")


def ulysses_tp_layout(abstract, key_w1):
    """Sequence over (x, y) outside attention, heads over (x, y) inside (Ulysses); MLP weights
    split over y (tensor parallel) and the first MLP matmul constrained by key."""
    def spec(p, a):
        if p == "[1]":
            return (None, ("x", "y"), None)
        if "w1" in p:
            return (None, None, "y")
        if "w2" in p:
            return (None, "y", None)
        return None
    return Layout(MESH, param_specs(abstract, spec), None, rules={"seq": ("x", "y")},
                  node_specs={key_w1: (None, "x", "y")},
                  attention={"*": AttentionLayout(heads=("x", "y"))}, name="ulysses_tp")


def ring_layout(abstract):
    specs = param_specs(abstract, lambda p, a: (None, ("x", "y"), None) if p == "[1]" else None)
    return Layout(MESH, specs, [(None, ("x", "y"), None)], rules={"seq": ("x", "y")},
                  attention={"*": AttentionLayout(seq=("x", "y"), kv="ring")}, name="ring")


def test_realized_toy_matches_unsharded_on_8_cpu_devices():
    abstract = toy_args(2, 48, 64, 128)    # 48 tokens: 12 per y shard, 6 per (x, y) shard
    args = concrete(abstract)
    want = np.asarray(jax.jit(toy)(*args))
    mesh = auto_mesh(jax.devices()[:8], (2, 4), ("x", "y"))
    key_w1 = first_key(toy, abstract, "dot_general")
    for layout in (context_layout(abstract), ulysses_tp_layout(abstract, key_w1), ring_layout(abstract)):
        fn, sargs = realize(toy, abstract, layout, mesh)
        compiled = fn.lower(*sargs).compile(compiler_options=FAST)
        placed = jax.tree_util.tree_map(lambda a, s: jax.device_put(a, s.sharding), args, sargs)
        got = compiled(*placed)
        err = float(np.max(np.abs(np.asarray(got) - want)))
        assert err < 1e-4, f"{layout.name}: max abs error {err:.3g} against the unsharded toy"
        hlo = compiled.as_text()
        if layout.name == "ring":
            assert "collective-permute" in hlo, layout.name


def test_node_specs_apply_at_the_walk_key_and_bad_specs_fail_in_one_line():
    abstract = toy_args(2, 48, 64, 128)
    mesh = auto_mesh(jax.devices()[:8], (2, 4), ("x", "y"))
    key = first_key(toy, abstract, "dot_general")
    lay = ulysses_tp_layout(abstract, key)
    lay.node_specs = {key: (None, None, ("x", "y"))}            # 64 columns over 8: fine
    realize(toy, abstract, lay, mesh).lower()
    lay.node_specs = {key: (None, None, "z")}                   # no such axis
    with pytest.raises(RealizeError, match=re.escape(f"node {key}")):
        realize(toy, abstract, lay, mesh)                       # raised by realize, before lowering
    lay.node_specs = {"99.1": (None, None, None)}
    with pytest.raises(RealizeError, match="does not have"):
        realize(toy, abstract, lay, mesh)
    lay.node_specs = {}
    lay.attention = {key: AttentionLayout()}                    # a dot_general, not an attention
    with pytest.raises(RealizeError, match="not an attention"):
        realize(toy, abstract, lay, mesh)
    with pytest.raises(RealizeError, match=r"attention node .*heads \(3\) does not divide over "
                                           r"mesh axes \('x', 'y'\) of size 8"):
        realize(make_toy(3), toy_args(2, 48, 48, 128), Layout(
            MESH, [None] * 8, None, attention={"*": AttentionLayout(heads=("x", "y"))}), mesh)
    bad = context_layout(toy_args(2, 50, 64, 128))              # 50 tokens over y = 4
    with pytest.raises(RealizeError, match=r"input \[1\].*dim 1 \(50\) does not divide over mesh axes \('y',\)"):
        realize(toy, toy_args(2, 50, 64, 128), bad, mesh)
    with pytest.raises(RealizeError, match="Auto"):
        realize(toy, abstract, context_layout(abstract), jax.make_mesh((2, 4), ("x", "y")))


@pytest.mark.tpu_compiler
def test_realized_toy_compiles_for_v5e_8_with_the_layouts_collectives():
    from aoizora.extract.targets import get_target

    mesh = auto_mesh(get_target("v5e-8").devices(), (2, 4), ("x", "y"))
    abstract = toy_args(2, 1024, 512, 1024, dtype=jnp.bfloat16)   # 8 heads x 64
    key_w1 = first_key(toy, abstract, "dot_general")
    want = {"context": "all-gather", "ulysses_tp": "all-to-all", "ring": "collective-permute"}
    for layout in (context_layout(abstract), ulysses_tp_layout(abstract, key_w1), ring_layout(abstract)):
        hlo = realize(toy, abstract, layout, mesh).compile().as_text()
        assert "custom-call" in hlo and "tpu_custom_call" in hlo, f"{layout.name}: no splash kernel"
        assert want[layout.name] in hlo, f"{layout.name}: no {want[layout.name]} in the TPU HLO"


@pytest.mark.parametrize("al", [AttentionLayout(seq=("x", "y")),
                                AttentionLayout(batch=("x",), heads=("y",)),
                                AttentionLayout(batch=("x",), seq=("y",), kv="ring")],
                         ids=["context", "batch_heads", "ring"])
def test_splash_interpret_matches_reference_with_padding(al):
    """100 queries / 60 keys: the wrapper pads to the kernel's blocks and masks the padded keys."""
    mesh = auto_mesh(jax.devices()[:8], (2, 4), ("x", "y"))
    ks = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(ks[0], (2, 4, 100, 32))
    k, v = (jax.random.normal(kk, (2, 4, 60, 32)) for kk in ks[1:])
    want = reference_attention(q, k, v, scale=0.2)
    got = jax.jit(lambda q, k, v: splash_attention(q, k, v, layout=al, mesh=mesh, scale=0.2,
                                                   interpret=True))(q, k, v)
    err = float(jnp.max(jnp.abs(got - want)))
    assert err < 1e-5, f"splash (interpret) vs reference: max abs error {err:.3g}"
    ref = jax.jit(lambda q, k, v: sharded_attention(q, k, v, layout=al, mesh=mesh, scale=0.2,
                                                    impl="reference"))(q, k, v)
    err = float(jnp.max(jnp.abs(ref - want)))
    assert err < 1e-5, f"sharded reference vs reference: max abs error {err:.3g}"


def test_call_like_eqns_are_inlined_and_loop_bodies_keep_walk_keys():
    """jit, checkpoint, custom_jvp (relu), a while loop and a cond: same output, walk keys apply."""
    @jax.jit
    def inner(x, w):
        return jax.nn.relu(x @ w)

    def fn(x, w, n):
        y = jax.checkpoint(lambda x: inner(x, w))(x)
        y = jax.lax.fori_loop(0, n, lambda i, y: hint(jnp.tanh(y @ w), "batch", "embed"), y)
        return jax.lax.cond(n > 1, lambda y: y * 2.0, lambda y: y, y)

    abstract = (jax.ShapeDtypeStruct((16, 32), jnp.float32), jax.ShapeDtypeStruct((32, 32), jnp.float32),
                jax.ShapeDtypeStruct((), jnp.int32))
    x, w = concrete(abstract[:2])
    n = jnp.int32(3)
    want = np.asarray(jax.jit(fn)(x, w, n))
    mesh = auto_mesh(jax.devices()[:8], (2, 4), ("x", "y"))
    closed = jax.make_jaxpr(fn)(*abstract)
    keys = {w_.eqn.primitive.name: w_.key for w_ in walk(closed.jaxpr) if w_.scope}
    tanh_key = keys["tanh"]                                    # inside the while body
    lay = Layout(MESH, [("x", None), None, ()], [("x", "y")], node_specs={tanh_key: ("x", "y")},
                 rules={"batch": ("x",), "embed": ("y",)})
    fn_r, sargs = realize(fn, abstract, lay, mesh)
    got = np.asarray(fn_r(jax.device_put(x, sargs[0].sharding), jax.device_put(w, sargs[1].sharding), n))
    err = float(np.max(np.abs(got - want)))
    assert err < 1e-4, f"max abs error {err:.3g}"  # sharded contractions sum in another order
    lay.node_specs = {tanh_key: ("x", "z")}
    with pytest.raises(RealizeError, match=re.escape(f"node {tanh_key} (tanh)")):
        realize(fn, abstract, lay, mesh)
