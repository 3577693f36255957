"""Q1's seconds of an XLA matmul at its shard shape: the MXU's padding and its efficiency.

A dot with batch labels of per-device sizes b_i, row (lhs free) labels m_j, contracting labels
k_l and column (rhs free) labels n_r runs on the MXU, a systolic array of W x W MACs
(``kernel_model.MXU_SIDE``: 128 on v4/v5e/v5p, 256 on v6e/v7x), as

    B = prod b_i,  M = prod m_j,  K = prod k_l,  N = prod n_r
    mxu_flops  = 2 * B * round_up(M, 8) * round_up(K, W) * round_up(N, W)
    matmul_s   = mxu_flops / (peak_flops * MXU_EFFICIENCY)

(``padding_factor`` = mxu_flops / (2 B M K N)). So a split that leaves a shard of 192 columns on
a 128-wide MXU pays for 256 of them. ``MXU_EFFICIENCY`` is the share of peak a large XLA
matmul reaches: the JAX Pallas TPU guide's measured XLA bf16 matmul 8192^3 on TPU v5e, 6,047.1
us (jax-ml/jax docs/pallas/tpu/matmul.ipynb, timeit of 100 calls) against 2 x 8192^3 / 197
TFLOP/s = 5,581.2 us: 0.923 (the host's dispatch included, so a lower bound); no other
generation's figure was found, so every generation uses it. This module has no jax import
(formulation layer).
"""

from __future__ import annotations

import math
from typing import Mapping

from aoizora.formulation.kernel_model import MXU_SIDE, round_up

MXU_EFFICIENCY = 5581.2 / 6047.1     # published measurement (module docstring): 0.923
ROW_ALIGN = 8                        # rows fill the MXU's input in sublanes of 8


def padding_factor(shard_sizes: Mapping[str, int], roles: Mapping[str, str],
                   generation: str) -> float:
    """mxu_flops / (2 B M K N) of one dot (module docstring), >= 1.

    Args:
      shard_sizes: label -> its per-device size.
      roles: label -> "batch" | "lhs_free" | "rhs_free" | "contracting".
      generation: the TPU generation (``MXU_SIDE``); another gives 1.0 (no MXU model).
    """
    width = MXU_SIDE.get(generation)
    if width is None:
        return 1.0
    size = {r: math.prod(s for lab, s in shard_sizes.items() if roles.get(lab) == r)
            for r in ("lhs_free", "contracting", "rhs_free")}
    m, k, n = size["lhs_free"], size["contracting"], size["rhs_free"]
    if min(m, k, n) <= 0:
        return 1.0
    return (round_up(m, ROW_ALIGN) / m) * (round_up(k, width) / k) * (round_up(n, width) / n)
