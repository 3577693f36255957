"""The planner loop's state: one object instead of two dozen arguments.

``LoopState`` holds what a planning run is given (``Program``: the program, the target and its
network, the traced IR; ``Settings``: plan()'s solver settings; the candidate meshes; the
seeds and their queued compiles), the run's clock (``budget``, ``solvers.budget.Budget``) and
compile queue, and what the loop learns and finds as it goes: each mesh's ILP inputs
(``MeshState``: its collective costs, corrections, forbidden combinations), the scales the ILP
applies (attention compute per node and kv mode, the other ops' compute), the ILP answers
memoized by their inputs, every layout compiled (``seen``), the candidates priced, the best so
far, why the loop stopped, and one record per iteration (``new_record``), which goes into
``Plan.iterations`` as it is.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from aoizora.planning.candidate import Candidate, Seed
from aoizora.planning.compile_queue import CompileQueue
from aoizora.extract.network import Network
from aoizora.extract.targets import Target
from aoizora.formulation.axis_feedback import transferred_axis_costs
from aoizora.formulation.calibration import Calibration, mesh_key
from aoizora.formulation.collective_cost import AxisCosts, default_axis_costs
from aoizora.planning.progress import Progress
from aoizora.solvers.budget import Budget
from aoizora.solvers.stop import Stop


@dataclasses.dataclass(frozen=True)
class Settings:
    """plan()'s solver settings, as given."""

    seed: int
    top_k: int
    max_iterations: int
    ilp_time_s: float
    placement_time_s: float
    workers: int


@dataclasses.dataclass
class Program:
    """What is planned and where: ``fn(*args)``, its partitioner IR, the target and its links."""

    fn: Callable
    args: tuple
    target: Target
    network: Network
    ir: Any


@dataclasses.dataclass
class MeshState:
    """One candidate mesh's ILP inputs: collective costs (``default``: the target's, before any
    feedback; ``measured``: taken from a compiled layout of this mesh or a calibration),
    corrections and forbidden combinations (``formulation.sharding_ilp``)."""

    costs: AxisCosts
    default: AxisCosts
    measured: bool
    corrections: dict[str, Any] = dataclasses.field(default_factory=dict)
    forbidden: list[dict[str, str]] = dataclasses.field(default_factory=list)


def mesh_states(target: Target, meshes: list[dict[str, int]], given: Calibration
                ) -> dict[str, MeshState]:
    """Each mesh's starting ILP inputs: the calibration's collective costs for it when it has
    them, else the default ones scaled per collective kind by its pooled ratios, else the
    default (``formulation.calibration``)."""
    out = {}
    for m in meshes:
        default = default_axis_costs(target, m)
        costs = given.costs_for(m) or (transferred_axis_costs(default, given.kind_ratios)
                                       if given.kind_ratios else default)
        out[mesh_key(m)] = MeshState(costs, default, given.costs_for(m) is not None)
    return out


@dataclasses.dataclass
class LoopState:
    """The loop's state (module docstring). ``learned`` starts as a copy of the calibration
    given and is updated with what the loop measures; ``attention_scale`` and ``compute_scale``
    are what the next ILPs apply."""

    program: Program
    settings: Settings
    budget: Budget
    queue: CompileQueue
    meshes: list[dict[str, int]]
    mesh_state: dict[str, MeshState]
    learned: Calibration
    progress: Progress
    seeds: list[Seed] = dataclasses.field(default_factory=list)
    seed_compiles: list = dataclasses.field(default_factory=list)   # Futures, as ``seeds``
    on_candidate: Callable[[Candidate], None] | None = None
    stop: Stop = dataclasses.field(default_factory=Stop)    # the run's interrupt (solvers.stop)
    # what the ILP applies, learned from the compiled programs
    given_scale: dict = dataclasses.field(init=False)        # the calibration's attention scales
    attention_scale: dict = dataclasses.field(init=False)    # node / "*" -> kv mode -> factor
    attention_fit: list = dataclasses.field(default_factory=list)   # AttentionSamples
    compute_scale: float = dataclasses.field(init=False)     # factor on the other ops' compute
    anneal_reserve: float = dataclasses.field(init=False)    # kept while the best is unproven
    # the ILPs' answers, memoized by their inputs; seconds each mesh's ILP took; its last best
    ilp_cache: dict[str, Any] = dataclasses.field(default_factory=dict)
    ilp_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    last_best: dict[str, tuple[str, list[str]]] = dataclasses.field(default_factory=dict)
    # what the loop found
    seen: set[str] = dataclasses.field(default_factory=set)   # layout_id of every one compiled
    priced: list[Candidate] = dataclasses.field(default_factory=list)
    memory_errors: list[str] = dataclasses.field(default_factory=list)
    over_budget: str = ""
    best: Candidate | None = None
    stop_reason: str = ""
    iterations: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.given_scale = self.learned.attention_scale
        self.attention_scale = self.given_scale
        self.compute_scale = self.learned.compute_scale
        self.anneal_reserve = self.queue.reserve_s

    def ilp_inputs_key(self, m: dict[str, int]) -> str:
        """Everything mesh ``m``'s ILP depends on: equal keys give the same ILP and answer."""
        st = self.mesh_state[mesh_key(m)]
        return json.dumps([m, st.costs.to_json(), st.corrections, st.forbidden,
                           self.attention_scale, self.compute_scale], sort_keys=True, default=str)


def new_record(it: int) -> dict[str, Any]:
    """Iteration ``it``'s record, as ``Plan.iterations`` keeps it (``time_limited`` is moved to
    ``Plan.time_limited`` at the end)."""
    return {"iteration": it, "candidates": [], "feedback": {}, "changes": [],
            "decisions_changed": [], "time_limited": []}
