import json

import pytest

from aoizora.extract import targets as T
from conftest import run_cli as _cli


@pytest.mark.parametrize("name,canonical,chips,shape,wrap", [
    ("v5e-4", "v5e:2x2", 4, (2, 2), (False, False)),
    ("v5e-8", "v5e:2x4", 8, (2, 4), (False, False)),
    ("v5litepod-8", "v5e:2x4", 8, (2, 4), (False, False)),
    ("v5e:2x4", "v5e:2x4", 8, (2, 4), (False, False)),
    ("v5e-16", "v5e:4x4", 16, (4, 4), (False, False)),
    ("v5e-128", "v5e:8x16", 128, (8, 16), (False, True)),
    ("v5e-256", "v5e:16x16", 256, (16, 16), (True, True)),
    ("v6e-8", "v6e:2x4", 8, (2, 4), (False, False)),
    ("v5p-8", "v5p:2x2x1", 4, (2, 2, 1), (False, False, False)),
    ("v5p-128", "v5p:4x4x4", 64, (4, 4, 4), (True, True, True)),
    ("v4-8", "v4:2x2x1", 4, (2, 2, 1), (False, False, False)),
    ("V5E-8", "v5e:2x4", 8, (2, 4), (False, False)),
])
def test_spellings(name, canonical, chips, shape, wrap):
    t = T.get_target(name)
    assert (t.name, t.chips, t.shape, t.wrap) == (canonical, chips, shape, wrap)


@pytest.mark.parametrize("bad", ["v9z-3", "v5e-12", "v5e:2x2x2", "v5p-7", "", "tpu"])
def test_unknown_names_list_accepted_forms(bad):
    with pytest.raises(T.TargetError, match="accepted forms"):
        T.get_target(bad)


def test_chip_numbers_from_facts():
    c = T.get_target("v5e-8").chip
    assert c.peak_bf16_flops == 1.97e14 and c.link_bandwidth_Bps == 4.5e10
    assert c.hbm_bytes == int(15.75 * 1024**3) and c.links_per_chip == 4


@pytest.mark.tpu_compiler
@pytest.mark.parametrize("name", ["v5e-1", "v5e-8", "v5e-16", "v5p-8"])
def test_devices_have_the_target_coordinates(name):
    t = T.get_target(name)
    coords = t.device_coords()
    assert len(coords) == t.num_devices
    assert sorted(set(coords)) == sorted(
        __import__("itertools").product(*[range(s) for s in t.shape]))




def test_cli_targets_json():
    r = _cli("targets", "--json")
    assert r.returncode == 0, r.stderr
    rows = {d["name"]: d for d in json.loads(r.stdout)}
    for n in ("v5e-4", "v5e-8", "v5e-16", "v5e-256", "v6e-8", "v5p-8"):
        assert {"name", "chips", "shape", "wrap", "link_bandwidth_Bps", "hbm_bytes"} <= set(rows[n])
    assert rows["v5e-256"]["wrap"] == [True, True] and rows["v5e-16"]["wrap"] == [False, False]
    assert rows["v5p-8"]["chips"] == 4 and rows["v5e-8"]["shape"] == [2, 4]


def test_cli_unknown_target_is_one_line_exit_2():
    r = _cli("targets", "v9z-3")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "accepted forms" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_one_target_any_spelling():
    r = _cli("targets", "v5litepod-8", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["canonical"] == "v5e:2x4"
