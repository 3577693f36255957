"""GPU targets (issue 49): the four built-in boxes, their links and numbers, the switched network
(routes, rings, per-link bandwidth), and boxes read from `nvidia-smi topo -m` / NCCL's XML."""

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from aoizora.extract import targets as T
from aoizora.extract.evidence import Collective
from aoizora.extract.network import Network
from aoizora.formulation.traffic import collective_link_bytes

DATA = Path(__file__).parent / "data"
SMI = DATA / "nvidia_smi_topo_l40_dual_socket.txt"   # a dual-socket 8-GPU PCIe box, L40-like


@pytest.mark.parametrize("name,gpus,shape,peak,first_hop", [
    ("h100-8", 8, (8,), 989.4e12, 18 * 20.6e9),
    ("a100-8", 8, (8,), 312e12, 12 * 20.0e9),
    ("l40-8", 8, (2, 2, 2), 181.05e12, 24e9),
    ("h100-16", 16, (8, 2), 989.4e12, 18 * 20.6e9),
])
def test_gpu_targets_numbers(name, gpus, shape, peak, first_hop):
    t = T.get_target(name)
    assert (t.family, t.chips, t.shape, t.chip.peak_bf16_flops) == ("gpu", gpus, shape, peak)
    assert t.chip.link_bandwidth_Bps == pytest.approx(first_hop)
    assert all(l.source and l.bandwidth_Bps > 0 and l.latency_s > 0 for l in t.fabric.links)
    assert T.get_target(name.upper()).name == name


def _ring(kind, V, group):
    return Collective(name="c", kind=kind, dtype="bf16", bytes=V, replica_groups=[list(group)],
                      phase=0, count=1)


def _seconds(net, c, placement):
    f, _ = collective_link_bytes(c, np.asarray(placement), net)
    return float(net.link_time_s(f).max())


def test_nvswitch_ring_all_reduce_is_bus_bandwidth():
    # nccl-tests: busbw = V / t x 2(n-1)/n; a ring on NVSwitch runs at each GPU's uplink
    net = Network.from_target(T.get_target("h100-8"))
    V = 1 << 30
    t = _seconds(net, _ring("all-reduce", V, range(8)), range(8))
    assert V / t * 2 * 7 / 8 == pytest.approx(18 * 20.6e9)
    # every placement is the same on NVSwitch
    assert t == _seconds(net, _ring("all-reduce", V, range(8)), [3, 1, 7, 0, 2, 6, 5, 4])


def test_l40_routes_and_cross_socket_bottleneck():
    net = Network.from_target(T.get_target("l40-8"))
    assert net.has_switches and net.num_nodes == 8 + 6
    assert net.hops[0, 1] == 2 and net.hops[0, 2] == 4 and net.hops[0, 4] == 5
    V = 1 << 28
    # a 4-GPU group inside one socket: PCIe-bound; across sockets: UPI (10 GB/s) bound
    same = _seconds(net, _ring("all-gather", V, range(4)), range(8))
    cross = _seconds(net, _ring("all-gather", V, range(4)), [0, 1, 4, 5, 2, 3, 6, 7])
    assert same == pytest.approx(V * 3 / 4 / 24e9)
    assert cross == pytest.approx(V * 3 / 4 / 10e9)
    r = net.ring_through([5, 0, 4, 1])
    assert r.order == (0, 1, 4, 5) and r.kind == "scattered" and net.ring_directions(r) == 1


def test_h100_16_crosses_the_rails_once_per_ring_direction():
    net = Network.from_target(T.get_target("h100-16"))
    assert net.hops[0, 1] == 2 and net.hops[0, 8] == 6
    r = net.ring_through(range(16))
    assert r.order == tuple(range(16))
    f, _ = collective_link_bytes(_ring("all-gather", 16 << 20, range(16)), np.arange(16), net)
    rails = [l for l in range(net.num_links) if net.link_kind[l] == "ib"]
    assert sorted(f[rails]) == [15 << 20] * 4       # one ring step each way of each node's rails


def test_nvidia_smi_sample_matches_the_builtin_l40_box():
    t = T.get_target(f"topo:{SMI}")
    assert t.name == f"topo:l40:{SMI.name}" and t.shape == (2, 2, 2)
    a, b = Network.from_target(t), Network.from_target(T.get_target("l40-8"))
    assert np.array_equal(a.hops, b.hops)
    assert sorted(a.link_bandwidth) == sorted(b.link_bandwidth)
    assert T.get_target(str(SMI)).name == t.name          # a path works as target= too


def test_nvidia_smi_nvlink_pairs_and_nvswitch():
    pairs = ("\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\n"
             "GPU0\t X \tNV12\tNODE\tSYS\t0-31\t0\n"
             "GPU1\tNV12\t X \tNODE\tSYS\t0-31\t0\n"
             "GPU2\tNODE\tNODE\t X \tSYS\t0-31\t0\n"
             "GPU3\tSYS\tSYS\tSYS\t X \t32-63\t1\n")
    fab, gen = T.topology_files.parse_nvidia_smi(pairs)
    assert gen == "a100"
    nvl = [l for l in fab.links if l.kind == "nvlink"]
    assert [(l.a, l.b, l.bandwidth_Bps) for l in nvl] == [("GPU0", "GPU1", 12 * 20.0e9)]
    full = "\t" + "\t".join(f"GPU{i}" for i in range(4)) + "\n" + "".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else "NV18" for j in range(4)) + "\n"
        for i in range(4))
    fab, gen = T.topology_files.parse_nvidia_smi(full)
    assert gen == "h100" and fab.switches == ("nvswitch",) and len(fab.links) == 4


NCCL_XML = """<system version="1">
  <cpu numaid="0" affinity="ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="106">
    <pci busid="0000:15:00.0" class="0x060400" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:17:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="89" rank="0" gdr="1"/>
      </pci>
      <pci busid="0000:18:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="89" rank="1" gdr="1"/>
      </pci>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ffff0000" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="106">
    <pci busid="0000:95:00.0" class="0x030200" link_speed="8.0 GT/s PCIe" link_width="16">
      <gpu dev="2" sm="89" rank="2" gdr="1"/>
    </pci>
  </cpu>
</system>"""


def test_nccl_xml(tmp_path):
    p = tmp_path / "topo.xml"
    p.write_text(NCCL_XML)
    t = T.get_target(f"topo:{p}")
    assert t.generation == "l40" and t.chips == 3
    net = Network.from_target(t)
    assert net.hops[0, 1] == 2 and net.hops[0, 2] == 4      # gpu-switch-cpu0-cpu1-gpu
    gen3 = [l.bandwidth_Bps for l in t.fabric.links if l.a == "GPU2"]
    assert gen3 == [12e9]                                    # Gen3 x16: NCCL's PCI_BW 12


@pytest.mark.parametrize("text,msg", [
    ("hello", "nvidia-smi topo -m"),
    ("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tFOO\t X \n", "legend"),
    ("<system><cpu/></system>", "no <gpu>"),
])
def test_bad_topology_files(tmp_path, text, msg):
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(T.TargetError, match=msg):
        T.get_target(f"topo:{p}")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "aoizora", *args], capture_output=True, text=True)


def test_cli_lists_gpu_targets_and_reads_a_topology():
    r = _cli("targets", "--json")
    assert r.returncode == 0, r.stderr
    rows = {d["name"]: d for d in json.loads(r.stdout)}
    for n in ("h100-8", "a100-8", "l40-8", "h100-16"):
        assert rows[n]["family"] == "gpu" and rows[n]["links"]
    r = _cli("targets", "--from-topology", str(SMI))
    assert r.returncode == 0 and "upi" in r.stdout and "PCIe tree" in r.stdout
    r = _cli("targets", "--from-topology", "/nonexistent/topo.txt")
    assert r.returncode == 2 and "nvidia-smi topo -m" in r.stderr and "Traceback" not in r.stderr
