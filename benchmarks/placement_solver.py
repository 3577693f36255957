"""CP-SAT placement solver against heuristic searches at equal wall-clock budgets.

    python -m benchmarks.placement_solver [--budgets 1 5 30] [--quick]

Instances: v5e-16 (4x4) and v5e-64 (8x8) with Wan-2.1-1.3B-like per-layer evidence built by hand
(``benchmarks.evidence_fixtures.wan_like_evidence``: 32,760 tokens x 1,536 hidden, bf16, 30
layers; a 2D logical mesh ulysses x context), until evidence parsed from a real compile is wired
in. Every search prices placements with the same cost function (``formulation.traffic``): the
exposed communication seconds per step (Q2's communication term).

Writes benchmarks/results/placement_solver.json and .md, with the machine (nproc, CPU model).
Targets (issue 5): proven optimal for 4x4 in < 10 s; within 5% of the bound for 8x8 in 60 s.
"""

from __future__ import annotations

from benchmarks.machine import machine_info
import argparse
import json
from pathlib import Path

import aoizora  # noqa: F401  (libtpu environment first)
from aoizora.extract.network import Network, default_device_order
from aoizora.extract.targets import get_target
from aoizora.formulation.latency import predict_step
from aoizora.solvers import placement_heuristics as H
from aoizora.solvers.placement import solve_placement

from benchmarks.evidence_fixtures import wan_like_evidence

RESULTS = Path(__file__).parent / "results"
INSTANCES = [("v5e-16", 4, 4), ("v5e-64", 4, 16)]
# issue 5's targets: (instance, CP-SAT budget in s, what must hold)
TARGET_CHECKS = {"v5e-16": (10.0, "proven optimal"), "v5e-64": (60.0, "within 5% of the bound")}


def machine() -> dict:
    return machine_info()

def time_to_reach(trace, value, tol=1e-12):
    for t, o in trace:
        if o <= value * (1 + tol):
            return t
    return None


def run(budgets, target_checks=True, out_dir=RESULTS) -> dict:
    out = {"machine": machine(), "budgets_s": budgets,
           "evidence": "hand-built Wan-2.1-1.3B-like per-layer collectives (32,760 tokens x 1,536 "
                       "hidden, bf16, 30 layers) on a 2D logical mesh ulysses x context; not "
                       "from a compile",
           "objective": "exposed communication seconds per step (Q2 communication term)",
           "instances": []}
    for tname, U, S in INSTANCES:
        t = get_target(tname)
        net = Network.from_target(t)
        ev = wan_like_evidence(U, S, t.name)
        d = default_device_order(t, ev.mesh_axes)
        q_def = predict_step(ev, d, net)
        inst = {"target": tname, "shape": list(t.shape), "mesh": ev.mesh_axes,
                "default_order_comm_s": q_def.communication_s,
                "default_order_step_s": q_def.step_s, "runs": []}
        print(f"{tname}: default order comm {q_def.communication_s * 1e3:.3f} ms", flush=True)
        ax = H.axis_orders(ev, net, default=d)
        inst["runs"].append(_row("axis orders", None, ax))
        for b in budgets:
            cp = solve_placement(ev, net, time_limit_s=b, seed=0, workers=1, hint=d)
            rows = [_row("CP-SAT", b, cp)]
            rnd = H.random_search(ev, net, time_limit_s=b, seed=0, default=d)
            sa = H.annealing(ev, net, time_limit_s=b, seed=0, starts=[d])
            sa_ax = H.annealing(ev, net, time_limit_s=b, seed=0, starts=[d, ax.placement])
            for name, r in (("random", rnd), ("annealing", sa),
                            ("annealing from axis orders", sa_ax)):
                rows.append(_row(name, b, r))
            cobj = cp.certificate.objective
            for row, r in zip(rows[1:], (rnd, sa, sa_ax)):
                row["time_to_match_cpsat_s"] = (time_to_reach(r.trace, cobj)
                                                if cobj is not None else None)
            inst["runs"] += rows
            for row in rows:
                print(f"  {b:>5} s  {row['search']:<28} {_ms(row['objective_s'])} ms  "
                      f"{row['status']:<9} bound {_ms(row['bound_s'])}  "
                      f"({row['time_s']:.1f} s)", flush=True)
        if target_checks and tname in TARGET_CHECKS:
            b, what = TARGET_CHECKS[tname]
            cp = solve_placement(ev, net, time_limit_s=b, seed=0, workers=1, hint=d)
            c = cp.certificate
            met = c.proven_optimal if what == "proven optimal" else (
                c.gap is not None and c.gap <= 0.05)
            lvl = c.detail.get("levels", {}).get("comm", {})
            inst["target_check"] = {"budget_s": b, "target": what, "met": bool(met),
                                    "status": c.status, "objective_s": c.objective,
                                    "bound_s": c.bound, "gap": c.gap, "time_s": c.time_s,
                                    "level1_done_at_s": lvl.get("done_at_s")}
            print(f"  target: {what} in {b:g} s -> {'met' if met else 'MISSED'} "
                  f"({c.status}, gap {c.gap}, {c.time_s:.1f} s)", flush=True)
        out["instances"].append(inst)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "placement_solver.json").write_text(json.dumps(out, indent=1))
    (out_dir / "placement_solver.md").write_text(markdown(out))
    return out


def _s(v):
    return "-" if v is None else f"{v:.1f}"


def _ms(v):
    return "   -   " if v is None else f"{v * 1e3:7.3f}"


def _row(name, budget, res) -> dict:
    c = res.certificate
    lvl = c.detail.get("levels", {}).get("comm", {}) if isinstance(c.detail, dict) else {}
    return {"search": name, "budget_s": budget, "status": c.status, "objective_s": c.objective,
            "level1_done_at_s": lvl.get("done_at_s"),
            "bound_s": c.bound, "gap": c.gap, "time_s": c.time_s,
            "formulation": c.detail.get("formulation"), "placement": res.placement,
            "trace": res.trace}


def markdown(out: dict) -> str:
    m = out["machine"]
    lines = ["# Placement: CP-SAT against heuristics at equal budgets", "",
             f"Machine: {m['nproc']} cores, {m['cpu']}. CP-SAT: 1 worker, seed 0.", "",
             f"Evidence: {out['evidence']}.", "",
             f"Objective: {out['objective']}, in ms (lower is better). Bound: CP-SAT's proven "
             "lower bound (over the model's scope: every placement for the 'sets' formulation, "
             "connected rings for 'circuit').", ""]
    for inst in out["instances"]:
        lines += [f"## {inst['target']} ({'x'.join(map(str, inst['shape']))}), logical mesh "
                  f"{inst['mesh']}", "",
                  f"JAX default order: {inst['default_order_comm_s'] * 1e3:.3f} ms exposed "
                  f"communication per step (Q2 step {inst['default_order_step_s'] * 1e3:.3f} ms).",
                  "",
                  "| budget (s) | search | objective (ms) | status | bound (ms) | gap | time (s) "
                  "| time to match CP-SAT (s) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in inst["runs"]:
            gap = "" if r["gap"] is None else f"{100 * r['gap']:.1f}%"
            ttm = r.get("time_to_match_cpsat_s", "")
            if r["search"] != "CP-SAT" and "time_to_match_cpsat_s" in r:
                ttm = "never" if ttm is None else f"{ttm:.2f}"
            obj = "-" if r["objective_s"] is None else f"{r['objective_s'] * 1e3:.3f}"
            bnd = "-" if r["bound_s"] is None else f"{r['bound_s'] * 1e3:.3f}"
            form = f" ({r['formulation']})" if r["formulation"] else ""
            lines.append(f"| {r['budget_s'] if r['budget_s'] is not None else '-'} | "
                         f"{r['search']}{form} | {obj} | {r['status']} | {bnd} | {gap} | "
                         f"{r['time_s']:.2f} | {ttm} |")
        lines.append("")
        tc = inst.get("target_check")
        if tc:
            gap = "-" if tc["gap"] is None else f"{100 * tc['gap']:.1f}%"
            lines += [f"Target: {tc['target']} within {tc['budget_s']:g} s: "
                      f"**{'met' if tc['met'] else 'missed'}** (CP-SAT {tc['status']}, objective "
                      f"{tc['objective_s'] * 1e3:.3f} ms, bound {tc['bound_s'] * 1e3:.3f} ms, gap "
                      f"{gap}, {tc['time_s']:.1f} s in all; the comm level ended at "
                      f"{_s(tc['level1_done_at_s'])} s, the tie-break levels used the rest).", ""]
    lines += ["Targets (issue 5): proven optimal for 4x4 in < 10 s; within 5% of the bound for "
              "8x8 in 60 s (the 'Target' lines above).", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[1, 5, 30])
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    run(a.budgets, out_dir=Path(a.out))


if __name__ == "__main__":
    main()
