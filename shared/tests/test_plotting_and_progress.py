from pathlib import Path

import pytest

from mixlab.shared import bar_plot, line_plot, progress, track

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_line_and_bar_plots_write_png(tmp_path: Path) -> None:
    line = line_plot(
        tmp_path / "curves" / "loss.png",
        {"ours": ([1, 2, 3], [3.0, 2.0, 1.0]), "baseline": ([1, 2, 3], [3.0, 2.5, 2.0])},
        xlabel="step",
        ylabel="loss",
        logy=True,
    )
    bars = bar_plot(
        tmp_path / "acc.png",
        {"ours": 0.9, "baseline": 0.7},
        ylabel="accuracy",
        errors={"ours": 0.01, "baseline": 0.02},
    )
    for path in (line, bars):
        assert path.read_bytes()[:8] == PNG_MAGIC


def test_plot_inputs_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must end in .png"):
        bar_plot(tmp_path / "acc.jpg", {"a": 1.0}, ylabel="y")
    with pytest.raises(ValueError, match=r"series\['a'\] has 2 x values but 1 y values"):
        line_plot(tmp_path / "x.png", {"a": ([1, 2], [1])}, xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="errors must have the same names"):
        bar_plot(tmp_path / "x.png", {"a": 1.0}, ylabel="y", errors={"b": 0.1})


def test_progress_passes_items_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIXLAB_PROGRESS", "1")
    assert list(track(range(4), "count")) == [0, 1, 2, 3]
    with progress(3, "train", completed=1) as bar:
        bar.advance(loss=0.5)
        bar.advance(2)
