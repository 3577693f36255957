"""TPU v7x (Ironwood, libtpu "TPU7x") targets, and pricing per device where a chip shows as two
devices (v4, v7x): a device gets half the chip's peak, HBM bandwidth and HBM."""

import pytest

from aoizora.extract import targets as T
from aoizora.formulation.strategies import Hardware
from benchmarks.sim.constants import chip_model


@pytest.mark.parametrize("name,canonical,chips,shape,wrap", [
    ("v7x-8", "v7x:2x2x1", 4, (2, 2, 1), (False, False, False)),
    ("tpu7x-8", "v7x:2x2x1", 4, (2, 2, 1), (False, False, False)),
    ("v7x:2x2x1", "v7x:2x2x1", 4, (2, 2, 1), (False, False, False)),
    ("TPU7x:2x2x2", "v7x:2x2x2", 8, (2, 2, 2), (False, False, False)),
    ("v7x-16", "v7x:2x2x2", 8, (2, 2, 2), (False, False, False)),
    ("v7x-128", "v7x:4x4x4", 64, (4, 4, 4), (True, True, True)),
])
def test_v7x_spellings(name, canonical, chips, shape, wrap):
    t = T.get_target(name)
    assert (t.name, t.chips, t.shape, t.wrap) == (canonical, chips, shape, wrap)
    assert t.num_devices == 2 * chips and t.short_name == f"v7x-{2 * chips}"


@pytest.mark.parametrize("bad", ["v7x-6", "v7x:4x4", "v7x-7", "tpu7x:2x2"])
def test_v7x_bad_sizes_are_one_line_errors(bad):
    with pytest.raises(T.TargetError, match="accepted forms") as e:
        T.get_target(bad)
    assert "\n" not in str(e.value)


def test_v7x_chip_numbers_and_json():
    c = T.get_target("v7x-8").chip
    assert (c.peak_bf16_flops, c.hbm_bytes, c.hbm_bandwidth_Bps) == (2.307e15, 192 * 2**30, 7.38e12)
    assert c.devices_per_chip == 2 and c.device_kind == "TPU7x"
    row = T.get_target("v7x-16").to_json()
    assert (row["name"], row["canonical"], row["chips"], row["devices"]) == (
        "v7x-16", "v7x:2x2x2", 8, 16)
    assert {"v7x-8", "v7x-16"} <= set(T.STANDARD_TARGETS)


@pytest.mark.parametrize("name", ["v7x-8", "v4-8"])
def test_a_device_of_a_two_device_chip_gets_half_of_it(name):
    c = T.get_target(name).chip
    assert c.device_peak_flops == pytest.approx(c.peak_bf16_flops / 2)
    assert c.device_hbm_bandwidth_Bps == pytest.approx(c.hbm_bandwidth_Bps / 2)
    assert c.device_hbm_bytes == c.hbm_bytes // 2
    hw = Hardware.from_chip(c)
    assert (hw.peak_flops, hw.hbm_bandwidth_Bps, hw.hbm_bytes) == (
        c.device_peak_flops, c.device_hbm_bandwidth_Bps, c.device_hbm_bytes)
    sim = chip_model(c.generation)      # the simulator's own table says the same
    assert sim.device_flops == pytest.approx(sim.peak_bf16_flops / 2)
    assert sim.device_hbm_Bps == pytest.approx(sim.hbm_Bps / 2) and sim.device_cores == 1


def test_one_device_chips_keep_the_chip_figures():
    for name in ("v5e-8", "v5p-8", "v6e-8", "h100-8"):
        c = T.get_target(name).chip
        assert (c.device_peak_flops, c.device_hbm_bytes) == (c.peak_bf16_flops, c.hbm_bytes)
    assert chip_model("v5p").device_cores == 2           # megacore: one device, two cores


def test_simulator_splits_a_parallel_grid_over_a_megacore_only():
    from benchmarks.sim.kernel_model import StepWork, kernel_time
    w = StepWork(mxu_flops=1e9)
    v7x = chip_model("v7x")
    one = kernel_time(v7x, 100, w, parallel_split=False)
    split = kernel_time(v7x, 100, w, parallel_split=True)
    assert split.seconds == pytest.approx(one.seconds)       # a v7x device is one core
    v5p = chip_model("v5p")
    assert kernel_time(v5p, 100, w, True).seconds < 0.6 * kernel_time(v5p, 100, w, False).seconds


@pytest.mark.tpu_compiler
@pytest.mark.parametrize("name", ["v7x-8", "v7x-16"])
def test_v7x_devices_two_per_chip(name):
    from aoizora.extract.network import Network
    t = T.get_target(name)
    devs = t.devices()
    assert len(devs) == t.num_devices and {d.device_kind for d in devs} == {"TPU7x"}
    coords = t.device_coords()
    assert all(coords.count(c) == 2 for c in set(coords)) and len(set(coords)) == t.chips
    net = Network.from_target(t)
    assert net.peak_flops == pytest.approx(t.chip.peak_bf16_flops / 2)
    assert net.device_chip[0] == net.device_chip[1] != net.device_chip[2]


# libtpu 0.0.42.1 on TPU7x offloads collectives to the SparseCore: an asynchronous call of a
# computation on the "sparsecore" thread that holds the collective (shape of what it printed)
SPARSECORE_HLO = """\
HloModule sc, is_scheduled=true, num_partitions=8

%called_computation (p0: bf16[2,24,256], p1: token[]) -> bf16[2,192,256] {
  %p1 = token[] parameter(1)
  %p0 = bf16[2,24,256]{2,1,0} parameter(0)
  ROOT %all-gather.6 = bf16[2,192,256]{2,1,0} all-gather(%p0), channel_id=7, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={1}, use_global_device_ids=true
}, execution_thread="sparsecore"

ENTRY %main (x: bf16[2,24,256]) -> bf16[2,192,256] {
  %x = bf16[2,24,256]{2,1,0} parameter(0)
  %ps = s32[] custom-call(), custom_call_target="PrepareAsyncCallStart"
  %pd = token[] custom-call(%ps), custom_call_target="PrepareAsyncCallDone"
  %ag.call-start = ((bf16[2,24,256]{2,1,0}, token[]), bf16[2,192,256]{2,1,0}) call-start(%x, %pd), async_execution_thread="sparsecore", to_apply=%called_computation
  %y = bf16[2,24,256]{2,1,0} multiply(%x, %x), backend_config={"estimated_cycles":"100"}
  ROOT %ag.call-done = bf16[2,192,256]{2,1,0} call-done(%ag.call-start)
}
"""


def test_a_collective_offloaded_to_the_sparsecore_is_an_async_collective():
    from aoizora.extract.compiled_evidence import evidence_from_hlo_text
    from aoizora.extract.hlo import parse_hlo_module
    assert parse_hlo_module(SPARSECORE_HLO).computations[
        "called_computation"].execution_thread == "sparsecore"
    ev = evidence_from_hlo_text(SPARSECORE_HLO, target="v7x:2x2x1", mesh_axes={"x": 8})
    (c,) = ev.collectives
    assert (c.kind, c.bytes, c.is_async, c.replica_groups) == (
        "all-gather", 2 * 192 * 256 * 2, True, [list(range(8))])
    assert c.start_index < c.done_index and not ev.warnings


@pytest.mark.tpu_compiler
def test_tiny_wan_compiles_for_v7x_8_and_q2_and_the_simulator_price_it():
    """wan2.1-small (128p, 9 frames) under an expert layout compiles for v7x-8 with libtpu: 8
    devices, collectives (some offloaded to the SparseCore), and a priced step from both Q2 and
    the reference simulator."""
    from aoizora.builtin import builtin_job
    from aoizora.extract.network import Network, default_device_order
    from aoizora.formulation.latency import predict_step
    from aoizora.models.experts import expert_layouts
    from aoizora.planning.candidate_pricing import compile_layout
    from benchmarks.simulator import Simulator

    job = builtin_job("wan2.1-small", "128p", 9, "v7x-8")
    ex = next(e for e in expert_layouts(job.model, job.workload, job.target)
              if e.name == "ulysses")
    order = default_device_order(job.target, ex.layout.mesh_axes)
    ev = compile_layout(ex.fn, ex.args, job.target, ex.layout, order)
    assert ev.num_devices == 8 and ev.memory.fits
    assert ev.memory.hbm_bytes == 96 * 2**30                  # half a 192 GiB chip
    kinds = {c.kind for c in ev.collectives}
    assert {"all-to-all", "all-gather"} <= kinds
    assert any(c.name.endswith("call-start") for c in ev.collectives)   # SparseCore offload
    q = predict_step(ev, order, Network.from_target(job.target))
    s = Simulator(job.target.name).run(ev, order)
    assert q.step_s > 0 and s.step_s > 0 and q.compute_s > 0 and s.compute_s > 0


def _two_per_chip_network():
    """v7x:2x2x1 as libtpu numbers it: devices 2c and 2c + 1 on chip c (x fastest)."""
    from aoizora.extract.network import Network
    c = T.get_target("v7x-8").chip
    coords = [(x, y, 0) for y in range(2) for x in range(2) for _ in range(2)]
    return Network((2, 2, 1), (False, False, False), c.link_bandwidth_Bps, c.hop_latency_s,
                   device_coords=coords, name="v7x:2x2x1", peak_flops=c.device_peak_flops,
                   hbm_bandwidth_Bps=c.device_hbm_bandwidth_Bps)


def test_placement_with_two_devices_per_chip_is_a_cpsat_certificate():
    """With two devices per chip (v4, v7x) the CP-SAT placement model places ranks on devices
    (tests/test_placement_devices.py checks it against every device order)."""
    from aoizora.extract.evidence import Collective, ComputeOp, Evidence
    from aoizora.formulation.traffic import mesh_axis_groups
    from aoizora.solvers.placement import solve_placement

    net = _two_per_chip_network()
    ev = Evidence(target="v7x:2x2x1", mesh_axes={"a": 2, "b": 4}, clock_hz=2.2e9,
                  collectives=[Collective("ag", "all-gather", "bf16", 8 << 20,
                                          mesh_axis_groups((2, 4), [1]), count=4)],
                  compute=[ComputeOp("mlp", "fusion", 1e6, count=4)])
    res = solve_placement(ev, net, time_limit_s=2.0, hint=list(range(8)))
    assert sorted(res.placement) == list(range(8))
    c = res.certificate
    assert c.solver.startswith("CP-SAT") and c.status == "OPTIMAL"
    assert c.detail["method"] == "CP-SAT (sets)"


@pytest.mark.tpu_compiler
def test_an_axis_over_the_two_devices_of_a_chip_crosses_no_link():
    from aoizora.formulation.collective_cost import default_axis_costs
    costs = default_axis_costs(T.get_target("v7x-8"), {"x": 4, "y": 2})
    assert costs.alpha_s["y"] == 0.0 and costs.beta_s_per_byte["y"] == 0.0
    assert costs.alpha_s["x"] > 0 and costs.beta_s_per_byte["x"] > 0
