"""Solver answers kept beside the evidence (aoizora.planning.solve_memo): an answer no clock
decided comes back for the same inputs, whatever the time limit; any changed input is solved
again; an answer a clock decided is never kept; placements are kept with their candidates."""

import dataclasses

from aoizora.extract.evidence_cache import EvidenceCache
from aoizora.planning.solve_memo import SolveMemo
from aoizora.solvers.sharding import ShardingProblem, solve_sharding

MESH = {"x": 2, "y": 2}


def _counting(fn, calls):
    def solve(*a, **k):
        calls.append(a[2] if len(a) > 2 else None)
        return fn(*a, **k)
    return solve


def test_a_proven_answer_comes_back_and_a_changed_input_is_solved(mlp_ir, v5e4, tmp_path):
    calls = []
    memo = SolveMemo(EvidenceCache(tmp_path))
    solve = memo.sharding(_counting(solve_sharding, calls))
    first = solve(mlp_ir, v5e4, MESH, ShardingProblem(), time_limit_s=30.0, k_best=2)
    assert first.certificate.status == "OPTIMAL" and memo.kept == 1
    again = solve(mlp_ir, v5e4, MESH, ShardingProblem(), time_limit_s=5.0, k_best=2)
    assert len(calls) == 1 and memo.hits == 1          # the limit is not part of the key
    assert again.best.layout == first.best.layout and again.best.choice == first.best.choice
    assert [a.layout for a in again.alternatives] == [a.layout for a in first.alternatives]
    assert again.certificate.detail["from_cache"] and not first.certificate.detail.get("from_cache")
    # a new process: the same directory gives the same answer back
    other = SolveMemo(EvidenceCache(tmp_path)).sharding(_counting(solve_sharding, calls))
    assert other(mlp_ir, v5e4, MESH, ShardingProblem(), k_best=2).best.layout == first.best.layout
    assert len(calls) == 1
    # every input is part of the key
    solve(mlp_ir, v5e4, {"x": 4}, ShardingProblem(), k_best=2)
    solve(mlp_ir, v5e4, MESH, ShardingProblem(hbm_bytes=150e6), k_best=2)
    solve(mlp_ir, v5e4, MESH, ShardingProblem(), k_best=1)
    solve(mlp_ir, v5e4, MESH, ShardingProblem(corrections={"in:t0": 1e-4}), k_best=2)
    assert len(calls) == 5


def test_an_answer_a_clock_decided_is_not_kept(mlp_ir, v5e4, tmp_path):
    def stopped(*a, **k):
        res = solve_sharding(*a, **k)
        res.best.certificate = dataclasses.replace(res.best.certificate, status="FEASIBLE")
        return res

    calls = []
    memo = SolveMemo(EvidenceCache(tmp_path))
    solve = memo.sharding(_counting(stopped, calls))
    solve(mlp_ir, v5e4, MESH, ShardingProblem(), time_limit_s=30.0)
    solve(mlp_ir, v5e4, MESH, ShardingProblem(), time_limit_s=30.0)
    assert len(calls) == 2 and memo.kept == 0 and memo.hits == 0
