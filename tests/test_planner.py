"""The planner end to end on a small DiT: plan for v5e:2x4 with the real TPU compiler, apply the
plan on 8 CPU devices, and get the unsharded numbers."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import aoizora
from aoizora.models import registry as R
from aoizora.planning.candidate_pricing import levels_proven
from aoizora.planning.compile_queue import CompileQueue
from aoizora.planning.seams import Seams
from aoizora.solvers.placement_heuristics import annealing as placement_annealing
from aoizora.solvers.sharding import solve_sharding
from conftest import run_cli as _cli
from aoizora.extract.targets import get_target

pytestmark = pytest.mark.tpu_compiler

MESHES = [{"x": 2, "y": 4}]  # one logical mesh keeps the test short; the CLI tries them all


@pytest.fixture(scope="module")
def small():
    m = R.get_model("wan2.1-small")
    wl = m.workloads[0]
    fn = R.denoise_step(m, pad_multiple=128)
    args = R.abstract_inputs(m, wl, dtype=jnp.float32)
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, seed=0, top_k=1,
                     meshes=MESHES, max_iterations=2)
    return m, wl, fn, args, p


def test_plan_has_mesh_order_prediction_and_certificates(small):
    _, _, _, _, p = small
    assert p.mesh == {"x": 2, "y": 4}
    assert sorted(p.device_order) == list(range(8))
    assert len(set(p.device_coords)) == 8
    pr = p.predicted
    assert pr["kind"] == "predicted" and pr["step_s"] > 0
    assert pr["step_s"] == pytest.approx(pr["compute_s"] + pr["communication_s"] + pr["latency_s"])
    assert p.compiler["jax"] == jax.__version__ and p.compiler["libtpu"]
    # never worse than JAX's default device order under the same model
    assert pr["step_s"] <= pr["default_order_step_s"] + 1e-12
    for name in ("sharding", "placement"):
        c = p.certificates[name]
        assert c.status in ("OPTIMAL", "FEASIBLE") and c.objective is not None
        assert c.bound is None or c.bound <= c.objective + 1e-9
    assert p.fits_hbm is True
    assert p.iterations and p.iterations[0]["candidates"]


def test_compiled_attention_feeds_back_into_the_ilp(small):
    """Iteration 1's compiled attention time per node and kv mode is fitted against Q1 and the
    next ILPs scale their attention compute by it (the plan records the fit and the change)."""
    _, _, _, _, p = small
    fb = p.iterations[0]["feedback"]["attention"]
    compiled = p.iterations[0]["candidates"][0]
    assert "*" in fb and len(fb) >= 3                      # pooled + the small DiT's 2 attentions
    for key, by_mode in fb.items():
        for mu, f in by_mode.items():
            assert mu in ("gather", "ring") and f["samples"] >= 1
            assert f["scale"] == pytest.approx(f["compiled_s"] / f["q1_compute_s"]) and f["scale"] > 0
    assert any(line.startswith("attention ") and "scales its compute by" in line
               for line in p.iterations[0]["changes"])
    assert compiled["layout"] == "ilp"


def test_plan_applied_on_cpu_matches_unsharded(small, tmp_path):
    m, wl, fn, args, p = small
    path = tmp_path / "plan.json"
    p.save(str(path))
    q = aoizora.load_plan(str(path))
    inputs = (R.init_params(m, jax.random.key(1)),
              *R.random_inputs(m, wl, jax.random.key(0), dtype=jnp.float32))
    want = jax.jit(fn)(*inputs)
    mesh = q.make_mesh(jax.devices())
    got = q.jit(fn, mesh)(*inputs)
    err = float(jnp.max(jnp.abs(got - want)))
    assert np.allclose(np.asarray(got), np.asarray(want), atol=2e-4, rtol=2e-4), f"max abs err {err}"


def test_plan_refuses_another_program(small):
    _, _, fn, args, p = small
    def other(*a):
        return 2.0 * fn(*a)

    m = R.get_model("wan2.1-small")
    inputs = (R.init_params(m, jax.random.key(1)),
              *R.random_inputs(m, small[1], jax.random.key(1), dtype=jnp.float32))
    with pytest.raises(aoizora.PlanError, match="another program"):
        p.jit(other, p.make_mesh(jax.devices()))(*inputs)


def test_same_seed_same_plan(small):
    _, _, fn, args, p = small
    again = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, seed=0, top_k=1,
                         meshes=MESHES, max_iterations=2)
    assert again.layout.to_json() == p.layout.to_json()
    assert again.device_order == p.device_order
    # each plan says where a time limit bound (aoizora.planning.time_limits): on this small model the ILPs
    # and CP-SAT prove their answers and every compile fits; the final annealing runs exactly
    # when the placement is not proven on every level, and then makes the swaps its budget buys
    # before the clock would cut it: no limit bound, the plan is repeatable
    for q in (p, again):
        assert q.time_limited == []
        cert = q.certificates["placement"]
        runs = cert.detail.get("final_annealing")
        if levels_proven(cert):
            assert runs is None
        else:
            assert [r["run"].split(" from")[0] for r in runs] == ["annealing"] * 2
            assert all(r["swaps"] == r["swaps_asked"] > 0 and r["cut"] is None for r in runs)
        assert any(n.startswith("no time limit bound") for n in q.notes)



def test_final_annealing_runs_uncut_when_the_placement_is_not_proven(small):
    """Without Q1's prefetch credit the small model's plan has a placement CP-SAT does not prove
    on every level (Q2's latency term moves it): the final annealing runs twice and makes the
    swaps its budget buys before the clock would cut it."""
    import dataclasses

    from aoizora.formulation.strategies import Options
    from aoizora.solvers.sharding import solve_sharding

    def no_prefetch(ir, target, mesh, problem, **kw):
        opts = dataclasses.replace(problem.options or Options(), prefetch_room=0.0)
        return solve_sharding(ir, target, mesh, dataclasses.replace(problem, options=opts), **kw)

    _, _, fn, args, _ = small
    q = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, seed=0, top_k=1,
                     meshes=MESHES, max_iterations=2, seams=Seams(solve_sharding=no_prefetch))
    cert = q.certificates["placement"]
    assert not levels_proven(cert) and q.time_limited == []
    runs = cert.detail["final_annealing"]
    assert [r["run"].split(" from")[0] for r in runs] == ["annealing"] * 2
    assert all(r["swaps"] == r["swaps_asked"] > 0 and r["cut"] is None for r in runs)

def test_budget_too_small_for_one_compile(small):
    _, _, fn, args, _ = small
    # 0.02 s: gone before the first compile can start (tracing alone takes longer); with more,
    # a fast ILP may start a compile before the deadline, and that plan comes back over budget
    with pytest.raises(aoizora.BudgetError, match="raise the budget"):
        aoizora.plan(fn, *args, target="v5e-8", time_budget_s=0.02, meshes=MESHES)


@pytest.mark.parametrize("kw,what", [({"top_k": 0}, "top_k=0"), ({"max_iterations": 0},
                                                                     "max_iterations=0")])
def test_nothing_to_compile_per_iteration_is_refused(small, kw, what):
    _, _, fn, args, _ = small
    with pytest.raises(aoizora.PlanningError, match=what):
        aoizora.plan(fn, *args, target="v5e-8", meshes=MESHES, **kw)


@pytest.mark.parametrize("budget", [0, -1.0, float("nan"), float("inf")])
def test_a_budget_that_is_not_a_positive_finite_number_is_refused(small, budget):
    _, _, fn, args, _ = small
    with pytest.raises(aoizora.BudgetError, match="positive, finite number of seconds"):
        aoizora.plan(fn, *args, target="v5e-8", time_budget_s=budget, meshes=MESHES)


@pytest.mark.parametrize("kw,what", [
    ({"seed": 1.5}, "seed=1.5: give a whole number"),
    ({"workers": 0}, "workers=0"),
    ({"placement_time_s": float("nan")}, "placement_time_s=nan"),
    ({"ilp_time_s": -1}, "ilp_time_s=-1"),
])
def test_solver_settings_that_cannot_work_are_refused(small, kw, what):
    _, _, fn, args, _ = small
    with pytest.raises(aoizora.PlanningError, match=what):
        aoizora.plan(fn, *args, target="v5e-8", meshes=MESHES, **kw)


def test_an_argument_without_shape_and_dtype_is_named():
    def f(x, n):
        return x * n

    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    with pytest.raises(aoizora.PlanningError, match=r"argument 1\['n'\] is of type int.*"
                                                    "functools.partial"):
        aoizora.plan(f, x, {"n": 3}, target="v5e-8", meshes=MESHES)


def test_cli_top_k_zero_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "aoizora", "plan", "--model", "wan2.1-small",
                        "--resolution", "128p", "--frames", "9", "--top-k", "0", "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--top-k" in r.stderr


def test_a_first_compile_past_the_budget_still_returns_its_plan(small, jumping_clock):
    """A compile cannot be interrupted: when the first one ends past the budget, its priced
    candidate comes back, and the plan says by how much the budget was exceeded."""
    import aoizora.planning.candidate_pricing as pricing

    _, _, fn, args, _ = small
    budget = 8.0
    real = pricing.compile_layout

    def slow_compile(*a, **kw):
        ev = real(*a, **kw)
        jumping_clock.sleep(budget)  # now surely past the deadline (at once: no real wait)
        return ev

    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=budget, meshes=[{"x": 8}],
                     max_iterations=1, verify=False, seams=Seams(compile_layout=slow_compile))
    assert p.planning_time_s > budget
    assert any("over budget" in n for n in p.notes)
    assert p.predicted["step_s"] > 0




@pytest.mark.parametrize("argv,match", [
    (["plan", "--target", "v9z-3"], "unknown target"),
    (["plan", "--frames", "17"], "no workload"),
    (["plan", "--model", "sd3"], "sd3"),
    (["show", "/nonexistent.json"], "no plan file"),
    (["plan", "--time-budget", "nan"], "--time-budget: 'nan': give a finite number above 0"),
    (["plan", "--time-budget", "-1"], "give a finite number above 0"),
    (["compare", "--time-budget", "inf"], "give a finite number above 0"),
    (["plan", "--top-k", "1.5"], "'1.5' is not a whole number"),
    (["plan", "--frames", "x"], "--frames"),
    (["check", "plan.json", "--tolerance", "-0.1"], "give a finite number of at least 0"),
    (["check", "plan.json", "--max-step-ms", "0"], "give a finite number above 0"),
    (["plan", "--no-such-flag"], "unrecognized arguments"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, match):
    r = _cli(*argv)
    assert r.returncode == 2, r.stderr
    assert match in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_corrupt_plan_file(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text('{"format": "aoizora-plan/1", "key": ')
    r = _cli("show", str(bad))
    assert r.returncode == 2 and f"{bad}: not JSON" in r.stderr


def test_a_seed_layout_with_its_own_program_is_priced_and_recorded(small):
    """Seeds only (no ILP mesh): the expert layout is compiled with its own padding, placed by
    CP-SAT, and the plan says it was a seed and which program variant it is for."""
    from aoizora.models.experts import expert_layouts
    from aoizora.planner import Seed

    m, wl, fn, args, _ = small
    ex = next(e for e in expert_layouts(m, wl, get_target("v5e-8"), dtype=jnp.float32) if e.name == "context")
    seed = Seed(ex.layout, ex.fn, tuple(ex.args), {"pad_multiple": ex.pad_multiple})
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, meshes=[], max_iterations=1,
                     seed_layouts=[seed])
    assert p.layout.name == "expert:context"
    assert p.program == {"pad_multiple": ex.pad_multiple}
    sh = p.certificates["sharding"]
    assert sh.status == "FEASIBLE" and sh.detail["seed"] and p.status == "NOT PROVEN"
    assert p.certificates["placement"].status in ("OPTIMAL", "FEASIBLE")
    # the plan's key is the seed program's: it applies to that program, not to the planned one
    from aoizora.plans import program_key

    p.check_key(program_key(ex.fn, tuple(ex.args), "v5e:2x4"))
    if ex.pad_multiple != 128:
        with pytest.raises(aoizora.PlanError):
            p.check_key(program_key(fn, args, "v5e:2x4"))


def test_the_first_seed_compiles_alone_then_the_ilps_solve(small):
    """The first seed compiles from the start with the cores to itself; the first iteration's
    ILPs start once it is done (the budget then known to hold the ILP's best); the candidates
    are priced in the order first seed (its refinement, none here), then the ILP's best."""
    from aoizora.models.experts import expert_layouts

    m, wl, fn, args, _ = small
    ex = next(e for e in expert_layouts(m, wl, get_target("v5e-8"), dtype=jnp.float32) if e.name == "context")
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, top_k=1, meshes=MESHES,
                     max_iterations=1, verify=False, seed_layouts=[ex.layout])
    it = p.iterations[0]
    sd, ilp = it["candidates"]
    assert ilp["layout"] == "ilp" and sd["layout"] == "expert:context"
    # each of the three is rounded to 1 ms, and the ILPs may start within a millisecond
    assert sd["compile_started_s"] + sd["compile_s"] <= it["ilps_started_s"] + 0.002
    assert it["ilps_started_s"] <= it["ilps_done_s"] <= ilp["compile_started_s"]
    assert sd["q2_step_s"] > 0 and ilp["q2_step_s"] > 0
    assert not any("ILPs skipped" in c for c in it["changes"])


def test_the_ilps_are_skipped_when_the_budget_cannot_compile_their_best(small):
    """When, after the first seed's compile, the budget holds fewer compiles than the ILP's best
    needs (its place in line and itself), the first iteration solves no ILP, prices the seed, and
    the plan lists the skip among its time limits."""
    from aoizora.models.experts import expert_layouts

    class NoRoomLeft(CompileQueue):
        def compiles_left(self, slower=1.0):
            return 0 if self.done else super().compiles_left(slower)

    m, wl, fn, args, _ = small
    ex = next(e for e in expert_layouts(m, wl, get_target("v5e-8"), dtype=jnp.float32) if e.name == "context")
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, top_k=1, meshes=MESHES,
                     max_iterations=2, verify=False, seed_layouts=[ex.layout],
                     seams=Seams(compile_queue=NoRoomLeft))
    it = p.iterations[0]
    assert [c["layout"] for c in it["candidates"]] == ["expert:context"]
    assert p.layout.name == "expert:context" and p.predicted["step_s"] > 0
    assert any(c.startswith("sharding ILPs skipped: the time budget holds 0 more compile(s)")
               for c in it["changes"])
    assert any(w.startswith("sharding ILPs of iteration 1: skipped") for w in p.time_limited)


def test_a_skipped_compile_does_not_drop_the_seeds_compiled_before_it(small):
    """When the budget skips the ILP's compiles, the seeds that compiled beside the ILPs are
    still priced and the plan comes from them."""
    from concurrent.futures import Future

    from aoizora.planning.compile_queue import Skipped
    from aoizora.models.experts import expert_layouts

    class NoRoomForTheILP(CompileQueue):
        def submit(self, compile_fn, priority=0.0, **kw):
            if compile_fn.layout.name.startswith("ilp"):
                f = Future()
                f.set_result(Skipped("time budget: 1.0 s left, a compile takes about 9.0 s"))
                return f
            return super().submit(compile_fn, priority, **kw)

    m, wl, fn, args, _ = small
    ex = next(e for e in expert_layouts(m, wl, get_target("v5e-8"), dtype=jnp.float32) if e.name == "context")
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, top_k=1, meshes=MESHES,
                     max_iterations=2, verify=False, seed_layouts=[ex.layout],
                     seams=Seams(compile_queue=NoRoomForTheILP))
    assert p.layout.name == "expert:context" and p.predicted["step_s"] > 0
    assert len(p.iterations) == 1 and [c["layout"] for c in p.iterations[0]["candidates"]] == [
        "expert:context"]
    assert any("time budget: 1.0 s left" in n for n in p.notes)


def test_an_unproven_placement_is_annealed_and_never_worse(small):
    """When CP-SAT does not prove its answer (here: forced to return JAX's default order,
    FEASIBLE), the time left after the last compile anneals it twice (from a heuristic's starts
    for CP-SAT's own time limit, then from CP-SAT's answer) and the least Q2 step is kept; the
    certificate keeps CP-SAT's bound and says where the placement came from."""
    from aoizora.formulation.latency import predict_step
    from aoizora.solvers.certificate import Certificate
    from aoizora.solvers.placement import PlacementResult

    _, _, fn, args, _ = small
    seen = {}

    def stalled(ev, network, time_limit_s, seed, workers, hint):
        q2 = predict_step(ev, hint, network)
        seen["q2"] = q2.step_s
        cert = Certificate("CP-SAT (stalled)", "FEASIBLE", q2.communication_s, 0.0, 0.1,
                           time_limit_s=1.5)
        return PlacementResult(list(hint), cert, q2, [])

    from aoizora.extract.network import default_device_order
    from aoizora.extract.targets import get_target

    seen_starts, limits = [], []
    real_annealing = placement_annealing

    def annealing(ev, network, time_limit_s, seed, starts=None, **kw):
        seen_starts.append([[int(v) for v in st] for st in starts])
        limits.append(time_limit_s)
        return real_annealing(ev, network, time_limit_s=time_limit_s, seed=seed, starts=starts,
                              **kw)

    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, meshes=[{"x": 2, "y": 4}],
                     max_iterations=1, verify=False, placement_time_s=2.0,
                     seams=Seams(solve_placement=stalled, annealing=annealing))
    c = p.certificates["placement"]
    choice = c.detail["step_choice"]
    assert p.predicted["step_s"] <= seen["q2"] + 1e-12
    assert choice["start"] in ("certified", "default order") or choice["start"].startswith(
        "annealing from")
    # two runs: from a heuristic's starts (the default order first, then the axis-order
    # placements) for CP-SAT's time limit, as a heuristic with the same budget; then from the
    # answer kept so far, for placement_time_s
    default = default_device_order(get_target("v5e-8"), {"x": 2, "y": 4})
    assert len(seen_starts) == 2 and len(seen_starts[1]) == 1      # the kept answer alone
    assert seen_starts[0][0] == default and len(seen_starts[0]) > 1
    assert limits == [1.5, 2.0]
    assert c.bound == 0.0 and c.status == "FEASIBLE"
    assert c.objective == pytest.approx(p.predicted["communication_s"])
    # the plan says that the clock decided its placement: the unproven CP-SAT; not the
    # annealing, which made the swaps its budgets buy
    assert any(w.startswith("placement of mesh x2xy4") and "not proven on every level" in w
               for w in p.time_limited)
    assert not any(w.startswith("final annealing") for w in p.time_limited)
    from aoizora.solvers.placement_heuristics import evaluation_budget

    runs = c.detail["final_annealing"]
    assert [(r["budget_s"], r["swaps_asked"], r["swaps"]) for r in runs] == [
        (b, evaluation_budget(b), evaluation_budget(b)) for b in (1.5, 2.0)]
    assert any(n.startswith(f"time limits bound in {len(p.time_limited)} place(s)")
               for n in p.notes)


@pytest.mark.parametrize("levels,anneals", [
    ({"comm": "OPTIMAL", "link_bytes": "skipped: no time left"}, True),
    ({"comm": "OPTIMAL", "link_bytes": "OPTIMAL", "hops": "OPTIMAL"}, False)])
def test_a_placement_proven_on_link_load_alone_is_still_annealed(small, levels, anneals):
    """A proof of the link-load level leaves the placements tying on it unranked by Q2's
    per-hop latency: the time left anneals them unless every level (link load, link bytes,
    hops) is proven."""
    from aoizora.formulation.latency import predict_step
    from aoizora.solvers.certificate import Certificate
    from aoizora.solvers.placement import PlacementResult

    _, _, fn, args, _ = small

    seen = {}

    def proven(ev, network, time_limit_s, seed, workers, hint):
        q2 = predict_step(ev, hint, network)
        seen["q2"] = q2.step_s
        cert = Certificate("CP-SAT", "OPTIMAL", q2.communication_s, q2.communication_s,
                           0.1, detail={"levels": {k: {"status": v} for k, v in levels.items()}})
        return PlacementResult(list(hint), cert, q2, [])

    calls = []
    real_annealing = placement_annealing

    def annealing(*a, **kw):
        calls.append(1)
        return real_annealing(*a, **kw)

    queues = []

    class Queue(CompileQueue):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            queues.append((self, self.reserve_s))

    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, meshes=[{"x": 2, "y": 4}],
                     max_iterations=1, verify=False, placement_time_s=1.0,
                     seams=Seams(solve_placement=proven, annealing=annealing, compile_queue=Queue))
    assert len(calls) == (2 if anneals else 0)
    assert p.predicted["step_s"] <= seen["q2"] + 1e-12
    assert ("final_annealing" in p.certificates["placement"].detail) == anneals
    assert not any(w.startswith("final annealing") for w in p.time_limited)
    assert (p.time_limited == []) == (not anneals)    # the link-bytes level skipped: not proven
    # compiles do not start into time kept for that annealing, none kept once it is not needed
    (q, first), = queues
    # the reserve holds the last candidate's placement and the heuristic's annealing
    assert first == 2.0 and q.reserve_s == (2.0 if anneals else 0.0)


def test_a_plan_warm_starts_the_next_from_its_calibration(small, tmp_path):
    """The plan records what its loop learned (collective costs of the measured mesh, attention
    scales); the next plan's first ILP starts from exactly that, and says so."""
    from aoizora.plans import load_plan

    _, _, fn, args, p = small
    cal = p.calibration
    assert cal is not None and cal.target == "v5e:2x4"
    costs = cal.costs_for(MESHES[0])
    assert costs is not None and costs.beta_by_kind            # measured per axis and kind
    assert cal.attention_scale["*"] and cal.source["compiled"] >= 1
    p.save(str(tmp_path / "p.json"))
    again = load_plan(str(tmp_path / "p.json")).calibration
    assert again == cal

    seen = []
    real = solve_sharding

    def spy(ir, target, mesh, problem, **kw):
        seen.append((problem.axis_costs, problem.attention_scale))
        return real(ir, target, mesh, problem, **kw)

    warm = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=120, top_k=1, meshes=MESHES,
                        max_iterations=1, verify=False, calibration=again,
                        seams=Seams(solve_sharding=spy))
    assert seen[0][0] == costs and seen[0][1] == cal.attention_scale
    assert any(n.startswith("started from a calibration") for n in warm.notes)
    assert warm.calibration.source["started_from"] == cal.source


def test_cli_calibration_from_a_plan_without_one_is_one_line_exit_2(small, tmp_path):
    _, _, _, _, p = small
    import dataclasses

    old = tmp_path / "old.json"
    dataclasses.replace(p, calibration=None).save(str(old))
    r = _cli("plan", "--model", "wan2.1-small", "--resolution", "128p", "--frames", "9",
             "--calibration", str(old), "--time-budget", "30", "--quiet")
    assert r.returncode == 2 and "records no calibration" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_loop_calibrates_the_compute_of_the_other_ops(small):
    """Each compiled ILP layout adds (compiled, Q1) non-attention compute to the pool; the plan's
    calibration carries it, and the next iteration's ILP prices compute at the pooled ratio."""
    _, _, _, _, p = small
    samples = [s for it in p.iterations for s in it["feedback"].get("compute", [])]
    assert samples and all(s["q1_s"] > 0 and s["compiled_s"] > 0 for s in samples)
    t, q = p.calibration.compute_pool
    assert t == pytest.approx(sum(s["compiled_s"] for s in samples))
    assert q == pytest.approx(sum(s["q1_s"] for s in samples))
    assert p.calibration.compute_scale == pytest.approx(t / q)


def test_final_annealing_without_time_left_is_a_time_limit():
    """An unproven placement whose annealing finds no time left says so (``time_limited``)."""
    import time
    from types import SimpleNamespace

    from aoizora.planning.final_annealing import anneal_best
    from aoizora.solvers.budget import Budget
    from aoizora.solvers.certificate import Certificate
    from aoizora.solvers.placement import LEVELS

    cert = Certificate("CP-SAT", "FEASIBLE", 1.0, 0.5, 10.0, time_limit_s=10.0)
    best = SimpleNamespace(placement_cert=cert, evidence=object())
    did, limited = anneal_best(best, None, Budget.until(time.perf_counter()), 10.0, 0, None)
    assert did == "" and len(limited) == 1 and limited[0].startswith("not run, 0.0 s left")
    # a placement proven on every level is not annealed, and no limit bound there
    cert.status = "OPTIMAL"
    cert.detail = {"levels": {n: {"status": "OPTIMAL"} for n in LEVELS}}
    assert anneal_best(best, None, Budget.until(time.perf_counter()), 10.0, 0, None) == ("", [])
