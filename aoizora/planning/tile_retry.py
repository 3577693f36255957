"""A candidate whose compile overflowed the chip's VMEM or SMEM with the kernel model's tiles is
compiled again with the tiles chosen within less of the VMEM, as the planner's final tiles are
(``kernels.tiles.choose_tiles``) and as the tuned experts' are (``expert_tuning``).

    fraction_k = VMEM_BACKOFF^k,   k = 1 .. VMEM_RETRIES
    layout_k   = kernel_tiled(layout, ir, target, fraction_k)   (``smaller_tile_choices``: a
                 choice with the tiles of the one before is skipped, not compiled)

Each retry is one more compile of the budget (the compile queue decides, as for any compile);
the first that compiles replaces the candidate's layout (its tiles), and the retries stop at the
first failure that is not an on-chip overflow. Only layouts whose tiles are the kernel model's
are retried: the ILP's own (``"ilp"``) and seeds' refinements (``"refined"``); a seed as given
keeps its authors' blocks, and its failure stands.
"""

from __future__ import annotations

import dataclasses

from aoizora.extract.frontends.jax.ir_builder import build_ir
from aoizora.kernels.tiles import kernel_tiled, overflows_on_chip, smaller_tile_choices
from aoizora.planning.candidate_pricing import compile_job
from aoizora.planning.compile_queue import Skipped

RETILED_KINDS = ("ilp", "refined")


def retile_overflowing(state, item, got, sol):
    """(compile result, solution) of ``item`` (a ``PricingItem``) after retrying an on-chip
    overflow of its compile ``got`` (module docstring); unchanged when there is none to retry.
    ``state``: the loop's ``LoopState`` (its program, compile queue, progress)."""
    if isinstance(got, Skipped) or not overflows_on_chip(getattr(got, "error", "") or "") \
            or item.kind not in RETILED_KINDS or not sol.layout.attention:
        return got, sol
    prog = state.program
    seed = item.seed
    own = seed is None or seed.fn is None
    fn, args = (prog.fn, prog.args) if own else (seed.fn, seed.args)
    ir = prog.ir if own else build_ir(fn, *args)
    for fraction, layout in smaller_tile_choices(
            lambda f: kernel_tiled(sol.layout, ir, prog.target, f), sol.layout):
        state.progress.note(f"{got.error[:100]}: tiles chosen again within {fraction:.2f} of "
                            f"the VMEM, compiling again")
        again = state.compiles_to().submit(
            compile_job(fn, args, prog.target, layout, item.mesh,
                        compile_fn=state.seams.compile_layout, cache=prog.cache),
            priority=item.rank).result()
        if isinstance(again, Skipped):
            return got, sol
        got, sol = again, dataclasses.replace(sol, layout=layout)
        if not overflows_on_chip(got.error or ""):
            break
    return got, sol
