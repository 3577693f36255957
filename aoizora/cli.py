"""The aoizora command line.

Exit codes (one meaning each):
  0    done (check: the plan passes);
  1    only from check: the plan regressed (no longer compiles for its target, no longer fits in
       HBM, or its prediction exceeds --max-step-ms / the baseline);
  2    bad input or configuration, one line on stderr (aoizora: error: <field>: <what is wrong>;
       <what to do>), no traceback: arguments, plan files, an --out that cannot be written
       (also when the save fails after planning: the plan is still printed), a LIBTPU_INIT_ARGS
       libtpu refuses, no libtpu;
  3    a fault of aoizora's own (with its traceback);
  130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: plan saves the best plan so far to --out
       (and prints it) with status INTERRUPTED, or says in one line that none was found yet; a
       second signal quits at once.
Input is checked before any work: a file to write (--out, --png) first, then every plan file
read (aoizora.plan_schema; check reads its --baseline too), then LIBTPU_INIT_ARGS, then the job
is built, planned or compiled."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback


class UsageError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def _number(kind: str, low: float, strict: bool):
    """An argparse type: a finite number (int or float) above `low` (at or above unless strict)."""
    def parse(text: str):
        try:
            v = int(text) if kind == "int" else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {'whole ' if kind == 'int' else ''}number") from None
        if not math.isfinite(v) or v < low or (strict and v == low):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a {'whole' if kind == 'int' else 'finite'} number "
                f"{'above' if strict else 'of at least'} {low:g}")
        return v
    parse.__name__ = kind       # argparse names the type in its messages
    return parse


_POSITIVE = _number("float", 0, strict=True)    # --time-budget, --max-step-ms
_COUNT = _number("int", 1, strict=False)        # --top-k
_FRACTION = _number("float", 0, strict=False)   # --tolerance


def check_writable(flag: str, path: str) -> None:
    """A UsageError unless `path` can be written as a file: not a directory, in a directory that
    exists, writable. Tried by opening it for append (nothing truncated; a file this check
    created is removed again), so permissions, read-only file systems and root are all judged by
    the system itself."""
    if os.path.isdir(path):
        raise UsageError(f"{flag}: {path!r} is a directory; give a file path, e.g. "
                         f"{os.path.join(path, 'plan.json')}")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise UsageError(f"{flag}: {parent!r} (where {path!r} would go) is not an existing "
                         f"directory; create it or give another path")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise UsageError(f"{flag}: {path!r} cannot be written ({e.strerror}); give a "
                         f"writable path") from None
    if not existed:
        os.remove(path)


def _fmt_bytes(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB"


def cmd_targets(args: argparse.Namespace) -> int:
    from aoizora.extract import targets as T

    src = getattr(args, "from_topology", None)
    if src:
        ts = [T.get_target(src if src.startswith("topo:") else "topo:" + src)]
    else:
        ts = [T.get_target(args.name)] if args.name else T.standard_targets()
    rows = [t.to_json() for t in ts]
    if args.json:
        print(json.dumps(rows if not (args.name or src) else rows[0], indent=2))
        return 0
    hdr = (f"{'name':<10} {'canonical':<13} {'chips':>5} {'devices':>7}  {'shape':<8} {'wrap':<12} "
           f"{'link (one way)':>15} {'HBM/chip':>10} {'bf16 peak/chip':>15}")
    print(hdr)
    for r in rows:
        wrap = ",".join("y" if w else "n" for w in r["wrap"])
        print(f"{r['name']:<10} {r['canonical']:<13} {r['chips']:>5} {r['devices']:>7}  "
              f"{'x'.join(map(str, r['shape'])):<8} {wrap:<12} "
              f"{r['link_bandwidth_Bps'] / 1e9:>10.0f} GB/s {_fmt_bytes(r['hbm_bytes']):>10} "
              f"{r['peak_bf16_flops'] / 1e12:>10.0f} TFLOP/s")
    print("wrap: wraparound link per physical axis (y/n). TPU numbers: Google Cloud TPU docs and "
          "the JAX scaling book; GPU: datasheets and NCCL (src/graph/topo.h, tuning.cc).")
    for r in rows:
        if "links" in r:
            _print_links(r)
    return 0


def _print_links(row: dict) -> None:
    """The distinct links of a GPU target (bandwidth one way, latency, source), one line each."""
    print(f"\n{row['name']}: {row['description']}")
    seen = set()
    for l in row["links"]:
        key = (l["kind"], l["bandwidth_Bps"], l["latency_s"])
        n = sum(1 for m in row["links"] if (m["kind"], m["bandwidth_Bps"], m["latency_s"]) == key)
        if key in seen:
            continue
        seen.add(key)
        print(f"  {n:>2} x {l['kind']:<7} {l['a']} - {l['b']} ...  {l['bandwidth_Bps'] / 1e9:7.1f} "
              f"GB/s each way, {l['latency_s'] * 1e6:4.2f} us  [{l['source']}]")


def _fmt_count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def cmd_models(args: argparse.Namespace) -> int:
    from aoizora.models.registry import models_table

    rows = models_table()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for m in rows:
        nominal = (f"nominal {_fmt_count(m['nominal_params'])}" if m["nominal_params"]
                   else "a small test configuration")
        print(f"{m['name']:<22} {_fmt_count(m['params'])} parameters (computed from the "
              f"configuration; {nominal})")
        for w in m["workloads"]:
            print(f"    {w['name']:<12} {w['width']}x{w['height']}, {w['frames']} frames -> "
                  f"latent {'x'.join(map(str, w['latent']))}, {w['tokens']:,} tokens after the (1,2,2) patch")
    return 0


def _job(args: argparse.Namespace, plan=None):
    """The built-in job of the arguments; with a plan, the program variant the plan was made for."""
    from aoizora.builtin import builtin_job

    prog = (plan.program or {}) if plan is not None else {}
    task = getattr(args, "task", "denoise")
    if task == "train" and prog.get("batch") not in (None, args.batch):
        raise UsageError(f"--batch {args.batch}: the plan was made for batch {prog['batch']}")
    return builtin_job(args.model, args.resolution, args.frames, args.target,
                       pad_multiple=prog.get("pad_multiple"), task=task,
                       batch=getattr(args, "batch", 1), remat=prog.get("remat"))


def _cache(args: argparse.Namespace):
    """The evidence cache of ``--cache-dir`` / ``AOIZORA_CACHE`` / the user cache directory, at
    most ``--cache-limit`` GiB; None with ``--no-cache`` (``extract.evidence_cache``)."""
    from aoizora.extract.evidence_cache import CacheError, open_cache

    if getattr(args, "no_cache", False):
        return None
    limit = getattr(args, "cache_limit", None)
    try:
        return open_cache(args.cache_dir or True,
                          int(limit * 1024 ** 3) if limit is not None else None)
    except CacheError as e:
        raise UsageError(f"--cache-dir: {e}") from None


def _workers(args: argparse.Namespace):
    from aoizora.planning.compile_workers import WorkersError, workers_for

    try:
        return workers_for(args.compile_workers)
    except WorkersError as e:
        raise UsageError(str(e)) from None


def _plan_json(p) -> dict:
    d = p.to_json()
    d["device_order"] = [list(c) for c in p.device_coords]
    d["device_ids"] = list(p.device_order)
    return d


# The wall clock's guard when ``--compiles`` is given and ``--time-budget`` is not, seconds:
# the count decides, the guard only stops a run on a machine far slower than expected.
COMPILE_GUARD_S = 3600.0


def _time_budget(args: argparse.Namespace, default: float = 300.0) -> float:
    """``--time-budget`` if given; else ``COMPILE_GUARD_S`` with ``--compiles``, else
    ``default``."""
    if args.time_budget is not None:
        return args.time_budget
    return COMPILE_GUARD_S if getattr(args, "compiles", None) is not None else default


def _check_compiler() -> None:
    """LIBTPU_INIT_ARGS that libtpu refuses is a configuration error (exit 2), checked before
    anything compiles (``extract.targets.check_libtpu_args``)."""
    from aoizora.extract.targets import check_libtpu_args

    check_libtpu_args()


def cmd_plan(args: argparse.Namespace) -> int:
    from aoizora.planner import plan
    from aoizora.planning.progress import ConsoleProgress, Progress

    if args.out is not None:
        if not args.out.strip():
            raise UsageError("--out: an empty path; give a file path, e.g. --out plan.json, or "
                             "leave --out out to print the plan only")
        check_writable("--out", args.out)
    calibration = None
    if args.calibration:
        from aoizora.plans import load_plan

        calibration = load_plan(args.calibration)
    _check_compiler()
    args.signals.keeps_plan = True     # a first signal stops planning and keeps the best
    args.signals.quit_note = ("quit at once, no plan saved"
                              + (f" ({args.out} unchanged)" if args.out else ""))
    job = _job(args)
    prog = Progress() if args.quiet else ConsoleProgress()
    time_budget = _time_budget(args)
    count = "" if args.compiles is None else f"{args.compiles} compiles, guard "
    prog.stage(f"planning {job.describe()}, budget {count}{time_budget:g} s, seed {args.seed}")
    from aoizora.builtin import expert_seed_layouts

    seeds = [] if args.no_seeds else expert_seed_layouts(job)
    workers = _workers(args)
    try:
        p = plan(job.fn, *job.args, target=job.target, time_budget_s=time_budget,
                 seed=args.seed, top_k=args.top_k, seed_layouts=seeds, progress=prog,
                 calibration=calibration, compiles=args.compiles, cache=_cache(args),
                 compile_workers=workers, screen=not args.no_screen)
    finally:
        workers.close()
    if not p.program:
        p.program = job.program()
    with args.signals.critical():      # a second signal waits for the save (atomic anyway)
        return _save_and_print(p, args)


def _save_and_print(p, args: argparse.Namespace) -> int:
    """Save the plan to --out (atomically) and print it; a failed save still prints the plan,
    then one line and exit 2. An interrupted plan exits 130 (SIGINT) / 143 (SIGTERM)."""
    from aoizora.report import format_plan

    failed = ""
    if args.out:
        try:
            p.save(args.out)
            args.signals.quit_note = f"quit; the plan is saved in {args.out}"
        except OSError as e:
            failed = (f"--out: the plan could not be saved to {args.out!r} ({e.strerror or e}); "
                      f"the file there is unchanged; the plan is printed above")
    if args.json:
        print(json.dumps(_plan_json(p), indent=1, allow_nan=False))
    else:
        print(format_plan(p))
        if args.out and not failed:
            print(f"saved: {args.out}")
    sys.stdout.flush()
    if failed:
        raise UsageError(failed)
    return _interrupted_code(args) if p.status == "INTERRUPTED" else 0


def _interrupted_code(args: argparse.Namespace) -> int:
    from aoizora.planning.interrupts import EXIT_CODES

    names = {"SIGINT": 2, "SIGTERM": 15}
    sig = names.get(args.signals.stop.reason, 2)
    return EXIT_CODES.get(sig, 128 + sig)


def cmd_show(args: argparse.Namespace) -> int:
    from aoizora.plans import load_plan
    from aoizora.report import format_plan

    if args.png:
        check_writable("--png", args.png)
    p = load_plan(args.plan)
    if args.json:
        print(json.dumps(_plan_json(p), indent=1, allow_nan=False))
    else:
        print(format_plan(p))
    if args.png:
        from aoizora.picture import draw_plan

        draw_plan(p, args.png)
        print(f"picture: {args.png}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from aoizora.extract.evidence_summary import summarize_evidence
    from aoizora.extract.network import default_device_order
    from aoizora.planner import compile_layout
    from aoizora.plans import load_plan, program_key

    p = load_plan(args.plan) if args.plan else None     # checked before anything is built
    _check_compiler()
    job = _job(args, p)
    if p is not None:
        fn, fargs, layout, order = job.fn, job.args, p.layout, p.device_order
        p.check_key(program_key(fn, fargs, job.target.name), ignore_target=False)
        what = f"plan {args.plan}"
    else:
        from aoizora.compare import job_experts

        exs = {e.name: e for e in job_experts(job)}
        if args.expert not in exs:
            raise UsageError(f"unknown expert configuration {args.expert!r}; known: {', '.join(exs)}")
        ex = exs[args.expert]
        if not ex.valid:
            raise UsageError(f"expert configuration {ex.name} is not valid here: {ex.reason}")
        fn, fargs, layout = ex.fn, ex.args, ex.layout
        order = default_device_order(job.target, layout.mesh_axes)
        what = f"expert configuration {ex.name} ({ex.reason}), JAX's default device order"
    ev = compile_layout(fn, fargs, job.target, layout, order, cache=_cache(args))
    if args.json:
        print(json.dumps(ev.to_json()))
    else:
        print(f"{job.describe()}: {what}")
        print(summarize_evidence(ev))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from aoizora.compare import compare
    from aoizora.plans import load_plan, program_key
    from aoizora.planning.progress import ConsoleProgress, Progress

    plan = load_plan(args.plan) if args.plan else None  # checked before anything is built
    _check_compiler()
    job = _job(args)
    if plan is not None:
        pjob = _job(args, plan)
        plan.check_key(program_key(pjob.fn, pjob.args, pjob.target.name), ignore_target=False)
    prog = Progress() if args.quiet else ConsoleProgress()
    workers = _workers(args)
    try:
        res = compare(job, plan=plan, time_budget_s=_time_budget(args, 120.0), seed=args.seed,
                      progress=prog, compiles=args.compiles, tuned=args.tuned,
                      tune_compiles=args.tune_compiles, cache=_cache(args),
                      compile_workers=workers)
    finally:
        workers.close()
    res.pop("plan")
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{job.describe()}: step latency predicted by the Q2 link-load model on the compiled "
          f"TPU program (not measured)")
    print(f"{'configuration':<32} {'mesh':<14} {'step ms':>10} {'AoiZora speedup':>16}  note")
    for r in res["rows"]:
        mesh = "x".join(f"{k}{v}" for k, v in (r.get("mesh") or {}).items()) or "-"
        step = f"{r['step_s'] * 1e3:.3f}" if r.get("step_s") else "-"
        sp = f"{r['speedup']:.3f}x" if r.get("speedup") else "-"
        note = r.get("reason") or r.get("description") or ""
        print(f"{r['name']:<32} {mesh:<14} {step:>10} {sp:>16}  {note[:90]}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Exit 0 when the plan still compiles for its target in its own device order, fits in HBM and
    its re-priced prediction has not regressed; 1 when it fails a check; 2 on bad input."""
    from aoizora.extract.aot_compile import CompileError, compiler_differences
    from aoizora.extract.network import Network
    from aoizora.formulation.latency import predict_step
    from aoizora.planner import compile_layout
    from aoizora.plans import load_plan, program_key

    from aoizora.extract.targets import libtpu_available

    p = load_plan(args.plan)
    base = load_plan(args.baseline) if args.baseline else None   # both read before compiling
    _check_compiler()
    if not libtpu_available():   # not the plan's fault: a configuration error, not a FAIL
        raise UsageError("libtpu is unavailable here, so the plan cannot be compiled; install "
                         "the project with its TPU compiler: pip install -e .")
    job = _job(args, p)
    p.check_key(program_key(job.fn, job.args, job.target.name), ignore_target=False)
    try:
        ev = compile_layout(job.fn, job.args, job.target, p.layout, p.device_order,
                            cache=_cache(args))
    except CompileError as e:
        print(f"FAIL: the plan no longer compiles for {job.target.name} in its device order: "
              f"{str(e).splitlines()[0][:160]}")
        return 1
    if not ev.memory.fits:
        print(f"FAIL: the plan no longer fits in HBM on {job.target.name}: {ev.memory.oom_message[:160]}")
        return 1
    q = predict_step(ev, p.device_order, Network.from_target(job.target))
    limit, what = None, ""
    if base is not None:
        limit = base.predicted["step_s"] * (1 + args.tolerance)
        what = f"baseline {base.predicted['step_s'] * 1e3:.3f} ms + {100 * args.tolerance:g}%"
    if args.max_step_ms is not None:
        lim2 = args.max_step_ms / 1e3
        if limit is None or lim2 < limit:
            limit, what = lim2, f"--max-step-ms {args.max_step_ms:g}"
    msg = (f"plan {args.plan}: compiles for {job.target.name} in its device order, fits in HBM "
           f"({ev.memory.total_bytes / 1024**3:.2f} GiB/device); predicted step "
           f"{q.step_s * 1e3:.3f} ms (Q2 model)")
    changed = compiler_differences(p.compiler)
    if changed:
        msg += f"; compiled by another compiler than the plan's ({', '.join(changed)})"
    if limit is not None and q.step_s > limit:
        print(f"FAIL: {msg} exceeds {limit * 1e3:.3f} ms ({what})")
        return 1
    print(f"OK: {msg}" + (f" <= {limit * 1e3:.3f} ms ({what})" if limit is not None else ""))
    return 0


def _add_job_args(p: argparse.ArgumentParser) -> None:
    from aoizora import builtin as B

    p.add_argument("--model", default=B.DEFAULT_MODEL, help=f"built-in model (default {B.DEFAULT_MODEL}; see aoizora models)")
    p.add_argument("--resolution", default=B.DEFAULT_RESOLUTION, help=f"480p, 720p, 544p (default {B.DEFAULT_RESOLUTION})")
    p.add_argument("--frames", type=int, default=B.DEFAULT_FRAMES, help=f"video frames (default {B.DEFAULT_FRAMES})")
    p.add_argument("--target", default=B.DEFAULT_TARGET, help=f"TPU slice (default {B.DEFAULT_TARGET}; see aoizora targets)")
    p.add_argument("--task", choices=B.TASKS, default="denoise",
                   help="denoise: one CFG denoising step (default); train: one Wan 2.1 training "
                        "step (flow matching, AdamW) with --batch videos")
    p.add_argument("--batch", type=_COUNT, default=1,
                   help="training: global batch, videos per step (default 1)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="evidence cache directory (default $AOIZORA_CACHE, else the user cache "
                        "directory, e.g. ~/.cache/aoizora)")
    p.add_argument("--cache-limit", type=_POSITIVE, metavar="GIB",
                   help="evidence cache size limit in GiB; least recently used entries are "
                        "evicted past it (default 2)")
    p.add_argument("--no-cache", action="store_true",
                   help="compile everything again; read and write no evidence cache")


def _add_workers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile-workers", default="auto", metavar="WHERE",
                   help="where compiles run: auto (default: as many local processes as cores "
                        "and memory hold, in-process when that is one), inline, local, local:N, "
                        "ray (a local Ray instance or $RAY_ADDRESS), ray://HOST:PORT (a cluster; "
                        "needs the ray extra)")


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (and where to read the usage) instead of the
    whole usage text; exit code 2 as argparse's. Subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="aoizora", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("targets", help="list TPU and GPU targets (or show one) with chips, shape, wraparound, links, HBM")
    t.add_argument("name", nargs="?", help="a target in any accepted spelling: v5e-8, v5e:2x4, v5litepod-8, v5p-8, v7x-8, h100-8, l40-8, topo:FILE")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.add_argument("--from-topology", metavar="FILE", help="a GPU box from `nvidia-smi topo -m` "
                   "output or NCCL's topology XML (NCCL_TOPO_DUMP_FILE); GEN:FILE names the GPU "
                   "(h100, a100, l40). Use the same file as target=topo:FILE")
    t.set_defaults(func=cmd_targets)

    m = sub.add_parser("models", help="list the built-in models and workloads with parameter and token counts")
    m.add_argument("--json", action="store_true", help="print JSON")
    m.set_defaults(func=cmd_models)

    pl = sub.add_parser("plan", help="plan a built-in model (default: Wan 2.1 1.3B, 480p, 81 frames, v5e-8)")
    _add_job_args(pl)
    pl.add_argument("--time-budget", type=_POSITIVE, default=None, help="seconds for the whole call, compiles included (default 300; with --compiles, a guard of 3600)")
    pl.add_argument("--compiles", type=_COUNT, default=None, help="at most N candidate compiles: the count, not the machine's load, decides what is priced (the time budget is then a guard)")
    pl.add_argument("--seed", type=int, default=0, help="solver seed (default 0)")
    pl.add_argument("--top-k", type=_COUNT, default=2, help="layouts compiled per iteration (default 2)")
    pl.add_argument("--no-seeds", action="store_true",
                    help="do not price today's expert configurations alongside the ILP's layouts")
    pl.add_argument("--no-screen", action="store_true",
                    help="compile every layout fully in the pricing order, without screening it "
                         "first by its early evidence (the compile stopped after libtpu's HLO "
                         "passes) and compiling the screen's best first")
    pl.add_argument("--calibration", metavar="PLAN",
                    help="start from what an earlier plan's loop learned on this target (a plan "
                         "file from aoizora plan --out, e.g. of another frame count)")
    pl.add_argument("--out", help="save the plan as JSON (atomically: the file there stays whole "
                                  "if the save fails or is interrupted)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _add_workers_arg(pl)
    pl.set_defaults(func=cmd_plan)

    sh = sub.add_parser("show", help="summarize a saved plan (and draw it with --png)")
    sh.add_argument("plan", help="a plan file from aoizora plan --out")
    sh.add_argument("--png", help="draw the chip grid with link loads and logical ranks (needs the plot extra)")
    sh.add_argument("--json", action="store_true", help="print the plan as JSON")
    sh.set_defaults(func=cmd_show)

    ins = sub.add_parser("inspect", help="what the TPU compiler emitted for an expert configuration or a plan")
    _add_job_args(ins)
    ins.add_argument("--expert", default="context", help="expert configuration (default context)")
    ins.add_argument("--plan", help="a saved plan for this model, workload and target instead")
    ins.add_argument("--json", action="store_true", help="print the whole evidence as JSON")
    ins.set_defaults(func=cmd_inspect)

    ck = sub.add_parser("check", help="CI gate: the plan still compiles, fits and has not "
                        "regressed (exit 1 only then; 2 for bad input or configuration)",
                        description="Exit 0: the plan passes; 1: the plan regressed (no longer "
                        "compiles for its target, no longer fits in HBM, or its prediction "
                        "exceeds --max-step-ms / the baseline); 2: bad input or configuration "
                        "(a plan file, a LIBTPU_INIT_ARGS libtpu refuses, no libtpu), one line.")
    ck.add_argument("plan", help="a plan file from aoizora plan --out")
    _add_job_args(ck)
    ck.add_argument("--baseline", help="a reference plan file; fail when the prediction exceeds its own by --tolerance")
    ck.add_argument("--tolerance", type=_FRACTION, default=0.10, help="allowed regression over the baseline (default 0.10)")
    ck.add_argument("--max-step-ms", type=_POSITIVE, help="fail when the predicted step exceeds this many ms")
    ck.set_defaults(func=cmd_check)

    cp = sub.add_parser("compare", help="the plan against expert configurations, Alpa-style search, default order")
    _add_job_args(cp)
    cp.add_argument("--plan", help="a saved plan (else plan now)")
    cp.add_argument("--time-budget", type=_POSITIVE, default=None, help="planning budget when no --plan (default 120; with --compiles, a guard of 3600)")
    cp.add_argument("--compiles", type=_COUNT, default=None, help="planning budget in candidate compiles when no --plan")
    cp.add_argument("--tuned", action="store_true", help="also each expert at the best of the knobs its users turn (remat, attention blocks, compiler options), the best of them, and that one under a solved placement")
    cp.add_argument("--tune-compiles", type=_COUNT, default=None, help="with --tuned: at most this many settings compiled per expert (default: every one)")
    cp.add_argument("--seed", type=int, default=0)
    cp.add_argument("--json", action="store_true")
    cp.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _add_workers_arg(cp)
    cp.set_defaults(func=cmd_compare)
    return p


def _user_errors() -> tuple:
    from aoizora.builtin import WorkloadError
    from aoizora.extract.targets import TargetError
    from aoizora.formulation.calibration import CalibrationError
    from aoizora.models.training import TrainingError
    from aoizora.planner import PlanningError
    from aoizora.plans import PlanError
    from aoizora.runtime.realize import RealizeError
    from aoizora.solvers.sharding import ShardingSolveError

    return (UsageError, TargetError, WorkloadError, PlanningError, PlanError, RealizeError,
            ShardingSolveError, CalibrationError, TrainingError)


def _host_backend_for_gpu_targets(args: argparse.Namespace) -> None:
    """Planning for a GPU target on a machine without one: run jax on the CPU backend (XLA:GPU
    compiles ahead of time through the CUDA plugin's topology, which needs no backend), so the
    plugin does not try, and fail, to start CUDA. A user's JAX_PLATFORMS is kept."""
    import glob

    target = str(getattr(args, "target", "") or "")
    gpu_target = target.lower().startswith("topo:") or target.lower() in (
        "h100-8", "a100-8", "l40-8", "h100-16")
    if gpu_target and not os.environ.get("JAX_PLATFORMS") and not glob.glob("/dev/nvidia[0-9]*"):
        import jax                  # read before any backend starts (none has: nothing ran yet)
        jax.config.update("jax_platforms", "cpu")


def main(argv: list[str] | None = None) -> int:
    """Run one command (exit codes: the module docstring). SIGINT and SIGTERM are handled for the
    whole command (``aoizora.planning.interrupts``, installed before libtpu initialises, so that
    libtpu's native stack dump never shows): plan keeps and saves its best plan so far; any
    other command, or a second signal, quits at once."""
    from aoizora.planning.interrupts import handling_signals
    from aoizora.solvers.stop import Stop, running

    args = build_parser().parse_args(argv)
    _host_backend_for_gpu_targets(args)
    stop = Stop()
    with running(stop), handling_signals(stop, hard_exit=True) as signals:
        args.signals = signals
        code = _run_command(args)
        if stop.is_set():
            # a compile abandoned by the interrupt may still run in its thread: leave without
            # waiting for it (nothing else is pending: the plan is saved, the output flushed)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _run_command(args: argparse.Namespace) -> int:
    from aoizora.planning_errors import PlanningError

    try:
        return args.func(args)
    except _user_errors() as e:
        print(f"aoizora: error: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        if isinstance(e, PlanningError) and e.kind == "interrupted":
            return _interrupted_code(args)
        return 2
    except KeyboardInterrupt:
        print("aoizora: interrupted", file=sys.stderr)
        return 130
    except Exception:   # a fault of aoizora's, not the input's: 3, so that 1 stays a regression
        traceback.print_exc()
        print("aoizora: internal error (the traceback above); please report it", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
