"""Where a time limit decided a planning run (``Plan.time_limited``).

Every solver in the loop is seeded and single-threaded, so a run is repeatable wherever no time
limit binds (``tests/test_planner.py::test_same_seed_same_plan``). Where one binds, what was found
by then depends on the machine's speed and load, and a re-run with the same inputs, seed and
budget can plan otherwise. The planner records, in words, each place where one bound:

- a sharding ILP, or a seed's refinement, answered without a proof (certificate status not
  OPTIMAL: its solver was stopped by its limit), or found fewer of the k best layouts asked;
- an ILP or a seed refinement skipped, or a compile not started, to keep the budget;
- a placement whose CP-SAT solves the clock's guard stopped before their work budget (CP-SAT's
  deterministic time, ``solvers.work_budget``: a placement left unproven by its work budget is
  repeatable, one the guard stopped is not), whose limit the time left cut below
  ``placement_time_s`` and which is not proven optimal (a proof under a cut limit is the
  answer a longer limit would give on its link-load level), found by a heuristic (no CP-SAT
  model: its annealing is capped by the clock), or whose swap descent its time limit cut (``solvers.placement_step.choose_by_step``);
- the final annealing of the plan's placement cut by the time left, or not run for want of it
  (its schedule follows a count of swaps, ``placement_heuristics.evaluation_budget``; the clock
  only caps it), or the swap descent after it cut.

An empty list: no limit bound, and the same inputs, seed and budget give the same layout and
device order. Notes that do not change them (whether the plan was re-compiled in its device
order at the end) are not counted. Not seen either: a seed refinement whose ILP keeps the seed's
layout (``aoizora.planning.seed_refinement.refine_seed`` returns no certificate then), and an ILP answer
within ``PROOF_REL_TOL`` of its bound (OPTIMAL, though another optimum within that tolerance
could come back on a re-run).
"""

from __future__ import annotations

from aoizora.solvers.certificate import Certificate
from aoizora.solvers.placement import LEVELS


def sharding(what: str, cert: Certificate | None) -> list[str]:
    """``what`` (e.g. "sharding ILP on mesh 2x4") if its certificate shows a time limit bound."""
    if cert is None:
        return []
    out = []
    if not cert.proven_optimal:
        gap = "" if cert.gap is None else f", gap {100 * cert.gap:.2f}%"
        out.append(f"{what}: {cert.status} at its {_seconds(cert.time_limit_s)} limit{gap}")
    note = (cert.detail or {}).get("k_best_note")
    if note:
        out.append(f"{what}: {note}")
    return out


def placement(what: str, cert: Certificate | None, asked_s: float | None = None) -> list[str]:
    """``what`` (e.g. "placement of mesh 2x4 layout L") where the clock decided the placement:
    its limit below `asked_s` (the planner's ``placement_time_s``: the time left cut it) and its
    status not OPTIMAL (a cut limit did not change a proven answer); with a
    work budget (``detail["work"]``), each solve the clock's guard stopped before its work;
    without one (a heuristic's answer, or a certificate from before the work budget), every
    level not proven (the link-load level, or a tie-break level solved but stopped short of a
    proof; tie-break levels not attempted, e.g. when the incumbent met the analytic bound, are
    not a time limit); and the swap descent after it, stopped by its time limit."""
    if cert is None:
        return []
    detail = cert.detail or {}
    levels = detail.get("levels") or {}
    out = []
    if (asked_s is not None and cert.time_limit_s is not None and cert.status != "OPTIMAL"
            and cert.time_limit_s < float(asked_s) * (1 - 1e-9)):
        out.append(f"{what}: its limit cut to {_seconds(cert.time_limit_s)} of "
                   f"{_seconds(float(asked_s))} by the time budget left")
    work = detail.get("work")
    if work is not None:
        if work.get("wall_cut"):
            out.append(f"{what}: the clock stopped {', '.join(work['wall_cut'])} before its "
                       f"work budget ({_seconds(cert.time_limit_s)} limit)")
    else:
        open_levels = [f"{name} {(levels.get(name) or {}).get('status', 'not proven')}"
                       for name in LEVELS
                       if (levels.get(name) or {}).get("status") != "OPTIMAL"
                       and (name == "comm" or name in levels)]
        if open_levels:
            out.append(f"{what}: {cert.solver} not proven on every level in its "
                       f"{_seconds(cert.time_limit_s)} limit ({', '.join(open_levels)})")
    if (detail.get("step_choice") or {}).get("descent_cut") == "time limit":
        out.append(f"{what}: the swap descent stopped at its time limit")
    return out


def summary(time_limited: list[str]) -> str:
    """The plan's note on repeatability."""
    if not time_limited:
        return ("no time limit bound: the same inputs, seed and budget give this layout and "
                "device order")
    return (f"time limits bound in {len(time_limited)} place(s) (plan.time_limited): a re-run "
            f"with the same inputs, seed and budget on a machine of another speed or load can "
            f"plan otherwise")


def _seconds(s: float | None) -> str:
    return "time" if s is None else f"{s:.1f} s"
