"""The programs the planner compiled in one benchmark cell, reused for the rows that are the same
program: a seed's compile serves its expert's row, the plan's compile the plan's rows."""

from __future__ import annotations

import json
from typing import Any

from aoizora.extract.aot_compile import read_hlo


def json_remat(r):
    """A remat as JSON: a mapping for the pairs a TrainConfig keeps, else as it is."""
    return dict(r) if isinstance(r, (list, tuple)) else r


class PlannerCompiles:
    """The programs the planner compiled (its ``on_candidate``), by layout and program variant,
    each with its evidence and its HLO (kept by ``keeping_hlo``): a row whose layout and program
    the planner compiled reuses that compile instead of compiling it again (the evidence is in
    logical ranks, so one compile serves every placement)."""

    def __init__(self, job):
        self.job, self.by_key = job, {}
        self.texts: dict[str, str] = {}      # HLO text of compiles added with ``add``

    def add(self, layout, program: dict[str, Any], ev, hlo: str) -> None:
        """A compile made elsewhere (e.g. a tuned expert's setting), with its HLO text."""
        k = self.key(layout, program)
        self.by_key[k], self.texts[k] = ev, hlo

    def __call__(self, cand) -> None:
        if cand.evidence is not None and cand.fits and read_hlo(cand.evidence) is not None:
            prog = cand.seed.program if cand.seed is not None else {}
            self.by_key[self.key(cand.solution.layout, prog)] = cand.evidence

    def key(self, layout, program: dict[str, Any]) -> str:
        d = layout.to_json()
        d.pop("name", None)
        pad = program.get("pad_multiple") or self.job.pad_multiple
        remat = json_remat(program.get("remat", self.job.remat or "none"))
        return json.dumps([d, pad, remat], sort_keys=True, default=str)

    def evidence(self, layout, program: dict[str, Any]):
        """The evidence of that compile (it fits in HBM), or None."""
        return self.by_key.get(self.key(layout, program))

    def get(self, layout, program: dict[str, Any]):
        """(evidence, HLO text) of that compile, or None."""
        k = self.key(layout, program)
        ev = self.by_key.get(k)
        return None if ev is None else (ev, self.texts.get(k) or read_hlo(ev))
