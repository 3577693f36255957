"""Compile each full-size built-in model ahead of time for a TPU slice (default v5e-8) under a
simple sharding that fits in HBM, and record compile time and HBM use.

Sharding ("fsdp+cp"): mesh (data=2, seq=4) from ``jax.make_mesh`` (JAX's default device order),
Auto axes. Activations: batch (the CFG pair) over ``data``, the video/joint sequence over ``seq``
(hints ``batch`` -> data, ``seq`` -> seq); attention: batch over data, query sequence over seq,
keys/values gathered (context parallel), the Pallas splash kernel inside ``shard_map`` (the
realizer's attention wrapper). Weights FSDP-style: each weight's largest non-layer dim that divides
8 is split over (data, seq); the partitioner gathers it where it is used. The token sequence is
padded to a multiple of 128 x seq degree (= 512) so each shard holds whole splash blocks.

Run:  /work/venv/bin/python benchmarks/model_compile.py [--target v5e-8] [--only NAME]
      [--frames N (override, to validate quickly)]
Writes benchmarks/results/model_compile.json and .md (one row per model: padded tokens, compile
seconds, HBM bytes per device by kind, fits).
"""

from __future__ import annotations

from benchmarks.machine import machine_info
import argparse
import json
import math
import os
import sys
import time

import aoizora  # noqa: F401  (libtpu environment first)
import jax
from jax.sharding import AxisType

from aoizora.extract.targets import get_target
from aoizora.formulation.layout import AttentionLayout, Layout
from aoizora.models.registry import abstract_inputs, denoise_step, get_model
from aoizora.models.workloads import Workload, pad_to
from aoizora.runtime.realize import realize
from aoizora.extract.atomic_io import atomic_open

RUNS = [("wan2.1-1.3b", "480p-81f"), ("wan2.1-14b", "480p-81f"), ("hunyuanvideo-13b", "720p-129f"),
        ("wan2.1-14b", "720p-81f"), ("hunyuanvideo-13b", "544p-129f")]
HERE = os.path.dirname(os.path.abspath(__file__))


def fsdp_spec(path: str, shape: tuple[int, ...], n: int, stacked: bool):
    """Split the largest dim (not the layer dim of stacked block params) that divides n."""
    dims = list(range(1 if stacked else 0, len(shape)))
    cands = [d for d in dims if shape[d] % n == 0]
    if not cands:
        return None
    d = max(cands, key=lambda i: shape[i])
    spec = [None] * len(shape)
    spec[d] = ("data", "seq")
    return tuple(spec)


def layout_for(args, mesh_axes: dict[str, int]) -> Layout:
    n = math.prod(mesh_axes.values())
    leaves = jax.tree_util.tree_flatten_with_path(args)[0]
    in_specs = []
    for path, leaf in leaves:
        ks = jax.tree_util.keystr(path)
        if ks.startswith("[0]"):   # params
            stacked = "blocks" in ks
            in_specs.append(fsdp_spec(ks, leaf.shape, n, stacked))
        elif ks.startswith("[1]"):  # latents [B, C, F, H, W]: batch 1 -> replicated
            in_specs.append(None)
        else:
            in_specs.append(None)
    return Layout(mesh_axes=dict(mesh_axes), in_specs=in_specs, out_specs=None,
                  rules={"batch": ("data",), "seq": ("seq",)},
                  attention={"*": AttentionLayout(batch=("data",), seq=("seq",), kv="gather")},
                  name="fsdp+cp")


def fsdp_cp_setup(name: str, wl_name: str, target: str, frames: int | None):
    """(model, workload, target, mesh axes, mesh, pad) of the fsdp+cp layout: data=2 x seq=n/2
    in jax.make_mesh order, the sequence padded to 128 x seq; `frames` overrides the workload's."""
    m = get_model(name)
    wl = m.workload(wl_name)
    if frames is not None:
        wl = Workload(f"{wl.resolution}-{frames}f", wl.resolution, wl.width, wl.height, frames)
    tgt = get_target(target)
    mesh_axes = {"data": 2, "seq": tgt.num_devices // 2}
    mesh = jax.make_mesh(tuple(mesh_axes.values()), tuple(mesh_axes), devices=tgt.devices(),
                         axis_types=(AxisType.Auto,) * 2)
    return m, wl, tgt, mesh_axes, mesh, 128 * mesh_axes["seq"]


def compile_one(name: str, wl_name: str, target: str, frames: int | None) -> dict:
    m, wl, tgt, mesh_axes, mesh, pad = fsdp_cp_setup(name, wl_name, target, frames)
    args = abstract_inputs(m, wl)
    layout = layout_for(args, mesh_axes)
    step = denoise_step(m, pad_multiple=pad)
    text = 0 if m.family == "wan" else m.config.text_len
    row = {"model": name, "workload": wl.name, "frames": wl.frames, "tokens": wl.tokens,
           "padded_sequence": pad_to(wl.tokens + text, pad), "params": m.params,
           "target": tgt.short_name if hasattr(tgt, "short_name") else target,
           "mesh": mesh_axes, "layout": layout.name, "pad_multiple": pad}
    row["load_avg_1min_before"] = round(os.getloadavg()[0], 2)  # the machine is shared
    t0 = time.perf_counter()
    try:
        r = realize(step, args, layout, mesh)
        lowered = r.lower()
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
    except Exception as e:  # report the failure (e.g. RESOURCE_EXHAUSTED) as a row
        row.update(ok=False, fits=False, error=str(e).splitlines()[0][:400],
                   seconds_total=round(time.perf_counter() - t0, 1))
        return row
    mem = compiled.memory_analysis()
    hbm = {k: int(getattr(mem, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                             "temp_size_in_bytes", "generated_code_size_in_bytes",
                                             "alias_size_in_bytes")}
    total = (hbm["argument_size_in_bytes"] + hbm["output_size_in_bytes"] + hbm["temp_size_in_bytes"]
             + hbm["generated_code_size_in_bytes"] - hbm["alias_size_in_bytes"])
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    hlo = compiled.as_text()
    row.update(ok=True, seconds_lower=round(t1 - t0, 1), seconds_compile=round(t2 - t1, 1),
               hbm_bytes_per_device=hbm, hbm_total_bytes_per_device=total,
               hbm_capacity_bytes=int(tgt.chip.hbm_bytes) if hasattr(tgt, "chip") else None,
               fits=True,  # the TPU compiler rejects programs that do not fit (RESOURCE_EXHAUSTED)
               flops_per_device_loop_bodies_once=float(cost.get("flops", -1)) if cost else None,
               custom_calls=hlo.count(" custom-call("))
    return row


def machine() -> dict:
    return machine_info()

def write(rows: list[dict], target: str, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    doc = {"target": target, "machine": machine(), "runs": rows}
    with atomic_open(os.path.join(out_dir, "model_compile.json")) as f:
        json.dump(doc, f, indent=2)
    gib = 1024 ** 3
    lines = [f"# Full-size models compiled ahead of time for {target}", "",
             f"Machine: {doc['machine']['platform']}, {doc['machine']['cpus']} CPUs, jax "
             f"{doc['machine']['jax']}, libtpu {doc['machine']['libtpu']} (no TPU; shared machine).", "",
             "Layout `fsdp+cp`: mesh data=2 x seq=4 (jax.make_mesh order), CFG pair over data, "
             "sequence over seq, splash attention with keys/values gathered, weights FSDP over all 8. "
             "Padded attention sequence: video tokens (Wan) or video + 256 text tokens (HunyuanVideo) "
             "padded to a multiple of 512. HBM: argument + output + temp + code - alias bytes per "
             "device (capacity 15.75 GiB); a program that does not fit fails to compile.", "",
             "| model | workload | video tokens | padded attention seq | compile s | lower s | HBM/device GiB | fits | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        hb = r.get("hbm_total_bytes_per_device")
        lines.append(f"| {r['model']} | {r['workload']} | {r['tokens']:,} | {r['padded_sequence']:,} | "
                     f"{r.get('seconds_compile', '-')} | {r.get('seconds_lower', '-')} | "
                     f"{'-' if hb is None else f'{hb / gib:.2f}'} | {r['fits']} | {r.get('error', '')} |")
    with atomic_open(os.path.join(out_dir, "model_compile.md")) as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="v5e-8")
    ap.add_argument("--only", default=None, help="one model name")
    ap.add_argument("--frames", type=int, default=None, help="override frames (quick validation)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    rows = []
    for name, wl in RUNS:
        if a.only and name != a.only:
            continue
        row = compile_one(name, wl, a.target, a.frames)
        print(json.dumps({k: v for k, v in row.items() if k != "hbm_bytes_per_device"}), flush=True)
        rows.append(row)
        write(rows, a.target, a.out)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
