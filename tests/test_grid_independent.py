"""The grid's independent pricing (issue #34, item 5): compiles keep their HLO text when asked, the
evidence's JSON does not carry where, and the report says where Q2 and the simulator disagree."""

import gzip
import os

import numpy as np
import pytest

from aoizora.extract.evidence import Evidence
from benchmarks.grid_independent_report import disagreement
from aoizora.extract.targets import get_target


def test_hlo_path_is_not_part_of_the_evidence_json_nor_its_equality():
    a = Evidence(target="v5e:2x4", mesh_axes={"x": 8})
    b = Evidence(target="v5e:2x4", mesh_axes={"x": 8}, hlo_path="/tmp/x.hlo.gz")
    assert a == b and "hlo_path" not in b.to_json()
    assert Evidence.loads(b.dumps()).hlo_path is None
    assert Evidence.from_json({**a.to_json(), "hlo_path": "/gone"}).hlo_path is None


@pytest.mark.tpu_compiler
def test_compiles_keep_their_hlo_only_when_asked(tmp_path):
    """Inside keeping_hlo (also on another thread, as the planner compiles), each compile writes
    its program's HLO gzip'd and the evidence names the file; outside, nothing is kept."""
    import threading

    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from aoizora.extract.aot_compile import compile_evidence, keeping_hlo, read_hlo, target_mesh

    mesh = target_mesh(get_target("v5e-8"), {"x": 8})
    args = (jax.ShapeDtypeStruct((256, 512), jnp.bfloat16), jax.ShapeDtypeStruct((512, 128),
                                                                                jnp.bfloat16))

    def compile_():
        return compile_evidence(lambda a, b: a @ b, args, mesh=mesh, target=get_target("v5e-8"),
                                in_shardings=(P(None, "x"), P("x", None)))

    assert compile_().hlo_path is None
    got = {}
    with keeping_hlo(tmp_path / "hlo"):
        t = threading.Thread(target=lambda: got.setdefault("ev", compile_()))
        t.start()
        t.join()
    ev = got["ev"]
    assert ev.hlo_path and os.path.dirname(ev.hlo_path) == str(tmp_path / "hlo")
    with gzip.open(ev.hlo_path, "rt") as f:
        text = f.read()
    assert text == read_hlo(ev) and "ENTRY" in text
    assert any(c.kind in ("all-reduce", "reduce-scatter") for c in ev.collectives)
    assert compile_().hlo_path is None                      # the context is closed again


def _pair(what, q2c, q2m, simc, simm, layout="L"):
    return {"what": what, "program": "job", "layout": layout, "placement": [0],
            "q2_step_s": q2c + q2m, "q2_compute_s": q2c, "sim_step_s": simc + simm,
            "sim_compute_s": simc}


def test_disagreement_names_the_pairs_and_the_term_that_turns_the_order():
    cell = {"fidelity": {"pairs": [
        _pair("aoizora", 10.0, 1.0, 12.0, 1.0, "A"),            # Q2's first
        _pair("expert:x", 10.5, 1.0, 11.0, 1.1, "B"),           # the simulator's first
        _pair("random:1", 10.0, 3.0, 12.0, 3.0, "A")]}}
    d = disagreement(cell)
    assert not d["agree"] and d["q2_first"] == "aoizora" and d["sim_first"] == "expert:x"
    assert d["term"] == "compute" and not d["same_program_and_layout"]
    assert d["sim_rank_of_q2_first"] == 2 and d["q2_rank_of_sim_first"] == 2
    assert np.isclose(d["q2_delta"]["compute_s"], 0.5) and np.isclose(d["sim_delta"]["compute_s"], -1.0)
    # the same cell where the simulator's compute agrees: only communication could turn it
    cell["fidelity"]["pairs"][1] = _pair("expert:x", 10.5, 1.0, 12.5, 0.1, "B")
    assert disagreement(cell)["term"] == "communication"
    cell["fidelity"]["pairs"][1] = _pair("expert:x", 10.5, 1.0, 12.5, 1.0, "B")
    assert disagreement(cell)["agree"]
    assert disagreement({"fidelity": {"pairs": []}}) is None


def test_the_grid_prices_each_pair_with_the_programs_hlo(tmp_path):
    """The grid's pricer reads the HLO kept for a program and gives it to the simulator (its own
    compute model), the same numbers as a fresh simulator given the text, under every placement;
    a program without kept HLO is priced all the same and marked."""
    from aoizora.extract.compiled_evidence import evidence_from_hlo_text
    from aoizora.extract.network import Network
    from aoizora.extract.targets import get_target
    from benchmarks.grid import _Pricer
    from benchmarks.simulator import Simulator
    from test_compiled_evidence import HAND

    def hand():
        return evidence_from_hlo_text(HAND, target="v5e:2x4", mesh_axes={"d": 2, "m": 4},
                                      device_order=list(range(8)), clock_hz=1.5e9)

    ev = hand()
    ev.hlo_path = str(tmp_path / "hand.hlo.gz")
    with gzip.open(ev.hlo_path, "wt") as f:
        f.write(HAND)
    tgt = get_target("v5e-8")
    pricer = _Pricer(tgt, Network.from_target(tgt))
    for placement in (list(range(8)), [7, 6, 5, 4, 3, 2, 1, 0], list(range(8))):
        p = pricer.price(ev, placement, "L", "x")
        fresh = Simulator(tgt).run(hand(), placement, hlo=HAND)
        blind = Simulator(tgt).run(hand(), placement)
        assert p["sim_hlo"] and p["sim_step_s"] == pytest.approx(fresh.step_s, rel=1e-12)
        assert p["sim_compute_s"] == pytest.approx(fresh.compute_s, rel=1e-12)
        assert not any("no HLO given" in n for n in p["sim_notes"])
        assert p["sim_compute_s"] != pytest.approx(blind.compute_s, rel=1e-6)   # its own model
    bare = pricer.price(hand(), list(range(8)), "L", "y")
    assert not bare["sim_hlo"] and any("no HLO given" in n for n in bare["sim_notes"])
    assert [q["sim_hlo"] for q in pricer.pairs] == [True, True, True, False]
