"""The planner loop's state: one object instead of two dozen arguments.

``LoopState`` holds what a planning run is given (``Program``: the program, the target and its
network, the traced IR; ``Settings``: plan()'s solver settings; the candidate meshes; the
seeds and their queued compiles), the run's clock (``budget``, ``solvers.budget.Budget``) and
compile queue, and what the loop learns and finds as it goes, grouped by the module that
owns it: each mesh's ILP inputs (``MeshState``: its collective costs, corrections, forbidden
combinations) and the scales the ILP applies (``Scales``: attention compute per node and kv
mode, the other ops' compute), both written by ``feedback``; the ILP answers memoized by their
inputs (``IlpMemo``, ``ilp_step``); and, the loop's own, every layout compiled (``seen``), the
candidates priced, the best so far, why the loop stopped, and one ``IterationRecord`` per
iteration, which goes into ``Plan.iterations`` (``IterationRecord.to_json``).
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
from aoizora.planning.seams import Seams
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
    cache: Any = None        # the evidence cache compiles look up (extract.evidence_cache)
    memo: Any = None         # the solver answers kept beside it (planning.solve_memo)


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
class IterationRecord:
    """What one iteration of the loop did, as ``Plan.iterations`` keeps it (``to_json``).

    Attributes:
      iteration: its number, from 1.
      candidates: each priced candidate's summary (``Candidate.summary``), in pricing order.
      feedback: what the feedback measured, by mesh and kind (``planning.feedback``).
      changes: what changed in the ILPs' inputs or the best, one sentence each.
      decisions_changed: the meshes whose best ILP layout changed after the feedback.
      time_limited: what the budget cut short (moved to ``Plan.time_limited`` at the end).
      refinements: the seeds' refinements (first iteration with seeds; None otherwise).
      ilps_started_s: budget seconds elapsed when the ILPs started (first iteration with
        seeds, after the first compile; None otherwise).
      ilps_done_s: budget seconds elapsed when the ILPs were done.
      best_q2_step_s: the best's step by Q2 after this iteration, seconds (None if none).
      elapsed_s: budget seconds elapsed at its end.
      screens: with screening (``planning.screening``), each layout's screen
        (``Screen.summary``), in the order its full compile was queued; None without.
    """

    iteration: int
    candidates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    feedback: dict[str, Any] = dataclasses.field(default_factory=dict)
    changes: list[str] = dataclasses.field(default_factory=list)
    decisions_changed: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    time_limited: list[str] = dataclasses.field(default_factory=list)
    refinements: list[dict[str, Any]] | None = None
    ilps_started_s: float | None = None
    ilps_done_s: float | None = None
    best_q2_step_s: float | None = None
    elapsed_s: float | None = None
    completed: bool = False   # best_q2_step_s and elapsed_s were filed (the iteration priced)
    screens: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as ``Plan.iterations`` keeps it: the keys an iteration filed, in the order
        plan files have always had them; ``time_limited`` is not among them (it goes to
        ``Plan.time_limited``)."""
        d = {"iteration": self.iteration, "candidates": self.candidates,
             "feedback": self.feedback, "changes": self.changes,
             "decisions_changed": self.decisions_changed}
        optional = {"refinements": self.refinements, "ilps_started_s": self.ilps_started_s,
                    "ilps_done_s": self.ilps_done_s, "screens": self.screens}
        d.update({k: v for k, v in optional.items() if v is not None})
        if self.completed:
            d.update(best_q2_step_s=self.best_q2_step_s, elapsed_s=self.elapsed_s)
        return d


@dataclasses.dataclass
class Scales:
    """What the next ILPs apply, learned from the compiled programs. Owned by
    ``planning.feedback`` (which writes it); the ILPs (``ilp_step``, ``seeds``) read it.

    Attributes:
      given: the calibration's attention scales, as given (node / "*" -> kv mode -> factor).
      attention: the attention scales the ILP applies now, the same shape.
      compute: the factor on the other ops' compute (``formulation.compute_calibration``).
      attention_fit: every attention sample so far (``AttentionSample``).
    """

    given: dict
    attention: dict
    compute: float
    attention_fit: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class IlpMemo:
    """The sharding ILPs' answers and times, owned by ``planning.ilp_step``.

    Attributes:
      answers: each ILP's result, by its inputs (``LoopState.ilp_inputs_key``).
      seconds: what each mesh's last ILP took, wall-clock seconds, by ``mesh_key``.
      last_best: each mesh's last best layout (its id, its words), by ``mesh_key``.
      memory_errors: why a mesh's ILP found no layout that fits in HBM.
    """

    answers: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    last_best: dict[str, tuple[str, list[str]]] = dataclasses.field(default_factory=dict)
    memory_errors: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LoopState:
    """The loop's state (module docstring), its fields grouped by who owns them. ``learned``
    starts as a copy of the calibration given and is updated with what the loop measures."""

    # given by ``aoizora.planner.plan``, not changed by the loop (but the queue's and budget's
    # own state)
    program: Program
    settings: Settings
    budget: Budget
    queue: CompileQueue
    meshes: list[dict[str, int]]
    mesh_state: dict[str, MeshState]     # each mesh's ILP inputs: ``feedback`` updates them
    learned: Calibration                 # what the loop learned, for the plan: ``feedback``
    progress: Progress
    seeds: list[Seed] = dataclasses.field(default_factory=list)
    on_candidate: Callable[[Candidate], None] | None = None
    stop: Stop = dataclasses.field(default_factory=Stop)    # the run's interrupt (solvers.stop)
    seams: Seams = dataclasses.field(default_factory=Seams)   # what tests may replace
    # ``screening``: the screen every compile goes through first; None: compiles go straight
    # to ``queue``
    screener: Any = None
    # ``seeds``: the seeds' compiles, as ``seeds``
    seed_compiles: list = dataclasses.field(default_factory=list)   # Futures
    # ``feedback``: what the ILP applies; ``ilp_step``: its answers and times
    scales: Scales = dataclasses.field(init=False)
    ilps: IlpMemo = dataclasses.field(default_factory=IlpMemo)
    # ``loop``: what the loop found
    anneal_reserve: float = dataclasses.field(init=False)    # kept while the best is unproven
    seen: set[str] = dataclasses.field(default_factory=set)   # layout_id of every one compiled
    priced: list[Candidate] = dataclasses.field(default_factory=list)
    over_budget: str = ""
    best: Candidate | None = None
    stop_reason: str = ""
    iterations: list[IterationRecord] = dataclasses.field(default_factory=list)
    final_evidence: list = dataclasses.field(default_factory=list)   # the plan's own compiles

    def __post_init__(self):
        self.scales = Scales(self.learned.attention_scale, self.learned.attention_scale,
                             self.learned.compute_scale)
        self.anneal_reserve = self.queue.reserve_s

    def compiles_to(self) -> Any:
        """Where the loop submits a layout's compile (``submit``, ``hold``, ``release``): the
        screener with screening (``planning.screening``), else the compile queue."""
        return self.screener if self.screener is not None else self.queue

    def ilp_inputs_key(self, m: dict[str, int]) -> str:
        """Everything mesh ``m``'s ILP depends on: equal keys give the same ILP and answer."""
        st = self.mesh_state[mesh_key(m)]
        return json.dumps([m, st.costs.to_json(), st.corrections, st.forbidden,
                           self.scales.attention, self.scales.compute], sort_keys=True,
                          default=str)


def new_record(it: int) -> IterationRecord:
    """Iteration ``it``'s record, empty."""
    return IterationRecord(it)
