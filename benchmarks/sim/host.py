"""Host offload in a compiled program: the transfers between HBM and host memory, and where they
sit in the schedule.

XLA:TPU spells host memory as memory space 5 in a layout (``{...S(5)}``). An offloading remat
policy (``save_and_offload_only_these_names(..., offload_dst="pinned_host")``) compiles to async
pairs whose operand or result lives there:

- ``dynamic-update-slice-start`` into an ``S(5)`` buffer / ``-done``: device -> host, the update's
  bytes (a scan's residual written into its stacked host buffer);
- ``dynamic-slice-start`` from an ``S(5)`` buffer / ``-done``: host -> device, the slice's bytes;
- ``copy-start`` / ``copy-done`` with the destination (first tuple element) or the source in
  ``S(5)``: the copied bytes, direction from which side is the host (copies between HBM and other
  spaces, e.g. ``S(1)`` VMEM prefetches, are not host transfers);
- ``custom-call`` ``MoveToHost`` / ``MoveToDevice`` left in a compiled program: a synchronous
  transfer of its result's bytes.

Each transfer is placed in the schedule by its computation's compute ops (evidence positions):
released just after the last compute op before its start, waited for just before the first
compute op after its done, so the compute scheduled between them overlaps it. Units: bytes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

HOST_SPACE = "S(5)"
_ARRAY = re.compile(r"\b[a-z]+\d*\[[\d,]*\](\{[^}]*\})?")
_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+([a-z][\w\-]*)\(")


@dataclasses.dataclass(frozen=True)
class HostTransfer:
    """One transfer between HBM and host memory (module docstring)."""

    name: str               # the start instruction (or the custom call)
    to_host: bool           # device -> host; else host -> device
    bytes: int
    start_key: float        # schedule position just after the last compute op before the start
    done_key: float         # schedule position just before the first compute op after the done
    count: int              # runs per step (the trip counts around it)


def host_flags(hlo_text: str) -> dict[str, list[bool]]:
    """Instruction name -> per array of its result (tuples flattened in order): in host memory."""
    out: dict[str, list[bool]] = {}
    for line in hlo_text.splitlines():
        m = _LINE.match(line)
        if m and HOST_SPACE in m.group(2):
            out[m.group(1)] = [HOST_SPACE in (a.group(1) or "") for a in _ARRAY.finditer(m.group(2))]
    return out


def _transfer(ins: Any, comp: Any, flags: dict[str, list[bool]]) -> tuple[bool, int] | None:
    """(to_host, bytes) of a start instruction or host custom call; None if it is not one."""
    op = ins.opcode
    if op == "custom-call" and getattr(ins, "custom_call_target", "") in ("MoveToHost",
                                                                           "MoveToDevice"):
        return ins.custom_call_target == "MoveToHost", int(ins.shape.bytes)
    if not op.endswith("-start") or op not in ("copy-start", "dynamic-update-slice-start",
                                               "dynamic-slice-start"):
        return None
    mine = flags.get(ins.name, [])
    src = comp.by_name.get(ins.operands[0]) if ins.operands else None
    src_host = bool(src is not None and any(flags.get(src.name, [])))
    arrays = ins.shape.arrays()
    if op == "copy-start":
        dst_host = bool(mine and mine[0])
        if dst_host == src_host:
            return None
        return dst_host, int(arrays[0].bytes)
    if op == "dynamic-update-slice-start":
        if not any(mine):
            return None
        upd = comp.by_name.get(ins.operands[1]) if len(ins.operands) > 1 else None
        return True, int(upd.shape.bytes if upd is not None else 0)
    if not src_host:
        return None
    n_ops = len(ins.operands)
    return False, int(arrays[n_ops].bytes if len(arrays) > n_ops else 0)


def host_transfers(module: Any, hlo_text: str, positions: dict[str, tuple[int, int]]
                   ) -> tuple[list[HostTransfer], list[str]]:
    """Every host transfer of ``module`` placed in the schedule.

    Args:
        module: the parsed HLO module (``aoizora.extract.hlo``).
        hlo_text: its text (memory spaces are read from it).
        positions: compute op name -> (schedule position, count), from the evidence.
    Returns:
        (transfers, notes); a transfer in a computation with no compute op of the evidence is
        left out and named in the notes.
    """
    flags = host_flags(hlo_text)
    out: list[HostTransfer] = []
    notes: list[str] = []
    for comp in module.computations.values():
        found = []
        for i, ins in enumerate(comp.instructions):
            got = _transfer(ins, comp, flags)
            if got is None:
                continue
            done_i = i
            if ins.opcode != "custom-call":
                done_i = next((j for j in range(i + 1, len(comp.instructions))
                               if ins.name in comp.instructions[j].operands
                               and comp.instructions[j].opcode.endswith("-done")), i)
            found.append((ins, got, i, done_i))
        if not found:
            continue
        pos = [(j, positions[x.name]) for j, x in enumerate(comp.instructions) if x.name in positions]
        if not pos:
            notes.append(f"{len(found)} host transfer(s) in {comp.name}, which has no compute op "
                         "in the evidence: not priced")
            continue
        count = pos[0][1][1]
        for ins, (to_host, nb), i, d in found:
            before = [p for j, (p, _) in pos if j < i]
            after = [p for j, (p, _) in pos if j > d]
            s = (before[-1] if before else pos[0][1][0] - 1) + 0.5
            e = (after[0] if after else pos[-1][1][0] + 1) - 0.5
            out.append(HostTransfer(ins.name, to_host, nb, s, max(s, e), count))
    return out, notes
