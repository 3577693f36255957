"""A flash-attention kernel model: seconds of one attention forward at its per-shard shapes.

    t        = max(4 B H S T D / rate(T), (|q| + |k| + |v| + |o|) / hbm_bandwidth)
    rate(T)  = min(peak_flops x EFF_MAX[kernel], ceiling) x T / (T + T_HALF)
    ceiling  = FA2_HOPPER_CEILING_FLOPS for FlashAttention-2 on a Hopper GPU, else no ceiling

Sources (forward pass, head dim 128, bf16/fp16, no causal mask):
- FlashAttention-2 (Dao, arXiv 2307.08691, section 4.1 and figure 4) reaches up to 230 TFLOP/s
  of an A100's 312 (73%): ``EFF_MAX["fa2"]``.
- FlashAttention-3 (Shah et al., arXiv 2407.08608, abstract) reaches up to 740 TFLOP/s of an
  H100's 989 in BF16 (75%): ``EFF_MAX["fa3"]``; the same abstract: FlashAttention-2 "achieves
  only 35% utilization on H100" (it uses none of Hopper's asynchronous matrix instructions), so
  on a Hopper GPU FA2 is capped at 0.35 x 989.4 TFLOP/s whatever the chip's own peak
  (``FA2_HOPPER_CEILING_FLOPS``; a Hopper part with a smaller peak, such as the H20, reaches
  the Ampere fraction of its own peak first).
- Both papers show lower utilization at short sequences (about half at 512 keys): the
  saturating curve T / (T + T_HALF) through those facts.
The kernel is FlashAttention-2 unless told otherwise: it is what PyTorch's scaled-dot-product
attention runs as its flash backend (PyTorch 2.2 release notes) and what the official Wan 2.1 and
HunyuanVideo repositories call. The Hopper ceiling was added after a validation against published
xDiT runs showed the one-fraction-of-peak model at about half of the measured H100 times
(``benchmarks/results/gpu_validation.md``): a structural choice made after seeing data, from the
papers' figures, with no constant fitted to those runs. The kernel model is per device: B, H, S
the query shard's batch, heads and sequence, T the keys each device attends over (gathered
context-parallel keys: the whole sequence).
"""

from __future__ import annotations

EFF_MAX = {"fa2": 0.73, "fa3": 0.75}   # fraction of peak at long sequences (FA2 / FA3 papers)
FA2_HOPPER_CEILING_FLOPS = 0.35 * 989.4e12   # FA2 on an H100 SXM: 35% of 989.4 TFLOP/s
T_HALF = 512.0        # keys at which the utilization is half of its long-sequence value
KERNELS = tuple(EFF_MAX)
MODEL = "flash-attention kernel model (FA2/FA3 published peak utilization, FA2's Hopper ceiling)"


def flash_rate(kv_len: int, peak_flops: float, kernel: str = "fa2",
               hopper: bool = False) -> float:
    """FLOP/s a flash-attention forward reaches with ``kv_len`` keys (``rate`` in the module
    docstring).

    Raises:
        ValueError: an unknown kernel."""
    if kernel not in EFF_MAX:
        raise ValueError(f"flash-attention kernel {kernel!r}: give one of {', '.join(KERNELS)}")
    top = peak_flops * EFF_MAX[kernel]
    if kernel == "fa2" and hopper:
        top = min(top, FA2_HOPPER_CEILING_FLOPS)
    return top * kv_len / (kv_len + T_HALF)


def flash_attention_seconds(b: int, h: int, s: int, t: int, d: int, peak_flops: float,
                            hbm_bandwidth_Bps: float, dtype_bytes: int = 2, *,
                            kernel: str = "fa2", hopper: bool = False) -> float:
    """Seconds of one flash-attention forward (module docstring); shapes per shard.

    Args:
      kernel: "fa2" (FlashAttention-2, PyTorch SDPA's flash backend) or "fa3".
      hopper: the GPU is a Hopper part (compute capability 9.x): FA2's ceiling applies.

    Raises:
        ValueError: a non-positive peak or bandwidth, or an unknown kernel."""
    if peak_flops <= 0 or hbm_bandwidth_Bps <= 0:
        raise ValueError("flash_attention_seconds needs a positive peak and HBM bandwidth")
    if min(b, h, s, t, d) <= 0:
        return 0.0
    flops = 4.0 * b * h * s * t * d
    io = dtype_bytes * b * h * d * (2 * s + 2 * t)
    return max(flops / flash_rate(t, peak_flops, kernel, hopper), io / hbm_bandwidth_Bps)
