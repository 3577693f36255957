"""The TPU family: slice names -> chip numbers, physical shape, wraparound, and libtpu's devices.

A TPU target is one slice, named in any of three spellings:

- the unambiguous form ``GEN:SHAPE`` -- ``v5e:2x4``, ``v6e:4x4``, ``v5p:2x2x1``, ``v4:2x2x2``,
  ``v7x:2x2x1``;
- the chip-count form users know -- ``v5e-8``, ``v6e-16``, ... ``v5e-256`` (v5e / v6e count chips);
- Google Cloud accelerator types -- ``v5litepod-8``, ``v6e-8``, ``v5p-8``, ``v4-8``, ``v7x-8`` /
  ``tpu7x-8`` (v5p, v4 and v7x count TensorCores, two per chip, so ``v5p-8`` and ``v7x-8`` are
  4 chips).

libtpu names TPU7x slices ``TPU7x:2x2x1`` (it refuses ``v7x:...``); the canonical name here stays
``v7x:2x2x1`` and ``_LIBTPU_GEN`` translates it when asking libtpu for the devices.

Chip numbers come from the Google Cloud TPU docs and the JAX scaling book
(``shared/facts/tpu.md``); the devices with their physical coordinates come from libtpu's
ahead-of-time topology description (``jax.experimental.topologies.get_topology_desc``), so the
compiler and the planner see the same slice.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
import sys

from aoizora.extract.hardware.records import ChipSpec, Target, TargetError

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
    # v7x (Ironwood, "TPU7x"), per chip, https://docs.cloud.google.com/tpu/docs/tpu7x
    # ("System architecture" table): 2,307 TFLOP/s bf16, 192 GiB HBM, 7,380 GB/s HBM bandwidth,
    # 2 TensorCores per chip, 1,200 GB/s bidirectional ICI per chip. libtpu 0.0.42.1 shows each
    # TensorCore as its own device (device_kind "TPU7x", core_on_chip 0 and 1): 2 per chip.
    # [assumed] 6 ICI links per chip, a 3D torus wrapping like v5p (the page: TPU7x "shares many
    # similarities with TPU v5p"; 9,216-chip pods), so one link one way = 1.2e12 / 6 / 2 = 1e11 B/s.
    # [assumed] clock = 2307e12 / (8 MXUs x 256 x 256 x 2) = 2.2 GHz: 256x256 MXUs (jax 0.10.2
    # tpu_info, TPU_7X mxu_column_size 256) and 4 per TensorCore as on v6e (no public count).
    # libtpu 0.0.42.1 agrees: it estimates a 4096x8192x8192 bf16 matmul on one v7x device at
    # 1,307,304 cycles = 420k FLOP/cycle, more than 2 MXUs could do (262k), 80% of 4 (524k;
    # the same check gives 88% on v6e at 1.75 GHz and 97% on v5e at 1.5 GHz).
    "v7x": ChipSpec("v7x", "TPU7x", 2.307e15, 192 * GiB, 7.38e12, 6, 1e11, 1e-6,
                    2.2e9, 3, 4, False, devices_per_chip=2),
}

# Slice shapes for the chip-count spellings (shared/facts/tpu.md).
_2D_SHAPES = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
              128: (8, 16), 256: (16, 16)}
_3D_SHAPES = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
              128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8)}
_GEN_ALIASES = {"v5e": "v5e", "v5litepod": "v5e", "v5lite": "v5e", "v6e": "v6e", "v6": "v6e",
                "v5p": "v5p", "v4": "v4", "v7x": "v7x", "tpu7x": "v7x"}
# libtpu's own generation names where they differ from the canonical ones
_LIBTPU_GEN = {"v7x": "TPU7x"}

ACCEPTED_FORMS = ("v5e:2x4 | v6e:4x4 | v5p:2x2x1 | v4:2x2x2 | v7x:2x2x1 (GEN:SHAPE), "
                  "v5e-8 | v6e-16 (chips), v5litepod-8 | v5p-8 | v4-8 | v7x-8 | tpu7x-8 (Cloud "
                  "accelerator types; v5p/v4/v7x count TensorCores)")

# The TPU targets `aoizora targets` lists.
STANDARD_TARGETS = ("v5e-4", "v5e-8", "v5e-16", "v5e-32", "v5e-64", "v5e-256",
                    "v6e-4", "v6e-8", "v6e-16", "v5p-8", "v5p-16", "v5p-128", "v4-8", "v4-16",
                    "v7x-8", "v7x-16")

_GEN = r"(v5e|v6e|v5p|v4|v7x|tpu7x|v5litepod|v5lite|v6)"


def _shape_from_str(s: str) -> tuple[int, ...]:
    return tuple(int(v) for v in s.lower().split("x"))


def parse(raw: str) -> Target | None:
    """The TPU target of a spelling, None when it is not a TPU spelling at all.

    Raises:
        TargetError: a TPU generation with a shape or size no slice has."""
    s = raw.strip().lower()
    m = re.fullmatch(_GEN + r"[:](\d+(?:x\d+){1,2})", s)
    if m:
        gen = _GEN_ALIASES[m.group(1)]
        shape = _shape_from_str(m.group(2))
        chip = CHIPS[gen]
        if len(shape) != chip.torus_dims:
            raise TargetError(f"target {raw!r}: {gen} slices have {chip.torus_dims} axes; "
                              f"accepted forms: {ACCEPTED_FORMS}")
        return make(gen, shape)
    m = re.fullmatch(_GEN + r"-(\d+)", s)
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
        return make(gen, shape)
    return None


def make(gen: str, shape: tuple[int, ...]) -> Target:
    """The slice of generation `gen` with `shape` chips per axis.

    Raises:
        TargetError: an axis below 1."""
    chip = CHIPS[gen]
    if any(v < 1 for v in shape):
        raise TargetError(f"target {gen}:{'x'.join(map(str, shape))}: axes must be >= 1")
    return Target(name=f"{gen}:{'x'.join(map(str, shape))}", chip=chip, shape=shape,
                  wrap=tuple(chip.wraps(v) for v in shape), compiler=compiler_devices)


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

    gen, shape = canonical.split(":")
    dims = [int(x) for x in shape.split("x")] + [1, 1]
    # a host holds up to 2x2x1 chips; a smaller slice (v5e-1) is one smaller host
    bounds = tuple(min(d, h) for d, h in zip(dims, (2, 2, 1)))
    try:
        topo = topologies.get_topology_desc(
            platform="tpu", topology_name=f"{_LIBTPU_GEN.get(gen, gen)}:{shape}",
            chip_config_name="default",
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


def compiler_devices(target: Target) -> tuple:
    """libtpu's devices of the slice (TPU device objects with `.coords`), by id.

    Raises:
        TargetError: libtpu is missing or does not know the shape."""
    return _topology_devices(target.name)


def libtpu_available() -> bool:
    """True when libtpu's ahead-of-time compiler can be used here."""
    try:
        _topology_devices("v5e:2x2")
        return True
    except Exception:
        return False
