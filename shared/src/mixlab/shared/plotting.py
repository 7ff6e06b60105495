"""Plots saved as PNG files, without pyplot's global state (safe in threads and without a display)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    import torch


def save_figure(figure: Figure, path: str | os.PathLike[str], *, dpi: int = 120) -> Path:
    """Write ``figure`` to ``path`` as PNG (folders are created) and return the path."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ValueError(f"path must end in .png, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    return path


def image_grid(images: torch.Tensor, columns: int) -> np.ndarray:
    """Images ``[B, C, H, W]`` in [-1, 1] tiled ``columns`` per row on a white 1-pixel grid, as
    a uint8 array ``[rows·(H+1)+1, columns·(W+1)+1, C]``."""
    array = ((images.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().byte()
    array = array.permute(0, 2, 3, 1).numpy()
    rows = -(-len(array) // columns)
    h, w, c = array.shape[1:]
    canvas = np.full((rows * (h + 1) + 1, columns * (w + 1) + 1, c), 255, np.uint8)
    for i, image in enumerate(array):
        r, col = divmod(i, columns)
        canvas[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + col * (w + 1) : 1 + col * (w + 1) + w] = (
            image
        )
    return canvas


def line_plot(
    path: str | os.PathLike[str],
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    logy: bool = False,
) -> Path:
    """One line per system: ``series = {"ours": (xs, ys), "baseline": (xs, ys)}``."""
    if not series:
        raise ValueError("series must hold at least one named (xs, ys) pair")
    figure = Figure(figsize=(6, 4))
    axes = figure.add_subplot()
    for label, (xs, ys) in series.items():
        if len(xs) != len(ys):
            raise ValueError(f"series[{label!r}] has {len(xs)} x values but {len(ys)} y values")
        axes.plot(xs, ys, label=label, marker="o" if len(xs) <= 20 else None)
    axes.set(xlabel=xlabel, ylabel=ylabel, title=title)
    if logx:
        axes.set_xscale("log")
    if logy:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend()
    return save_figure(figure, path)


def bar_plot(
    path: str | os.PathLike[str],
    values: Mapping[str, float],
    *,
    ylabel: str,
    title: str = "",
    errors: Mapping[str, float] | None = None,
) -> Path:
    """One bar per system, with optional error bars (e.g. the spread over seeds)."""
    if not values:
        raise ValueError("values must hold at least one named number")
    if errors is not None and set(errors) != set(values):
        raise ValueError(
            f"errors must have the same names as values: {sorted(values)}, got {sorted(errors)}"
        )
    figure = Figure(figsize=(max(4, 1.2 * len(values)), 4))
    axes = figure.add_subplot()
    names = list(values)
    axes.bar(
        names,
        [values[n] for n in names],
        yerr=[errors[n] for n in names] if errors else None,
        capsize=4,
    )
    axes.set(ylabel=ylabel, title=title)
    axes.grid(axis="y", alpha=0.3)
    return save_figure(figure, path)
