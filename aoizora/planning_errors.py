"""The errors ``aoizora.plan`` raises when planning cannot go on (each a one-line reason).

``PlanningError.kind`` says whose the problem is, so that a caller can act on it without reading
the text:

- ``"input"``: an argument of ``plan`` is unusable (a non-callable ``fn``, an argument without
  shape and dtype, a zero-size or non-integer dimension, a setting of the wrong type or range);
  the message names the argument and what to pass;
- ``"trace"``: ``fn`` raised while JAX traced it (e.g. NumPy called on a traced value, a shape
  error in the model); the message gives the function's first error line;
- ``"budget"``: the time budget cannot hold what planning needs (``BudgetError``);
- ``"interrupted"``: SIGINT or SIGTERM came before any layout was compiled and priced, so there
  is no plan to return (after that, ``plan`` returns the best plan so far with status
  ``"INTERRUPTED"`` instead of raising);
- ``"no_plan"``: planning ran but found nothing to return (no layout fits in HBM, none
  compiled); the default.
"""

KINDS = ("input", "trace", "budget", "interrupted", "no_plan")


class PlanningError(ValueError):
    """Planning cannot go on: a one-line reason and what to do. ``kind``: one of ``KINDS``
    (module docstring)."""

    def __init__(self, message: str = "", kind: str = "no_plan"):
        super().__init__(message)
        self.kind = kind


class BudgetError(PlanningError):
    """The time budget is too small for what planning needs (kind ``"budget"``)."""

    def __init__(self, message: str = "", kind: str = "budget"):
        super().__init__(message, kind)
