"""A human summary of Evidence (what `aoizora inspect` prints)."""

from __future__ import annotations

from collections import defaultdict

from aoizora.extract.evidence import COLLECTIVE_KINDS, Evidence


def _size(b: float) -> str:
    for unit, k in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(b) >= k:
            return f"{b / k:.2f} {unit}"
    return f"{b:.0f} B"


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def hidden_compute_cycles(ev: Evidence, kind: str = "") -> float:
    """Estimated compute cycles per call scheduled inside at least one async collective's
    start..done window (each op counted once, however many collectives overlap it); with
    ``kind`` (e.g. "all-gather"), only the windows of collectives of that kind."""
    wins = sorted((c.start_index, c.done_index) for c in ev.collectives
                  if c.is_async and c.done_index > c.start_index + 1 and kind in c.kind)
    merged: list[list[int]] = []
    for s, d in wins:
        if merged and s < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], d)
        else:
            merged.append([s, d])
    total = 0.0
    for op in ev.compute:
        if op.estimated_cycles is None:
            continue
        if any(s < op.index < d for s, d in merged):
            total += op.estimated_cycles * op.count
    return total


def summarize_evidence(ev: Evidence) -> str:
    """Collectives by kind (bytes, runs, group sizes), compute time, HBM use and fit."""
    axes = " x ".join(f"{k}={v}" for k, v in ev.mesh_axes.items()) or "-"
    lines = [f"evidence for {ev.target}, mesh {axes} ({ev.num_devices} devices), "
             f"fidelity {ev.fidelity}, compiled in {ev.compile_s:.2f} s"]
    mu = ev.memory
    lines.append(f"HBM per device: {_size(mu.total_bytes)} of {_size(mu.hbm_bytes)} "
                 f"(arguments {_size(mu.argument_bytes)}, outputs {_size(mu.output_bytes)}, "
                 f"temporaries {_size(mu.temp_bytes)}, code {_size(mu.generated_code_bytes)}, "
                 f"aliased {_size(mu.alias_bytes)}): "
                 + ("fits" if mu.fits else "DOES NOT FIT"))
    if not mu.fits and mu.oom_message:
        lines.append(f"  compiler: {mu.oom_message}")
    # collectives
    by_kind: dict[str, list] = defaultdict(list)
    for c in ev.collectives:
        by_kind[c.kind].append(c)
    n_phases = len({c.phase for c in ev.collectives})
    lines.append(f"collectives: {len(ev.collectives)} in the program, "
                 f"{sum(c.count for c in ev.collectives)} runs per call, {n_phases} phases")
    if ev.collectives:
        lines.append(f"  {'kind':<19}{'ops':>5}{'runs':>7}{'bytes/run (V)':>17}{'bytes/call':>14}"
                     f"{'async':>7}  group sizes")
    for kind in COLLECTIVE_KINDS:
        cs = by_kind.get(kind)
        if not cs:
            continue
        runs = sum(c.count for c in cs)
        per_call = sum(c.bytes * c.count for c in cs)
        sizes = sorted({c.group_size for c in cs})
        n_async = sum(1 for c in cs if c.is_async)
        lines.append(f"  {kind:<19}{len(cs):>5}{runs:>7}{_size(per_call / max(runs, 1)):>17}"
                     f"{_size(per_call):>14}{n_async:>7}  {','.join(map(str, sizes))}")
    if ev.collectives:
        lines.append("  largest (bytes/call):")
        top = sorted(ev.collectives, key=lambda c: -c.bytes * c.count)[:8]
        for c in top:
            where = c.op_name.split("/")[-1] if c.op_name else "?"
            lines.append(f"    {c.kind:<19} {c.dtype:<5} {_size(c.bytes):>11} x{c.count:<4} "
                         f"groups {len(c.replica_groups)}x{c.group_size:<3} phase {c.phase:<4}"
                         f"{' async' if c.is_async else ''}  {where}  {c.source}")
    # compute
    cyc = sum((op.estimated_cycles or 0.0) * op.count for op in ev.compute)
    n_est = sum(1 for op in ev.compute if op.estimated_cycles is not None)
    no_est = [op for op in ev.compute if op.estimated_cycles is None]
    comp_s = cyc / ev.clock_hz if ev.clock_hz else 0.0
    lines.append(f"compute: {len(ev.compute)} ops, {n_est} with compiler cycle estimates: "
                 f"{cyc:,.0f} cycles per call = {_time(comp_s)} at {ev.clock_hz / 1e9:.2f} GHz")
    if no_est:
        fl = sum(op.flops * op.count for op in no_est)
        by = sum(op.bytes * op.count for op in no_est)
        lines.append(f"  {len(no_est)} ops without estimates: {fl:.3e} FLOP, {_size(by)} moved "
                     f"(from shapes)")
    overlap = hidden_compute_cycles(ev)
    if overlap:
        lines.append(f"  compute scheduled while async collectives are in flight: {overlap:,.0f} "
                     f"cycles per call ({overlap / max(cyc, 1):.0%} of the estimated cycles)")
    opt = f", optimal {_time(ev.optimal_seconds)}" if ev.optimal_seconds is not None else ""
    lines.append(f"cost analysis per device: {ev.flops:.3e} FLOP, {_size(ev.bytes_accessed)} "
                 f"accessed{opt} (XLA counts each loop body once)")
    if ev.algorithms:
        lines.append(f"placement-dependent algorithm choices: {len(ev.algorithms)} (device order "
                     f"{ev.algorithms_device_order})")
    for w in ev.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
