"""Seed refinement: the sharding ILP completes a given layout (a seed, e.g. an expert configuration).

A seed fixes how each attention runs (batch / heads / query-sequence axes; keys and values
gathered or in a ring) and how the activations are laid out (its rules). Its parameter layout is
often a convention that memory does not force (maxdiffusion splits the embed dim of every weight
over the context axis, so each layer all-gathers its weights). The refinement asks the sharding
ILP what it would do around the seed's attention.

The model is the ILP of ``aoizora.formulation.sharding_ilp`` on the seed's mesh ``M`` and the
seed's own program (its own padding) with one more family of constraints. For every attention
group ``g`` whose node the seed lays out, ``kept[g]`` is the strategy whose (batch, heads, query
sequence, kv mode) is the seed's, and

  (pin)  s[g][k] = 0    for every strategy k of g other than kept[g]

(each written as a one-strategy no-good cut, the ILP's ``forbidden``). Every other group (the
parameters, every dot, the scan carries) is free; the objective is Q1 and the memory rows hold
as always, so the answer is Q1-optimal among the layouts that run attention the seed's way.

  (tie)  among Q1's tied optima, each parameter group is moved back to ``seed_strategies``' (the
         strategy that lays out its parameters as the seed does) where Q1 does not rise
         (``aoizora.solvers.sharding.settle_ties``)

Q1 does not price a small weight's split, the compiler does: on Wan 2.1 1.3B 480p-81f, v6e-8,
two proven optima of equal Q1 (358.880 ms) that differ in the small embedding weights compiled
to programs Q2 prices at 164.7 and 179.7 ms; the solver's pick between them was chance.

The refined layout is the seed's layout (mesh, rules, attention, the specs of the other inputs)
with the specs of the parameter leaves (``param_leaves``) taken from the ILP's solution; where
the seed gives an output the spec of its input (a training step's donated state), the refined
layout does too. It is one more candidate: compiled, placed and priced by Q2 like the others,
and kept only when Q2 prices it lower. When the ILP keeps every parameter spec of the seed, there
is no refinement.

With ``remat="decide"`` (a training seed laid out on the step as traced with every residual
kept, ``aoizora.runtime.rematerialize.retraceable``) the ILP also decides the rematerialization around
the seed's attention (``formulation.remat``: keep / recompute / offload per named activation,
recompute and offload time in Q1, the residual stacks in the memory rows), and the refined
layout carries that choice (``Layout.remat``); it is always a refinement, since the seed ran its
authors' remat policy, not the program as traced. A recipe's remat is set for the largest model
and slice it was written for (maxdiffusion recomputes every block of Wan 2.1 1.3B on v5p-8 where
the residuals would take a few GiB of 95); the ILP keeps what HBM holds.

Why it pays: around cfg2_context's attention on Wan 2.1 1.3B the ILP replicates the 2.6 GB of
weights instead of splitting them over the context axis, so no layer all-gathers its weights;
on Wan 2.1 14B (26.6 GiB of weights, which cannot be replicated) its parameter split prices
slower than the seed's and Q2 keeps the seed (figures: benchmarks/results/grid.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from aoizora.formulation.layout import Layout
from aoizora.formulation.strategies import Hardware, Options, build_strategies
from aoizora.formulation.collective_cost import default_axis_costs
from aoizora.solvers.sharding import (ShardingProblem, ShardingSolution, ShardingSolveError,
                                     solve_sharding, tensor_spec)


class RefinementError(ValueError):
    """The seed cannot be refined: a one-line reason."""


@dataclasses.dataclass
class Refinement:
    layout: Layout                  # the seed's layout with the ILP's parameter specs
    solution: ShardingSolution      # the pinned ILP's solution (its certificate: the pinned ILP)
    kept: dict[str, str]            # attention group -> the strategy the seed runs
    changed: int                    # parameter leaves whose spec differs from the seed's

    def summary(self) -> dict[str, Any]:
        c = self.solution.certificate
        return {"layout": self.layout.name, "kept": dict(self.kept), "changed_params": self.changed,
                "ilp_status": c.status, "ilp_q1_s": c.objective}


def attention_pins(graph, layout: Layout) -> tuple[dict[str, str], list[dict[str, str]]]:
    """(kept, forbidden): per attention group the strategy that runs the seed's attention layout,
    and a one-strategy cut for each of its other strategies. RefinementError when the ILP offers
    no strategy for the seed's layout of some attention node."""
    kept: dict[str, str] = {}
    forbidden: list[dict[str, str]] = []
    for gid, G in ((g, graph.groups[g]) for g in graph.order()):
        if G.kind != "attention":
            continue
        a = layout.attention_for(G.anchor)
        match = [st.name for st in G.strategies
                 if tuple(st.labels.get("b", ())) == tuple(a.batch)
                 and tuple(st.labels.get("h", ())) == tuple(a.heads)
                 and tuple(st.labels.get("s", ())) == tuple(a.seq) and st.kv == a.kv]
        if not match:
            raise RefinementError(
                f"the ILP has no strategy for {layout.name or 'the seed'}'s attention at {G.anchor} "
                f"(batch {a.batch}, heads {a.heads}, seq {a.seq}, kv {a.kv})")
        kept[gid] = match[0]
        forbidden += [{gid: st.name} for st in G.strategies if st.name != match[0]]
    return kept, forbidden


def seed_strategies(ir, graph, layout: Layout, param_leaves: Sequence[int]) -> dict[str, str]:
    """(tie) group id -> the strategy that lays out every parameter leaf of the group as the seed
    does, for each group that lays out parameters and offers one."""
    leaves: dict[str, list[int]] = {}
    for i in param_leaves:
        o = graph.origin.get(ir.inputs[i])
        if o is not None:
            leaves.setdefault(o[0], []).append(i)
    out = {}
    for gid, idx in sorted(leaves.items()):
        for k, st in enumerate(graph.groups[gid].strategies):
            if all(_norm(tensor_spec(ir, graph, {gid: k}, ir.inputs[i])) == _norm(layout.in_specs[i])
                   for i in idx):
                out[gid] = st.name
                break
    return out


def refine_seed(ir, target, layout: Layout, param_leaves: Sequence[int], *,
                time_limit_s: float = 30.0, seed: int = 0,
                attention_scale: dict[str, Any] | None = None,
                compute_scale: float = 1.0, remat: str = "stacks",
                solve: Callable = solve_sharding) -> Refinement | None:
    """The refined layout of ``layout`` (module docstring) on ``ir`` (the seed's program), or None
    when the ILP keeps every parameter spec (and decides no remat). ``param_leaves``: indices
    into ``layout.in_specs`` of the parameters; ``remat``: ``ShardingProblem.remat`` ("decide":
    the ILP chooses the remat too); ``solve``: the sharding solver (``Seams.solve_sharding``).
    Raises RefinementError (no matching attention strategy, or no
    layout fits)."""
    mesh = dict(layout.mesh_axes)
    costs = default_axis_costs(target, mesh)
    options = Options(compute_scale=compute_scale)
    hardware = Hardware.from_chip(target.chip)
    graph = build_strategies(ir, costs, hardware, options, attention_scale)
    kept, forbidden = attention_pins(graph, layout)
    if not kept:
        raise RefinementError(f"{layout.name or 'the seed'} lays out no attention the ILP can keep")
    prefer = seed_strategies(ir, graph, layout, param_leaves)
    try:
        res = solve(ir, target, mesh, ShardingProblem(
            axis_costs=costs, forbidden=forbidden or None, attention_scale=attention_scale,
            options=options, prefer=prefer, hardware=hardware, graph=graph, remat=remat),
            time_limit_s=time_limit_s, seed=seed)
    except ShardingSolveError as e:
        raise RefinementError(str(e).splitlines()[0]) from None
    sol = res.best
    specs, outs = list(layout.in_specs), list(layout.out_specs or ())
    changed = 0
    for i in param_leaves:
        new = sol.layout.in_specs[i]
        if _norm(new) == _norm(specs[i]):
            continue
        if i < len(outs) and _norm(outs[i]) == _norm(specs[i]):   # a donated state follows
            outs[i] = new
        specs[i] = new
        changed += 1
    if not changed and remat != "decide":
        return None
    refined = dataclasses.replace(
        layout, in_specs=specs, out_specs=outs if layout.out_specs is not None else None,
        remat=sol.layout.remat if remat == "decide" else layout.remat,
        name=f"refined:{layout.name or 'seed'}")
    return Refinement(refined, sol, kept, changed)


def _norm(spec) -> tuple:
    """A spec without trailing replicated dims (None and all-None mean the same)."""
    if spec is None:
        return ()
    out = [a if a not in ((), None) else None for a in spec]
    while out and out[-1] is None:
        out.pop()
    return tuple(out)
