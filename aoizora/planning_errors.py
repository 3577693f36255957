"""The errors ``aoizora.plan`` raises when planning cannot go on (each a one-line reason)."""


class PlanningError(ValueError):
    """Planning cannot go on: a one-line reason and what to do (``aoizora.plan`` raises it; the
    CLI prints it and exits 2).

    Args:
      message: the reason and what to do, one line.
    """


class BudgetError(PlanningError):
    """The time budget is not a positive number of seconds, or is too small for one compile of
    the program (a ``PlanningError``).

    Args:
      message: the budget, what it could not hold, and the budget to give instead.
    """
