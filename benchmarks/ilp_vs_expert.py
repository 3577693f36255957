"""What the sharding ILP's own layout does differently from the best expert, cell by cell, and
which terms make each price prefer one or the other (issue #52).

    python -m benchmarks.ilp_vs_expert [--cells NAME,...]

Reads the compiled layouts of ``benchmarks/results/q1_fidelity/<cell>/`` (written by
``benchmarks.q1_fidelity_collect``; the layouts compiled with the options the planner gives them
today, as ``benchmarks.q1_fidelity`` selects them). Per cell it takes two of them:

- the ILP's layout: the simulator's fastest of the ILP's own layouts (named ``ilp...``);
- the best expert: the simulator's fastest expert as published (named ``expert:...``);

and writes, for each: the mesh, each attention's scheme (the mesh axes its batch, heads and
sequence are split over, how keys and values travel, the splash blocks), the bytes of arguments
per device (weights replicated or split), the compiler's memory figure, and the step in two
models with their terms:

- Q2 (predicted; what the planner ranks compiled candidates by): attention kernels, the other
  ops inside an attention (the ring's combine, the residual slice), every other compute op, and
  the rest of the step (exposed communication);
- the reference simulator (simulated, independent of Q2): attention, MXU-bound ops, HBM-bound
  ops, and the rest of the step (exposed communication).

The difference of each term (ILP minus expert, ms per step) says why each model prefers the
layout it prefers. Nothing is compiled or run here; nothing ran on a TPU.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.q1_fidelity_collect import RESULTS as CELLS_DIR

OUT = Path(__file__).resolve().parent / "results" / "ilp_vs_expert"
Q2_TERMS = ("attention kernels", "attention other ops", "other compute", "exposed communication")
SIM_TERMS = ("attention", "mxu-bound ops", "hbm-bound ops", "exposed communication")


def compiled_now(cell_dir: Path) -> list[dict[str, Any]]:
    """The cell's records compiled with today's options (``q1_fidelity._as_compiled_now``)
    that fit in HBM and were simulated."""
    from aoizora.builtin import builtin_job
    from aoizora.models.experts import expert_layouts
    from benchmarks.q1_fidelity import _as_compiled_now

    model, rest = cell_dir.name.split("_", 1)
    res_frames, target = rest.rsplit("_", 1)
    resolution, frames = res_frames.split("-")
    job = builtin_job(model, resolution, int(frames.rstrip("f")), target)
    experts = {f"expert:{e.name}": e for e in expert_layouts(job.model, job.workload, job.target)}
    recs = [json.loads(p.read_text()) for p in sorted(cell_dir.glob("*.json"))]
    return [r for r in recs if "sim" in r and r.get("fits_hbm")
            and _as_compiled_now(r, experts, job.target)]


def pick(recs: list[dict[str, Any]]) -> tuple[dict | None, dict | None]:
    """(the simulator's fastest ILP layout, the simulator's fastest expert); None when absent."""
    def fastest(prefix):
        rs = [r for r in recs if r["name"].startswith(prefix)]
        return min(rs, key=lambda r: (r["sim"]["step_s"], r["name"])) if rs else None
    return fastest("ilp"), fastest("expert:")


def attention_schemes(layout: dict[str, Any]) -> list[str]:
    """Each attention of the layout, in node order: 'batch y, seq x (ring), blocks 1280/1280'."""
    out = []
    for node in sorted(layout.get("attention") or {}):
        a = layout["attention"][node]
        parts = [f"{dim} {'.'.join(a[dim])}" for dim in ("batch", "heads", "seq") if a.get(dim)]
        kv = a.get("kv", "gather") if a.get("seq") else "local"
        blocks = "/".join(str(a[k]) for k in ("block_q", "block_kv", "block_kv_compute")
                          if a.get(k))
        out.append(f"{', '.join(parts) or 'replicated'}; kv {kv}"
                   + (f"; blocks {blocks}" if blocks else ""))
    return out


def q2_terms_ms(cell_dir: Path, rec: dict[str, Any]) -> dict[str, float] | None:
    """Q2's step split into ``Q2_TERMS`` (ms), from the record's kept evidence; None without it.

    attention kernels + attention other ops + other compute = Q2's compute (``q2.compute_s``);
    exposed communication = Q2's step - its compute.
    """
    from aoizora.extract.evidence import Evidence
    from aoizora.extract.network import Network
    from aoizora.formulation.op_time import op_seconds
    from benchmarks.q1_fidelity_collect import is_attention_op

    path = cell_dir / (rec["name"].replace(":", "_") + ".evidence.json.gz")
    if not path.exists():
        return None
    with gzip.open(path, "rt") as f:
        ev = Evidence.loads(f.read())
    net = Network.from_target(_target_of(cell_dir))
    kern = other_att = 0.0
    for op in ev.compute:
        if not is_attention_op(op):
            continue
        t = op.count * (op_seconds(op, ev, net) or 0.0)
        if getattr(op, "kernel", None):
            kern += t
        else:
            other_att += t
    q2 = rec["q2"]
    return {"attention kernels": kern * 1e3, "attention other ops": other_att * 1e3,
            "other compute": (q2["compute_s"] - kern - other_att) * 1e3,
            "exposed communication": (q2["step_s"] - q2["compute_s"]) * 1e3}


def _target_of(cell_dir: Path):
    from aoizora.extract.targets import get_target
    return get_target(cell_dir.name.rsplit("_", 1)[1])


def sim_terms_ms(rec: dict[str, Any]) -> dict[str, float]:
    """The simulator's step split into ``SIM_TERMS`` (ms): its compute by kind (attention kinds
    summed) and the rest of its step (exposed communication)."""
    s = rec["sim"]
    by = s.get("compute_by_kind") or {}
    att = sum(v for k, v in by.items() if "attention" in k)
    return {"attention": att * 1e3, "mxu-bound ops": by.get("mxu-bound ops", 0.0) * 1e3,
            "hbm-bound ops": (by.get("hbm-bound ops", 0.0) + by.get("other kernels", 0.0)) * 1e3,
            "exposed communication": (s["step_s"] - s["compute_s"]) * 1e3}


def side(cell_dir: Path, rec: dict[str, Any]) -> dict[str, Any]:
    """One layout's row of the comparison (see the module docstring)."""
    mem = rec.get("memory") or {}
    return {"name": rec["name"], "mesh": rec["mesh"],
            "attention": attention_schemes(rec["layout"]),
            "argument_gib": (mem.get("argument_bytes") or 0) / 2**30,
            "compiler_gib": (mem.get("compiler_total_bytes") or 0) / 2**30,
            "q2_ms": rec["q2"]["step_s"] * 1e3, "sim_ms": rec["sim"]["step_s"] * 1e3,
            "q2_terms": q2_terms_ms(cell_dir, rec), "sim_terms": sim_terms_ms(rec)}


def why(ilp: dict[str, Any], ex: dict[str, Any], model: str) -> str:
    """Which layout ``model`` ("q2" | "sim") prefers, by how much, and the terms that decide it
    (the two largest differences, ILP minus expert)."""
    terms_i, terms_e = ilp[f"{model}_terms"], ex[f"{model}_terms"]
    gap = ilp[f"{model}_ms"] - ex[f"{model}_ms"]
    label = {"q2": "Q2", "sim": "the simulator"}[model]
    if terms_i is None or terms_e is None:
        return f"{label}: ILP minus expert {gap:+.1f} ms (no terms kept)"
    delta = {k: terms_i[k] - terms_e[k] for k in terms_i}
    top = sorted(delta.items(), key=lambda kv: -abs(kv[1]))[:2]
    who = "the ILP's layout" if gap < 0 else "the expert"
    return (f"{label} prefers {who} by {abs(gap):.1f} ms: "
            + ", ".join(f"{k} {v:+.1f}" for k, v in top) + " (ILP minus expert)")


def compare_cell(cell_dir: Path) -> dict[str, Any] | None:
    ilp, ex = pick(compiled_now(cell_dir))
    if ilp is None or ex is None:
        return None
    a, b = side(cell_dir, ilp), side(cell_dir, ex)
    return {"cell": cell_dir.name, "ilp": a, "expert": b,
            "why_q2": why(a, b, "q2"), "why_sim": why(a, b, "sim")}


def _mesh(m: dict[str, int]) -> str:
    return " x ".join(f"{k} {v}" for k, v in m.items())


def markdown(rows: list[dict[str, Any]]) -> str:
    L = ["# The ILP's own layout against the best expert, cell by cell", "",
         "Generated by `python -m benchmarks.ilp_vs_expert` from the compiled layouts of "
         "`q1_fidelity/` (each compiled by libtpu ahead of time in JAX's default device order). "
         "Per cell: the simulator's fastest of the ILP's own layouts and of the experts as "
         "published. ms per step: Q2 predicted (what the planner ranks compiled candidates by), "
         "sim simulated by the AoiZora reference simulator; arguments: bytes of the program's "
         "arguments per device (weights split or replicated), compiler: the compiler's memory "
         "figure per device. Nothing ran on a TPU.", ""]
    for r in rows:
        L += [f"## {r['cell']}", "",
              "| layout | mesh | attention (in node order) | arguments GiB | compiler GiB | "
              "Q2 ms | sim ms |", "|---|---|---|---|---|---|---|"]
        for s in (r["ilp"], r["expert"]):
            L.append(f"| {s['name']} | {_mesh(s['mesh'])} | {'<br>'.join(s['attention'])} | "
                     f"{s['argument_gib']:.2f} | {s['compiler_gib']:.2f} | {s['q2_ms']:.1f} | "
                     f"{s['sim_ms']:.1f} |")
        L += ["", _terms_table(r), "", f"- {r['why_q2']}.", f"- {r['why_sim']}.", ""]
    return "\n".join(L)


def _terms_table(r: dict[str, Any]) -> str:
    head = "| terms, ms | " + " | ".join([f"Q2 {t}" for t in Q2_TERMS]
                                         + [f"sim {t}" for t in SIM_TERMS]) + " |"
    lines = [head, "|---|" + "---|" * (len(Q2_TERMS) + len(SIM_TERMS))]
    for s in (r["ilp"], r["expert"]):
        q2 = s["q2_terms"] or {}
        vals = [q2.get(t) for t in Q2_TERMS] + [s["sim_terms"][t] for t in SIM_TERMS]
        lines.append(f"| {s['name']} | " + " | ".join("-" if v is None else f"{v:.1f}"
                                                       for v in vals) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="", help="comma-separated cell directory names "
                    "(default: every cell of q1_fidelity/)")
    a = ap.parse_args(argv)
    names = [c for c in a.cells.split(",") if c]
    dirs = [CELLS_DIR / n for n in names] if names else sorted(
        p for p in CELLS_DIR.iterdir() if p.is_dir())
    missing = [d.name for d in dirs if not d.is_dir()]
    if missing:
        print(f"no compiled layouts for {', '.join(missing)}: collect them first "
              f"(python -m benchmarks.q1_fidelity_collect)", file=sys.stderr)
        return 2
    rows = [r for r in (compare_cell(d) for d in dirs) if r is not None]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{OUT}.json").write_text(json.dumps(rows, indent=1))
    Path(f"{OUT}.md").write_text(markdown(rows) + "\n")
    print(f"wrote {OUT}.md ({len(rows)} cells)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
