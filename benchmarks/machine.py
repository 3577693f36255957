"""The machine a benchmark ran on, recorded with every result: CPU, cores, load, versions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from aoizora.extract.atomic_io import atomic_open

PACKAGES = ("jax", "jaxlib", "libtpu", "ortools", "pulp", "highspy", "numpy")
NOTE = ("CPU-only machine (no TPU): libtpu compiles ahead of time for the target; wall-clock "
        "seconds on a shared machine are indicative")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """Keys: nproc (= cpus), cpu (= cpu_model), platform, python, loadavg, date, one per package
    version, and a note."""
    out: dict[str, Any] = {
        "nproc": os.cpu_count(), "cpus": os.cpu_count(), "cpu": cpu_model(),
        "platform": platform.platform(), "python": platform.python_version(),
        "loadavg": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "note": NOTE,
    }
    out["cpu_model"] = out["cpu"]
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def git_state() -> dict[str, Any]:
    """The checkout's commit and its modified tracked files ("" and [] outside git)."""
    try:
        here = Path(__file__).resolve().parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=here, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, cwd=here).stdout.split("\n")
        dirty = [d[3:] for d in dirty if d.strip()]
    except Exception:  # noqa: BLE001
        commit, dirty = "", []
    return {"git_commit": commit, "git_modified_files": dirty}


def machine_line(doc: dict[str, Any]) -> str:
    """``Machine: ...`` for a results file, from ``doc["machine"]`` and ``doc["git"]``."""
    m = doc["machine"]
    return (f"Machine: {m.get('cpus')} CPUs ({m.get('cpu')}), jax {m.get('jax')}; commit "
            f"{doc['git'].get('git_commit', '')[:7]}; {m.get('date', '')}.")


def write_results(out_dir: str, name: str, doc: dict[str, Any], md_lines: list[str]) -> None:
    """``doc`` as ``out_dir/name.json`` and ``md_lines`` as ``out_dir/name.md``."""
    os.makedirs(out_dir, exist_ok=True)
    with atomic_open(os.path.join(out_dir, f"{name}.json")) as f:
        json.dump(doc, f, indent=1)
    with atomic_open(os.path.join(out_dir, f"{name}.md")) as f:
        f.write("\n".join(md_lines) + "\n")
