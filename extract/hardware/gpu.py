"""The GPU family: HGX boxes, a PCIe box and a two-node InfiniBand cluster, as switched fabrics.

Targets (``GPU_TARGETS``): ``h100-8`` (HGX H100 SXM, NVSwitch), ``a100-8`` (HGX A100 SXM,
NVSwitch), ``l40-8`` (8 x L40 on PCIe Gen4: two PCIe switches per CPU socket, two GPUs per
switch, the sockets joined over UPI), ``h100-16`` (two HGX H100 nodes over InfiniBand NDR, one
400 Gb/s NIC per GPU). A user's own box comes from ``hardware.topology_files``.

Link bandwidths are NCCL's own effective one-way numbers (``src/graph/topo.h`` and ``topo.cc`` of
NVIDIA/nccl), the numbers NCCL's tuner plans rings with; the datasheet line rates are given
beside them. NCCL's maintainer on the gap (nccl-tests issue 212): "450GB/s is the line rate.
With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s".

- NVLink, per link and direction: NVLink3 (A100, sm_80) ``SM80_NVLINK_BW`` 20.0 GB/s, NVLink4
  (H100, sm_90) ``SM90_NVLINK_BW`` 20.6 GB/s (line rate 25 GB/s for both: 600 GB/s over 12
  links and 900 GB/s over 18 links, both directions together, NVIDIA A100 / H100 datasheets).
  An HGX board's NVSwitches make every GPU pair equivalent: modelled as one non-blocking switch,
  each GPU joined to it by all its links (A100 12 x 20.0 = 240 GB/s, H100 18 x 20.6 = 370.8
  GB/s each way).
- PCIe: NCCL takes width x per-lane rate / 80 (``topo.cc``: "16 GT/s" -> 120, "32 GT/s" -> 240;
  ``PCI_BW`` 12.0 for Gen3 x16), so Gen4 x16 = 24 GB/s and Gen5 x16 = 48 GB/s each way (line
  rate 31.5 / 63 GB/s).
- Inter-socket (Intel UPI): ``SKL_QPI_BW`` 10.0 GB/s (NCCL's figure for Skylake and later Xeons).
- InfiniBand NDR: 400 Gb/s per port = 50 GB/s each way (NCCL reads the port speed in Mb/s and
  divides by 8000). On h100-16 the eight rails of a node are one aggregated link (8 x 48 GB/s on
  the PCIe Gen5 side, 8 x 50 GB/s on the wire): NCCL spreads its channels over the rails (PXN),
  so the node's traffic sees their sum.
- Latency: NCCL ``tuning.cc`` ``hwLat`` for Ring / Simple, per ring step: NVLink 3.4 us, PCIe 5.7
  us, network 14 us. A step crosses two links (up to the switch and down), so each link carries
  half of its step's latency.

Compute and memory (datasheets): H100 SXM5 80 GB: 989.4 TFLOP/s dense bf16 (1,979 with
sparsity), HBM3 3.35 TB/s, 132 SMs, 1.98 GHz boost. A100 SXM4 80 GB: 312 TFLOP/s dense bf16, HBM2e
2.039 TB/s, 108 SMs, 1.41 GHz. L40: 181.05 TFLOP/s dense bf16 (362.1 with sparsity), 48 GB GDDR6
at 864 GB/s, 142 SMs, 2.49 GHz boost, no NVLink.
"""

from __future__ import annotations

import dataclasses
import functools

from aoizora.extract.hardware.records import ChipSpec, Fabric, Link, Target, TargetError

GB = 1e9

# NCCL src/graph/topo.h (NVIDIA/nccl, 2.18 and later): effective one-way GB/s per NVLink link
SM80_NVLINK_Bps = 20.0 * GB
SM90_NVLINK_Bps = 20.6 * GB
# NCCL topo.cc: width x rate / 80 with "16 GT/s" -> 120 and "32 GT/s" -> 240
PCIE_GEN4_X16_Bps = 16 * 120 / 80 * GB          # 24 GB/s
PCIE_GEN5_X16_Bps = 16 * 240 / 80 * GB          # 48 GB/s
UPI_Bps = 10.0 * GB                             # NCCL topo.h SKL_QPI_BW
IB_NDR_Bps = 400e9 / 8                          # 400 Gb/s NDR port: 50 GB/s
# NCCL tuning.cc hwLat, Ring / Simple, per step (two links per step)
NVLINK_STEP_S, PCIE_STEP_S, NET_STEP_S = 3.4e-6, 5.7e-6, 14.0e-6

_SRC_NVL = "NCCL topo.h SM{}_NVLINK_BW x {} links; latency: NCCL tuning.cc hwLat NVLink Ring/Simple / 2"
_SRC_PCIE4 = "NCCL topo.cc PCIe Gen4 x16 = 16 x 120 / 80; latency: tuning.cc hwLat PCI Ring/Simple / 2"
_SRC_PCIE5 = ("NCCL topo.cc PCIe Gen5 x16 = 16 x 240 / 80, 8 rails; latency: tuning.cc hwLat NET "
              "Ring/Simple / 4 (a cross-node step crosses 4 such links)")
_SRC_UPI = "NCCL topo.h SKL_QPI_BW; latency: tuning.cc hwLat PCI Ring/Simple / 2"
_SRC_IB = ("InfiniBand NDR 400 Gb/s per port, 8 rails; latency: tuning.cc hwLat NET Ring/Simple / 4 "
           "(a cross-node step crosses 4 such links)")

GPUS: dict[str, ChipSpec] = {
    "h100": ChipSpec("h100", "NVIDIA H100 80GB HBM3", 989.4e12, 80 * 10**9, 3.35e12, 18,
                     18 * SM90_NVLINK_Bps, NVLINK_STEP_S / 2, 1.98e9, 1, 0, True, family="gpu"),
    "a100": ChipSpec("a100", "NVIDIA A100-SXM4-80GB", 312e12, 80 * 10**9, 2.039e12, 12,
                     12 * SM80_NVLINK_Bps, NVLINK_STEP_S / 2, 1.41e9, 1, 0, True, family="gpu"),
    "l40": ChipSpec("l40", "NVIDIA L40", 181.05e12, 48 * 10**9, 864e9, 0,
                    PCIE_GEN4_X16_Bps, PCIE_STEP_S / 2, 2.49e9, 3, 0, True, family="gpu"),
}

# jax-cuda's deviceless topology needs a minimal gpu_device_info text proto (the core fields of
# XLA's xla/backends/gpu/target_config/specs/*.txtpb); L40 (sm_89) has no upstream spec, its
# fields are from the L40 datasheet (142 SMs, 96 MB L2, 864 GB/s, 2.49 GHz, 48 GB).
_DEVICE_INFO = {
    "h100": dict(core_count=132, memory_bandwidth=3352320000000, clock_rate_ghz=1.98,
                 l2_cache_size=52428800, device_memory_size=84942979072,
                 shared_memory_per_core=233472, shared_memory_per_block_optin=232448,
                 cc=(9, 0)),
    "a100": dict(core_count=108, memory_bandwidth=2039000000000, clock_rate_ghz=1.41,
                 l2_cache_size=41943040, device_memory_size=85198045184,
                 shared_memory_per_core=167936, shared_memory_per_block_optin=166912,
                 cc=(8, 0)),
    "l40": dict(core_count=142, memory_bandwidth=864000000000, clock_rate_ghz=2.49,
                l2_cache_size=100663296, device_memory_size=48305799168,
                shared_memory_per_core=102400, shared_memory_per_block_optin=101376,
                cc=(8, 9)),
}

GPU_TARGETS = ("h100-8", "a100-8", "l40-8", "h100-16")

# NVLink SHARP (NVLS): the NVSwitch reduces and multicasts. Third-generation NVSwitch (NVLink4,
# HGX H100 / H200 / H800) has it ("SHARP in-network reductions ... multicast", NVIDIA H100 Tensor
# Core GPU Architecture whitepaper, 2022); the second generation (HGX A100) does not, nor does a
# PCIe box. NCCL builds its NVLS graph only with an NVSwitch in the topology and every GPU at
# compute capability >= 9.0 (NVIDIA/nccl src/graph/search.cc, v2.30.7: "if (graph->pattern ==
# NCCL_TOPO_PATTERN_NVLS && (system->nodes[NVS].count == 0 || ccMin < 90)) return").
NVLS_MIN_COMPUTE_CAPABILITY = (9, 0)


def compute_capability(generation: str) -> tuple[int, int]:
    """CUDA compute capability (major, minor) of a GPU generation (H100 9.0, A100 8.0, L40 8.9).

    Raises:
        KeyError: not a GPU generation of ``GPUS``."""
    return tuple(_DEVICE_INFO[generation]["cc"])


def _nvswitch_box(gen: str, per_link: float, links: int, node: str = "",
                  node_coord: tuple[int, ...] = ()) -> tuple[list, list, list, list]:
    gpus = [f"{node}gpu{i}" for i in range(8)]
    sw = f"{node}nvswitch"
    sm = "90" if gen == "h100" else "80"
    ls = [Link(g, sw, links * per_link, NVLINK_STEP_S / 2, "nvlink", _SRC_NVL.format(sm, links))
          for g in gpus]
    return gpus, [(i,) + node_coord for i in range(8)], [sw], ls


def _l40_fabric() -> Fabric:
    gpus = [f"gpu{i}" for i in range(8)]
    coords = [(i % 2, (i // 2) % 2, i // 4) for i in range(8)]
    switches = [f"pcie_sw{s}" for s in range(4)] + ["cpu0", "cpu1"]
    links = [Link(g, f"pcie_sw{i // 2}", PCIE_GEN4_X16_Bps, PCIE_STEP_S / 2, "pcie", _SRC_PCIE4)
             for i, g in enumerate(gpus)]
    links += [Link(f"pcie_sw{s}", f"cpu{s // 2}", PCIE_GEN4_X16_Bps, PCIE_STEP_S / 2, "pcie",
                   _SRC_PCIE4 + " (the switch's x16 uplink)") for s in range(4)]
    links.append(Link("cpu0", "cpu1", UPI_Bps, PCIE_STEP_S / 2, "upi", _SRC_UPI))
    return Fabric(tuple(gpus), tuple(coords), tuple(switches), tuple(links),
                  "8 x L40, PCIe Gen4 x16: 2 GPUs per PCIe switch, 2 switches per socket, "
                  "2 sockets over UPI")


def _h100_16_fabric() -> Fabric:
    gpus, coords, switches, links = [], [], [], []
    for n in range(2):
        g, c, s, l = _nvswitch_box("h100", SM90_NVLINK_Bps, 18, f"n{n}.", (n,))
        gpus += g; coords += c; switches += s; links += l
        switches.append(f"n{n}.nics")
        links.append(Link(f"n{n}.nvswitch", f"n{n}.nics", 8 * PCIE_GEN5_X16_Bps, NET_STEP_S / 4,
                          "pcie", _SRC_PCIE5))
        links.append(Link(f"n{n}.nics", "ib", 8 * IB_NDR_Bps, NET_STEP_S / 4, "ib", _SRC_IB))
    switches.append("ib")
    return Fabric(tuple(gpus), tuple(coords), tuple(switches), tuple(links),
                  "2 nodes x 8 H100 SXM (NVSwitch), 8 x 400 Gb/s NDR rails per node, one "
                  "InfiniBand switch", host_axis=1)


def _box(gen: str) -> Fabric:
    per, n = (SM90_NVLINK_Bps, 18) if gen == "h100" else (SM80_NVLINK_Bps, 12)
    gpus, coords, switches, links = _nvswitch_box(gen, per, n)
    return Fabric(tuple(gpus), tuple(coords), tuple(switches), tuple(links),
                  f"HGX {gen.upper()} SXM: 8 GPUs, NVSwitch ({n} NVLink links per GPU)")


def make_target(name: str, chip: ChipSpec, fabric: Fabric) -> Target:
    """A GPU target over `fabric`: ``shape`` is the extent of the GPUs' coordinates.

    Raises:
        TargetError: coordinates that are not distinct or do not fill the shape."""
    nd = len(fabric.coords[0]) if fabric.coords else 1
    shape = tuple(max(c[k] for c in fabric.coords) + 1 for k in range(nd))
    n = 1
    for s in shape:
        n *= s
    if len(set(fabric.coords)) != len(fabric.gpus) or n != len(fabric.gpus):
        raise TargetError(f"target {name}: GPU coordinates {fabric.coords} do not fill a grid")
    chip = dataclasses.replace(chip, torus_dims=nd)
    return Target(name=name, chip=chip, shape=shape, wrap=(False,) * nd, fabric=fabric,
                  compiler=compiler_devices)


def parse(raw: str) -> Target | None:
    """The GPU target of a name in ``GPU_TARGETS`` (case-insensitive), else None."""
    s = raw.strip().lower()
    if s == "h100-8":
        return make_target(s, GPUS["h100"], _box("h100"))
    if s == "a100-8":
        return make_target(s, GPUS["a100"], _box("a100"))
    if s == "l40-8":
        return make_target(s, GPUS["l40"], _l40_fabric())
    if s == "h100-16":
        return make_target(s, GPUS["h100"], _h100_16_fabric())
    return None


def target_config(generation: str) -> str:
    """The text proto jax-cuda's deviceless topology takes for this GPU generation."""
    d = _DEVICE_INFO[generation]
    chip = GPUS[generation]
    major, minor = d["cc"]
    return "\n".join([
        "gpu_device_info {",
        "  threads_per_block_limit: 1024", "  threads_per_warp: 32",
        "  shared_memory_per_block: 49152",
        f"  shared_memory_per_core: {d['shared_memory_per_core']}",
        "  threads_per_core_limit: 2048", f"  core_count: {d['core_count']}",
        "  fpus_per_core: 128", "  block_dim_limit_x: 2147483647",
        "  block_dim_limit_y: 65535", "  block_dim_limit_z: 65535",
        f"  memory_bandwidth: {d['memory_bandwidth']}", f"  l2_cache_size: {d['l2_cache_size']}",
        f"  clock_rate_ghz: {d['clock_rate_ghz']}",
        f"  device_memory_size: {d['device_memory_size']}",
        f"  shared_memory_per_block_optin: {d['shared_memory_per_block_optin']}",
        f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
        "  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536",
        "}", 'platform_name: "CUDA"', "dnn_version_info { major: 9 minor: 3 }",
        f'device_description_str: "{chip.device_kind}"', ""])


def cuda_plugin_available() -> bool:
    """True when the jax CUDA plugin (the ``gpu`` extra) is installed."""
    import importlib.util
    return (importlib.util.find_spec("jax_plugins") is not None
            and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None)


@functools.lru_cache(maxsize=None)
def _cuda_devices(generation: str, hosts: int, per_host: int) -> tuple:
    if not cuda_plugin_available():
        raise TargetError("GPU targets compile with the jax CUDA plugin: "
                          "pip install -e '.[gpu]'")
    from jax.experimental import topologies
    try:
        topo = topologies.get_topology_desc(platform="cuda", target_config=target_config(generation),
                                            topology=f"1x{hosts}x{per_host}")
    except Exception as e:
        raise TargetError(f"jax's CUDA plugin cannot describe {hosts}x{per_host} "
                          f"{generation}: {str(e).splitlines()[0]}") from e
    return tuple(sorted(topo.devices, key=lambda d: d.id))


# XLA:GPU compiler options for compiles without a device: autotuning needs one, level 0 picks
# kernels by heuristics.
COMPILER_OPTIONS = {"xla_gpu_autotune_level": 0}


def compiler_devices(target: Target) -> tuple:
    """XLA:GPU's ahead-of-time devices of the target (one host per HGX node), by id.

    Raises:
        TargetError: the jax CUDA plugin is missing or refuses the topology."""
    hosts = 2 if target.name == "h100-16" else 1
    return _cuda_devices(target.generation, hosts, target.num_devices // hosts)
