"""Collective costs measured on a compiled program, fed back into the sharding ILP's
``AxisCosts`` (``formulation.collective_cost``) by the planner's loop (``aoizora.planner``).

For a compiled candidate of logical mesh m, under its chosen placement, with Q2 of it
(``formulation.latency``), over the collectives c whose replica groups are one logical axis a:

  t_c   = the time the collective's most loaded link needs under the placement
          (``formulation.traffic``), seconds, one run; count_c its runs per call
  f_c V_c = the bytes term alpha-beta charges it: (n-1)/n V for all-gather and reduce-scatter,
          2(n-1)/n V for all-reduce, (n-1)/n^2 V for all-to-all
  x_c   = exposed_p / T_p of the phase p that c ran in (the share of its link time the step paid)

- effective bandwidth (``effective_axis_costs``):
      beta_eff[a] = sum_c count_c t_c / sum_c count_c f_c V_c
  replaces the default beta of axis a;
- exposed cost per collective kind k measured on axis a:
      beta[a][k] = max(EXPOSURE_FLOOR, X[a][k]) x sum_{c of kind k} count_c t_c / sum count_c f_c V_c
      X[a][k]    = sum_{c of kind k} count_c t_c x_c / sum count_c t_c
  goes into ``AxisCosts.beta_by_kind`` (other kinds keep beta_eff; an all-to-all not measured
  keeps its own routed default scaled as the axis's beta was, beta0[a][a2a] x beta_eff[a] /
  beta0[a]: its pairs load the links differently from a ring, ``default_axis_costs``). The
  floor keeps no collective free: overlap has finite room;
- meshes with no compiled ILP layout yet (``pool_kind_ratios``, ``transferred_axis_costs``):
      beta_by_kind[a][k] = beta0[a][k] x R[k],   R[k] = sum w r / sum w
  over every (mesh, axis) measured so far, with r = beta[a][k] / beta0[a][k] (beta0:
  ``default_axis_costs``, its own default for a kind it routes on its own, else the axis's
  beta) and w its link seconds. The schedule's overlap and how the network
  carries a kind belong to the program and the slice, not to one mesh.

Approximation: a factor measured on one layout is applied to every layout of that mesh (or
of the others); the next compile checks it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.collective_cost import BYTES_FACTOR, AxisCosts
from aoizora.formulation.latency import Q2
from aoizora.formulation.traffic import base_kind, collective_link_bytes, mesh_axis_groups

EXPOSURE_FLOOR = 0.1   # the least share of a collective kind's link time the ILP charges it
ROUTED_KINDS = ("all-to-all",)   # kinds ``default_axis_costs`` routes on their own
MIN_POOLED_LINK_S = 1e-3   # seconds of link time per step a kind needs to transfer to meshes


def effective_axis_costs(ev: Evidence, placement: Sequence[int], network: Network,
                         costs: AxisCosts, q2: Q2 | None = None
                         ) -> tuple[AxisCosts, dict[str, dict[str, Any]]]:
    """``costs`` with beta replaced by the effective seconds-per-byte each logical axis got under
    ``placement``, and, given ``q2`` (Q2 of that placement), the exposed cost per axis and
    collective kind (module docstring). Axes and kinds not measured keep theirs."""
    share = {}                                    # collective name -> x_c
    for ph in (q2.phases if q2 is not None else []):
        for name in ph.collectives:
            share[name] = ph.exposed_s / ph.link_s if ph.link_s > 0 else 0.0
    kt: dict[tuple[str, str], list[float]] = {}   # (axis, kind) -> [sum t, sum t x, sum f V]
    names = list(ev.mesh_axes)
    shape = [int(ev.mesh_axes[a]) for a in names]
    groups_of = {frozenset(frozenset(g) for g in mesh_axis_groups(shape, [i])): a
                 for i, a in enumerate(names) if shape[i] > 1}
    chip_of_rank = network.device_chip[np.asarray(placement, dtype=np.int64)]
    num = {a: 0.0 for a in names}
    den = {a: 0.0 for a in names}
    for c in ev.collectives:
        kind = base_kind(c.kind)
        if kind not in BYTES_FACTOR or c.bytes <= 0:
            continue
        axis = groups_of.get(frozenset(frozenset(g) for g in c.replica_groups))
        if axis is None:
            continue
        link_bytes, _ = collective_link_bytes(c, chip_of_rank, network)
        t = float(network.link_time_s(link_bytes).max()) if len(link_bytes) else 0.0
        fv = BYTES_FACTOR[kind](costs.sizes[axis]) * c.bytes
        num[axis] += c.count * t
        den[axis] += c.count * fv
        if c.name in share and t > 0:
            acc = kt.setdefault((axis, kind), [0.0, 0.0, 0.0])
            acc[0] += c.count * t
            acc[1] += c.count * t * share[c.name]
            acc[2] += c.count * fv
    beta = dict(costs.beta_s_per_byte)
    by_kind = {a: dict(k) for a, k in costs.beta_by_kind.items()}
    detail: dict[str, dict[str, Any]] = {}
    for a in names:
        if den[a] > 0 and num[a] > 0:
            detail[a] = {"beta_before_s_per_B": beta[a], "beta_after_s_per_B": num[a] / den[a],
                         "effective_bandwidth_Bps": den[a] / num[a]}
            if beta[a] > 0 and a in by_kind:
                for k in ROUTED_KINDS:
                    if k in by_kind[a]:
                        by_kind[a][k] *= num[a] / den[a] / beta[a]
            beta[a] = num[a] / den[a]
    for (a, kind), (t_sum, tx_sum, fv_sum) in sorted(kt.items()):
        x = max(EXPOSURE_FLOOR, tx_sum / t_sum)
        by_kind.setdefault(a, {})[kind] = x * t_sum / fv_sum
        detail.setdefault(a, {}).setdefault("by_kind", {})[kind] = {
            "exposed_share": x, "beta_s_per_B": x * t_sum / fv_sum, "link_s": t_sum}
    new = dataclasses.replace(costs, beta_s_per_byte=beta, beta_by_kind=by_kind,
                              note=f"effective bandwidth measured on compiled evidence under the "
                                   f"best placement ({', '.join(detail) or 'no axis measured'})")
    return new, detail


def pool_kind_ratios(pool: dict[str, list[float]], detail: dict[str, dict[str, Any]],
                     default: AxisCosts) -> None:
    """Adds one mesh's measured kinds (``effective_axis_costs``' detail) to ``pool``: kind ->
    [sum w r, sum w], r = measured beta / the axis's default beta for that kind, w = its link
    seconds. A kind measured on less than ``MIN_POOLED_LINK_S`` of link time on an axis is not
    pooled: its beta is set by latency, not bandwidth (on Wan 2.1 1.3B 480p-21f, v5e-8, mesh 8,
    7 MB of all-to-alls measured 18x their default beta and, transferred, priced Ulysses'
    gigabytes of all-to-all at 100 ms where the simulator exposes 17 ms)."""
    for a, d in detail.items():
        for k, v in d.get("by_kind", {}).items():
            if v["link_s"] < MIN_POOLED_LINK_S:
                continue
            base = default.beta_by_kind.get(a, {}).get(k, default.beta_s_per_byte[a])
            acc = pool.setdefault(k, [0.0, 0.0])
            acc[0] += v["link_s"] * v["beta_s_per_B"] / base
            acc[1] += v["link_s"]


def transferred_axis_costs(default: AxisCosts, ratios: dict[str, float]) -> AxisCosts:
    """``default`` with every axis's beta for collective kind k multiplied by ``ratios[k]``
    (what the kind cost, over the default, on the meshes measured so far; module docstring)."""
    kinds = default.beta_by_kind
    return dataclasses.replace(
        default, beta_by_kind={a: {**kinds.get(a, {}),
                                   **{k: kinds.get(a, {}).get(k, b) * r
                                      for k, r in ratios.items()}}
                               for a, b in default.beta_s_per_byte.items()},
        note=f"{default.note}; collective kinds scaled as measured on other meshes")
