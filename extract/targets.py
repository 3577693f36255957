"""TPU targets: slice names -> chip numbers, physical shape, wraparound, and the compiler's devices.

A *target* is one TPU slice the planner compiles for. It is named in any of three spellings:

- the unambiguous form ``GEN:SHAPE`` -- ``v5e:2x4``, ``v6e:4x4``, ``v5p:2x2x1``, ``v4:2x2x2``;
- the chip-count form users know -- ``v5e-8``, ``v6e-16``, ... ``v5e-256`` (v5e / v6e count chips);
- Google Cloud accelerator types -- ``v5litepod-8``, ``v6e-8``, ``v5p-8``, ``v4-8`` (v5p and v4 count
  TensorCores, two per chip, so ``v5p-8`` is 4 chips).

Chip numbers come from the Google Cloud TPU docs and the JAX scaling book
(``shared/facts/tpu.md``); the devices with their physical coordinates come from libtpu's
ahead-of-time topology description (``jax.experimental.topologies.get_topology_desc``), so the
compiler and the planner see the same slice.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import os
import re
import subprocess
import sys
from typing import Any


class TargetError(ValueError):
    """An unknown or malformed target name."""


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    """Per-chip numbers. Units: FLOP/s, bytes, bytes/s, seconds, Hz."""

    generation: str            # "v5e", "v6e", "v5p", "v4"
    device_kind: str           # what jax reports, e.g. "TPU v5 lite"
    peak_bf16_flops: float     # FLOP/s (docs)
    hbm_bytes: int             # HBM per chip: v5e as the compiler reports it (15.75 GiB), else docs
    hbm_bandwidth_Bps: float   # bytes/s (docs)
    links_per_chip: int        # ICI ports (docs)
    link_bandwidth_Bps: float  # one-way bytes/s per link (scaling book)
    hop_latency_s: float       # per ICI hop (scaling book: about 1 us)
    clock_hz: float            # TensorCore clock, derived: peak_bf16_flops / (MXUs x MXU MACs x 2)
    torus_dims: int            # 2 for v5e/v6e, 3 for v5p/v4
    wrap_period: int           # an axis wraps when its length is a multiple of this ... (see wraps())
    wrap_only_full: bool       # ... v5e/v6e: only the full 16-chip axis wraps; v5p/v4: multiples of 4
    devices_per_chip: int = 1

    def wraps(self, axis_len: int) -> bool:
        if self.wrap_only_full:
            return axis_len == self.wrap_period
        return axis_len >= self.wrap_period and axis_len % self.wrap_period == 0


GiB = 1024**3

CHIPS: dict[str, ChipSpec] = {
    # v5e: 197 TFLOP/s bf16 = 4 MXUs x 128x128 MACs x 2 FLOP x 1.5 GHz.
    "v5e": ChipSpec("v5e", "TPU v5 lite", 1.97e14, int(15.75 * GiB), 8.1e11, 4, 4.5e10, 1e-6,
                    1.5e9, 2, 16, True),
    # v6e (Trillium): 918 TFLOP/s = 4 MXUs x 256x256 x 2 x 1.75 GHz.
    "v6e": ChipSpec("v6e", "TPU v6 lite", 9.2e14, int(31.25 * GiB), 1.6e12, 4, 9e10, 1e-6,
                    1.75e9, 2, 16, True),
    # v5p: 459 TFLOP/s per chip (2 TensorCores, megacore) = 8 MXUs x 128x128 x 2 x 1.75 GHz.
    "v5p": ChipSpec("v5p", "TPU v5", 4.59e14, int(95e9), 2.8e12, 6, 9e10, 1e-6,
                    1.75e9, 3, 4, False),
    # v4: 275 TFLOP/s per chip = 8 MXUs x 128x128 x 2 x 1.05 GHz; libtpu shows two devices per chip.
    "v4": ChipSpec("v4", "TPU v4", 2.75e14, int(32e9), 1.2e12, 6, 4.5e10, 1e-6,
                   1.05e9, 3, 4, False, devices_per_chip=2),
}

# Slice shapes for the chip-count spellings (shared/facts/tpu.md).
_2D_SHAPES = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
              128: (8, 16), 256: (16, 16)}
_3D_SHAPES = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
              128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8)}
_GEN_ALIASES = {"v5e": "v5e", "v5litepod": "v5e", "v5lite": "v5e", "v6e": "v6e", "v6": "v6e",
                "v5p": "v5p", "v4": "v4"}

ACCEPTED_FORMS = ("v5e:2x4 | v6e:4x4 | v5p:2x2x1 | v4:2x2x2 (GEN:SHAPE), "
                  "v5e-8 | v6e-16 (chips), v5litepod-8 | v5p-8 | v4-8 (Cloud accelerator types; "
                  "v5p/v4 count TensorCores)")

# The targets `aoizora targets` lists.
STANDARD_TARGETS = ("v5e-4", "v5e-8", "v5e-16", "v5e-32", "v5e-64", "v5e-256",
                    "v6e-4", "v6e-8", "v6e-16", "v5p-8", "v5p-16", "v5p-128", "v4-8", "v4-16")


@dataclasses.dataclass(frozen=True)
class Target:
    """One TPU slice: chip numbers, physical shape and wraparound per axis."""

    name: str                  # canonical "GEN:SHAPE", e.g. "v5e:2x4"
    chip: ChipSpec
    shape: tuple[int, ...]     # chips along each physical axis (x, y[, z])
    wrap: tuple[bool, ...]     # wraparound link on each physical axis

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
        """The chip-count spelling (v5e-8), or the Cloud type for v5p/v4 (v5p-8 = 4 chips)."""
        if self.chip.torus_dims == 2:
            return f"{self.generation}-{self.chips}"
        return f"{self.generation}-{2 * self.chips}"

    def to_json(self) -> dict[str, Any]:
        c = self.chip
        return {
            "name": self.short_name, "canonical": self.name, "generation": self.generation,
            "device_kind": c.device_kind, "chips": self.chips, "devices": self.num_devices,
            "shape": list(self.shape), "wrap": list(self.wrap),
            "peak_bf16_flops": c.peak_bf16_flops, "hbm_bytes": c.hbm_bytes,
            "hbm_bandwidth_Bps": c.hbm_bandwidth_Bps, "links_per_chip": c.links_per_chip,
            "link_bandwidth_Bps": c.link_bandwidth_Bps, "hop_latency_s": c.hop_latency_s,
            "clock_hz": c.clock_hz,
        }

    def devices(self) -> list:
        """The compiler's devices for this slice (TPU device objects with `.coords`), by id."""
        return list(_topology_devices(self.name))

    def device_coords(self) -> list[tuple[int, ...]]:
        """Physical chip coordinates of each device, indexed by position in `devices()`."""
        nd = len(self.shape)
        return [tuple(int(v) for v in d.coords[:nd]) for d in self.devices()]


def _shape_from_str(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.lower().split("x"))


def get_target(name: "str | Target") -> Target:
    """Parse any accepted spelling into a Target; raise TargetError with the accepted forms."""
    if isinstance(name, Target):
        return name
    raw = str(name).strip()
    s = raw.lower()
    m = re.fullmatch(r"(v5e|v6e|v5p|v4|v5litepod|v5lite|v6)[:](\d+(?:x\d+){1,2})", s)
    if m:
        gen = _GEN_ALIASES[m.group(1)]
        shape = _shape_from_str(m.group(2))
        chip = CHIPS[gen]
        if len(shape) != chip.torus_dims:
            raise TargetError(f"target {raw!r}: {gen} slices have {chip.torus_dims} axes; "
                              f"accepted forms: {ACCEPTED_FORMS}")
        return _make(gen, shape)
    m = re.fullmatch(r"(v5e|v6e|v5p|v4|v5litepod|v5lite|v6)-(\d+)", s)
    if m:
        gen = _GEN_ALIASES[m.group(1)]
        n = int(m.group(2))
        chip = CHIPS[gen]
        if chip.torus_dims == 2:
            shape = _2D_SHAPES.get(n)
        else:
            shape = _3D_SHAPES.get(n // 2) if n % 2 == 0 else None
        if shape is None:
            raise TargetError(f"target {raw!r}: no {gen} slice of that size; "
                              f"accepted forms: {ACCEPTED_FORMS}")
        return _make(gen, shape)
    raise TargetError(f"unknown target {raw!r}; accepted forms: {ACCEPTED_FORMS}")


def _make(gen: str, shape: tuple[int, ...]) -> Target:
    chip = CHIPS[gen]
    if any(v < 1 for v in shape):
        raise TargetError(f"target {gen}:{'x'.join(map(str, shape))}: axes must be >= 1")
    return Target(name=f"{gen}:{'x'.join(map(str, shape))}", chip=chip, shape=shape,
                  wrap=tuple(chip.wraps(v) for v in shape))


def standard_targets() -> list[Target]:
    return [get_target(n) for n in STANDARD_TARGETS]


# ---------------------------------------------------------------------------------------------
# libtpu ahead of time, on a machine without a TPU

# libtpu looks for a TPU VM's metadata on start-up; without these it prints warnings about
# TPU_ACCELERATOR_TYPE / TPU_WORKER_HOSTNAMES. Values for one local, ahead-of-time worker; a user
# running on a real TPU VM has them set already, and setdefault leaves those alone.
_LIBTPU_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v5litepod-8",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
    # Ahead-of-time compiles touch no chip: let several processes (tests, compile workers) load libtpu.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def on_tpu_vm() -> bool:
    """True on a machine with TPU chips attached (then libtpu must find its real settings)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def prepare_libtpu_env() -> None:
    """Set what libtpu needs to initialise quietly for ahead-of-time compilation.

    Only on a machine without TPU chips; values a user set are kept."""
    if on_tpu_vm():
        return
    for k, v in _LIBTPU_ENV.items():
        os.environ.setdefault(k, v)


@functools.lru_cache(maxsize=None)
def _topology_devices(canonical: str) -> tuple:
    prepare_libtpu_env()
    if os.environ.get("_AOIZORA_LIBTPU_PROBE") != "1":
        check_libtpu_args()      # before libtpu reads LIBTPU_INIT_ARGS (it exits on a bad one)
    from jax.experimental import topologies

    dims = [int(x) for x in canonical.split(":")[1].split("x")] + [1, 1]
    # a host holds up to 2x2x1 chips; a smaller slice (v5e-1) is one smaller host
    bounds = tuple(min(d, h) for d, h in zip(dims, (2, 2, 1)))
    try:
        topo = topologies.get_topology_desc(
            platform="tpu", topology_name=canonical, chip_config_name="default",
            chips_per_host_bounds=bounds, num_slices=1)
    except Exception as e:  # libtpu missing or the shape unknown to it
        raise TargetError(f"libtpu cannot describe {canonical}: {str(e).splitlines()[0]} "
                          f"(install the project: pip install -e .)") from e
    return tuple(sorted(topo.devices, key=lambda d: d.id))


class LibtpuArgsError(TargetError):
    """libtpu refuses the options in ``LIBTPU_INIT_ARGS`` (a configuration error)."""


def check_libtpu_args() -> None:
    """Refuse a ``LIBTPU_INIT_ARGS`` libtpu does not accept (an unknown flag, a bad value) before
    libtpu initialises in this process: libtpu reads it once, when it first initialises, and on
    a bad flag exits the process with code 1 (the code a CI gate reads as a regression). So a
    child process initialises libtpu with it first (about 3 s, once per process and value;
    nothing when the variable is empty). Called before every in-process initialisation
    (``Target.devices``).

    Raises:
        LibtpuArgsError: libtpu refused the options; the message gives libtpu's own line.
    """
    said = _libtpu_args_refusal(os.environ.get("LIBTPU_INIT_ARGS", "").strip())
    if said:
        raise LibtpuArgsError(said)


@functools.lru_cache(maxsize=None)
def _libtpu_args_refusal(args: str, timeout_s: float = 180.0) -> str:
    """The one-line error for ``LIBTPU_INIT_ARGS=args`` ("" when libtpu accepts it, when libtpu
    is unavailable, or when the probe gives no verdict in ``timeout_s``)."""
    if not args:
        return ""
    code = ("import sys; from aoizora.extract.targets import libtpu_available; "
            "sys.exit(0 if libtpu_available() else 3)")
    env = {**os.environ, "LIBTPU_INIT_ARGS": args, "_AOIZORA_LIBTPU_PROBE": "1"}
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired:
        return ""
    if r.returncode in (0, 3):   # accepted, or libtpu unavailable (said where it matters)
        return ""
    lines = [ln.strip() for ln in r.stderr.splitlines() if ln.strip()]
    said = next((ln for ln in lines if ln.startswith("ERROR:")), lines[-1] if lines else "")
    said = said[:200] or f"exit code {r.returncode}"
    return (f"LIBTPU_INIT_ARGS={args!r}: libtpu refuses it ({said}); fix or unset "
            f"LIBTPU_INIT_ARGS")


def libtpu_available() -> bool:
    """True when libtpu's ahead-of-time compiler can be used here."""
    try:
        _topology_devices("v5e:2x2")
        return True
    except Exception:
        return False

