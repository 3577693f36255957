"""The reference simulator: flow engine, collective expansion, schedule walk, and the scaling book's
worked v5e timings (JAX scaling book, chapter 'sharding'; shared/facts/tpu.md)."""

import numpy as np
import pytest

from aoizora.extract.evidence import Collective, ComputeOp, Evidence
from aoizora.extract.network import Network
from aoizora.extract.targets import libtpu_available
from benchmarks.sim.engine import EngineError, FlowEngine, maxmin_rates
from benchmarks.simulator import LABEL, Simulator, SimulatorError, simulate
from aoizora.extract.targets import get_target

W = 4.5e10          # v5e one-way link bandwidth, B/s
LAT = 1e-6          # per hop, s


# --------------------------------------------------------------------------- flow engine
def test_maxmin_classic():
    # flow 0 crosses links 0 and 1; flow 1 only link 0; flow 2 only link 1: all get half
    r = maxmin_rates(np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1]), 3, np.array([1.0, 1.0]))
    assert np.allclose(r, 0.5)
    # link 1 is wide: flow 0 is held by link 0 only, shared with flow 1
    r = maxmin_rates(np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1]), 3, np.array([1.0, 10.0]))
    assert np.allclose(r, [0.5, 0.5, 9.5])


def test_engine_sharing_latency_and_dependencies():
    e = FlowEngine([1.0, 1.0])
    e.add([1.0], [[0, 1]], [0.5], 0.0, tag=0)
    assert e.run_until_tag(0) == pytest.approx(1.5)            # b / W + hops x latency
    e = FlowEngine([1.0])
    e.add([1.0, 2.0], [[0], [0]], [0.0, 0.0], 0.0, tag=0)
    assert e.run_until_tag(0) == pytest.approx(3.0)            # fair: both at 1/2, then 1
    assert e.finish[:2] == pytest.approx([2.0, 3.0])
    e = FlowEngine([1.0])
    e.add([1.0, 1.0], [[0], [0]], [0.1, 0.1], 0.0, tag=0, deps=[[], [0]])
    assert e.run_until_tag(0) == pytest.approx(2.2)            # the second waits for the first
    e = FlowEngine([1.0])
    e.add([1.0], [[0]], [0.0], 0.0, tag=0)
    e.add([1.0], [[0]], [0.0], 0.5, tag=1)                     # released half way
    assert e.run_until_tag(1) == pytest.approx(2.0)
    assert e.tag_finish[0] == pytest.approx(1.5)
    with pytest.raises(EngineError):
        e.add([1.0], [[5]], [0.0], 3.0, tag=2)


# --------------------------------------------------------------------------- helpers
def _ev(target, mesh, colls, compute=()):
    return Evidence(target=target, mesh_axes=mesh, collectives=list(colls), compute=list(compute),
                    clock_hz=1.5e9)


def _ag(name, groups, V, **kw):
    return Collective(name, "all-gather", "bf16", int(V), groups, **kw)


# --------------------------------------------------------------------------- collectives
ARRAY_BYTES = 2048 * 8192 * 2


def test_line_ring_matches_the_book_count():
    # Y=4 line on v5e:8x4 (the x=0 column, devices 0, 8, 16, 24): 3 steps of V/4 one way
    from benchmarks.simulator import simulate_collective
    one = simulate_collective(_ag("y", [[0, 1, 2, 3]], ARRAY_BYTES), [0, 8, 16, 24], "v5e:8x4")
    assert one == pytest.approx(3 * ARRAY_BYTES / 4 / W, rel=0.03)


# --------------------------------------------------------------------------- compute model
def test_splash_tiles_change_the_time_and_mask_density_scales_it():
    from benchmarks.sim.kernel_model import splash_time_s
    base = splash_time_s("v5e", 8192, 8192, 8, 128, 1, 512, 512)
    small = splash_time_s("v5e", 8192, 8192, 8, 128, 1, 128, 128)
    half = splash_time_s("v5e", 8192, 8192, 8, 128, 1, 512, 512, mask_density=0.5)
    assert small > 1.5 * base            # 16x the grid steps, each paying the step overhead
    assert 0.4 * base < half < 0.75 * base
    # head_dim 64 pads to the 128-wide MXU: the matmul time does not halve
    d64 = splash_time_s("v5e", 8192, 8192, 8, 64, 1, 512, 512)
    assert d64 > 0.6 * base
    with pytest.raises(ValueError):
        splash_time_s("v5e", 8192, 8192, 8, 128, 1, 512, 512, mask_density=0.0)
    with pytest.raises(ValueError):
        splash_time_s("v9", 8192, 8192, 8, 128, 1, 512, 512)


def test_kernel_time_bounds_and_megacore_split():
    from benchmarks.sim.constants import GRID_STEP_OVERHEAD_S, chip_model
    from benchmarks.sim.kernel_model import StepWork, kernel_time
    v5p = chip_model("v5p")
    w = StepWork(mxu_flops=1e9)
    one = kernel_time(v5p, 100, w, parallel_split=False)
    two = kernel_time(v5p, 100, w, parallel_split=True)
    assert one.bound == "mxu" and two.seconds < 0.6 * one.seconds
    tiny = kernel_time(v5p, 100, StepWork(mxu_flops=1.0), parallel_split=False)
    assert tiny.bound == "overhead" and tiny.step_s == pytest.approx(GRID_STEP_OVERHEAD_S, rel=1e-3)


def test_gated_kernel_time_prices_skipped_steps_apart():
    from benchmarks.sim.constants import GRID_STEP_OVERHEAD_S, OP_LAUNCH_S, chip_model
    from benchmarks.sim.kernel_model import StepWork, gated_kernel_time, kernel_time
    v5p = chip_model("v5p")
    run, skip = StepWork(mxu_flops=1e9, first_bytes=1e6), StepWork(dma_bytes=1e5)
    assert gated_kernel_time(v5p, 100, 100, run, skip, True).seconds == pytest.approx(
        kernel_time(v5p, 100, run, True).seconds)
    none = gated_kernel_time(v5p, 100, 0, run, skip, False)
    per_skip = 1e5 / v5p.core_hbm_Bps + GRID_STEP_OVERHEAD_S
    assert none.seconds == pytest.approx(OP_LAUNCH_S + 1e6 / v5p.core_hbm_Bps + 100 * per_skip)
    quarter = gated_kernel_time(v5p, 100, 25, run, skip, False).seconds
    assert none.seconds < quarter < kernel_time(v5p, 100, run, False).seconds


@pytest.mark.skipif(not libtpu_available(), reason="needs libtpu")
def test_pallas_grid_read_from_the_compiled_kernel_prices_blocks():
    import functools as ft
    import jax
    import jax.numpy as jnp
    from aoizora.extract.hlo import parse_hlo_module
    from benchmarks.sim.constants import chip_model
    from benchmarks.sim.hlo_cost import compute_seconds_by_name
    from benchmarks.sim.mosaic import parse_kernel
    from benchmarks.simulator_validation import pallas_matmul_program, single_device_mesh
    from jax.sharding import NamedSharding, PartitionSpec as P

    times = {}
    for b in (128, 256):
        fn, shapes, target, _, _ = pallas_matmul_program(1024, b, b, b)
        mesh = single_device_mesh(target)
        args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, P()))
                for s, _ in shapes]
        with jax.set_mesh(mesh):
            text = jax.jit(fn).lower(*args).compile().as_text()
        mod = parse_hlo_module(text)
        ins = next(i for c in mod.computations.values() for i in c.instructions
                   if i.opcode == "custom-call" and i.custom_call_target == "tpu_custom_call")
        k = parse_kernel(ins)
        n = 1024 // b
        assert k.grid == (n, n, n) and k.matmuls == [(b, b, b)]
        assert [w.copies(k.grid) for w in k.windows] == [n ** 3, n ** 3, n * n]
        assert [w.item_bytes for w in k.windows] == [2, 2, 2]
        times[b] = compute_seconds_by_name(mod, chip_model("v5e"))[0][ins.name]
    assert times[128] > 3 * times[256]          # 8x the steps, each paying the step overhead



def _tiny_splash_grad_module(fused: bool):
    """jit(grad(sum(splash))) of a tiny local-window splash attention on one v5p chip (2 heads,
    T=2048, head_dim 128, blocks 256, window 256: each q block row keeps 2 of 8 kv blocks)."""
    import jax
    import jax.numpy as jnp
    from aoizora.extract.hlo import parse_hlo_module
    from benchmarks.simulator_validation import single_device_mesh
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as sk, splash_attention_mask as sm)
    from jax.sharding import NamedSharding, PartitionSpec as P

    heads, t, b = 2, 2048, 256
    extra = dict(use_fused_bwd_kernel=True) if fused else dict(block_q_dq=b, block_kv_dq=b)
    sizes = sk.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
                          block_kv_dkv=b, block_kv_dkv_compute=b, **extra)
    kern = sk.make_splash_mha(sm.MultiHeadMask([sm.LocalMask((t, t), (b, 0), 0)] * heads),
                              block_sizes=sizes, head_shards=1, q_seq_shards=1)

    def g(q, k, v):
        return jax.grad(lambda *a: kern(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)
    mesh = single_device_mesh("v5p:2x2x1")
    args = [jax.ShapeDtypeStruct((heads, t, 128), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
            for _ in range(3)]
    with jax.set_mesh(mesh):
        return parse_hlo_module(jax.jit(g).lower(*args).compile().as_text())


def test_fused_splash_backward_runs_its_compute_only_on_the_blocks_the_mask_keeps():
    """The fused dk/dv kernel walks every (kv block, q block) pair but computes on the 2 of 8 per
    row the mask keeps: its gated compute is priced on that fraction of the steps (taken from the
    forward kernel's shrunk grid), its skipped steps pay their copies and the step overhead. The
    separate dq and dk/dv kernels (shrunk grids) and the forward are priced as before."""
    from benchmarks.sim.constants import chip_model
    from benchmarks.sim.hlo_cost import HloCoster
    from benchmarks.sim.mosaic import parse_kernel

    chip = chip_model("v5p")
    priced = {}
    for fused in (True, False):
        mod = _tiny_splash_grad_module(fused)
        c = HloCoster(mod, chip)
        for comp in mod.computations.values():
            for ins in comp.instructions:
                if ins.opcode != "custom-call" or ins.custom_call_target != "tpu_custom_call":
                    continue
                k = parse_kernel(ins)
                role = next(r for r in ("fwd", "dkv", "dq") if f"splash_mha_{r}" in k.name)
                run = c._splash_bwd_run_fraction(ins, comp, k)
                every = HloCoster(mod, chip)
                every._splash_bwd_run_fraction = lambda *a: 1.0   # gated work on every step
                priced[fused, role] = (k, run, c.seconds(ins, comp), every.seconds(ins, comp))
    k, run, sec, every_step = priced[True, "dkv"]
    assert k.grid[-1] == 8 and len(k.gated_matmuls) == 5          # s, dv, dp, dk and dq
    assert k.gated_vpu_ops >= 256 * 256 and k.gated_eup_ops == 256 * 256
    assert [w.data_dependent for w in k.windows][0]                # q follows the block table
    assert run == pytest.approx(2 / 8)
    assert sec < 0.7 * every_step                                  # 3 in 4 steps skip the body
    for role in ("dkv", "dq"):
        _, run, sec, every_step = priced[False, role]
        assert run == 1.0 and sec == every_step                    # shrunk grids: every step runs
    assert priced[True, "fwd"][2] == priced[False, "fwd"][2]       # the forward is not changed

# --------------------------------------------------------------------------- behaviour
def test_concurrent_collectives_sharing_links_take_longer():
    # v5e-8 (2x4, device d at (d % 2, d // 2)). A: all-gather along the x=0 column (ranks 0,2,4,6);
    # B: a permute from (0,0) to (0,3), routed over the same column.
    V = 64e6
    a = _ag("A", [[0, 2, 4, 6]], V, is_async=True, phase=0)
    b = Collective("B", "collective-permute", "bf16", int(V), [[0, 6]],
                   source_target_pairs=[(0, 6)], is_async=True, phase=0)
    mesh = {"x": 8}
    t_a = simulate(_ev("v5e:2x4", mesh, [a])).step_s
    t_b = simulate(_ev("v5e:2x4", mesh, [b])).step_s
    both = simulate(_ev("v5e:2x4", mesh, [a, b]))
    assert both.step_s > max(t_a, t_b) * 1.1
    # in different phases they run one after the other
    b2 = Collective("B", "collective-permute", "bf16", int(V), [[0, 6]],
                    source_target_pairs=[(0, 6)], is_async=True, phase=1)
    assert simulate(_ev("v5e:2x4", mesh, [a, b2])).step_s == pytest.approx(t_a + t_b, rel=1e-6)
    # a collective on disjoint links (the x=1 column) does not slow A down
    c = _ag("C", [[1, 3, 5, 7]], V, is_async=True, phase=0)
    assert simulate(_ev("v5e:2x4", mesh, [a, c])).step_s == pytest.approx(t_a, rel=1e-6)


def test_async_collective_hidden_behind_compute_adds_nothing():
    V = 8e6
    clock = 1.5e9
    alone = simulate(_ev("v5e:2x4", {"x": 8}, [_ag("g", [list(range(8))], V)])).step_s
    cycles = 2 * alone * clock
    # phases (no schedule positions)
    ev = _ev("v5e:2x4", {"x": 8},
             [_ag("g", [list(range(8))], V, is_async=True, overlap_cycles=cycles)],
             [ComputeOp("mlp", "fusion", cycles)])
    r = simulate(ev)
    assert r.step_s == pytest.approx(r.compute_s)
    assert r.communication_s == pytest.approx(0.0, abs=1e-12)
    assert r.compute_s == pytest.approx(cycles / clock)
    # schedule positions: start at 1, the compute at 2, done at 3
    ev = _ev("v5e:2x4", {"x": 8},
             [_ag("g", [list(range(8))], V, is_async=True, start_index=1, done_index=3)],
             [ComputeOp("mlp", "fusion", cycles, index=2)])
    r = simulate(ev)
    assert r.communication_s == pytest.approx(0.0, abs=1e-12)
    # too little compute: the rest is exposed
    ev = _ev("v5e:2x4", {"x": 8},
             [_ag("g", [list(range(8))], V, is_async=True, start_index=1, done_index=3)],
             [ComputeOp("mlp", "fusion", cycles / 8, index=2)])
    r = simulate(ev)
    assert r.communication_s == pytest.approx(alone - cycles / 8 / clock, rel=1e-6)
    # a sync collective blocks: compute + collective
    ev = _ev("v5e:2x4", {"x": 8}, [_ag("g", [list(range(8))], V, start_index=1, done_index=1)],
             [ComputeOp("mlp", "fusion", cycles, index=2)])
    r = simulate(ev)
    assert r.step_s == pytest.approx(cycles / clock + alone, rel=1e-6)


def test_placement_changes_a_collective_not_physically_adjacent():
    # 4 ranks of an 8-rank mesh all-gather. Identity placement: devices 0..3 = the 2x2 block
    # (0,0),(1,0),(0,1),(1,1), a closed physical cycle (bidirectional ring). Scattered: devices
    # 0,3,4,7 = (0,0),(1,1),(0,2),(1,3): no two adjacent; its routed ring cannot run both ways
    # without contention, so it runs one way: twice the block's time.
    V = 32e6
    ev = _ev("v5e:2x4", {"x": 8}, [_ag("g", [[0, 1, 2, 3]], V)])
    block = simulate(ev, list(range(8)))
    scattered = simulate(ev, [0, 3, 4, 7, 1, 2, 5, 6])
    line = simulate(ev, [0, 2, 4, 6, 1, 3, 5, 7])              # the x=0 column: a line
    assert block.collectives[0].algorithm == "bidirectional ring"
    assert line.collectives[0].algorithm == "unidirectional ring"
    assert scattered.collectives[0].algorithm == "unidirectional ring"
    assert block.step_s * 1.9 < line.step_s
    assert block.step_s * 1.9 < scattered.step_s
    assert block.step_s == pytest.approx(3 * V / 8 / W, rel=0.03)
    assert line.step_s == pytest.approx(3 * V / 4 / W, rel=0.03)


def test_loops_multiply_the_body_and_results_are_labelled():
    V = 4e6
    one = simulate(_ev("v5e:2x2", {"x": 4}, [_ag("g", [[0, 1, 2, 3]], V)],
                       [ComputeOp("f", "fusion", 1.5e6)]))
    ev = _ev("v5e:2x2", {"x": 4}, [_ag("g", [[0, 1, 2, 3]], V, count=30)],
             [ComputeOp("f", "fusion", 1.5e6, count=30), ComputeOp("head", "fusion", 3e6)])
    r = simulate(ev)
    assert r.step_s == pytest.approx(30 * one.step_s + 3e6 / 1.5e9, rel=1e-9)
    assert r.compute_s == pytest.approx(30 * 1e-3 + 2e-3)
    assert r.label == LABEL == "simulated (AoiZora reference simulator)"
    assert r.collectives[0].total_exposed_s == pytest.approx(30 * r.collectives[0].exposed_s)
    assert r.busiest_links and r.busiest_links[0].busy_s > 0
    assert {lp["count"] for lp in r.loops} == {1, 30}


def test_compute_roofline_where_the_compiler_gave_no_estimate():
    sim = Simulator("v5e:2x2")
    op = ComputeOp("splash", "custom-call", None, flops=1.97e14, bytes=8.1e12)
    assert sim.compute_seconds(op, 1.5e9) == pytest.approx(10.0)      # bytes-bound: 8.1e12 / 8.1e11
    op = ComputeOp("mm", "fusion", None, flops=3.94e14, bytes=0.0)
    assert sim.compute_seconds(op, 1.5e9) == pytest.approx(2.0)       # flops-bound


def test_all_to_all_and_permute_and_bad_placements():
    V = 16e6
    ev = _ev("v5e:2x2", {"x": 4}, [Collective("a2a", "all-to-all", "bf16", int(V), [[0, 1, 2, 3]])])
    r = simulate(ev)
    # 2x2 block: each chip sends V/4 to each of 3 others; the diagonal goes over 2 hops, so the
    # busiest link carries 2 x V/4 -> at least V / (2W)
    assert r.step_s >= V / 2 / W
    assert r.collectives[0].algorithm == "pairwise"
    with pytest.raises(SimulatorError):
        simulate(ev, [0, 1, 2, 2])
    with pytest.raises(SimulatorError):
        simulate(ev, [0, 1, 2])
    with pytest.raises(SimulatorError):
        Simulator("v5e:2x4").run(ev)


def test_multiple_groups_share_links_when_placed_across_each_other():
    # two groups of 2 on a 1x4 line-like column: {0,2} and {1,3} crossing vs {0,1} and {2,3}
    net = Network((1, 4), (False, False), W, LAT)
    sim = Simulator("v5e:2x2", network=net)
    V = 16e6
    near = Evidence(target="", mesh_axes={"x": 4},
                    collectives=[_ag("g", [[0, 1], [2, 3]], V)])
    crossing = Evidence(target="", mesh_axes={"x": 4},
                        collectives=[_ag("g", [[0, 2], [1, 3]], V)])
    assert sim.run(crossing).step_s > sim.run(near).step_s


def test_episode_cache_gives_the_same_answer_across_placements():
    ev = _ev("v5e:2x4", {"x": 8},
             [_ag("a", [[0, 1, 2, 3], [4, 5, 6, 7]], 16e6, is_async=True, start_index=1,
                  done_index=3),
              Collective("p", "collective-permute", "bf16", int(8e6), [list(range(8))],
                         source_target_pairs=[(i, (i + 1) % 8) for i in range(8)],
                         is_async=True, start_index=2, done_index=4)],
             [ComputeOp("f", "fusion", 1e5, index=2)])
    sim = Simulator("v5e:2x4")
    p1, p2 = list(range(8)), [0, 3, 4, 7, 1, 2, 5, 6]
    a = sim.run(ev, p1).to_json()
    b = sim.run(ev, p2).to_json()
    fresh = Simulator("v5e:2x4")
    assert fresh.run(ev, p2).to_json() == b
    assert sim.run(ev, p1).to_json() == a
    assert a["step_s"] != b["step_s"]


def test_devices_sharing_a_chip_exchange_without_links():
    # v4: two devices per chip; a group of the two devices of one chip moves nothing over ICI
    ev = Evidence(target="v4-8", mesh_axes={"x": 8}, clock_hz=1.05e9,
                  collectives=[_ag("g", [[0, 1], [2, 3], [4, 5], [6, 7]], 32e6)])
    r = simulate(ev)
    assert r.step_s == 0.0 and r.busiest_links == []


def test_result_round_trips_through_json():
    import json
    from benchmarks.simulator import SimResult
    r = simulate(_ev("v5e:2x2", {"x": 4}, [_ag("g", [[0, 1, 2, 3]], 4e6, count=3)]))
    again = SimResult.from_json(json.loads(json.dumps(r.to_json())))
    assert again == r


@pytest.mark.tpu_compiler
def test_real_compiler_output_scanned_mlp_gradient():
    # XLA:TPU evidence of a 4-layer scanned MLP gradient on v5e-8: schedule positions, a loop,
    # async collectives fused with compute.
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from aoizora.extract.aot_compile import compile_evidence, target_mesh

    mesh = target_mesh(get_target("v5e:2x4"), {"d": 2, "m": 4})

    def sds(shape, spec):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=NamedSharding(mesh, P(*spec)))

    def layer(x, w):
        wq, wo = w
        return x + jax.nn.gelu(x @ wq) @ wo, None

    def loss(x, wq, wo):
        return jax.lax.scan(layer, x, (wq, wo))[0].sum()

    w = (None, "m", None)
    ev = compile_evidence(jax.grad(loss, argnums=(1, 2)),
                          [sds((1024, 512), ("d", None)), sds((4, 512, 512), w),
                           sds((4, 512, 512), w)], mesh=mesh, target=get_target("v5e-8"))
    assert ev.collectives and ev.compute
    order = [int(d) for d in range(8)]
    r = simulate(ev, order)
    assert r.schedule == "positions"
    assert 4 in {lp["count"] for lp in r.loops}
    assert r.step_s >= r.compute_s > 0
    for c, e in zip(r.collectives, ev.collectives):
        if any(len(g) > 1 for g in e.replica_groups) or e.source_target_pairs:
            assert c.time_s > 0 and c.algorithm not in ("", "none"), c
    total = sum(lp["count"] * lp["body_s"] for lp in r.loops)
    assert r.step_s == pytest.approx(total)
    hidden = [c for c in r.collectives if c.is_async and c.exposed_s < c.time_s]
    assert hidden, "an async collective overlapped no compute"


def test_default_placement_is_the_compiled_device_order():
    ev = _ev("v5e:2x4", {"x": 8}, [_ag("g", [[0, 1, 2, 3]], 32e6)])
    ev.algorithms_device_order = [0, 3, 4, 7, 1, 2, 5, 6]      # device ids (= positions on v5e)
    r = simulate(ev)
    assert r.placement == ev.algorithms_device_order
    assert r.step_s == simulate(ev, ev.algorithms_device_order).step_s
    assert r.step_s != simulate(ev, list(range(8))).step_s


def test_command_line_prints_the_labelled_summary(tmp_path, capsys):
    from benchmarks.simulator import main
    ev = _ev("v5e:2x2", {"x": 4}, [_ag("g", [[0, 1, 2, 3]], 4e6, count=3)])
    path = tmp_path / "ev.json"
    path.write_text(ev.dumps())
    assert main([str(path), "--placement", "0,1,3,2"]) == 0
    out = capsys.readouterr().out
    assert LABEL in out and "step" in out and "placement [0, 1, 3, 2]" in out


def test_kernel_flops_price_an_opaque_kernel_the_evidence_left_blind():
    ev = _ev("v5e:2x2", {"x": 4}, [], [ComputeOp("splash", "custom-call", None, bytes=8.1e8,
                                                 custom_call_target="tpu_custom_call")])
    r = simulate(ev)
    assert r.compute_s == pytest.approx(1e-3) and any("opaque" in n for n in r.notes)
    r = simulate(ev, kernel_flops={"splash": 1.97e12})
    assert r.compute_s == pytest.approx(1e-2) and not any("opaque" in n for n in r.notes)


# --------------------------------------------------------------------------- own topology
def _sim_net(shape, wrap=None):
    import itertools
    from benchmarks.sim.topology import SimNetwork
    coords = [tuple(reversed(c)) for c in itertools.product(*[range(s) for s in reversed(shape)])]
    return SimNetwork(shape, wrap or (False,) * len(shape), coords, W, LAT)


def test_own_rings_close_on_even_boxes_and_bend_along_lines():
    for shape, kind in (((2, 4), "ring"), ((4, 4), "ring"), ((3, 3), "line"),
                        ((2, 2, 2), "ring"), ((3, 4), "ring")):
        net = _sim_net(shape)
        r = net.ring_through(range(len(net.chips)))
        assert r.kind == kind, shape
        steps = [net.hops(a, b) for a, b in zip(r.order, r.order[1:])]
        assert steps == [1] * (len(r.order) - 1)
        assert (net.hops(r.order[-1], r.order[0]) == 1) == (kind == "ring")
    net = _sim_net((2, 4))
    ell = [net.chip_index[c] for c in ((1, 0), (0, 0), (0, 1), (0, 2))]
    r = net.ring_through(ell)
    assert r.kind == "line" and net.ring_directions(r) == 1
    used = {lid for step in net.ring_step_routes(r) for lid in step}
    assert len(used) == 6                       # the closing step travels back along the L
    # a full wrapped axis closes; the same chips without wraparound form a line
    assert _sim_net((16, 1), (True, False)).ring_through(range(16)).kind == "ring"
    assert _sim_net((16, 1)).ring_through(range(16)).kind == "line"


def test_scattered_tour_is_shortest_and_routes_follow_dimension_order():
    net = _sim_net((4, 4))
    scattered = [net.chip_index[c] for c in ((0, 0), (2, 0), (0, 2), (2, 2))]
    r = net.ring_through(scattered)
    assert r.kind == "scattered"
    assert sum(net.hops(r.order[i], r.order[(i + 1) % 4]) for i in range(4)) == 8
    a, b = net.chip_index[(0, 0)], net.chip_index[(2, 1)]
    hops = [(net.chips[int(net.link_src[l])], net.chips[int(net.link_dst[l])])
            for l in net.route(a, b)]
    assert hops == [((0, 0), (1, 0)), ((1, 0), (2, 0)), ((2, 0), (2, 1))]
    with pytest.raises(ValueError):
        net.ring_through([0, 99])


def test_validation_summary_leaves_fitted_rows_out():
    from benchmarks.simulator_validation import cases, summary
    cs = cases()
    assert len(cs) >= 10 and {c.kind for c in cs} == {"matmul-bound", "attention-bound",
                                                      "communication-bound"}
    assert sum(c.fitted for c in cs) == 3 and all(c.source for c in cs)
    rows = [{"case": "a", "error_pct": 10.0, "fitted": False},
            {"case": "b", "error_pct": -150.0, "fitted": True},
            {"case": "c", "error_pct": -60.0, "fitted": False},
            {"case": "d", "error_pct": 130.0, "fitted": False}]
    s = summary(rows)
    assert s["independent_rows"] == 3 and s["median_abs_error_pct"] == 60.0
    assert s["worst_case"] == "d" and s["outside_2x"] == ["c", "d"]


def test_splash_blocks_beyond_vmem_are_refused():
    from benchmarks.sim.kernel_model import splash_time_s, splash_vmem_bytes
    assert splash_vmem_bytes(128, 512, 512) < splash_vmem_bytes(128, 4096, 4096)
    with pytest.raises(ValueError, match="VMEM"):
        splash_time_s("v5e", 65536, 65536, 1, 128, 1, 8192, 8192)


_STACKED_RESIDUAL_HLO = """HloModule m, entry_computation_layout={()->()}

%fused (p0: bf16[30,1024,1024], p1: bf16[1,1024,1024], p2: s32[]) -> (bf16[30,1024,1024], bf16[1,1024,1024]) {
  %p0 = bf16[30,1024,1024]{2,1,0} parameter(0)
  %p1 = bf16[1,1024,1024]{2,1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %c = s32[] constant(0)
  %n = bf16[1,1024,1024]{2,1,0} negate(%p1)
  %dus = bf16[30,1024,1024]{2,1,0} dynamic-update-slice(%p0, %n, %p2, %c, %c)
  ROOT %t = (bf16[30,1024,1024]{2,1,0}, bf16[1,1024,1024]{2,1,0}) tuple(%dus, %n)
}

ENTRY %main (a: bf16[30,1024,1024], b: bf16[1,1024,1024], i: s32[]) -> (bf16[30,1024,1024], bf16[1,1024,1024]) {
  %a = bf16[30,1024,1024]{2,1,0} parameter(0)
  %b = bf16[1,1024,1024]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  ROOT %f = (bf16[30,1024,1024]{2,1,0}, bf16[1,1024,1024]{2,1,0}) fusion(%a, %b, %i), kind=kLoop, calls=%fused
}
"""


def test_a_multi_output_fusion_writing_a_stacked_residual_counts_the_slice():
    """A scan stacks each layer's residual into a [layers, ...] buffer by a dynamic-update-slice,
    often one output of a multi-output fusion: it writes one slice in place, not the buffer
    (counting the buffer priced a Wan 1.3B training step 53% slower than the same step with its
    residuals recomputed)."""
    from aoizora.extract.hlo import parse_hlo_module
    from benchmarks.sim.constants import OP_LAUNCH_S, chip_model
    from benchmarks.sim.hlo_cost import compute_seconds_by_name

    ch = chip_model("v5p")
    secs, _ = compute_seconds_by_name(parse_hlo_module(_STACKED_RESIDUAL_HLO), ch)
    slice_bytes = 2 * 1024 * 1024
    # read the update's input, write the update in place and the second output: 3 slices
    assert abs(secs["f"] - (OP_LAUNCH_S + 3 * slice_bytes / ch.hbm_Bps)) < 1e-9
    assert secs["f"] < 30 * slice_bytes / ch.hbm_Bps / 5
    # the step's compute by kind: the fusion run 3 times, bound by HBM; unnamed ops not counted
    from benchmarks.sim.hlo_cost import compute_breakdown
    parts = compute_breakdown(parse_hlo_module(_STACKED_RESIDUAL_HLO), ch, {"f": 3})
    assert parts == {"hbm-bound ops": pytest.approx(3 * secs["f"])}


def _offload_program(offload: bool):
    """A 4-layer scanned MLP gradient whose hidden activation ``h`` is offloaded to the host
    (``save_and_offload_only_these_names``) or recomputed; compiled for one v5p chip."""
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name
    from jax.sharding import NamedSharding, PartitionSpec as P

    from aoizora.extract.compiled_evidence import evidence_from_compiled
    from aoizora.extract.targets import get_target
    from benchmarks.simulator_validation import single_device_mesh

    pol = (jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=["h"],
        offload_src="device", offload_dst="pinned_host") if offload
        else jax.checkpoint_policies.nothing_saveable)

    def layer(x, w):
        return jnp.tanh(checkpoint_name(jnp.tanh(x @ w), "h") @ w)

    def loss(x, ws):
        y, _ = jax.lax.scan(lambda c, w: (jax.checkpoint(layer, policy=pol)(c, w), None), x, ws)
        return jnp.sum(y.astype(jnp.float32))

    mesh = single_device_mesh("v5p:2x2x1")
    s = NamedSharding(mesh, P())
    args = [jax.ShapeDtypeStruct((2048, 1024), jnp.bfloat16, sharding=s),
            jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16, sharding=s)]
    with jax.set_mesh(mesh):
        compiled = jax.jit(jax.grad(loss, argnums=1)).lower(*args).compile()
    tgt = get_target("v5p:2x2x1")
    return evidence_from_compiled(compiled, target=tgt, mesh=mesh), compiled.as_text()


@pytest.mark.skipif(not libtpu_available(), reason="needs libtpu")
def test_host_offload_bytes_are_priced_on_the_pcie_link():
    from aoizora.extract.hlo import parse_hlo_module
    from benchmarks.sim.host import host_transfers

    ev, text = _offload_program(True)
    pos = {o.name: (o.index, o.count) for o in ev.compute}
    tr, _ = host_transfers(parse_hlo_module(text), text, pos)
    act = 2048 * 1024 * 2                        # one layer's h, bf16
    assert {(t.to_host, t.bytes) for t in tr} == {(True, act), (False, act)}
    assert sum(t.count for t in tr if t.to_host) == 4 == sum(t.count for t in tr if not t.to_host)
    sim = Simulator("v5p:2x2x1")
    fast = sim.run(ev, [0], hlo=text)
    assert any("host offload: 2 transfer(s), 0.034 GB" in n for n in fast.notes)
    sim.capacity[list(sim.host_links)] = 1e8     # a 100 MB/s host link: the copies show
    sim._episodes.clear()
    slow = sim.run(ev, [0], hlo=text)
    assert slow.compute_s == pytest.approx(fast.compute_s)
    assert slow.step_s > fast.step_s + 4 * act / 1e8   # at least the to-host copies are exposed
    ev2, text2 = _offload_program(False)
    assert not host_transfers(parse_hlo_module(text2), text2,
                              {o.name: (o.index, o.count) for o in ev2.compute})[0]


def test_matmul_padding_to_the_mxu_raises_time_and_xla_matmuls_run_below_peak():
    from benchmarks.sim.constants import XLA_MXU_EFFICIENCY, chip_model
    from benchmarks.sim.kernel_model import matmul_flops

    v5e, v6e = chip_model("v5e"), chip_model("v6e")
    base = matmul_flops(1024, 128, 1024, v5e)
    assert matmul_flops(1024, 129, 1024, v5e) == 2 * base        # k one past the 128 tile
    assert matmul_flops(1024, 128, 1024, v6e) == 2 * base        # v6e's MXU is 256 wide
    assert matmul_flops(1, 128, 128, v5e) == matmul_flops(8, 128, 128, v5e)
    assert 0.5 < XLA_MXU_EFFICIENCY < 1.0
