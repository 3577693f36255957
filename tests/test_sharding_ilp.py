"""The sharding ILP picks the textbook layouts of a 2-layer MLP, reports an impossible memory
budget clearly, is deterministic, gives K distinct best solutions, and reports honest statuses."""

import random

import jax
import jax.numpy as jnp
import pulp
import numpy as np
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.collective_cost import AxisCosts, default_axis_costs
from aoizora.formulation.layout import Layout
from aoizora.formulation.strategies import (Hardware, build_strategies, dtensor_steps,
                                            reshard_cost)
from aoizora.solvers.sharding import (MemoryBudgetError, ShardingProblem, ShardingSolveError,
                                      available_solvers, run_solver, solve_sharding)

# Compute-bound on v5e (batch 1024 > peak/HBM-bandwidth = 243 FLOP/B): data parallel needs no
# communication at inference; Megatron all-reduces (or reduce-scatters) [B, D] once; FSDP would
# gather 2 x 128 MB of weights.
B, D, F = 1024, 4096, 16384
W_BYTES = 2 * D * F * 2


# mlp_ir and v5e4: the shared 2-layer MLP fixtures of tests/conftest.py
from conftest import mlp  # noqa: E402


def _specs(ir, layout: Layout) -> dict[str, tuple]:
    return {ir.tensors[t].path: s for t, s in zip(ir.inputs, layout.in_specs)}


def test_data_parallel_when_memory_allows(mlp_ir, v5e4):
    r = solve_sharding(mlp_ir, v5e4, {"x": 4})
    sp = _specs(mlp_ir, r.layout)
    assert sp["params/w1"] == (None, None) and sp["params/w2"] == (None, None)
    dots = [n.key for n in mlp_ir.by_kind("dot")]
    assert all(r.layout.node_specs[k] == ("x", None) for k in dots)   # rows (batch) split
    assert r.certificate.status == "OPTIMAL" and r.certificate.gap == 0.0
    assert r.best.predicted["comm_s"] == 0.0
    assert r.best.peak_bytes > W_BYTES   # replicated weights are counted


def test_megatron_when_memory_forces(mlp_ir, v5e4):
    budget = 150e6   # below the replicated weights (268 MB), above a quarter of them
    r = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=budget))
    sp = _specs(mlp_ir, r.layout)
    assert sp["params/w1"] == (None, "x"), "first layer: column split"
    assert sp["params/w2"] == ("x", None), "second layer: row split"
    assert r.best.peak_bytes <= budget
    assert r.certificate.status == "OPTIMAL"
    words = " ".join(r.best.words)
    assert "columns" in words and "contracting" in words and "partial sum over x" in words
    assert r.best.predicted["comm_s"] > 0


def test_impossible_budget_says_how_much_is_missing(mlp_ir, v5e4):
    with pytest.raises(MemoryBudgetError, match="GiB missing") as ei:
        solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=20e6))
    e = ei.value
    assert e.min_bytes is not None and e.min_bytes > e.budget == 20e6
    assert e.min_bytes >= W_BYTES / 4   # at least a quarter of the weights on every device


def test_same_inputs_same_answer(mlp_ir, v5e4):
    a = solve_sharding(mlp_ir, v5e4, {"x": 2, "y": 2}, ShardingProblem(hbm_bytes=150e6))
    b = solve_sharding(mlp_ir, v5e4, {"x": 2, "y": 2}, ShardingProblem(hbm_bytes=150e6))
    assert a.best.choice == b.best.choice
    assert a.layout.to_json() == b.layout.to_json()
    assert a.certificate.objective == b.certificate.objective


def test_k_best_distinct_and_ordered(mlp_ir, v5e4):
    r = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=150e6), k_best=3)
    sols = r.all()
    assert len(sols) == 3
    choices = [tuple(sorted(s.choice.items())) for s in sols]
    assert len(set(choices)) == 3
    objs = [s.certificate.objective for s in sols]
    assert objs == sorted(objs)
    # every layout is compiled with the settings under which Q1's gathers hold (TPU: no
    # windowed einsums); a GPU target gets none
    assert all(s.layout.compiler_options == {
        "xla_tpu_enable_windowed_einsum_for_all_gather": False,
        "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False} for s in sols)
    assert solve_sharding(mlp_ir, get_target("h100-8"), {"x": 8}).best.layout.compiler_options == {}


@pytest.mark.skipif("highs" not in available_solvers(), reason="highspy not installed")
def test_highs_agrees_with_cbc(mlp_ir, v5e4):
    a = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=150e6), solver="cbc")
    b = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=150e6), solver="highs")
    assert b.certificate.status == "OPTIMAL"
    assert b.certificate.objective == pytest.approx(a.certificate.objective, rel=1e-6)


def test_feedback_hooks(mlp_ir, v5e4):
    base = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=150e6))
    dot1 = mlp_ir.by_kind("dot")[0].key
    name = base.best.choice[dot1]
    # forbidding the chosen strategy of the first dot changes it
    r = solve_sharding(mlp_ir, v5e4, {"x": 4},
                       ShardingProblem(hbm_bytes=150e6, forbidden=[{dot1: name}]))
    assert r.best.choice[dot1] != name
    assert r.certificate.objective >= base.certificate.objective
    # a large correction on that strategy has the same effect; a constant one only shifts Q1
    r2 = solve_sharding(mlp_ir, v5e4, {"x": 4},
                        ShardingProblem(hbm_bytes=150e6, corrections={dot1: {name: 1.0}}))
    assert r2.best.choice[dot1] != name
    r3 = solve_sharding(mlp_ir, v5e4, {"x": 4},
                        ShardingProblem(hbm_bytes=150e6, corrections={dot1: 0.5}))
    assert r3.best.choice == base.best.choice
    assert r3.certificate.objective == pytest.approx(base.certificate.objective + 0.5)
    # slower axis costs (a replaced AxisCosts) are used
    ac = default_axis_costs(v5e4, {"x": 4}).scaled({"x": 1000.0})
    r4 = solve_sharding(mlp_ir, v5e4, {"x": 4}, ShardingProblem(hbm_bytes=150e6, axis_costs=ac))
    assert r4.certificate.objective > base.certificate.objective


def test_reshard_costs_by_hand():
    class T:
        shape, bytes = [8, 16], 8 * 16 * 2
    ac = AxisCosts(sizes={"x": 4, "y": 2}, alpha_s={"x": 3e-6, "y": 1e-6},
                   beta_s_per_byte={"x": 1e-9, "y": 2e-9})
    V = 256.0
    assert reshard_cost(T, (("x",), ()), ((), ()), ac) == pytest.approx(3e-6 + 1e-9 * 3 / 4 * V)
    assert reshard_cost(T, ((), ()), (("x",), ()), ac) == 0.0          # slicing is free
    assert reshard_cost(T, (("x",), ()), ((), ("x",)), ac) == pytest.approx(   # all-to-all
        3e-6 + 1e-9 * 3 / 16 * (V / 4 * 4))
    # gather y while x stays: V = the array one x-group holds = 256 / 4
    assert reshard_cost(T, (("x",), ("y",)), (("x",), ()), ac) == pytest.approx(
        1e-6 + 2e-9 * 1 / 2 * (V / 4))


def test_dtensor_reshard_costs_by_hand():
    """A torch program's reshard as DTensor runs it: taking the outer axis off a dim split over
    (x, y) gathers the whole dim over y, then x, and slices it over y again; the XLA pricing
    gathers over x alone. Moves of one axis between dims stay one all-to-all."""
    class T:
        shape, bytes = [8, 16], 8 * 16 * 2
    ac = AxisCosts(sizes={"x": 4, "y": 2}, alpha_s={"x": 3e-6, "y": 1e-6},
                   beta_s_per_byte={"x": 1e-9, "y": 2e-9})
    V = 256.0
    src, dst = (("x", "y"), ()), (("y",), ())
    assert dtensor_steps(src, dst, ac.sizes) == [("all-gather", "y"), ("all-gather", "x"),
                                                 ("slice", "y")]
    got = reshard_cost(T, src, dst, ac, dtensor=True)
    assert got == pytest.approx(1e-6 + 2e-9 * 1 / 2 * (V / 4) + 3e-6 + 1e-9 * 3 / 4 * V)
    assert got > reshard_cost(T, src, dst, ac)
    for src, dst in [((("x",), ()), ((), ("x",))),          # Ulysses: one all-to-all
                     ((("x",), ("y",)), (("x",), ())),      # gather y, x stays
                     ((("x",), ()), ((), ()))]:
        assert reshard_cost(T, src, dst, ac, dtensor=True) == pytest.approx(
            reshard_cost(T, src, dst, ac))


def test_default_axis_costs_ring_and_line():
    t16 = get_target("v5e-256")          # 16x16, wraps on both axes
    ac = default_axis_costs(t16, {"x": 16, "y": 16})
    W = t16.chip.link_bandwidth_Bps
    assert ac.beta_s_per_byte["x"] == pytest.approx(1 / (2 * W))      # ring: both directions


@pytest.mark.parametrize("target,mesh", [("v5e-8", {"x": 2, "y": 4}), ("v5e-16", {"x": 2, "y": 8}),
                                         ("v5e-8", {"x": 2, "y": 2, "z": 2})])
def test_default_axis_costs_price_an_all_gather_as_q2_does(target, mesh):
    """Q1's beta of an axis is what Q2 charges that axis's all-gather under the default order."""
    from aoizora.extract.evidence import Collective
    from aoizora.extract.network import Network, default_device_order
    from aoizora.formulation.traffic import collective_link_bytes, mesh_axis_groups
    tgt = get_target(target)
    net, ac = Network.from_target(tgt), default_axis_costs(tgt, mesh)
    chips = net.device_chip[np.asarray(default_device_order(tgt, mesh))]
    V = 1 << 24
    for i, (a, n) in enumerate(mesh.items()):
        c = Collective("ag", "all-gather", "bf16", V, mesh_axis_groups(list(mesh.values()), [i]))
        t = float(net.link_time_s(collective_link_bytes(c, chips, net)[0]).max())
        assert ac.beta_s_per_byte[a] * (n - 1) / n * V == pytest.approx(t, rel=1e-9)
        # an all-to-all of the same V (V / n a rank), routed pair by pair as Q2 routes it
        c = Collective("a2a", "all-to-all", "bf16", V // n,
                       mesh_axis_groups(list(mesh.values()), [i]))
        t = float(net.link_time_s(collective_link_bytes(c, chips, net)[0]).max())
        assert ac.all_to_all(a, V) - ac.alpha_s[a] == pytest.approx(t, rel=1e-9)
        if n >= 4:          # pairs two or more hops apart: dearer than a ring's neighbour sends
            assert ac.all_to_all(a, V) - ac.alpha_s[a] > ac.beta_s_per_byte[a] * (n - 1) / n**2 * V
    # v5e-8 2x4 in make_mesh's order: y's groups close rings on 2x2 squares, x's pairs sit
    # apart and share the middle links
    if target == "v5e-8" and len(mesh) == 2:
        assert ac.beta_s_per_byte["x"] > ac.beta_s_per_byte["y"]


def test_unknown_op_is_replicated_only(v5e4):
    from jax.extend.core import Primitive
    p = Primitive("mystery_op2")
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    with pytest.warns(UserWarning):
        ir = build_ir(lambda x, w: p.bind(x @ w), jax.ShapeDtypeStruct((64, 32), jnp.float32),
                      jax.ShapeDtypeStruct((32, 32), jnp.float32))
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip))
    unk = ir.by_kind("unknown")[0]
    assert len(g.groups[g.group_of_node[unk.key]].strategies) == 1


def test_time_limit_reports_honestly(v5e4):
    """A hard problem under a tiny limit: a solution marked not proven (with the solver's bound),
    or proven optimal -- never a false claim."""
    rnd = random.Random(0)
    prob = pulp.LpProblem("cover", pulp.LpMinimize)
    x = [prob.add_variable(f"x{i}", 0, 1, cat=pulp.LpBinary) for i in range(400)]
    prob += pulp.lpSum(rnd.randint(10, 100) * v for v in x)
    for _ in range(40):
        prob += pulp.lpSum(rnd.randint(10, 100) * v for v in x) >= 8000
    r = run_solver(prob, "cbc", 0.3, 0, 1)
    assert r["status"] in ("FEASIBLE", "OPTIMAL", "UNKNOWN")
    if r["status"] == "FEASIBLE":
        assert r["bound"] is not None and r["bound"] <= r["objective"] + 1e-6
    if r["status"] == "OPTIMAL":
        assert r["bound"] == r["objective"]
    # the sharding ILP under a tiny limit: a result or a clear error with an honest status
    bf = jnp.bfloat16
    ir = build_ir(mlp, {"w1": jax.ShapeDtypeStruct((D, F), bf), "w2": jax.ShapeDtypeStruct((F, D), bf)},
                  jax.ShapeDtypeStruct((B, D), bf))
    try:
        res = solve_sharding(ir, v5e4, {"x": 2, "y": 2}, time_limit_s=0.01)
        c = res.certificate
        assert c.status in ("OPTIMAL", "FEASIBLE")
        assert c.proven_optimal == (c.status == "OPTIMAL")
        if c.bound is not None:
            assert c.bound <= c.objective + 1e-12
    except ShardingSolveError as e:
        assert e.certificate is not None and e.certificate.status == "UNKNOWN"


def _tiny_dit():
    """A 2-block DiT-like model (scan, attention primitive, hint) in f32, and its abstract inputs."""
    from aoizora.kernels.primitives import attention, hint
    b, s, d, h, f, nl = 2, 16, 32, 4, 64, 2

    def block(x, p):
        x = hint(x, "batch", "seq", "embed")
        y = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        q, k, v = [(y @ p[n]).reshape(b, s, h, d // h).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv")]
        x = x + attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, s, d) @ p["wo"]
        return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]

    def model(params, x):
        x, _ = jax.lax.scan(lambda c, p: (block(c, p), None), x, params)
        return x

    sds = jax.ShapeDtypeStruct
    params = {n: sds((nl, d, d), jnp.float32) for n in ("wq", "wk", "wv", "wo")}
    params.update(w1=sds((nl, d, f), jnp.float32), w2=sds((nl, f, d), jnp.float32))
    return model, (params, sds((b, s, d), jnp.float32))


def test_attention_strategies_gather_kv(v5e4):
    model, args = _tiny_dit()
    ir = build_ir(model, *args)
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 2, "y": 2}), Hardware.from_chip(v5e4.chip))
    att = ir.by_kind("attention")[0]
    strats = g.groups[att.key].strategies
    assert any(s.labels == {"h": ("y",), "s": ("x",)} for s in strats)       # heads y, sequence x
    assert any(not s.labels for s in strats)                                 # replicated
    assert all(set(s.labels) <= {"b", "h", "s"} for s in strats)             # never kv seq / head dim
    for s in strats:   # keys / values are needed whole along their sequence
        for (node, k), spec in s.req.items():
            if node == att.key and k in (1, 2):
                assert spec[2] == ()


def test_ilp_layout_realizes_and_computes_the_same_numbers():
    from aoizora.formulation.collective_cost import uniform_axis_costs
    from aoizora.models.experts import default_mesh
    from aoizora.runtime.realize import realize
    import numpy as np
    model, args = _tiny_dit()
    ir = build_ir(model, *args)
    mesh_axes = {"x": 2, "y": 4}
    # slow compute, fast links: the ILP splits the tiny program as it would a large one
    hw = Hardware(peak_flops=1e6, hbm_bandwidth_Bps=1e6, hbm_bytes=10**9)
    r = solve_sharding(ir, None, mesh_axes, ShardingProblem(
        hardware=hw, axis_costs=uniform_axis_costs(mesh_axes, 1e9, 1e-9)))
    assert any(spec != (None, None, None) for spec in r.layout.node_specs.values())
    leaves, tree = jax.tree_util.tree_flatten(args)
    vals = [0.3 * jax.random.normal(jax.random.PRNGKey(i), l.shape, l.dtype) for i, l in enumerate(leaves)]
    p, x = jax.tree_util.tree_unflatten(tree, vals)
    ref = np.asarray(jax.jit(model)(p, x))
    fn, _ = realize(model, args, r.layout, default_mesh(jax.devices()[:8], mesh_axes))
    out = np.asarray(fn(p, x))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_ring_attention_variant(v5e4):
    """With the query sequence split and whole 128-token kv blocks per shard, a ring variant keeps
    keys/values split like the queries and overlaps their traffic with compute."""
    from aoizora.kernels.primitives import attention

    sds = jax.ShapeDtypeStruct
    ir = build_ir(lambda q, k, v: attention(q, k, v), *[sds((1, 4, 1024, 64), jnp.bfloat16)] * 3)
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip))
    att = ir.by_kind("attention")[0].key
    strats = g.groups[att].strategies
    ring = [s for s in strats if s.kv == "ring"]
    gather = [s for s in strats if s.kv == "gather" and s.labels == {"s": ("x",)}]
    assert len(ring) == 1 and ring[0].labels == {"s": ("x",)} and len(gather) == 1
    for k in (1, 2):
        assert ring[0].req[(att, k)] == ((), (), ("x",), ())      # kv split like the queries
        assert gather[0].req[(att, k)] == ((), (), (), ())        # kv gathered
    assert ring[0].comm > 0 and ring[0].cost < gather[0].cost + ring[0].comm   # overlapped
    r = solve_sharding(ir, v5e4, {"x": 4})
    assert r.layout.attention[att].kv in ("ring", "gather")


def test_k_best_distinct_in_kv_mode(v5e4):
    """distinct="kv": the second solution runs the attention's keys/values the other way (ring vs
    gathered); once no kv mode is left the next ones differ as plain no-good cuts make them."""
    from aoizora.kernels.primitives import attention

    sds = jax.ShapeDtypeStruct
    ir = build_ir(lambda q, k, v: attention(q, k, v), *[sds((1, 4, 1024, 64), jnp.bfloat16)] * 3)
    att = ir.by_kind("attention")[0].key
    plain = solve_sharding(ir, v5e4, {"x": 4}, k_best=2)
    kv = solve_sharding(ir, v5e4, {"x": 4}, k_best=3, distinct="kv")
    modes = [s.layout.attention[att].kv for s in kv.all()]
    assert len(modes) == 3 and modes[0] != modes[1]
    assert plain.best.choice == kv.best.choice
    assert len({tuple(sorted(s.choice.items())) for s in kv.all()}) == 3
    objs = [s.certificate.objective for s in kv.all()]
    assert objs[0] <= min(objs[1:])
    with pytest.raises(ValueError, match="distinct"):
        solve_sharding(ir, v5e4, {"x": 4}, distinct="attention")


def _scanned_stack(params, x):
    """fp32 layer stacks cast to bf16, then a layer scan slices them (as a training step does)."""
    w = params.astype(jnp.bfloat16)

    def layer(h, wl):
        return jnp.tanh(h @ wl), None

    return jax.lax.scan(layer, x, w)[0].sum()


def test_no_strategy_splits_a_scanned_stacks_layers(v5e4):
    """A scan slices one layer per iteration: splitting the stack's layer dim would gather the
    whole stack each iteration, which Q1 cannot price, so no strategy offers it, even where the
    stack reaches the scan through a cast."""
    ir = build_ir(_scanned_stack, jax.ShapeDtypeStruct((4, 256, 256), jnp.float32),
                  jax.ShapeDtypeStruct((64, 256), jnp.bfloat16))
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip))
    stack = ir.inputs[0]
    gid = g.origin[stack][0]
    specs = [st.specs[stack] for st in g.groups[gid].strategies]
    assert any(any(sp) for sp in specs)                 # the stack's other dims may split
    assert all(not sp[0] for sp in specs)               # its layer dim never does


def _momentum_step(state, x):
    """A state fed back (weights and their momenta): (new state, loss), the state donated as a
    training step's is."""
    params, mom = state

    def loss_fn(p):
        h = x
        for w in p:
            h = jnp.tanh(h @ w)
        return h.sum()

    loss, g = jax.value_and_grad(loss_fn)(params)
    mom = [0.9 * m + d for m, d in zip(mom, g)]
    return ([p - 0.01 * m for p, m in zip(params, mom)], mom), loss


def test_a_donated_state_is_not_counted_twice(v5e4):
    """The new state may take the donated old state's buffer: the memory rows count the old one
    to its last use only, so the peak is below the old-plus-new of an undonated program."""
    from aoizora.formulation.sharding_ilp import memory_rows
    leaves = [jax.ShapeDtypeStruct((512, 512), jnp.float32)] * 6
    ir = build_ir(_momentum_step, (leaves, leaves), jax.ShapeDtypeStruct((64, 512), jnp.float32))
    assert ir.state_aliases
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip))
    k0 = {gid: 0 for gid in g.groups}

    def peak(rows):
        return max(r.const + sum(v for (gid, k), v in r.terms.items() if k0[gid] == k)
                   for r in rows)

    donated = peak(memory_rows(ir, g, small_bytes=0))
    ir.state_aliases = []
    kept = peak(memory_rows(ir, g, small_bytes=0))
    assert 0 < donated < kept - 4 * 2**20    # at least four of the 1 MiB leaves less


def _scan_with_ys(ws, h):
    def body(c, w):
        c = jnp.tanh(c @ w)
        return c, c * 2.0
    c, ys = jax.lax.scan(body, h, ws)
    return jnp.sum(ys) + jnp.sum(c)


def test_a_scans_stacked_result_is_counted_whole_through_the_loop(v5e4, monkeypatch):
    """The compiler allocates a scan's stacked output (8 slices of 1 MiB here) before the loop:
    the rows inside the loop count all of it, not the one slice the body makes."""
    from aoizora.formulation import sharding_ilp
    ws = jax.ShapeDtypeStruct((8, 512, 512), jnp.float32)
    h = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    ir = build_ir(_scan_with_ys, ws, h)
    assert sharding_ilp.stacked_outputs(ir)
    g = build_strategies(ir, default_axis_costs(v5e4, {"x": 4}), Hardware.from_chip(v5e4.chip))
    k0 = {gid: 0 for gid in g.groups}

    def peak():
        return max(r.const + sum(v for (gid, k), v in r.terms.items() if k0[gid] == k)
                   for r in sharding_ilp.memory_rows(ir, g, small_bytes=0))

    whole = peak()
    monkeypatch.setattr(sharding_ilp, "stacked_outputs", lambda ir, remat=None: set())
    one_slice = peak()
    assert whole >= one_slice + 7 * 2**20 / 4    # 7 more slices, each split at most 4 ways
