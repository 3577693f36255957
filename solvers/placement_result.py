"""What a placement search returns (``PlacementResult``), shared by the CP-SAT solver
(``solvers.placement``) and the heuristic searches (``solvers.placement_heuristics``)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from aoizora.extract.network import Network
from aoizora.formulation.latency import Q2
from aoizora.solvers.certificate import Certificate


@dataclasses.dataclass
class PlacementResult:
    placement: list[int] | None          # device index (position in target.devices()) per rank
    certificate: Certificate
    q2: Q2 | None
    trace: list[tuple[float, float]]     # (seconds since start, best objective in seconds)
    # other placements priced on the way (hint, axis orders), the best
    # ``solvers.placement.CANDIDATES_KEPT`` by link cost: what
    # ``solvers.placement_step.choose_by_step`` also considers; not serialized
    candidates: list[list[int]] = dataclasses.field(default_factory=list, repr=False)

    def to_json(self):
        return {"placement": self.placement, "certificate": self.certificate.to_json(),
                "q2": self.q2.to_json() if self.q2 else None, "trace": self.trace}


def chips_to_devices(network: Network, chip_of_rank: Sequence[int]) -> list[int]:
    """The placement (device index per rank) that puts rank r on chip ``chip_of_rank[r]``: the
    first device of that chip in ``network.device_chip`` (one device per chip: the device)."""
    dev_of_chip = {int(c): d for d, c in enumerate(network.device_chip)}
    return [dev_of_chip[int(c)] for c in chip_of_rank]

