"""Q1 of a given (seed) layout: the sharding ILP's own objective, evaluated at that layout.

The sharding ILP (``solvers.sharding.solve_sharding``) prices a solution ``choice`` (group ->
strategy index of the ``StrategyGraph`` built by ``build_problem(ir, target, mesh, problem)``)
as ``formulation.sharding_ilp.evaluate(graph, choice)["total_s"]``:

    Q1(choice) = sum_g cost[g][choice[g]] + sum_e edge_cost[e][choice[producer]][choice[consumer]]
                 - prefetch_hidden(choice)

``seed_q1(ir, target, layout, problem)`` builds the same graph on the seed's mesh and finds the
choice that lays the program out as the seed does:

- ``allowed[g]`` = the strategies k of group g under which every tensor the seed lays out and g
  produces (the program's inputs, ``Layout.in_specs``; dot/conv/attention outputs,
  ``Layout.node_specs``) has the seed's spec (``solvers.sharding_layout.tensor_spec``), and, for
  an attention group, whose (batch, heads, query sequence) axes and kv mode are the seed's
  (``Layout.attention``);
- a group the seed does not pin (an elementwise op, a norm) is free among its strategies, and
  takes the cheapest given its neighbours: coordinate descent over ``graph.order()``, each group
  moved to ``argmin_k cost[g][k] + sum_{e incident to g} edge_cost`` (ties: the lower index),
  until a sweep moves nothing (at most ``SWEEPS``) -- the runtime, too, lets DTensor propagate
  those ops' layouts from their operands.

Q1 of the seed = ``evaluate(graph, choice)["total_s"]``. When the seed is an ILP layout, the
pinned groups take the ILP's strategies, so its Q1 is at least the ILP's objective (the ILP's
choice is the optimum over all completions; the descent may stop at a local one), and equal to
it on the tested program (tests/test_torch_seeds.py, both of the ILP's two best). Memory rows are not read (the evidence says whether a seed fits).

A seed whose layout no strategy expresses (a spec the graph does not offer, a mesh the
strategies cannot be built for, a mesh of more than ``MAX_AXES`` axes -- the ILP's meshes have at
most 3, ``formulation.meshes.candidate_meshes``, and its strategies grow with the axes) has no
Q1: ``SeedQ1Error`` says why.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from aoizora.formulation.layout import Layout, axes_of
from aoizora.formulation.meshes import AXIS_NAMES
from aoizora.formulation.sharding_ilp import evaluate
from aoizora.solvers.sharding import ShardingProblem, tensor_spec
from aoizora.solvers.sharding_problem import problem_graph

SWEEPS = 20
MAX_AXES = 3


class SeedQ1Error(ValueError):
    """The seed layout cannot be priced by Q1 (one-line reason)."""


def _norm(spec) -> tuple:
    """A PartitionSpec's entries as tuples of axis names (None and () alike)."""
    out = []
    for e in spec:
        if e is None:
            out.append(())
        elif isinstance(e, str):
            out.append((e,))
        else:
            out.append(tuple(e))
    return tuple(out)


def _seed_specs(ir, layout: Layout) -> dict[str, tuple]:
    """Tensor id -> the seed's spec, for the tensors the seed lays out: its inputs and its dot,
    conv and attention outputs. A spec on another op (an ILP layout's pin of an operand a dot
    reshards, ``solvers.sharding_layout.operand_pins``) is an edge's requirement, not a group's
    choice."""
    out = {}
    for tid, spec in zip(ir.inputs, layout.in_specs):
        out[tid] = _norm(spec)
    for n in ir.nodes:
        if n.key in layout.node_specs and n.results and n.kind in ("dot", "conv", "attention"):
            out[n.results[0]] = _norm(layout.node_specs[n.key])
    return out


def _allowed(ir, graph, layout: Layout) -> dict[str, list[int]]:
    """Group id -> the strategy indices that lay out its seed-pinned tensors as the seed does.

    Raises:
        SeedQ1Error: a group has no such strategy."""
    pinned: dict[str, list[str]] = {}
    for tid in _seed_specs(ir, layout):
        o = graph.origin.get(tid)
        if o is not None:
            pinned.setdefault(o[0], []).append(tid)
    specs = _seed_specs(ir, layout)
    out = {}
    for gid in graph.order():
        g = graph.groups[gid]
        keep = list(range(len(g.strategies)))
        if gid in pinned:
            keep = [k for k in keep if all(_norm(tensor_spec(ir, graph, {gid: k}, t)) == specs[t]
                                           for t in pinned[gid])]
        if g.kind == "attention" and g.anchor in layout.attention:
            a = layout.attention[g.anchor]
            keep = [k for k in keep
                    if (tuple(g.strategies[k].labels.get("b", ())), tuple(g.strategies[k].labels.get("h", ())),
                        tuple(g.strategies[k].labels.get("s", ())), g.strategies[k].kv)
                    == (tuple(a.batch), tuple(a.heads), tuple(a.seq), a.kv)]
        if not keep:
            what = pinned.get(gid, [g.anchor])[0]
            raise SeedQ1Error(f"no strategy of group {gid} lays out {what} as the seed does")
        out[gid] = keep
    return out


def _incident(graph) -> dict[str, list]:
    inc: dict[str, list] = {}
    for e in graph.edges:
        inc.setdefault(e.producer, []).append(e)
        if e.consumer != e.producer:
            inc.setdefault(e.consumer, []).append(e)
    return inc


def _local(graph, inc, choice: dict[str, int], gid: str, k: int) -> float:
    """Group gid's own cost at strategy k plus its edges' with every other group as chosen."""
    total = graph.groups[gid].strategies[k].cost
    for e in inc.get(gid, ()):
        p = k if e.producer == gid else choice[e.producer]
        q = k if e.consumer == gid else choice[e.consumer]
        total += e.cost[e.p_of[p]][e.q_of[q]]
    return total


def seed_choice(ir, graph, layout: Layout) -> dict[str, int]:
    """The choice that lays the program out as ``layout`` (module docstring).

    Raises:
        SeedQ1Error: the layout's mesh is not the graph's, or a group cannot follow the seed."""
    if dict(layout.mesh_axes) != dict(graph.mesh_axes):
        raise SeedQ1Error(f"the seed's mesh {dict(layout.mesh_axes)} is not the graph's "
                          f"{dict(graph.mesh_axes)}")
    if len(layout.in_specs) != len(ir.inputs):
        raise SeedQ1Error(f"the seed lays out {len(layout.in_specs)} inputs, the program has "
                          f"{len(ir.inputs)}")
    allowed = _allowed(ir, graph, layout)
    inc = _incident(graph)
    choice = {}
    for gid, ks in allowed.items():
        choice[gid] = min(ks, key=lambda k: (graph.groups[gid].strategies[k].cost, k))
    free = [g for g in graph.order() if len(allowed[g]) > 1]
    for _ in range(SWEEPS):
        moved = False
        for gid in free:
            cur = _local(graph, inc, choice, gid, choice[gid])
            best = min(allowed[gid], key=lambda k: (_local(graph, inc, choice, gid, k), k))
            if _local(graph, inc, choice, gid, best) < cur - 1e-15:
                choice[gid], moved = best, True
        if not moved:
            break
    return choice


def strategy_graph(ir, target, mesh_axes: dict[str, int], problem: ShardingProblem):
    """The StrategyGraph the sharding ILP chooses among for ``problem`` on this mesh
    (``solvers.sharding_problem.problem_graph``)."""
    return problem_graph(ir, target, mesh_axes, problem)[1]


def canonical(layout: Layout) -> Layout:
    """``layout`` with its mesh axes renamed to the ILP's (``formulation.meshes.AXIS_NAMES``:
    x, y, z in mesh order); Q1 reads axes by size and order only, so seeds on meshes of the same
    shape (cfg2 x ulysses2 x tp2, cfg2 x ulysses2 x ring2) share one strategy graph."""
    names = dict(zip(layout.mesh_axes, AXIS_NAMES))

    def entry(e):
        axes = tuple(names[a] for a in axes_of(e))
        return None if not axes else (axes[0] if len(axes) == 1 else axes)

    def spec(sp):
        return None if sp is None else tuple(entry(e) for e in sp)

    def att(a):
        return dataclasses.replace(a, batch=tuple(names[x] for x in a.batch),
                                   heads=tuple(names[x] for x in a.heads),
                                   seq=tuple(names[x] for x in a.seq))

    return dataclasses.replace(
        layout, mesh_axes={names[a]: n for a, n in layout.mesh_axes.items()},
        in_specs=[spec(sp) for sp in layout.in_specs], out_specs=None,
        node_specs={k: spec(v) for k, v in layout.node_specs.items()},
        reshard_from={k: spec(v) for k, v in layout.reshard_from.items()},
        attention={k: att(a) for k, a in layout.attention.items()}, rules={})


def seed_q1(ir, target, layout: Layout, problem: ShardingProblem,
            graphs: dict | None = None) -> float:
    """Q1 (seconds) of ``layout`` on ``ir`` under the sharding ILP's ``problem`` on ``target``
    (module docstring).

    Args:
      ir: the IR the sharding ILP solves (the one ``layout`` lays out).
      target: an ``extract.targets.Target``.
      layout: the seed layout (its mesh is the graph's).
      problem: the ILP's instance knobs (e.g. ``torch_planner.torch_problem()``).
      graphs: a memo of StrategyGraphs by mesh shape (filled here; ``canonical``), shared
        across seeds of one IR.

    Returns:
      ``evaluate(graph, choice)["total_s"]`` at the seed's choice.

    Raises:
      SeedQ1Error: the seed cannot be priced (its mesh's strategies cannot be built, or no
        strategy lays a group out as the seed does)."""
    if len(layout.mesh_axes) > MAX_AXES:
        raise SeedQ1Error(f"mesh {dict(layout.mesh_axes)} has {len(layout.mesh_axes)} axes; "
                          f"the sharding ILP's have at most {MAX_AXES}")
    layout = canonical(layout)
    key = tuple(layout.mesh_axes.items())
    graphs = {} if graphs is None else graphs
    if key not in graphs:
        try:
            graphs[key] = strategy_graph(ir, target, dict(layout.mesh_axes), problem)
        except Exception as e:  # noqa: BLE001 -- any failure to build is "no Q1", said once
            graphs[key] = SeedQ1Error(f"no strategy graph for mesh {dict(layout.mesh_axes)}: "
                                      f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    graph = graphs[key]
    if isinstance(graph, SeedQ1Error):
        raise graph
    q1 = float(evaluate(graph, seed_choice(ir, graph, layout), problem.corrections)["total_s"])
    if not math.isfinite(q1):
        raise SeedQ1Error("Q1 is not finite at the seed's layout")
    return q1


__all__: list[Any] = ["SeedQ1Error", "canonical", "seed_choice", "seed_q1", "strategy_graph", "SWEEPS", "MAX_AXES"]
