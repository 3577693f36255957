"""AoiZora: solver-optimal sharding and placement plans for video diffusion transformers on TPU
slices, priced on the program the real XLA:TPU compiler emits (ahead of time, no TPU needed)."""

__version__ = "0.1.0"

from aoizora.extract.targets import prepare_libtpu_env as _prepare_libtpu_env

# libtpu reads these when it first initialises; set them before anything touches a backend.
_prepare_libtpu_env()

from aoizora.plans import Plan, PlanError, load_plan  # noqa: E402
from aoizora.planner import BudgetError, PlanningError, plan  # noqa: E402

__all__ = ["plan", "load_plan", "Plan", "PlanError", "PlanningError", "BudgetError"]
