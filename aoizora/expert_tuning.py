"""Tuning an expert configuration the way its users would: its layout as published, priced at
the best of the knobs they turn (``models.tuned_experts``: remat, attention blocks, compiler
options), one knob at a time.

``tune_expert(job, name, price)``, in this order, each step from the best setting so far
(coordinate descent; deterministic: the order is fixed and ties keep the earlier):
  1. the expert as published (every knob ``published``);
  2. blocks: ``shard`` (sized to the shard by the kernel model, fused backward included; when
     the compile overflows VMEM or SMEM, chosen again within a smaller VMEM fraction, as the
     planner's own tiles are: ``kernels.tiles.choose_tiles``; one setting, one trial);
  3. remat (training): each of maxdiffusion's named policies, then keep-what-fits, whose rungs
     (``KEEP_LADDER``) are tried in order until one fits in HBM (none tried when ``none``, which
     keeps everything, fits);
  4. options (TPU): the published ones without windowed einsums (what the planner compiles its
     own layouts with), then the other setting (maxdiffusion's published options, or libtpu's
     defaults).
``price(variant)`` compiles and prices one setting and returns a ``Priced``: step seconds, or
None with the reason (does not compile, does not fit in HBM). ``max_compiles`` caps the settings
priced (the published one included); what the cap left untried is listed.

The result (``TunedExpert``) keeps every setting priced, the published one and the best; the
best tuned expert of a job is the least best over its experts (``best_of``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from aoizora.kernels.tiles import overflows_on_chip, smaller_tile_choices
from aoizora.models import tuned_experts as TE
from aoizora.models.tuned_experts import Knobs, Variant


@dataclasses.dataclass
class Priced:
    """What pricing one setting gave: ``step_s`` (None: not priced; ``reason`` says why),
    ``fits`` (HBM), and anything the pricer keeps (``detail``: e.g. its row, its evidence)."""

    step_s: float | None
    fits: bool | None = None
    reason: str = ""
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Trial:
    knobs: Knobs
    priced: Priced
    variant: Variant | None = None
    vmem_fraction: float = 1.0      # blocks ``shard``: the VMEM fraction its tiles were chosen in

    def to_json(self) -> dict[str, Any]:
        out = {**dataclasses.asdict(self.knobs), "step_s": self.priced.step_s,
               "fits": self.priced.fits, "reason": self.priced.reason}
        if self.vmem_fraction != 1.0:
            out["vmem_fraction"] = self.vmem_fraction
        return out


@dataclasses.dataclass
class TunedExpert:
    """One expert tuned: its published setting, its best setting, every setting priced, the
    ones the compile cap left untried."""

    name: str
    published: Trial | None
    best: Trial | None
    trials: list[Trial]
    untried: list[Knobs] = dataclasses.field(default_factory=list)

    @property
    def gain(self) -> float | None:
        """published step / best step (>= 1), None unless both are priced."""
        p = self.published.priced.step_s if self.published else None
        b = self.best.priced.step_s if self.best else None
        return p / b if p and b else None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "published": self.published and self.published.to_json(),
                "best": self.best and self.best.to_json(), "gain": self.gain,
                "trials": [t.to_json() for t in self.trials],
                "untried": [dataclasses.asdict(k) for k in self.untried]}


class _Search:
    """The descent's state: every setting priced (memoized by knobs), the best, the cap."""

    def __init__(self, job, name: str, price: Callable[[Variant], Priced],
                 max_compiles: int | None):
        self.job, self.name, self.price, self.cap = job, name, price, max_compiles
        self.trials: dict[Knobs, Trial] = {}
        self.untried: list[Knobs] = []
        self.best: Trial | None = None
        self.shard_fraction = 1.0

    def try_(self, knobs: Knobs) -> Trial | None:
        if knobs in self.trials:
            return self.trials[knobs]
        if self.cap is not None and len(self.trials) >= self.cap:
            self.untried.append(knobs)
            return None
        shard = knobs.blocks == "shard"
        fraction = self.shard_fraction if shard else 1.0
        v = TE.variant(self.job, self.name, knobs, fraction)
        if v is None:
            return None
        t = Trial(knobs, self.price(v), v, fraction)
        if shard and t.priced.step_s is None and overflows_on_chip(t.priced.reason):
            for f, w in smaller_tile_choices(lambda f: TE.variant(self.job, self.name, knobs, f),
                                             v, start=fraction,
                                             attention=lambda x: x.layout.attention):
                t = Trial(knobs, self.price(w), w, f)
                if t.priced.step_s is not None or not overflows_on_chip(t.priced.reason):
                    break
        if shard and t.priced.step_s is not None:
            self.shard_fraction = t.vmem_fraction     # later settings start from tiles that fit
        self.trials[knobs] = t
        s = t.priced.step_s
        if s is not None and (self.best is None or s < self.best.priced.step_s):
            self.best = t
        return t

    def base(self) -> Knobs:
        return self.best.knobs if self.best is not None else Knobs()


def _remat_step(search: _Search) -> None:
    """Step 3: each named policy from the best so far, then keep-what-fits (module docstring)."""
    for label in TE.remat_labels("train")[1:]:
        search.try_(dataclasses.replace(search.base(), remat=label))
    none = search.trials.get(dataclasses.replace(search.base(), remat="none"))
    if none is not None and none.priced.fits:
        return                          # everything kept fits: keep-what-fits is "none"
    for rung in range(1, len(TE.KEEP_LADDER) + 1):
        t = search.try_(dataclasses.replace(search.base(), remat=f"{TE.KEEP_WHAT_FITS}:{rung}"))
        if t is None or t.priced.fits:
            return


def tune_expert(job, name: str, price: Callable[[Variant], Priced],
                max_compiles: int | None = None) -> TunedExpert:
    """Expert ``name`` of ``job`` (``builtin.Job``) tuned by ``price`` (module docstring);
    ``max_compiles``: at most that many settings priced. An expert not valid for the job gives
    a TunedExpert with no trial."""
    search = _Search(job, name, price, max_compiles)
    published = search.try_(Knobs())
    if published is None:
        return TunedExpert(name, None, None, [])
    search.try_(dataclasses.replace(search.base(), blocks="shard"))
    if getattr(job, "task", "denoise") == "train":
        _remat_step(search)
    family = getattr(getattr(getattr(job, "target", None), "chip", None), "family", "tpu")
    for label in TE.option_labels(published.variant.layout.compiler_options
                                  if published.variant else {}, family)[1:]:
        search.try_(dataclasses.replace(search.base(), options=label))
    return TunedExpert(name, published, search.best, list(search.trials.values()),
                       search.untried)


def best_of(tuned: list[TunedExpert], published: bool = False) -> TunedExpert | None:
    """The expert whose best (or, with ``published``, published) setting is the least step."""
    def step(t: TunedExpert):
        trial = t.published if published else t.best
        return trial.priced.step_s if trial is not None else None

    priced = [t for t in tuned if step(t) is not None]
    return min(priced, key=step) if priced else None
