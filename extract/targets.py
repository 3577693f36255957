"""Targets: a name (or a topology file) -> one family-neutral `Target`, resolved once.

Families (``aoizora.extract.hardware``):

- TPU slices (``hardware.tpu``): ``v5e:2x4`` / ``v5e-8`` / ``v5litepod-8`` / ``v5p-8`` /
  ``v7x-8`` ...;
- GPU boxes and clusters (``hardware.gpu``): ``h100-8``, ``a100-8``, ``l40-8``, ``h100-16``;
- a user's own GPU box (``hardware.topology_files``): ``topo:FILE`` or a path to a file holding
  ``nvidia-smi topo -m`` output or NCCL's topology XML (``NCCL_TOPO_DUMP_FILE``).

The records (`Target`, `ChipSpec`, `Fabric`, `Link`) are in ``hardware.records``; this module
re-exports them with the TPU helpers the rest of the package uses.
"""

from __future__ import annotations

import os

from aoizora.extract.hardware import gpu, topology_files, tpu
from aoizora.extract.hardware.records import ChipSpec, Fabric, Link, Target, TargetError
from aoizora.extract.hardware.tpu import (CHIPS, GiB, LibtpuArgsError, check_libtpu_args,
                                          libtpu_available, on_tpu_vm, prepare_libtpu_env)

__all__ = ["ACCEPTED_FORMS", "CHIPS", "ChipSpec", "Fabric", "GiB", "LibtpuArgsError", "Link",
           "STANDARD_TARGETS", "Target", "TargetError", "check_libtpu_args", "get_target",
           "libtpu_available", "on_tpu_vm", "prepare_libtpu_env", "standard_targets"]

ACCEPTED_FORMS = (tpu.ACCEPTED_FORMS + "; GPU: " + " | ".join(gpu.GPU_TARGETS)
                  + " | topo:FILE (nvidia-smi topo -m text or NCCL topology XML)")

# The targets `aoizora targets` lists.
STANDARD_TARGETS = tpu.STANDARD_TARGETS + gpu.GPU_TARGETS


def get_target(name: "str | Target") -> Target:
    """Parse any accepted spelling into a Target.

    Args:
        name: a TPU or GPU target name, ``topo:FILE``, a path to a topology file, or a Target.
    Returns:
        The Target (a Target is returned as is).
    Raises:
        TargetError: an unknown name (the message lists the accepted forms) or a bad file."""
    if isinstance(name, Target):
        return name
    raw = str(name).strip()
    for family in (tpu, gpu):
        t = family.parse(raw)
        if t is not None:
            return t
    if raw.lower().startswith("topo:"):
        return topology_files.target_from_file(raw[5:])
    if raw and (os.sep in raw or raw.endswith((".txt", ".xml"))) and os.path.isfile(raw):
        return topology_files.target_from_file(raw)
    raise TargetError(f"unknown target {raw!r}; accepted forms: {ACCEPTED_FORMS}")


def standard_targets() -> list[Target]:
    """The targets `aoizora targets` lists: TPU slices, then the GPU boxes and cluster."""
    return [get_target(n) for n in STANDARD_TARGETS]
