"""What maxdiffusion's published Wan recipe sets beyond the mesh: libtpu options and splash
tiles (AI-Hypercomputer/maxdiffusion README, Wan 2.1 section; ``shared/facts/practice.md``).

- ``MAXDIFFUSION_OPTIONS``: its ``LIBTPU_INIT_ARGS`` (``--xla_tpu_enable_async_collective_fusion
  =true --xla_tpu_enable_async_collective_fusion_fuse_all_reduce=true
  --xla_tpu_enable_async_collective_fusion_multiple_steps=true
  --xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_reduce=true``), as
  per-compile options (libtpu 0.0.42.1 accepts each).
- ``MAXDIFFUSION_TILES``: its ``flash_block_sizes`` in the 720p example: block_q 3024,
  block_kv 2048, block_kv_compute 1024.

``published_tiles(lq, lkv)`` scales the published tiles to per-shard lengths: per tile the
largest size at most the published one (and at most the length rounded up) that divides the
per-shard length, in multiples of 8 for queries and 128 for keys; when none does, that cap (the
wrapper then pads); block_kv_compute the largest multiple of 128 at most 1024 dividing block_kv.
With ``vmem_limit`` (bytes; the chip's scoped VMEM, ``formulation.kernel_model``), block_q and
then block_kv are halved (staying multiples of 8 / 128 that divide the length) while the
kernel's estimated VMEM exceeds it: the published tiles are for maxdiffusion's own kernel
settings, and on v5e (16 MiB scoped) 2048 / 2048 / 1024 at Wan 2.1 1.3B 480p-81f does not
compile (libtpu 0.0.42.1: "Scoped allocation with size 21.33M and limit 16.00M").
"""

from __future__ import annotations

from aoizora.formulation.kernel_model import SplashShape, splash_vmem_bytes

MAXDIFFUSION_OPTIONS: dict[str, bool] = {
    "xla_tpu_enable_async_collective_fusion": True,
    "xla_tpu_enable_async_collective_fusion_fuse_all_reduce": True,
    "xla_tpu_enable_async_collective_fusion_multiple_steps": True,
    "xla_tpu_overlap_compute_collective_tc": True,
    "xla_enable_async_all_reduce": True,
}
MAXDIFFUSION_TILES = {"block_q": 3024, "block_kv": 2048, "block_kv_compute": 1024}


def _largest_divisor(length: int, cap: int, align: int) -> int | None:
    """The largest multiple of ``align`` at most ``cap`` that divides ``length``, or None."""
    for t in range(cap - cap % align, 0, -align):
        if length % t == 0:
            return t
    return None


def published_tiles(lq: int, lkv: int, vmem_limit: int | None = None, head_dim: int = 128,
                    dtype_bytes: int = 2, published: dict[str, int] | None = None) -> dict[str, int]:
    """maxdiffusion's tiles scaled to per-shard query / key lengths (module docstring);
    ``published``: another published set (default ``MAXDIFFUSION_TILES``, the 720p inference one)."""
    p = published or MAXDIFFUSION_TILES
    cap_q, cap_kv = min(p["block_q"], -(-lq // 8) * 8), min(p["block_kv"], -(-lkv // 128) * 128)
    bq = _largest_divisor(lq, cap_q, 8) or cap_q
    bkv = _largest_divisor(lkv, cap_kv, 128) or cap_kv
    bkvc = _largest_divisor(bkv, p["block_kv_compute"], 128) or bkv
    if vmem_limit is not None:
        shape = SplashShape(1, lq, lkv, head_dim, dtype_bytes)
        while splash_vmem_bytes(shape, bq, bkv, bkvc) > vmem_limit:
            if bq > 8 and (half := _largest_divisor(lq, bq // 2, 8)):
                bq = half
            elif bkv > 128 and (half := _largest_divisor(lkv, bkv // 2, 128)):
                bkv, bkvc = half, _largest_divisor(half, min(bkvc, half), 128) or half
            else:
                break
    return {"block_q": bq, "block_kv": bkv, "block_kv_compute": bkvc}

