"""Plans in words: the summary `aoizora plan` and `aoizora show` print."""

from __future__ import annotations

import collections
import re

from aoizora.plans import Plan

_KEY = re.compile(r"\[(\S+)")
TIME_LIMITED_SHOWN = 5   # of plan.time_limited, under its note


def main_ops(words: list[str], limit: int = 8) -> list[str]:
    """Attention layouts one per line, then the most common matmul layouts with their counts."""
    attn = [w for w in words if "attention" in w.split(":")[0]]
    dots = collections.Counter("dot: " + w.split(" [")[0].split(":", 1)[1].strip()
                               for w in words if w.startswith("dot"))
    out = [w.split(" [")[0] for w in attn]
    out = list(dict.fromkeys(out))  # the same layout for every layer is said once
    for text, n in dots.most_common(max(0, limit - len(out))):
        out.append(f"{text}  ({n} matmul{'s' if n > 1 else ''})")
    return out


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f} ms"


def format_plan(p: Plan) -> str:
    pr = p.predicted
    lines = [f"AoiZora plan for {p.target} -- {p.status or 'status unknown'}"]
    lines.append("mesh: " + " x ".join(f"{k}={v}" for k, v in p.mesh.items()))
    lines.append("layout of the main ops:")
    lines += [f"  {w}" for w in main_ops(p.layout_in_words)]
    order = ", ".join(f"{r}->({','.join(map(str, c))})" for r, c in enumerate(p.device_coords))
    lines.append(f"device order (logical rank -> chip x,y): {order}")
    lines.append(f"predicted step latency: {_ms(pr.get('step_s'))} "
                 f"(compute {_ms(pr.get('compute_s'))}, exposed communication "
                 f"{_ms(pr.get('communication_s'))}, hop latency {_ms(pr.get('latency_s'))}); "
                 f"under JAX's default device order "
                 f"{_ms(pr.get('default_order_step_s'))}")
    lines.append(f"  source: {pr.get('model', '?')} -- a prediction, not a measurement")
    if p.fits_hbm is not None:
        hbm = f"{p.hbm_bytes_per_device / 1024**3:.2f} GiB/device" if p.hbm_bytes_per_device else ""
        lines.append(f"HBM: {'fits' if p.fits_hbm else 'DOES NOT FIT'} {hbm} (compiler's memory analysis)")
    lines.append("certificates:")
    for name, c in p.certificates.items():
        gap = "-" if c.gap is None else f"{100 * c.gap:.2f}%"
        lines.append(f"  {name:<9} {c.solver:<18} {c.status:<9} objective {_ms(c.objective)}  "
                     f"bound {_ms(c.bound)}  gap {gap}  {c.time_s:.2f} s")
    lines.append(f"iterations: {len(p.iterations)}; planning time {p.planning_time_s:.1f} s")
    if p.compiles:
        c = p.compiles
        lines.append(f"compiles: {c.get('compiled', 0)} compiled ({c.get('workers', '?')}), "
                     f"{c.get('cached', 0)} from the evidence cache"
                     + (f", {c['screened']} screened by early evidence" if "screened" in c else "")
                     + (f", {c['failed']} failed" if c.get("failed") else "")
                     + (f" ({c['cache']})" if c.get("cache") else " (no cache)")
                     + (f"; {c['solver_answers_cached']} solver answers from it"
                        if c.get("solver_answers_cached") else ""))
    if p.compiler:
        c = p.compiler
        lines.append(f"compiled by: jax {c.get('jax') or '?'}, libtpu {c.get('libtpu') or '?'}"
                     + (f", LIBTPU_INIT_ARGS={c['LIBTPU_INIT_ARGS']}"
                        if c.get("LIBTPU_INIT_ARGS") else ", libtpu's default options"))
    for n in p.notes:
        lines.append(f"note: {n}")
    shown = p.time_limited[:TIME_LIMITED_SHOWN]
    lines += [f"  time limit: {w}" for w in shown]
    if len(p.time_limited) > len(shown):
        lines.append(f"  ... and {len(p.time_limited) - len(shown)} more (plan.time_limited)")
    return "\n".join(lines)
