import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mixlab.shared.cli import main


def _stderr_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, f"expected one line on stderr, got {err!r}"
    return err


def test_list_shows_installed_methods(toy_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "toy" in out
    assert "registry" in out  # from the paper title (the table may wrap it)


def test_run_writes_result_json(toy_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "toy",
                "--seed",
                "2",
                "--device",
                "cpu",
                "--out",
                str(out),
                "--set",
                "steps=120",
            ]
        )
        == 0
    )
    data = json.loads((out / "result.json").read_text())
    assert (data["seed"], data["config"]["steps"], data["env"]["device"]) == (2, 120, "cpu")


def test_run_resumes_after_a_kill(toy_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated kill"):
        main(["run", "toy", "--device", "cpu", "--out", str(out), "--set", "crash_at_step=55"])
    assert main(["run", "toy", "--device", "cpu", "--out", str(out), "--resume"]) == 0
    assert (out / "resumed_from.txt").read_text() == "50"
    resumed = json.loads((out / "result.json").read_text())["metrics"]
    assert main(["run", "toy", "--device", "cpu", "--out", str(tmp_path / "straight")]) == 0
    assert json.loads((tmp_path / "straight" / "result.json").read_text())["metrics"] == resumed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "does-not-exist"], "unknown method 'does-not-exist'; installed methods: "),
        (["run", "toy", "--profile", "huge"], "profile must be one of ['full', 'quick']"),
        (["run", "toy", "--seed", "-3"], "seed must be an integer"),
        (["run", "toy", "--seed", "abc"], "Invalid value for '--seed'"),
        (["run", "toy", "--device", "tpu"], "device must be one of"),
        (["run", "toy", "--set", "stepz=3"], "--set field must be one of"),
        (["run", "toy", "--set", "steps=0"], "steps must be an integer >= 1"),
        (["run", "toy", "--bogus"], "No such option: --bogus"),
        (["reproduce", "--only", "toy,nope"], "--only must name installed methods ("),
        (["frobnicate"], "No such command 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    toy_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    assert (
        main([*argv, *(["--out", str(tmp_path)] if argv[0] == "run" and len(argv) > 1 else [])])
        == 2
    )
    line = _stderr_line(capsys)
    assert line.startswith("mixlab")
    assert message in line


def test_reproduce_writes_reports(
    toy_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reproduce", "--only", "toy", "--device", "cpu", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "reproduce.json").read_text())
    (row,) = [row for row in report["methods"] if row["method"] == "toy"]
    assert row["status"] == "ok"
    assert row["claims"][0]["holds"] is True
    assert "| toy | SGD gets within 0.01" in (tmp_path / "reproduce.md").read_text()
    assert (tmp_path / "toy" / "result.json").exists()
    assert "holds" in capsys.readouterr().out


def test_reproduce_reports_a_crash_and_exits_1(
    site_with_methods, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site_with_methods(
        {"crashy": "mixlab_crashy_method:METHOD"},
        {
            "mixlab_crashy_method": (
                "from mixlab.shared import ExperimentConfig, Method\n"
                "def run(config, out_dir, *, resume=False):\n"
                "    raise RuntimeError('out of memory')\n"
                "METHOD = Method(name='crashy', domain='rl', paper='p', claim='c', config=ExperimentConfig, run=run)\n"
            )
        },
    )
    assert main(["reproduce", "--only", "crashy", "--device", "cpu", "--out", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "reproduce.json").read_text())
    assert report["methods"][0]["status"] == "failed"
    assert "out of memory" in report["methods"][0]["error"]
    assert "Traceback" in (tmp_path / "crashy" / "error.txt").read_text()


def test_console_script_exits_2_with_one_line(toy_path: Path) -> None:
    script = Path(sys.executable).with_name("mixlab")
    completed = subprocess.run(
        [str(script), "run", "does-not-exist"],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith(
        "mixlab: error: unknown method 'does-not-exist'; installed methods: "
    )
    assert completed.stderr.count("\n") == 1
    assert "toy" in completed.stderr


def test_no_arguments_shows_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "Usage: mixlab" in capsys.readouterr().out
