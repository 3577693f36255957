"""Whole-step figures of public recipes, measured by their publishers on named TPUs, against Q2 and
the reference simulator on the same configuration rebuilt here.

    python -m benchmarks.published_steps            # compile, price, write results/published_steps.*

Each ``Published`` case is one measured run: its publisher, source, hardware and configuration,
and the time measured (a whole run of ``steps`` denoising steps: text encoding and VAE decoding
included, so ``measured_run_s / steps`` is an UPPER BOUND of one DiT step). Rebuilt here as the
builtin job (``model``, ``resolution``, ``frames``, ``target``) under the expert configuration
that runs the recipe's layout (``aoizora.models.experts``), with the recipe's own splash blocks
(``tiles``: self-attention; cross-attention gets the blocks the recipe's helper derives for a
short key sequence) in place of our shard-sized ones, and its published libtpu options; compiled
ahead of time by libtpu for the target in JAX's default device order, then priced by Q2
(``formulation.latency``, the planner's model) and by the simulator (``benchmarks.simulator``).

A pair (``PAIRS``) is two cases of the same run but for one setting: the difference of their
measured times, divided by the steps, is a DiT-only figure (everything else is the same), so it
is compared with the models' step differences directly.

Nothing ran on a TPU here: every model figure is a prediction (Q2) or a simulation (simulator) of
the compiled program; the measured figures are the publisher's.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import aoizora  # noqa: F401  -- sets libtpu's environment first
from aoizora.builtin import builtin_job
from aoizora.extract.aot_compile import keeping_hlo, read_hlo
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network, default_device_order
from aoizora.kernels.recipes import MAXDIFFUSION_OPTIONS
from aoizora.kernels.tiles import attention_shapes
from aoizora.models.experts import expert_layouts
from aoizora.planning.candidate_pricing import compile_layout
from benchmarks.machine import git_state, machine_info, machine_line, write_results
from benchmarks.q1_fidelity_collect import q2_terms, sim_terms
from benchmarks.simulator import LABEL as SIM_LABEL, Simulator

RESULTS = Path(__file__).resolve().parent / "results"
PR376 = "https://github.com/AI-Hypercomputer/maxdiffusion/pull/376"
# maxdiffusion's src/maxdiffusion/configs/base_wan_i2v_27b.yml: flash_block_sizes (the default),
# and the set commented "Use on v6e" there (block_q 3024, block_kv 2048, block_kv_compute 1024)
I2V_27B_BLOCKS = {"block_q": 1024, "block_kv": 1024, "block_kv_compute": 256}
I2V_27B_V6E_BLOCKS = {"block_q": 3024, "block_kv": 2048, "block_kv_compute": 1024}


@dataclasses.dataclass(frozen=True)
class Published:
    name: str
    source: str
    hardware: str
    configuration: str
    model: str
    resolution: str
    frames: int
    target: str
    expert: str
    tiles: dict[str, int]
    measured_run_s: float
    steps: int
    rebuilt_as: str
    pad_block: int = 1      # the program pads its sequence to pad_block x (sequence degree)
    # True: ``measured_run_s`` is the publisher's denoising loop alone (no text encoding, no VAE),
    # so per step it is a measured DiT step (and the scheduler's update), not a bound
    denoise_only: bool = False
    options: tuple = ()     # (name, value) libtpu options of the recipe, for this compile only

    @property
    def step_bound_s(self) -> float:
        """The measured run per step (seconds): an upper bound of one DiT step for a whole run,
        the measured step itself when ``denoise_only``."""
        return self.measured_run_s / self.steps


_WAN22 = dict(source=f"maxdiffusion PR #376 ({PR376}), Performance, TPU v6e, Wan2.2 I2V, "
                     "global batch size 1",
              hardware="8x TPU v6e (v6e-8)",
              model="wan2.1-14b", resolution="720p", frames=81, target="v6e-8", steps=40)
_REBUILT = ("Wan 2.1 14B 720p-81f denoising step, CFG pair (batch 2): the transformer of each "
            "Wan2.2 A14B expert (same blocks, heads, widths; the I2V patch embedding's 20 extra "
            "input channels are not rebuilt); the sequence unpadded (75,600 tokens), each shard's "
            "queries and keys padded to the blocks inside the attention, as maxdiffusion's "
            "_pad_data_for_flash does; splash blocks of base_wan_i2v_27b.yml, {which} (the PR "
            "does not list the ones it ran)")
_MEASURED = {"cfg2_context": ("flash", 285.56), "cfg2_ulysses": ("ulysses", 251.45)}


def _cases() -> tuple[Published, ...]:
    out = []
    for which, tiles in (("its default", I2V_27B_BLOCKS), ("its 'Use on v6e' set",
                                                          I2V_27B_V6E_BLOCKS)):
        for expert, (attn, run_s) in _MEASURED.items():
            out.append(Published(
                name=f"maxdiffusion {attn}, dp2 x cp4, blocks {tiles['block_q']}/"
                     f"{tiles['block_kv']}/{tiles['block_kv_compute']}",
                expert=expert, tiles=tiles, measured_run_s=run_s,
                configuration=f"Wan-AI/Wan2.2-I2V-A14B-Diffusers, dp=2 cp=4, attention={attn}, "
                              "40 steps, 81 frames, 720x1280",
                rebuilt_as=_REBUILT.format(which=which), **_WAN22))
    return tuple(out)


PR436 = "https://github.com/AI-Hypercomputer/maxdiffusion/pull/436"
# maxdiffusion's v7x recipe flags (end_to_end/tpu/run_wan_fast_inference.sh) that matter to the
# rebuilt program: its scoped VMEM limit (the kernel's blocks need it) and the async-collective
# options maxdiffusion's configs share (aoizora.kernels.recipes.MAXDIFFUSION_OPTIONS)
V7X_OPTIONS = tuple({**MAXDIFFUSION_OPTIONS, "xla_tpu_scoped_vmem_limit_kib": 65536}.items())


def _v7x_cases() -> tuple[Published, ...]:
    """maxdiffusion PR #436's v7x-8 row with its tiles (denoising s/step, as published)."""
    return (Published(
        name="maxdiffusion ulysses_custom, cp8, CFG batch folded, blocks 8448/1024",
        source=f"maxdiffusion PR #436 ({PR436}), Results, WAN2.2-A14B 720p 81 frames CFG on, "
               "v7x-8 (CP8 pure Ulysses), row '+ tile bq8448/bkv1024'",
        hardware="4 chips of TPU v7x (v7x-8: 8 TensorCores)",
        configuration="WAN2.2-A14B, 720p, 81 frames, CFG on, context parallel 8 (pure Ulysses), "
                      "attention ulysses_custom, CFG batch folded into heads, block_q 8448, "
                      "block_kv 1024; 3.10 s/step (denoise)",
        model="wan2.1-14b", resolution="720p", frames=81, target="v7x-8", expert="ulysses",
        tiles={"block_q": 4224, "block_kv": 1024, "block_kv_compute": 1024},
        measured_run_s=3.10, steps=1, denoise_only=True, options=V7X_OPTIONS,
        rebuilt_as="Wan 2.1 14B 720p-81f denoising step, CFG pair (batch 2) on every device, "
                   "Ulysses over the 8 devices (our `ulysses` expert: splash, not maxdiffusion's "
                   "ulysses_custom kernel; batch not folded into heads), the sequence unpadded "
                   "(75,600 tokens), libtpu's scoped VMEM raised to 64 MiB as the recipe does; "
                   "block_q 4224, half the recipe's 8448 (the same padding, 76,032 rows): at "
                   "8448 jax's splash kernel needs 79.22M of VMEM, libtpu says, over the 64M "
                   "there are), block_kv 1024, block_kv_compute 1024 (the recipe script's)"),)


CASES = _cases() + _v7x_cases()
# (a, b): the same run but for one setting (the v6e flash / Ulysses runs)
PAIRS = tuple((CASES[i + 1].name, CASES[i].name) for i in range(0, 4, 2))


def recipe_tiled(layout, ir, tiles: dict[str, int]):
    """``layout`` with the recipe's blocks on every attention node of ``ir``: ``tiles`` where
    queries and keys are equally long (self-attention), else maxdiffusion's helper's choice for
    a short key sequence (block_q as configured; block_kv = block_kv_compute = the key length
    rounded up to 128, at most that length padded)."""
    attention = dict(layout.attention)
    for key, s in attention_shapes(ir).items():
        al = layout.attention_for(key)
        if s.q_len == s.kv_len:
            attention[key] = al.with_tiles(**tiles)
        else:
            kv = -(-s.kv_len // 128) * 128
            attention[key] = al.with_tiles(block_q=tiles["block_q"], block_kv=kv,
                                           block_kv_compute=kv)
    return dataclasses.replace(layout, attention=attention)


def price_case(case: Published) -> dict[str, Any]:
    """Compile the rebuilt case and price it by Q2 and the simulator (seconds per step)."""
    job = builtin_job(case.model, case.resolution, case.frames, case.target)
    ex = next(e for e in expert_layouts(job.model, job.workload, job.target,
                                        block=case.pad_block) if e.name == case.expert)
    if not ex.valid:
        return {"error": f"expert {case.expert} not valid: {ex.reason}"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ir = build_ir(ex.fn, *ex.args)
    layout = recipe_tiled(ex.layout, ir, case.tiles)
    if case.options:
        layout = dataclasses.replace(layout, compiler_options={
            **layout.compiler_options, **dict(case.options)})
    order = default_device_order(job.target, layout.mesh_axes)
    net = Network.from_target(job.target)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, keeping_hlo(tmp):
        ev = compile_layout(ex.fn, ex.args, job.target, layout, order)
        text = read_hlo(ev)
        module = parse_hlo_module(text) if text is not None else None
    out = {"compile_s": round(time.perf_counter() - t0, 1), "fits_hbm": bool(ev.memory.fits),
           "layout": layout.to_json(), "device_order": list(order),
           "q2": q2_terms(ev, order, net),
           "sim": sim_terms(Simulator(job.target, net), ev, order, module)}
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f}"


def _against(pred: float | None, row: dict[str, Any]) -> str:
    """A model's step against the row's measured figure: its signed error for a measured step;
    for an upper bound, "within" or how far over."""
    if pred is None:
        return "-"
    err = pred / row["step_bound_s"] - 1
    if row.get("denoise_only"):
        return f"{err * 100:+.1f}%"
    return "within" if err <= 0 else f"over by {err * 100:.1f}%"


def report(doc: dict[str, Any]) -> list[str]:
    rows = {r["name"]: r for r in doc["cases"]}
    md = ["# Whole steps of public recipes: measured by their publishers, against Q2 and the "
          "simulator", "", machine_line(doc), "",
          "Generated by `python -m benchmarks.published_steps`. Measured: the publisher's figure "
          "on its TPU: either a whole run divided by its steps (text encoding and VAE decoding "
          "included, so an **upper bound** of one DiT step, marked <=), or the publisher's own "
          "per-step time of the denoising loop (a measured step). Q2: predicted by "
          "AoiZora's Q2 link-load model; sim: " + SIM_LABEL + "; both on the program libtpu "
          "compiled here, ahead of time, for the rebuilt configuration. No TPU ran here. "
          "ms per denoising step.", "",
          "| case | hardware | measured | Q2 | sim | Q2 against it | sim against it | "
          "rebuilt as |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["cases"]:
        q2, sim = r.get("q2", {}).get("step_s"), r.get("sim", {}).get("step_s")
        step = "" if r.get("denoise_only") else "<= "
        md.append(f"| {r['name']} ({r['expert']}) | {r['hardware']} | "
                  f"{step}{_ms(r['step_bound_s'])} | {_ms(q2)} | {_ms(sim)} | "
                  f"{_against(q2, r)} | {_against(sim, r)} | "
                  f"{r.get('error') or r['rebuilt_as']} |")
    md += ["", "Pairs: the same run but for one setting; the measured difference per step is "
           "DiT-only.", "", "| pair | measured (ms/step) | Q2 (ms/step) | sim (ms/step) |",
           "|---|---|---|---|"]
    for a, b in doc["pairs"]:
        ra, rb = rows[a], rows[b]
        meas = ra["step_bound_s"] - rb["step_bound_s"]
        dq = ra["q2"]["step_s"] - rb["q2"]["step_s"] if "q2" in ra and "q2" in rb else None
        ds = ra["sim"]["step_s"] - rb["sim"]["step_s"] if "sim" in ra and "sim" in rb else None
        md.append(f"| {a} - {b} | {meas * 1e3:+,.0f} | "
                  f"{'-' if dq is None else f'{dq * 1e3:+,.0f}'} | "
                  f"{'-' if ds is None else f'{ds * 1e3:+,.0f}'} |")
    md += ["", "Terms (ms per step): Q2 compute (attention / the rest) and exposed communication; "
           "the simulator's compute by kind and its exposed communication by collective kind.",
           "", "| case | Q2 attention | Q2 other | Q2 comm | sim attention | sim mxu-bound | "
           "sim hbm-bound | sim comm | sim all-gather | sim all-to-all |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["cases"]:
        if "q2" not in r:
            continue
        q, s = r["q2"], r["sim"]
        k, c = s.get("compute_by_kind", {}), s.get("collectives", {})
        md.append(f"| {r['name']} | {_ms(q['compute_attention_s'])} | "
                  f"{_ms(q['compute_other_s'])} | {_ms(q['communication_s'])} | "
                  f"{_ms(k.get('attention forward'))} | {_ms(k.get('mxu-bound ops'))} | "
                  f"{_ms(k.get('hbm-bound ops'))} | {_ms(s['communication_s'])} | "
                  f"{_ms(c.get('all-gather', {}).get('exposed_s'))} | "
                  f"{_ms(c.get('all-to-all', {}).get('exposed_s'))} |")
    md += ["", "Sources:"] + sorted({f"- {r['name']}: {r['source']}; {r['configuration']}"
                                     for r in doc["cases"]})
    return md


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS), help="results directory")
    a = ap.parse_args(argv)
    doc: dict[str, Any] = {"machine": machine_info(), "git": git_state(),
                           "labels": {"q2": "predicted (Q2)", "sim": SIM_LABEL,
                                      "measured": "measured by the publisher"},
                           "unit": "seconds per denoising step", "cases": [],
                           "pairs": [list(p) for p in PAIRS]}
    for case in CASES:
        row = {**dataclasses.asdict(case), "step_bound_s": case.step_bound_s}
        try:
            row.update(price_case(case))
        except Exception as e:  # noqa: BLE001 -- recorded in the row
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        doc["cases"].append(row)
        print(f"{case.name}: measured {'' if case.denoise_only else '<= '}"
              f"{case.step_bound_s * 1e3:,.0f} ms, "
              f"Q2 {_ms(row.get('q2', {}).get('step_s'))} ms, "
              f"sim {_ms(row.get('sim', {}).get('step_s'))} ms {row.get('error', '')}", flush=True)
    write_results(a.out, "published_steps", doc, report(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
