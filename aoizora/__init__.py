"""AoiZora: solver-optimal sharding and placement plans for video diffusion transformers on TPU
slices, priced on the program the real XLA:TPU compiler emits (ahead of time, no TPU needed).

The public names (``plan``, ``plan_torch``, ``load_plan``, ``Plan``, ``PlanError``, ``PlanningError``,
``BudgetError``) are imported on first use (module ``__getattr__``), so that importing a
subpackage (e.g. ``aoizora.extract.targets``) does not import the planner."""

__version__ = "0.1.0"

import importlib

from aoizora.extract.targets import prepare_libtpu_env as _prepare_libtpu_env

# libtpu reads these when it first initialises; set them before anything touches a backend.
_prepare_libtpu_env()

_PUBLIC = {"plan": "aoizora.planner", "plan_torch": "aoizora.planning.torch_planner", "load_plan": "aoizora.plans", "Plan": "aoizora.plans",
           "PlanError": "aoizora.plans", "PlanningError": "aoizora.planning_errors",
           "BudgetError": "aoizora.planning_errors"}

__all__ = ["plan", "plan_torch", "load_plan", "Plan", "PlanError", "PlanningError", "BudgetError"]


def __getattr__(name):
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'aoizora' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_PUBLIC))
