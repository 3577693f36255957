"""Tuned experts (``aoizora.expert_tuning``, ``models.tuned_experts``): the descent tries the
knobs in a fixed order from the best setting so far, keep-what-fits climbs its ladder until a
rung fits, the cap leaves settings untried and says which; the knob settings build real
programs and layouts of the small model (no compile)."""

import dataclasses

import pytest

from aoizora import expert_tuning as X
from aoizora.models import tuned_experts as TE
from aoizora.models.tuned_experts import Knobs


def _fake_variants(monkeypatch, options=None):
    def variant(job, name, knobs, vmem_fraction=1.0):
        layout = type("L", (), {"compiler_options": dict(options or {}), "name": knobs.label(),
                                "vmem_fraction": vmem_fraction,
                                "attention": {"node": vmem_fraction}})
        return TE.Variant(name, knobs, None, (), layout, {})
    monkeypatch.setattr(TE, "variant", variant)


def _price(table, default=10.0, unfit=()):
    seen = []

    def price(v):
        seen.append(v.knobs)
        if v.knobs.remat in unfit:
            return X.Priced(None, False, "does not fit in HBM")
        return X.Priced(table.get(v.knobs, default), True)
    return price, seen


def test_inference_tunes_blocks_then_options_from_the_best(monkeypatch):
    _fake_variants(monkeypatch)
    shard = Knobs(blocks="shard")
    price, seen = _price({Knobs(): 10.0, shard: 8.0, dataclasses.replace(shard, options=
                                                                          "maxdiffusion"): 9.0})
    t = X.tune_expert(type("J", (), {"task": "denoise"})(), "cfg2_context", price)
    assert seen == [Knobs(), shard, Knobs(blocks="shard", options="no_windowed_einsum"),
                    Knobs(blocks="shard", options="maxdiffusion")]
    assert t.best.knobs == shard and t.published.knobs == Knobs() and t.gain == pytest.approx(1.25)
    # on a GPU target the options knob has nothing to try (its names are XLA:TPU's)
    gpu = type("J", (), {"task": "denoise",
                         "target": type("T", (), {"chip": type("C", (), {"family": "gpu"})()})()})()
    price, seen = _price({})
    X.tune_expert(gpu, "cfg2_context", price)
    assert [k.options for k in seen] == ["published", "published"]


def test_blocks_that_overflow_vmem_are_chosen_again_within_less_of_it(monkeypatch):
    """Blocks sized to the shard that overflow VMEM are chosen again within 0.75 of it, as the
    planner's own tiles are; the retry is the same setting: one trial, no cap spent."""
    _fake_variants(monkeypatch)
    fractions = []

    def price(v):
        fractions.append((v.knobs.blocks, v.layout.vmem_fraction))
        if v.knobs.blocks == "shard" and v.layout.vmem_fraction > 0.8:
            return X.Priced(None, None, "RESOURCE_EXHAUSTED: CompileTimeScopedVmemOom: VMEM")
        return X.Priced(8.0 if v.knobs.blocks == "shard" else 10.0, True)
    t = X.tune_expert(type("J", (), {"task": "denoise"})(), "dsp", price, max_compiles=3)
    assert fractions == [("published", 1.0), ("shard", 1.0), ("shard", 0.75), ("shard", 0.75)]
    shard = [x for x in t.trials if x.knobs == Knobs(blocks="shard")]
    assert len(shard) == 1 and shard[0].vmem_fraction == 0.75 and t.best is shard[0]
    assert shard[0].to_json()["vmem_fraction"] == 0.75 and len(t.trials) == 3 and t.untried
    # another compile error is not retried
    fractions.clear()
    t = X.tune_expert(type("J", (), {"task": "denoise"})(), "dsp",
                      lambda v: X.Priced(None, None, "does not fit in HBM"), max_compiles=3)
    assert [x.vmem_fraction for x in t.trials] == [1.0, 1.0, 1.0]


def test_training_tries_every_named_remat_and_climbs_keep_what_fits(monkeypatch):
    _fake_variants(monkeypatch, options={"x": True})
    job = type("J", (), {"task": "train"})()
    # "none" (keep everything) does not fit: the ladder is climbed until rung 2 fits
    price, seen = _price({Knobs(remat="full"): 12.0, Knobs(remat="keep_what_fits:2"): 7.0},
                         unfit=("none", "keep_what_fits:1"))
    t = X.tune_expert(job, "maxdiffusion", price)
    remats = [k.remat for k in seen]
    assert remats[:2] == ["published", "published"]           # as published, blocks shard
    assert remats[2:7] == list(TE.REMAT_POLICIES)
    assert remats[7:9] == ["keep_what_fits:1", "keep_what_fits:2"]
    assert seen[-1].options == "libtpu_default"               # the recipe had options
    assert t.best.knobs.remat == "keep_what_fits:2"
    # "none" fits: keep-what-fits is "none", no rung is tried
    price, seen = _price({})
    X.tune_expert(job, "maxdiffusion", price)
    assert not any(k.remat.startswith("keep_what_fits") for k in seen)


def test_the_cap_leaves_settings_untried_and_says_which(monkeypatch):
    _fake_variants(monkeypatch)
    price, seen = _price({})
    t = X.tune_expert(type("J", (), {"task": "train"})(), "x", price, max_compiles=3)
    assert len(seen) == 3 and len(t.trials) == 3 and t.untried
    assert X.best_of([t]) is t and X.best_of([X.TunedExpert("y", None, None, [])]) is None


def test_knob_settings_build_the_small_models_programs():
    from aoizora.builtin import builtin_job

    job = builtin_job("wan2.1-small", "128p", 9, "v5p-8", task="train")
    pub = TE.variant(job, "maxdiffusion", Knobs())
    assert pub.program["remat"] == dict(TE.REMAT_POLICIES["hidden_state_with_offload"])
    assert pub.layout.compiler_options            # maxdiffusion's published options
    none = TE.variant(job, "maxdiffusion", Knobs(remat="none", blocks="shard",
                                                 options="libtpu_default"))
    assert none.program["remat"] == "none" and none.layout.compiler_options == {}
    assert none.layout.mesh_axes == pub.layout.mesh_axes
    nwe = TE.variant(job, "maxdiffusion", Knobs(options="no_windowed_einsum"))
    assert nwe.layout.compiler_options == {**pub.layout.compiler_options,
                                           "xla_tpu_enable_windowed_einsum_for_all_gather": False,
                                           "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}
    assert none.layout.in_specs == pub.layout.in_specs            # the expert's own layout
    assert any(a.tiles != b.tiles for a, b in zip(none.layout.attention.values(),
                                                  pub.layout.attention.values()))
    kwf = TE.keep_what_fits(2)
    assert kwf["ffn_hidden"] == kwf["qkv"] == "recompute" and kwf["attn_out"] == "keep"
    with pytest.raises(ValueError):
        TE.remat_value("sometimes")
    inf = builtin_job("wan2.1-small", "128p", 9, "v5e-8")
    assert TE.variant(inf, "cfg2_context", Knobs(remat="none")) is None
    assert TE.variant(inf, "cfg2_context", Knobs(options="libtpu_default")).layout \
        .compiler_options == {}


def test_the_tuned_cells_report_and_readme_sentence_read_a_cell(tmp_path):
    import json

    from benchmarks.tuned_cells_report import cell_line, tuning_lines
    from benchmarks.update_readme import tuned_cells_text

    cell = {"cell": "m_w_t", "compiles": 4, "budget_s": 1800, "git": {"git_commit": "ab" * 20},
            "rows": [{"name": "aoizora", "sim_step_s": 0.10},
                     {"name": "expert:a", "sim_step_s": 0.15},
                     {"name": "best-tuned-expert", "sim_step_s": 0.12, "expert": "a",
                      "knobs": "remat none, blocks shard, options published"},
                     {"name": "best-tuned-expert/solved-placement", "sim_step_s": 0.11}],
            "tuning": [{"name": "a", "gain": 1.25, "untried": [],
                        "published": {"step_s": 0.15}, "trials": [{}, {}],
                        "best": {"step_s": 0.12, "remat": "none", "blocks": "shard",
                                 "options": "published"}}]}
    d = tmp_path / "grid_tuned"
    d.mkdir()
    (d / "m_w_t.json").write_text(json.dumps(cell))
    line = cell_line(cell)
    assert "| 1.200x |" in line and "| 1.500x |" in line and "| 1.100x |" in line
    assert tuned_cells_text([d]) == (
        "Re-run with them and a compile budget, 1 cell(s) only (`tuned_cells.md`, simulated): "
        "m_w_t: the plan 1.200x over the best tuned expert, 1.500x over the best as published.")
    assert tuned_cells_text([tmp_path / "none"]) == "No cell has been re-run with them."
    assert tuning_lines(cell) == ["- a: as published 150 ms; best 120 ms with remat none, "
                                  "blocks shard, options published (1.250x from tuning); 2 "
                                  "setting(s) priced"]
