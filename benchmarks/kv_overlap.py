"""Can the key/value all-gathers of context parallelism hide behind attention? Compiled evidence.

Wan 2.1 14B on v5e-16 ties the best expert (cfg2_context) in every grid cell: a third of its
step is exposed communication (Q2 and the simulator agree), and most of it is the all-gathers of
keys and values. This benchmark compiles the ways of hiding them that the layout space and the
compiler offer, and prices each with the reference simulator (predictions: no TPU runs here).

Part "block": two transformer blocks at Wan 2.1 14B's sizes (dim 5120, 40 heads x 128, FFN
13824) on the 480p-41f workload's tokens (17,160, padded to 17,408), batch 2 (classifier-free
guidance), on v5e-16 as mesh cfg 2 x context 8 with JAX's default device order: activations
split [cfg, context], weights replicated so that only the attention moves data. It is a
stand-in block (self-attention and an MLP, no norms, no cross-attention), compiled by libtpu.
Its attention in three layouts, each compiled with libtpu's default options and with
``xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call`` (which lets the compiler fuse
a Pallas kernel with a collective):
- ``gather``: keys and values all-gathered along the sequence (cfg2_context's attention);
- ``gather-by-heads``: the same, in 5 head chunks of 8 heads, so that the gather of one chunk
  could run while the kernel attends another;
- ``ring``: keys and values passed around a ring of 8 (``kv="ring"``).

Part "model": the whole Wan 2.1 14B 480p-41f step, expert cfg2_context, with the default options
and with that option, and with its self-attention in a ring (``kv="ring"``; cross-attention
over the 512 text tokens stays gathered).

Run: ``python -m benchmarks.kv_overlap`` (about 3 minutes) -> ``benchmarks/results/
kv_overlap.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any

import aoizora  # noqa: F401  (libtpu environment first)
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from aoizora.extract.aot_compile import compile_evidence, target_mesh
from aoizora.extract.network import default_device_order
from aoizora.extract.targets import get_target
from aoizora.formulation.layout import AttentionLayout
from aoizora.kernels.attention_kernels import sharded_attention
from aoizora.models.experts import attention_roles, expert_layouts
from aoizora.models.registry import get_model
from aoizora.planner import compile_layout
from benchmarks.machine import git_state, machine_info, machine_line, write_results
from benchmarks.simulator import LABEL, simulate

TARGET = "v5e-16"
MODEL, WORKLOAD, EXPERT = "wan2.1-14b", "480p-41f", "cfg2_context"
PADDED_TOKENS = 17_408              # 17,160 rounded up to 8 shards x the splash block of 128
LAYERS = 2
HEAD_CHUNKS = 5
MOSAIC_FUSION = "xla_tpu_enable_async_collective_fusion_with_mosaic_custom_call"
OPTIONS = {"default": None, "mosaic-fusion": {MOSAIC_FUSION: True}}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def block_program(attention: str):
    """(fn, args, mesh): ``LAYERS`` blocks with the attention in ``attention``'s layout."""
    cfg = get_model(MODEL).config
    b, s, e, h, d, f = 2, PADDED_TOKENS, cfg.dim, cfg.heads, cfg.head_dim, cfg.ffn_dim
    mesh = target_mesh(TARGET, {"cfg": 2, "context": 8})
    kv = "ring" if attention == "ring" else "gather"
    layout = AttentionLayout(batch=("cfg",), seq=("context",), kv=kv)
    chunks = HEAD_CHUNKS if attention == "gather-by-heads" else 1

    def attend(q, k, v):
        hc = h // chunks
        outs = [sharded_attention(q[:, c:c + hc], k[:, c:c + hc], v[:, c:c + hc], layout=layout,
                                  mesh=mesh, scale=d ** -0.5, impl="splash")
                for c in range(0, h, hc)]
        return outs[0] if chunks == 1 else jnp.concatenate(outs, axis=1)

    def step(x, weights):
        heads = lambda t: t.reshape(b, s, h, d).transpose(0, 2, 1, 3)   # noqa: E731
        for wq, wk, wv, wo, w1, w2 in weights:
            o = attend(heads(x @ wq), heads(x @ wk), heads(x @ wv))
            x = x + o.transpose(0, 2, 1, 3).reshape(b, s, e) @ wo
            x = x + jax.nn.gelu(x @ w1) @ w2
        return x

    act = NamedSharding(mesh, P("cfg", "context", None))
    rep = NamedSharding(mesh, P())
    w = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=rep)   # noqa: E731
    weights = [(w(e, e), w(e, e), w(e, e), w(e, e), w(e, f), w(f, e)) for _ in range(LAYERS)]
    return step, [jax.ShapeDtypeStruct((b, s, e), jnp.bfloat16, sharding=act), weights], mesh


def evidence_row(ev, **kw) -> dict[str, Any]:
    """``kw`` and the simulated step of ``ev`` (ms) with its all-gathers and fused kernels."""
    r = simulate(ev)
    gathers = [c for c in ev.collectives if c.kind == "all-gather"]
    return dict(kw, step_ms=round(r.step_s * 1e3, 3), compute_ms=round(r.compute_s * 1e3, 3),
                exposed_ms=round(r.communication_s * 1e3, 3),
                all_gathers_sync=sum(c.count for c in gathers if not c.is_async),
                all_gathers_async=sum(c.count for c in gathers if c.is_async),
                kernels_fused=sum(o.count for o in ev.compute
                                  if o.kind == "fusion" and "splash" in o.name),
                compile_s=round(ev.compile_s, 1))


def run_block() -> list[dict[str, Any]]:
    rows = []
    for attention in ("gather", "gather-by-heads", "ring"):
        fn, args, mesh = block_program(attention)
        for opt, options in OPTIONS.items():
            ev = compile_evidence(fn, args, mesh=mesh, target=TARGET, compiler_options=options)
            rows.append(evidence_row(ev, part="block", attention=attention, options=opt))
            print(rows[-1], flush=True)
    return rows


def run_model() -> list[dict[str, Any]]:
    e = next(x for x in expert_layouts(MODEL, WORKLOAD, TARGET) if x.name == EXPERT)
    tgt = get_target(TARGET)
    order = default_device_order(tgt, e.layout.mesh_axes)   # jax.make_mesh's, as default_mesh
    roles = attention_roles(e.fn, e.args)
    ring = dataclasses.replace(e.layout, attention={
        k: dataclasses.replace(a, kv="ring") if roles.get(k) == "self" else a
        for k, a in e.layout.attention.items()})
    rows = []
    for attention, layout, opt in (("gather", e.layout, "default"),
                                   ("gather", e.layout, "mosaic-fusion"),
                                   ("self-attention in a ring", ring, "default")):
        ev = compile_layout(e.fn, e.args, tgt, layout, order, compiler_options=OPTIONS[opt])
        rows.append(evidence_row(ev, part="model", attention=f"{EXPERT}, {attention}", options=opt))
        print(rows[-1], flush=True)
    return rows


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """The comparisons the rows support, as markdown bullets (figures simulated)."""
    at = {(r["part"], r["attention"], r["options"]): r for r in rows}
    pct = lambda a, b: 100.0 * (a["step_ms"] / b["step_ms"] - 1.0)   # noqa: E731
    out = []
    g, h, r = (at.get(("block", a, "default")) for a in ("gather", "gather-by-heads", "ring"))
    if g and h:
        out.append(f"- Gathering by head chunks makes the block {pct(h, g):+.1f}% slower "
                   f"({h['step_ms']:.2f} against {g['step_ms']:.2f} ms, simulated): "
                   f"{h['all_gathers_sync']} of its {h['all_gathers_sync'] + h['all_gathers_async']} "
                   f"all-gathers are synchronous (the compiler runs them back to back, ahead of the "
                   f"kernels), so no chunk's gather overlaps another chunk's kernel.")
    hm = at.get(("block", "gather-by-heads", "mosaic-fusion"))
    if hm and h:
        out.append(f"- With `{MOSAIC_FUSION}` libtpu fuses {hm['kernels_fused']} kernels with a "
                   f"collective, and the block takes {hm['step_ms']:.2f} ms (simulated): no better.")
    if g and r:
        out.append(f"- The ring exposes {r['exposed_ms']:.2f} ms of its transfers (the gather "
                   f"{g['exposed_ms']:.2f} ms) and computes "
                   f"{r['compute_ms'] - g['compute_ms']:.2f} ms more than the gather "
                   f"({pct(r, g):+.1f}% in all, simulated): besides the kernel, each of its steps "
                   f"rescales the partial output, slices the kernel's residuals and copies the "
                   f"loop-carried keys/values.")
    md, mm, mr = (at.get(("model", f"{EXPERT}, {a}", o)) for a, o in (
        ("gather", "default"), ("gather", "mosaic-fusion"), ("self-attention in a ring", "default")))
    if md and mm:
        out.append(f"- The whole step with `{MOSAIC_FUSION}`: {mm['step_ms']:.2f} against "
                   f"{md['step_ms']:.2f} ms ({pct(mm, md):+.1f}%, simulated; exposed "
                   f"communication {mm['exposed_ms']:.1f} against {md['exposed_ms']:.1f} ms). "
                   f"A user who sets it in `LIBTPU_INIT_ARGS` gets plans priced on the programs "
                   f"compiled with it; the grid uses libtpu's defaults for every row.")
    if md and mr:
        out.append(f"- The whole step with its self-attention in a ring: {mr['step_ms']:.2f} against "
                   f"{md['step_ms']:.2f} ms ({pct(mr, md):+.1f}%, simulated).")
    return out


def write(doc: dict[str, Any], out_dir: str = RESULTS) -> None:
    lines = [
        "# Hiding the key/value all-gathers of context parallelism (Wan 2.1 14B sizes, v5e-16)", "",
        f"Step latency in ms, {LABEL}, of programs compiled ahead of time by libtpu (no TPU was "
        f"run); mesh cfg 2 x context 8, JAX's default device order. Block: {LAYERS} stand-in "
        f"transformer blocks at Wan 2.1 14B's sizes on 480p-41f's tokens (weights replicated); "
        f"model: the whole Wan 2.1 14B 480p-41f step, expert {EXPERT}. Options: libtpu's defaults, "
        f"or `{MOSAIC_FUSION}`. Generated by `python -m benchmarks.kv_overlap` "
        f"(`benchmarks/kv_overlap.py` says what each row is).", "",
        machine_line(doc), "",
        "| part | attention | options | step ms | compute ms | exposed communication ms | "
        "all-gathers sync / async | kernels fused with a collective |",
        "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(f"| {r['part']} | {r['attention']} | {r['options']} | {r['step_ms']:.2f} | "
                     f"{r['compute_ms']:.2f} | {r['exposed_ms']:.2f} | {r['all_gathers_sync']} / "
                     f"{r['all_gathers_async']} | {r['kernels_fused']} |")
    lines += [""] + findings(doc["rows"])
    write_results(out_dir, "kv_overlap", doc, lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=RESULTS, help="directory for kv_overlap.json and .md")
    a = ap.parse_args(argv)
    doc = {"machine": machine_info(), "git": git_state(), "target": TARGET}
    doc["rows"] = run_block() + run_model()
    doc["machine_end"] = machine_info()
    write(doc, a.out)
    print(open(os.path.join(a.out, "kv_overlap.md")).read())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
