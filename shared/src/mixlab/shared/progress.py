"""Progress bars for long loops (rich), quiet when the output is not a terminal.

Set ``MIXLAB_PROGRESS=0`` to hide them, ``MIXLAB_PROGRESS=1`` to force them on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")


def progress_enabled() -> bool:
    setting = os.environ.get("MIXLAB_PROGRESS")
    if setting is not None:
        return setting not in ("0", "false", "no", "")
    return sys.stderr.isatty()


class ProgressBar:
    """Handle of :func:`progress`: ``advance`` by some steps and show the latest numbers."""

    def __init__(self, bar: Progress, task: int) -> None:
        self._bar, self._task = bar, task

    def advance(self, steps: int = 1, **numbers: float) -> None:
        shown = "  ".join(f"{name}={value:.4g}" for name, value in numbers.items())
        self._bar.update(self._task, advance=steps, numbers=shown)


@contextmanager
def progress(total: int | None, description: str, *, completed: int = 0) -> Iterator[ProgressBar]:
    """A progress bar for a manual loop; ``completed`` starts it part-way (a resumed run)::

    with progress(total_steps, "train", completed=start) as bar:
        for step in range(start, total_steps):
            ...
            bar.advance(loss=loss.item())
    """
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[numbers]}"),
        disable=not progress_enabled(),
        transient=False,
    )
    with bar:
        task = bar.add_task(description, total=total, completed=completed, numbers="")
        yield ProgressBar(bar, task)


def track(iterable: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``iterable`` with a progress bar."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with progress(total, description) as bar:
        for item in iterable:
            yield item
            bar.advance()
