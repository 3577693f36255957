"""One sharding instance: what the ILP prices and constrains, besides the program and the mesh.

``ShardingProblem`` gathers the knobs of an instance (all optional; the defaults are the
chip's numbers and no feedback):

- ``axis_costs``: the collective cost per logical axis (``formulation.collective_cost``);
  default ``default_axis_costs(target, mesh_axes)``;
- ``hardware``: the chip's compute and HBM numbers; default ``Hardware.from_chip(target.chip)``;
- ``options``: strategy options (``formulation.strategies.Options``, e.g. ``compute_scale``);
- ``hbm_bytes``: the per-device budget of the ILP's memory rows; default the chip's HBM times
  ``1 - hbm_reserve`` (the reserve is kept for what the ILP's memory model does not see: the
  compiler's temporaries, kernel scratch, collective buffers: benchmarks/results/lab_notes.md);
- ``corrections`` / ``forbidden``: the planner's feedback
  (``formulation.sharding_ilp.build_model``);
- ``attention_scale``: kv mode -> factor on Q1's attention compute
  (``formulation.attention_calibration``);
- ``prefer``: group id -> strategy name to take among tied optima of the best layout
  (``solvers.sharding.settle_ties``); it does not change the model;
- ``graph``: the StrategyGraph already built for these inputs, to skip building it again;
- ``remat``: a training step's layer groups (``formulation.remat``): "stacks" (default: their
  residual stacks in the memory rows, the program as traced), "decide" (keep / recompute /
  offload per named activation, for a step that can be retraced: ``aoizora.runtime.realize``), "off"
  (not modelled); ``offload``: offer host offload in "decide".

``build_problem`` builds the instance (hardware, HBM budget in bytes, StrategyGraph, ILPModel);
``solvers.sharding.solve_sharding`` solves it and ``solvers.sharding_heuristics`` searches it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aoizora.formulation.collective_cost import AxisCosts, default_axis_costs
from aoizora.formulation.remat import remat_problem
from aoizora.formulation.sharding_ilp import build_model
from aoizora.formulation.strategies import Hardware, Options, build_strategies
from aoizora.solvers.mip_run import ShardingSolveError

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class ShardingProblem:
    """The knobs of one sharding instance (module docstring)."""

    axis_costs: AxisCosts | None = None
    hardware: Hardware | None = None
    options: Options | None = None
    hbm_bytes: float | None = None
    hbm_reserve: float = 0.1
    corrections: dict[str, Any] | None = None
    forbidden: list[dict[str, str]] | None = None
    attention_scale: dict[str, Any] | None = None
    prefer: dict[str, str] | None = None
    graph: Any = None
    remat: str = "stacks"
    offload: bool = True


def problem_graph(ir, target, mesh_axes: dict[str, int], problem: ShardingProblem | None = None):
    """(hardware, StrategyGraph) of one sharding instance: the strategies and their costs the ILP
    chooses among (``build_problem`` without the ILP model). ``target``: a Target, or None when
    ``problem`` gives both ``hardware`` and ``axis_costs``.

    Raises:
      ShardingSolveError: no way to price compute or communication, or axis costs of another
        mesh."""
    p = problem or ShardingProblem()
    hardware, axis_costs = p.hardware, p.axis_costs
    if hardware is None:
        if target is None:
            raise ShardingSolveError("give a target or hardware= to price compute")
        hardware = Hardware.from_chip(target.chip)
    if axis_costs is None:
        if target is None:
            raise ShardingSolveError("give a target or axis_costs= to price communication")
        axis_costs = default_axis_costs(target, mesh_axes)
    if dict(axis_costs.sizes) != {k: int(v) for k, v in mesh_axes.items()}:
        raise ShardingSolveError(f"axis costs are for mesh {axis_costs.sizes}, not {mesh_axes}")
    graph = p.graph
    if graph is None:
        graph = build_strategies(ir, axis_costs, hardware, p.options, p.attention_scale)
    return hardware, graph


def build_problem(ir, target, mesh_axes: dict[str, int], problem: ShardingProblem | None = None):
    """(hardware, HBM budget in bytes, StrategyGraph, ILPModel) of one sharding instance with
    ``problem``'s knobs (module docstring). ``target``: a Target, or None when ``problem`` gives
    both ``hardware`` and ``axis_costs``."""
    p = problem or ShardingProblem()
    hardware, graph = problem_graph(ir, target, mesh_axes, p)
    budget = float(p.hbm_bytes if p.hbm_bytes is not None
                   else hardware.hbm_bytes * (1.0 - p.hbm_reserve))
    if p.remat not in ("stacks", "decide", "off"):
        raise ShardingSolveError(f"remat={p.remat!r}: use 'stacks', 'decide' or 'off'")
    rp = None if p.remat == "off" else remat_problem(
        ir, hardware, decide=p.remat == "decide", offload=p.offload,
        compute_scale=p.options.compute_scale if p.options else 1.0,
        attention_scale=p.attention_scale)
    model = build_model(ir, graph, budget, corrections=p.corrections, forbidden=p.forbidden,
                        remat=rp)
    return hardware, budget, graph, model
