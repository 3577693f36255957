"""Plan assembly (``aoizora.planning.plan_assembly``): why no plan came out, the per-link seconds, the
attention ops named by role. Synthetic records and loads: nothing compiles."""

from types import SimpleNamespace as NS

import numpy as np
import pytest

import aoizora.planning.plan_assembly as A


def _state(cands, stop="the ILP's best layouts repeat"):
    return NS(iterations=[{"candidates": cands}], program=NS(target=NS(name="v5e:2x4")),
              stop_reason=stop)


def test_no_plan_says_why_in_one_line():
    oom = A.no_plan_error(_state([{"fits_hbm": False}, {"fits_hbm": False}]))
    assert str(oom) == ("no compiled layout fits in HBM on v5e:2x4 (2 tried); use a larger "
                        "slice or a smaller workload")
    err = A.no_plan_error(_state([{"fits_hbm": False}, {"error": "realize: bad spec"}]))
    assert str(err) == "no layout could be compiled and priced for v5e:2x4: realize: bad spec"
    none = A.no_plan_error(_state([], stop="time budget: 1.0 s left"))
    assert str(none).endswith(": time budget: 1.0 s left")


def test_link_seconds_count_each_phase_by_its_runs():
    network = NS(num_links=2, link_bandwidth_Bps=1e9, chips=[(0, 0), (0, 1)],
                 link=lambda lid: (lid, 1 - lid))
    # phase 0 runs 3 times (its largest class count), phase 1 once
    q2 = NS(phases=[NS(phase=0, count=2), NS(phase=0, count=3), NS(phase=1, count=1)],
            link_loads={"0": [1e9, 0.0], "1": [5e8, 2e9]})
    out = A.link_seconds(q2, network)
    assert [o["seconds"] for o in out] == pytest.approx([3.5, 2.0])
    assert out[0]["from"] == [0, 0] and out[0]["to"] == [0, 1]
    assert np.isfinite([o["seconds"] for o in out]).all()


def test_attention_words_are_named_by_role(monkeypatch):
    monkeypatch.setattr(A, "attention_roles", lambda fn, args: {"91.98": "self"})
    words = ["attention: heads on x [91.98 block/attn]", "attention: replicated [91.161]",
             "dot params/w: x on y [12.3]"]
    assert A.named_words(None, (), words) == [
        "self-attention: heads on x [91.98 block/attn]", "attention: replicated [91.161]",
        "dot params/w: x on y [12.3]"]
