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


def test_a_networks_key_is_not_its_ring_cache(v5e4):
    """A ring asked for fills the network's private cache; a placement's key stays the same
    (it differed between runs by the order rings were asked for)."""
    from aoizora.extract.network import Network
    from aoizora.planning.solve_memo import _network

    net = Network.from_target(v5e4)
    before = _network(net)
    net.ring_through([0, 1, 2, 3])
    assert net._ring_cache and _network(net) == before


def test_a_refinement_comes_back_and_a_changed_seed_is_refined_again(tmp_path):
    """A seed's refinement (``seed_refinement.refine_seed``) whose ILP no clock decided comes
    back without building its strategy graph; another layout is refined again; an answer the
    clock decided is never kept."""
    import jax
    import jax.numpy as jnp

    from aoizora.extract.frontends.jax.ir_builder import build_ir
    from aoizora.extract.targets import get_target
    from aoizora.models import registry as R
    from aoizora.models.experts import expert_layouts
    from aoizora.planning.seed_refinement import refine_seed

    tgt = get_target("v5e-8")
    m = R.get_model("wan2.1-small")
    ex = next(e for e in expert_layouts(m, m.workloads[0], tgt, dtype=jnp.float32)
              if e.name == "cfg2_context")
    ir, n = build_ir(ex.fn, *ex.args), len(jax.tree_util.tree_leaves(ex.args[0]))
    calls = []
    memo = SolveMemo(EvidenceCache(tmp_path))
    refine = memo.refinement(_counting(refine_seed, calls))
    first = refine(ir, tgt, ex.layout, range(n), time_limit_s=30.0)
    again = refine(ir, tgt, ex.layout, range(n), time_limit_s=5.0)
    assert len(calls) == 1 and memo.hits == 1 and memo.kept == 1
    assert again.layout == first.layout and again.kept == first.kept
    assert again.solution.certificate.detail["from_cache"]
    refine(ir, tgt, dataclasses.replace(ex.layout, name="other"), range(n))
    assert len(calls) == 2

    def clocked(*a, solve, **k):       # its ILP's answer decided by the clock
        def stopped(*sa, **sk):
            res = solve(*sa, **sk)
            res.best.certificate = dataclasses.replace(res.best.certificate, status="FEASIBLE")
            return res
        return refine_seed(*a, solve=stopped, **k)

    memo2 = SolveMemo(EvidenceCache(tmp_path / "clocked"))
    refine2 = memo2.refinement(_counting(clocked, calls))
    refine2(ir, tgt, ex.layout, range(n))
    refine2(ir, tgt, ex.layout, range(n))
    assert len(calls) == 4 and memo2.kept == 0 and memo2.hits == 0
