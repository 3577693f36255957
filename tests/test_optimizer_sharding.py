"""ZeRO as points of one sharding ILP (formulation/sharding_ilp.py, "Optimizer state"): every leaf
of a training step's state -- the fp32 master weight, AdamW's mu and nu -- chooses its spec, so
the ILP can mix data parallel (all replicated), ZeRO-1 (moments split, master replicated) and
ZeRO-3 (all split) leaf by leaf; a smaller HBM budget moves leaves to ZeRO-3."""

import collections
import re
import warnings

import jax
import pytest

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.models import training
from aoizora.models.workloads import Workload
from aoizora.solvers.sharding import ShardingProblem, solve_sharding

MESH = {"data": 4}                       # v5p-8: 4 chips, the batch of 4 over data
MiB = 2 ** 20


@pytest.fixture(scope="module")
def program():
    cfg = training.TrainConfig()
    step = training.train_step("wan2.1-small", cfg)
    args = training.abstract_train_inputs("wan2.1-small", Workload("t", "128p", 128, 128, 9), 4, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # the random ops the IR keeps replicated
        ir = build_ir(step, *args)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args[0])[0]]
    return ir, paths


def _points(ir, paths, hbm_bytes):
    """Counter of (master split, mu split, nu split) over the parameters, in the ILP's best."""
    res = solve_sharding(ir, get_target("v5p-8"), MESH,
                         ShardingProblem(hbm_bytes=hbm_bytes, hbm_reserve=0.0),
                         time_limit_s=30, seed=0)
    assert res.certificate.status == "OPTIMAL"
    per: dict[str, dict[str, bool]] = collections.defaultdict(dict)
    for path, spec in zip(paths, res.best.layout.in_specs):
        m = re.match(r"^(?:\['opt_state'\]\[0\]\.(mu|nu)|\['params'\])(.+)$", path)
        if m is None:
            continue                          # the step count
        split = spec is not None and any(a not in (None, ()) for a in spec)
        per[m.group(2)][m.group(1) or "master"] = split
    return collections.Counter((d["master"], d["mu"], d["nu"]) for d in per.values())


def test_each_leaf_chooses_its_zero_stage_and_less_hbm_means_more_zero3(program):
    """Without an HBM limit nothing pays for splitting the state (data parallel everywhere: the
    optimizer update is fused and cheap in Q1); under a budget the ILP mixes data parallel,
    ZeRO-1 and ZeRO-3 leaf by leaf, and a tighter one moves leaves to ZeRO-3."""
    ir, paths = program
    free = _points(ir, paths, None)
    dp, zero1, zero3 = (False, False, False), (False, True, True), (True, True, True)
    mid = _points(ir, paths, 60 * MiB)
    assert mid[dp] and mid[zero1] and mid[zero3], mid
    assert free[dp] >= mid[dp] and free[zero3] < mid[zero3], (free, mid)
    # a master split never leaves its moments whole (they are updated where the master is)
    assert not any(m and not (mu and nu) for c in (free, mid) for m, mu, nu in c), (free, mid)
    tight = _points(ir, paths, 30 * MiB)   # the smallest peak over all layouts is 28.3 MiB
    assert tight[zero3] > free[zero3] and sum(tight.values()) == sum(free.values())
