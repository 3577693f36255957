"""Training: attention is differentiable as one backward op (aoizora_attention_bwd), the IR and the
sharding model see it, and three AdamW steps of wan2.1-small through plan.jit on 8 CPU devices
(batch, sequence and an FFN weight split, state donated) equal the unsharded steps within bf16
tolerance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from aoizora.extract.frontends.jax.jaxpr_walk import walk
from aoizora.extract.frontends.jax.ir_builder import ATTENTION_BWD_FLOPS_RATIO, build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.formulation.strategies import Hardware, build_strategies
from aoizora.models import registry, training
from aoizora.kernels.primitives import ATTENTION, ATTENTION_BWD, ATTENTION_FWD, attention, reference_attention
from aoizora.plans import Plan, program_key
from aoizora.runtime.realize import realize
from aoizora.solvers.sharding import solve_sharding
from aoizora.solvers.sharding_problem import ShardingProblem

MODEL = "wan2.1-small"
WORKLOAD = "tiny-9f"          # 3 x 8 x 8 = 192 video tokens; text 32 tokens
BATCH = 2


def test_attention_grad_is_one_backward_op_matching_the_reference():
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(k[0], (2, 4, 16, 8))
    kv = [jax.random.normal(x, (2, 4, 12, 8)) for x in k[1:]]

    def loss(att):
        return lambda q, k, v: jnp.sum(jnp.sin(att(q, k, v)))

    ours = jax.grad(loss(attention), argnums=(0, 1, 2))(q, *kv)
    ref = jax.grad(loss(lambda a, b, c: reference_attention(a, b, c, scale=8 ** -0.5)),
                   argnums=(0, 1, 2))(q, *kv)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    jvp = jax.jvp(loss(attention), (q, *kv), (q, *kv))[1]
    np.testing.assert_allclose(jvp, jax.jvp(loss(lambda a, b, c: reference_attention(
        a, b, c, scale=8 ** -0.5)), (q, *kv), (q, *kv))[1], rtol=1e-5)
    names = [e.primitive.name for e in jax.make_jaxpr(jax.grad(loss(attention)))(q, *kv).eqns]
    assert names.count(ATTENTION_BWD) == 1 and "dot_general" not in names


@pytest.fixture(scope="module")
def step_and_args():
    cfg = training.TrainConfig(learning_rate=1e-3)
    return cfg, training.train_step(MODEL, cfg), training.abstract_train_inputs(MODEL, WORKLOAD,
                                                                                BATCH, cfg)


def test_train_step_jaxpr_has_one_backward_per_attention_and_no_dense_scores(step_and_args):
    _, step, args = step_and_args
    closed = jax.make_jaxpr(step)(*args)
    prims = [w.eqn for w in walk(closed.jaxpr)]
    fwd = [e for e in prims if e.primitive.name == ATTENTION_FWD]
    bwd = [e for e in prims if e.primitive.name == ATTENTION_BWD]
    assert len(fwd) == 2 and len(bwd) == 2            # self + cross attention, scan body once
    assert not [e for e in prims if e.primitive.name == ATTENTION]   # the forward keeps its lse
    for b in bwd:        # the backward reads the forward's (out, lse), so it does not recompute it
        f = next(f for f in fwd if f.invars[1].aval.shape == b.invars[1].aval.shape)
        assert [tuple(v.aval.shape) for v in b.invars[3:5]] == \
            [tuple(v.aval.shape) for v in f.outvars]
    assert sorted(tuple(e.invars[1].aval.shape) for e in bwd) == \
        sorted(tuple(e.invars[1].aval.shape) for e in fwd)
    seqs = {e.invars[0].aval.shape[2] for e in fwd} | {e.invars[1].aval.shape[2] for e in fwd}
    for e in prims:   # no q x k score matrix outside the attention ops
        if e.primitive.name == "dot_general":
            shp = e.outvars[0].aval.shape
            assert not (len(shp) >= 2 and shp[-2] in seqs and shp[-1] in seqs), shp


def test_ir_has_attention_backward_nodes_with_the_forward_roles(step_and_args):
    _, step, args = step_and_args
    with pytest.warns(UserWarning, match="replicated-only"):   # the PRNG's key ops
        ir = build_ir(step, *args)
    fwd, bwd = ir.by_kind("attention"), ir.by_kind("attention_bwd")
    assert len(fwd) == len(bwd) == 2
    for b in bwd:
        f = next(f for f in fwd if ir.tensors[f.operands[1]].shape == ir.tensors[b.operands[1]].shape)
        assert b.roles == f.roles
        assert b.operand_labels[:3] == f.operand_labels and b.operand_labels[3] == f.result_labels[0]
        assert [ir.tensors[r].shape for r in b.results] == \
            [ir.tensors[o].shape for o in b.operands[:3]]
        assert b.flops == pytest.approx(ATTENTION_BWD_FLOPS_RATIO * f.flops)
    assert not any("add_any" in w or "attention" in w for w in ir.warnings)
    # every state leaf is fed back: the new state is aliased to the old, leaf by leaf
    n_state = len(jax.tree.leaves(args[0]))
    assert ir.state_aliases == [[i, i] for i in range(n_state)]


def test_ilp_lays_out_the_backward_and_keeps_the_state_layout(step_and_args):
    _, step, args = step_and_args
    with pytest.warns(UserWarning, match="replicated-only"):
        ir = build_ir(step, *args)
    target, mesh = get_target("v5p-16"), {"x": 2, "y": 4}
    graph = build_strategies(ir, default_axis_costs(target, mesh), Hardware.from_chip(target.chip))
    bwd = [n.key for n in ir.by_kind("attention_bwd")]
    for k in bwd:   # the forward's splits, keys/values gathered; a query-sequence split pays
        g = graph.groups[k]   # the dk/dv all-reduce over its axes, a heads split nothing
        assert {s.kv for s in g.strategies} == {"gather"}
        assert any(s.labels.get("s") for s in g.strategies)
        for s in g.strategies:
            if s.labels.get("s"):
                assert s.comm > 0 and "dk/dv all-reduced" in s.words
            if set(s.labels) == {"h"}:
                assert s.comm == 0
    state_edges = [e for e in graph.edges if e.operand == -3]
    assert state_edges and all(e.consumer.startswith("in:") for e in state_edges)
    r = solve_sharding(ir, target, mesh, ShardingProblem(graph=graph), time_limit_s=60)
    lay = r.layout
    assert all(k in lay.attention and lay.attention[k].kv == "gather" for k in bwd)
    for o, i in ir.state_aliases:
        assert lay.out_specs[o] == lay.in_specs[i]


def _run(fn, state, batch, steps):
    losses = []
    for _ in range(steps):
        state, loss = fn(state, batch)
        losses.append(float(loss))
    return state, losses


def test_three_sharded_steps_equal_the_unsharded_steps(step_and_args):
    cfg, step, (st_abs, b_abs) = step_and_args
    def fresh_state():   # donation needs buffers no other array shares
        params = registry.init_params(MODEL, jax.random.PRNGKey(0))
        return training.init_train_state(MODEL, params, cfg)

    batch = training.random_batch(MODEL, WORKLOAD, jax.random.PRNGKey(1), BATCH)
    p0 = jax.device_get(fresh_state()["params"])
    ref_state, ref_losses = _run(jax.jit(step), fresh_state(), batch, 3)

    leaves = jax.tree_util.tree_flatten_with_path((st_abs, b_abs))[0]

    def spec(path, leaf):
        p = jax.tree_util.keystr(path)
        if p.startswith("[0]['params']['blocks']['ffn']['fc1']['w']") or \
                ("['mu']['blocks']['ffn']['fc1']['w']" in p):   # weight and its moment split
            return (None,) * (leaf.ndim - 1) + ("seq",)
        if "latents" in p or "context" in p:
            return ("data",) + (None,) * (leaf.ndim - 1)
        return None

    in_specs = [spec(p, leaf) for p, leaf in leaves]
    n_state = len(jax.tree.leaves(st_abs))
    out_specs = [s if s is not None else (None,) * leaf.ndim
                 for s, (_, leaf) in zip(in_specs[:n_state], leaves)] + [()]
    layout = Layout(mesh_axes={"data": 2, "seq": 4}, in_specs=in_specs, out_specs=out_specs,
                    attention={"*": AttentionLayout(batch=("data",), seq=("seq",))},
                    rules={"batch": ("data",), "seq": ("seq",)})
    # a plan carrying the layout (query sequence split with keys/values gathered: the backward
    # all-reduces dk/dv), applied with plan.jit, the state donated
    target = get_target("v5p-16")
    plan = Plan(key=program_key(step, (st_abs, b_abs), target.name), target=target.name,
                layout=layout, device_order=list(range(8)),
                device_coords=[(i, 0, 0) for i in range(8)], predicted={}, certificates={})
    mesh = plan.make_mesh(jax.devices()[:8])
    fn = plan.jit(step, mesh, donate_argnums=(0,))
    shardings = [NamedSharding(mesh, P(*(sp or ()))) for sp in in_specs]
    s0 = jax.tree.unflatten(jax.tree.structure(st_abs),
                            [jax.device_put(a, sh) for a, sh in
                             zip(jax.tree.leaves(fresh_state()), shardings[:n_state])])
    got_state, got_losses = _run(fn, s0, batch, 3)

    assert all(x.is_deleted() for x in jax.tree.leaves(s0))        # the state was donated
    np.testing.assert_allclose(got_losses, ref_losses, rtol=2e-3)
    assert ref_losses[2] < ref_losses[0]                             # it trains
    assert int(got_state["step"]) == 3

    # gradients, through AdamW's first moment mu = sum of (1 - b1) b1^k g: bf16 tolerance
    def rel(a, b):
        return float(jnp.linalg.norm((a - b).ravel()) / (jnp.linalg.norm(b.ravel()) + 1e-30))

    mu_got, mu_ref = got_state["opt_state"][0].mu, ref_state["opt_state"][0].mu
    errs = jax.tree.map(rel, mu_got, mu_ref)
    assert max(jax.tree.leaves(errs)) < 5e-2, errs
    # parameters: the update (new - initial) agrees; Adam's normalised step makes single
    # near-zero gradients flip sign at bf16 noise, so compare the update's norm per leaf
    upd = jax.tree.map(lambda g, r0, p0: rel(g - p0, r0 - p0), got_state["params"],
                       ref_state["params"], p0)
    assert float(np.median(jax.tree.leaves(upd))) < 5e-2, upd
    assert max(jax.tree.leaves(upd)) < 0.3, upd


def test_training_grid_inputs_and_bad_input():
    grid = training.training_grid()
    assert len(grid) == 2 * 6 * 3    # two sizes x (480p, 720p) x (21, 41, 81 frames) x batch 1/2/4
    state, batch = training.abstract_train_inputs("wan2.1-14b", "720p-81f", 4)
    assert batch["latents"].shape == (4, 16, 21, 90, 160)
    assert batch["context"].shape == (4, 512, 4096) and batch["key"].shape == (2,)
    leaves = jax.tree.leaves(state["params"]) + jax.tree.leaves(state["opt_state"][0].mu)
    assert {a.dtype for a in leaves} == {jnp.dtype(jnp.float32)}
    assert sum(a.size for a in jax.tree.leaves(state["params"])) == registry.get_model(
        "wan2.1-14b").params
    _, b13 = training.abstract_train_inputs("wan2.1-1.3b", "720p-21f", 2)   # 720p for 1.3B too
    assert b13["latents"].shape == (2, 16, 6, 90, 160)
    with pytest.raises(training.TrainingError, match="global batch"):
        training.abstract_train_inputs(MODEL, WORKLOAD, 0)
    with pytest.raises(training.TrainingError, match="hunyuan"):
        training.train_step("hunyuanvideo-small")


@pytest.mark.tpu_compiler
def test_train_step_compiles_for_v5p_with_splash_backward_kernels(step_and_args):
    """Batch and query sequence split, keys/values gathered: on TPU the backward is splash's own
    dq and dk/dv kernels (after the forward it recomputes for its residuals), and the dk/dv
    partial sums over the sequence axis are all-reduced."""
    _, step, args = step_and_args
    target = get_target("v5p-8")
    mesh = Mesh(np.array(target.devices()).reshape(2, 2), ("data", "seq"),
                axis_types=(AxisType.Auto,) * 2)
    n = len(jax.tree.leaves(args))
    layout = Layout(mesh_axes={"data": 2, "seq": 2}, in_specs=[None] * n,
                    attention={"*": AttentionLayout(batch=("data",), seq=("seq",))},
                    rules={"batch": ("data",), "seq": ("seq",)})
    hlo = realize(step, args, layout, mesh, donate_argnums=(0,)).compile().as_text()
    for kernel in ("splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"):
        assert kernel in hlo, kernel
    # per attention (self, cross): forward, dq, dk/dv; the backward reads the forward's
    # (out, lse) and does not run the forward again
    assert hlo.count('custom_call_target="tpu_custom_call"') == 2 * 3
    assert " all-reduce(" in hlo


def test_the_planners_compile_donates_the_state(step_and_args):
    """compile_layout (every compile of the planner, compare and check) donates a training step's
    state as plan.jit(..., donate_argnums=(0,)) runs it: the memory analysis aliases the whole
    state once instead of counting it as input and again as output."""
    from aoizora.planning.candidate_pricing import compile_layout
    from aoizora.extract.network import default_device_order

    _, step, args = step_and_args
    target = get_target("v5p-8")
    n = len(jax.tree.leaves(args))
    layout = Layout(mesh_axes={"data": 2, "seq": 2}, in_specs=[None] * n,
                    attention={"*": AttentionLayout(batch=("data",), seq=("seq",))},
                    rules={"batch": ("data",), "seq": ("seq",)})
    ev = compile_layout(step, args, target, layout, default_device_order(target, layout.mesh_axes))
    state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(args[0]))
    assert ev.memory.alias_bytes >= state_bytes          # replicated state: all of it per device
    assert ev.memory.total_bytes < ev.memory.argument_bytes + ev.memory.output_bytes \
        + ev.memory.temp_bytes
