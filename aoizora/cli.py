"""The `aoizora` command line. Bad input: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import argparse
import json
import sys


class UsageError(Exception):
    """An error the user can fix; printed as one line, exit code 2."""


def _fmt_bytes(n: float) -> str:
    return f"{n / 1024**3:.2f} GiB"


def cmd_targets(args: argparse.Namespace) -> int:
    from aoizora.extract import targets as T

    ts = [T.get_target(args.name)] if args.name else T.standard_targets()
    rows = [t.to_json() for t in ts]
    if args.json:
        print(json.dumps(rows if not args.name else rows[0], indent=2))
        return 0
    hdr = f"{'name':<10} {'canonical':<13} {'chips':>5}  {'shape':<8} {'wrap':<12} {'link (one way)':>15} {'HBM/chip':>10} {'bf16 peak':>12}"
    print(hdr)
    for r in rows:
        wrap = ",".join("y" if w else "n" for w in r["wrap"])
        print(f"{r['name']:<10} {r['canonical']:<13} {r['chips']:>5}  "
              f"{'x'.join(map(str, r['shape'])):<8} {wrap:<12} "
              f"{r['link_bandwidth_Bps'] / 1e9:>10.0f} GB/s {_fmt_bytes(r['hbm_bytes']):>10} "
              f"{r['peak_bf16_flops'] / 1e12:>7.0f} TFLOP/s")
    print("wrap: wraparound link per physical axis (y/n). Numbers: Google Cloud TPU docs and the JAX scaling book.")
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aoizora", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("targets", help="list TPU targets (or show one) with chips, shape, wraparound, links, HBM")
    t.add_argument("name", nargs="?", help="a target in any accepted spelling: v5e-8, v5e:2x4, v5litepod-8, v5p-8")
    t.add_argument("--json", action="store_true", help="print JSON")
    t.set_defaults(func=cmd_targets)

    m = sub.add_parser("models", help="list the built-in models and workloads with parameter and token counts")
    m.add_argument("--json", action="store_true", help="print JSON")
    m.set_defaults(func=cmd_models)
    return p


def main(argv: list[str] | None = None) -> int:
    from aoizora.extract.targets import TargetError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (UsageError, TargetError) as e:
        print(f"aoizora: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
