"""A flash-attention kernel model: seconds of one attention forward at its per-shard shapes.

    t = max(4 B H S T D / (peak_flops x eff(T)), (|q| + |k| + |v| + |o|) / hbm_bandwidth)
    eff(T) = EFF_MAX x T / (T + T_HALF)

Sources for the peak utilization (forward pass, head dim 128, bf16/fp16, no causal mask):
FlashAttention-2 (Dao, arXiv 2307.08691, section 4.1 and figure 4) reaches up to 230 TFLOP/s of
an A100's 312 (73%); FlashAttention-3 (Shah et al., arXiv 2407.08608, abstract) reaches up to
740 TFLOP/s of an H100's 989 in BF16 (75%). Both papers show lower utilization at short
sequences (about half at 512 keys); ``eff`` is a simple saturating curve through those two
facts (EFF_MAX 0.72, half of it at T_HALF = 512 keys), not fitted to measurements of this
model. The kernel model is per device: B, H, S the query shard's batch, heads and sequence, T the
keys each device attends over (gathered context-parallel keys: the whole sequence).
"""

from __future__ import annotations

EFF_MAX = 0.72        # fraction of peak at long sequences (FA2 on A100: 73%, FA3 on H100: 75%)
T_HALF = 512.0        # keys at which the utilization is half of EFF_MAX
MODEL = "flash-attention kernel model (FA2/FA3 published peak utilization)"


def flash_efficiency(kv_len: int) -> float:
    """Fraction of the chip's peak a flash-attention forward reaches with ``kv_len`` keys."""
    return EFF_MAX * kv_len / (kv_len + T_HALF)


def flash_attention_seconds(b: int, h: int, s: int, t: int, d: int, peak_flops: float,
                            hbm_bandwidth_Bps: float, dtype_bytes: int = 2) -> float:
    """Seconds of one flash-attention forward (module docstring); shapes per shard.

    Raises:
        ValueError: a non-positive peak or bandwidth."""
    if peak_flops <= 0 or hbm_bandwidth_Bps <= 0:
        raise ValueError("flash_attention_seconds needs a positive peak and HBM bandwidth")
    if min(b, h, s, t, d) <= 0:
        return 0.0
    flops = 4.0 * b * h * s * t * d
    io = dtype_bytes * b * h * d * (2 * s + 2 * t)
    return max(flops / (peak_flops * flash_efficiency(t)), io / hbm_bandwidth_Bps)
