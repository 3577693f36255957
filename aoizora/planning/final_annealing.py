"""After the last compile: anneal the best candidate's placement with the time left.

Unless the best candidate's placement is proven on every level CP-SAT optimizes (link load,
link bytes, hops: ``candidate_pricing.levels_proven``), two annealing runs
(``solvers.placement_heuristics.annealing``), each on the budget's ``annealing`` share (the time
left less a 1 s margin, none under 0.5 s, at most the run's own budget):

  1. from the starts a placement heuristic would take (the default order and every axis-order
     placement, ``annealing_starts``) with the budget CP-SAT had on it (``time_limit_s`` of its
     certificate: a heuristic search "with the same budget");
  2. from the placement kept so far, with ``placement_time_s``;

then the least Q2 step among the answer and both, after a swap descent on the
``final_descent`` share (``solvers.placement_step.choose_by_step``). CP-SAT can stall above what
swaps reach, and a proof of the link-load level alone leaves the placements that tie on it unranked
by the per-hop latency Q2 adds (benchmarks/results/lab_notes.md). Each run makes the swaps its
budget buys (``evaluation_budget`` of its own budget, not of the time left), the clock only capping
it, so the first run is the grid's annealing baseline itself (same evidence, starts, seed and
budget) whenever the clock does not cut it.

The loop keeps the budget's ``reserve`` share from compiles for this (``anneal_reserve``): the
last compiled candidate's placement and then the first run, each up to ``placement_time_s``.
With one ``placement_time_s`` only, the last candidate's placement takes part of the annealing's
time (benchmarks/results/lab_notes.md). The heuristic's run
goes first so that a shortfall (a compile over its expected time) falls on the second.
"""

from __future__ import annotations

from typing import Callable

from aoizora.planning.candidate import Candidate
from aoizora.planning.candidate_pricing import levels_proven
from aoizora.extract.network import Network
from aoizora.planning.progress import Progress
from aoizora.solvers.budget import Budget, share
from aoizora.solvers.placement import PlacementResult
from aoizora.solvers.placement_heuristics import annealing, annealing_starts, evaluation_budget
from aoizora.solvers.placement_step import choose_by_step


def anneal_reserve(budget: Budget, placement_time_s: float) -> float:
    """The seconds no compile starts into while the best placement is not proven: the budget's
    ``reserve`` share, min(2 x placement_time_s, 0.1 x the budget)."""
    return budget.share_s("reserve", placement_time_s)


def anneal_best(best: Candidate, network: Network, budget: Budget, placement_time_s: float,
                seed: int, progress: Progress, anneal: Callable = annealing,
                choose: Callable = choose_by_step) -> tuple[str, list[str]]:
    """Anneal ``best``'s placement (module docstring) and keep the least Q2 step in ``best``
    (``anneal``, ``choose``: the annealing and the choice by step, ``Seams``' own).
    Returns what it did, in words ("" when it did not run), and where the clock cut it (a run
    cut or not started, the final swap descent cut): ``Plan.time_limited``'s entries."""
    cert = best.placement_cert
    if cert is None or levels_proven(cert) or best.evidence is None:
        return "", []
    left = _annealing_left(budget)
    if left < share("annealing").least_s:
        return "", [f"not run, {max(left, 0.0):.1f} s left"]
    ev = best.evidence
    heuristic_starts = annealing_starts(network, list(ev.mesh_axes.values()),
                                        best.default_order or range(ev.num_devices))
    runs = [("annealing from the heuristic starts", heuristic_starts,
             float(cert.time_limit_s or placement_time_s)),
            ("annealing from the placement kept", [best.placement], placement_time_s)]
    found, names, spent, limited, record = [], [], 0.0, [], []
    sh = share("annealing")
    for name, starts, limit in runs:
        now_left = budget.left()
        left = sh.available_s(now_left, budget.total_s)
        if left < sh.least_s:
            limited.append(f"{name}: not run, {max(left, 0.0):.1f} s left")
            break
        run_s = sh.seconds(now_left, budget.total_s, limit)    # min(limit, left)
        sa = anneal(ev, network, time_limit_s=run_s, seed=seed, starts=starts,
                       max_evaluations=evaluation_budget(limit))
        d = sa.certificate.detail
        if d.get("cut"):
            limited.append(f"{name}: cut at the {run_s:.1f} s left ({d['cut']})")
        found.append(sa.placement)
        names.append(name)
        spent += sa.certificate.time_s
        record.append({"run": name, "budget_s": limit, "starts": len(starts),
                       "swaps_asked": d.get("evaluations_asked"), "swaps": d.get("iterations"),
                       "cut": d.get("cut"), "time_s": sa.certificate.time_s,
                       "step_s": sa.q2.step_s})
    res = PlacementResult(list(best.placement), cert, best.q2, [])
    res = choose(ev, network, res, found, names=names,
                 time_limit_s=budget.share_s("final_descent"))
    if res.certificate.detail["step_choice"].get("descent_cut") == "time limit":
        limited.append("the swap descent after it stopped at its time limit")
    res.certificate.detail["final_annealing"] = record
    did = (f"{spent:.1f} s ({len(found)} runs), Q2 {res.q2.step_s * 1e3:.3f} ms (was "
           f"{best.q2.step_s * 1e3:.3f} ms)")
    progress.note(f"placement not proven on every level: annealing for {did}")
    best.placement, best.placement_cert, best.q2 = res.placement, res.certificate, res.q2
    return did, limited


def _annealing_left(budget: Budget) -> float:
    """The annealing share's base now: the time left less its margin."""
    return share("annealing").available_s(budget.left(), budget.total_s)
