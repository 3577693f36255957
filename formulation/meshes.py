"""Candidate logical meshes: every ordered factorization of the device count into 1, 2 or 3 axes
(each longer than 1), named x, y, z from major to minor as in ``jax.make_mesh``."""

from __future__ import annotations

AXIS_NAMES = ("x", "y", "z")


def candidate_meshes(num_devices: int, max_axes: int = 3) -> list[dict[str, int]]:
    """E.g. 8 -> [{x:8}, {x:2,y:4}, {x:4,y:2}, {x:2,y:2,z:2}]; 1 -> [{x:1}]."""
    if num_devices < 1:
        raise ValueError(f"a mesh needs at least one device, got {num_devices}")
    if num_devices == 1:
        return [{"x": 1}]
    out: list[tuple[int, ...]] = []

    def rec(rest: int, prefix: tuple[int, ...]) -> None:
        if rest == 1:
            if prefix:
                out.append(prefix)
            return
        if len(prefix) == max_axes:
            return
        for f in range(2, rest + 1):
            if rest % f == 0:
                rec(rest // f, prefix + (f,))

    rec(num_devices, ())
    out.sort(key=lambda s: (len(s), s))
    return [dict(zip(AXIS_NAMES, s)) for s in out]
