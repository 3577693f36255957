"""Hand-built evidence with realistic per-layer collectives of a 2D logical mesh (Wan 2.1 1.3B sizes).

Used by the placement benchmark until evidence parsed from a real compile is wired in. Per layer
(count 30), on a logical mesh (ulysses=U, context=S), sequence split over both axes:
  phase 0: all-to-all over `ulysses` of Q, K, V   (buffer 3 x T/(U S) x H x 2 bytes)
  phase 1: all-gather over `context` of K and V   (gathered 2 x T/U x H x 2 bytes... per head shard)
  phase 2: all-to-all over `ulysses` of the attention output (T/(U S) x H x 2 bytes)
  phase 3: all-gather over every device of the block's weights (FSDP), async, overlapping the
           MLP compute (the compiler's cycle estimate, made up here from the MLP's flops)
with T = 32,760 tokens, H = 1,536 hidden, bf16 (2 bytes), block weights 1.3e9 / 30 parameters.
"""

from __future__ import annotations

from aoizora.extract.evidence import Collective, ComputeOp, Evidence
from aoizora.formulation.traffic import mesh_axis_groups

TOKENS = 32_760
HIDDEN = 1_536
FFN = 8_960
LAYERS = 30
BF16 = 2
CLOCK_HZ = 1.5e9          # v5e
PEAK = 1.97e14


def wan_like_evidence(ulysses: int, context: int, target: str = "", layers: int = LAYERS,
                      fsdp: bool = True) -> Evidence:
    mesh = {"ulysses": ulysses, "context": context}
    shape = (ulysses, context)
    n = ulysses * context
    shard_tokens = -(-TOKENS // n)
    u_groups = mesh_axis_groups(shape, [0])
    s_groups = mesh_axis_groups(shape, [1])
    all_groups = mesh_axis_groups(shape, [0, 1])
    cs = []
    if ulysses > 1:
        cs.append(Collective("qkv-all-to-all", "all-to-all", "bf16",
                             3 * shard_tokens * HIDDEN * BF16, u_groups, count=layers, phase=0))
    if context > 1:
        kv = 2 * (shard_tokens * context) * (HIDDEN // ulysses) * BF16
        cs.append(Collective("kv-all-gather", "all-gather", "bf16", kv, s_groups,
                             count=layers, phase=1))
    if ulysses > 1:
        cs.append(Collective("out-all-to-all", "all-to-all", "bf16",
                             shard_tokens * HIDDEN * BF16, u_groups, count=layers, phase=2))
    mlp_flops = 2 * 2 * shard_tokens * HIDDEN * FFN
    if fsdp and n > 1:
        w = int(1.3e9 / LAYERS) * BF16
        cs.append(Collective("weights-all-gather", "all-gather-start", "bf16", w, all_groups,
                             count=layers, phase=3, is_async=True,
                             overlap_cycles=mlp_flops / PEAK * CLOCK_HZ))
    attn_flops = 4 * shard_tokens * TOKENS * HIDDEN
    comp = [ComputeOp("attention", "custom-call", attn_flops / PEAK * CLOCK_HZ, count=layers),
            ComputeOp("mlp", "fusion", mlp_flops / PEAK * CLOCK_HZ, count=layers)]
    return Evidence(target=target, mesh_axes=mesh, collectives=cs, compute=comp,
                    clock_hz=CLOCK_HZ,
                    warnings=["hand-built Wan-2.1-1.3B-like evidence (not from a compile)"])
