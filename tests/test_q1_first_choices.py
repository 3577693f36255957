"""benchmarks.q1_fidelity.first_choices: which layout the simulator, Q1 and Q2 rank first."""

from benchmarks.q1_fidelity import first_choices


def _row(name, q1, q2, sim, fits=True):
    return {"name": name, "q1": {"step_s": q1}, "q2": {"step_s": q2}, "sim": {"step_s": sim},
            "fits_hbm": fits}


def test_counts_the_ilps_fastest_and_each_models_first():
    cells = {
        "a": {"rows": [_row("ilp:2x4", 1.0, 1.2, 0.9), _row("expert:x", 1.1, 1.1, 1.0)]},
        "b": {"rows": [_row("ilp:8", 2.0, 2.0, 2.1), _row("expert:y", 2.2, 1.9, 2.0),
                       _row("expert:z", 0.1, 0.1, 0.1, fits=False)]},
        "c": {"rows": [_row("ilp:8", 1.0, 1.0, 1.0)]},              # one layout: left out
    }
    text = "\n".join(first_choices(cells))
    assert "over 2 cells the simulator's fastest is one of the ILP's own layouts in 1" in text
    assert "Q1's first is the simulator's fastest in 1, Q2's in 1" in text
    assert "expert:z" not in text and "- c:" not in text
