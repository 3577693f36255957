"""Solver answers kept across planning runs, beside the evidence they were computed from.

With every compile found in the evidence cache, what is left of a re-plan is solving: the
sharding ILPs (one per mesh and iteration, and one per seed refinement), the placements (one
per compiled candidate, each followed by its choice by Q2 step) and the final annealing. Each
is a function of its inputs and of the solver code alone, unless a clock stopped it; so ``SolveMemo`` keeps the answers that no clock decided and gives them back
for the same inputs:

  key(sharding)  = SHA-256 of (code, IR, target, mesh, ShardingProblem without its prebuilt
                   graph, solver, k_best, seed, threads, distinct)
  key(placement) = SHA-256 of (code, evidence, target, time limit, seed, workers, hint, options)
  key(annealing) = SHA-256 of (code, evidence, target, seed, starts, temperatures, evaluations)
  key(step_choice) = SHA-256 of (code, evidence, network, the certified placement, the other
                   candidates and their names, the descent's evaluation cap)
  key(refinement) = SHA-256 of (code, IR, target, the seed's layout, its parameter leaves, seed,
                   attention and compute scales, remat)

``code``: a hash of the source of ``formulation/``, ``solvers/`` and ``extract/`` (the model, the
solvers, the evidence and network they read). The sharding time limit is not in its key: an
answer is kept only when every certificate is proven optimal and no alternative was dropped
for time (``time_limits.sharding`` finds nothing), so a longer or shorter limit gives the
same answer. A placement's limit is in its key: it sets CP-SAT's deterministic work budget
(``solvers.work_budget``); kept only when no clock stopped a solve before its work
(``time_limits.placement``). An annealing run given its count of evaluations is kept when the
clock did not cut it; a choice by Q2 step (``solvers.placement_step.choose_by_step``) when the
clock did not cut its swap descent (its record then applied to the result given: ``with_choice``).
A seed's refinement (``seed_refinement.refine_seed``: its strategy graph, pins and ILP) is kept
as its ILP's answer is, whatever the limit. A kept answer comes back with its original certificate, which
says so in ``detail["from_cache"]``.

Stored as JSON records in the evidence cache (``EvidenceCache.get_record`` / ``put_record``):
the same directory, size limit, atomic writes and corruption checks.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Callable

from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.formulation.latency import predict_step
from aoizora.formulation.layout import Layout
from aoizora.planning import time_limits
from aoizora.planning.seed_refinement import Refinement
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.placement_result import PlacementResult
from aoizora.solvers.placement_step import MAX_EVALUATIONS, with_choice
from aoizora.solvers.sharding import ShardingResult, ShardingSolution, solve_sharding

FORMAT = 1          # the records' format; part of every key
_UNREADABLE = object()      # a record ``build`` could not read (``SolveMemo._given_back``)


SOLVER_CODE = ("formulation", "solvers", "extract")     # what a solver's answer depends on


def code_fingerprint() -> str:
    """SHA-256 (hex, 16 chars) of the source of the packages a solver's answer depends on
    (``SOLVER_CODE``)."""
    return source_fingerprint(SOLVER_CODE)


@functools.lru_cache(maxsize=8)
def source_fingerprint(paths: tuple[str, ...]) -> str:
    """SHA-256 (hex, 16 chars) of the ``.py`` files under ``paths`` (folders or files, relative
    to the repository's root), each with its path, in sorted order; computed once a process.

    Raises:
        FileNotFoundError: a path names no folder nor file."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    h = hashlib.sha256()
    for rel in paths:
        for path in _sources(os.path.join(root, rel)):
            with open(path, "rb") as f:
                h.update(os.path.relpath(path, root).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:16]


def _sources(path: str) -> list[str]:
    """The ``.py`` files of ``path`` (itself when a file), sorted."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(path)
    return sorted(os.path.join(d, n) for d, _, files in os.walk(path)
                  for n in files if n.endswith(".py"))


def _digest(obj: Any) -> str:
    blob = json.dumps(_canon(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _canon(x: Any) -> Any:
    """``x`` as plain JSON: records by their ``to_json`` or fields, arrays as lists, mapping
    keys as strings."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, dict):
        return {str(k): _canon(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_canon(v) for v in x]
    if hasattr(x, "to_json"):
        return _canon(x.to_json())
    if dataclasses.is_dataclass(x):
        return _canon({f.name: getattr(x, f.name) for f in dataclasses.fields(x)})
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


class SolveMemo:
    """Wraps a planner's ``solve_sharding``, ``solve_placement``, ``annealing``,
    ``choose_by_step`` and ``refine_seed`` (``planning.seams``) so that answers no clock decided are kept in ``cache`` and given back (module docstring).
    ``hits`` / ``kept``: answers given back / stored in this run."""

    def __init__(self, cache: EvidenceCache):
        self.cache = cache
        self.hits = self.kept = 0
        self._fingerprints: dict[int, tuple[Any, str]] = {}

    def _fingerprint(self, obj: Any) -> str:
        """The digest of an IR or evidence record, computed once per object: of its ``repr``
        (a dataclass of plain values: deterministic, and far cheaper than its JSON); of its
        JSON if the repr shows an object's address."""
        got = self._fingerprints.get(id(obj))
        if got is None or got[0] is not obj:
            text = f"{type(obj).__name__}:{obj!r}"
            digest = (_digest(obj.to_json()) if " at 0x" in text
                      else hashlib.sha256(text.encode("utf-8")).hexdigest())
            got = self._fingerprints[id(obj)] = (obj, digest)
        return got[1]

    def _key(self, kind: str, parts: dict[str, Any]) -> str:
        return self.cache.key({"kind": kind, "format": FORMAT, "code": code_fingerprint(),
                               "inputs": _digest(parts)})

    def _given_back(self, record: dict[str, Any], build: Callable[[dict[str, Any]], Any]):
        try:
            out = build(record)
        except (KeyError, TypeError, ValueError):
            return _UNREADABLE          # an unreadable record: solve again
        self.hits += 1
        return out

    def _through(self, key: str, build: Callable[[dict[str, Any]], Any], run: Callable[[], Any],
                 keep: Callable[[Any], bool], record: Callable[[Any], dict[str, Any]]):
        """The answer kept under ``key`` (``build`` from its record), else ``run()``'s, kept
        when ``keep`` says no clock decided it."""
        got = self.cache.get_record(key)
        if got is not None:
            got = self._given_back(got, build)
            if got is not _UNREADABLE:
                return got
        res = run()
        if keep(res):
            self.cache.put_record(key, record(res))
            self.kept += 1
        return res

    def sharding(self, solve: Callable) -> Callable:
        """``solve`` (``solvers.sharding.solve_sharding``'s signature), memoized."""

        @functools.wraps(solve)
        def memoized(ir, target, mesh_axes, problem=None, *, solver="highs", time_limit_s=30.0,
                     k_best=1, seed=0, threads=1, distinct="any"):
            prob = None if problem is None else {
                f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)
                if f.name != "graph"}
            key = self._key("sharding", {
                "ir": self._fingerprint(ir), "target": _target(target), "mesh": mesh_axes,
                "problem": prob, "solver": solver, "k_best": k_best, "seed": seed,
                "threads": threads, "distinct": distinct})
            return self._through(
                key, _sharding_result,
                lambda: solve(ir, target, mesh_axes, problem, solver=solver,
                              time_limit_s=time_limit_s, k_best=k_best, seed=seed,
                              threads=threads, distinct=distinct),
                _proven, lambda res: res.to_json())

        return memoized

    def placement(self, solve: Callable) -> Callable:
        """``solve`` (``solvers.placement.solve_placement``'s signature), memoized."""

        @functools.wraps(solve)
        def memoized(evidence, network, time_limit_s=10.0, *, seed=0, workers=1, hint=None,
                     options=None):
            key = self._key("placement", {
                "evidence": self._fingerprint(evidence), "network": _network(network),
                "time_limit_s": round(float(time_limit_s), 3), "seed": seed,
                "workers": workers, "hint": None if hint is None else [int(d) for d in hint],
                "options": options})
            return self._through(
                key, functools.partial(_placement_result, evidence, network),
                lambda: solve(evidence, network, time_limit_s, seed=seed, workers=workers,
                              hint=hint, options=options),
                lambda res: not time_limits.placement("placement", res.certificate),
                _placement_record)

        return memoized

    def annealing(self, anneal: Callable) -> Callable:
        """``anneal`` (``solvers.placement_heuristics.annealing``'s signature), memoized: an
        answer is kept when the clock did not cut it (``detail["cut"]``); given a count of
        evaluations, the limit is then only a guard and stays out of the key."""

        @functools.wraps(anneal)
        def memoized(evidence, network, time_limit_s=5.0, seed=0, starts=None, t_start=0.05,
                     t_end=1e-4, max_evaluations=None):
            kw = dict(seed=seed, starts=starts, t_start=t_start, t_end=t_end,
                      max_evaluations=max_evaluations)
            if max_evaluations is None:     # the clock sets the count: not repeatable
                return anneal(evidence, network, time_limit_s, **kw)
            key = self._key("annealing", {
                "evidence": self._fingerprint(evidence), "network": _network(network), **kw})
            return self._through(
                key, functools.partial(_placement_result, evidence, network),
                lambda: anneal(evidence, network, time_limit_s, **kw),
                lambda res: not (res.certificate.detail or {}).get("cut"),
                _placement_record)

        return memoized

    def step_choice(self, choose: Callable) -> Callable:
        """``choose`` (``solvers.placement_step.choose_by_step``'s signature), memoized: the
        choice (placement and record) is kept when the clock did not cut its swap descent; the
        result it is applied to stays out of the key but its placement (``with_choice``
        applies a kept choice to the result given), the time limit too."""

        @functools.wraps(choose)
        def memoized(evidence, network, result, candidates, tm=None, time_limit_s=2.0,
                     max_evaluations=MAX_EVALUATIONS, names=None):
            run = lambda: choose(evidence, network, result, candidates, tm,  # noqa: E731
                                 time_limit_s, max_evaluations, names)
            if result.placement is None:
                return run()
            key = self._key("step_choice", {
                "evidence": self._fingerprint(evidence), "network": _network(network),
                "certified": [int(d) for d in result.placement],
                "candidates": [[int(d) for d in q] for q in candidates],
                "names": None if names is None else list(names),
                "max_evaluations": max_evaluations})
            return self._through(
                key, lambda rec: with_choice(evidence, network, result, rec["placement"],
                                             {**rec["choice"], "from_cache": True}, tm),
                run, lambda res: _choice(res)["descent_cut"] != "time limit",
                lambda res: {"placement": [int(d) for d in res.placement],
                             "choice": {k: v for k, v in _choice(res).items()
                                        if k != "changed"}})

        return memoized


    def refinement(self, refine: Callable) -> Callable:
        """``refine`` (``seed_refinement.refine_seed``'s signature), memoized: its refinement
        (None too: the ILP keeps the seed's parameters) is kept when no clock decided its ILP
        (as ``sharding`` keeps one); a RefinementError is raised again each time. The time
        limit is not in its key."""

        @functools.wraps(refine)
        def memoized(ir, target, layout, param_leaves, *, time_limit_s=30.0, seed=0,
                     attention_scale=None, compute_scale=1.0, remat="stacks",
                     solve=solve_sharding):
            kw = dict(seed=seed, attention_scale=attention_scale, compute_scale=compute_scale,
                      remat=remat)
            key = self._key("refinement", {
                "ir": self._fingerprint(ir), "target": _target(target),
                "layout": layout.to_json(), "params": [int(i) for i in param_leaves], **kw})
            answers = []

            def seen(*a, **k):
                answers.append(solve(*a, **k))
                return answers[-1]

            return self._through(
                key, _refinement,
                lambda: refine(ir, target, layout, param_leaves, time_limit_s=time_limit_s,
                               solve=seen, **kw),
                lambda res: len(answers) == 1 and _proven(answers[0]), _refinement_record)

        return memoized


def _proven(res: ShardingResult) -> bool:
    """No clock decided this sharding answer (``time_limits.sharding``)."""
    return not any(time_limits.sharding("ilp", s.certificate) for s in res.all())


def _refinement_record(ref: Refinement | None) -> dict[str, Any]:
    return {"refinement": None if ref is None else {
        "layout": ref.layout.to_json(), "solution": ref.solution.to_json(),
        "kept": dict(ref.kept), "changed": int(ref.changed)}}


def _refinement(record: dict[str, Any]) -> Refinement | None:
    d = record["refinement"]
    if d is None:
        return None
    sol = ShardingSolution.from_json(d["solution"])
    sol.certificate.detail = {**(sol.certificate.detail or {}), "from_cache": True}
    return Refinement(Layout.from_json(d["layout"]), sol, dict(d["kept"]), int(d["changed"]))


def _choice(res: PlacementResult) -> dict[str, Any]:
    return res.certificate.detail["step_choice"]


def _placement_record(res: PlacementResult) -> dict[str, Any]:
    return {"placement": None if res.placement is None else [int(d) for d in res.placement],
            "certificate": res.certificate.to_json(), "trace": [list(t) for t in res.trace],
            "candidates": [[int(d) for d in c] for c in res.candidates]}


def _target(target) -> Any:
    """A target's identity in a key: its resolved record (None: the problem carries it)."""
    return None if target is None else _canon(target)


def _network(network) -> Any:
    """A network's identity in a key: its public attributes of plain types and arrays (name,
    shape, wrap, bandwidths, latencies, links, device-to-chip map); not its private caches
    (``_ring_cache``: filled as rings are asked for, so in an order that differs by run)."""
    out = {"class": type(network).__name__}
    for k, v in sorted(vars(network).items()):
        if k.startswith("_"):
            continue
        if hasattr(v, "tolist") or isinstance(v, (int, float, str, bool, tuple, list, dict)):
            out[k] = _canon(v)
    return out


def _sharding_result(record: dict[str, Any]) -> ShardingResult:
    res = ShardingResult.from_json(record)
    for sol in res.all():
        sol.certificate.detail = {**(sol.certificate.detail or {}), "from_cache": True}
    return res


def _placement_result(evidence, network, record: dict[str, Any]) -> PlacementResult:
    cert = Certificate.from_json(record["certificate"])
    cert.detail = {**(cert.detail or {}), "from_cache": True}
    placement = record["placement"]
    q2 = None if placement is None else predict_step(evidence, placement, network)
    return PlacementResult(placement, cert, q2, [tuple(t) for t in record["trace"]],
                           [list(c) for c in record["candidates"]])
