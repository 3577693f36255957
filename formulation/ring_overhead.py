"""The memory traffic a ring attention adds around its kernels, priced before any compile.

A ring over ``n`` devices (``aoizora.kernels.attention_kernels``' ring body: ``n`` kernel calls,
``n - 1`` sends) does more than its kernels. Per device, with ``lead`` = batch x heads per shard,
``lq`` / ``lkv`` the query / key-value shard lengths, ``d`` the head dim and ``e`` the bytes of
an element, the compiled program (XLA:TPU, libtpu 0.0.42.1) has, per call of the attention:

- the online-softmax combine, once per kernel call: read the float32 accumulator, read the
  kernel's output (``e`` bytes), write the accumulator::

      combine_bytes = n * lead * lq * d * (4 + e + 4)

- the loop's copies of the key and value chunks it forwards (the while loop's carry is updated
  in place, so the chunk being sent and attended to is copied first), one read and one write of
  each per send::

      carry_bytes = (n - 1) * 2 * 2 * lead * lkv * d * e

- the log-sum-exp the kernel returns lane-broadcast, ``[lead, lq, LANES]`` float32, of which
  lane 0 is kept; a TPU reads whole (8, 128) tiles, so the slice reads all of it::

      lse_bytes = n * lead * lq * (LANES + 1) * 4

and ``overhead_s = (combine_bytes + carry_bytes + lse_bytes) / hbm_bandwidth``. The three are
memory-bound elementwise passes on the core that runs the kernels, so they add to the kernels'
time, not to the transfers they overlap with.

An example, Wan 2.1 1.3B 480p-21f on v5e-8 (lead 12, lq = lkv = 2560, d 128, bf16, n = 4): the
compiled combine fusion writes f32[1,12,2560,128] from five operands, 49.9 us a call by the
compiler's estimate, 48 us by ``combine_bytes`` at 819 GB/s; each carry copy of
bf16[1,12,2560,128] 19 us by bytes (the compiler estimates 58 us); the lane-0 slice 19 us by
bytes (the compiler estimates 48 us). The forward only: a ring's backward is not priced here.
"""

from __future__ import annotations

LANES = 128      # a TPU vector register's lanes: the width of splash's log-sum-exp residual
F32 = 4          # bytes of the float32 accumulator and log-sum-exp


def ring_overhead_bytes(n: int, lead: int, lq: int, lkv: int, d: int, e: int) -> float:
    """Bytes per device per call of a ring attention's combine, carry copies and log-sum-exp
    slice (module docstring); 0 for a ring of one device.

    Args:
      n: devices in the ring (the sequence split).
      lead: batch x heads per shard.
      lq, lkv: query and key/value shard lengths, tokens.
      d: head dim; e: bytes per element of q, k, v.
    """
    if n <= 1:
        return 0.0
    combine = n * lead * lq * d * (F32 + e + F32)
    carry = (n - 1) * 2 * 2 * lead * lkv * d * e
    lse = n * lead * lq * (LANES + 1) * F32
    return float(combine + carry + lse)


def ring_overhead_seconds(n: int, lead: int, lq: int, lkv: int, d: int, e: int,
                          hbm_bandwidth_Bps: float) -> float:
    """``ring_overhead_bytes`` over the HBM bandwidth, seconds per call (0 without a bandwidth).

    Raises:
      ValueError: a negative bandwidth.
    """
    if hbm_bandwidth_Bps < 0:
        raise ValueError(f"HBM bandwidth {hbm_bandwidth_Bps}: want >= 0 bytes/s")
    if hbm_bandwidth_Bps == 0:
        return 0.0
    return ring_overhead_bytes(n, lead, lq, lkv, d, e) / hbm_bandwidth_Bps
