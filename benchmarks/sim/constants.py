"""The reference simulator's own hardware constants, each with its source.

Kept apart from ``aoizora.extract.targets`` on purpose: the simulator is a yardstick for the
planner's cost models, so it restates every number it uses here, with where it comes from, and
shares none of the planner's calibrations. Units: FLOP/s, bytes/s, Hz, seconds, elements.

Sources
- [cloud]  Google Cloud TPU documentation, "TPU v5e", "TPU v5p", "TPU v6e (Trillium)", "TPU7x
  (Ironwood)" system architecture pages (cloud.google.com/tpu/docs/v5e, /v5p, /v6e,
  docs.cloud.google.com/tpu/docs/tpu7x): peak bf16 FLOP/s per chip, HBM bandwidth per chip,
  TensorCores per chip, bidirectional ICI bandwidth per chip (TPU7x: 1,200 GB/s).
- [libtpu] libtpu 0.0.42.1's ahead-of-time topology (jax.experimental.topologies): the devices
  a chip shows as -- one on v5e, v6e and v5p (megacore: both v5p TensorCores are one device),
  two on v4 and TPU7x (device ids 0 and 1 on chip (0, 0, 0), core_on_chip 0 and 1). A device
  gets its share of the chip's peak, HBM bandwidth and cores.
- [jax-tpu-info] jax 0.10.2 jax/_src/pallas/mosaic/tpu_info.py, ChipVersion.TPU_7X: MXU column
  size 256, VMEM 64 MiB per TensorCore.
- [book]   "How to Scale Your Model" (jax-ml.github.io/scaling-book), chapter "tpus": MXU sizes
  (128x128 through v5, 256x256 on v6e), the VPU as an (8, 128) array of lanes with 4 f32 ALUs per
  lane on v5 ("in v5 you can add 4 pairs of f32 values together from VREGs in each cycle"),
  TPU memory tiles of (8, 128); chapter "sharding": about 1 us per ICI hop, one-way ICI
  bandwidth per link 4.5e10 B/s on v5e and v4, 9e10 B/s on v5p and v6e (its hardware table).
- [book-pcie] the scaling book, chapter "tpus" (jax-ml/scaling-book tpus.md): "PCIe bandwidth is
  typically around 1.5e10 bytes / second per chip", footnote "Trillium (TPU v6e) has 32GB/s, about
  2x higher than v5": 1.5e10 B/s on v4, v5e, v5p; 3.2e10 B/s on v6e. Taken as each way
  (PCIe is full duplex) [assumed].
- [derived] clock = peak / (2 FLOP x MXUs per chip x MXU_dim^2) from the [cloud] peak and the
  [book] MXU geometry.
- [fit]    fitted on one measured figure, named, and that figure is marked as not independent in
  ``benchmarks/results/simulator_validation.md``.
- [assumed] no public figure found; stated as an assumption, with the reasoning.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ChipModel:
    """One TPU generation as the simulator sees it. See the module docstring for sources."""

    name: str
    peak_bf16_flops: float      # per chip [cloud]
    hbm_Bps: float              # per chip [cloud]
    cores: int                  # TensorCores per chip [cloud]; a Pallas "parallel" grid
                                # dimension is split over one device's (device_cores)
    mxu_dim: int                # MXU is mxu_dim x mxu_dim [book]
    mxus_per_chip: int          # [cloud]/[book]
    vpu_f32_ops_per_cycle: int  # per core: 8 sublanes x 128 lanes x ALUs per lane [book]
    eup_ops_per_cycle: int      # per core: transcendental (exp, reciprocal) elements per cycle [assumed]
    vmem_bytes: int = 128 * 2**20  # VMEM per core [book: "128 MiB on TPU v5e"; assumed alike elsewhere]
    link_Bps: float = 4.5e10    # one ICI link, one way [book, chapter "sharding"]
    hop_latency_s: float = 1e-6 # per ICI hop [book, chapter "sharding": "typically around 1us"]
    tile_rows: int = 8          # second-minor tile of a 32-bit array in memory [book]
    tile_cols: int = 128        # minor tile [book]
    host_Bps: float = 1.5e10    # PCIe to the host per chip, each way [book-pcie]
    devices_per_chip: int = 1   # devices the compiler shards over, per chip [libtpu]

    @property
    def clock_hz(self) -> float:
        """[derived] peak / (2 x MXUs x mxu_dim^2)."""
        return self.peak_bf16_flops / (2 * self.mxus_per_chip * self.mxu_dim ** 2)

    @property
    def device_flops(self) -> float:
        """Peak bf16 FLOP/s of one device: the chip's, split over its devices [libtpu]."""
        return self.peak_bf16_flops / self.devices_per_chip

    @property
    def device_hbm_Bps(self) -> float:
        """HBM bandwidth of one device, bytes/s: the chip's, split over its devices [libtpu]."""
        return self.hbm_Bps / self.devices_per_chip

    @property
    def device_cores(self) -> int:
        """TensorCores one device drives (v5p megacore: 2; v4, TPU7x: 1 each)."""
        return max(1, self.cores // self.devices_per_chip)

    @property
    def core_flops(self) -> float:
        return self.peak_bf16_flops / self.cores

    @property
    def core_hbm_Bps(self) -> float:
        return self.hbm_Bps / self.cores


# EUP: one vector register of 8 x 128 elements per cycle per core [assumed]: the transcendental
# unit is a single pipeline beside the 4 VPU ALU slots; no public throughput figure was found.
_EUP = 8 * 128

CHIPS: dict[str, ChipModel] = {
    # v5e: 197 TFLOP/s, 819 GB/s, 1 TensorCore, 4 MXUs of 128x128 [cloud, book]
    "v5e": ChipModel("v5e", 1.97e14, 8.19e11, 1, 128, 4, 8 * 128 * 4, _EUP),
    # v5p: 459 TFLOP/s, 2,765 GB/s, 2 TensorCores (megacore), 4 MXUs of 128x128 each [cloud, book]
    "v5p": ChipModel("v5p", 4.59e14, 2.765e12, 2, 128, 8, 8 * 128 * 4, _EUP, link_Bps=9e10),
    # v6e: 918 TFLOP/s, 1,640 GB/s, 1 TensorCore, MXUs of 256x256 [cloud, book]
    "v6e": ChipModel("v6e", 9.18e14, 1.64e12, 1, 256, 4, 8 * 128 * 4, _EUP, link_Bps=9e10,
                     host_Bps=3.2e10),
    # v4: 275 TFLOP/s, 1,228 GB/s, 2 TensorCores, 4 MXUs of 128x128 each [cloud, book]; libtpu
    # shows each TensorCore as a device [libtpu]
    "v4": ChipModel("v4", 2.75e14, 1.228e12, 2, 128, 8, 8 * 128 * 2, _EUP, devices_per_chip=2),
    # v7x (TPU7x, Ironwood): 2,307 TFLOP/s, 7,380 GB/s, 2 TensorCores [cloud], each its own device
    # [libtpu]; 256x256 MXUs, 64 MiB VMEM per core [jax-tpu-info]; 4 MXUs per core [assumed: as
    # v6e, no public count; it sets the derived clock, 2.2 GHz; libtpu's cycle estimate of a
    # large matmul, 420k FLOP/cycle per core, rules out 2]; one ICI link one way
    # 1.2e12 / 6 links / 2 directions = 1e11 B/s [cloud, assumed 6 links as on v5p's 3D torus];
    # PCIe 3.2e10 B/s [assumed: as v6e, no public figure]
    "v7x": ChipModel("v7x", 2.307e15, 7.38e12, 2, 256, 8, 8 * 128 * 4, _EUP,
                     vmem_bytes=64 * 2**20, link_Bps=1e11, host_Bps=3.2e10, devices_per_chip=2),
}

# Per grid step of a Pallas TPU kernel: the fixed cost of one iteration of the kernel's pipelined
# loop (DMA issue and wait, semaphore bookkeeping, scalar work), paid on top of the step's
# compute/DMA time. [fit] on ONE figure: the Pallas TPU matmul guide's bm=bk=bn=128 kernel on a
# 4096^3 bf16 matmul on TPU v5e, 11.77 ms measured over 32,768 grid steps; the step's own work at
# those blocks (32 kB + 32 kB of DMA, 4.2 MFLOP) is under 0.1 us, so the step costs
# 11.77 ms / 32,768 = 0.359 us, minus the modelled 0.08 us of DMA. That row is reported as fitted.
GRID_STEP_OVERHEAD_S = 0.28e-6

# Sustained fraction of MXU peak an XLA matmul reaches on its padded FLOPs (padding: k and n to
# the MXU width, m to 8 rows, ``kernel_model.matmul_flops``). [fit] on ONE figure: the Pallas
# TPU matmul guide's XLA bf16 8192^3 matmul on TPU v5e, 6,047 us measured by timeit, minus the
# host dispatch (108 us, itself fitted on the 1024^3 row) = 5,939 us of device time against
# 5,582 us at peak: 0.94. That row is reported as fitted; the 4096^3 row checks it. No curve
# over shapes is fitted: no published measurement of XLA matmuls at skinny shapes was found, so
# small shards pay only their padding, the launch overhead and their HBM bytes.
XLA_MXU_EFFICIENCY = 0.94

# Per launched XLA op or kernel: [assumed] equal to one grid step's overhead (a launch is one
# more trip of the core's scalar unit through descriptor setup and a barrier, the same kind of
# work a grid step does). Small against every op of a transformer step.
OP_LAUNCH_S = GRID_STEP_OVERHEAD_S

# Vector work per score element in the splash attention forward step, [derived] by counting the
# vector ops of the compiled splash forward body (jax.experimental.pallas.ops.tpu.splash_attention,
# read from its Mosaic module, ``benchmarks.sim.mosaic``) on a (block_q x block_kv) score tile:
# unmasked: subtract the running max, the max reduction and the sum reduction = 3 f32 VPU ops and
# one exp (EUP) per score; a block the mask cuts through adds the element mask: two iota adds, a
# subtract, two compares, an and, a select = 7 more VPU ops per score. Per (q row, head_dim)
# element and step: the accumulator's rescale and add, and the correction's exp = 2 VPU + 1 EUP.
SPLASH_VPU_OPS_PER_SCORE = 3
SPLASH_MASK_VPU_OPS_PER_SCORE = 7
SPLASH_EUP_OPS_PER_SCORE = 1
SPLASH_VPU_OPS_PER_ACC = 2
SPLASH_EUP_OPS_PER_ACC = 1
# Fraction of a banded mask's visited blocks that the mask cuts through when the compiled program
# does not say: [assumed] the first and last visited block of each q row (a causal mask's diagonal
# and a local window's two edges), i.e. min(1, 2 / visited kv blocks per q row).
SPLASH_PARTIAL_BLOCKS_PER_ROW = 2


def chip_model(generation: str) -> ChipModel:
    """The ChipModel of a generation name ("v5e", "v5p", "v6e", "v4", "v7x"); ValueError
    otherwise."""
    g = str(generation).lower()
    if g not in CHIPS:
        raise ValueError(f"no simulator constants for TPU generation {generation!r}; "
                         f"known: {sorted(CHIPS)}")
    return CHIPS[g]
