"""A plan's predicted step (``Plan.predicted``): what Q2, the planner's link-load model, says one
step of the planned program takes on the target, from the program XLA:TPU compiled ahead of
time. A prediction, not a measurement: nothing ran on a TPU.

``Predicted`` is a dataclass that also reads as the mapping plan files store (``pr["step_s"]``,
``pr.get("links")``, ``dict(pr)``), so code written against the plan's JSON keeps working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

# the order of the keys in a plan file (the order the planner has always written them in)
_KEYS = ("step_s", "compute_s", "communication_s", "latency_s", "link_time_s", "model", "kind",
         "default_order_step_s", "q1_step_s", "links")


@dataclasses.dataclass(frozen=True, eq=False)
class Predicted(Mapping):
    """One step of the planned program, predicted by Q2. Times are seconds per step (one
    denoising step, or one training step), on the plan's mesh, layout and device order.

    Attributes:
      step_s: the whole step: ``compute_s + communication_s + latency_s``.
      compute_s: compute of the compiled program (its ops' times, ``formulation.op_time``).
      communication_s: communication not hidden behind compute (link loads over bandwidth).
      latency_s: per-hop latency of the collectives; None in plan files that lack it.
      link_time_s: the busiest link's time (seconds), overlapped or not; None if absent.
      model: the model that priced it (e.g. ``"Q2"``, with its version words).
      kind: ``"predicted"`` (never ``"measured"``).
      default_order_step_s: the same layout under JAX's default device order, seconds per
        step by Q2; None when not priced.
      q1_step_s: the sharding ILP's own estimate (Q1) for the layout, seconds per step; None
        for a seed the ILP did not price.
      links: the busiest links, each a dict (``{"link": ..., "seconds": ...}``, seconds per
        step), as ``extract.network`` names them.
      extra: any other entry a plan file carries (newer or older fields), kept as read.
    """

    step_s: float
    compute_s: float
    communication_s: float
    latency_s: float | None = None
    link_time_s: float | None = None
    model: str = ""
    kind: str = ""
    default_order_step_s: float | None = None
    q1_step_s: float | None = None
    links: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Predicted":
        """Reads the ``predicted`` object of a plan file (or a ``Predicted``).

        Args:
          d: the mapping; ``step_s``, ``compute_s`` and ``communication_s`` are required (the
            plan file's schema, ``plan_schema``, checks them before this is called).

        Returns:
          The ``Predicted``; keys it does not know go to ``extra``.

        Raises:
          KeyError: a required key is missing.
        """
        if isinstance(d, Predicted):
            return d
        known = {k: d[k] for k in _KEYS if k in d}
        known["links"] = list(known.get("links") or [])
        return cls(**known, extra={k: v for k, v in d.items() if k not in _KEYS})

    def to_json(self) -> dict[str, Any]:
        """The ``predicted`` object of a plan file.

        Returns:
          A dict of the fields in the plan file's order, then ``extra``'s entries.
        """
        d = {k: getattr(self, k) for k in _KEYS}
        d["links"] = list(self.links)
        d.update(self.extra)
        return d

    # -- the mapping plan files store ------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key in _KEYS:
            return getattr(self, key)
        return self.extra[key]

    def __iter__(self) -> Iterator[str]:
        return iter((*_KEYS, *self.extra))

    def __len__(self) -> int:
        return len(_KEYS) + len(self.extra)
