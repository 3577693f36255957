"""Heuristic searches over sharding layouts: the same StrategyGraph, the same cost (Q1) and the
same memory rows as the sharding ILP, and a wall-clock budget -- what the ILP is compared against.

A *choice* gives every group g of the graph one strategy k (``choice[g] = k``). It is priced
exactly as the ILP's objective prices it (``aoizora.formulation.sharding_ilp``):

  Q1(choice) = sum_g (cost[g][k_g] + correction[g][k_g]) + sum_e r[e][p_of[k_P(e)]][q_of[k_C(e)]]

in seconds, and it is *feasible* when every memory row of the ILP holds:

  row_i(choice) = const_i + sum_g bytes_i[g][k_g] <= hbm_budget        for every memory row i

(the rows are the ILP model's own ``memory_rows``). ``ShardingInstance`` compiles both into
numpy arrays (``M[i, off[g] + k] = bytes_i[g][k]``, a unary cost vector, and per edge its cost
matrix with ``p_of`` / ``q_of``), so a single-group move is priced by a delta over the group's
incident edges and memory rows instead of a full evaluation; a full evaluation with
``sharding_ilp.evaluate`` gives the objective of every answer returned.

Searches (each seeded, each stops at ``time_limit_s``; each returns the best feasible choice it
saw, with a ``Certificate`` and a trace of (seconds since start, best Q1 in seconds)):

- ``exhaustive``: every choice, in mixed-radix order, in vectorised batches, when the space has at
  most ``max_states`` choices. A completed enumeration is a proof: OPTIMAL with bound = objective
  (INFEASIBLE when no choice fits).
- ``random_search``: strategies drawn uniformly and independently per group.
- ``coordinate_descent``: cyclic coordinate descent -- each group in turn moves to its best
  strategy given the others (feasible moves only; from an over-budget start, moves minimise the
  total overflow first) until a full sweep changes nothing; started from all-replicated, then
  from the cheapest strategy per group (node cost alone), then restarted from uniformly random
  choices until the budget ends.
- ``annealing``: simulated annealing over single-group moves at temperature
  T = T0 * (T1 / T0) ** f, f the fraction of the budget (or of ``max_steps``) used; T0 the mean
  uphill delta of sampled moves from the start, T1 = T0 * ``t_end_ratio``; from all-replicated (or
  the cheapest start if that does not fit), ending with one coordinate descent from its best.
  Each step draws a group uniformly; ``moves="heat-bath"`` (default) then draws its strategy from
  exp(-delta_k / T) over every strategy k that keeps the memory rows, ``moves="metropolis"`` draws
  one other strategy uniformly and accepts it with probability min(1, exp(-delta / T)) if it fits
  (``metropolis_annealing``). Heat-bath steps cost a group's full delta vector, Metropolis steps
  one delta; on Wan 2.1 at 1-5 s budgets heat-bath ends nearer the optimum.

Heuristics prove nothing: status FEASIBLE and bound None (UNKNOWN with objective None when no
feasible choice was seen). An answer is never over the HBM budget. With the same seed and a step /
sample / restart cap that ends the search before the clock does, the answer is the same on every
run; with only a time limit, how far a search gets depends on the machine.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import numpy as np

from aoizora.formulation.prefetch import credit, prefetch_edges, strategy_compute
from aoizora.formulation.sharding_ilp import ILPModel, strategy_corrections, evaluate
from aoizora.formulation.strategies import Hardware, Options, StrategyGraph
from aoizora.solvers.certificate import Certificate
from aoizora.solvers.sharding_problem import ShardingProblem, build_problem


class ShardingHeuristicError(ValueError):
    """A search that cannot run on this instance (e.g. enumeration of too large a space)."""


# ---------------------------------------------------------------------------------------------
# the instance: graph, ILP memory rows, budget, compiled for fast pricing

@dataclasses.dataclass
class ShardingInstance:
    graph: StrategyGraph
    model: ILPModel                    # the ILP model on the same graph (memory rows, budget)
    corrections: dict[str, Any] | None = None

    def __post_init__(self):
        g = self.graph
        self.gids: list[str] = g.order()            # the ILP's group order
        self.index = {gid: i for i, gid in enumerate(self.gids)}
        self.K = np.array([len(g.groups[x].strategies) for x in self.gids], dtype=np.int64)
        self.off = np.concatenate([[0], np.cumsum(self.K)[:-1]]).astype(np.int64)
        S = int(self.K.sum())
        corr = strategy_corrections(g, self.corrections or {})
        self.unary = np.zeros(S)
        for i, gid in enumerate(self.gids):
            for k, st in enumerate(g.groups[gid].strategies):
                self.unary[self.off[i] + k] = st.cost + corr.get((gid, k), 0.0)
        rows = self.model.memory_rows
        self.budget = float(self.model.hbm_budget)
        self.const = np.array([r.const for r in rows], dtype=float)
        self.M = np.zeros((len(rows), S))
        for ri, r in enumerate(rows):
            for (gid, k), v in r.terms.items():
                self.M[ri, self.off[self.index[gid]] + k] += v
        self.Mt = np.ascontiguousarray(self.M.T)           # per strategy: its bytes in every row
        self.edges: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = []
        self.incident: list[list[tuple[int, int]]] = [[] for _ in self.gids]   # (edge, 0 prod / 1 cons)
        for ei, e in enumerate(g.edges):
            pi, ci = self.index[e.producer], self.index[e.consumer]
            self.edges.append((pi, ci, np.array(e.cost, dtype=float), np.array(e.p_of, dtype=np.int64),
                               np.array(e.q_of, dtype=np.int64)))
            self.incident[pi].append((ei, 0))
            self.incident[ci].append((ei, 1))
        self.free = np.array([i for i in range(len(self.gids)) if self.K[i] > 1], dtype=np.int64)
        # prefetch overlap (formulation.prefetch): h = min(P, rho C), Q1 takes (1 - TIE) h off
        self.room = float(getattr(g, "prefetch_room", 0.0))
        self.pre = set(prefetch_edges(g)) if self.room > 0 else set()
        self.comp = np.zeros(S)
        for i, gid in enumerate(self.gids):
            for k, st in enumerate(g.groups[gid].strategies):
                self.comp[self.off[i] + k] = strategy_compute(st)

    def _hidden(self, P, C):
        """(1 - TIE) min(P, rho C), elementwise."""
        return credit(P, C, self.room)

    def _pc(self, c: np.ndarray) -> tuple[float, float]:
        """(P, C) of a choice vector (formulation.prefetch)."""
        P = sum(float(self.edges[ei][2][self.edges[ei][3][c[self.edges[ei][0]]],
                                        self.edges[ei][4][c[self.edges[ei][1]]]])
                for ei in self.pre)
        return P, float(self.comp[self.off + c].sum())

    # --- conversions --------------------------------------------------------------------------
    def to_choice(self, c: np.ndarray) -> dict[str, int]:
        return {gid: int(c[i]) for i, gid in enumerate(self.gids)}

    def from_choice(self, choice: dict[str, int]) -> np.ndarray:
        return np.array([choice[gid] for gid in self.gids], dtype=np.int64)

    def names(self, c: np.ndarray) -> dict[str, str]:
        return {gid: self.graph.groups[gid].strategies[int(c[i])].name for i, gid in enumerate(self.gids)}

    # --- pricing ------------------------------------------------------------------------------
    def objective(self, c: np.ndarray) -> float:
        """Q1 of a choice vector, seconds (same sum as ``sharding_ilp.evaluate``)."""
        tot = float(self.unary[self.off + c].sum())
        for pi, ci, cost, p_of, q_of in self.edges:
            tot += cost[p_of[c[pi]], q_of[c[ci]]]
        return tot - float(self._hidden(*self._pc(c))) if self.pre else tot

    def rows(self, c: np.ndarray) -> np.ndarray:
        """Every memory row's bytes per device under a choice vector."""
        return self.const + self.M[:, self.off + c].sum(axis=1)

    def feasible(self, c: np.ndarray) -> bool:
        return bool((self.rows(c) <= self.budget).all())

    def batch(self, C: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Q1 seconds, peak bytes) of every row of a [N, groups] array of choices."""
        idx = self.off[None, :] + C
        obj = self.unary[idx].sum(axis=1)
        P = np.zeros(len(C))
        for ei, (pi, ci, cost, p_of, q_of) in enumerate(self.edges):
            v = cost[p_of[C[:, pi]], q_of[C[:, ci]]]
            obj = obj + v
            P = P + v if ei in self.pre else P
        if self.pre:
            obj = obj - self._hidden(P, self.comp[idx].sum(axis=1))
        if self.M.shape[0]:
            peak = (self.const[:, None] + self.M[:, idx].sum(axis=2)).max(axis=0)
        else:
            peak = np.zeros(len(C))
        return obj, peak

    def move_deltas(self, c: np.ndarray, rows: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        """For group i and every strategy k': (Q1 change, memory rows after the move [rows, K])."""
        o, K, k0 = self.off[i], self.K[i], c[i]
        d = self.unary[o:o + K] - self.unary[o + k0]
        dP = np.zeros(K)
        for ei, role in self.incident[i]:
            pi, ci, cost, p_of, q_of = self.edges[ei]
            v = cost[p_of, q_of[c[ci]]] if role == 0 else cost[p_of[c[pi]], q_of]
            d = d + (v - v[k0])
            dP = dP + (v - v[k0]) if ei in self.pre else dP
        if self.pre:
            P, Cc = self._pc(c)
            dC = self.comp[o:o + K] - self.comp[o + k0]
            d = d - (self._hidden(P + dP, Cc + dC) - self._hidden(P, Cc))
        new_rows = rows[:, None] + self.M[:, o:o + K] - self.M[:, o + k0][:, None]
        return d, new_rows

    def move_delta(self, c: np.ndarray, i: int, k: int) -> float:
        """Q1 change of moving group i to strategy k."""
        o, k0 = self.off[i], c[i]
        d = self.unary[o + k] - self.unary[o + k0]
        dP = 0.0
        for ei, role in self.incident[i]:
            pi, ci, cost, p_of, q_of = self.edges[ei]
            if role == 0:
                q = q_of[c[ci]]
                v = cost[p_of[k], q] - cost[p_of[k0], q]
            else:
                p = p_of[c[pi]]
                v = cost[p, q_of[k]] - cost[p, q_of[k0]]
            d += v
            dP += v if ei in self.pre else 0.0
        if self.pre:
            P, Cc = self._pc(c)
            dC = self.comp[o + k] - self.comp[o + k0]
            d -= float(self._hidden(P + dP, Cc + dC) - self._hidden(P, Cc))
        return float(d)

    # --- starts -------------------------------------------------------------------------------
    def replicated_start(self) -> np.ndarray:
        """Every group at its all-replicated strategy (the first strategy where it has none)."""
        c = np.zeros(len(self.gids), dtype=np.int64)
        for i, gid in enumerate(self.gids):
            for k, st in enumerate(self.graph.groups[gid].strategies):
                if all(not a for sp in st.specs.values() for a in sp):
                    c[i] = k
                    break
        return c

    def cheapest_start(self) -> np.ndarray:
        """Every group at its cheapest strategy by node cost alone (edges ignored)."""
        return np.array([int(np.argmin(self.unary[o:o + K])) for o, K in zip(self.off, self.K)],
                        dtype=np.int64)

    def space_size(self) -> int:
        return math.prod(int(k) for k in self.K)


def build_instance(ir, target, mesh_axes: dict[str, int], *, axis_costs=None,
                   hardware: Hardware | None = None, options: Options | None = None,
                   hbm_bytes: float | None = None, hbm_reserve: float = 0.1,
                   corrections: dict[str, Any] | None = None) -> ShardingInstance:
    """The instance ``solve_sharding(ir, target, mesh_axes, ...)`` solves, with the same defaults
    (strategies, axis costs, HBM budget = chip HBM x (1 - hbm_reserve), corrections); its
    ``model.prob`` is the ILP itself."""
    _, _, graph, model = build_problem(ir, target, mesh_axes, ShardingProblem(
        axis_costs=axis_costs, hardware=hardware, options=options, hbm_bytes=hbm_bytes,
        hbm_reserve=hbm_reserve, corrections=corrections))
    return ShardingInstance(graph, model, corrections)


# ---------------------------------------------------------------------------------------------
# results

@dataclasses.dataclass
class HeuristicResult:
    search: str
    choice: dict[str, int] | None          # group id -> strategy index (None: nothing feasible)
    names: dict[str, str] | None           # group id -> strategy name
    certificate: Certificate
    predicted: dict[str, float] | None     # sharding_ilp.evaluate of the choice, seconds
    peak_bytes: float | None               # largest memory row of the choice, bytes per device
    trace: list[tuple[float, float]]       # (seconds since start, best Q1 seconds) at each improvement
    evaluated: int                         # choices (or moves) priced

    @property
    def objective(self) -> float | None:
        return self.certificate.objective

    def time_to_reach(self, target_s: float, rel: float = 1e-6) -> float | None:
        """Seconds until the best Q1 was within `rel` (relative) of `target_s`, None if never."""
        for t, v in self.trace:
            if v <= target_s * (1.0 + rel):
                return t
        return None

    def best_at(self, seconds: float) -> float | None:
        """The best Q1 seen within the first `seconds` of the search, None if nothing yet."""
        best = None
        for t, v in self.trace:
            if t <= seconds:
                best = v
        return best

    def to_json(self) -> dict[str, Any]:
        return {"search": self.search, "choice": self.choice, "names": self.names,
                "certificate": self.certificate.to_json(), "predicted": self.predicted,
                "peak_bytes": self.peak_bytes, "trace": [list(p) for p in self.trace],
                "evaluated": self.evaluated}


class _Best:
    """The best feasible choice so far and the trace of improvements."""

    def __init__(self, inst: ShardingInstance, t0: float):
        self.inst, self.t0 = inst, t0
        self.c: np.ndarray | None = None
        self.obj = math.inf
        self.trace: list[tuple[float, float]] = []

    def offer(self, c: np.ndarray, obj: float | None = None) -> bool:
        """Keep `c` if it is feasible (checked afresh) and cheaper than the best (exact Q1)."""
        if obj is not None and obj >= self.obj:
            return False
        if not self.inst.feasible(c):
            return False
        exact = self.inst.objective(c)
        if exact < self.obj:
            self.obj, self.c = exact, c.copy()
            self.trace.append((time.perf_counter() - self.t0, exact))
            return True
        return False


def _result(inst: ShardingInstance, name: str, best: _Best, t0: float, time_limit_s: float,
            seed: int | None, evaluated: int, detail: dict, proven: bool = False) -> HeuristicResult:
    elapsed = time.perf_counter() - t0
    if best.c is None:
        status = "INFEASIBLE" if proven else "UNKNOWN"
        cert = Certificate(solver=name, status=status, objective=None, bound=None, time_s=elapsed,
                           seed=seed, workers=1, time_limit_s=time_limit_s, detail=detail)
        return HeuristicResult(name, None, None, cert, None, None, best.trace, evaluated)
    choice = inst.to_choice(best.c)
    pred = evaluate(inst.graph, choice, inst.corrections)
    obj = pred["total_s"]
    cert = Certificate(solver=name, status="OPTIMAL" if proven else "FEASIBLE", objective=obj,
                       bound=obj if proven else None, time_s=elapsed, seed=seed, workers=1,
                       time_limit_s=time_limit_s, detail=detail)
    return HeuristicResult(name, choice, inst.names(best.c), cert, pred,
                           float(inst.rows(best.c).max()) if len(inst.const) else 0.0,
                           best.trace, evaluated)


# ---------------------------------------------------------------------------------------------
# searches

def exhaustive(inst: ShardingInstance, *, time_limit_s: float = 60.0, max_states: int = 2_000_000,
               batch: int = 4096) -> HeuristicResult:
    """Every choice (see module doc); OPTIMAL when the enumeration completes in the limit."""
    total = inst.space_size()
    if total > max_states:
        raise ShardingHeuristicError(
            f"the space has {total:.3g} choices, more than max_states={max_states}; use a search "
            f"(random_search, coordinate_descent, annealing) or the ILP")
    t0 = time.perf_counter()
    best = _Best(inst, t0)
    free = inst.free
    radix = inst.K[free]
    strides = np.concatenate([[1], np.cumprod(radix)[:-1]]).astype(np.int64)
    base = np.zeros(len(inst.gids), dtype=np.int64)
    done = 0
    while done < total:
        if time.perf_counter() - t0 > time_limit_s:
            break
        idx = np.arange(done, min(total, done + batch), dtype=np.int64)
        C = np.repeat(base[None, :], len(idx), axis=0)
        C[:, free] = (idx[:, None] // strides[None, :]) % radix[None, :]
        obj, peak = inst.batch(C)
        ok = np.nonzero(peak <= inst.budget)[0]
        if len(ok):
            j = ok[np.argmin(obj[ok])]
            best.offer(C[j], float(obj[j]) - 1e-12 * abs(float(obj[j])))
        done += len(idx)
    complete = done >= total
    return _result(inst, "exhaustive enumeration", best, t0, time_limit_s, None, done,
                   {"states": total, "enumerated": done, "complete": complete}, proven=complete)


def random_search(inst: ShardingInstance, *, time_limit_s: float = 10.0, seed: int = 0,
                  max_samples: int | None = None, batch: int = 256) -> HeuristicResult:
    """Uniformly random choices (each group's strategy drawn independently), in batches."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    best = _Best(inst, t0)
    n = 0
    feasible = 0
    while time.perf_counter() - t0 < time_limit_s and (max_samples is None or n < max_samples):
        m = batch if max_samples is None else min(batch, max_samples - n)
        C = (rng.random((m, len(inst.K))) * inst.K[None, :]).astype(np.int64)
        obj, peak = inst.batch(C)
        ok = np.nonzero(peak <= inst.budget)[0]
        feasible += len(ok)
        if len(ok):
            j = ok[np.argmin(obj[ok])]
            best.offer(C[j], float(obj[j]) - 1e-12 * abs(float(obj[j])))
        n += m
    return _result(inst, "random search", best, t0, time_limit_s, seed, n,
                   {"samples": n, "feasible_samples": feasible})


def _descend(inst: ShardingInstance, c: np.ndarray, deadline: float, best: _Best) -> tuple[np.ndarray, int, bool]:
    """Cyclic coordinate descent from c (in place); (c, moves priced, converged)."""
    rows = inst.rows(c)
    B = inst.budget
    priced = 0
    cost = inst.objective(c)
    while True:
        moved = False
        for i in inst.free:
            if time.perf_counter() > deadline:
                return c, priced, False
            d, new_rows = inst.move_deltas(c, rows, i)
            priced += len(d)
            over_now = float(np.clip(rows - B, 0, None).sum())
            over = np.clip(new_rows - B, 0, None).sum(axis=0)
            if over_now > 0:
                # minimise the overflow first, then Q1
                cand = np.lexsort((d, over))[0]
                if over[cand] < over_now or (over[cand] == over_now and d[cand] < -1e-12 * abs(cost) - 1e-18):
                    k = int(cand)
                else:
                    continue
            else:
                dd = np.where(over <= 0, d, np.inf)
                k = int(np.argmin(dd))
                if not dd[k] < -1e-12 * abs(cost) - 1e-18:
                    continue
            rows = new_rows[:, k].copy()
            cost += float(d[k])
            c[i] = k
            moved = True
        best.offer(c, cost)
        if not moved:
            break
    return c, priced, True


def coordinate_descent(inst: ShardingInstance, *, time_limit_s: float = 10.0, seed: int = 0,
                       max_restarts: int | None = None) -> HeuristicResult:
    """Cyclic coordinate descent from all-replicated, cheapest-per-group, then random starts."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    rng = np.random.default_rng(seed)
    best = _Best(inst, t0)
    priced = 0
    starts = 0
    converged = 0
    while time.perf_counter() < deadline and (max_restarts is None or starts <= max_restarts):
        if starts == 0:
            c = inst.replicated_start()
        elif starts == 1:
            c = inst.cheapest_start()
        else:
            c = (rng.random(len(inst.K)) * inst.K).astype(np.int64)
        best.offer(c)
        c, p, conv = _descend(inst, c, deadline, best)
        priced += p
        starts += 1
        converged += int(conv)
    return _result(inst, "coordinate descent", best, t0, time_limit_s, seed, priced,
                   {"starts": starts, "converged_descents": converged, "moves_priced": priced})


def annealing(inst: ShardingInstance, *, time_limit_s: float = 10.0, seed: int = 0,
              moves: str = "heat-bath", max_steps: int | None = None, t_start: float | None = None,
              t_end_ratio: float = 1e-6, resync_every: int = 20000) -> HeuristicResult:
    """Simulated annealing over single-group moves (see module doc). moves="heat-bath": the
    group's new strategy is drawn from the Boltzmann distribution exp(-delta / T) over all its
    strategies that keep the memory rows (the current one included); moves="metropolis": one new
    strategy drawn uniformly, accepted with probability min(1, exp(-delta / T)) when it fits."""
    if moves not in ("heat-bath", "metropolis"):
        raise ShardingHeuristicError(f"unknown moves {moves!r}; use 'heat-bath' or 'metropolis'")
    name = f"simulated annealing ({moves})"
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    rng = np.random.default_rng(seed)
    best = _Best(inst, t0)
    B = inst.budget
    c = inst.replicated_start()
    if not inst.feasible(c):
        c = inst.cheapest_start()
    if not inst.feasible(c):   # repair: coordinate descent minimises the overflow first
        c, _, _ = _descend(inst, c, deadline, best)
    feasible_start = inst.feasible(c)
    best.offer(c)
    free = inst.free
    if len(free) == 0 or not feasible_start:
        return _result(inst, name, best, t0, time_limit_s, seed, 0,
                       {"steps": 0, "note": "no free group" if len(free) == 0 else "no feasible start"})
    rows = inst.rows(c)
    cost = inst.objective(c)
    if t_start is None:   # mean uphill delta of sampled moves from the start
        ups = []
        for _ in range(200):
            i = int(free[rng.integers(len(free))])
            k = int(rng.integers(inst.K[i]))
            d = inst.move_delta(c, i, k)
            if d > 0:
                ups.append(d)
        t_start = float(np.mean(ups)) if ups else max(abs(cost), 1e-9) * 1e-3
    t_end = t_start * t_end_ratio
    log_ratio = math.log(t_end / t_start)
    Mt, off, K = inst.Mt, inst.off, inst.K
    steps = accepted = 0
    nfree = len(free)
    chunk = 64 if moves == "heat-bath" else 256
    anneal_end = t0 + 0.98 * time_limit_s     # the rest is for the final descent
    while True:
        if max_steps is not None and steps >= max_steps:
            break
        now = time.perf_counter()
        if now > anneal_end:
            break
        frac = (steps / max_steps) if max_steps is not None else (now - t0) / (anneal_end - t0)
        T = t_start * math.exp(log_ratio * min(frac, 1.0))
        gi = rng.integers(nfree, size=chunk)
        ur = rng.random(chunk)
        ua = rng.random(chunk)
        for j in range(chunk):
            if max_steps is not None and steps >= max_steps:
                break
            steps += 1
            i = int(free[gi[j]])
            k0 = int(c[i])
            if moves == "heat-bath":
                d_all, rows_all = inst.move_deltas(c, rows, i)
                dd = np.where((rows_all <= B).all(axis=0), d_all, np.inf)
                if not math.isfinite(dd.min()):
                    continue
                w = np.cumsum(np.exp(-(dd - dd.min()) / T))
                k = min(int(np.searchsorted(w, ur[j] * w[-1], side="right")), len(w) - 1)
                if k == k0:
                    continue
                d = float(d_all[k])
                new_rows = rows_all[:, k].copy()
            else:
                k = int(ur[j] * (K[i] - 1))
                if k >= k0:
                    k += 1      # a strategy other than the current one, uniformly
                d = inst.move_delta(c, i, k)
                if d > 0 and ua[j] >= math.exp(-d / T):
                    continue
                new_rows = rows + (Mt[off[i] + k] - Mt[off[i] + k0])
                if new_rows.max() > B:
                    continue
            rows = new_rows
            c[i] = k
            cost += d
            accepted += 1
            if accepted % resync_every == 0:   # drop the drift of the running sums
                rows = inst.rows(c)
                cost = inst.objective(c)
            if cost < best.obj * (1.0 - 1e-13):
                best.offer(c, cost)
    polish = best.c.copy()
    _, priced, _ = _descend(inst, polish, deadline, best)
    return _result(inst, name, best, t0, time_limit_s, seed, steps + priced,
                   {"moves": moves, "steps": steps, "accepted": accepted, "t_start_s": t_start,
                    "t_end_s": t_end, "polish_moves_priced": priced})


def metropolis_annealing(inst: ShardingInstance, **kw) -> HeuristicResult:
    """``annealing`` with Metropolis moves (one uniformly drawn strategy per step)."""
    return annealing(inst, moves="metropolis", **kw)


SEARCHES: dict[str, Callable[..., HeuristicResult]] = {
    "random": random_search, "descent": coordinate_descent, "annealing": annealing,
    "metropolis": metropolis_annealing}
