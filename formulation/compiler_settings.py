"""The compiler settings an ILP layout is compiled with: those under which the collectives the
compiler emits are the ones Q1 priced.

Q1 prices a weight that a matmul needs gathered as an all-gather, which the compiler may run
ahead of the matmul (``formulation.prefetch``), and a partial sum split over devices as a
reduce-scatter or all-reduce (``formulation.collective_cost``). By default XLA:TPU's SPMD
partitioner may instead emit a *windowed einsum* for such a matmul: a loop of
collective-permutes, each followed by the part of the matmul its shard allows, which waits on
its own permutes and cannot run ahead. ``TPU_OPTIONS`` turns that off for all-gathers and
reduce-scatters, so the compiled program gathers as Q1 priced it. MaxText publishes the same
two settings for inference on TPU (AI-Hypercomputer/maxtext,
``src/MaxText/inference_mlperf/trillium/select_xla_flags.py``, its manually selected flags).

Measured here (libtpu 0.0.42.1 ahead of time, simulated by the reference simulator; nothing ran
on a TPU), Wan 2.1 14B 480p-21f on v5e-8, the ILP's x8 layouts of
``benchmarks/results/q1_fidelity/wan2.1-14b_480p-21f_v5e-8/``: ``ilppf_8`` (libtpu's defaults)
moves 22.2 GB of collective-permutes per device per step, simulated 1,040 ms; ``ilpnwe_8``
(solved again, compiled with ``TPU_OPTIONS``) 0.02 GB of them, 12.2 GB of all-gathers, simulated
779 ms, compiled in 37 s. ``ilppf_8`` itself compiled again with ``TPU_OPTIONS`` simulated at
771 ms (a scratch run, ``lab_notes.md``).

Other targets (XLA:GPU) get no options: these names are XLA:TPU's.
"""

from __future__ import annotations

from typing import Any

TPU_OPTIONS: dict[str, bool] = {
    "xla_tpu_enable_windowed_einsum_for_all_gather": False,
    "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False,
}


def ilp_compiler_options(target: Any) -> dict[str, bool]:
    """The options an ILP layout for ``target`` is compiled with (module docstring): a copy of
    ``TPU_OPTIONS`` for a TPU target, ``{}`` for any other (or None)."""
    family = getattr(getattr(target, "chip", None), "family", "")
    return dict(TPU_OPTIONS) if family == "tpu" else {}
