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
        (["reproduce", "--only", "toy", "--tolerance", "-1"], "--tolerance must be a number >= 0"),
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
    report_md = (tmp_path / "report.md").read_text()
    assert "| toy | SGD gets within 0.01 of the least-squares error | holds |" in report_md
    assert "![toy](toy/loss.png)" in report_md  # the headline plot, embedded
    assert (tmp_path / "toy" / "result.json").exists()
    out = capsys.readouterr().out
    assert "holds" in out
    assert "[1/1] toy" in out


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


def _toy_result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "toy" / "result.json").read_text())


def test_reproduce_resume_keeps_finished_methods(
    toy_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["reproduce", "--only", "toy", "--device", "cpu", "--out", str(tmp_path)]
    assert main(argv) == 0
    first = _toy_result(tmp_path)
    assert main([*argv, "--resume"]) == 0
    assert "kept the finished run" in capsys.readouterr().out
    assert _toy_result(tmp_path) == first  # the same file, wall time included: not rerun


def test_reproduce_compare_reports_verdict_changes_and_drift(
    toy_path: Path, tmp_path: Path
) -> None:
    fresh = tmp_path / "fresh"
    assert main(["reproduce", "--only", "toy", "--device", "cpu", "--out", str(fresh)]) == 0
    committed = json.loads((fresh / "toy" / "result.json").read_text())
    reference = tmp_path / "committed"
    folder = reference / "toy" / "experiment-quick"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(committed))
    argv = ["reproduce", "--only", "toy", "--device", "cpu", "--compare", str(reference)]
    assert main([*argv, "--out", str(tmp_path / "same")]) == 0
    same = json.loads((tmp_path / "same" / "reproduce.json").read_text())["methods"][0]["compare"]
    assert (same["verdict_changes"], same["drifted_metrics"]) == ([], [])
    exact = [*argv, "--tolerance", "1e-6", "--out", str(tmp_path / "exact")]
    assert main(exact) == 0  # the same seed on the CPU reproduces every metric to 1e-6
    report = json.loads((tmp_path / "exact" / "reproduce.json").read_text())
    assert report["methods"][0]["compare"]["tolerance"] == 1e-6
    assert report["methods"][0]["compare"]["drifted_metrics"] == []

    committed["claims"][0] |= {"holds": False, "state": "fails"}
    committed["metrics"]["sgd"]["train_mse"] *= 2
    (folder / "result.json").write_text(json.dumps(committed))
    assert main([*argv, "--out", str(tmp_path / "changed")]) == 1
    report = json.loads((tmp_path / "changed" / "reproduce.json").read_text())
    comparison = report["methods"][0]["compare"]
    assert comparison["verdict_changes"] == [
        {"claim": committed["claims"][0]["text"], "committed": "fails", "fresh": "holds"}
    ]
    assert [(d["system"], d["metric"]) for d in comparison["drifted_metrics"]] == [
        ("sgd", "train_mse")
    ]
    assert "1 verdict change(s)" in (tmp_path / "changed" / "report.md").read_text()


FOUR_STATES_METHOD = """
from dataclasses import dataclass
from typing import ClassVar

from mixlab.shared import Claim, ClaimSpec, ExperimentConfig, Method, Result

ACCURACY = {"ours": 0.9, "mean": 0.8, "chance": 0.5}


def spec(key, text, control, premises=()):
    return ClaimSpec(key=key, text=text, system="ours", control=control, why_control="simpler",
                     premises=premises, not_per_seed="a toy")


@dataclass
class Config(ExperimentConfig):
    SYSTEMS: ClassVar = tuple(ACCURACY)
    CLAIMS: ClassVar = (
        spec("beats_chance", "ours beats chance", "mean"),
        spec("beats_mean", "ours beats the mean", "chance"),
        spec("premised", "ours beats chance once it learned", "mean", ("learned",)),
        spec("perfect", "ours is perfect", "chance"),
    )


def beats(reference):
    return lambda system: Claim.compare(system, ACCURACY[system], ">", ACCURACY[reference])


def run(config, out_dir, *, resume=False):
    learned = Claim.compare("the reference learned", 0.1, ">", 0.5)
    claims = [
        config.judge("beats_chance", beats("chance")),
        config.judge("beats_mean", beats("mean")),
        config.judge("premised", beats("chance"), premises={"learned": learned}),
        config.judge("perfect", lambda s: Claim.compare(s, ACCURACY[s], ">=", 1.0)),
    ]
    return Result(metrics={s: {"acc": v} for s, v in ACCURACY.items()}, claims=claims)


METHOD = Method(name="four", domain="rl", paper="p", claim="c", config=Config, run=run)
"""


def test_reproduce_shows_the_four_states(site_with_methods, tmp_path: Path) -> None:
    site_with_methods(
        {"four": "mixlab_four_states:METHOD"}, {"mixlab_four_states": FOUR_STATES_METHOD}
    )
    assert main(["reproduce", "--only", "four", "--device", "cpu", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert (
        "| four | ours beats chance | vacuous | 0.9 > 0.5 | mean passes too (0.8 > 0.5) |" in report
    )
    assert "| four | ours beats the mean | holds | 0.9 > 0.8 | chance fails (0.5 > 0.8) |" in report
    assert "| four | ours beats chance once it learned | untested |" in report
    assert "| four | ours is perfect | fails |" in report
    assert "1 hold, 1 fail, 1 untested, 1 vacuous" in report
    row = json.loads((tmp_path / "reproduce.json").read_text())["methods"][0]
    assert row["tally"] == {"holds": 1, "fails": 1, "untested": 1, "vacuous": 1}
    saved = json.loads((tmp_path / "four" / "result.json").read_text())["claims"]
    assert [c["state"] for c in saved] == ["vacuous", "holds", "untested", "fails"]
    assert saved[2]["premises"][0]["text"] == "the reference learned"


def test_reproduce_refuses_a_claim_without_a_control(site_with_methods, tmp_path: Path) -> None:
    site_with_methods(
        {"bare": "mixlab_bare_method:METHOD"},
        {
            "mixlab_bare_method": (
                "from mixlab.shared import Claim, ExperimentConfig, Method, Result\n"
                "def run(config, out_dir, *, resume=False):\n"
                "    claims = [Claim.compare('ours beats the reference', 0.34, '>', 0.33)]\n"
                "    return Result(metrics={'ours': {'acc': 0.34}}, claims=claims)\n"
                "METHOD = Method(name='bare', domain='rl', paper='p', claim='c', config=ExperimentConfig, run=run)\n"
            )
        },
    )
    assert main(["reproduce", "--only", "bare", "--device", "cpu", "--out", str(tmp_path)]) == 1
    row = json.loads((tmp_path / "reproduce.json").read_text())["methods"][0]
    assert row["status"] == "failed"
    assert "was not judged from its Config's CLAIMS" in row["error"]


def test_reproduce_on_a_missing_device_is_one_line_and_exit_2(
    toy_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reproduce", "--device", "cuda:99", "--out", str(tmp_path / "r")]) == 2
    assert "device 'cuda:99'" in _stderr_line(capsys)
    assert not (tmp_path / "r").exists()  # refused before any method ran


def test_run_on_a_missing_device_leaves_no_folder(
    toy_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["run", "toy", "--device", "cuda:99", "--out", str(out)]) == 2
    assert "device 'cuda:99'" in _stderr_line(capsys)
    assert not out.exists()


def test_ctrl_c_is_one_line_and_exit_130(
    site_with_methods, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site_with_methods(
        {"slow": "mixlab_slow_method:METHOD"},
        {
            "mixlab_slow_method": (
                "from mixlab.shared import ExperimentConfig, Method\n"
                "def run(config, out_dir, *, resume=False):\n"
                "    raise KeyboardInterrupt\n"
                "METHOD = Method(name='slow', domain='rl', paper='p', claim='c', config=ExperimentConfig, run=run)\n"
            )
        },
    )
    for verb in ("run", "reproduce"):
        argv = [verb, *(["slow"] if verb == "run" else ["--only", "slow"])]
        assert main([*argv, "--device", "cpu", "--out", str(tmp_path / verb)]) == 130
        assert _stderr_line(capsys) == "mixlab: interrupted; rerun with --resume to continue\n"


@pytest.mark.parametrize("damage", ["truncate", "edit_number"])
def test_console_script_refuses_a_damaged_checkpoint(
    toy_path: Path, tmp_path: Path, damage: str
) -> None:
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="simulated kill"):
        main(["run", "toy", "--device", "cpu", "--out", str(out), "--set", "crash_at_step=55"])
    checkpoint = out / "checkpoints" / "step_00000050"
    if damage == "truncate":
        tensors = checkpoint.with_suffix(".safetensors")
        tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
    else:
        sidecar = checkpoint.with_suffix(".json")
        text = sidecar.read_text()
        assert '"lr": 0.05' in text  # the optimizer's learning rate, stored as a JSON number
        sidecar.write_text(text.replace('"lr": 0.05', '"lr": 0.5'))
    script = Path(sys.executable).with_name("mixlab")
    completed = subprocess.run(
        [str(script), "run", "toy", "--device", "cpu", "--out", str(out), "--resume"],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=120,
    )
    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.count("\n") == 1
    assert "step_00000050" in completed.stderr


def test_wide_metric_tables_are_split_to_fit_the_terminal() -> None:
    from rich.console import Console

    from mixlab.shared import cli
    from mixlab.shared.result import Result

    systems = [f"system-{i:02d}" for i in range(20)]
    metrics = {s: {f"metric_{j:02d}": 0.012345 * (i + 1) * (j + 1) for j in range(25)}
               for i, s in enumerate(systems)}  # fmt: skip
    result = Result(metrics=metrics, claims=[], method="wide")
    console, cli.console = cli.console, Console(width=150, record=True)
    try:
        cli._print_result(result)
        text = cli.console.export_text()
    finally:
        cli.console = console
    assert "…" not in text  # no cell cut short
    assert all(system in text for system in systems)
    assert "wide: metrics (1 of " in text
    assert max(len(line) for line in text.splitlines()) <= 150


def test_an_empty_file_is_an_error_not_an_interrupt(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 80: an EOFError (torch.load of an empty optimizer.pt) became click's Abort and was
    reported as Ctrl-C, "interrupted; rerun with --resume", exit 130."""
    import typer

    from mixlab.shared.cli_base import run_app

    app = typer.Typer()

    @app.command()
    def load() -> None:
        raise EOFError("Ran out of input")

    @app.command()
    def other() -> None:  # two commands: the app is a group, as the mixlab CLIs are
        pass

    monkeypatch.delenv("MIXLAB_DEBUG", raising=False)
    assert run_app(app, ["load"], prog_name="prog") == 2
    err = capsys.readouterr().err.strip()  # click writes an empty line before its Abort
    assert err == "prog: error: a file ended early (empty or cut): Ran out of input"
    monkeypatch.setenv("MIXLAB_DEBUG", "1")
    with pytest.raises(EOFError):
        run_app(app, ["load"], prog_name="prog")
