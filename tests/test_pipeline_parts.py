"""The parts of a published run outside the DiT (``benchmarks/pipeline_parts.py``): a tiny VAE
decoder on the meta device is priced with the convolution FLOPs torch's own flop counter
reports, its group norms, upsamplings and paddings by their HBM bytes (not zero); the tiling
follows the publishers' code; the whole-run prediction adds up."""

from __future__ import annotations

import collections

import pytest

from benchmarks.pipeline_parts import NEGLIGIBLE, VAES, encoder_estimate, tiles


@pytest.mark.parametrize("family,shape", [("hunyuanvideo", (1, 4, 3, 8, 8)),
                                          ("flux", (1, 4, 8, 8)),
                                          ("cogvideox", (1, 4, 2, 8, 8)),
                                          ("sana", (1, 4, 8, 8))])
def test_tiny_decoder_priced_from_its_graph(family, shape):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    from torch.utils.flop_counter import FlopCounterMode

    from aoizora.extract.network import Network
    from aoizora.formulation.op_time import op_seconds
    from benchmarks.gpu_validation import box_target
    from benchmarks.pipeline_parts import decoder_module, tile_evidence

    tgt = box_target("h100", 1)
    ev, _ = tile_evidence(family, shape, tgt, small=True)
    with torch.device("meta"):
        mod, dtype = decoder_module(family, small=True)
        with FlopCounterMode(display=False) as fc:
            mod(torch.randn(shape, dtype=dtype))
    counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
    conv = sum(o.flops * o.count for o in ev.compute
               if o.kind == "dot" and o.name.startswith("conv"))
    assert conv > 0 and conv == pytest.approx(counts["aten.convolution"])
    matmul = sum(o.flops * o.count for o in ev.compute if o.kind in ("dot", "attention"))
    assert matmul == pytest.approx(fc.get_total_flops())
    net = Network.from_target(tgt)
    by = collections.defaultdict(float)
    for o in ev.compute:
        by[o.name.rstrip("0123456789").rstrip("_")] += op_seconds(o, ev, net) * o.count
    norm = "group_norm" if family != "sana" else "pow"       # DC-AE: an RMSNorm, eager ops
    up = {"hunyuanvideo": "upsample_nearest3d", "cogvideox": "upsample_nearest3d"}.get(
        family, "upsample_nearest2d")
    assert by[norm] > 0 and by[up] > 0 and by["silu"] > 0
    if family == "hunyuanvideo":
        assert by["pad"] > 0                                  # causal replicate padding


def test_tiles_follow_the_publishers_code():
    hy = tiles("hunyuanvideo-720p")        # 33 latent frames: 17, 17, 9; 90 x 160: 4 x 7
    assert sum(hy.values()) == 3 * 4 * 7
    assert {s[2] for s in hy} == {17, 9} and max(s[3] for s in hy) == 32
    assert sum(tiles("hunyuanvideo-960").values()) == 3 * 5 * 5
    cog = tiles("cogvideox-5b")
    assert cog == collections.Counter({(1, 16, 3, 60, 90): 1, (1, 16, 2, 60, 90): 5})
    assert sum(s[2] * n for s, n in cog.items()) == VAES["cogvideox-5b"].latents[2]
    assert sum(tiles("sana-1600m-4k").values()) == 100
    assert tiles("flux-dev-1024") == collections.Counter({(1, 16, 128, 128): 1})


def test_encoders_are_an_estimate_under_one_percent():
    e = encoder_estimate("flux-dev-1024", 989.4e12, 3.35e12)
    # T5-XXL 4.76B x 256 tokens: 2.4 TFLOP at 989 TFLOP/s = 2.5 ms < 9.5 GB / 3.35 TB/s = 2.8 ms
    assert e["encoders_estimate_s"] == pytest.approx(2 * 4.76e9 / 3.35e12 + 2 * 123e6 / 3.35e12)
    assert e["encoders_estimate_s"] < NEGLIGIBLE * 1.63      # the fastest FLUX run, 1.63 s


def test_whole_run_adds_up():
    from benchmarks.gpu_validation import table

    rec = {"source": "https://example.org/x", "states": "x", "gpu": "h100", "gpus": 1,
           "model": "flux-dev-1024", "config": {}, "steps": 50, "measured_s": 100.0,
           "same_gpu": True, "exact_model": True, "note": "", "xdit_config": "xdit:single",
           "target": "t", "step_s": 1.5, "compute_s": 1.5, "communication_s": 0.0,
           "repo_layout_step_s": 1.5, "fits_hbm": True, "xdit_collectives_step_s": 1.5,
           "fallbacks": [], "vae_decode_s": 2.0, "encoders_estimate_s": 0.1, "vae_calls": 1,
           "vae_flops": 1e13, "vae_dot_flops": 9e12, "vae_bytes": 4e10, "vae_note": "whole",
           "vae_source": "https://example.org/vae", "encoders": "T5"}
    big = dict(rec, encoders_estimate_s=1.0, gpus=2, measured_s=50.0, step_s=0.75)
    t = table([rec, big])
    small_enc, with_enc = t["rows"]
    assert small_enc["predicted_run_s"] == pytest.approx(50 * 1.5 + 2.0)     # 0.1 s: < 1%
    assert not small_enc["encoders_added"]
    assert small_enc["run_error"] == pytest.approx(-0.23)
    assert with_enc["encoders_added"] and with_enc["predicted_run_s"] == pytest.approx(40.5)
    assert t["median_abs_error_is"] == "whole run"
    assert t["median_abs_error"]["headline"] == (pytest.approx((0.23 + 0.19) / 2), 2)
    assert t["median_abs_step_bound_error"]["headline"][0] == pytest.approx(0.25)
    assert with_enc["speedup_of"] == "whole run"
    assert with_enc["speedup_predicted"] == pytest.approx(77.0 / 40.5)
    from benchmarks.gpu_validation import markdown

    md = markdown({"table": t, "git": {"git_commit": "abc", "git_modified_files": []},
                   "machine": {"date": "d"}, "models": {}})
    head = next(line for line in md if "(headline)" in line)
    assert head.startswith("- Median |error| (whole run)") and "**21.0%** over 2 rows" in head
    assert any("| 77.00 (50 x 1.500 + 2.00) | -23.0% | 2.00 |" in line for line in md)
    assert any(line.startswith("| flux-dev-1024 | H100 | 2.000 | 1 |") for line in md)


def test_execution_modes_views_free_pointwise_fused():
    pytest.importorskip("torch")     # the op-name tables of the torch frontend
    import dataclasses

    from aoizora.extract.evidence import ComputeOp
    from benchmarks.gpu_validation import execution_modes

    @dataclasses.dataclass
    class Ev:
        compute: list

    ops = [ComputeOp("linear_1", "dot", None, 1e12, 1e9), ComputeOp("view_3", "elementwise", None,
                                                                   1e6, 4e8),
           ComputeOp("add_2", "elementwise", None, 1e6, 6e8),
           ComputeOp("layer_norm", "elementwise", None, 1e6, 4e8),
           ComputeOp("sdpa", "attention", 5e5, 1e12, 1e8)]
    m = execution_modes(Ev(ops))
    assert m["kernels"] == 4                                  # the view launches nothing
    unf = {o.name: o.bytes for o in m["unfused"].compute}
    fus = {o.name: o.bytes for o in m["fused"].compute}
    assert unf == {"linear_1": 1e9, "view_3": 0.0, "add_2": 6e8, "layer_norm": 4e8, "sdpa": 1e8}
    assert fus == dict(unf, add_2=0.0)                       # pointwise folded, the norm kept
