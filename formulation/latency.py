"""Q2: the step latency this model predicts for (evidence, placement) on a network.

A PREDICTION of AoiZora's link-load model, not a measurement.

    step_s          = compute_s + communication_s + latency_s
    compute_s       = sum_o count_o * t_o,  t_o = estimated_cycles_o / clock_hz when the compiler
                      gave cycles; for a splash attention kernel the kernel model
                      (``formulation.kernel_model``: its tiles at its per-shard shapes); else
                      max(flops_o / peak_flops, bytes_o / hbm_bandwidth)
    communication_s = sum_p count_p * max(0, T_p - O_p, D_p)           (exposed)
    T_p             = max_l load_{p,l} / bandwidth_l                   (seconds)
    load_{p,l}      = bytes on directed link l of the collectives of phase p, one run
                      (flows as ``formulation.traffic`` builds them under the placement)
    O_p             = for an async part (below): the compute scheduled between its first start
                      and its last done, priced as compute_s prices it
                      (``formulation.op_time.ScheduleSpans``; without schedule positions,
                      min_c overlap_cycles_c / clock_hz); else 0
    D_p             = max over the part's sub-demand sets s of T_s - O_s: members whose windows
                      lie in a shorter span must fit that span's compute
                      (``formulation.async_demand``); 0 for a sync class

    latency_s       = sum_p count_p * (max(0, T_p + L_p - O_p, D_p) - max(0, T_p - O_p, D_p))
    L_p             = hop_latency * the critical path of p in hops: for an async part the
                      longest of its collectives' (in flight together), for a sync class the
                      sum of its collectives' (they block one after another); a collective's:
                      the longest over its groups (ring: m (k-1) steps x the longest step
                      route; a line's closing step crosses k-1 hops; pair: m x its route;
                      all-to-all: its longest pair route; permute: its longest route)

Phases ``p`` are the phase classes of ``formulation.traffic.phase_classes``: per evidence phase
``(phase, count)``, its sync (blocking) collectives, and its async ones in parts that are in
flight together. Collectives in flight together share links, so their bytes add per link
before the max; a sync collective inside an async window blocks for its own transfer only, it
does not cancel the window's overlap; an async part hides behind its own shortest window.
``communication_s`` is the link-load term the placement solvers optimize (and certify);
``latency_s`` is the per-hop latency on top of it (about 1 us per hop: it separates placements
whose link loads tie, which the solvers' hop tie-break also prefers). ``link_time_s`` is the
communication before overlap; ``hops`` the flow hops (the CP-SAT model's last tie-break).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from aoizora.extract.early_evidence import FIDELITY as EARLY_FIDELITY
from aoizora.extract.evidence import Evidence
from aoizora.extract.network import Network
from aoizora.formulation.op_time import compute_seconds
from aoizora.formulation.traffic import TrafficModel

MODEL = "AoiZora Q2 link-load model (prediction)"


@dataclasses.dataclass
class PhaseReport:
    phase: int
    count: int
    collectives: list[str]
    link_s: float              # T_p, seconds, one run
    overlap_s: float           # O_p, seconds
    exposed_s: float           # max(0, T_p - O_p), one run
    max_link: int              # id of the most loaded link
    max_link_bytes: float      # its bytes, one run
    link_bytes: float          # total bytes over all links, one run
    hops: int                  # flow hops, one run
    latency_s: float = 0.0     # L_p, seconds, one run


@dataclasses.dataclass
class Q2:
    step_s: float
    compute_s: float
    communication_s: float     # exposed link-load time, summed over phases x counts
    link_time_s: float         # before overlap
    link_bytes: float          # sum_p count_p * total link bytes
    hops: int                  # sum_p count_p * flow hops
    phases: list[PhaseReport]
    link_loads: dict[int, list[float]]   # phase -> bytes per link id, one run
    placement: list[int]
    latency_s: float = 0.0     # exposed per-hop latency on top of communication_s, summed
    model: str = MODEL
    warnings: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def predict_step(evidence: Evidence, placement: Sequence[int], network: Network,
                 traffic: TrafficModel | None = None, partial: bool = False) -> Q2:
    """Q2 for (evidence, placement): see the module docstring. `traffic` may be reused.

    Args:
      evidence, placement, network, traffic: as above.
      partial: accept partial evidence (``extract.early_evidence``): its compute ops carry no
        cycles, so every op is priced by ``formulation.op_time``'s kernel model or flops / bytes,
        and the ops the early module does not keep are missing. Only the planner's screen
        (``aoizora.planning.screening``) asks for it, to rank layouts before their full compile.

    Raises:
      ValueError: partial evidence without ``partial``: Q2 is a full compile's price."""
    if evidence.fidelity == EARLY_FIDELITY and not partial:
        raise ValueError(f"Q2 needs a full compile's evidence: this one is {EARLY_FIDELITY} "
                         "(collectives only, no compute cycles); compile the layout fully")
    tm = traffic or TrafficModel(evidence, network)
    loads = tm.phase_loads(placement)
    comp, warns = compute_seconds(evidence, network)
    if evidence.clock_hz <= 0 and any(c.is_async and c.overlap_cycles for c in evidence.collectives):
        warns.append("evidence has no clock_hz: async overlap not credited")
    phases = []
    comm = link_t = lb = lat = 0.0
    hops = 0
    for pl in loads:
        n = pl.key.count
        j = int(pl.link_bytes.argmax()) if len(pl.link_bytes) else -1
        phases.append(PhaseReport(pl.key.phase, n, pl.collectives, pl.link_s, pl.overlap_s,
                                  pl.exposed_s, j, float(pl.link_bytes[j]) if j >= 0 else 0.0,
                                  float(pl.link_bytes.sum()), pl.hops, pl.latency_s))
        comm += n * pl.exposed_s
        lat += n * pl.exposed_latency_s
        link_t += n * pl.link_s
        lb += n * float(pl.link_bytes.sum())
        hops += n * pl.hops
    link_loads: dict[int, list[float]] = {}
    for pl in loads:
        prev = link_loads.get(pl.key.phase)
        vals = pl.link_bytes.tolist()
        link_loads[pl.key.phase] = vals if prev is None else [a + b for a, b in zip(prev, vals)]
    return Q2(step_s=comp + comm + lat, compute_s=comp, communication_s=comm, link_time_s=link_t,
              link_bytes=lb, hops=hops, phases=phases,
              link_loads=link_loads, placement=[int(v) for v in placement], latency_s=lat,
              warnings=warns)
