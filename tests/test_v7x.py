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
