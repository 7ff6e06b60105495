"""Progress of long loops: what runs now, its own step counter and an ETA from its measured rate.

Every training or evaluation loop of an experiment reports through :func:`progress` (or
:func:`track`). Loops nest: an experiment's cells (:func:`~mixlab.shared.checkpoint.run_cells`)
show which cell runs, and a loop inside a cell shows beneath it, named after the cell, with its
own counter and ETA::

    mobiquant cells  3/19  ━━━━━━━━━  0:04:10  0:21:00   [per_bit gptq bits=3 seed=0]
    per_bit gptq bits=3 seed=0 · gptq blocks  2/4  ━━━━━━━━━  0:00:40  0:00:41

``MIXLAB_PROGRESS`` chooses how: ``bars`` (rich bars, the default on a terminal), ``lines`` (a
plain line per cell and, every ``MIXLAB_PROGRESS_EVERY`` seconds (30), per running loop: the
default when stderr is a file or a pipe, so a log shows what a long run is doing) or ``0`` (off).
Worker processes always write lines.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")

_display: Progress | None = None
"""the one rich display of this process while a bar is open; nested loops add their tasks to it"""
_cell: str | None = None
"""the name of the cell that runs now (:func:`current_cell`), prefixed to the loops inside it"""


def progress_mode() -> str:
    """``"bars"``, ``"lines"`` or ``"off"``, from ``MIXLAB_PROGRESS`` (default: bars on a
    terminal, lines otherwise)."""
    setting = os.environ.get("MIXLAB_PROGRESS")
    if setting is None:
        return "bars" if sys.stderr.isatty() else "lines"
    setting = setting.strip().lower()
    if setting in ("0", "false", "no", "off", ""):
        return "off"
    return "lines" if setting == "lines" else "bars"


def _line_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("MIXLAB_PROGRESS_EVERY", "30")))
    except ValueError:
        return 30.0


def clock(seconds: float) -> str:
    """``h:mm:ss`` (or ``m:ss`` under an hour)."""
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class ProgressBar:
    """Handle of :func:`progress`: ``advance`` by some steps and show the latest numbers."""

    def __init__(
        self,
        description: str,
        total: int | None,
        completed: int,
        *,
        display: Progress | None = None,
        task: Any = None,
        lines: bool = False,
    ) -> None:
        self.description, self.total, self.done = description, total, completed
        self._display, self._task, self._lines = display, task, lines
        self._started, self._first = time.perf_counter(), completed
        self._last_line = self._started
        self._numbers = ""

    def advance(self, steps: int = 1, *, line: bool = False, **numbers: float) -> None:
        """``steps`` more done; ``numbers`` shown beside the bar. In lines mode a line is
        written every ``MIXLAB_PROGRESS_EVERY`` seconds, or now with ``line=True``."""
        self.done += steps
        self._numbers = "  ".join(f"{name}={value:.4g}" for name, value in numbers.items())
        if self._display is not None:
            self._display.update(self._task, advance=steps, numbers=self._numbers)
        elif self._lines and (line or time.perf_counter() - self._last_line >= _line_interval()):
            self.note()

    def describe(self, description: str) -> None:
        """Show ``description`` on the bar in place of the loop's name (the cell that runs now;
        lines name it when it starts)."""
        if self._display is not None:
            self._display.update(self._task, description=description)

    def status(self) -> str:
        """``name: done/total (rate/s, elapsed, ETA) numbers``, the ETA from the measured rate."""
        elapsed = time.perf_counter() - self._started
        text = f"{self.description}: {self.done}" + (f"/{self.total}" if self.total else "")
        rate = (self.done - self._first) / elapsed if elapsed > 0 else 0.0
        parts = [
            f"{rate:.3g}/s" if rate >= 0.1 else f"{1 / rate:.3g} s each" if rate else "",
            clock(elapsed),
        ]
        if self.total and rate > 0:
            parts.append(f"ETA {clock((self.total - self.done) / rate)}")
        text += f" ({', '.join(p for p in parts if p)})"
        return f"{text} {self._numbers}".rstrip()

    def note(self, text: str | None = None) -> None:
        """In lines mode, one timestamped line now: ``text`` (a cell that starts), or the
        :meth:`status` (a cell that ended)."""
        if self._lines:
            self._last_line = time.perf_counter()
            text = self.status() if text is None else text
            print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


@contextmanager
def progress(total: int | None, description: str, *, completed: int = 0) -> Iterator[ProgressBar]:
    """Progress of a manual loop; ``completed`` starts it part-way (a resumed run)::

        with progress(total_steps, "train", completed=start) as bar:
            for step in range(start, total_steps):
                ...
                bar.advance(loss=loss.item())

    Inside a cell (:func:`current_cell`) the loop is named ``"<cell> · <description>"``; inside
    another loop's bar it shows beneath it and disappears when it ends.
    """
    global _display
    label = f"{_cell} · {description}" if _cell else description
    mode = progress_mode()
    if mode != "bars":
        yield ProgressBar(label, total, completed, lines=mode == "lines")
        return
    owner = _display is None
    if owner:
        _display = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[numbers]}"),
            transient=False,
        )
        _display.start()
    display = _display
    task = display.add_task(label, total=total, completed=completed, numbers="")
    try:
        yield ProgressBar(label, total, completed, display=display, task=task)
    finally:
        if owner:
            display.stop()
            _display = None
        else:
            display.remove_task(task)  # the outer bar stays; a finished inner loop goes


@contextmanager
def current_cell(name: str) -> Iterator[None]:
    """Name the loops that run inside: an experiment's cell (``run_cells`` sets it)."""
    global _cell
    outer, _cell = _cell, name
    try:
        yield
    finally:
        _cell = outer


def track(iterable: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``iterable`` with its progress shown."""
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    with progress(total, description) as bar:
        for item in iterable:
            yield item
            bar.advance()


def cell_name(cell: dict[str, Any]) -> str:
    """A cell's short name: its string values as they are, the others as ``key=value``
    (``per_bit gptq bits=3 seed=0``)."""
    return " ".join(v if isinstance(v, str) else f"{k}={v}" for k, v in cell.items())


def lines_in_workers() -> None:
    """Worker processes write lines (their bars would fight the parent's display)."""
    if progress_mode() != "off":
        os.environ["MIXLAB_PROGRESS"] = "lines"


@contextmanager
def quiet_library_bars() -> Iterator[None]:
    """No progress bars of Hugging Face libraries inside the block (an experiment's own loops
    report through :func:`progress`; transformers would add a bar per model saved or loaded).
    ``HF_HUB_DISABLE_PROGRESS_BARS`` reaches the libraries imported later and worker processes;
    an already imported transformers is switched off and back."""
    previous = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    hf_logging = sys.modules.get("transformers.utils.logging")
    shown = hf_logging is not None and hf_logging.is_progress_bar_enabled()
    if shown:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = previous
        if shown:
            hf_logging.enable_progress_bar()
