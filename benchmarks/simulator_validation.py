"""The reference simulator against public *measured* TPU figures (not formulas).

Each case is a public measurement: its source, the chip and slice, the program, the measured time.
The same program (shapes, dtypes, sharding, kernel block sizes) is built here, compiled ahead of
time by libtpu for the same slice, and its compiled HLO and evidence are simulated
(``Simulator.run(evidence, hlo=...)``: the simulator's own compute model, no compiler estimate).
Error = (simulated - measured) / measured.

Honesty rules (issue 34): three constants are fitted, each on one figure, and those rows are shown
but left out of the statistics (``fitted``: True):
- the per-grid-step overhead of Pallas kernels (``benchmarks.sim.constants``), on the Pallas
  128-block 4096^3 matmul;
- ``XLA_MXU_EFFICIENCY`` (``benchmarks.sim.constants``), the sustained fraction of MXU peak of
  an XLA matmul, on the XLA 8192^3 matmul;
- ``HOST_DISPATCH_S``, the host's cost of dispatching one jitted call, which figures taken with
  a Python timer (timeit / perf_counter around ``block_until_ready``) include and a device
  simulator does not model: on the XLA 1024^3 matmul (measured 119.4 us, simulated device time
  11.2 us). It is added to the simulated time of every timer-measured row (``timer``: True) for
  the comparison only; profiled figures (the scaling book's) get nothing added.

Run: ``python -m benchmarks.simulator_validation`` -> ``benchmarks/results/simulator_validation
.json`` and ``.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
from typing import Any, Callable

import aoizora  # noqa: F401  (libtpu environment first)
from benchmarks.machine import machine_info
from benchmarks.simulator import LABEL, Simulator
from aoizora.extract.atomic_io import atomic_open

RESULTS = os.path.join(os.path.dirname(__file__), "results")
# Host dispatch of one jitted call in a Python-timed measurement: fitted on the XLA 1024^3 matmul
# row (119.43 us measured - 11.2 us simulated device time); see the module docstring.
HOST_DISPATCH_S = 108e-6
MATMUL_DOC = ("JAX docs, Pallas TPU 'Matrix Multiplication' guide, measured outputs in "
              "github.com/jax-ml/jax docs/pallas/tpu/matmul.ipynb (TPU v5e, timeit of 100 calls)")
AXLEARN = ("apple/axlearn axlearn/common/flash_attention/tpu_attention_benchmark.py, 'Sample "
           "outputs: (v5p)' (commit c40b39a5, PR #908): flash_fwd, batch 2, seq 8192, block 512, "
           "causal sliding window 1024, head_dim 128, bf16")
AXLEARN_BWD = ("apple/axlearn axlearn/common/flash_attention/tpu_attention_benchmark.py, 'Sample "
               "outputs: (v5p)' (commit c40b39a5, PR #908): flash_bwd = jit(grad(mean(flash))) "
               "over q, k, v, same configuration as flash_fwd; the backward is splash's fused "
               "kernel (use_fused_bwd_kernel=True in axlearn/common/flash_attention/"
               "tpu_attention.py at that commit)")
BOOK = ("JAX scaling book, chapter 'sharding', Pop Quiz 2 "
        "(jax-ml.github.io/scaling-book/sharding): profiled AllGather on TPU v5e")


@dataclasses.dataclass
class Case:
    name: str
    kind: str                   # "matmul-bound", "attention-bound", "communication-bound"
    source: str
    target: str                 # slice it was measured on
    program: str
    measured_s: float
    build: Callable[[], tuple]  # -> (fn, args, mesh_target, mesh_axes, in/out shardings)
    fitted: bool = False
    note: str = ""
    timer: bool = True          # measured with a Python timer (host dispatch included)


def single_device_mesh(target: str):
    """A one-device mesh on the first device of ``target`` (a single-chip measurement)."""
    import numpy as np
    from jax.sharding import Mesh

    from aoizora.extract.targets import get_target
    return Mesh(np.array(get_target(target).devices()[:1]), ("x",))


def _xla_matmul(n: int):
    import jax.numpy as jnp
    return jnp.matmul, [((n, n), "bf16"), ((n, n), "bf16")], "v5e:1x1", None, None


def pallas_matmul_program(n: int, bm: int, bk: int, bn: int):
    """The Pallas TPU guide's blocked bf16 matmul kernel at n^3 with blocks (bm, bk, bn): an f32
    VMEM accumulator, grid (n/bm, n/bn, n/bk), the k axis innermost ("arbitrary")."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, y_ref, z_ref, acc_ref, *, nsteps):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)
        acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == nsteps - 1)
        def _():
            z_ref[...] = acc_ref[...].astype(z_ref.dtype)

    def mm(x, y):
        return pl.pallas_call(
            functools.partial(kernel, nsteps=n // bk),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=0,
                in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                          pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
                out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
                scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
                grid=(n // bm, n // bn, n // bk)),
            out_shape=jax.ShapeDtypeStruct((n, n), x.dtype),
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary")))(x, y)
    return mm, [((n, n), "bf16"), ((n, n), "bf16")], "v5e:1x1", None, None


def _axlearn_splash(heads: int, backward: bool = False):
    """axlearn's flash benchmark on one v5p chip: the forward (``flash_fwd``) or, with
    ``backward``, ``jit(grad(mean(attention)))`` over q, k, v (``flash_bwd``: the forward saving
    its residuals, then the fused splash backward kernel ``splash_mha_dkv`` computing dq, dk and
    dv, as axlearn's ``tpu_flash_attention`` sets ``use_fused_bwd_kernel=True``: its grid walks
    every (kv block, q block) pair, runs its compute on the blocks the mask keeps, writes a dq
    block per step into ``dq_unreduced`` [kv blocks, heads, T, head_dim], which XLA sums)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as sk, splash_attention_mask as sm)

    B, T, H, bs, W = 2, 8192, 128, 512, 1024

    def f(q, k, v):
        q = q * (H ** -0.5)
        q, k, v = (jnp.einsum("btnh->bnth", a) for a in (q, k, v))
        mask = sm.MultiHeadMask([sm.LocalMask((T, T), (W, 0), 0) for _ in range(heads)])
        # axlearn's block sizes at that commit (tpu_attention.py): the backward is the fused
        # dk/dv kernel, which also computes dq (no dq kernel, no dq block sizes)
        sizes = sk.BlockSizes(block_q=bs, block_kv=bs, block_kv_compute=bs, block_q_dkv=bs,
                              block_kv_dkv=bs, block_kv_dkv_compute=bs, use_fused_bwd_kernel=True)
        kern = sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)
        return jnp.einsum("bnth->btnh", jax.vmap(kern)(q, k, v))
    shape = ((B, T, heads, H), "bf16")
    if backward:
        def g(q, k, v):
            return jax.grad(lambda *a: f(*a).astype(jnp.float32).mean(), argnums=(0, 1, 2))(q, k, v)
        return g, [shape, shape, shape], "v5p:2x2x1", None, None
    return f, [shape, shape, shape], "v5p:2x2x1", None, None


def _book_allgather(e: int, f: int):
    from jax.sharding import PartitionSpec as P

    def g(x):
        return x * 1
    return g, [((e, f), "bf16")], "v5e:4x8", P("Y", None), P(None, None)


def cases() -> list[Case]:
    """Every measured public figure with its source, slice, program and measured time."""
    out = []
    for n, t in ((1024, 119.43e-6), (4096, 827.29e-6), (8192, 6047.15e-6)):
        out.append(Case(f"XLA matmul {n}^3 bf16", "matmul-bound", MATMUL_DOC, "v5e-1",
                        f"jnp.matmul bf16[{n},{n}] x bf16[{n},{n}]", t,
                        functools.partial(_xla_matmul, n), fitted=(n in (1024, 8192)),
                        note={1024: "HOST_DISPATCH_S fitted here",
                              8192: "XLA_MXU_EFFICIENCY fitted here"}.get(n, "")))
    for (bm, bk, bn), figs in (((128, 128, 128), ((1024, 297.67e-6), (4096, 11771.5e-6),
                                                  (8192, 91835.8e-6))),
                               ((512, 1024, 1024), ((1024, 127.09e-6), (4096, 889.09e-6),
                                                    (8192, 6099.43e-6)))):
        for n, t in figs:
            out.append(Case(f"Pallas matmul {n}^3, blocks {bm}/{bk}/{bn}", "matmul-bound",
                            MATMUL_DOC, "v5e-1", f"pallas_call matmul bm={bm} bk={bk} bn={bn}", t,
                            functools.partial(pallas_matmul_program, n, bm, bk, bn),
                            fitted=(bm == 128 and n == 4096),
                            note="per-grid-step overhead fitted here"
                            if (bm == 128 and n == 4096) else ""))
    for heads, t in ((16, 1.4e-3), (40, 3.2e-3), (56, 4.3e-3), (72, 5.5e-3), (88, 6.7e-3),
                     (110, 7.2e-3)):
        out.append(Case(f"splash fwd, {heads} heads (axlearn)", "attention-bound", AXLEARN,
                        "v5p (one chip)", f"transposes + splash_mha_fwd, B=2 T=8192 N={heads} "
                        "H=128, LocalMask(1024, 0), blocks 512", t,
                        functools.partial(_axlearn_splash, heads)))
    for heads, t in ((16, 5.8e-3), (40, 15.2e-3), (56, 20.4e-3), (72, 26.2e-3), (88, 31.3e-3),
                     (110, 37.3e-3)):
        out.append(Case(f"splash fwd+bwd, {heads} heads (axlearn)", "attention-bound", AXLEARN_BWD,
                        "v5p (one chip)", f"jit(grad(mean(splash))) over q, k, v: transposes, "
                        f"splash_mha_fwd_residuals, fused splash_mha_dkv (dq, dk, dv), the dq_unreduced "
                        f"sum; B=2 T=8192 "
                        f"N={heads} H=128, LocalMask(1024, 0), all blocks 512", t,
                        functools.partial(_axlearn_splash, heads, True)))
    out.append(Case("AllGather over Y=4 of bf16[2048,8192] (book)", "communication-bound", BOOK,
                    "v5e 8x4 (mesh X=8, Y=4)", "all-gather of [E_Y, F] over Y, E=2048 F=8192",
                    680e-6, functools.partial(_book_allgather, 2048, 8192), timer=False))
    out.append(Case("AllGather over Y=4 of bf16[256,256] (book)", "communication-bound", BOOK,
                    "v5e 8x4 (mesh X=8, Y=4)", "all-gather of [E_Y, F] over Y, E=F=256", 8e-6,
                    functools.partial(_book_allgather, 256, 256), timer=False,
                    note="latency-bound (32 kB per shard): the book says 'in practice closer to "
                    "8 us'"))
    return out


def run_case(case: Case) -> dict[str, Any]:
    """Compile the case's program for its slice and simulate it with the HLO."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from aoizora.extract.aot_compile import target_mesh
    from aoizora.extract.compiled_evidence import evidence_from_compiled
    from aoizora.extract.targets import get_target

    fn, shapes, target, in_spec, out_spec = case.build()
    tgt = get_target(target)
    if in_spec is None:
        mesh = single_device_mesh(target)
    else:
        mesh = target_mesh(tgt, {"X": 8, "Y": 4})
    dt = {"bf16": jnp.bfloat16, "f32": jnp.float32}
    args = [jax.ShapeDtypeStruct(s, dt[d], sharding=NamedSharding(mesh, in_spec or P()))
            for s, d in shapes]
    kw = {"out_shardings": NamedSharding(mesh, out_spec)} if out_spec is not None else {}
    with jax.set_mesh(mesh):
        compiled = jax.jit(fn, **kw).lower(*args).compile()
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh)
    sim = Simulator(tgt)
    placement = None
    if len(ev.algorithms_device_order) != tgt.num_devices:
        pos = {int(d.id): i for i, d in enumerate(tgt.devices())}
        placement = [pos[int(d.id)] for d in mesh.devices.flat]
    res = sim.run(ev, placement, hlo=compiled.as_text())
    compared = res.step_s + (HOST_DISPATCH_S if case.timer else 0.0)
    err = (compared - case.measured_s) / case.measured_s
    return {"case": case.name, "kind": case.kind, "source": case.source, "slice": case.target,
            "program": case.program, "measured_us": round(case.measured_s * 1e6, 2),
            "simulated_device_us": round(res.step_s * 1e6, 2),
            "host_dispatch_us": round(1e6 * HOST_DISPATCH_S, 1) if case.timer else 0.0,
            "simulated_us": round(compared * 1e6, 2), "error_pct": round(100 * err, 1),
            "fitted": case.fitted, "note": case.note,
            "sim_compute_us": round(res.compute_s * 1e6, 2),
            "sim_notes": [n for n in res.notes if "placement" not in n][:4]}


def splash_tiles() -> list[dict[str, Any]]:
    """The splash model at one shard of Wan 2.1 1.3B 480p-81f self-attention under 8-way
    context parallelism on v5e (q 4,096 of 32,768 padded tokens, kv 32,768, 12 heads, head_dim
    128, batch 2 for CFG), per block size: what the tiles do to the time (simulated)."""
    from benchmarks.sim.kernel_model import splash_time_s
    peak = 4 * 4096 * 32768 * 128 * 12 * 2 / 1.97e14
    return [{"block": b, "simulated_ms": round(1e3 * splash_time_s("v5e", 4096, 32768, 12, 128, 2,
                                                                    b, b, b), 2),
             "at_peak_ms": round(1e3 * peak, 2)} for b in (128, 256, 512, 1024, 2048)]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |error| over the independent (not fitted) rows."""
    errs = [abs(r["error_pct"]) for r in rows if not r["fitted"]]
    worst = max((r for r in rows if not r["fitted"]), key=lambda r: abs(r["error_pct"]))
    outside = [r["case"] for r in rows if not r["fitted"]
               and not 0.5 <= 1 + r["error_pct"] / 100 <= 2.0]
    return {"independent_rows": len(errs), "median_abs_error_pct": round(statistics.median(errs), 1),
            "worst_case": worst["case"], "worst_error_pct": worst["error_pct"],
            "outside_2x": outside}


def to_markdown(data: dict[str, Any]) -> str:
    """The validation table and its reading, as markdown."""
    s = data["summary"]
    lines = ["# Reference simulator against public measured TPU figures", "",
             f"Simulated column: {data['label']}, with the compiled HLO (the simulator's own "
             "compute model, `benchmarks/sim/`). Every program compiled ahead of time by libtpu "
             "for the slice named. Generated by `python -m benchmarks.simulator_validation`.", "",
             f"Independent rows: {s['independent_rows']}; median |error| "
             f"{s['median_abs_error_pct']}%; worst {s['worst_error_pct']:+.1f}% "
             f"({s['worst_case']}); outside 2x: {', '.join(s['outside_2x']) or 'none'}.", "",
             "Simulated = simulated device time + host dispatch (timer-measured rows only, "
             f"{1e6 * HOST_DISPATCH_S:.0f} us, fitted on one row).", "",
             "| case | kind | slice | measured (us) | simulated device (us) | + dispatch | "
             "simulated (us) | error | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        note = ("FITTED, not counted: " if r["fitted"] else "") + r["note"]
        lines.append(f"| {r['case']} | {r['kind']} | {r['slice']} | {r['measured_us']:,.1f} | "
                     f"{r.get('simulated_device_us', float('nan')):,.1f} | "
                     f"{r.get('host_dispatch_us', 0.0):.0f} | {r['simulated_us']:,.1f} | "
                     f"{r['error_pct']:+.1f}% | {note} |")
    lines += ["", "Reading: the rows come from three sources (seven matmul rows from one guide, "
              "twelve splash rows from one benchmark, two collectives from the book), so the "
              "median is mostly theirs. The splash forward+backward rows are axlearn's flash_bwd: "
              "the forward saving residuals, then splash's fused backward kernel (axlearn sets "
              "use_fused_bwd_kernel=True: one dk/dv kernel that also computes dq, walking every "
              "(kv block, q block) pair, computing on the blocks the mask keeps and writing a dq "
              "block per step into dq_unreduced, which XLA then sums), priced from its compiled "
              "Mosaic grid, blocks and body. Built first with the separate dq and dk/dv kernels "
              "(not the program measured), these rows were 21-26% under; with the fused program "
              "and its skipped steps priced (the gated compute on the forward's mask density of "
              "the steps, the other steps their copies and the step overhead) they are 11-16% "
              "under, no constant changed. The rest is not isolated. Ruled out by the compiled "
              "kernels' own schedules (libtpu's LLO dump): XLU transposes in the dk/dv matmuls "
              "(the transposed operands are pushed into the MXU transposed; the fused kernel's "
              "one 512x512 transpose of ds per step is counted). Candidates, not established: a "
              "skipped step runs about 560 bundles of scalar pipeline work (12 windows, "
              "block-table look-ups) against about 130 in the matmul kernel the constant step "
              "overhead was fitted on; the HBM-bound parts (the dq_unreduced sum, 8% of the "
              "simulated time, and the dq block written at every step) priced at peak HBM "
              "bandwidth. No row "
              "measures host offload or an XLA matmul at a skinny shard shape: none was found "
              "published, so offload is priced from the scaling book's PCIe figure alone and "
              "XLA matmuls from their padding and one fitted efficiency. No whole-step row of a "
              "public recipe is in the table yet. Three structural choices were made after seeing a "
              "run and are not blind tests: the host dispatch term (without it the 1024^3 rows are "
              "-37% to -91%, the two small ones outside 2x), the serial chain inside a Pallas "
              "step (MXU + VPU + EUP added; with max() instead, the splash rows were -30% to -38% "
              "before the dispatch term), and the block-sparse steps of the fused backward "
              "(added with the fused program, while the backward rows were known to be under). "
              "No constant was fitted to any counted row. The "
              "collectives use the scaling book's link bandwidth and 1 us per hop: the large "
              "all-gather is -16% (the book: 'likely not getting 100% of the theoretical "
              "bandwidth'), the latency-bound one +40%.", "",
              "Sources:"]
    for src in sorted({r["source"] for r in data["rows"]}):
        lines.append(f"- {src}")
    lines += ["", "Programs: " + "; ".join(sorted({f"{r['case']}: {r['program']}"
                                                   for r in data["rows"]})), ""]
    if data.get("splash_tiles"):
        lines += ["## Splash tiles (simulated, not a measurement)", "",
                  "One shard of Wan 2.1 1.3B 480p-81f self-attention, 8-way context parallel on "
                  "v5e (q 4,096, kv 32,768, 12 heads, head_dim 128, batch 2), "
                  "`kernel_model.splash_time_s` per block size (block_q = block_kv = "
                  "block_kv_compute), against the same FLOPs at 100% of peak:", "",
                  "| block | simulated (ms) | at peak (ms) |", "|---|---|---|"]
        lines += [f"| {t['block']} | {t['simulated_ms']} | {t['at_peak_ms']} |"
                  for t in data["splash_tiles"]]
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    """Build, compile and simulate every case; write the JSON and markdown results."""
    rows = []
    for c in cases():
        try:
            rows.append(run_case(c))
        except Exception as e:  # a case that cannot be built here is reported, not hidden
            rows.append({"case": c.name, "kind": c.kind, "source": c.source, "slice": c.target,
                         "program": c.program, "measured_us": c.measured_s * 1e6,
                         "simulated_us": float("nan"), "error_pct": float("nan"),
                         "fitted": True, "note": f"not built: {str(e).splitlines()[0][:200]}"})
        print(rows[-1]["case"], rows[-1]["measured_us"], rows[-1]["simulated_us"],
              rows[-1]["error_pct"], flush=True)
    data = {"label": LABEL, "machine": machine_info(), "rows": rows, "summary": summary(rows),
            "splash_tiles": splash_tiles()}
    os.makedirs(RESULTS, exist_ok=True)
    with atomic_open(os.path.join(RESULTS, "simulator_validation.json")) as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    with atomic_open(os.path.join(RESULTS, "simulator_validation.md")) as f:
        f.write(to_markdown(data))
    print(to_markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
