"""The planner's replaceable parts: the seams a test or a benchmark passes to ``aoizora.plan``
(``seams=``) instead of patching module attributes, which stop applying silently when a
function moves. The defaults are the real ones."""

from __future__ import annotations

import dataclasses
from typing import Callable

from aoizora.planning.candidate_pricing import compile_layout, early_layout_evidence
from aoizora.planning.compile_queue import CompileQueue
from aoizora.planning.seed_refinement import refine_seed
from aoizora.solvers.placement import solve_placement
from aoizora.solvers.placement_heuristics import annealing
from aoizora.solvers.placement_step import choose_by_step
from aoizora.solvers.sharding import solve_sharding


@dataclasses.dataclass(frozen=True)
class Seams:
    """What the planner calls for its expensive or clocked steps.

    Attributes:
      compile_layout: compiles a layout in a device order
        (``candidate_pricing.compile_layout``: fn, args, target, layout, device order ->
        ``Evidence``); every candidate, seed and the plan's own re-compile go through it.
      compile_queue: makes the compile queue (``compile_queue.CompileQueue``: budget, the
        compile errors, ``reserve_s=``).
      solve_placement: places one compiled candidate (``solvers.placement.solve_placement``).
      solve_sharding: solves one mesh's sharding ILP (``solvers.sharding.solve_sharding``).
      annealing: the final annealing runs (``solvers.placement_heuristics.annealing``).
      choose_by_step: keeps the least Q2 step among a placement's answer, the other
        placements priced and a swap descent (``solvers.placement_step.choose_by_step``).
      refine_seed: completes a seed's layout with the sharding ILP
        (``seed_refinement.refine_seed``).
      early_evidence: a layout's compile stopped after libtpu's HLO passes, for the screen
        (``candidate_pricing.early_layout_evidence``; ``planning.screening``).
    """

    compile_layout: Callable = compile_layout
    compile_queue: Callable = CompileQueue
    solve_placement: Callable = solve_placement
    solve_sharding: Callable = solve_sharding
    annealing: Callable = annealing
    choose_by_step: Callable = choose_by_step
    refine_seed: Callable = refine_seed
    early_evidence: Callable = early_layout_evidence
