"""What one compile teaches Q1, applied to layouts never compiled: the Q1-fidelity benchmark's
"feedback" variant (``benchmarks.q1_fidelity --variant feedback``).

From one compiled layout (the teacher: by default the ILP's own layout on the first mesh it
would compile), as the planner's loop learns it (``aoizora.feedback``):
- collectives: the effective seconds per byte each logical axis got, and the exposed cost per
  axis and collective kind (``formulation.axis_feedback.effective_axis_costs`` with Q2 under
  the teacher's device order): rules keyed by (axis, kind), not by op. A layout on a mesh of the
  teacher's shape takes them axis by axis (by position: an expert names its axes its own way);
  a layout on another mesh takes the kind ratios over its default (``transferred_axis_costs``);
- compute: the teacher's compiled compute of every op but the attention kernels over Q1's
  (``Options.compute_scale``), and its attention kernels (Q2's splash kernel model at the tiles
  the compiled program runs) over Q1's (``attention_scale`` for every node, "*").
Only compiled figures (Q2 reads the compiler's evidence) teach; the simulator teaches nothing.
"""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path
from typing import Any

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.axis_feedback import (effective_axis_costs, pool_kind_ratios,
                                              transferred_axis_costs)
from aoizora.formulation.collective_cost import AxisCosts, default_axis_costs
from aoizora.formulation.latency import predict_step
from aoizora.formulation.op_time import op_seconds


@dataclasses.dataclass
class Teacher:
    name: str
    shape: tuple[int, ...]
    costs: AxisCosts                      # learned, on the teacher's axis names
    ratios: dict[str, float]              # collective kind -> measured / default beta
    compute_scale: float
    attention_scale: float

    def axis_costs(self, target, mesh: dict[str, int]) -> AxisCosts:
        """The learned collective costs for ``mesh`` (module docstring)."""
        if tuple(mesh.values()) == self.shape:
            ren = dict(zip(self.costs.sizes, mesh))
            c = self.costs
            return dataclasses.replace(
                c, sizes={ren[a]: v for a, v in c.sizes.items()},
                alpha_s={ren[a]: v for a, v in c.alpha_s.items()},
                beta_s_per_byte={ren[a]: v for a, v in c.beta_s_per_byte.items()},
                beta_by_kind={ren[a]: dict(v) for a, v in c.beta_by_kind.items()})
        return transferred_axis_costs(default_axis_costs(target, mesh), self.ratios)

    def summary(self) -> dict[str, Any]:
        return {"teacher": self.name, "mesh": list(self.shape), "kind_ratios": self.ratios,
                "compute_scale": self.compute_scale, "attention_scale": self.attention_scale}


def teach(cell_dir: Path, rec: dict[str, Any], q1: dict[str, float], target) -> Teacher:
    """The Teacher of record ``rec`` (its Q1 terms ``q1``, without feedback)."""
    name = rec["name"].replace(":", "_")
    with gzip.open(cell_dir / f"{name}.evidence.json.gz", "rt") as f:
        ev = Evidence.loads(f.read())
    net = Network.from_target(target)
    order = list(rec["device_order"])
    q2 = predict_step(ev, order, net)
    default = default_axis_costs(target, ev.mesh_axes)
    learned, detail = effective_axis_costs(ev, order, net, default, q2)
    pool: dict[str, list[float]] = {}
    pool_kind_ratios(pool, detail, default)
    ratios = {k: a / b for k, (a, b) in sorted(pool.items()) if b > 0}
    kernels = sum(op.count * (op_seconds(op, ev, net) or 0.0) for op in ev.compute if op.kernel)
    other = q2.compute_s - kernels
    cs = other / q1["compute_other_s"] if q1["compute_other_s"] else 1.0
    at = kernels / q1["compute_attention_s"] if q1["compute_attention_s"] and kernels else 1.0
    return Teacher(rec["name"], tuple(ev.mesh_axes.values()), learned, ratios, cs, at)
