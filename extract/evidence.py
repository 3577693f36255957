"""The evidence: what the compiler really emitted for one candidate, in logical ids.

Plain dataclasses, JSON in and out. Everything here is *placement-open* (identical under any
device order) except `Evidence.algorithms`, the compiler's `collective_algorithm_config`
choices, which are kept apart and tagged with the device order they were made under.

Conventions
- Logical ids: a rank is a position in the compiled mesh's flattened device array
  (``mesh.devices.flat``), exactly as the compiler's replica groups name them.
- ``Collective.bytes`` is V, the per-device size of the *larger* side of the collective: the
  gathered result of an all-gather, the operand of a reduce-scatter, the buffer of an all-reduce,
  the buffer of an all-to-all or of a collective-permute (scaling-book convention,
  ``shared/facts/tpu.md``).
- ``Collective.count`` is how many times it runs per call of the program: the product of the trip
  counts of the `while` loops around it.
- ``Collective.phase``: collectives with the same phase are in flight at the same time and share
  links; phases are numbered in schedule order.
- Times are seconds; sizes are bytes.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

COLLECTIVE_KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                    "collective-permute")

# The name scope ``aoizora.runtime.realize`` puts around each attention node, so that the compiled ops of
# that node carry its IR key in their op_name metadata: ``.../aoizora_attention[3.1.7]/...``.
ATTENTION_SCOPE = "aoizora_attention"
_SCOPE_RE = re.compile(re.escape(ATTENTION_SCOPE) + r"\[([^\]]+)\]")


def attention_scope(key: str) -> str:
    """The name scope of attention node ``key`` (IR node key, as in ``Layout.attention``)."""
    return f"{ATTENTION_SCOPE}[{key}]"


def attention_node_of(op_name: str) -> str | None:
    """The attention node key an op's op_name metadata names (innermost scope), or None."""
    keys = _SCOPE_RE.findall(op_name or "")
    return keys[-1] if keys else None


@dataclasses.dataclass
class Collective:
    name: str                                  # HLO instruction name (the -start for async)
    kind: str                                  # one of COLLECTIVE_KINDS
    dtype: str                                 # HLO element type, e.g. "bf16"
    bytes: int                                 # V: see module docstring
    replica_groups: list[list[int]]            # logical ids; for permutes: one group of all ids used
    source_target_pairs: list[tuple[int, int]] | None = None  # collective-permute only
    count: int = 1                             # runs per program call (loop trip counts)
    is_async: bool = False                     # -start/-done pair or async collective fusion
    phase: int = 0                             # in flight together <=> same phase
    overlap_cycles: float = 0.0                # compiler-estimated compute cycles between start and done
    computation: str = ""                      # HLO computation it lives in
    op_name: str = ""                          # HLO metadata op_name (links back to the IR)
    source: str = ""                           # "file:line" from metadata, when present
    # Schedule: positions in the program's schedule flattened from ENTRY (called computations
    # inlined where they are called); a sync collective has start_index == done_index.
    start_index: int = 0
    done_index: int = 0
    fused_with: list[str] = dataclasses.field(default_factory=list)  # compute fusions carrying it

    @property
    def group_size(self) -> int:
        return max((len(g) for g in self.replica_groups), default=1)


@dataclasses.dataclass
class ComputeOp:
    name: str                                  # HLO instruction name
    kind: str                                  # "fusion", "custom-call", "convolution", ...
    estimated_cycles: float | None             # compiler's own estimate, None when absent
    flops: float = 0.0                         # from shapes, where estimated_cycles is absent
    bytes: float = 0.0
    count: int = 1                             # runs per program call
    computation: str = ""
    op_name: str = ""
    custom_call_target: str = ""
    index: int = 0                             # schedule position (same numbering as Collective)
    # a splash attention kernel's tiles and per-shard shapes (block_q, block_kv,
    # block_kv_compute, lead, lq, lkv, head_dim, dtype_bytes); {} for any other op
    kernel: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class MemoryUse:
    argument_bytes: int = 0
    output_bytes: int = 0
    temp_bytes: int = 0
    alias_bytes: int = 0
    generated_code_bytes: int = 0
    hbm_bytes: int = 0                         # the target's usable HBM per device
    fits: bool = True
    oom_message: str = ""                      # the compiler's RESOURCE_EXHAUSTED text, if any

    @property
    def total_bytes(self) -> int:
        return (self.argument_bytes + self.output_bytes + self.temp_bytes
                + self.generated_code_bytes - self.alias_bytes)


_LOCAL = ("hlo_path", "source", "cache_key")    # an Evidence's fields of this call, not its JSON


@dataclasses.dataclass
class Evidence:
    target: str                                # canonical target name, e.g. "v5e:2x4"
    mesh_axes: dict[str, int]                  # logical mesh axis name -> size, in order
    generation: str = ""                       # the target's chip generation, e.g. "v5e"
    fidelity: str = "tpu"                      # "tpu" (libtpu), "gpu" (XLA:GPU ahead of time) or "cpu-low" (CPU backend fallback)
    collectives: list[Collective] = dataclasses.field(default_factory=list)
    compute: list[ComputeOp] = dataclasses.field(default_factory=list)
    memory: MemoryUse = dataclasses.field(default_factory=MemoryUse)
    flops: float = 0.0                         # cost_analysis() per device
    bytes_accessed: float = 0.0
    clock_hz: float = 0.0                      # to turn estimated_cycles into seconds
    # Placement-dependent: the compiler's collective_algorithm_config per collective name,
    # valid only for `algorithms_device_order` (physical device ids per logical rank).
    algorithms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    algorithms_device_order: list[int] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    compile_s: float = 0.0
    optimal_seconds: float | None = None       # cost_analysis() estimate; None when unknown (<0)
    # Where the compiled program's HLO text was kept (gzip'd), when the compile was asked to keep
    # it (``aot_compile.keeping_hlo``); None otherwise. Not part of the evidence's JSON nor of
    # its equality: it names a file of this machine, which may be gone.
    hlo_path: str | None = dataclasses.field(default=None, compare=False, repr=False)
    # Where this evidence came from on this call: "" (compiled here), "cache" (an entry of
    # ``evidence_cache.EvidenceCache``). Not part of the JSON nor of equality, like ``hlo_path``.
    source: str = dataclasses.field(default="", compare=False, repr=False)
    # The key of the evidence cache entry it was stored or found under on this call ("" without
    # a cache): what ``aot_compile.keep_alias`` keeps. Not part of the JSON nor of equality.
    cache_key: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self):
        # evidence saved before it kept the generation, or made from a target name alone (a
        # hand-written HLO): the canonical name starts with it ("v5e:2x4"), read here once
        if not self.generation:
            self.generation = str(self.target).split(":")[0]

    @property
    def num_devices(self) -> int:
        n = 1
        for v in self.mesh_axes.values():
            n *= v
        return n

    def placement_open(self) -> dict[str, Any]:
        """The part of the evidence that does not depend on the device order."""
        d = self.to_json()
        for k in ("algorithms", "algorithms_device_order", "compile_s"):
            d.pop(k)
        # The code the compiler generates for a collective depends on the algorithm it chose
        # (observed: 316,416 vs 318,464 bytes for one program under two device orders).
        d["memory"].pop("generated_code_bytes", None)
        return d

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in _LOCAL:
            d.pop(k, None)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Evidence":
        d = {k: v for k, v in d.items() if k not in _LOCAL}
        d["collectives"] = [
            Collective(**{**c, "source_target_pairs": (
                [tuple(p) for p in c["source_target_pairs"]]
                if c.get("source_target_pairs") is not None else None)})
            for c in d.get("collectives", [])]
        d["compute"] = [ComputeOp(**c) for c in d.get("compute", [])]
        d["memory"] = MemoryUse(**d.get("memory", {}))
        return cls(**d)

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def loads(cls, s: str) -> "Evidence":
        return cls.from_json(json.loads(s))
