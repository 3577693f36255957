"""A candidate whose compile overflows VMEM with the kernel model's tiles is compiled again with
tiles chosen within 0.75 of the VMEM (``planning.tile_retry``), inside the compile budget; the
candidate keeps the tiles that compiled."""

import jax
import jax.numpy as jnp

import aoizora
from aoizora.extract.aot_compile import CompileError
from aoizora.kernels.tiles import VMEM_RETRIES
from aoizora.planning.candidate_pricing import compile_layout
from aoizora.planning.seams import Seams

B, S, H, D = 2, 32768, 8, 128       # long enough that VMEM bounds the splash tiles


def _attention(x, wq, wk, wv):
    q, k, v = (jnp.reshape(x @ w, (B, S, H, D)) for w in (wq, wk, wv))
    return jax.nn.dot_product_attention(q, k, v).reshape(B, S, H * D)


def _tiles(layout):
    return tuple(sorted((a.block_q, a.block_kv, a.block_kv_compute)
                        for a in layout.attention.values() if a.block_q))


def _plan(compile_fn, compiles):
    sds = jax.ShapeDtypeStruct
    args = (sds((B, S, H * D), jnp.bfloat16),) + (sds((H * D, H * D), jnp.bfloat16),) * 3
    return aoizora.plan(_attention, *args, target="v5e-8", time_budget_s=600, seed=0, top_k=1,
                        meshes=[{"x": 8}], max_iterations=1, verify=False, compiles=compiles,
                        seams=Seams(compile_layout=compile_fn))


def test_a_vmem_overflow_is_compiled_again_with_smaller_tiles():
    asked = []

    def overflow_first(fn, args, tgt, layout, order, **kw):
        asked.append(_tiles(layout))
        if len(asked) == 1:       # the first compile: as if its kernel overflowed VMEM
            raise CompileError("RESOURCE_EXHAUSTED: CompileTimeScopedVmemOom: scoped VMEM limit")
        return compile_layout(fn, args, tgt, layout, order, **kw)

    p = _plan(overflow_first, compiles=2)
    assert len(asked) == 2 and asked[0] and asked[1] != asked[0]     # retried, smaller tiles
    assert _tiles(p.layout) == asked[1] and p.predicted["step_s"] > 0


def test_the_retries_stop_after_vmem_retries():
    """Until a candidate compiles the count budget does not stop the planner (a plan needs one),
    so the retries stop after ``VMEM_RETRIES`` choices, each within less of the VMEM."""
    asked = []

    def always_overflows(fn, args, tgt, layout, order, **kw):
        asked.append(_tiles(layout))
        raise CompileError("RESOURCE_EXHAUSTED: CompileTimeScopedVmemOom: scoped VMEM limit")

    try:
        _plan(always_overflows, compiles=3)
    except aoizora.PlanningError:
        pass
    assert len(asked) == 1 + VMEM_RETRIES and len(set(asked)) == len(asked)
