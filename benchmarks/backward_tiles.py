"""The splash backward's blocks: what Q2 and the simulator say about them at a training shard.

    python -m benchmarks.backward_tiles            # writes benchmarks/results/backward_tiles.{json,md}
    python -m benchmarks.backward_tiles --report   # the markdown again, from the JSON

One self-attention of Wan 2.1 1.3B at 480p-21f (12 heads x 10,240 padded tokens x 128), as
maxdiffusion's recipe lays it out on v5p-8: the query sequence split over fsdp = 4 (2,560 per
chip), keys and values gathered. Each variant is the splash kernel's own forward and VJP (its
``make_splash_mha`` with ``BlockSizes``; not AoiZora's wrapper) inside ``jax.shard_map``,
compiled by libtpu for v5p-8 ahead of time. The forward's blocks are the planner's for this cell
(128 / 512 / 256); only the backward's change: the dk/dv kernel's (block_q_dkv, block_kv_dkv,
block_kv_dkv_compute), the dq kernel's (block_q_dq, block_kv_dq), or one fused dq-dk-dv kernel
(``use_fused_bwd_kernel``). Each compiled program is priced by Q2's compute term
(``formulation.op_time`` through ``predict_step``) and by the AoiZora reference simulator's
compute by kind (``benchmarks.sim.hlo_cost.compute_breakdown``: the backward kernels from their
Mosaic grids and blocks). No TPU runs: both are predictions. The question it answers: does the
planner's price see the backward's blocks? Q2 prices the backward kernels with
``formulation.splash_backward_model`` (written from the kernels' source); the simulator reads
their compiled Mosaic grids, windows and matmuls (``benchmarks.sim.mosaic``). What they share:
the chip's peak FLOP/s, HBM bandwidth and clock, and a per-grid-step overhead of similar origin
(Q2: 0.35 us from the Pallas TPU docs; the simulator: 0.28 us, its own fit to one figure of the
Pallas matmul guide).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import aoizora  # noqa: F401  -- sets libtpu's environment first
from aoizora.extract.aot_compile import target_mesh
from aoizora.extract.compiled_evidence import evidence_from_compiled
from aoizora.extract.hlo import parse_hlo_module
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import predict_step
from benchmarks.sim.constants import chip_model
from benchmarks.sim.hlo_cost import compute_breakdown
from aoizora.extract.atomic_io import atomic_write

RESULTS = Path(__file__).parent / "results"
HEADS, TOKENS, HEAD_DIM, CHIPS = 12, 10240, 128, 4
FORWARD = {"block_q": 128, "block_kv": 512, "block_kv_compute": 256}
VARIANTS = {
    "the forward's blocks (what plans run today)":
        {"block_q_dkv": 128, "block_kv_dkv": 512, "block_kv_dkv_compute": 512,
         "block_q_dq": 128, "block_kv_dq": 512},
    "dk/dv and dq query block 512":
        {"block_q_dkv": 512, "block_kv_dkv": 512, "block_kv_dkv_compute": 512,
         "block_q_dq": 512, "block_kv_dq": 512},
    "dk/dv 512 / 1024 / 256, dq 512 / 1024":
        {"block_q_dkv": 512, "block_kv_dkv": 1024, "block_kv_dkv_compute": 256,
         "block_q_dq": 512, "block_kv_dq": 1024},
    "fused dq-dk-dv kernel, 512 / 1024 / 512":
        {"block_q_dkv": 512, "block_kv_dkv": 1024, "block_kv_dkv_compute": 512,
         "use_fused_bwd_kernel": True},
}


def _step(backward: dict, lq: int):
    """Per shard: splash's forward and VJP for q [H, lq, D] against the gathered keys."""
    import jax
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    sizes = sa.BlockSizes(**FORWARD, **backward)
    kernel = sa.make_splash_mha(sa.MultiHeadMask([sa.FullMask((lq, TOKENS))] * HEADS),
                                block_sizes=sizes, head_shards=1, q_seq_shards=1)

    def body(q, k, v, do):
        out, vjp = jax.vjp(jax.vmap(kernel), q, k, v)
        return (out, *vjp(do))
    return body


def variant_row(name: str, backward: dict) -> dict:
    """Q2's and the simulator's compute (ms) of the compiled variant."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    tgt = get_target("v5p-8")
    order = default_device_order(tgt, {"fsdp": CHIPS})
    mesh = target_mesh(tgt, {"fsdp": CHIPS}, list(order))
    qs, kv = P(None, None, "fsdp", None), P()
    fn = jax.jit(jax.shard_map(_step(backward, TOKENS // CHIPS), mesh=mesh,
                               in_specs=(qs, kv, kv, qs), out_specs=(qs, qs, kv, kv),
                               check_vma=False))
    arg = jax.ShapeDtypeStruct((1, HEADS, TOKENS, HEAD_DIM), jnp.bfloat16)
    t0 = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = fn.lower(arg, arg, arg, arg).compile()
    except Exception as err:  # noqa: BLE001 -- the compiler's verdict is the result
        return {"variant": name, "backward": backward, "error": str(err).splitlines()[0][:300]}
    ev = evidence_from_compiled(compiled, target=tgt, mesh=mesh, compile_s=time.perf_counter() - t0)
    q2 = predict_step(ev, order, Network.from_target(tgt))
    sim = compute_breakdown(parse_hlo_module(compiled.as_text()), chip_model("v5p"),
                            {o.name: o.count for o in ev.compute})
    return {"variant": name, "backward": backward, "q2_compute_ms": q2.compute_s * 1e3,
            "sim_compute_ms": {k: v * 1e3 for k, v in sorted(sim.items()) if v > 1e-9}}


def report(rows: list[dict]) -> list[str]:
    out = ["# The splash backward's blocks at a training shard (Wan 2.1 1.3B 480p-21f, v5p-8)", "",
           "Generated by `python -m benchmarks.backward_tiles` (module docstring). One self-"
           "attention's forward and backward per chip (12 heads, 2,560 queries against 10,240 "
           "keys, head dim 128; forward blocks 128 / 512 / 256), compiled by libtpu for v5p-8. "
           "**No TPU ran**: Q2 is the planner's prediction, `sim` the AoiZora reference simulator's.",
           "", "| backward blocks | Q2 compute ms | sim: backward kernels ms | sim: forward ms |",
           "|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['variant']} | compile error: {r['error']} | | |")
            continue
        s = r["sim_compute_ms"]
        bwd = s.get("attention backward (dq, dk/dv)", 0.0)
        fwd = sum(v for k, v in s.items() if k.startswith("attention forward"))
        out.append(f"| {r['variant']} | {r['q2_compute_ms']:.3f} | {bwd:.3f} | {fwd:.3f} |")
    return out + [""] + _finding([r for r in rows if "error" not in r])


def _finding(rows: list[dict]) -> list[str]:
    """How far apart each price puts the variants, and which each ranks first."""
    if len(rows) < 2:
        return []
    q2 = {r["variant"]: r["q2_compute_ms"] for r in rows}
    sim = {r["variant"]: sum(r["sim_compute_ms"].values()) for r in rows}
    return [f"Q2 puts the variants {max(q2.values()) / min(q2.values()):.2f}x apart and ranks "
            f"first \"{min(q2, key=q2.get)}\"; the simulator puts them "
            f"{max(sim.values()) / min(sim.values()):.2f}x apart and ranks first "
            f"\"{min(sim, key=sim.get)}\".", ""]


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if "--report" in argv:           # only the markdown, from the written JSON
        rows = json.loads((RESULTS / "backward_tiles.json").read_text())
    else:
        rows = [variant_row(n, b) for n, b in VARIANTS.items()]
        for r in rows:
            print(json.dumps(r), flush=True)
        RESULTS.mkdir(exist_ok=True)
        atomic_write(RESULTS / "backward_tiles.json", json.dumps(rows, indent=1) + "\n")
    atomic_write(RESULTS / "backward_tiles.md", "\n".join(report(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
