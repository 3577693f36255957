"""Prefetch overlap in Q1: resharding a tensor that no op of the step produces hides behind compute.

A program input or constant (the weights, above all: a layer's weights gathered for its matmuls
under FSDP-style layouts) does not depend on anything the step computes, so the compiler may
issue its resharding collectives as early as it likes. XLA:TPU's latency-hiding scheduler
makes such all-gathers asynchronous and runs them behind compute that does not need them (the
compiled evidence shows them async, with compute in their windows). A tensor an op produces
(activations: keys/values gathered for attention, a tensor-parallel all-gather) waits for its
producer and is priced exposed, as before.

With the sharding ILP's names (``formulation.sharding_ilp``: ``s[g][k]`` the strategy binaries,
``x[e][p][q]`` the edge pairs, ``r[e][p][q]`` an edge's resharding seconds, ``cost`` / ``comm``
a strategy's seconds and their communication part), ``E_pre`` the edges whose producer group is
a program input or constant (``PREFETCH_KINDS``) and rho = ``room``:

    P = sum_{e in E_pre} sum_{p,q} x[e][p][q] r[e][p][q]        prefetchable resharding, seconds
    C = sum_g sum_k s[g][k] (cost[g][k] - comm[g][k])            compute of the step, seconds
    0 <= h <= P,   h <= rho C
    Q1 = (the objective without overlap) - (1 - TIE) h

so the step pays max(0, P - rho C) of its prefetchable resharding (at the optimum h = min(P,
rho C); the model is linear), plus TIE = ``PREFETCH_TIE`` of what hides: a tie-break, so that of
two layouts whose gathers hide alike the one that moves fewer bytes is cheaper.
``PREFETCH_ROOM`` = 0.5: the share of a step's compute that runs while a weight all-gather is in
flight in the compiler's own schedule, median 0.54 (range 0.15-0.68) over the 7 compiled Wan 2.1
layouts that gather at least 1 GB per call (``benchmarks/prefetch_room.py``, libtpu's schedule
and cycle estimates). Compiled evidence corrects it: once a compile has measured how exposed
all-gathers are on an axis (``AxisCosts.beta_by_kind``, ``formulation.axis_feedback``), that
measurement already holds the overlap, and the credit is off (``prefetch_room``), so overlap is
never counted twice.

Scope: inference programs (``prefetch_room``: a training step's gradient reductions overlap too,
and are not modelled). Approximation: one credit for the whole step, not per scan body; a gather cannot really hide
behind compute that needs it, nor behind another layer's compute when the scheduler keeps one
layer's weights in flight. This module has no jax import (formulation layer).
"""

from __future__ import annotations

from typing import Any

import pulp

PREFETCH_ROOM = 0.5                    # rho: seconds of prefetch one second of compute can hide
PREFETCH_TIE = 1e-3                    # TIE: the share of a hidden second still charged
PREFETCH_KINDS = ("input", "const")    # producer group kinds whose tensors no op of the step makes


def prefetch_room(ir: Any, axis_costs: Any, room: float = PREFETCH_ROOM) -> float:
    """rho for a sharding instance of program ``ir`` priced with ``axis_costs``: ``room``, or 0
    - when the costs hold a measured all-gather cost on some axis (``beta_by_kind``, learned from
      compiled evidence: its overlap already counted; the default costs set only
      collective-permute's there);
    - for a training step (state fed back: ``ir.state_aliases``), whose gradient reductions the
      compiler overlaps with the backward too: crediting the weights' gathers alone would favour
      ZeRO-3 over data parallelism for the wrong reason."""
    kinds = getattr(axis_costs, "beta_by_kind", None) or {}
    if getattr(ir, "state_aliases", ()) or any("all-gather" in k for k in kinds.values()):
        return 0.0
    return float(room)


def strategy_compute(st) -> float:
    """A strategy's compute seconds (its C term): cost less its communication, at least 0."""
    return max(0.0, st.cost - st.comm)


def credit(P, C, room: float):
    """(1 - TIE) min(P, rho C): what Q1 takes off for prefetch P and compute C (scalars or
    numpy arrays, elementwise)."""
    import numpy as np

    return (1.0 - PREFETCH_TIE) * np.maximum(0.0, np.minimum(P, room * C))


def prefetch_edges(graph) -> list[int]:
    """Indices of the edges of ``graph`` whose tensor comes from a program input or constant."""
    return [i for i, e in enumerate(graph.edges)
            if graph.groups[e.producer].kind in PREFETCH_KINDS]


def prefetch_terms(graph, s: dict[str, list[Any]], x: list[dict]) -> tuple[list, float]:
    """P as (variable, seconds) pairs and a constant: an edge with both sides free through its
    ``x`` pairs; one with a fixed side through the other side's strategy binaries (as
    ``build_model`` puts its cost); both fixed: the constant."""
    terms, const = [], 0.0
    for ei in prefetch_edges(graph):
        e = graph.edges[ei]
        if x[ei]:
            terms += [(v, e.cost[p][q]) for (p, q), v in x[ei].items() if e.cost[p][q]]
            continue
        side = s[e.consumer] if len(e.p_specs) == 1 else s[e.producer]
        for k, v in enumerate(side):
            c = e.cost[0][e.q_of[k]] if len(e.p_specs) == 1 else e.cost[e.p_of[k]][0]
            if isinstance(v, int):
                const += c * v
            elif c:
                terms.append((v, c))
    return terms, const


def compute_terms(graph, s: dict[str, list[Any]]) -> tuple[list, float]:
    """C as (variable, seconds) pairs and a constant (fixed groups)."""
    terms, const = [], 0.0
    for gid, vs in s.items():
        for k, v in enumerate(vs):
            c = strategy_compute(graph.groups[gid].strategies[k])
            if isinstance(v, int):
                const += c * v
            elif c:
                terms.append((v, c))
    return terms, const


def add_prefetch_overlap(prob: pulp.LpProblem, graph, s, x, room: float, scale: float):
    """Add h and its two rows (module docstring) to ``prob``, in the objective's unit ``scale``
    (units per second); returns h's pulp variable, or None when ``room`` is 0 or no edge is
    prefetchable."""
    if room <= 0 or not prefetch_edges(graph):
        return None
    p_terms, p_const = prefetch_terms(graph, s, x)
    if not p_terms and p_const <= 0:
        return None
    c_terms, c_const = compute_terms(graph, s)
    h = prob.add_variable("prefetch_hidden", 0, None)
    prob += h <= _expr(p_terms, p_const, scale), "prefetch_hidden_le_prefetch"
    prob += h <= _expr(c_terms, c_const, scale * room), "prefetch_hidden_le_compute"
    return h


def hidden_seconds(graph, choice: dict[str, int]) -> float:
    """(1 - TIE) h of a choice (group -> strategy index), seconds, h = min(P, rho C) at that
    choice: what Q1 takes off the step."""
    room = getattr(graph, "prefetch_room", 0.0)
    if room <= 0:
        return 0.0
    P = sum(graph.edges[i].cost[graph.edges[i].p_of[choice[graph.edges[i].producer]]]
            [graph.edges[i].q_of[choice[graph.edges[i].consumer]]] for i in prefetch_edges(graph))
    C = sum(strategy_compute(graph.groups[g].strategies[k]) for g, k in choice.items())
    return float(credit(P, C, room))


def _expr(terms, const: float, scale: float) -> pulp.LpAffineExpression:
    coef: dict[Any, float] = {}
    for v, c in terms:
        coef[v] = coef.get(v, 0.0) + c * scale
    return pulp.LpAffineExpression(list(coef.items()), constant=const * scale)
