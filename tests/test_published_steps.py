"""The published-steps benchmark rebuilds a recipe's splash blocks the way its helper picks them,
and reports the measured run per step as an upper bound."""

import warnings

from aoizora.builtin import builtin_job
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.kernels.tiles import attention_shapes
from aoizora.models.experts import expert_layouts
from benchmarks.published_steps import CASES, PAIRS, I2V_27B_V6E_BLOCKS, recipe_tiled, report


def _small_expert():
    job = builtin_job("wan2.1-small", "128p", 9, "v5e-8")
    ex = next(e for e in expert_layouts(job.model, job.workload, job.target)
              if e.name == "cfg2_context")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ir = build_ir(ex.fn, *ex.args)
    return ex, ir


def test_self_attention_takes_the_recipe_blocks_and_cross_attention_its_short_key_blocks():
    ex, ir = _small_expert()
    laid = recipe_tiled(ex.layout, ir, I2V_27B_V6E_BLOCKS)
    shapes = attention_shapes(ir)
    selfs = [k for k, s in shapes.items() if s.q_len == s.kv_len]
    cross = [k for k, s in shapes.items() if s.q_len != s.kv_len]
    assert selfs and cross
    for k in selfs:
        a = laid.attention_for(k)
        assert (a.block_q, a.block_kv, a.block_kv_compute) == (3024, 2048, 1024)
    for k in cross:
        a, kv = laid.attention_for(k), -(-shapes[k].kv_len // 128) * 128
        assert (a.block_q, a.block_kv, a.block_kv_compute) == (3024, kv, kv)
        assert a.seq == ex.layout.attention_for(k).seq      # the layout itself is unchanged


def test_the_report_bounds_a_step_by_the_run_and_differences_pairs():
    rows = []
    for i, c in enumerate(CASES[:2]):
        rows.append({"name": c.name, "expert": c.expert, "hardware": c.hardware,
                     "rebuilt_as": c.rebuilt_as, "source": c.source,
                     "configuration": c.configuration, "step_bound_s": c.step_bound_s,
                     "q2": {"step_s": 9.0 + i, "compute_attention_s": 7.0,
                            "compute_other_s": 1.0, "communication_s": 1.0},
                     "sim": {"step_s": 6.0 + i, "communication_s": 0.5,
                             "compute_by_kind": {}, "collectives": {}}})
    doc = {"machine": {"cpus": 2, "cpu": "x", "jax": "0", "date": "d"},
           "git": {"git_commit": "abc"}, "cases": rows, "pairs": [list(PAIRS[0])]}
    md = "\n".join(report(doc))
    assert CASES[0].step_bound_s == 285.56 / 40
    assert "| <= 7,139 | 9,000 | 6,000 | over by 26.1% | within |" in md   # flash: Q2 over, sim within
    meas = (CASES[1].step_bound_s - CASES[0].step_bound_s) * 1e3
    assert f"| {meas:+,.0f} | +1,000 | +1,000 |" in md


def test_a_measured_denoising_step_is_compared_as_a_measurement_not_a_bound():
    v7x = next(c for c in CASES if c.target == "v7x-8")
    assert v7x.denoise_only and v7x.step_bound_s == 3.10
    assert dict(v7x.options)["xla_tpu_scoped_vmem_limit_kib"] == 65536
    row = {"name": v7x.name, "expert": v7x.expert, "hardware": v7x.hardware,
           "rebuilt_as": v7x.rebuilt_as, "source": v7x.source, "configuration": v7x.configuration,
           "step_bound_s": v7x.step_bound_s, "denoise_only": True,
           "q2": {"step_s": 3.41, "compute_attention_s": 2.0, "compute_other_s": 1.0,
                  "communication_s": 0.41},
           "sim": {"step_s": 2.79, "communication_s": 0.1, "compute_by_kind": {},
                   "collectives": {}}}
    doc = {"machine": {"cpus": 2, "cpu": "x", "jax": "0", "date": "d"},
           "git": {"git_commit": "abc"}, "cases": [row], "pairs": []}
    md = "\n".join(report(doc))
    assert "| 3,100 | 3,410 | 2,790 | +10.0% | -10.0% |" in md
