"""The tuned experts' rows of a grid cell (``aoizora.expert_tuning``), whichever grid prices them.

Rows (each a dict of the grid's row fields, priced as the grid prices every row):
  ``tuned:NAME``                          expert NAME at the best of its users' knobs (remat,
                                          attention blocks, compiler options), default order;
  ``best-tuned-expert``                   the least of those: the headline baseline;
  ``best-tuned-expert/solved-placement``  that setting under the placement CP-SAT solves for it
                                          (kept only if Q2 prices it below the default order:
                                          the planner's own rule), so that what placement adds
                                          is apart from what layouts add.
Each row names the expert, its knobs (``knobs``) and the gain of tuning over the published
setting (``tuning_gain``, by the grid's price); ``tuning`` lists every setting priced.
"""

from __future__ import annotations

from typing import Any, Callable

from aoizora.compare import job_experts
from aoizora.expert_tuning import Priced, TunedExpert, best_of, tune_expert
from aoizora.extract.network import Network
from aoizora.formulation.latency import predict_step
from aoizora.models.tuned_experts import Variant
from aoizora.solvers.placement import solve_placement

PLACEMENT_TIME_S = 10.0        # the planner's default placement_time_s


def solved_order(ev, network: Network, default: list[int], seed: int = 0
                 ) -> tuple[list[int], str]:
    """(placement, how): CP-SAT's placement of ``ev`` when Q2 prices it below ``default``,
    else ``default``."""
    res = solve_placement(ev, network, time_limit_s=PLACEMENT_TIME_S, seed=seed, hint=default)
    if res.placement is not None and (predict_step(ev, res.placement, network).step_s
                                      < predict_step(ev, default, network).step_s):
        return list(res.placement), f"placement CP-SAT ({res.certificate.status})"
    return list(default), "CP-SAT found no placement better than JAX's default order (Q2)"


def tuned_expert_rows(job, price: Callable[[Variant], Priced],
                      solved: Callable[[TunedExpert], dict[str, Any] | None],
                      log: Callable[[str], None] = print, tune_compiles: int | None = None
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, tuning) for ``job`` (module docstring). ``price``: compiles one setting and
    returns its ``Priced`` with the grid's row in ``detail``; ``solved``: the row of a tuned
    expert's best setting under a solved placement (None: not priced)."""
    tuned = []
    for ex in job_experts(job):
        if ex.valid:
            log(f"  tuning expert {ex.name}")
            tuned.append(tune_expert(job, ex.name, price, tune_compiles))
    rows = []
    for t in tuned:
        if t.best is None:
            why = next((x.priced.reason for x in t.trials if x.priced.reason), "")
            rows.append({"name": f"tuned:{t.name}", "valid": False,
                         "reason": f"no setting of its knobs was priced: {why}"[:300]})
            continue
        rows.append({**t.best.priced.detail, "name": f"tuned:{t.name}", "valid": True,
                     "knobs": t.best.knobs.label(), "tuning_gain": t.gain})
    best = best_of(tuned)
    if best is not None:
        common = {"expert": best.name, "knobs": best.best.knobs.label(),
                  "tuning_gain": best.gain, "valid": True}
        rows.append({**best.best.priced.detail, **common, "name": "best-tuned-expert"})
        row = solved(best)
        if row is not None:
            rows.append({**row, **common, "name": "best-tuned-expert/solved-placement"})
    return rows, [t.to_json() for t in tuned]
