"""Replica groups and permute pairs of HLO collectives, in all the spellings XLA prints.

Every function returns *logical* ids: positions in the compiled program's device assignment
(``mesh.devices.flat``), exactly as the compiler names them.

Spellings (``replica_groups=...``):
- explicit lists: ``{{0,1},{2,3}}``; ``{}`` means one group of all devices;
- iota: ``[G,S]<=[N]`` or ``[G,S]<=[d0,d1,...]T(p0,p1,...)``: the ids
  ``arange(N).reshape(d).transpose(p).reshape(G, S)``, one group per row;
- mesh form: ``mesh['a'=2,'b'=4] {'b'}`` or ``mesh['a'=1,'b'=8,'c'=2], device_ids=([2,8]T(1,0))
  {'b'}``: the device array (iota, or the ``device_ids`` tile assignment) reshaped to the axis
  sizes; the listed axes (``'b'``, or a sub-axis ``'b':(pre)size``) vary inside a group, the other
  axes index the groups. This mirrors XLA's ``MeshAxesReplicaGroupList``: each axis with
  sub-axes is reshaped to ``[pre, size, rest]`` pieces, grouped axes are transposed to the end in
  the listed order, and consecutive runs of the group size are the groups.
- ``source_target_pairs={{0,1},{1,2}}`` for collective-permute.
"""

from __future__ import annotations

import re

import numpy as np


class ReplicaGroupError(ValueError):
    """A replica-group spelling this parser does not know (the message shows it)."""


_INT_LIST = re.compile(r"^\s*\[([\d,\s]*)\]")


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v.strip()]


def parse_iota_array(text: str) -> np.ndarray:
    """An iota tile assignment ``[dims]`` / ``[dims]T(perm)`` / ``[dims]<=[rdims]T(perm)``.

    Returns the id array: shape ``dims`` for the ``<=`` form; for ``[dims]T(perm)`` the
    transposed array (only the flattened order matters to callers)."""
    t = text.strip()
    m = re.fullmatch(r"\[([\d,\s]*)\]\s*(?:<=\s*\[([\d,\s]*)\])?\s*(?:T\(([\d,\s]*)\))?", t)
    if not m:
        raise ReplicaGroupError(f"cannot read the iota device list {text!r}: expected "
                                f"[dims]<=[reshape]T(perm) or [dims]T(perm)")
    dims = _ints(m.group(1))
    rdims = _ints(m.group(2)) if m.group(2) is not None else list(dims)
    n = int(np.prod(dims)) if dims else 1
    if int(np.prod(rdims)) != n:
        raise ReplicaGroupError(f"iota device list {text!r}: {dims} and {rdims} differ in size")
    arr = np.arange(n).reshape(rdims)
    if m.group(3) is not None:
        perm = _ints(m.group(3))
        if sorted(perm) != list(range(len(rdims))):
            raise ReplicaGroupError(f"iota device list {text!r}: T{tuple(perm)} is not a "
                                    f"permutation of {len(rdims)} dims")
        arr = arr.transpose(perm)
    if m.group(2) is None:          # "[dims]T(perm)": the dims are the ones before the transpose
        return arr
    return arr.reshape(dims)


def _explicit_groups(text: str) -> list[list[int]]:
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        raise ReplicaGroupError(f"cannot read replica groups {text!r}")
    inner = t[1:-1].strip()
    if not inner:
        return []
    groups = re.findall(r"\{([^{}]*)\}", inner)
    rebuilt = ",".join("{" + g + "}" for g in groups)
    if re.sub(r"\s", "", rebuilt) != re.sub(r"\s", "", inner):
        raise ReplicaGroupError(f"cannot read replica groups {text!r}: expected {{{{a,b}},{{c,d}}}}")
    return [_ints(g) for g in groups]


_MESH = re.compile(
    r"^mesh\[(?P<axes>[^\]]*)\]\s*(?:,\s*device_ids=\((?P<ids>[^()]*(?:\([^()]*\))?)\))?\s*"
    r"\{(?P<group>[^}]*)\}\s*$")
_AXIS_DEF = re.compile(r"^\s*'?([^'=]+?)'?\s*=\s*(\d+)\s*$")
_AXIS_REF = re.compile(r"^\s*'?([^':]+?)'?\s*(?::\((\d+)\)(\d+))?\s*$")


def _mesh_groups(text: str) -> list[list[int]]:
    m = _MESH.match(text.strip())
    if not m:
        raise ReplicaGroupError(f"cannot read mesh replica groups {text!r}: expected "
                                f"mesh['a'=2,...][, device_ids=(...)] {{'a',...}}")
    names: list[str] = []
    sizes: list[int] = []
    for a in m.group("axes").split(","):
        if not a.strip():
            continue
        ma = _AXIS_DEF.match(a)
        if not ma:
            raise ReplicaGroupError(f"mesh replica groups {text!r}: cannot read axis {a!r}")
        names.append(ma.group(1))
        sizes.append(int(ma.group(2)))
    n = int(np.prod(sizes)) if sizes else 1
    if m.group("ids"):
        ids = parse_iota_array(m.group("ids")).reshape(-1)
        if ids.size != n:
            raise ReplicaGroupError(f"mesh replica groups {text!r}: {ids.size} device ids for a "
                                    f"mesh of {n}")
    else:
        ids = np.arange(n)
    # axis refs in the group: full axes or sub-axes 'a':(pre)size
    refs: list[tuple[int, int | None, int | None]] = []
    for g in m.group("group").split(","):
        if not g.strip():
            continue
        mg = _AXIS_REF.match(g)
        if not mg or mg.group(1) not in names:
            raise ReplicaGroupError(f"mesh replica groups {text!r}: unknown axis {g.strip()!r}")
        ax = names.index(mg.group(1))
        pre = int(mg.group(2)) if mg.group(2) else None
        size = int(mg.group(3)) if mg.group(3) else None
        refs.append((ax, pre, size))
    # Reshape every axis that has sub-axis refs into [pre, size, rest] pieces.
    by_axis: dict[int, list[tuple[int, int, int]]] = {}
    for k, (ax, pre, size) in enumerate(refs):
        if pre is not None:
            by_axis.setdefault(ax, []).append((pre, size, k))
        elif ax in by_axis:
            raise ReplicaGroupError(f"mesh replica groups {text!r}: axis used whole and split")
    new_sizes: list[int] = []
    ref_dim: dict[int, int] = {}
    for ax, full in enumerate(sizes):
        subs = sorted(by_axis.get(ax, []))
        if not subs:
            for k, (a2, _, _) in enumerate(refs):
                if a2 == ax:
                    ref_dim[k] = len(new_sizes)
            new_sizes.append(full)
            continue
        prefix = 1
        for pre, size, k in subs:
            if pre % prefix:
                raise ReplicaGroupError(f"mesh replica groups {text!r}: overlapping sub-axes")
            if pre != prefix:
                new_sizes.append(pre // prefix)
                prefix = pre
            ref_dim[k] = len(new_sizes)
            new_sizes.append(size)
            prefix *= size
        if full % prefix:
            raise ReplicaGroupError(f"mesh replica groups {text!r}: sub-axes do not divide {full}")
        if prefix != full:
            new_sizes.append(full // prefix)
    grouped = [ref_dim[k] for k in range(len(refs))]
    others = [d for d in range(len(new_sizes)) if d not in grouped]
    arr = ids.reshape(new_sizes).transpose(others + grouped)
    gsize = int(np.prod([new_sizes[d] for d in grouped])) if grouped else 1
    return arr.reshape(-1, gsize).tolist()


def parse_replica_groups(text: str | None, num_devices: int) -> list[list[int]]:
    """Replica groups of a collective, as lists of logical ids.

    `num_devices` (partitions x replicas) is used for the empty spelling ``{}`` (one group of all
    devices) and to check the ids. Raises ReplicaGroupError on any unknown spelling."""
    if text is None:
        return [list(range(num_devices))]
    t = text.strip()
    if t.startswith("mesh["):
        groups = _mesh_groups(t)
    elif t.startswith("["):
        m = re.fullmatch(r"\[\s*(\d+)\s*,\s*(\d+)\s*\]\s*<=\s*(.*)", t)
        if not m:
            raise ReplicaGroupError(f"cannot read iota replica groups {text!r}: expected "
                                    f"[G,S]<=[dims] or [G,S]<=[dims]T(perm)")
        g, s = int(m.group(1)), int(m.group(2))
        arr = parse_iota_array(f"[{g},{s}]<={m.group(3)}")
        groups = arr.tolist()
    elif t.startswith("{"):
        groups = _explicit_groups(t)
        if not groups:
            groups = [list(range(num_devices))]
    else:
        raise ReplicaGroupError(f"unknown replica-group spelling {text!r}")
    flat = [i for g in groups for i in g]
    if flat and (min(flat) < 0 or max(flat) >= num_devices):
        raise ReplicaGroupError(f"replica groups {text!r} name ids outside 0..{num_devices - 1}")
    if len(set(flat)) != len(flat):
        raise ReplicaGroupError(f"replica groups {text!r} repeat an id")
    return [[int(i) for i in g] for g in groups]


def parse_source_target_pairs(text: str, num_devices: int | None = None) -> list[tuple[int, int]]:
    """``{{0,1},{1,2}}`` -> [(0, 1), (1, 2)] (collective-permute)."""
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        raise ReplicaGroupError(f"cannot read source_target_pairs {text!r}")
    groups = _explicit_groups(t)
    pairs: list[tuple[int, int]] = []
    for g in groups:
        if len(g) != 2:
            raise ReplicaGroupError(f"source_target_pairs {text!r}: {g} is not a pair")
        if num_devices is not None and not all(0 <= v < num_devices for v in g):
            raise ReplicaGroupError(f"source_target_pairs {text!r} name ids outside "
                                    f"0..{num_devices - 1}")
        pairs.append((g[0], g[1]))
    return pairs
