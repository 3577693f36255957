"""What the planner's loop prices: given layouts (``Seed``) and compiled candidates
(``Candidate``), and the names it files them under."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Any, Callable

from aoizora.extract.evidence import Evidence
from aoizora.formulation.latency import Q2
from aoizora.formulation.layout import Layout
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.sharding import ShardingSolution


@dataclasses.dataclass
class Seed:
    """A given layout to price alongside the ILP's, optionally of its own variant of the program
    (e.g. an expert configuration that pads the sequence less): ``fn`` / ``args`` default to the
    planned program; ``program`` says what differs (recorded in the plan, e.g. pad_multiple).
    ``retraceable``: the same configuration laid out on its step as traced with every residual
    kept (``aoizora.runtime.rematerialize.retraceable``), on which the seed's refinement lets the ILP
    decide the remat (``aoizora.planning.seed_refinement``); None for a step whose remat is not offered."""

    layout: Layout
    fn: Callable | None = None
    args: tuple | None = None
    program: dict[str, Any] = dataclasses.field(default_factory=dict)
    retraceable: "Seed | None" = None


@dataclasses.dataclass
class Candidate:
    """One (mesh, layout) the loop compiled and priced."""

    iteration: int
    mesh_axes: dict[str, int]
    solution: ShardingSolution
    evidence: Evidence | None = None
    fits: bool | None = None
    placement: list[int] | None = None
    placement_cert: Certificate | None = None
    q2: Q2 | None = None
    q2_default: Q2 | None = None
    default_order: list[int] | None = None
    compile_s: float = 0.0
    compile_started_s: float | None = None   # seconds into planning (compiles run in background)
    cached: bool = False              # its evidence came from the evidence cache (no compile)
    error: str = ""
    seed: Seed | None = None          # set when the layout was given, not solved

    @property
    def q1_s(self) -> float:
        return float(self.solution.predicted.get("total_s", math.inf))

    @property
    def from_ilp(self) -> bool:
        """The layout is the sharding ILP's (not a seed's, nor a seed refined)."""
        return not self.solution.certificate.detail.get("seed")

    def summary(self) -> dict[str, Any]:
        return {
            "mesh": dict(self.mesh_axes), "layout": self.solution.layout.name,
            "q1_s": self.q1_s if math.isfinite(self.q1_s) else None,
            "seed": self.seed.program if self.seed is not None else None,
            "fits_hbm": self.fits, "compile_s": round(self.compile_s, 3),
            "evidence": "cache" if self.cached else "compiled",
            "compile_started_s": (round(self.compile_started_s, 3)
                                  if self.compile_started_s is not None else None),
            "q2_step_s": self.q2.step_s if self.q2 else None,
            "q2_default_order_step_s": self.q2_default.step_s if self.q2_default else None,
            "placement_status": self.placement_cert.status if self.placement_cert else None,
            "error": self.error or None,
        }


def layout_id(mesh_axes: dict[str, int], layout: Layout) -> str:
    """A layout's identity on a mesh, whatever its name and the names and order of the mesh's
    axes (the loop compiles each once). A layout on mesh 2x4x2 and its twin on 4x2x2 that splits
    the same tensors over axes of the same sizes are one program up to which chip runs which
    rank, and the placement chooses that for each: the identity is the least, over the orders
    of the axes, of the layout with its axes renamed in that order."""
    d = layout.to_json()
    d.pop("name", None)
    d.pop("mesh_axes", None)
    return _canonical(mesh_axes, d)


def attention_id(mesh_axes: dict[str, int], layout: Layout) -> str:
    """``layout_id`` of the layout's attention alone (each attention node's batch, heads and
    sequence splits, kv way and tiles) and its compiler options: two layouts with one
    ``attention_id`` run every attention the same way and differ at most in how other tensors
    are split."""
    d = layout.to_json()
    return _canonical(mesh_axes, {"attention": d.get("attention", {}),
                                  "compiler_options": d.get("compiler_options", {})})


def _canonical(mesh_axes: dict[str, int], d: dict[str, Any]) -> str:
    """The least, over the orders of the mesh's axes, of JSON ``d`` with its axes renamed in that
    order, with the axes' sizes in that order."""
    best = None
    for order in itertools.permutations(list(mesh_axes)):
        new = {a: f"_a{k}" for k, a in enumerate(order)}
        s = json.dumps([[mesh_axes[a] for a in order], _renamed(d, new)], sort_keys=True)
        best = s if best is None or s < best else best
    return best


def _renamed(x: Any, new: dict[str, str]) -> Any:
    """``x`` (a layout's JSON) with every string that names a mesh axis renamed by ``new``."""
    if isinstance(x, str):
        return new.get(x, x)
    if isinstance(x, list):
        return [_renamed(v, new) for v in x]
    if isinstance(x, dict):
        return {k: _renamed(v, new) for k, v in x.items()}
    return x


def mesh_str(m: dict[str, int]) -> str:
    """A mesh in words: {"x": 2, "y": 4} -> "x2xy4"."""
    return "x".join(f"{k}{v}" for k, v in m.items())
