"""Progress reports from the planner: stage, candidate k of K, each solver's incumbent and bound.

The planner calls a `Progress` object it is given; the library default says nothing. The CLI
passes `ConsoleProgress`, which writes to stderr through rich.
"""

from __future__ import annotations

import time


class Progress:
    """Silent progress (the library default). Subclass and override what you want to see."""

    def stage(self, text: str) -> None:
        pass

    def candidate(self, k: int, total: int, text: str) -> None:
        pass

    def solver(self, name: str, status: str, incumbent: float | None, bound: float | None,
               unit: str = "s") -> None:
        pass

    def note(self, text: str) -> None:
        pass


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v * 1e3:.3f} ms"
    return f"{v:.4g} {unit}"


class ConsoleProgress(Progress):
    """Progress lines on stderr (rich), each with the seconds since planning began."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.t0 = time.perf_counter()

    def _print(self, text: str) -> None:
        self.console.print(f"[dim]{time.perf_counter() - self.t0:7.1f}s[/dim] {text}")

    def stage(self, text: str) -> None:
        self._print(f"[bold]{text}[/bold]")

    def candidate(self, k: int, total: int, text: str) -> None:
        self._print(f"  candidate {k}/{total}: {text}")

    def solver(self, name, status, incumbent, bound, unit="s") -> None:
        self._print(f"    {name}: {status}, incumbent {_fmt(incumbent, unit)}, bound {_fmt(bound, unit)}")

    def note(self, text: str) -> None:
        self._print(f"  [dim]{text}[/dim]")
