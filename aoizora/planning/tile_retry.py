"""A candidate whose compile overflowed the chip's VMEM or SMEM with the kernel model's tiles is
compiled again with the tiles chosen within less of the VMEM, as the planner's final tiles are
(``kernels.tiles.choose_tiles``) and as the tuned experts' are (``expert_tuning``).

    fraction_k = VMEM_BACKOFF^k,   k = 1 .. VMEM_RETRIES
    layout_k   = kernel_tiled(layout, ir, target, fraction_k)

Each retry is one more compile of the budget (the compile queue decides, as for any compile);
the first that compiles replaces the candidate's layout (its tiles), and the retries stop at the
first failure that is not an on-chip overflow. Only layouts whose tiles are the kernel model's
are retried: the ILP's own (``"ilp"``) and seeds' refinements (``"refined"``); a seed as given
keeps its authors' blocks, and its failure stands.
"""

from __future__ import annotations

import dataclasses
import warnings

from aoizora.kernels.tiles import VMEM_BACKOFF, VMEM_RETRIES, kernel_tiled, overflows_on_chip
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
    fn = seed.fn if seed is not None and seed.fn is not None else prog.fn
    args = seed.args if seed is not None and seed.args is not None else prog.args
    ir = prog.ir if seed is None else _ir(fn, args)
    fraction = 1.0
    for _ in range(VMEM_RETRIES):
        fraction *= VMEM_BACKOFF
        layout = kernel_tiled(sol.layout, ir, prog.target, fraction)
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


def _ir(fn, args):
    from aoizora.extract.frontends.jax.ir_builder import build_ir

    with warnings.catch_warnings():     # ops kept replicated: the IR's warning, not ours
        warnings.simplefilter("ignore")
        return build_ir(fn, *args)
