"""The sharding ILP against heuristic searches at equal wall-clock budgets.

Instances: Wan 2.1 1.3B (480p, 81 frames; one denoising step, CFG pair as batch 2, 30 scanned
blocks -- the block is in the model once), sequence padded to 128 x chips, built as
``benchmarks/sharding_ilp.py`` builds it, on v5e-16 with the 4x4 and 2x2x4 logical meshes and on
v5e-8 with 2x4. Each instance is one StrategyGraph and one ILP model
(``aoizora.solvers.sharding_heuristics.build_instance``: the same strategies, axis costs, HBM
budget and memory rows as ``solve_sharding``). At each budget (1, 5, 30, 120 s) it runs the ILP
as ``solve_sharding`` does (``aoizora.solvers.sharding.solve_model``, one thread, seed 0, wall-clock
budget = the budget: a coordinate-descent incumbent, HiGHS's LP relaxation in process (a proof
when it is integral), then the MIP solver (``--solver``: HiGHS, ``solve_sharding``'s default, or
CBC) on what is left, and the best answer; status, objective, best bound, gap, time, where the
answer came from) and each
heuristic (random search, coordinate descent with restarts, simulated annealing; seed 0, time
limit = budget: the best objective reached and how long it took to match the ILP's best
objective within 1e-6 relative, or "never").

Q1 is the ILP's objective: the predicted step latency of its placement-oblivious cost model (ms in
the tables) -- a prediction, not a measurement. All searches price a layout with the same Q1 and
the same memory rows; none returns a layout over the HBM budget.

Run:  /work/venv/bin/python -m benchmarks.sharding_vs_heuristics [--budgets 1 5 30 120] [--quick]
      [--instances v5e-16:4x4 ...] [--force] [--ilp] [--searches descent ...] [--solver cbc]
A cell is one (instance, budget); finished cells are kept in the JSON and skipped on the next
run (``--force`` re-runs them; ``--ilp`` re-runs only the ILP in them, ``--searches`` only those
searches). Writes benchmarks/results/sharding_vs_heuristics.json, .md and
.png (``--quick``: one 1 s budget on v5e-8 2x4, written as sharding_vs_heuristics_quick.*).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import aoizora  # noqa: F401  (libtpu environment first)

from benchmarks.machine import machine_info
from aoizora.extract.atomic_io import atomic_open

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL, WORKLOAD = "wan2.1-1.3b", "480p-81f"
INSTANCES = [("v5e-16", {"x": 4, "y": 4}), ("v5e-16", {"x": 2, "y": 2, "z": 4}),
             ("v5e-8", {"x": 2, "y": 4})]
BUDGETS = [1.0, 5.0, 30.0, 120.0]
SEARCHES = ["random", "descent", "annealing", "metropolis"]
SEARCH_NAMES = {"random": "random search", "descent": "coordinate descent",
                "annealing": "annealing (heat-bath)", "metropolis": "annealing (Metropolis)"}
MATCH_REL = 1e-6
SEED = 0
TRACE_POINTS = 400


def mesh_name(m: dict[str, int]) -> str:
    return "x".join(str(v) for v in m.values())


def instance_id(target: str, mesh: dict[str, int]) -> str:
    return f"{target}:{mesh_name(mesh)}"


def cell_id(target: str, mesh: dict[str, int], budget: float) -> str:
    return f"{instance_id(target, mesh)}@{budget:g}s"


def thin(trace: list, n: int = TRACE_POINTS) -> list[list[float]]:
    """At most about n points of an improvement trace: the last point in each log-spaced time bin
    (and the first and last points)."""
    if len(trace) <= n:
        return [[float(t), float(v)] for t, v in trace]
    t_lo = max(min(t for t, _ in trace), 1e-6)
    t_hi = max(t for t, _ in trace)
    width = (math.log(t_hi) - math.log(t_lo)) / n or 1.0
    keep: dict[int, tuple[float, float]] = {}
    for t, v in trace:
        keep[int((math.log(max(t, t_lo)) - math.log(t_lo)) / width)] = (t, v)
    pts = [trace[0]] + sorted(keep.values()) + [trace[-1]]
    out = []
    for t, v in pts:
        if not out or out[-1] != [float(t), float(v)]:
            out.append([float(t), float(v)])
    return out


def build(target_name: str, mesh: dict[str, int], irs: dict):
    from aoizora.extract.frontends.jax.ir_builder import build_ir
    from aoizora.extract.targets import get_target
    from aoizora.models.registry import abstract_inputs, denoise_step, get_model
    from aoizora.solvers.sharding_heuristics import build_instance

    tgt = get_target(target_name)
    pad = 128 * tgt.chips
    if pad not in irs:
        m = get_model(MODEL)
        args = abstract_inputs(m, WORKLOAD)
        irs[pad] = build_ir(denoise_step(m, pad_multiple=pad), *args)
    t0 = time.perf_counter()
    inst = build_instance(irs[pad], tgt, mesh)
    return inst, time.perf_counter() - t0, pad


def run_cell(inst, budget: float, searches: list[str] | None = None, prev: dict | None = None,
             ilp_only: bool = False, solver: str = "highs") -> dict:
    """The ILP and each search at one budget; with `searches` (and the cell's previous result
    `prev`), only those searches run again, with `ilp_only` only the ILP; the rest of `prev` is
    kept."""
    if prev is not None and (searches is not None or ilp_only):
        out = dict(prev)
        out["heuristics"] = dict(prev["heuristics"])
        old = prev.get("machine", {})
        for h in [out["ilp"], *out["heuristics"].values()]:
            h.setdefault("date", old.get("date"))
            h.setdefault("cpu", old.get("cpu"))
        if ilp_only:
            out["ilp"] = run_ilp(inst, budget, solver)
        obj = out["ilp"]["objective_s"]
        for name in searches or []:
            out["heuristics"][name] = run_search(inst, name, budget, obj)
        return out
    ilp = run_ilp(inst, budget, solver)
    obj = ilp["objective_s"]
    return {"ilp": ilp, "heuristics": {name: run_search(inst, name, budget, obj) for name in SEARCHES}}


def run_ilp(inst, budget: float, solver: str = "highs") -> dict:
    """The ILP as solve_sharding runs it (solve_model), the budget as its wall-clock limit;
    `solver`: its MIP solver ("highs", solve_sharding's default, or "cbc")."""
    from aoizora.formulation.sharding_ilp import TIME_SCALE
    from aoizora.solvers.sharding import solve_model

    r = solve_model(inst.graph, inst.model, solver=solver, time_limit_s=budget, seed=SEED, threads=1,
                    corrections=inst.corrections)
    obj = r["objective"] / TIME_SCALE if r["objective"] is not None else None
    bound = r["bound"] / TIME_SCALE if r["bound"] is not None else None
    ilp = {"solver": r["solver"], "mip_solver": solver, "status": r["status"],
           "objective_s": obj, "bound_s": bound,
           "gap": (0.0 if r["status"] == "OPTIMAL" else
                   (max(0.0, (obj - bound) / obj) if obj and bound is not None else None)),
           "time_s": r["time_s"], "answer_from": r["detail"].get("answer_from"),
           "detail": r["detail"], "loadavg": list(os.getloadavg()),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if obj is not None:
        ch = inst.from_choice(r["choice"])
        ilp["heuristic_price_s"] = inst.objective(ch)     # the heuristics' price of the ILP's choice
        ilp["peak_bytes"] = float(inst.rows(ch).max())
        ilp["feasible_for_heuristics"] = inst.feasible(ch)
    print(f"  ILP {budget:g}s: {r['status']} Q1={obj} bound={bound} in {r['time_s']:.2f}s "
          f"(answer from {ilp['answer_from']})", flush=True)
    return ilp


def run_search(inst, name: str, budget: float, ilp_obj: float | None, seed: int = SEED) -> dict:
    from aoizora.solvers.sharding_heuristics import SEARCHES as FNS

    res = FNS[name](inst, time_limit_s=budget, seed=seed)
    c = res.certificate
    print(f"  {name:9s} {budget:g}s seed {seed}: {c.status} Q1={c.objective} in {c.time_s:.2f}s "
          f"(evaluated {res.evaluated})", flush=True)
    return {"search": c.solver, "status": c.status, "objective_s": c.objective,
            "time_s": c.time_s, "loadavg": list(os.getloadavg()), "evaluated": res.evaluated,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "peak_bytes": res.peak_bytes, "choice": res.names,
            "detail": c.detail, "trace": thin(res.trace), "n_improvements": len(res.trace),
            "full_trace_match_s": (res.time_to_reach(ilp_obj, MATCH_REL) if ilp_obj is not None
                                   else None)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", type=float, nargs="+", default=None)
    ap.add_argument("--instances", nargs="+", default=None, help="e.g. v5e-16:4x4 v5e-8:2x4")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--searches", nargs="+", choices=SEARCHES, default=None,
                    help="re-run only these searches in finished cells (keeps the rest)")
    ap.add_argument("--ilp", action="store_true",
                    help="re-run only the ILP in finished cells (keeps the searches)")
    ap.add_argument("--solver", choices=["highs", "cbc"], default="highs",
                    help="the ILP's MIP solver (default: HiGHS, as solve_sharding)")
    ap.add_argument("--spread-seeds", type=int, nargs="+", default=[],
                    help="also run every search with these seeds at --spread-budget (seed spread)")
    ap.add_argument("--spread-budget", type=float, default=5.0)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    base = "sharding_vs_heuristics_quick" if a.quick else "sharding_vs_heuristics"
    budgets = a.budgets or ([1.0] if a.quick else BUDGETS)
    chosen_inst = [(t, m) for t, m in INSTANCES
                   if (a.instances is None and (not a.quick or t == "v5e-8"))
                   or (a.instances is not None and instance_id(t, m) in a.instances)]
    path = os.path.join(a.out, base + ".json")
    doc = json.load(open(path)) if os.path.exists(path) else {}
    doc.update({"model": MODEL, "workload": WORKLOAD, "seed": SEED, "match_rel": MATCH_REL,
                "units": {"objective": "Q1, the ILP's predicted step latency (placement-oblivious "
                                       "cost model), seconds in the JSON, ms in the tables; a "
                                       "prediction, not a measurement",
                          "time": "wall-clock seconds on this machine",
                          "peak_bytes": "largest ILP memory row, bytes per device"}})
    doc.setdefault("instances", {})
    irs: dict = {}
    for tname, mesh in chosen_inst:
        iid = instance_id(tname, mesh)
        done = doc["instances"].get(iid, {}).get("cells", {})
        todo = [b for b in budgets if a.force or a.searches or a.ilp or cell_id(tname, mesh, b) not in done]
        spread = doc["instances"].get(iid, {}).get("seed_spread", {}).get(f"{a.spread_budget:g}s", {})
        seeds = [sd for sd in a.spread_seeds if any(str(sd) not in spread.get(n, {}) for n in SEARCHES)]
        if not todo and not seeds:
            continue
        inst, build_s, pad = build(tname, mesh, irs)
        entry = doc["instances"].setdefault(iid, {"cells": {}})
        entry.update({"target": tname, "mesh": mesh, "pad_multiple": pad, "build_s": build_s,
                      "groups": len(inst.gids), "free_groups": int(len(inst.free)),
                      "strategies": int(inst.K.sum()), "edges": len(inst.edges),
                      "memory_rows": int(len(inst.const)), "hbm_budget_bytes": inst.budget,
                      "log10_choices": float(sum(math.log10(int(k)) for k in inst.K)),
                      "ilp_size": inst.model.size()})
        for b in todo:
            print(f"{iid} budget {b:g} s", flush=True)
            cell = run_cell(inst, b, a.searches, done.get(cell_id(tname, mesh, b)), a.ilp,
                            a.solver)
            cell.update({"budget_s": b, "machine": machine_info()})
            entry["cells"][cell_id(tname, mesh, b)] = cell
            doc["machine"] = machine_info()
            os.makedirs(a.out, exist_ok=True)
            with atomic_open(path) as f:
                json.dump(doc, f, indent=1)
        ref = [c["ilp"]["objective_s"] for c in entry["cells"].values() if c["ilp"]["objective_s"]]
        sp = entry.setdefault("seed_spread", {}).setdefault(f"{a.spread_budget:g}s", {})
        for sd in seeds:
            print(f"{iid} budget {a.spread_budget:g} s, seed {sd}", flush=True)
            for name in SEARCHES:
                if str(sd) in sp.get(name, {}) and not a.force:
                    continue
                r = run_search(inst, name, a.spread_budget, min(ref) if ref else None, seed=sd)
                sp.setdefault(name, {})[str(sd)] = {k: r[k] for k in ("status", "objective_s", "time_s",
                                                                      "evaluated", "loadavg",
                                                                      "full_trace_match_s")}
            doc["machine"] = machine_info()          # the report's "machine of the last run"
            with atomic_open(path) as f:
                json.dump(doc, f, indent=1)
    finish(doc)
    write_md(doc, os.path.join(a.out, base + ".md"))
    plot(doc, os.path.join(a.out, base + ".png"))
    with atomic_open(path) as f:
        json.dump(doc, f, indent=1)


def finish(doc: dict) -> None:
    """Per instance: the reference objective (the best ILP objective over all budgets) and each
    heuristic's time to match it (within match_rel) in each cell."""
    for iid, e in doc["instances"].items():
        objs = [c["ilp"]["objective_s"] for c in e["cells"].values() if c["ilp"]["objective_s"] is not None]
        ref = min(objs) if objs else None
        proven = any(c["ilp"]["status"] == "OPTIMAL" for c in e["cells"].values())
        e["reference_s"], e["reference_proven"] = ref, proven
        for c in e["cells"].values():
            for h in c["heuristics"].values():
                if ref is None or h["objective_s"] is None:
                    h["match_s"], h["excess"] = None, None
                    continue
                h["excess"] = h["objective_s"] / ref - 1.0
                if c["ilp"]["objective_s"] == ref:   # from the full trace, not the thinned one
                    h["match_s"] = h["full_trace_match_s"]
                else:
                    h["match_s"] = next((t for t, v in h["trace"] if v <= ref * (1 + doc["match_rel"])),
                                        None)


def _src(il: dict, short: bool = False) -> str:
    """Where the ILP's answer came from, when not from its MIP solver."""
    src = il.get("answer_from")
    if src in (None, "solver"):
        return ""
    if short:
        return {"lp-relaxation": " (LP)", "incumbent": " (incumbent)"}.get(src, f" ({src})")
    return {"lp-relaxation": " (HiGHS LP relaxation, integral)",
            "incumbent": " (descent incumbent)"}.get(src, f" ({src})")


def _dates(doc: dict) -> str:
    """When, and on which CPU, the ILP rows and the searches of each budget were run: a row's
    own date and cpu where a partial re-run (``--ilp``, ``--searches``) kept it from an earlier
    machine, else its cell's."""
    runs: dict[tuple[str, str, str], set] = {}
    for e in doc["instances"].values():
        for c in e["cells"].values():
            m0 = c.get("machine", {})
            d0, cpu0 = m0.get("date", "?"), m0.get("cpu", "?")
            b = f"{c['budget_s']:g} s"
            for what, h in [("ILP", c["ilp"]), *(("searches", h) for h in c["heuristics"].values())]:
                runs.setdefault((what, h.get("date", d0)[:10], h.get("cpu") or cpu0),
                                set()).add(b)
    parts = []
    for (what, day, cpu), bs in sorted(runs.items()):
        parts.append(f"{what} on {day} ({cpu}) at budgets "
                     f"{', '.join(sorted(bs, key=lambda x: float(x[:-2])))}")
    return "; ".join(parts)


def _mip_solvers(doc: dict) -> str:
    """The MIP solver(s) the ILP rows ran with (rows from before ``--solver`` ran CBC)."""
    names = {"highs": "HiGHS", "cbc": "CBC"}
    used = sorted({names.get(c["ilp"].get("mip_solver", "cbc"), c["ilp"].get("mip_solver"))
                   for e in doc["instances"].values() for c in e["cells"].values()})
    return " and ".join(used) or "?"


def _ms(v) -> str:
    return "" if v is None else f"{v * 1e3:.4f}"


def write_md(doc: dict, path: str) -> None:
    m = doc.get("machine", {})
    mip = _mip_solvers(doc)
    lines = [f"# Sharding ILP against heuristics: {doc['model']} {doc['workload']}", "",
             f"Machine of the last run: {m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs shared with other "
             f"jobs (load average {', '.join(f'{x:.1f}' for x in m.get('loadavg', []))}), "
             f"PuLP {m.get('pulp')}, numpy {m.get('numpy')}; {m.get('date', '')}. Every solver and search "
             f"single-threaded, seed {doc['seed']}; the budget is the wall-clock time limit of each run: "
             "for the ILP the whole solve as `solve_sharding` runs it (`solve_model`: a coordinate-descent "
             "incumbent, HiGHS's LP relaxation in process -- a proof when its solution is integral --, "
             f"then the MIP solver, {mip}, as a process on an MPS file on the time left, and the best "
             "answer), for a search its stop.", "",
             f"Runs: {_dates(doc)}.", "",
             "Q1 = the sharding ILP's objective: the predicted step latency of its placement-oblivious "
             "cost model, in **ms** -- a prediction, not a measurement. Every search prices a layout "
             "with exactly this Q1 (the ILP's own node, edge and correction costs) and rejects any "
             "layout over the ILP's HBM memory rows. 'excess' = Q1 / (best ILP Q1) - 1. "
             f"'match' = seconds until the search's best was within {doc['match_rel']:g} (relative) "
             "of the best ILP Q1; 'never' = not within the budget. Heuristics prove nothing (no bound). "
             "Time is wall clock, seconds; the machine is shared, so times are indicative.", "",
             "Searches: random search (uniform strategy per group, batches of 256); coordinate "
             "descent (cyclic, each group to its best strategy given the rest, from all-replicated, "
             "then cheapest-per-group, then random restarts); simulated annealing with single-group "
             "moves, geometric cooling over the budget, from all-replicated, a final descent: "
             "heat-bath (the group's strategy drawn from exp(-delta/T) over all its strategies that "
             "fit) and Metropolis (one strategy drawn uniformly, accepted with min(1, exp(-delta/T))). "
             "Instance build (strategies, PuLP model, arrays) is done once per instance and not "
             "counted in any budget, for the ILP as for the searches: `solve_sharding` reports it "
             "apart (`build_s`), and its `time_limit_s` starts after it.", ""]
    budgets = sorted({c["budget_s"] for e in doc["instances"].values() for c in e["cells"].values()})
    lines += ["## Summary", "",
              "Excess of each method's best Q1 over the best ILP Q1 at each budget (relative); "
              f"'= (t s)': matched within {doc['match_rel']:g} after t seconds; ILP: status, wall-clock "
              f"seconds of the whole solve, and where the answer came from when not from the MIP solver ({mip}; 'LP': "
              "HiGHS's LP relaxation, whose solution was integral, so proven by its own bound; "
              "'incumbent': the descent inside the ILP's budget); 'over' when it passed the budget.", "",
              "| instance | method | " + " | ".join(f"{b:g} s" for b in budgets) + " |",
              "|---|---|" + "---|" * len(budgets)]
    for iid, e in doc["instances"].items():
        cells = {c["budget_s"]: c for c in e["cells"].values()}
        row = []
        for b in budgets:
            c = cells.get(b)
            if c is None:
                row.append("not run")
                continue
            il = c["ilp"]
            row.append(f"{il['status']} {il['time_s']:.2f} s" + _src(il, short=True)
                       + (" (over)" if il["time_s"] > b else ""))
        lines.append(f"| {e['target']} {mesh_name(e['mesh'])} | ILP | " + " | ".join(row) + " |")
        for name in SEARCHES:
            row = []
            for b in budgets:
                h = cells[b]["heuristics"].get(name) if b in cells else None
                if h is None or h.get("excess") is None:
                    row.append("not run" if h is None else h["status"])
                elif h["match_s"] is not None:
                    row.append(f"= ({h['match_s']:.1f} s)")
                else:
                    row.append(f"{h['excess']:.1e}")
            lines.append(f"| | {SEARCH_NAMES[name]} | " + " | ".join(row) + " |")
    lines.append("")
    for iid, e in doc["instances"].items():
        for bkey, sp in sorted(e.get("seed_spread", {}).items(), key=lambda kv: float(kv[0][:-1])):
            b = float(bkey[:-1])
            main_cell = next((c for c in e["cells"].values() if c["budget_s"] == b), None)
            seeds = sorted({int(sd) for runs in sp.values() for sd in runs})
            if main_cell is not None:
                seeds = [doc["seed"]] + [sd for sd in seeds if sd != doc["seed"]]
            if "## Seeds" not in lines:
                lines += ["## Seeds", "",
                          "The searches are randomised: the same budget with other seeds (relative "
                          "excess over the best ILP Q1; '=' matched within the tolerance). Seed "
                          f"{doc['seed']} is the main run above.", ""]
            lines += [f"{e['target']} {mesh_name(e['mesh'])}, {b:g} s budget:", "",
                      "| method | " + " | ".join(f"seed {sd}" for sd in seeds) + " |",
                      "|---|" + "---|" * len(seeds)]
            for name in SEARCHES:
                row = []
                for sd in seeds:
                    if sd == doc["seed"] and main_cell is not None:
                        r = main_cell["heuristics"].get(name)
                        m_s = None if r is None else r.get("full_trace_match_s")
                    else:
                        r = sp.get(name, {}).get(str(sd))
                        m_s = None if r is None else r.get("full_trace_match_s")
                    if r is None or r["objective_s"] is None or not e.get("reference_s"):
                        row.append("" if r is None else r["status"])
                    elif m_s is not None:
                        row.append(f"= ({m_s:.1f} s)")
                    else:
                        row.append(f"{r['objective_s'] / e['reference_s'] - 1:.1e}")
                lines.append(f"| {SEARCH_NAMES[name]} | " + " | ".join(row) + " |")
            lines.append("")
    for iid, e in doc["instances"].items():
        lines += [f"## {e['target']}, mesh {mesh_name(e['mesh'])}", "",
                  f"{e['groups']} groups ({e['free_groups']} with a choice), {e['strategies']} strategies, "
                  f"{e['edges']} edges, {e['memory_rows']} memory rows, 10^{e['log10_choices']:.1f} "
                  f"layouts; HBM budget {e['hbm_budget_bytes'] / 2**30:.2f} GiB per device; "
                  f"ILP {e['ilp_size']['binaries']} binaries, {e['ilp_size']['continuous']} continuous, "
                  f"{e['ilp_size']['constraints']} rows; build {e['build_s']:.2f} s. "
                  f"Best ILP Q1 {_ms(e['reference_s'])} ms"
                  f"{' (proven optimal)' if e['reference_proven'] else ' (not proven)'}.", "",
                  "| budget s | method | status | Q1 ms | excess | bound ms | gap | time s | match s | evaluated |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for cid, c in sorted(e["cells"].items(), key=lambda kv: kv[1]["budget_s"]):
            b = c["budget_s"]
            il = c["ilp"]
            ex = (il["objective_s"] / e["reference_s"] - 1.0) if il["objective_s"] is not None else None
            gap = "" if il["gap"] is None else f"{il['gap']:.2%}"
            over = " (over the budget)" if il["time_s"] > b else ""
            lines.append(f"| {b:g} | ILP | {il['status']}{_src(il)}{over} | {_ms(il['objective_s'])} | "
                         f"{'' if ex is None else f'{ex:.2e}'} | {_ms(il['bound_s'])} | {gap} | "
                         f"{il['time_s']:.2f} | {il['time_s']:.2f} | |")
            for name in SEARCHES:
                h = c["heuristics"].get(name)
                if h is None:
                    continue
                match = "never" if h["match_s"] is None else f"{h['match_s']:.3f}"
                ex = "" if h["excess"] is None else f"{h['excess']:.2e}"
                lines.append(f"| {b:g} | {SEARCH_NAMES[name]} | {h['status']} | {_ms(h['objective_s'])} | "
                             f"{ex} | | | {h['time_s']:.2f} | {match} | {h['evaluated']} |")
        lines.append("")
    lines += ["- Each budget is a separate run. Random search and coordinate descent do the same work "
              "whatever the budget (runs differ only by how fast the shared machine was); annealing "
              "spreads its cooling over its budget, so a longer budget is a different run, not a "
              "continuation, and can end worse than a shorter one (see the seed table for its spread).",
              "- 'evaluated': layouts priced (random search), single-group moves priced (descent: every "
              "strategy of a group counts one), annealing steps plus the final descent's moves.",
              "- The ILP's match time is its solve time (the whole `solve_model` call); the "
              "heuristics' prices of the ILP's own layout equal its objective "
              "(`heuristic_price_s` in the JSON). Its stages (incumbent, LP relaxation, MPS write, MIP "
              "process, seconds) are in each cell's `ilp.detail`. The LP relaxation (HiGHS in "
              "process, no presolve) comes first at every budget; it is integral on all three "
              "instances and so proves the optimum without the MIP process (`solve_model` in "
              "solvers/sharding.py), whose MPS file alone takes 0.55-0.86 s to write on v5e-16 "
              "2x2x4 (255985 nonzeros).",
              f"- Plot: `{os.path.basename(path)[:-3]}.png` (excess over the best ILP Q1 against time, "
              "from each search's run at the largest budget)."]
    with atomic_open(path) as f:
        f.write("\n".join(lines) + "\n")


def plot(doc: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inst = [e for e in doc["instances"].values() if e["cells"] and e["reference_s"]]
    if not inst:
        return
    floor = 1e-7
    fig, axes = plt.subplots(1, len(inst), figsize=(max(5.2 * len(inst), 6.0), 4.6), squeeze=False)
    colors = {"random": "tab:gray", "descent": "tab:blue", "annealing": "tab:orange",
              "metropolis": "tab:green"}
    for ax, e in zip(axes[0], inst):
        ref = e["reference_s"]
        big = max(e["cells"].values(), key=lambda c: c["budget_s"])
        for name in SEARCHES:
            h = big["heuristics"].get(name)
            if not h or not h["trace"]:
                continue
            ts = [max(t, 1e-4) for t, _ in h["trace"]] + [h["time_s"]]
            ys = [max(v / ref - 1.0, floor) for _, v in h["trace"]]
            ys.append(ys[-1])
            ax.step(ts, ys, where="post", color=colors[name], label=SEARCH_NAMES[name])
        for c in e["cells"].values():
            il = c["ilp"]
            if il["objective_s"] is None:
                continue
            y = max(il["objective_s"] / ref - 1.0, floor)
            ax.plot([il["time_s"]], [y], marker="*", ms=11, color="tab:red", ls="none",
                    label="ILP, each budget" if c is next(iter(e["cells"].values())) else None)
        ax.axhline(floor, color="tab:red", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("wall-clock time (s)")
        ax.set_ylabel(f"Q1 / best ILP Q1 - 1  ({floor:g} = matched)")
        ax.set_title(f"{e['target']} {mesh_name(e['mesh'])}: best ILP Q1 {ref * 1e3:.2f} ms\n"
                     f"searches at the {big['budget_s']:g} s budget", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Sharding ILP against heuristics, {doc['model']} {doc['workload']}\n"
                 "(Q1 = predicted step latency, placement-oblivious model)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
