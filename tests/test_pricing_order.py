"""The order an iteration compiles and prices its layouts (``aoizora.planning.pricing_order``): the
pricing rank of seeds, refinements and ILP layouts, the diverse pick, the unproven near-ties."""

from types import SimpleNamespace as NS

from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.planning.pricing_order import (DIVERSE_NEAR, diverse, pricing_rank,
                                            with_unproven_near)
from aoizora.solvers.certificate import Certificate


def test_the_first_two_seeds_compile_before_the_ilps_best():
    """The first iteration's pricing (and compile) order: first seed, its refinement, the second
    seed, the ILP's best with its unproven near-ties, the second seed's refinement, each other
    seed then its refinement, the ILP's other layouts; with one seed: seed, refinement, the ILP's
    best; without seeds the ILP's layouts alone, in their order; later iterations alike."""
    order = [("seed", 1), ("refined", 1), ("seed", 2), ("ilp", 0), ("ilp", 1), ("refined", 2),
             ("seed", 3), ("refined", 3), ("seed", 4), ("refined", 4), ("ilp", 2), ("ilp", 3)]
    ranks = [pricing_rank(kind, i, 4, lead=2) for kind, i in order]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    one = [pricing_rank(kind, i, 1) for kind, i in (("seed", 1), ("refined", 1), ("ilp", 0),
                                                     ("ilp", 1))]
    assert one == sorted(one) and len(set(one)) == 4
    alone = [pricing_rank("ilp", k, 0, lead=2) for k in range(4)]
    assert alone == sorted(alone) and len(set(alone)) == 4 and alone[0] == 0
    one = [pricing_rank(*r, 1) for r in (("seed", 1), ("refined", 1), ("ilp", 0))]
    assert one == sorted(one) and pricing_rank("ilp", 1, 1) > one[-1]


def test_compile_order_takes_each_kv_mode_combination_early():
    """The layouts compiled first: the ILP's best, then the best of the other kind (a ring in some
    attention, or none) if Q1 puts it within DIVERSE_NEAR of the best, then Q1 order (a
    near-copy of the best is no longer second)."""

    def sol(kv, name):
        return NS(layout=Layout({"x": 8}, [], attention={"a": AttentionLayout(seq=("x",), kv=kv)},
                                name=name))

    ring_gather = NS(layout=Layout({"x": 8}, [], name="r3", attention={
        "a": AttentionLayout(seq=("x",), kv="ring"), "b": AttentionLayout(seq=("x",))}))
    ranked = [(1.0, {}, sol("ring", "r1")), (1.05, {}, sol("ring", "r2")),
              (1.1, {}, ring_gather), (1.2, {}, sol("gather", "g1")),
              (1.6, {}, sol("gather", "g2"))]
    assert [r[2].layout.name for r in diverse(ranked, 2)] == ["r1", "g1"]
    assert [r[2].layout.name for r in diverse(ranked, 4)] == ["r1", "g1", "r2", "r3"]
    assert [r[2].layout.name for r in diverse(ranked[:2], 2)] == ["r1", "r2"]
    # the other kind far behind by Q1 (a 48% gap, as on Wan 1.3B 41f v5e-16) waits its turn
    far = [(1.0, {}, sol("ring", "r1")), (1.2, {}, sol("ring", "r2")),
           (1.48, {}, sol("gather", "g1"))]
    assert 1.48 > 1.0 + DIVERSE_NEAR
    assert [r[2].layout.name for r in diverse(far, 2)] == ["r1", "r2"]
    assert [r[2].layout.name for r in diverse(far, 3)] == ["r1", "r2", "g1"]


def test_an_unproven_near_tie_on_another_mesh_is_compiled_too():
    """After the best layout: every other mesh's best whose ILP stopped at its limit with a bound
    below the best's Q1 and a Q1 within 1% of it; proven optima, far layouts, bounds above the
    best and a mesh's second layout are not added."""

    def entry(q1, mesh, status, bound, name):
        cert = Certificate(solver="HiGHS", status=status, objective=q1, bound=bound, time_s=20.0)
        return (q1, mesh, NS(certificate=cert, name=name))

    best = entry(0.5815, {"x": 4, "y": 2, "z": 2}, "FEASIBLE", 0.5795, "best")
    other_kind = entry(0.6188, {"x": 8, "y": 2}, "OPTIMAL", 0.6188, "other kind")
    untried = [best,
               entry(0.5818, {"x": 4, "y": 2, "z": 2}, "FEASIBLE", 0.5795, "best's mesh, 2nd"),
               entry(0.5824, {"x": 2, "y": 4, "z": 2}, "FEASIBLE", 0.5801, "near, unproven"),
               entry(0.5830, {"x": 2, "y": 8}, "OPTIMAL", 0.5830, "near, proven"),
               entry(0.5850, {"x": 2, "y": 2, "z": 4}, "FEASIBLE", 0.5820, "bound above best"),
               entry(0.6000, {"x": 16}, "FEASIBLE", 0.5000, "far"),
               other_kind]
    got = with_unproven_near([best, other_kind], untried)
    assert [r[2].name for r in got] == ["best", "near, unproven", "other kind"]
    proven = [entry(q1, m, "OPTIMAL", q1, sol.name) for q1, m, sol in untried]
    assert with_unproven_near(proven[:1], proven) == proven[:1]
    assert with_unproven_near([], untried) == []


def test_the_pricing_order_is_an_ordered_list_of_named_slots():
    """The order is written out as slots (``pricing_slots``), and a rank is a slot's place."""
    from aoizora.planning.pricing_order import pricing_slots

    assert pricing_slots(3) == [("seed", 1), ("refined", 1), ("seed", 2), ("retimed", 1),
                                ("ilp best", 0), ("refined", 2), ("retimed", 2), ("seed", 3),
                                ("refined", 3), ("retimed", 3), ("ilp rest", 0)]
    assert pricing_slots(2, refinement_first=True) == [
        ("refined", 1), ("refined", 2), ("retimed", 2), ("retimed", 1), ("seed", 2), ("seed", 1),
        ("ilp best", 0), ("ilp rest", 0)]
    assert pricing_slots(0) == [("ilp best", 0), ("ilp rest", 0)]
    assert pricing_rank("seed", 3, 3) == pricing_slots(3).index(("seed", 3))


def test_two_ilp_answers_with_one_layout_compile_once():
    """The k-best's second answer can differ from the first only in choices the realized layout
    does not show (no other kv way to take): the loop lists that program once, and never one it
    compiled before."""
    from aoizora.planning.candidate import layout_id
    from aoizora.planning.loop import distinct_untried
    m = {"x": 8}

    def sol(name, seq):
        return NS(layout=Layout(m, [("x",)], name=name,
                                attention={"7": AttentionLayout(seq=("x",) if seq else ())}))
    first, twin, other, old = sol("ilp", True), sol("ilp#2", True), sol("ilp#3", False), \
        sol("ilp", False)
    ranked = [(1.0, m, first), (1.0, m, twin), (1.1, m, other)]
    assert [s for _q, _m, s in distinct_untried(ranked, set())] == [first, other]
    assert distinct_untried(ranked, {layout_id(m, old.layout)}) == [(1.0, m, first)]


def test_a_layout_and_its_twin_on_the_permuted_mesh_are_one_identity():
    """``layout_id`` does not see the names or the order of the mesh's axes: the same splits on
    2x4 and on 4x2 (axes renamed) are one program; a split over an axis of another size is not."""
    from aoizora.planning.candidate import attention_id, layout_id

    def lay(mesh, seq, batch):
        return Layout(mesh, [(seq,), (batch,)], name="any", attention={
            "a": AttentionLayout(batch=(batch,), seq=(seq,), kv="ring")})

    a, twin = lay({"x": 2, "y": 4}, "y", "x"), lay({"x": 4, "y": 2}, "x", "y")
    other = lay({"x": 2, "y": 4}, "x", "y")          # the ring over the 2-axis
    assert layout_id(a.mesh_axes, a) == layout_id(twin.mesh_axes, twin)
    assert layout_id(a.mesh_axes, a) != layout_id(other.mesh_axes, other)
    assert attention_id(a.mesh_axes, a) == attention_id(twin.mesh_axes, twin)
    assert attention_id(a.mesh_axes, a) != attention_id(other.mesh_axes, other)


def test_a_twin_of_the_best_compiles_after_the_other_layouts():
    """A layout that runs every attention as the best does, on a permuted mesh, at the best's Q1
    (the 41f v5e-16 case: 2x4x2 and 4x2x2, 164.4 and 164.5 ms by Q2) goes last; the next
    distinct layout takes the second compile."""
    def sol(mesh, seq, batch, extra=None):
        return NS(layout=Layout(mesh, [(seq,), extra or (batch,)], name=f"{mesh}", attention={
            "a": AttentionLayout(batch=(batch,), seq=(seq,), kv="ring")}))

    best = sol({"x": 2, "y": 4}, "y", "x")
    twin = sol({"x": 4, "y": 2}, "x", "y", extra=(None,))   # one input split otherwise
    nxt = sol({"x": 2, "y": 4}, "x", "y")
    ranked = [(1.000, best.layout.mesh_axes, best), (1.000, twin.layout.mesh_axes, twin),
              (1.030, nxt.layout.mesh_axes, nxt)]
    assert [r[2] for r in diverse(ranked, 2)] == [best, nxt]
    assert [r[2] for r in diverse(ranked, 3)] == [best, nxt, twin]
    far = [(1.0, best.layout.mesh_axes, best), (1.1, twin.layout.mesh_axes, twin)]
    assert [r[2] for r in diverse(far, 2)] == [best, twin]   # Q1 apart: not a twin
