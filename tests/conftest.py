"""Test set-up: 8 CPU devices for running plans for real, libtpu quiet for ahead-of-time compiles."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the CLI's evidence cache (extract.evidence_cache): one per test session, not the user's; made
# by the process that starts the session (xdist's workers inherit it) and removed when it ends
if "AOIZORA_CACHE" not in os.environ:
    os.environ["AOIZORA_CACHE"] = tempfile.mkdtemp(prefix="aoizora-test-cache-")
    atexit.register(shutil.rmtree, os.environ["AOIZORA_CACHE"], ignore_errors=True)

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import aoizora  # noqa: E402,F401  (sets libtpu's environment)


# -- the 2-layer MLP shared by the sharding ILP and sharding heuristic tests -------------------
# bf16 [B, D] x [D, F] x [F, D]: 2 x 128 MB of weights, so memory pressure decides the layout.
import pytest  # noqa: E402
import jax.numpy as jnp  # noqa: E402

MLP_B, MLP_D, MLP_F = 1024, 4096, 16384


def mlp(params, x):
    h = jax.nn.gelu(x @ params["w1"])
    return h @ params["w2"]


@pytest.fixture(scope="module")
def mlp_ir():
    from aoizora.extract.frontends.jax.ir_builder import build_ir

    bf = jnp.bfloat16
    p = {"w1": jax.ShapeDtypeStruct((MLP_D, MLP_F), bf),
         "w2": jax.ShapeDtypeStruct((MLP_F, MLP_D), bf)}
    return build_ir(mlp, p, jax.ShapeDtypeStruct((MLP_B, MLP_D), bf))


@pytest.fixture(scope="module")
def v5e4():
    from aoizora.extract.targets import get_target

    return get_target("v5e-4")


# -- shared helpers (#47): the CLI in a subprocess, and a clock the tests move ------------------
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402


def run_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    """``python -m aoizora *args`` in a subprocess (in ``cwd``), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "aoizora", *args], capture_output=True,
                          text=True, cwd=cwd)


class TestClock:
    """``time.perf_counter`` as a test sees it, so ``solvers.budget.clock`` and every budget
    read it: the real clock (or, ``frozen``, the moment the test started) plus an offset that
    ``sleep`` moves forward at once instead of waiting."""

    __test__ = False   # not a test class

    def __init__(self, real, frozen: bool):
        self._real, self._frozen, self._t0 = real, frozen, real()
        self.offset = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return (self._t0 if self._frozen else self._real()) + self.offset

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.offset += seconds


@pytest.fixture
def frozen_clock(monkeypatch):
    """A clock that moves only by ``sleep``: what a compile "takes" is exactly what it says."""
    clock = TestClock(time.perf_counter, frozen=True)
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


@pytest.fixture
def jumping_clock(monkeypatch):
    """The real clock, plus the jumps ``sleep`` makes (a compile that "took" 8 s more, at once)."""
    clock = TestClock(time.perf_counter, frozen=False)
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock
