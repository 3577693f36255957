"""The screen (``aoizora.planning.screening``): every layout of an iteration priced from its early
evidence, the full compiles queued in screen-price order; with a compile count every layout is
screened whatever the clock; with the time budget alone a screen starts only while a full compile
of the screen's best still fits after it; and, with the real compiler on the small model, the plan
compiles fully the layout its screen ranked first and says how many it screened."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import pytest

from aoizora.extract.targets import get_target
from aoizora.planning.candidate_pricing import CompileJob
from aoizora.planning.compile_queue import Compiled, Skipped
from aoizora.planning.pricing_order import PricingItem
from aoizora.planning.screening import ScreenPrice, Screener
from aoizora.solvers.budget import Budget


@dataclasses.dataclass
class Layout:
    name: str
    mesh_axes: dict


class FakeQueue:
    """What the screener asks of the compile queue: submit, done, reserve_s."""

    def __init__(self, done=()):
        self.done, self.reserve_s, self.submitted = list(done), 0.0, []

    @property
    def expected_compile_s(self):
        return max(c.seconds for c in self.done)

    def submit(self, job, priority=0.0, unless=None, slower=1.0):
        from concurrent.futures import Future

        self.submitted.append((priority, job.layout.name))
        f = Future()
        f.set_result(Compiled(evidence=job.layout.name, seconds=1.0))
        return f


# each layout's screen: (step seconds, fits); None: the screen fails
PRICES = {"a": (0.30, True), "b": (0.20, True), "c": (0.10, False), "d": None, "e": (0.20, True)}


def fake_early(fn, args, target, layout, order, **kw):
    if PRICES[layout.name] is None:
        from aoizora.extract.early_evidence import EarlyEvidenceError

        raise EarlyEvidenceError("the compile failed before the module")
    return layout.name


def fake_price(early, order, network):
    step, fits = PRICES[early]
    return ScreenPrice(step, step, 0.0, 0.0, fits, 0.0)


def _items(screener, names):
    out = []
    for rank, name in enumerate(names):
        job = CompileJob(None, None, (), None, Layout(name, {"x": 8}), list(range(8)))
        out.append(PricingItem("ilp", rank, float(rank), {"x": 8}, None,
                               screener.submit(job, priority=float(rank))))
    return out


def test_full_compiles_are_queued_in_screen_order_the_unfitting_last():
    queue = FakeQueue()
    s = Screener(queue, Budget(60.0, compiles=2), fake_early, None, price=fake_price)
    record = []
    todo = s.order(_items(s, ["a", "b", "c", "d", "e"]), record)
    # by screen step, ties by pricing rank (b before e); d's screen failed: after the priced
    # layouts that fit; c does not fit: last
    assert [t.solution for t in todo] == [None] * 5
    assert [name for _, name in queue.submitted] == ["b", "e", "a", "d", "c"]
    assert [p for p, _ in queue.submitted] == [0, 1, 2, 3, 4]
    assert [t.rank for t in todo] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [r["layout"] for r in record] == ["b", "e", "a", "d", "c"]
    assert record[4]["fits_hbm"] is False and record[3]["error"].startswith("the compile failed")
    assert [t.compiling.result().evidence for t in todo] == ["b", "e", "a", "d", "c"]
    assert s.counts == {"screened": 4, "screen_failed": 1, "screen_skipped": 0}
    s.close()


def test_with_a_compile_count_every_layout_is_screened_whatever_the_clock():
    """A full compile known to take 1000 s does not stop a screen when a count decides."""
    queue = FakeQueue(done=[Compiled(evidence="x", seconds=1000.0)])
    s = Screener(queue, Budget(60.0, compiles=1), fake_early, None, price=fake_price)
    s.order(_items(s, ["a", "b", "e"]), [])
    assert s.counts["screened"] == 3 and s.counts["screen_skipped"] == 0
    s.close()


def test_with_the_time_budget_a_screen_keeps_room_for_one_full_compile():
    """With a full compile known to take 1000 s and a 60 s budget, no screen fits before it: the
    layouts come back as Skipped by the clock, nothing is queued."""
    queue = FakeQueue(done=[Compiled(evidence="x", seconds=1000.0)])
    s = Screener(queue, Budget(60.0), fake_early, None, price=fake_price)
    todo = s.order(_items(s, ["a", "b"]), [])
    got = [t.compiling.result() for t in todo]
    assert all(isinstance(g, Skipped) and g.clock and g.budget for g in got)
    assert "full compile of the screen's best" in got[0].reason
    assert queue.submitted == [] and s.counts["screen_skipped"] == 2
    s.close()


def test_hold_keeps_later_screens_until_release():
    import threading

    queue = FakeQueue()
    started, a_done = [], threading.Event()

    def early(fn, args, target, layout, order, **kw):
        started.append(layout.name)
        a_done.set()
        return layout.name

    s = Screener(queue, Budget(60.0, compiles=2), early, None, slots=1, price=fake_price)
    s.hold(0.5)
    items = _items(s, ["a", "b"])
    assert a_done.wait(60)
    assert started == ["a"]          # b (priority 1) held
    s.release()
    s.order(items, [])
    assert started == ["a", "b"]
    s.close()


@pytest.mark.tpu_compiler
def test_the_plan_compiles_fully_the_screens_best_and_counts_the_screens():
    """The small model with one seed and one mesh, screening on and one full compile: every
    layout is screened, the one compiled fully is the screen's first, and the plan says so."""
    import aoizora
    from aoizora.models import registry as R
    from aoizora.models.experts import expert_layouts

    m = R.get_model("wan2.1-small")
    wl = m.workloads[0]
    fn = R.denoise_step(m, pad_multiple=128)
    args = R.abstract_inputs(m, wl, dtype=jnp.float32)
    ex = next(e for e in expert_layouts(m, wl, get_target("v5e-8"), dtype=jnp.float32)
              if e.name == "context")
    p = aoizora.plan(fn, *args, target="v5e-8", time_budget_s=600, top_k=1,
                     meshes=[{"x": 2, "y": 4}], max_iterations=1, verify=False,
                     seed_layouts=[ex.layout], compiles=1, screen=True)
    it = p.iterations[0]
    screens = it["screens"]
    assert len(screens) >= 2 and p.compiles["screened"] == len(screens)
    assert p.compiles["compiled"] == 1
    priced = [c for c in it["candidates"] if c["q2_step_s"] is not None]
    assert [c["layout"] for c in priced] == [screens[0]["layout"]]
    assert screens[0]["full_compile_order"] == 0
    steps = [s["screen_step_s"] for s in screens if s["fits_hbm"]]
    assert steps == sorted(steps) and all(math.isfinite(x) and x > 0 for x in steps)
    assert any("screened" in n and "compiled 1 fully" in n for n in p.notes)


def test_a_screen_that_raises_anything_costs_its_place_not_the_plan():
    """An unexpected error in a screen (here a TypeError) is recorded and the layout is still
    queued, after the ones priced: ``order`` does not wait forever."""
    def early(fn, args, target, layout, order, **kw):
        if layout.name == "a":
            raise TypeError("cannot pickle the program")
        return layout.name

    queue = FakeQueue()
    s = Screener(queue, Budget(60.0, compiles=2), early, None, price=fake_price)
    record = []
    s.order(_items(s, ["a", "b"]), record)
    assert [name for _, name in queue.submitted] == ["b", "a"]
    assert record[1]["error"] == "TypeError: cannot pickle the program"
    s.close()


def test_a_warm_cache_screens_from_stored_early_evidence_and_gives_the_same_plan(tmp_path):
    """A re-plan with the same cache finds every screen's early evidence there: no early compile
    runs, the screen prices and so the full-compile order are the same, and so is the plan."""
    import aoizora
    from aoizora.models import registry as R
    from aoizora.planning.candidate_pricing import early_layout_evidence
    from aoizora.planning.seams import Seams

    m = R.get_model("wan2.1-small")
    wl = m.workloads[0]
    fn = R.denoise_step(m, pad_multiple=128)
    args = R.abstract_inputs(m, wl, dtype=jnp.float32)
    calls = []

    def counted(*a, **kw):
        calls.append(a[3].name)
        return early_layout_evidence(*a, **kw)

    def plan():
        return aoizora.plan(fn, *args, target="v5e-8", time_budget_s=600, top_k=2,
                            meshes=[{"x": 2, "y": 4}], max_iterations=1, verify=False,
                            seed_layouts=[], compiles=1, screen=True, cache=str(tmp_path),
                            seams=Seams(early_evidence=counted))

    cold = plan()
    n_cold = len(calls)
    warm = plan()
    assert n_cold >= 2 and len(calls) == n_cold          # nothing screened by compiling again
    assert [s["screen_step_s"] for s in warm.iterations[0]["screens"]] == \
        [s["screen_step_s"] for s in cold.iterations[0]["screens"]]
    assert warm.layout.to_json() == cold.layout.to_json()
    assert warm.device_order == cold.device_order
