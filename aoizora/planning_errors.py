"""The errors ``aoizora.plan`` raises when planning cannot go on (each a one-line reason)."""


class PlanningError(ValueError):
    """Planning cannot go on: a one-line reason and what to do."""


class BudgetError(PlanningError):
    """The time budget is too small for one compile of the program."""
