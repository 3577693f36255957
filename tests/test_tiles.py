"""Splash tiles and compiler options: the kernel model, the tile choice, the plan file, and the
tiles and options reaching the compiled program."""

import dataclasses
import json

import jax
import numpy as np
import jax.numpy as jnp
import pytest

from aoizora.extract.aot_compile import CompileError
from aoizora.formulation.kernel_model import (KernelModelError, SplashShape, kernel_chip,
                                              splash_flops, splash_seconds, splash_vmem_bytes)
from aoizora.formulation.layout import AttentionLayout, Layout, tile_problems
from aoizora.plan_schema import validate_plan_json
from aoizora.plans import Plan, PlanError, load_plan, program_key
from aoizora.solvers.certificate import Certificate
from aoizora.kernels.tiles import (RECIPE_OPTIONS, AttentionShape, choose_compiler_options, choose_tiles,
                           tiled_layout)
from aoizora.extract.targets import get_target

V5E = kernel_chip("v5e", 1.97e14, 8.1e11, 1.5e9)
# Wan 2.1 1.3B 480p-21f self-attention, context parallel over 4: 12 heads, 2340 x 9360 per shard
SELF = SplashShape(12, 2340, 9360, 128)


# -- kernel model ------------------------------------------------------------------------------
def test_a_tile_that_pads_more_costs_more():
    # block_q 2344 pads 2340 queries to 2344; block_q 2048 pads them to 4096
    assert splash_seconds(SELF, 2048, 1024, 512, V5E) > 1.5 * splash_seconds(SELF, 2344, 1024,
                                                                          512, V5E)


def test_tiny_tiles_pay_the_per_step_overhead():
    small, big = splash_seconds(SELF, 128, 128, 128, V5E), splash_seconds(SELF, 1176, 1920, 640,
                                                                            V5E)
    steps = 12 * (2432 // 128) * (9472 // 128)
    assert small > steps * V5E.step_overhead_s           # the overhead alone
    assert small > 4 * big


def test_the_kernel_is_never_faster_than_the_peak():
    for t in ((128, 128, 128), (512, 1024, 512), (2344, 4736, 128)):
        assert splash_seconds(SELF, *t, V5E) >= splash_flops(SELF) / V5E.peak_flops


def test_a_partial_mxu_tile_costs_a_whole_one():
    # head_dim 64 on a 256-wide MXU (v6e) costs what head_dim 256 costs when MXU-bound
    v6e = kernel_chip("v6e", 9.2e14, 1.6e12, 1.75e9)
    s64, s256 = SplashShape(1, 4096, 4096, 64), SplashShape(1, 4096, 4096, 256)
    assert splash_seconds(s64, 512, 1024, 512, v6e) > 0.5 * splash_seconds(s256, 512, 1024, 512,
                                                                           v6e)


def test_vmem_grows_with_the_tiles_and_bad_input_is_refused():
    assert splash_vmem_bytes(SELF, 1024, 2048, 1024) > splash_vmem_bytes(SELF, 512, 2048, 1024)
    assert splash_vmem_bytes(SELF, 512, 4096, 512) > splash_vmem_bytes(SELF, 512, 2048, 512)
    with pytest.raises(KernelModelError, match="divide"):
        splash_seconds(SELF, 128, 512, 384, V5E)
    with pytest.raises(KernelModelError, match="generation"):
        kernel_chip("v9z", 1e14, 1e12, 1e9)


def test_a_kernel_keeping_its_log_sum_exp_needs_vmem_for_it():
    """libtpu 0.0.42.1, v6e:2x4, Wan 2.1 1.3B 480p-81f in a ring of 4 (a shard of 8208 queries
    over 8192 keys, 12 heads): tiles (2736, 2048, 2048) asked 32.50M of a 32.00M scoped limit."""
    shard = SplashShape(12, 8208, 8192, 128)
    plain = splash_vmem_bytes(shard, 2736, 2048, 2048)
    kept = splash_vmem_bytes(shard, 2736, 2048, 2048, residuals=True)
    assert kept - plain == 2 * 2736 * 128 * 4
    assert plain < 32 << 20 < kept and abs(kept / (32.50 * 2**20) - 1) < 0.01


def test_ring_tiles_fit_the_scoped_vmem_with_the_log_sum_exp():
    from aoizora.formulation.attention_tiles import best_tiles
    v6e = kernel_chip("v6e", 9.2e14, 1.6e12, 1.75e9)
    wan = AttentionShape(2, 12, 32768, 32768, 128)
    ring = best_tiles(wan, 2, 1, 4, True, v6e)
    gathered = best_tiles(wan, 2, 1, 4, False, v6e)
    trained = best_tiles(wan, 2, 1, 4, False, v6e, residuals=True)
    for c, kept in ((ring, True), (gathered, False), (trained, True)):
        shard = SplashShape(12, 8192, 8192 if c is ring else 32768, 128)
        assert splash_vmem_bytes(shard, c.block_q, c.block_kv, c.block_kv_compute,
                                 residuals=kept) <= 32 << 20
    assert (ring.block_q, ring.block_kv, ring.block_kv_compute) != (2736, 2048, 2048)


def test_a_head_dim_off_the_lanes_pays_one_relayout_of_q_k_v_and_the_output():
    from aoizora.formulation.attention_tiles import best_tiles, relayout_seconds, wrapper_seconds
    # STDiT3's spatial self-attention (16 heads of 72) and the same with heads of 128
    d72, d128 = AttentionShape(2, 16, 6528, 6528, 72), AttentionShape(2, 16, 6528, 6528, 128)
    assert relayout_seconds(d128, 1, 1, 8, False, V5E) == 0.0
    got = relayout_seconds(d72, 1, 1, 8, False, V5E)
    # q and the output one shard of 816 rows each, k and v gathered (6528 rows), read + written
    want = 2 * 2 * 32 * 72 * (2 * 816 + 2 * 6528) / V5E.hbm_Bps
    assert got == pytest.approx(want)
    assert relayout_seconds(d72, 1, 1, 8, True, V5E) == pytest.approx(
        2 * 2 * 32 * 72 * 4 * 816 / V5E.hbm_Bps)        # a ring keeps only its kv shard
    c = best_tiles(d72, 1, 1, 8, False, V5E)
    kernel = splash_seconds(SplashShape(32, 6528 // 8 if 6528 % (8 * c.block_q) == 0 else
                                        -(-6528 // (8 * c.block_q)) * c.block_q,
                                        -(-6528 // c.block_kv) * c.block_kv, 72),
                            c.block_q, c.block_kv, c.block_kv_compute, V5E)
    assert c.seconds == pytest.approx(kernel + wrapper_seconds(d72, 1, 1, 8, False, c.block_q,
                                                               c.block_kv, V5E))
    assert wrapper_seconds(d72, 1, 1, 8, False, c.block_q, c.block_kv, V5E) >= got


# -- tile choice -------------------------------------------------------------------------------
LAYOUT = Layout({"data": 2, "context": 4}, [],
                attention={"*": AttentionLayout(batch=("data",), seq=("context",))})
SHAPES = {"7": AttentionShape(2, 12, 9360, 9360, 128), "9": AttentionShape(2, 12, 9360, 512, 128)}


def test_chosen_tiles_are_valid_fit_and_beat_the_automatic_ones():
    tiled, chosen = tiled_layout(LAYOUT, SHAPES, get_target("v5e-8"))
    assert set(chosen) == {"7", "9"}
    for key, c in chosen.items():
        a = tiled.attention_for(key)
        assert not tile_problems(a.block_q, a.block_kv, a.block_kv_compute)
        assert (a.block_q, a.block_kv, a.block_kv_compute) == (c.block_q, c.block_kv,
                                                              c.block_kv_compute)
        assert c.vmem_bytes <= V5E.scoped_vmem_bytes
    auto = splash_seconds(SplashShape(12, 2432, 9472, 128), 128, 128, 128, V5E)
    assert chosen["7"].seconds < auto
    assert tiled_layout(LAYOUT, SHAPES, get_target("v5e-8"))[1] == chosen            # deterministic


def test_ring_and_ulysses_are_priced_at_their_own_shard_shapes():
    ring = dataclasses.replace(LAYOUT, attention={"*": AttentionLayout(
        batch=("data",), seq=("context",), kv="ring")})
    uly = dataclasses.replace(LAYOUT, attention={"*": AttentionLayout(
        batch=("data",), heads=("context",))})
    g = tiled_layout(LAYOUT, SHAPES, get_target("v5e-8"))[1]["9"].seconds
    r = tiled_layout(ring, SHAPES, get_target("v5e-8"))[1]["9"].seconds
    u = tiled_layout(uly, SHAPES, get_target("v5e-8"))[1]["9"].seconds
    # cross-attention over 512 keys in a ring: 4 calls on 128-key chunks
    assert r > g and u != g


def test_a_vmem_verdict_makes_the_choice_again_smaller():
    seen = []

    def check(layout):
        seen.append(layout.attention_for("7"))
        if len(seen) == 1:
            raise CompileError("XLA cannot compile f for v5e:2x4: a kernel's on-chip VMEM "
                               "overflows (not HBM; e.g. a Pallas kernel's block sizes)")

    got = choose_tiles(LAYOUT, SHAPES, get_target("v5e-8"), check=check)
    assert len(seen) == 2 and got.attention_for("7") == seen[1]
    vm = lambda a: splash_vmem_bytes(SplashShape(12, 2432, 9472, 128), a.block_q,  # noqa: E731
                                     a.block_kv, a.block_kv_compute)
    assert vm(seen[1]) <= 0.75 * V5E.scoped_vmem_bytes < vm(seen[0])


def test_no_tiles_when_nothing_compiles_and_other_errors_propagate():
    def vmem(layout):
        raise CompileError("a kernel's on-chip SMEM overflows")

    assert choose_tiles(LAYOUT, SHAPES, get_target("v5e-8"), check=vmem, retries=1) is LAYOUT

    def other(layout):
        raise CompileError("XLA cannot compile f: INVALID_ARGUMENT")

    with pytest.raises(CompileError, match="INVALID_ARGUMENT"):
        choose_tiles(LAYOUT, SHAPES, get_target("v5e-8"), check=other)


def test_compiler_options_are_kept_only_when_they_price_lower():
    price = lambda L: 1.0 if L.compiler_options else 2.0                 # noqa: E731
    got, prices = choose_compiler_options(LAYOUT, price)
    assert got.compiler_options == RECIPE_OPTIONS and prices == {"default_s": 2.0,
                                                                 "recipe_s": 1.0}
    got, _ = choose_compiler_options(LAYOUT, lambda L: 3.0 if L.compiler_options else 2.0)
    assert got.compiler_options == {}


# -- plan file ---------------------------------------------------------------------------------
def _f(x, w):
    return jnp.tanh(x @ w)


ARGS = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 4), jnp.float32))


def _plan(attention=None, options=None):
    layout = Layout({"x": 2, "y": 4}, [("x", None), (None, "y")], [("x", "y")],
                    attention=attention or {"*": AttentionLayout(
                        heads=("y",), block_q=256, block_kv=512, block_kv_compute=256)},
                    compiler_options=dict(RECIPE_OPTIONS) if options is None else options)
    return Plan(key=program_key(_f, ARGS, "v5e:2x4"), target="v5e:2x4", layout=layout,
                device_order=[0, 1, 3, 2, 4, 5, 7, 6],
                device_coords=[(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (1, 2), (1, 3), (0, 3)],
                predicted={"step_s": 1e-3, "compute_s": 8e-4, "communication_s": 2e-4},
                certificates={"placement": Certificate("CP-SAT", "OPTIMAL", 2e-4, 2e-4, 0.1)})


def test_plan_json_round_trips_tiles_and_options(tmp_path):
    p = _plan()
    path = tmp_path / "plan.json"
    p.save(str(path))
    d = json.loads(path.read_text())
    assert d["layout"]["attention"]["*"]["block_q"] == 256
    assert d["layout"]["compiler_options"] == RECIPE_OPTIONS
    q = load_plan(str(path))
    assert q.layout.attention["*"].tiles == {"block_q": 256, "block_kv": 512,
                                             "block_kv_compute": 256}
    assert q.layout.compiler_options == RECIPE_OPTIONS and q.to_json() == p.to_json()
    # a layout without tiles or options writes neither (older plan files read the same)
    plain = _plan({"*": AttentionLayout(heads=("y",))}, {}).to_json()["layout"]
    assert "compiler_options" not in plain and "block_q" not in plain["attention"]["*"]


@pytest.mark.parametrize("tiles,match", [
    ({"block_kv": 100}, "block_kv 100 is not a positive multiple of 128"),
    ({"block_q": 0}, "block_q"),
    ({"block_q": 12}, "block_q 12 is not a positive multiple of 8"),
    ({"block_kv": 512, "block_kv_compute": 384}, "does not divide block_kv 512"),
    ({"block_q": "256"}, "block_q"),
])
def test_schema_rejects_bad_tiles(tiles, match):
    d = _plan().to_json()
    d["layout"]["attention"]["*"] = {"heads": ["y"], **tiles}
    with pytest.raises(PlanError, match=match):
        validate_plan_json(d)


def test_schema_rejects_bad_compiler_options():
    d = _plan().to_json()
    d["layout"]["compiler_options"] = {"xla_tpu_enable_async_collective_fusion": [True]}
    with pytest.raises(PlanError, match="compiler option"):
        validate_plan_json(d)
    d["layout"]["compiler_options"] = {"enable_something": True}
    with pytest.raises(PlanError, match="compiler_options"):
        validate_plan_json(d)


def test_a_layout_with_bad_tiles_is_refused_before_compiling():
    from aoizora.kernels.attention_kernels import AttentionLayoutError, check_layout

    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    with pytest.raises(AttentionLayoutError, match="block_kv 200"):
        check_layout((2, 4, 256, 32), (2, 4, 256, 32), AttentionLayout(block_kv=200), mesh)


# -- compiled ------------------------------------------------------------------------------------
@pytest.mark.tpu_compiler
def test_a_non_default_tile_reaches_the_compiled_kernel_and_q2():
    """block_q 256 / block_kv 512 / block_kv_compute 256 appear in the compiled splash kernel's
    metadata (the evidence reads them) and Q2 prices the two tile choices differently."""
    from aoizora.extract.aot_compile import compile_evidence, target_mesh
    from aoizora.extract.network import Network
    from aoizora.extract.targets import get_target
    from aoizora.formulation.op_time import op_seconds
    from aoizora.kernels.attention_kernels import sharded_attention

    mesh = target_mesh(get_target("v5e-8"), {"x": 2, "y": 4}, platform="tpu")
    q = jax.ShapeDtypeStruct((2, 4, 4096, 128), jnp.bfloat16)
    net = Network.from_target(get_target("v5e-8"))
    got = {}
    for tiles in ({}, {"block_q": 256, "block_kv": 512, "block_kv_compute": 256}):
        al = AttentionLayout(batch=("x",), seq=("y",), **tiles)

        def f(q, k, v, al=al):
            return sharded_attention(q, k, v, layout=al, mesh=mesh, scale=0.1, impl="splash")

        ev = compile_evidence(f, (q, q, q), mesh=mesh, target=get_target("v5e-8"))
        (op,) = [o for o in ev.compute if o.kernel]
        got[bool(tiles)] = (op.kernel, op_seconds(op, ev, net))
    assert got[False][0]["block_q"] == 128 and got[False][0]["block_kv"] == 128
    assert {k: got[True][0][k] for k in ("block_q", "block_kv", "block_kv_compute")} == {
        "block_q": 256, "block_kv": 512, "block_kv_compute": 256}
    assert got[True][0]["lead"] == 4 and got[True][0]["lq"] == 1024 and got[True][0]["lkv"] == 4096
    assert got[True][1] < got[False][1]


@pytest.mark.tpu_compiler
def test_realized_layouts_compile_with_their_options():
    """A layout's compiler options reach libtpu: an unknown flag fails the compile, the recipe's
    flags compile; on a CPU mesh they are left out."""
    from aoizora.extract.aot_compile import target_mesh
    from aoizora.runtime.realize import realize

    mesh = target_mesh(get_target("v5e-8"), {"x": 2, "y": 4}, platform="tpu")
    base = Layout({"x": 2, "y": 4}, [("x", None), (None, "y")])
    ok = realize(_f, ARGS, dataclasses.replace(base, compiler_options=dict(RECIPE_OPTIONS)), mesh)
    assert ok.compiler_options == RECIPE_OPTIONS
    ok.compile()
    bad = realize(_f, ARGS, dataclasses.replace(
        base, compiler_options={"xla_tpu_no_such_option_zz": True}), mesh)
    with pytest.raises(Exception, match="xla_tpu_no_such_option_zz"):
        bad.compile()
    with pytest.raises(Exception, match="xla_tpu_no_such_option_zz"):
        bad.runner().lower(*bad.args).compile()
    cpu = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("x", "y"),
                            axis_types=(jax.sharding.AxisType.Auto,) * 2)
    assert realize(_f, ARGS, bad.layout, cpu).compiler_options == {}


def test_plan_jit_runs_a_plan_with_tiles_and_options_on_cpu():


    p = _plan()
    mesh = p.make_mesh(jax.devices())
    x, w = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    out = p.jit(_f, mesh)(x, w)
    assert np.allclose(np.asarray(out), np.tanh(16.0))


def test_published_tiles_are_scaled_to_the_shard_lengths():
    from aoizora.kernels.recipes import MAXDIFFUSION_TILES, published_tiles

    # long shards: the published tiles where they divide, else the largest that divides
    assert published_tiles(3024 * 4, 2048 * 6) == MAXDIFFUSION_TILES
    assert published_tiles(2432, 9728) == {"block_q": 2432, "block_kv": 512,
                                           "block_kv_compute": 512}
    # shorter than a tile and divisible by none: one block rounded up (the wrapper pads)
    assert published_tiles(100, 60) == {"block_q": 104, "block_kv": 128, "block_kv_compute": 128}
    for lq, lkv in ((2432, 9728), (100, 60), (19000, 76032)):
        t = published_tiles(lq, lkv)
        assert not tile_problems(t["block_q"], t["block_kv"], t["block_kv_compute"])


def test_published_tiles_shrink_to_the_scoped_vmem():
    from aoizora.kernels.recipes import published_tiles

    # Wan 2.1 1.3B 480p-81f, context 4: 2048 / 2048 / 1024 needs 21.33M of v5e's 16M (libtpu)
    assert published_tiles(8192, 32768) == {"block_q": 2048, "block_kv": 2048,
                                            "block_kv_compute": 1024}
    t = published_tiles(8192, 32768, 16 << 20)
    assert t == {"block_q": 1024, "block_kv": 2048, "block_kv_compute": 1024}
    assert splash_vmem_bytes(SplashShape(1, 8192, 32768, 128), *t.values()) <= 16 << 20
