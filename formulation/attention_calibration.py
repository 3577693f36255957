"""Attention compute calibrated on compiled programs: the second thing the planner's loop feeds
back into the sharding ILP, besides the effective bandwidth per axis.

Q1 prices an attention shard by the splash kernel model at its shard shape
(``formulation.strategies``), and a ring also by the bytes of its online-softmax combine, the
loop's copies of the chunk it forwards and the log-sum-exp slice
(``formulation.ring_overhead``). The compiled programs still differ from Q1 (the compiler's
fusions and its own estimates of those passes), and from each other (an example:
benchmarks/results/lab_notes.md).

``aoizora.runtime.realize`` runs every attention node under the name scope
``extract.evidence.attention_scope(key)``, so the compiler's ops carry the node's key in their
op_name metadata. For compiled candidates ``c`` and their attention nodes ``a`` (ILP layouts
only: their strategies are known):

    t[c, a] = sum_{compute ops o of c whose op_name names a} count_o * t_o   (seconds per call,
              t_o as in Q2's compute_s: ``formulation.op_time.op_seconds``; collectives excluded)
              + x[c, a] when a runs in a ring
    x[c, a] = sum_{phases p of Q2(c)} count_p * exposed_p * bytes_p(a) / bytes_p
              the exposed link time Q2 charges to the collectives under a's scope (the ring's
              collective-permutes), each phase's exposed time shared among its collectives by
              bytes (``exposed_scope_seconds``). Q1 prices a ring as max(compute, comm), i.e.
              its transfers hidden behind its kernels; where the compiled program exposes them,
              the factor takes them in. (A gathered node's all-gather is an edge of the ILP,
              priced by the collective-cost feedback, so it is not added.)
    q[c, a] = Q1's unscaled compute of a under c's strategy, times its repeat
              (``ShardingSolution.attention[a]["compute_s"]``)

and per node ``a`` and kv mode ``mu`` in {"gather", "ring"}, over every candidate compiled so far:

    scale[a][mu]   = sum_{c : kv(c, a) = mu} t[c, a]  /  sum_{c : kv(c, a) = mu} q[c, a]
    scale["*"][mu] = the same sums over every node          (for nodes never compiled in mode mu)

The ILP then prices attention strategy k of node a in mode mu (``strategies``,
``attention_scale``): gathered ``scale * compute_k + comm_k``, ring ``max(scale * compute_k,
comm_k)``, with ``scale = scale[a][mu]`` if a ran in mode mu, else ``scale["*"][mu]``. A mode no
compiled candidate ran keeps scale 1 (Q1 as is). Approximation: one factor per node and mode,
whatever the mesh, shard shape or ring length.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from aoizora.extract.evidence import Evidence, attention_node_of
from aoizora.extract.network import Network
from aoizora.formulation.op_time import op_seconds

KV_MODES = ("gather", "ring")


@dataclasses.dataclass
class AttentionSample:
    """One attention node of one compiled candidate: Q1's compute against the compiler's."""
    key: str                 # attention node key (IR / Layout.attention)
    kv: str                  # "gather" | "ring"
    q1_compute_s: float      # q[c, a], seconds per call
    compiled_s: float        # t[c, a], seconds per call
    candidate: str = ""      # which candidate it came from, for the record


def compiled_attention_seconds(evidence: Evidence, network: Network) -> dict[str, float]:
    """t[c, a] for every attention node whose scope the compiled ops carry (seconds per call)."""
    out: dict[str, float] = {}
    for op in evidence.compute:
        key = attention_node_of(op.op_name)
        if key is None:
            continue
        t = op_seconds(op, evidence, network) or 0.0
        out[key] = out.get(key, 0.0) + op.count * t
    return out


def exposed_scope_seconds(evidence: Evidence, q2) -> dict[str, float]:
    """x[c, a] (module docstring) for every attention node whose scope some collective carries,
    seconds per call; ``q2``: the candidate's Q2 (its phases) under its placement."""
    col = {c.name: c for c in evidence.collectives}
    out: dict[str, float] = {}
    for ph in q2.phases:
        cs = [col[n] for n in ph.collectives if n in col]
        total = sum(c.bytes for c in cs)
        if total <= 0 or ph.exposed_s <= 0:
            continue
        for c in cs:
            key = attention_node_of(c.op_name)
            if key is not None:
                out[key] = out.get(key, 0.0) + ph.count * ph.exposed_s * c.bytes / total
    return out


def attention_samples(attention: dict[str, dict[str, Any]], evidence: Evidence,
                      network: Network, candidate: str = "", q2=None) -> list[AttentionSample]:
    """The samples of one compiled candidate: ``attention`` is its ``ShardingSolution.attention``;
    ``q2`` its Q2 (then a ring's exposed transfers count, module docstring). Nodes without
    compiled ops under their scope (or with no Q1 compute) give no sample."""
    seen = compiled_attention_seconds(evidence, network)
    exposed = exposed_scope_seconds(evidence, q2) if q2 is not None else {}
    out = []
    for key, a in sorted(attention.items()):
        q, t = float(a.get("compute_s", 0.0)), seen.get(key, 0.0)
        if a.get("kv") == "ring" and t > 0:
            t += exposed.get(key, 0.0)
        if a.get("kv") in KV_MODES and q > 0 and t > 0:
            out.append(AttentionSample(key, a["kv"], q, t, candidate))
    return out


def fit_attention_scale(samples: Iterable[AttentionSample]) -> dict[str, dict[str, dict[str, Any]]]:
    """scale[a][mu] and scale["*"][mu] (module docstring), with what each was fitted on:
    {a or "*": {mu: {"scale", "compiled_s", "q1_compute_s", "samples", "candidates"}}}."""
    samples = list(samples)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key in ["*"] + sorted({s.key for s in samples}):
        for mu in KV_MODES:
            mine = [s for s in samples if s.kv == mu and key in ("*", s.key)]
            q = sum(s.q1_compute_s for s in mine)
            if not mine or q <= 0:
                continue
            t = sum(s.compiled_s for s in mine)
            out.setdefault(key, {})[mu] = {
                "scale": t / q, "compiled_s": t, "q1_compute_s": q, "samples": len(mine),
                "candidates": sorted({s.candidate for s in mine})}
    return out


def scales(fit: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """The ILP's ``attention_scale`` argument from a ``fit_attention_scale`` result."""
    return {key: {mu: float(f["scale"]) for mu, f in by_mode.items()} for key, by_mode in fit.items()}
