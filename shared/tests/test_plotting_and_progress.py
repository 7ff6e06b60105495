import importlib
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


def test_nested_loops_share_one_display(monkeypatch: pytest.MonkeyPatch) -> None:
    progress_module = importlib.import_module("mixlab.shared.progress_report")
    monkeypatch.setenv("MIXLAB_PROGRESS", "1")
    with progress(2, "cells") as outer:
        with progress_module.current_cell("gcn seed=0"), progress(5, "train") as inner:
            display = progress_module._display
            assert display is not None
            assert [task.description for task in display.tasks] == ["cells", "gcn seed=0 · train"]
            inner.advance(2, loss=0.25)
        assert [task.description for task in display.tasks] == ["cells"]  # the inner loop ended
        outer.advance()
    assert progress_module._display is None


def test_lines_name_the_cell_count_steps_and_give_an_eta(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mixlab.shared.progress_report import current_cell

    monkeypatch.setenv("MIXLAB_PROGRESS", "lines")
    monkeypatch.setenv("MIXLAB_PROGRESS_EVERY", "0")
    with current_cell("per_bit gptq bits=3 seed=0"), progress(4, "calibrate") as bar:
        bar.advance(loss=0.5)
    line = capsys.readouterr().err.strip()
    assert "per_bit gptq bits=3 seed=0 · calibrate: 1/4 (" in line
    assert "ETA" in line
    assert line.endswith("loss=0.5")
    monkeypatch.setenv("MIXLAB_PROGRESS", "0")
    with progress(4, "quiet") as bar:
        bar.advance()
    assert capsys.readouterr().err == ""


CELL_MODULE = """
from mixlab.shared import progress


def train_in_a_cell(cell):
    with progress(2, "train") as bar:
        bar.advance()
        bar.advance()
    return cell["seed"]
"""


def test_run_cells_names_each_cell_in_its_lines_and_in_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import dataclass

    from mixlab.shared import ExperimentConfig, run_cells

    @dataclass
    class Config(ExperimentConfig):
        pass

    (tmp_path / "cell_module.py").write_text(CELL_MODULE)  # importable by the worker processes
    monkeypatch.syspath_prepend(str(tmp_path))
    train_in_a_cell = importlib.import_module("cell_module").train_in_a_cell
    monkeypatch.setenv("MIXLAB_PROGRESS", "lines")
    monkeypatch.setenv("MIXLAB_PROGRESS_EVERY", "0")
    planned = [{"system": "gcn", "seed": seed} for seed in range(2)]
    run_cells(tmp_path / "a", Config(), planned, train_in_a_cell, resume=False, label="cells")
    err = capfd.readouterr().err
    assert "cells: cell 1/2 starts: gcn seed=0" in err
    assert "gcn seed=1 · train: 1/2 (" in err
    assert "cells: 2/2 (" in err
    run_cells(tmp_path / "b", Config(), planned, train_in_a_cell, resume=False, label="cells",
              workers=2)  # fmt: skip
    err = capfd.readouterr().err
    assert "cells: 2 cells in 2 worker processes" in err
    assert "gcn seed=0 · train: 1/2 (" in err  # written by the worker that ran the cell
