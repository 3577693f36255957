"""How well Q1 (the sharding ILP's objective) predicts the compiled step: measured on every layout
with compiled evidence, against Q2 and the reference simulator, term by term.

    python -m benchmarks.q1_fidelity [--tag T]          # table + JSON from the cached evidence

The evidence is ``benchmarks/results/q1_fidelity/<cell>/<layout>.json``, written by
``benchmarks.q1_fidelity_collect`` (each layout compiled once by libtpu; Q2 and the simulator
priced it then; neither changes when Q1 does). Q1 is computed here, by the code as it is now:

- an ILP layout: the objective of the exact strategy choice the ILP made for it (stored by name
  in the record) under today's strategy costs (``formulation.sharding_ilp.evaluate``);
- an expert layout: the ILP pinned to the expert's decisions (every attention node's batch /
  heads / sequence / kv mode, every program input's spec where a strategy of its group lays it
  out so), its other groups (intermediates the compiler's propagation decides for an expert)
  chosen by the ILP: the cheapest Q1 of a layout that runs the expert's program the expert's way.

Either way, each attention node is priced (by Q1's own kernel model) at the splash tiles the
layout runs: its own, else the automatic ones; the ILP prices a strategy at the kernel model's
best tiles and its layouts carry them, so for its layouts both are the same.

Terms (seconds per step unless noted), each model's own:
- compute: attention (Q1: the attention groups' compute; Q2: the ops of attention scopes and the
  splash kernels; simulator: its splash/kernel time) and the rest (Q1: every other group's
  compute, unfused; Q2: the compiler's cycles; simulator: its MXU/HBM/VPU-bound ops);
- communication: Q1's own collectives of the anchors (all-reduce / reduce-scatter of partial
  sums) and its resharding on edges (all-gather / all-to-all), against the simulator's time per
  collective kind (all runs; and the part exposed on the step) and the compiled bytes per kind;
- memory: Q1's largest memory row (bytes per device) against the compiler's total.

Per cell: median |Q1 / simulated - 1| and Spearman's rho between Q1 and the simulated step over
the cell's layouts (also for Q2). Nothing ran on a TPU: Q1 and Q2 are predictions, the
simulator's figures are simulated (``benchmarks.simulator``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import aoizora  # noqa: F401
from aoizora.builtin import builtin_job
from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.formulation.layout import Layout
from aoizora.formulation.sharding_ilp import evaluate, peak_memory
from aoizora.formulation.strategies import SWITCH_EDGE
from aoizora.formulation.attention_tiles import wrapper_seconds
from aoizora.formulation.kernel_model import SplashShape, splash_seconds
from aoizora.formulation.ring_overhead import ring_overhead_seconds
from aoizora.formulation.compiler_settings import ilp_compiler_options
from aoizora.formulation.strategies import Hardware, Options
from aoizora.kernels.attention_kernels import padded_lengths
from aoizora.kernels.tiles import attention_shapes
from aoizora.models.experts import expert_layouts
from aoizora.solvers.sharding import ShardingProblem, ShardingSolveError, build_problem, solve_sharding
from aoizora.solvers.sharding_layout import tensor_spec
from aoizora.planning.seed_refinement import RefinementError, attention_pins
from benchmarks.grid import spearman
from benchmarks.machine import git_state
from benchmarks.q1_fidelity_collect import RESULTS
from benchmarks.q1_teacher import Teacher, teach

REPORT_MD = RESULTS.parent / "q1_fidelity.md"
REPORT_JSON = RESULTS.parent / "q1_fidelity.json"
ATTN = ("attention", "attention_bwd")


def _norm(spec) -> tuple:
    if spec is None:
        return ()
    out = [a if a not in ((), None, []) else None for a in spec]
    out = [tuple(a) if isinstance(a, list) else a for a in out]
    while out and out[-1] is None:
        out.pop()
    return tuple(out)


def input_pins(ir, graph, layout: Layout) -> list[dict[str, str]]:
    """One-strategy cuts that keep every program input's group on a strategy laying its inputs
    out as ``layout.in_specs`` does (groups with no such strategy are left free)."""
    leaves: dict[str, list[int]] = {}
    for i, tid in enumerate(ir.inputs):
        o = graph.origin.get(tid)
        if o is not None and i < len(layout.in_specs):
            leaves.setdefault(o[0], []).append(i)
    cuts = []
    for gid, idx in leaves.items():
        G = graph.groups[gid]
        if G.kind in ATTN:
            continue
        ok = [k for k in range(len(G.strategies))
              if all(_norm(tensor_spec(ir, graph, {gid: k}, ir.inputs[i]))
                     == _norm(layout.in_specs[i]) for i in idx)]
        if ok:
            cuts += [{gid: st.name} for k, st in enumerate(G.strategies) if k not in ok]
    return cuts


def layout_attention_seconds(G, st, layout: Layout, ir, chip) -> float | None:
    """Seconds per step of attention group ``G`` under strategy ``st`` by Q1's kernel model at
    the tiles ``layout`` runs it with (its own tiles, else the automatic ones:
    ``models.attention_kernels.padded_lengths``), with the pads and relayouts around the kernel
    at those tiles (``formulation.attention_tiles.wrapper_seconds``) and, in a ring, the ring's
    combine, carry copies and log-sum-exp slice (``formulation.ring_overhead``), as the ILP
    prices a strategy; None when not a forward attention or no kernel chip."""
    if G.kind != "attention" or chip is None:
        return None
    n = ir.node(G.anchor)
    al = layout.attention_for(G.anchor)
    sh = attention_shapes(ir).get(G.anchor)
    if sh is None:
        return None
    sizes = layout.mesh_axes
    n_b, n_h, n_s = (math.prod(sizes[a] for a in st.labels.get(lab, ())) for lab in "bhs")
    r = n_s if st.kv == "ring" else 1
    t = al.tiles
    sq, skv, bq, bkv = padded_lengths(sh.q_len, sh.kv_len, n_s, kv=st.kv, impl="splash",
                                      block_q=t.get("block_q"), block_kv=t.get("block_kv"))
    bkvc = t.get("block_kv_compute") or bkv
    lead = sh.batch // n_b * (sh.heads // n_h)
    one = splash_seconds(SplashShape(lead, sq // n_s, skv // r, sh.head_dim, sh.dtype_bytes),
                         bq, bkv, bkvc if bkv % bkvc == 0 else bkv, chip)
    around = wrapper_seconds(sh, n_b, n_h, n_s, st.kv == "ring", bq, bkv, chip)
    if st.kv == "ring":
        around += ring_overhead_seconds(n_s, -(-sh.batch // n_b) * -(-sh.heads // n_h),
                                        -(-sh.q_len // n_s), -(-sh.kv_len // n_s), sh.head_dim,
                                        sh.dtype_bytes, chip.hbm_Bps)
    return (r * one + around) * n.repeat


def q1_terms(graph, model, choice: dict[str, int], attention_s: dict[str, float] | None = None
             ) -> dict[str, float]:
    """Q1 and its terms (seconds per step) of a choice; memory in bytes per device.
    ``attention_s``: group -> attention compute to use instead of the strategy's (the layout's
    own tiles)."""
    attention_s = attention_s or {}
    ev = evaluate(graph, choice)
    total = ev["total_s"]
    att_c = att_comm = other_c = own_comm = 0.0
    for g, k in choice.items():
        G, st = graph.groups[g], graph.groups[g].strategies[k]
        if G.kind in ATTN:
            comp = attention_s.get(g, st.compute)
            cost = max(comp, st.comm) if st.kv == "ring" else comp + st.comm
            total += cost - st.cost
            att_c += comp
            att_comm += cost - comp
        else:
            other_c += st.cost - st.comm
            own_comm += st.comm
    return {"step_s": total, "compute_attention_s": att_c, "compute_other_s": other_c,
            "attention_comm_s": att_comm, "own_collectives_s": own_comm,
            "resharding_s": ev["edges_s"] - ev["prefetch_hidden_s"],
            "prefetch_hidden_s": ev["prefetch_hidden_s"],
            "communication_s": total - att_c - other_c,
            "peak_bytes": peak_memory(model, choice, remat=None)}


def variant_problem(variant: str, target, mesh: dict[str, int] | None = None,
                    teacher: Teacher | None = None, **kw) -> ShardingProblem:
    """The ShardingProblem of a Q1 variant: "roofline" (attention and every op priced
    max(flops / peak, bytes / HBM), followers unfused: Q1 before issue 52), "current" (the
    defaults: attention by the splash kernel model at its tiles, fused followers, ring permutes
    over one link) or "feedback" (current, with what ``teacher``'s compile taught:
    ``benchmarks.q1_teacher``)."""
    if variant == "roofline":
        c = target.chip
        kw["hardware"] = Hardware(float(c.device_peak_flops), float(c.device_hbm_bandwidth_Bps),
                                  int(c.device_hbm_bytes))
        kw["options"] = Options(fusion=False)
    elif variant == "feedback" and teacher is not None:
        kw["axis_costs"] = teacher.axis_costs(target, mesh)
        kw["options"] = Options(compute_scale=teacher.compute_scale)
        kw["attention_scale"] = {"*": {"gather": teacher.attention_scale,
                                       "ring": teacher.attention_scale}}
    elif variant not in ("current", "feedback"):
        raise ValueError(f"Q1 variant {variant!r}: use 'roofline', 'current' or 'feedback'")
    return ShardingProblem(remat="stacks", **kw)


def _no_switch(graph, gid: str, choice: dict[str, int]) -> int:
    """The strategy of switch group ``gid`` that keeps the spec its join computes in (no
    reshard): a choice the ILP made before it had switch points, completed."""
    e = next(e for e in graph.edges if e.consumer == gid and e.operand == SWITCH_EDGE)
    have = e.p_specs[e.p_of[choice[e.producer]]]
    return next(k for k, q in enumerate(e.q_of) if e.q_specs[q] == have)


def q1_of(rec: dict[str, Any], ir, target, variant: str = "current",
          teacher: Teacher | None = None) -> dict[str, Any]:
    """Q1 terms of one record's layout (module docstring) under Q1 ``variant``."""
    layout = Layout.from_json(rec["layout"])
    mesh = dict(rec["mesh"])
    prob = variant_problem(variant, target, mesh, teacher)
    _hw, _b, graph, model = build_problem(ir, target, mesh, prob)
    if rec.get("choice"):
        names = rec["choice"]
        choice = {}
        for gid, G in graph.groups.items():
            if G.kind == "switch" and gid not in names:
                choice[gid] = _no_switch(graph, gid, choice)   # chosen before switch points
                continue
            want = names.get(gid)
            idx = [k for k, st in enumerate(G.strategies) if st.name == want]
            if not idx:
                raise KeyError(f"group {gid}: strategy {want!r} no longer offered")
            choice[gid] = idx[0]
        how = "the ILP's own choice"
    else:
        _kept, cuts = attention_pins(graph, layout)
        cuts += input_pins(ir, graph, layout)
        res = solve_sharding(ir, target, mesh, variant_problem(
            variant, target, mesh, teacher, graph=graph, forbidden=cuts or None),
            time_limit_s=60.0, seed=0)
        choice = {g: next(k for k, st in enumerate(graph.groups[g].strategies) if st.name == n)
                  for g, n in res.best.choice.items()}
        how = f"ILP pinned to the expert ({len(cuts)} cuts), {res.best.certificate.status}"
    chip = _hw.kernel_chip() if variant != "roofline" else None
    att = {}
    for g, k in choice.items():
        t = layout_attention_seconds(graph.groups[g], graph.groups[g].strategies[k], layout, ir,
                                     chip)
        if t is not None:
            att[g] = t * (teacher.attention_scale if teacher is not None else 1.0)
    out = q1_terms(graph, model, choice, att)
    out["how"] = how
    return out


def _ratio(a, b):
    return (a / b) if (a is not None and b) else None


def _as_compiled_now(rec: dict[str, Any], experts: dict[str, Any], target) -> bool:
    """Whether ``rec``'s program was compiled with the compiler options its layout gets today:
    an ILP layout ``ilp_compiler_options(target)``, an expert its published options. A layout
    compiled under other settings is another program than the one Q1 now prices."""
    had = dict(rec["layout"].get("compiler_options") or {})
    if rec.get("choice"):
        return had == ilp_compiler_options(target)
    ex = experts.get(rec["name"])
    return ex is None or had == dict(ex.layout.compiler_options or {})


def cell_rows(d: Path, variant: str = "current", teacher_name: str = "",
              all_settings: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The cell's rows under Q1 ``variant``, and the teacher's summary ("feedback": the layout
    ``teacher_name``, default the first ILP layout on the smallest mesh it has). Only layouts
    compiled with the options the planner compiles them with today (``_as_compiled_now``),
    unless ``all_settings``."""
    recs = [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]
    recs = [r for r in recs if "sim" in r]
    if not recs:
        return []
    model, rest = d.name.split("_", 1)
    res_frames, target = rest.rsplit("_", 1)
    resolution, frames = res_frames.split("-")
    job = builtin_job(model, resolution, int(frames.rstrip("f")), target)
    experts = {f"expert:{ex.name}": ex for ex in expert_layouts(job.model, job.workload, job.target)}
    if not all_settings:
        recs = [r for r in recs if _as_compiled_now(r, experts, job.target)]
    irs: dict[str, Any] = {}

    def ir_of(r):
        prog = "job" if r["program"].get("job") else r["name"]
        if prog not in irs:
            fn, args = (job.fn, job.args) if prog == "job" else (experts[prog].fn, experts[prog].args)
            irs[prog] = build_ir(fn, *args)
        return irs[prog]

    teacher = None
    if variant == "feedback":
        # the layout the planner compiles first: the ILP's best by Q1 (today's ILP layouts)
        ilps = sorted((r for r in recs if r.get("choice") and r["name"].startswith("ilp52")),
                      key=lambda r: (r.get("q1_at_collect_s") or math.inf, r["name"]))
        trec = next((r for r in recs if r["name"] == teacher_name), ilps[0] if ilps else recs[0])
        teacher = teach(d, trec, q1_of(trec, ir_of(trec), job.target, "current"), job.target)
    rows = []
    for r in recs:
        t0 = time.perf_counter()
        try:
            q1 = q1_of(r, ir_of(r), job.target, variant, teacher)
        except (ShardingSolveError, RefinementError, KeyError) as e:
            q1 = {"error": str(e).splitlines()[0]}
        q1["wall_s"] = round(time.perf_counter() - t0, 2)
        rows.append({"name": r["name"], "mesh": r["mesh"], "q1": q1, "q2": r["q2"],
                     "teacher": teacher is not None and r["name"] == teacher.name,
                     "sim": r["sim"], "memory": r["memory"], "fits_hbm": r["fits_hbm"],
                     "collective_bytes": r["collective_bytes"]})
    return rows, (teacher.summary() if teacher is not None else None)


def cell_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if "step_s" in r["q1"] and r["fits_hbm"] and not r.get("teacher")]
    q1 = [r["q1"]["step_s"] for r in ok]
    q2 = [r["q2"]["step_s"] for r in ok]
    sim = [r["sim"]["step_s"] for r in ok]
    err = [abs(a / s - 1) for a, s in zip(q1, sim)]
    err2 = [abs(a / s - 1) for a, s in zip(q2, sim)]
    e12 = [abs(a / b - 1) for a, b in zip(q1, q2)]
    return {"layouts": len(ok), "median_abs_q1_over_sim_minus_1": statistics.median(err) if err else None,
            "median_abs_q1_over_q2_minus_1": statistics.median(e12) if e12 else None,
            "spearman_q1_q2": spearman(q1, q2),
            "spearman_q1_sim": spearman(q1, sim), "median_abs_q2_over_sim_minus_1":
            statistics.median(err2) if err2 else None, "spearman_q2_sim": spearman(q2, sim)}


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def first_choices(cells: dict[str, Any]) -> list[str]:
    """Per cell of at least two layouts: the simulator's fastest layout and the layout Q1 and Q2
    each rank first (with its simulated step); how often each model's first is the simulator's,
    and how often the simulator's fastest is one of the ILP's own layouts (named ``ilp...``)."""
    lines, n, own, hit = [], 0, 0, {"q1": 0, "q2": 0}
    for name, c in cells.items():
        rows = [r for r in c["rows"] if "step_s" in r["q1"] and r["fits_hbm"]
                and not r.get("teacher")]
        if len(rows) < 2:
            continue
        n += 1
        best = {k: min(rows, key=lambda r, k=k: r[k]["step_s"]) for k in ("sim", "q1", "q2")}
        own += best["sim"]["name"].startswith("ilp")
        for k in hit:
            hit[k] += best[k] is best["sim"]
        lines.append(f"- {name}: fastest simulated {best['sim']['name']} "
                     f"({_ms(best['sim']['sim']['step_s'])} ms); Q1's first {best['q1']['name']} "
                     f"({_ms(best['q1']['sim']['step_s'])}); Q2's first {best['q2']['name']} "
                     f"({_ms(best['q2']['sim']['step_s'])})")
    if not n:
        return []
    return ([f"Which layout each ranks first (simulated ms): over {n} cells the simulator's "
             f"fastest is one of the ILP's own layouts in {own}; Q1's first is the "
             f"simulator's fastest in {hit['q1']}, Q2's in {hit['q2']}.", ""] + lines + [""])


def _commits(cells: dict[str, Any]) -> str:
    """The commit(s) whose Q1 a tag's cells were computed with, in words."""
    got = sorted({(c.get("git") or {}).get("git_commit", "")[:12] for c in cells.values()})
    if got == [""]:
        return "commit not recorded (runs before 2026-12-08)"
    return "Q1 at commit " + ", ".join(g or "not recorded" for g in got)


def markdown(cells: dict[str, Any], tag: str) -> str:
    L = [f"# Q1 fidelity ({tag})", "", _commits(cells) + ".", "",
         "Q1 (the sharding ILP's objective, predicted, placement-oblivious) of every compiled "
         "layout against the reference simulator (simulated by the AoiZora reference simulator on "
         "the compiled XLA:TPU HLO, JAX's default device order) and Q2 (predicted). Milliseconds "
         "per step; nothing ran on a TPU. Generated by `python -m benchmarks.q1_fidelity`. "
         "Layouts compiled under other compiler options than the planner gives them now (ILP "
         "layouts before `formulation/compiler_settings.py`) are left out unless the run says "
         "`--all-settings`.", ""]
    meds = [c["summary"]["median_abs_q1_over_sim_minus_1"] for c in cells.values()
            if c["summary"]["median_abs_q1_over_sim_minus_1"] is not None]
    rhos = [c["summary"]["spearman_q1_sim"] for c in cells.values()
            if c["summary"]["spearman_q1_sim"] is not None]
    L += ["| cell | layouts | median abs(Q1/sim - 1) | Spearman rho (Q1, sim) | "
          "median abs(Q2/sim - 1) | Spearman rho (Q2, sim) | median abs(Q1/Q2 - 1) | "
          "Spearman rho (Q1, Q2) |", "|---|---|---|---|---|---|---|---|"]
    for name, c in cells.items():
        s = c["summary"]
        f = lambda v, p="{:.1%}": "-" if v is None else p.format(v)  # noqa: E731
        L.append(f"| {name} | {s['layouts']} | {f(s['median_abs_q1_over_sim_minus_1'])} | "
                 f"{f(s['spearman_q1_sim'], '{:.2f}')} | {f(s['median_abs_q2_over_sim_minus_1'])} | "
                 f"{f(s['spearman_q2_sim'], '{:.2f}')} | {f(s['median_abs_q1_over_q2_minus_1'])} | "
                 f"{f(s['spearman_q1_q2'], '{:.2f}')} |")
    if meds:
        pooled = [abs(r["q1"]["step_s"] / r["sim"]["step_s"] - 1) for c in cells.values()
                  for r in c["rows"] if "step_s" in r["q1"] and r["fits_hbm"]
                  and not r.get("teacher")]
        L += ["", f"Over cells: median of the cells' median abs(Q1/sim - 1) "
                  f"{statistics.median(meds):.1%}; median cell's Spearman rho "
                  f"{statistics.median(rhos) if rhos else float('nan'):.2f}. Over all "
                  f"{len(pooled)} layouts of these cells: median abs(Q1/sim - 1) "
                  f"{statistics.median(pooled):.1%}.", ""]
    L += first_choices(cells)
    for name, c in cells.items():
        t = c.get("teacher")
        L += [f"## {name}", ""] + ([
            f"Feedback from one compile: `{t['teacher']}` (mesh {t['mesh']}): compute scale "
            f"{t['compute_scale']:.3f}, attention scale {t['attention_scale']:.3f}, collective "
            f"kind ratios {', '.join(f'{k} {v:.2f}' for k, v in t['kind_ratios'].items())}; "
            "its row is left out of the cell's figures.", ""] if t else []) + [
              "| layout | mesh | Q1 | Q2 | sim | Q1 attn | Q2 attn | sim attn | Q1 other | "
              "Q2 other | sim other | Q1 own coll. | Q1 reshard | sim coll. (all runs) | "
              "sim exposed | Q1 peak GiB | compiler GiB |",
              "|" + "---|" * 17]
        for r in c["rows"]:
            q1, q2, s = r["q1"], r["q2"], r["sim"]
            if "step_s" not in q1:
                L.append(f"| {r['name']} | {r['mesh']} | error: {q1.get('error')} |" + " |" * 14)
                continue
            sk = s.get("compute_by_kind", {})
            s_att = sum(v for k, v in sk.items() if k.startswith("attention"))
            s_oth = s["compute_s"] - s_att
            coll = sum(v["time_s"] for v in s["collectives"].values())
            mesh = "x".join(str(v) for v in r["mesh"].values())
            L.append(f"| {r['name']} | {mesh} | {_ms(q1['step_s'])} | {_ms(q2['step_s'])} | "
                     f"{_ms(s['step_s'])} | {_ms(q1['compute_attention_s'])} | "
                     f"{_ms(q2['compute_attention_s'])} | {_ms(s_att)} | "
                     f"{_ms(q1['compute_other_s'])} | {_ms(q2['compute_other_s'])} | {_ms(s_oth)} | "
                     f"{_ms(q1['own_collectives_s'] + q1['attention_comm_s'])} | "
                     f"{_ms(q1['resharding_s'])} | {_ms(coll)} | {_ms(s['communication_s'])} | "
                     f"{q1['peak_bytes'] / 2**30:.2f} | "
                     f"{r['memory']['compiler_total_bytes'] / 2**30:.2f} |")
        L.append("")
    return "\n".join(L) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="current", help="label of this Q1 (e.g. the change made)")
    ap.add_argument("--variant", default="current", choices=("current", "roofline", "feedback"),
                    help="Q1 as it is now, priced by rooflines only (Q1 before issue 52), or "
                         "as it is now after one compile's feedback")
    ap.add_argument("--teacher", default="", help="feedback: the layout that was compiled")
    ap.add_argument("--cells", default="", help="comma-separated cell directory names")
    ap.add_argument("--all-settings", action="store_true",
                    help="also layouts compiled under other compiler options than the planner "
                         "gives them today")
    ap.add_argument("--report-only", action="store_true",
                    help="write the markdown again from q1_fidelity.json, computing nothing")
    a = ap.parse_args(argv)
    if a.report_only:
        hist = json.loads(REPORT_JSON.read_text())
        REPORT_MD.write_text("\n".join(markdown(c, t) for t, c in hist.items()))
        print(f"wrote {REPORT_MD}")
        return 0
    want = {c for c in a.cells.split(",") if c}
    dirs = [d for d in sorted(RESULTS.iterdir()) if d.is_dir() and (not want or d.name in want)]
    if not dirs:
        print(f"no evidence under {RESULTS}: run python -m benchmarks.q1_fidelity_collect first",
              file=sys.stderr)
        return 2
    cells = {}
    for d in dirs:
        rows, teacher = cell_rows(d, a.variant, a.teacher, a.all_settings)
        if rows:
            cells[d.name] = {"rows": rows, "summary": cell_summary(rows), "teacher": teacher,
                             "git": git_state()}
            print(d.name, cells[d.name]["summary"], flush=True)
    hist = json.loads(REPORT_JSON.read_text()) if REPORT_JSON.exists() else {}
    hist.setdefault(a.tag, {}).update(cells)
    REPORT_JSON.write_text(json.dumps(hist, indent=1, default=str))
    REPORT_MD.write_text("\n".join(markdown(c, t) for t, c in hist.items()))
    print(f"wrote {REPORT_MD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
