"""What a placement search returns (``PlacementResult``), shared by the CP-SAT solver
(``solvers.placement``) and the heuristic searches (``solvers.placement_heuristics``)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

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
    first device of that chip in ``network.device_chip`` (one device per chip: the device).
    With several devices per chip the CP-SAT model places ranks on devices: `chip_of_rank` is
    then a device per rank (``model_places``), returned as it is."""
    if network.num_devices != network.num_chips:
        return [int(d) for d in chip_of_rank]
    dev_of_chip = {int(c): d for d, c in enumerate(network.device_chip)}
    return [dev_of_chip[int(c)] for c in chip_of_rank]


def model_places(network: Network, placement: Sequence[int]) -> np.ndarray:
    """What the CP-SAT model (``formulation.placement_cpsat``) places rank r on, for a placement
    (device per rank).

    Args:
        network: the slice.
        placement: device index per rank.

    Returns:
        The chip of each rank with one device per chip; the device itself with several (the
        model then places ranks on devices). ``chips_to_devices`` is the inverse."""
    p = np.asarray(placement, dtype=np.int64)
    return p if network.num_devices != network.num_chips else network.device_chip[p]
