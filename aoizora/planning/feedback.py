"""Step 3 of an iteration: what the compiled, placed and priced candidates change in the ILP.

Per mesh, from its best priced ILP candidate of the iteration (seeds and their refinements are
priced, not fed back):
  - collective costs (``formulation.axis_feedback``, which states the math): the effective
    bandwidth of every logical axis under the chosen placement; per axis and collective kind,
    what the step paid for that kind (its exposed share of the link time, from Q2). The kinds'
    ratios to the default costs are pooled over the meshes measured; meshes with no compiled
    ILP layout yet take the pooled ratios (``transferred_axis_costs``);
  - attention compute, from every ILP layout compiled so far (all meshes pooled): per attention
    node and kv mode (gathered, ring), the compiler's compute time over Q1's
    (``formulation.attention_calibration``); every mesh's ILP then scales its attention compute
    by it (replacing, node by node and mode, the factor of the calibration given);
  - the compute of every other op, from every ILP layout compiled so far: one pooled factor,
    compiled over Q1's (``formulation.compute_calibration``; Q1 prices ops unfused), on every
    mesh's ILP (``Options.compute_scale``), changed when it moves by more than 1%.
Layouts that did not fit in HBM are forbidden in their mesh's ILP as they are priced
(``loop.py``). Not yet: per-op corrections for the other ops and for communication the compiler
added or removed against the ILP's assumptions (``corrections`` in the ILP is ready; mapping HLO
collectives back onto ILP groups needs finer provenance than the shared layer code gives).

Everything learned is kept in ``state.learned`` (a ``formulation.calibration.Calibration``) and
recorded in the iteration's record (``feedback`` and ``changes``).
"""

from __future__ import annotations

from typing import Any

from aoizora.planning.candidate import Candidate, mesh_str
from aoizora.formulation.attention_calibration import (attention_samples,
                                                       compiled_attention_seconds,
                                                       fit_attention_scale, scales)
from aoizora.formulation.axis_feedback import (effective_axis_costs, pool_kind_ratios,
                                              transferred_axis_costs)
from aoizora.formulation.calibration import mesh_key
from aoizora.formulation.compute_calibration import compute_sample
from aoizora.planning.loop_state import LoopState

COMPUTE_SCALE_CHANGE = 0.01   # the other ops' compute factor is updated when it moves this much


def apply_feedback(state: LoopState, it: int, this_iter: list[Candidate],
                   rec: dict[str, Any]) -> None:
    """The module docstring's feedback from iteration ``it``'s candidates, in that order."""
    collective_costs(state, this_iter, rec)
    transfer_costs(state, rec)
    state.attention_fit += _attention_samples(state, it, this_iter)
    compute_scale(state, it, this_iter, rec)
    attention_scale(state, rec)


def collective_costs(state: LoopState, this_iter: list[Candidate], rec: dict[str, Any]) -> None:
    """Each mesh's collective costs from its best priced ILP candidate of the iteration."""
    kind_pool = state.learned.kind_pool      # kind -> [sum w r, sum w] (transferred_axis_costs)
    for m in state.meshes:
        mine = [c for c in this_iter if c.mesh_axes == m and c.q2 is not None and c.from_ilp]
        if not mine:
            continue
        c = min(mine, key=lambda c: c.q2.step_s)
        st = state.mesh_state[mesh_key(m)]
        st.costs, detail = effective_axis_costs(c.evidence, c.placement, state.program.network,
                                                st.costs, c.q2)
        if detail:
            rec["feedback"][mesh_str(m)] = detail
            rec["changes"] += _axis_changes(m, detail)
        pool_kind_ratios(kind_pool, detail, st.default)
        st.measured = True
        state.learned.axis_costs[mesh_key(m)] = st.costs


def _axis_changes(m: dict[str, int], detail: dict[str, Any]) -> list[str]:
    out = []
    for a, d in detail.items():
        if "effective_bandwidth_Bps" in d:
            out.append(f"mesh {mesh_str(m)} axis {a}: effective bandwidth "
                       f"{d['effective_bandwidth_Bps'] / 1e9:.1f} GB/s under the best "
                       f"placement (ILP assumed {1 / d['beta_before_s_per_B'] / 1e9:.1f} GB/s)")
        if d.get("by_kind"):
            out.append(f"mesh {mesh_str(m)} axis {a}: exposed cost per kind " + ", ".join(
                f"{k} {v['exposed_share']:.2f} of its link time "
                f"({1 / v['beta_s_per_B'] / 1e9:.1f} GB/s effective)"
                for k, v in sorted(d["by_kind"].items())))
    return out


def transfer_costs(state: LoopState, rec: dict[str, Any]) -> None:
    """Meshes not measured yet take the kinds' pooled ratios to the default costs."""
    ratios = {k: sw / w for k, (sw, w) in sorted(state.learned.kind_pool.items()) if w > 0}
    unmeasured = [m for m in state.meshes if not state.mesh_state[mesh_key(m)].measured]
    if not (ratios and unmeasured):
        return
    for m in unmeasured:
        st = state.mesh_state[mesh_key(m)]
        st.costs = transferred_axis_costs(st.default, ratios)
    rec["feedback"]["transferred"] = {"meshes": [mesh_str(m) for m in unmeasured],
                                      "ratio_to_default": ratios}
    rec["changes"].append(
        f"meshes {', '.join(mesh_str(m) for m in unmeasured)} (no ILP layout compiled yet): "
        f"collective costs per kind from the compiled meshes, " + ", ".join(
            f"{k} x{r:.2f}" for k, r in ratios.items()) + " of the default")


def _attention_samples(state: LoopState, it: int, this_iter: list[Candidate]) -> list:
    """The compiled attention compute of every ILP layout compiled in iteration ``it``."""
    out = []
    for c in this_iter:
        if c.evidence is not None and c.from_ilp:
            out += attention_samples(
                c.solution.attention, c.evidence, state.program.network,
                f"it{it} {mesh_str(c.mesh_axes)} {c.solution.layout.name}", q2=c.q2)
    return out


def compute_scale(state: LoopState, it: int, this_iter: list[Candidate],
                  rec: dict[str, Any]) -> None:
    """Pool the other ops' compiled and Q1 compute of iteration ``it``'s ILP layouts; the ILP's
    factor follows the pool when it moves by more than ``COMPUTE_SCALE_CHANGE``."""
    learned, network = state.learned, state.program.network
    for c in this_iter:
        if (c.evidence is not None and c.q2 is not None and c.from_ilp
                and "other_compute_s" in c.solution.predicted):
            smp = compute_sample(
                c.solution.predicted["other_compute_s"], state.compute_scale, c.q2.compute_s,
                sum(compiled_attention_seconds(c.evidence, network).values()),
                f"it{it} {mesh_str(c.mesh_axes)} {c.solution.layout.name}")
            if smp is not None:
                learned.compute_pool[0] += smp.compiled_s
                learned.compute_pool[1] += smp.q1_s
                rec["feedback"].setdefault("compute", []).append(smp.to_json())
    was = state.compute_scale
    if abs(learned.compute_scale - was) > COMPUTE_SCALE_CHANGE * was:
        rec["changes"].append(
            f"compute of the other ops: compiled {learned.compute_pool[0] * 1e3:.3f} ms against "
            f"Q1's {learned.compute_pool[1] * 1e3:.3f} ms (pooled) -> the ILP scales it by "
            f"{learned.compute_scale:.3f} (was {was:.3f})")
        state.compute_scale = learned.compute_scale


def attention_scale(state: LoopState, rec: dict[str, Any]) -> None:
    """Fit the attention scales on every sample so far; the fitted factors replace the given
    calibration's, node by node and mode."""
    fit = fit_attention_scale(state.attention_fit)
    fitted = scales(fit)
    given = state.given_scale
    merged = {a: {**given.get(a, {}), **fitted.get(a, {})}
              for a in sorted(set(given) | set(fitted))}
    if merged == state.attention_scale:
        return
    state.attention_scale = state.learned.attention_scale = merged
    rec["feedback"]["attention"] = fit
    for node, by_mode in fit.items():
        for mu, f in by_mode.items():
            if node == "*":
                continue
            rec["changes"].append(
                f"attention {node} (keys/values {'in a ring' if mu == 'ring' else 'gathered'})"
                f": compiled compute {f['compiled_s'] * 1e3:.3f} ms against Q1's "
                f"{f['q1_compute_s'] * 1e3:.3f} ms ({f['samples']} compiled) -> the ILP "
                f"scales its compute by {f['scale']:.3f}")
