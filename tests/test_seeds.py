"""Seeds in the loop (``aoizora.planning.seeds``): their compiles queued at their place in the pricing
order, the ILPs held behind the first seed's compile, a seed dressed as a solution. Stub queue
and futures: nothing compiles."""

import math
from concurrent.futures import Future
from types import SimpleNamespace as NS

from aoizora.planning.candidate import Seed
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.planning.loop_state import new_record
from aoizora.planning.pricing_order import PricingItem, pricing_rank
from aoizora.planning.seeds import first_compile_alone, queue_seed_compiles, seed_solution
from aoizora.solvers.budget import Budget


class _Queue:
    def __init__(self, room=10, expected=5.0):
        self.held, self.submitted, self.unless, self.slower = None, [], [], []
        self.room, self.expected_compile_s = room, expected
        self.done = []                # compiles finished (``CompileQueue.done``)

    def hold(self, p):
        self.held = p

    def submit(self, job, priority=0.0, unless=None, slower=1.0):
        self.submitted.append((job, priority))
        self.unless.append(unless)
        self.slower.append(slower)
        f = Future()
        f.set_result(None)
        return f

    def compiles_left(self):
        return self.room


def _layout(name, mesh=None):
    return Layout(mesh or {"data": 2, "context": 4}, [],
                  attention={"a": AttentionLayout(batch=("data",), seq=("context",), kv="ring")},
                  rules={"act": ("context",)}, name=name)


def _state(n_seeds, meshes=({"x": 8},), queue=None, compiles=None):
    queue = queue or _Queue()
    return NS(seeds=[Seed(_layout(f"s{i}")) for i in range(1, n_seeds + 1)], meshes=list(meshes),
              program=NS(fn=lambda *a: None, args=(), target=NS(name="v5e:2x4"), cache=None),
              queue=queue, seed_compiles=[], progress=NS(stage=lambda t: None),
              seams=NS(compile_layout=None), budget=Budget(3600.0, compiles=compiles),
              screener=None, compiles_to=lambda: queue)


def test_seed_compiles_are_queued_in_the_pricing_order_behind_a_hold(monkeypatch):
    import aoizora.planning.seeds as S

    monkeypatch.setattr(S, "compile_job", lambda fn, args, tgt, layout, **kw: layout.name)
    st = _state(3)
    queue_seed_compiles(st)
    q = st.queue
    assert q.held == pricing_rank("ilp", 0, 3)
    assert [(j, p) for j, p in q.submitted] == [
        ("s1", pricing_rank("seed", 1, 3)), ("s2", pricing_rank("seed", 2, 3)),
        ("s3", pricing_rank("seed", 3, 3))]
    assert q.slower == [1.0] * 3       # inference seeds: programs like the ILP's
    assert len(st.seed_compiles) == 3
    # no ILP mesh: nothing to wait for, no hold
    st = _state(2, meshes=())
    queue_seed_compiles(st)
    assert st.queue.held is None and len(st.queue.submitted) == 2


def test_training_seeds_compile_their_first_two_refinements_before_the_seeds(monkeypatch):
    """Seeds with a retraceable twin (a training step's): every seed is held until the
    refinements are queued; the first two refinements rank before every seed, then the two
    retimed twins (the second's first), the second seed before the first, then the usual order;
    the hold moves to the ILP's best."""
    import aoizora.planning.seeds as S

    monkeypatch.setattr(S, "compile_job", lambda fn, args, tgt, layout, **kw: layout.name)
    monkeypatch.setattr(S, "_refine", lambda st, sd, ilp, irs, rec: (NS(
        layout=_layout("refined:" + sd.layout.name), changed=1, summary=lambda: {},
        solution=NS(certificate=NS(status="OPTIMAL", objective=1.0, bound=1.0, detail={}))),
        None, ()))
    monkeypatch.setattr(S, "_refined_solution", lambda sd, ref: None)
    monkeypatch.setattr(S, "_retimed_solution", lambda sd, ref, layout: None)
    monkeypatch.setattr(S.time_limits, "sharding", lambda what, c: [])
    st = _state(3)
    for sd in st.seeds:
        sd.retraceable = Seed(sd.layout)
    st.progress = NS(stage=lambda t: None, solver=lambda *a: None)
    queue_seed_compiles(st)
    assert st.queue.held == pricing_rank("refined", 1, 3, refinement_first=True) < min(
        pricing_rank("seed", i, 3, refinement_first=True) for i in (1, 2, 3))
    assert st.queue.slower == [S.SEED_PROGRAM_SLOWER] * 3    # each seed's own step
    out = S.refine_seeds(st, NS(left=lambda: 1.0), new_record(1))
    assert st.queue.slower[3:] == [1.0] * 6       # refinements and twins: the retraced step
    order = [j for j, _ in sorted(st.queue.submitted, key=lambda jp: jp[1])]
    assert order[:6] == ["refined:s1", "refined:s2", "retimed:s2", "retimed:s1", "s2", "s1"]
    assert st.queue.held == pricing_rank("ilp", 0, 3)
    assert [(r.kind, r.index) for r in out][:4] == [("refined", 1), ("retimed", 1),
                                                   ("refined", 2), ("retimed", 2)]
    # a twin is not compiled when its refinement (the same remat) compiled and did not fit
    refined_f, twin_unless = out[0].compiling, st.queue.unless[-5]
    assert twin_unless is not None and st.queue.unless[-6] is None
    assert twin_unless() == ""      # the stub's refinement compiled to nothing
    refined_f._result = NS(evidence=NS(memory=NS(fits=False)))
    assert "did not fit" in twin_unless()


def test_a_retimed_seed_is_its_own_parameter_layout_with_the_refinements_remat_and_tiles():
    from aoizora.planning.seeds import retimed

    own = Layout({"fsdp": 2, "tensor": 4}, [("fsdp", None), ("tensor",), None], out_specs=[
        ("fsdp", None), ("tensor",), None], name="expert")
    refined = Layout({"fsdp": 2, "tensor": 4}, [None, ("fsdp",), None], out_specs=[
        None, ("fsdp",), None], remat={"qkv": "keep"}, name="refined:expert")
    t = retimed(refined, own, "expert")
    assert t.in_specs == own.in_specs and t.out_specs == own.out_specs
    assert t.remat == {"qkv": "keep"} and t.name == "retimed:expert"
    assert refined.in_specs == [None, ("fsdp",), None]     # not changed in place


def test_the_ilps_start_only_if_the_budget_holds_their_best():
    st = _state(2)
    running = Future()                       # the second seed's compile, not done yet
    st.seed_compiles = [st.queue.submit(None), running]
    st.queue.submitted.clear()
    # ahead of the ILP's best: the second seed (waiting) and the first seed's refinement (done)
    refined = [PricingItem("refined", 1, pricing_rank("refined", 1, 2), {}, None,
                           st.queue.submit(None))]
    assert first_compile_alone(st, refined) == ("", False)
    st.queue.room = 1
    why = first_compile_alone(st, refined)
    assert why == ("the time budget holds 1 more compile(s) of about 5.0 s and the ILP's best "
                   "would be compile 2 after the first seed's", True)


def test_a_compile_count_that_decides_the_ilps_skip_is_not_a_time_limit():
    st = _state(2, compiles=3)
    st.seed_compiles = [st.queue.submit(None), Future()]   # the second seed still compiling
    st.queue.submitted.clear()
    refined = [PricingItem("refined", 1, pricing_rank("refined", 1, 2), {}, None,
                           st.queue.submit(None))]
    st.queue.done = [1, 2]                 # two compiles finished: the count leaves one
    st.queue.room = 1                      # what the queue says (min of count and clock)
    why, by_clock = first_compile_alone(st, refined)
    assert not by_clock and why.startswith("the compile budget (3) holds 1 more compile(s)")
    st.queue.done = [1]                    # the count leaves two: the ILP's best fits
    st.queue.room = 2
    assert first_compile_alone(st, refined) == ("", False)


def test_a_seed_as_a_solution_says_it_proves_nothing():
    ilp_best = NS(certificate=NS(to_json=lambda: {"status": "OPTIMAL"}))
    sol = seed_solution(_layout("expert:cfg2"), ilp_best)
    c = sol.certificate
    assert c.status == "FEASIBLE" and c.objective is None and c.bound is None
    assert c.detail["seed"] and c.detail["ilp_best"] == {"status": "OPTIMAL"}
    assert sol.words == ["attention: batch on data, sequence on context, keys/values in a ring [a]",
                         "rule act: on context"]
    assert math.isinf(sol.predicted["total_s"]) and sol.choice == {}


def test_training_candidates_are_priced_in_the_order_they_compile():
    """``loop.queue_compiles`` prices the first iteration's seeds and refinements in the order
    the queue compiles them: a training seed's refinement before the seed (it does not wait for
    the seed, which compiles after both refinements)."""
    from aoizora.planning.loop import queue_compiles

    st = _state(2)
    for sd in st.seeds:
        sd.retraceable = Seed(sd.layout)
    st.queue.release = lambda: None
    st.seen, st.settings = set(), NS(top_k=2)
    st.seed_compiles = [st.queue.submit(sd.layout.name) for sd in st.seeds]
    refined = [PricingItem(kind, i, pricing_rank(kind, i, 2, refinement_first=True), {}, None,
                           st.queue.submit(None), seed=Seed(_layout(f"{kind}:s{i}")))
               for i in (1, 2) for kind in ("refined", "retimed")]
    todo = queue_compiles(st, [], refined)
    names = [t.seed.layout.name for t in todo]
    assert names == ["refined:s1", "refined:s2", "retimed:s2", "retimed:s1", "s2", "s1"]
