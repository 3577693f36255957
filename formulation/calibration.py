"""What the planner's loop learned about the sharding ILP's costs on a target, carried from one
plan to the next: a warm start for time-bounded re-planning (CI after a model or workload
change) that would otherwise spend its first iteration re-measuring.

The planner's feedback (``aoizora.planner``, step 3) replaces three things in the ILP; a
calibration is their values at the end of a plan:

  axis_costs[m]      the ``AxisCosts`` of logical mesh m after its last measurement: effective
                     beta per axis and exposed beta per axis and collective kind
                     (``formulation.axis_feedback``), for the meshes that had an ILP layout
                     compiled;
  kind_pool[k]       [sum w r, sum w] over every (mesh, axis) measured (``pool_kind_ratios``):
                     R[k] = sum w r / sum w is the ratio of kind k's cost to the default, given to
                     meshes never measured (``transferred_axis_costs``);
  attention_scale[a][kv]
                     compiled attention compute over Q1's, per attention node a (and the pooled
                     row "*") and kv mode (``formulation.attention_calibration``);
  compute_pool       [sum T, sum Q] over the compiled ILP candidates: sigma = sum T / sum Q is
                     the factor on the compute of every op but attention
                     (``formulation.compute_calibration``).

``plan(..., calibration=C)`` starts from C instead of the defaults: meshes in C.axis_costs take
them, the others the transferred ratios, the ILP the attention scales; then the loop measures
and overwrites as usual (an attention scale fitted in this call replaces C's for that node and
mode; a mesh measured in this call replaces C's costs; kind_pool and compute_pool add this
call's weights).

Valid on the target it was measured on only (the network and the chips set the costs: another
target is refused). Across programs it is an assumption: the same model at another frame count
or resolution keeps its attention node keys and its collectives' kinds and overlap, but the
factors move with the sizes (Wan 2.1 1.3B on v5e-16: the ring attention's scale 1.27 / 1.48 /
1.44 at 21 / 41 / 81 frames). The first compile of this call checks it and the loop corrects it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from aoizora.formulation.collective_cost import AxisCosts


class CalibrationError(ValueError):
    """A calibration that cannot be used: malformed, or measured on another target."""


def mesh_key(mesh_axes: dict[str, int]) -> str:
    """The key of a logical mesh in ``Calibration.axis_costs`` (axis order matters)."""
    return json.dumps([[a, int(n)] for a, n in mesh_axes.items()])


@dataclasses.dataclass
class Calibration:
    target: str                                        # canonical target it was measured on
    axis_costs: dict[str, AxisCosts] = dataclasses.field(default_factory=dict)  # mesh_key ->
    kind_pool: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    attention_scale: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    source: dict[str, Any] = dataclasses.field(default_factory=dict)  # program, compiles, ...
    compute_pool: list[float] = dataclasses.field(default_factory=lambda: [0.0, 0.0])

    @property
    def compute_scale(self) -> float:
        t, q = self.compute_pool
        return t / q if q > 0 and t > 0 else 1.0

    def costs_for(self, mesh_axes: dict[str, int]) -> AxisCosts | None:
        return self.axis_costs.get(mesh_key(mesh_axes))

    @property
    def kind_ratios(self) -> dict[str, float]:
        return {k: sw / w for k, (sw, w) in sorted(self.kind_pool.items()) if w > 0}

    def check_target(self, target: str) -> None:
        if self.target != target:
            raise CalibrationError(
                f"the calibration was measured on {self.target}, not {target}; plan without it "
                f"(costs are set by the target's network) or take one from a plan for {target}")

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target,
                "axis_costs": [{"mesh": dict(json.loads(k)), "costs": c.to_json()}
                               for k, c in self.axis_costs.items()],
                "kind_pool": {k: list(v) for k, v in self.kind_pool.items()},
                "attention_scale": self.attention_scale,
                "compute_pool": [float(v) for v in self.compute_pool], "source": self.source}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Calibration":
        try:
            scale = {str(a): {str(kv): float(f) for kv, f in m.items()}
                     for a, m in d.get("attention_scale", {}).items()}
            if any(not f > 0 for m in scale.values() for f in m.values()):
                raise ValueError("attention scales must be positive")
            return cls(
                target=str(d["target"]),
                axis_costs={mesh_key({str(a): int(n) for a, n in e["mesh"].items()}):
                            AxisCosts.from_json(e["costs"]) for e in d.get("axis_costs", [])},
                kind_pool={str(k): [float(v[0]), float(v[1])]
                           for k, v in d.get("kind_pool", {}).items()},
                attention_scale=scale, source=dict(d.get("source", {})),
                compute_pool=_pool(d.get("compute_pool", [0.0, 0.0])))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise CalibrationError(f"malformed calibration ({e.__class__.__name__}: {e}); take it "
                                   f"from a plan saved by aoizora plan --out") from None


def _pool(v) -> list[float]:
    t, q = float(v[0]), float(v[1])
    if t < 0 or q < 0 or (t > 0) != (q > 0):
        raise ValueError("compute_pool needs [compiled s, Q1 s], both positive or both 0")
    return [t, q]
