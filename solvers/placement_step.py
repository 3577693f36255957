"""The placement the planner keeps: the lowest Q2 step among the placements priced.

CP-SAT (``solvers.placement``) minimises and certifies Q2's link-load term ``communication_s``.
Q2's step also carries the per-hop latency term ``latency_s``, which the CP-SAT model does not
hold, so two placements equal (or nearly equal) in link load can differ in predicted step. This
module picks, over a set P of priced placements (the certified answer, the hint, the axis orders)
and a swap descent from the best of them, the placement of least predicted step:

    S(p)  = comm(p) + lat(p)            (Q2's step minus its compute, the same for every p)
    p*    = argmin over P u D  of  (S(p), comm(p), link_bytes(p), hops(p))
    D     = the placements a first-improvement descent over rank swaps (i < j, in order) visits
            from argmin_P while that key strictly decreases, within ``max_evaluations`` and the
            limit (``placement_heuristics.swap_descent``, the annealing's polish too)

with ``comm, link_bytes, hops, lat = TrafficModel.scores(p)``. The descent is deterministic: a
fixed swap order and an evaluation cap (the time limit only guards it; the result says when it
cut the descent).

The certificate keeps the CP-SAT bound on ``communication_s`` (it is valid for every placement in
its scope); its objective becomes comm(p*), and the status is OPTIMAL only when comm(p*) meets
that bound, or the certified answer is OPTIMAL and comm(p*) does not exceed its objective (then
p* is as good as a proven optimum: the bound sits below that optimum by the model's overlap
rounding, ``placement_cpsat``'s ``rounding_units``). A placement chosen for a smaller S may carry more link load than the certified one:
the certificate then says FEASIBLE with the gap, and ``detail["step_choice"]`` says why.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.formulation.traffic import TrafficModel
from aoizora.solvers.placement_heuristics import swap_descent

# Swap evaluations of the descent: 4 full passes over a 16-rank slice's 120 swaps, one third of a
# pass on 64 ranks (2,016 swaps; 9 ms each here).
MAX_EVALUATIONS = 480


def step_key(tm: TrafficModel, p) -> tuple[float, float, float, int]:
    comm, lb, hops, lat = tm.scores(p)
    return (comm + lat, comm, lb, hops)


def choose_by_step(evidence: Evidence, network: Network, result, candidates: Sequence,
                   tm: TrafficModel | None = None, time_limit_s: float = 2.0,
                   max_evaluations: int = MAX_EVALUATIONS, names: Sequence[str] | None = None):
    """``result`` (a ``solvers.placement.PlacementResult`` with a placement) replaced by the
    placement of least predicted step among it, `candidates` (``names``: where each came from,
    recorded) and a swap descent (module docstring). Returns a new result; its certificate's
    ``detail["step_choice"]`` records the choice. A result without a placement is returned as
    it is."""
    if result.placement is None:
        return result
    tm = tm or TrafficModel(evidence, network)
    best, choice = step_choice(evidence, network, result.placement, candidates, tm,
                               time_limit_s, max_evaluations, names)
    return with_choice(evidence, network, result, best, choice, tm)


def step_choice(evidence: Evidence, network: Network, certified, candidates: Sequence,
                tm: TrafficModel | None = None, time_limit_s: float = 2.0,
                max_evaluations: int = MAX_EVALUATIONS, names: Sequence[str] | None = None
                ) -> tuple[list[int], dict]:
    """The placement of least predicted step among `certified`, `candidates` and a swap descent
    (module docstring), and the record of the choice (``detail["step_choice"]``: the rule, the
    step keys, where the descent started, its swaps, ``descent_cut``: why it stopped early,
    "time limit" when the clock did, and its seconds). A function of its arguments alone
    unless the clock cut the descent."""
    t0 = time.perf_counter()
    deadline = t0 + max(0.0, float(time_limit_s))
    tm = tm or TrafficModel(evidence, network)
    pool = [np.asarray(certified, dtype=np.int64)] + [np.asarray(q, dtype=np.int64)
                                                       for q in candidates]
    keys = [step_key(tm, q) for q in pool]
    i_best = min(range(len(pool)), key=lambda i: (keys[i], i))
    best, best_k = pool[i_best].copy(), keys[i_best]
    start_from = ("certified" if i_best == 0 else
                  names[i_best - 1] if names and i_best - 1 < len(names) else "candidate")
    best, best_k, evaluated, improved_swaps, cut = swap_descent(
        best, best_k, lambda q: step_key(tm, q), deadline, max_evaluations)
    choice = {"rule": "least Q2 step (communication_s + latency_s) among the certified answer, "
                      f"{len(pool) - 1} other priced placements and a swap descent",
              "certified_step_key_s": keys[0][0], "chosen_step_key_s": best_k[0],
              "start": start_from, "swaps_evaluated": evaluated,
              "improving_swaps": improved_swaps, "descent_cut": cut or None,
              "time_s": time.perf_counter() - t0}
    return [int(v) for v in best], choice


def with_choice(evidence: Evidence, network: Network, result, chosen: Sequence[int],
                choice: dict, tm: TrafficModel | None = None):
    """``result`` with the placement ``step_choice`` chose (``chosen``) and its record
    (``choice``) in its certificate's ``detail["step_choice"]``: unchanged but for that record
    when ``chosen`` is its placement; else with ``chosen``'s Q2, its certificate's objective
    ``communication_s`` and status OPTIMAL only when that meets the bound (module docstring)."""
    cert = dataclasses.replace(result.certificate, detail=dict(result.certificate.detail))
    same = [int(v) for v in chosen] == [int(v) for v in result.placement]
    cert.detail["step_choice"] = {**choice, "changed": not same}
    if same:
        return dataclasses.replace(result, certificate=cert)
    q2 = predict_step(evidence, [int(v) for v in chosen], network, tm)
    bound, was = cert.bound, result.certificate
    cert.objective = q2.communication_s
    if bound is not None:
        meets = q2.communication_s <= bound * (1 + 1e-12) + 1e-15
        as_good = (was.status == "OPTIMAL" and was.objective is not None
                   and q2.communication_s <= was.objective * (1 + 1e-12) + 1e-15)
        cert.status = "OPTIMAL" if meets or as_good else "FEASIBLE"
    delta = choice["chosen_step_key_s"] - choice["certified_step_key_s"]
    cert.detail["notes"] = list(cert.detail.get("notes", [])) + [
        f"the placement kept has Q2 step {delta * 1e6:+.3f} us against the "
        f"certified one ({choice['start']}, {choice['improving_swaps']} improving swaps); the "
        f"certificate's objective is its communication_s"]
    return dataclasses.replace(result, placement=[int(v) for v in chosen], certificate=cert,
                               q2=q2)
