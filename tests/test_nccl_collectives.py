"""NCCL-style collectives over GPU fabrics (ring, tree, all-to-all as nccl-tests' bus bandwidth)
and the committed validation table against published nccl-tests numbers."""

import json
import sys
from pathlib import Path

import pytest

from aoizora.extract.network import Network
from aoizora.extract.targets import get_target
from aoizora.formulation.nccl_collectives import nccl_algorithm, predicted_busbw
from aoizora.formulation.nvls import NvlsUnsupported, nvls_graph

ROOT = Path(__file__).parents[1]


def _net(name):
    return Network.from_target(get_target(name))


def test_ring_tree_and_all_to_all_on_the_boxes():
    h, l, c = _net("h100-8"), _net("l40-8"), _net("h100-16")
    assert predicted_busbw(h, range(8), "all-reduce") == pytest.approx(370.8e9)
    # l40-8: 8 GPUs cross the 10 GB/s UPI; 4 GPUs of one socket stay on 24 GB/s PCIe
    assert predicted_busbw(l, list(range(8)), "all-reduce") == pytest.approx(10e9)
    assert predicted_busbw(l, list(range(4)), "all-reduce") == pytest.approx(24e9)
    # the tree's chain crosses UPI once each way with the whole buffer: 2(n-1)/n x 10 GB/s
    assert predicted_busbw(l, list(range(8)), "all-reduce", "tree") == pytest.approx(17.5e9)
    # h100-16: the tree spans the two hosts (chain in each, two trees between them)
    assert c.chip_host.tolist() == [0] * 8 + [1] * 8
    assert predicted_busbw(c, list(range(16)), "all-reduce", "tree") < 370.8e9
    a2a = predicted_busbw(c, list(range(16)), "all-to-all")
    assert a2a == pytest.approx(8 * 48e9 / 4 * 15 / 16)   # 4 S per node over 8 x 48 GB/s
    with pytest.raises(ValueError, match="tree runs all-reduce only"):
        predicted_busbw(h, range(8), "all-gather", "tree")


def test_nvls_all_reduce_on_nvlink4_switch_boxes_only():
    h, a, l, c = _net("h100-8"), _net("a100-8"), _net("l40-8"), _net("h100-16")
    # NCCL's NVLS graph: 8 channels of 40 GB/s on 18 x 20.6 GB/s; 15 GB/s on H800's 8 links
    g = nvls_graph(8, 370.8)
    assert (g.channels, g.bw_intra, g.bw_inter) == (8, 40.0, 60.0)
    assert (nvls_graph(8, 164.8).bw_intra, nvls_graph(8, 164.8).bw_inter) == (15.0, 30.0)
    ring = predicted_busbw(h, range(8), "all-reduce", "ring")
    nvls = predicted_busbw(h, range(8), "all-reduce", "nvls")
    assert nvls == pytest.approx(476e9) and nvls > ring
    assert nccl_algorithm(h, range(8), "all-reduce") == "nvls"
    assert predicted_busbw(h, range(8), "all-reduce", "auto") == nvls
    # all-gather / reduce-scatter: NCCL's NVLS exists but prices below the ring on 8 x H100
    for kind in ("all-gather", "reduce-scatter"):
        assert predicted_busbw(h, range(8), kind, "nvls") < ring
        assert nccl_algorithm(h, range(8), kind) == "ring"
    # A100 (NVSwitch gen 2, sm_80) and L40 (PCIe) have no NVLink SHARP
    for net in (a, l):
        assert nccl_algorithm(net, range(8), "all-reduce") != "nvls"
        with pytest.raises(NvlsUnsupported):
            predicted_busbw(net, range(8), "all-reduce", "nvls")
    # across hosts NCCL runs NVLSTree (not modelled); one node of h100-16 is an h100-8
    assert nccl_algorithm(c, range(16), "all-reduce") != "nvls"
    assert nccl_algorithm(c, range(8, 16), "all-reduce") == "nvls"
    with pytest.raises(ValueError, match="no NVLS all-to-all"):
        predicted_busbw(h, range(8), "all-to-all", "nvls")


def test_committed_validation_table_is_current():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import nccl_busbw as B

    rs = B.rows()
    committed = json.loads((ROOT / "benchmarks/results/nccl_busbw.json").read_text())
    assert committed["rows"] == rs and committed["summary"] == B.summary(rs)
    assert len(rs) >= 8 and all(r["source"].startswith("https://github.com/NVIDIA/") for r in rs)
