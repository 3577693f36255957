"""Family-neutral records of a target: the chip's numbers, the fabric's nodes and links.

A `Target` is what the planner compiles for and places on, whatever the hardware family:

- ``chip`` (`ChipSpec`): one accelerator's compute, memory and first-hop link numbers;
- ``shape`` / ``wrap``: the chips' coordinates as a grid (a TPU torus; for a GPU box the levels
  of its hierarchy, e.g. GPU in PCIe switch x switch in socket x socket), which the axis-order
  seeds and symmetry checks read;
- ``fabric`` (`Fabric`, GPU family): the switches and duplex links between nodes when the chips
  are not joined by a torus of equal links (TPU targets leave it ``None``: their links follow
  from ``shape`` and ``wrap``).

The family modules (``hardware.tpu``, ``hardware.gpu``) build Targets; ``Network.from_target``
(``aoizora.extract.network``) turns one into directed links, routes and rings. Nothing outside
the family modules needs to know the family.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


class TargetError(ValueError):
    """An unknown or malformed target name or topology file."""


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """Per-chip numbers. Units: FLOP/s, bytes, bytes/s, seconds, Hz.

    A chip may show as several devices (``devices_per_chip``: 2 on v4 and v7x); whatever prices
    one device reads ``device_peak_flops``, ``device_hbm_bandwidth_Bps`` and
    ``device_hbm_bytes``, never the per-chip figures.

    For a GPU, ``links_per_chip`` counts NVLink links (0 on a PCIe-only GPU) and
    ``link_bandwidth_Bps`` is the GPU's one-way bandwidth into its fastest fabric (all NVLinks
    together, or its PCIe slot); ``torus_dims`` is the number of hierarchy levels and nothing
    wraps (``wrap_period`` 0)."""

    generation: str            # "v5e", "v6e", "v5p", "v4", "v7x", "h100", "a100", "l40"
    device_kind: str           # what jax reports, e.g. "TPU v5 lite", "NVIDIA H100 80GB HBM3"
    peak_bf16_flops: float     # FLOP/s, dense (datasheet)
    hbm_bytes: int             # device memory per chip
    hbm_bandwidth_Bps: float   # bytes/s (datasheet)
    links_per_chip: int        # ICI ports / NVLink links
    link_bandwidth_Bps: float  # one-way bytes/s per link (TPU) / into the fabric (GPU)
    hop_latency_s: float       # per link hop
    clock_hz: float            # core clock (TPU: derived from the peak; GPU: boost clock)
    torus_dims: int            # axes of `Target.shape`
    wrap_period: int           # an axis wraps when its length is a multiple of this ... (wraps())
    wrap_only_full: bool       # ... v5e/v6e: only the full 16-chip axis wraps; v5p/v4/v7x:
                               # multiples of 4
    devices_per_chip: int = 1
    family: str = "tpu"        # "tpu" or "gpu"

    @property
    def device_peak_flops(self) -> float:
        """Peak bf16 FLOP/s of one device (what the compiler shards over): the chip's figure
        split over ``devices_per_chip`` (libtpu shows v4 and v7x chips as two devices)."""
        return self.peak_bf16_flops / self.devices_per_chip

    @property
    def device_hbm_bandwidth_Bps(self) -> float:
        """HBM bandwidth of one device, bytes/s (the chip's, split over its devices)."""
        return self.hbm_bandwidth_Bps / self.devices_per_chip

    @property
    def device_hbm_bytes(self) -> int:
        """HBM of one device, bytes (the chip's, split over its devices)."""
        return self.hbm_bytes // self.devices_per_chip

    def wraps(self, axis_len: int) -> bool:
        """Whether an axis of `axis_len` chips has a wraparound link (never for GPUs)."""
        if self.wrap_period <= 0:
            return False
        if self.wrap_only_full:
            return axis_len == self.wrap_period
        return axis_len >= self.wrap_period and axis_len % self.wrap_period == 0


@dataclasses.dataclass(frozen=True)
class Link:
    """One duplex link between two fabric nodes: ``bandwidth_Bps`` each way (bytes/s),
    ``latency_s`` per crossing, ``kind`` ("nvlink", "pcie", "upi", "ib", ...) and ``source``, where
    the numbers come from."""

    a: str
    b: str
    bandwidth_Bps: float
    latency_s: float
    kind: str
    source: str = ""


@dataclasses.dataclass(frozen=True)
class Fabric:
    """The nodes and links of a switched box or cluster.

    ``gpus``: node names of the devices in device-id order (``CUDA_VISIBLE_DEVICES`` order);
    ``coords``: each GPU's coordinates in the target's ``shape`` (its place in the hierarchy);
    ``switches``: the other nodes (NVSwitch, PCIe switches, CPU sockets, NICs, IB switches);
    ``links``: duplex links; traffic between two GPUs follows the fewest-hop path (ties broken by
    the order of ``links``), as NCCL's path search does on these trees;
    ``host_axis``: which coordinate numbers the hosts (nodes) of a cluster, None for one host."""

    gpus: tuple[str, ...]
    coords: tuple[tuple[int, ...], ...]
    switches: tuple[str, ...]
    links: tuple[Link, ...]
    description: str = ""
    host_axis: int | None = None   # the coordinate that numbers hosts (None: one host)

    def to_json(self) -> list[dict[str, Any]]:
        """The links as JSON rows (bandwidth in bytes/s one way, latency in seconds)."""
        return [{"a": l.a, "b": l.b, "kind": l.kind, "bandwidth_Bps": l.bandwidth_Bps,
                 "latency_s": l.latency_s, "source": l.source} for l in self.links]


@dataclasses.dataclass(frozen=True)
class Target:
    """One target: a TPU slice or a GPU box / cluster (see the module docstring)."""

    name: str                  # canonical: "v5e:2x4" (TPU), "h100-8" (GPU), "topo:FILE"
    chip: ChipSpec
    shape: tuple[int, ...]     # chips along each axis (TPU: x, y[, z]; GPU: hierarchy levels)
    wrap: tuple[bool, ...]     # wraparound link on each axis
    fabric: Fabric | None = None
    # the family's source of compiler devices (libtpu, the jax CUDA plugin), set by the family
    # module that builds the target; not part of the target's identity
    compiler: Callable[["Target"], tuple] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    @property
    def family(self) -> str:
        return self.chip.family

    @property
    def generation(self) -> str:
        return self.chip.generation

    @property
    def chips(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def num_devices(self) -> int:
        return self.chips * self.chip.devices_per_chip

    @property
    def short_name(self) -> str:
        """The chip-count spelling (v5e-8), the Cloud type for v5p/v4/v7x (v5p-8, v7x-8 = 4
        chips), or the GPU target's own name."""
        if self.family != "tpu":
            return self.name
        if self.chip.torus_dims == 2:
            return f"{self.generation}-{self.chips}"
        return f"{self.generation}-{2 * self.chips}"

    def to_json(self) -> dict[str, Any]:
        """The target's numbers as a JSON row (units as in `ChipSpec`)."""
        c = self.chip
        row = {
            "name": self.short_name, "canonical": self.name, "family": self.family,
            "generation": self.generation, "device_kind": c.device_kind, "chips": self.chips,
            "devices": self.num_devices, "devices_per_chip": c.devices_per_chip,
            "shape": list(self.shape), "wrap": list(self.wrap),
            "peak_bf16_flops": c.peak_bf16_flops, "hbm_bytes": c.hbm_bytes,
            "hbm_bandwidth_Bps": c.hbm_bandwidth_Bps, "links_per_chip": c.links_per_chip,
            "link_bandwidth_Bps": c.link_bandwidth_Bps, "hop_latency_s": c.hop_latency_s,
            "clock_hz": c.clock_hz,
        }
        if self.fabric is not None:
            row["links"] = self.fabric.to_json()
            row["description"] = self.fabric.description
        return row

    def devices(self) -> list:
        """The compiler's devices for this target, by id (TPU: libtpu; GPU: the jax CUDA
        plugin's ahead-of-time topology). Raises TargetError when that compiler is missing."""
        if self.compiler is None:
            raise TargetError(f"{self.name}: no compiler is known for this target")
        return list(self.compiler(self))

    def device_coords(self) -> list[tuple[int, ...]]:
        """Coordinates of each device in ``shape``, indexed by position in `devices()`."""
        if self.fabric is not None:
            return [tuple(c) for c in self.fabric.coords]
        nd = len(self.shape)
        return [tuple(int(v) for v in d.coords[:nd]) for d in self.devices()]
