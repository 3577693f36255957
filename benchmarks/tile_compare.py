"""Two tile choices for one layout, compiled and priced by Q2 with the splash kernel model.

Cell (default; ``--cell MODEL WORKLOAD TARGET`` for another): Wan 2.1 1.3B, 480p-81f, v5e-8;
layout: the expert cfg2_context (data 2 x context 4), in
JAX's default device order. Compiled ahead of time by libtpu three times (no TPU is run), each
with libtpu's default options (the tiles are the only difference):
- ``automatic``: the layout without tiles (``splash_blocks``: 128);
- ``published``: maxdiffusion's published tiles scaled to the per-shard lengths
  (``kernels.recipes.published_tiles``, as the expert carries them);
- ``chosen``: the layout after ``aoizora.kernels.tiles.choose_tiles`` (kernel-model tiles per
  attention node, the compile as its feasibility check).
Each is priced by Q2 (``formulation.latency.predict_step``), whose compute term prices every
splash call with ``formulation.kernel_model`` at the tiles and per-shard shapes read off the
compiled kernel, and by the independent simulator (``benchmarks.simulator`` with the compiled
HLO: its own compute and splash models, ``benchmarks/sim/``, nothing from ``formulation/``).
Seconds are PREDICTIONS of those models.

Run: ``python -m benchmarks.tile_compare`` (three compiles, a few minutes on 2 cores) ->
``benchmarks/results/tile_compare_<model>_<workload>_<target>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import aoizora  # noqa: F401  (libtpu environment first)

from aoizora.extract.aot_compile import CompileError
from aoizora.extract.evidence import attention_node_of
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import MODEL, predict_step
from aoizora.formulation.op_time import op_seconds
from aoizora.models.experts import expert_layouts
from aoizora.extract.aot_compile import target_mesh
from aoizora.extract.compiled_evidence import evidence_from_compiled
from aoizora.runtime.realize import realize
from aoizora.kernels.tiles import choose_tiles
from benchmarks.machine import git_state, machine_info, machine_line, write_results
from benchmarks.simulator import LABEL as SIM_LABEL, Simulator

CELL = ("wan2.1-1.3b", "480p-81f", "v5e-8")
EXPERT = "cfg2_context"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def kernel_rows(ev, network: Network) -> list[dict[str, Any]]:
    """Per splash kernel op: its node, tiles, shapes, runs and Q2 seconds per run."""
    out = []
    for op in ev.compute:
        if op.kernel:
            out.append({"node": attention_node_of(op.op_name), **op.kernel, "count": op.count,
                        "seconds_per_run": op_seconds(op, ev, network)})
    return out


def compile_with_hlo(fn, args, tgt, layout, order):
    """(Evidence, compiled HLO text) of ``layout`` realized on the target in ``order``: the
    planner's compile (``candidate_pricing.compile_layout``) that also keeps the HLO, so that the
    independent simulator can price it. Raises CompileError as that compile does."""
    import jax
    import time

    mesh = target_mesh(tgt, layout.mesh_axes, list(order))
    r = realize(fn, args, layout, mesh)
    t0 = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = r.fn.lower(*r.args).compile(compiler_options=layout.compiler_options or None)
    except Exception as err:  # noqa: BLE001 -- the compiler's verdict, as compile_evidence words it
        raise CompileError(f"XLA cannot compile for {tgt.name}: {str(err).splitlines()[0]}") from err
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh, compile_s=time.perf_counter() - t0)
    return ev, compiled.as_text()


def run(model: str, workload: str, target: str) -> list[dict[str, Any]]:
    e = next(x for x in expert_layouts(model, workload, target) if x.name == EXPERT)
    tgt = get_target(target)
    network = Network.from_target(tgt)
    order = default_device_order(tgt, e.layout.mesh_axes)
    plain = dataclasses.replace(e.layout, compiler_options={}, attention={
        k: dataclasses.replace(a, block_q=None, block_kv=None, block_kv_compute=None)
        for k, a in e.layout.attention.items()})
    published = dataclasses.replace(e.layout, compiler_options={})
    compiled = {}

    def check(layout):           # the compiler's verdict on the chosen tiles; its evidence kept
        compiled["chosen"] = compile_with_hlo(e.fn, e.args, tgt, layout, order)

    chosen = choose_tiles(plain, build_ir(e.fn, *e.args), tgt, check=check)
    rows = []
    for label, layout in (("automatic", plain), ("published", published), ("chosen", chosen)):
        try:
            ev, hlo = compiled.get(label) or compile_with_hlo(e.fn, e.args, tgt, layout, order)
        except CompileError as err:      # the compiler's verdict on these tiles
            rows.append({"tiles": label, "error": str(err).splitlines()[0][:300],
                         "attention": {k: a.to_json() for k, a in layout.attention.items()},
                         "kernels": []})
            print(rows[-1], flush=True)
            continue
        q2 = predict_step(ev, order, network)
        sim = Simulator(tgt).run(ev, order, hlo=hlo)
        rows.append({"tiles": label, "step_s": q2.step_s, "compute_s": q2.compute_s,
                     "sim_step_s": sim.step_s, "sim_compute_s": sim.compute_s,
                     "communication_s": q2.communication_s, "latency_s": q2.latency_s,
                     "fits_hbm": ev.memory.fits, "compile_s": round(ev.compile_s, 1),
                     "attention": {k: a.to_json() for k, a in layout.attention.items()},
                     "kernels": kernel_rows(ev, network)})
        print({k: v for k, v in rows[-1].items() if k != "kernels"}, flush=True)
    return rows


def write(doc: dict[str, Any], out_dir: str = RESULTS) -> None:
    model, workload, target = doc["cell"]
    lines = [f"# Splash tiles: two choices for one layout ({model} {workload} {target}, "
             f"{EXPERT})", "",
             f"Step latency predicted by {MODEL}, whose compute term prices each splash kernel "
             f"with `formulation/kernel_model.py` at the tiles and per-shard shapes of the "
             f"compiled kernel; programs compiled ahead of time by libtpu (no TPU was run), "
             f"JAX's default device order, libtpu's default options in every row. Generated by "
             f"`python -m benchmarks.tile_compare`.",
             "", machine_line(doc), "",
             f"Simulated: {SIM_LABEL}, given the compiled HLO (its own compute and splash models).",
             "",
             "| tiles | Q2 step ms | Q2 compute ms | Q2 exposed communication ms | simulated step ms "
             "| simulated compute ms | fits HBM |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['tiles']} | does not compile: {r['error'][:120]} | | | | | |")
            continue
        lines.append(f"| {r['tiles']} | {1e3 * r['step_s']:.2f} | {1e3 * r['compute_s']:.2f} "
                     f"| {1e3 * r['communication_s']:.2f} | {1e3 * r['sim_step_s']:.2f} "
                     f"| {1e3 * r['sim_compute_s']:.2f} | {r['fits_hbm']} |")
    lines += ["", "Splash kernels (per run, kernel model):", "",
              "| tiles | node | block_q / block_kv / block_kv_compute | lead x Lq x Lkv x D | "
              "runs | ms per run |", "|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for k in r["kernels"]:
            lines.append(f"| {r['tiles']} | {k['node']} | {k['block_q']} / {k['block_kv']} / "
                         f"{k['block_kv_compute']} | {k['lead']} x {k['lq']} x {k['lkv']} x "
                         f"{k['head_dim']} | {k['count']} | {1e3 * k['seconds_per_run']:.3f} |")
    write_results(out_dir, result_name(doc["cell"]), doc, lines)


def result_name(cell) -> str:
    return "tile_compare_" + "_".join(cell)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=RESULTS, help="directory for the .json and .md results")
    ap.add_argument("--cell", nargs=3, default=list(CELL), metavar=("MODEL", "WORKLOAD", "TARGET"))
    a = ap.parse_args(argv)
    doc = {"machine": machine_info(), "git": git_state(), "cell": list(a.cell), "expert": EXPERT}
    doc["rows"] = run(*a.cell)
    doc["machine_end"] = machine_info()
    write(doc, a.out)
    print(open(os.path.join(a.out, result_name(a.cell) + ".md")).read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
