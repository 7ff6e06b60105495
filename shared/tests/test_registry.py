import json
import warnings
from pathlib import Path

import pytest
import torch

from mixlab.shared import ExperimentConfig, Method, Result, discover_methods, get_method
from mixlab.shared.result import RESULT_KEYS


def test_discovers_a_method_through_its_entry_point(toy_method: Method) -> None:
    assert toy_method.name == "toy"
    assert "toy" in discover_methods()


def test_unknown_method_names_the_installed_ones(toy_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown method 'nope'; installed methods: .*toy"):
        get_method("nope")


def test_broken_entry_point_warns_and_is_left_out(site_with_methods) -> None:
    site_with_methods(
        {"broken": "mixlab_broken_method:METHOD", "notamethod": "mixlab_broken_method:OTHER"},
        {"mixlab_broken_method": "OTHER = 3\n"},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        methods = discover_methods()
    assert "broken" not in methods
    assert "notamethod" not in methods
    messages = " ".join(str(w.message) for w in caught)
    assert "'broken'" in messages
    assert "'notamethod'" in messages


def test_execute_writes_the_result_schema(toy_method: Method, tmp_path: Path) -> None:
    config = toy_method.config.from_profile("quick", seed=3, device="cpu")
    result = toy_method.execute(config, tmp_path)
    data = json.loads((tmp_path / "result.json").read_text())
    assert tuple(data) == RESULT_KEYS
    assert data["method"] == "toy"
    assert data["profile"] == "quick"
    assert data["seed"] == 3
    assert data["config"]["steps"] == 100
    assert set(data["metrics"]) == {"sgd", "least_squares", "zero"}
    assert data["env"]["device"] == "cpu"
    assert data["env"]["torch"] == torch.__version__
    assert data["wall_s"] > 0
    assert data["claims"][0]["holds"] is True
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert Result.load(tmp_path).metrics == result.metrics


def test_same_seed_same_metrics(toy_method: Method, tmp_path: Path) -> None:
    runs = [
        toy_method.execute(
            toy_method.config.from_profile(seed=seed, device="cpu"), tmp_path / f"{i}"
        ).metrics
        for i, seed in enumerate([1, 1, 2])
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_killed_run_resumes_to_the_same_result(toy_method: Method, tmp_path: Path) -> None:
    straight = toy_method.execute(
        toy_method.config.from_profile(device="cpu"), tmp_path / "straight"
    )

    interrupted = tmp_path / "interrupted"
    with pytest.raises(RuntimeError, match="simulated kill"):
        toy_method.execute(
            toy_method.config.from_profile(device="cpu", crash_at_step=25), interrupted
        )
    assert (interrupted / "checkpoints" / "step_00000020.json").exists()
    resumed = toy_method.execute(
        toy_method.config.from_profile(device="cpu"), interrupted, resume=True
    )
    assert (interrupted / "resumed_from.txt").read_text() == "20"
    assert resumed.metrics == straight.metrics


def test_resume_refuses_another_methods_folder_before_touching_it(
    toy_method: Method, tmp_path: Path
) -> None:
    """Issue 80: ``--resume`` on the wrong ``--out`` removed that run's result.json, then failed."""
    import json

    folder = tmp_path / "other"
    folder.mkdir()
    other = {"method": "someone_else", "metrics": {}}
    (folder / "result.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="holds a run of someone_else, not of") as caught:
        toy_method.execute(toy_method.config.from_profile(device="cpu"), folder, resume=True)
    assert "\n" not in str(caught.value)
    assert json.loads((folder / "result.json").read_text()) == other  # untouched
    # a run of another method killed before its result: its marker names it
    killed = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="simulated kill"):
        toy_method.execute(toy_method.config.from_profile(device="cpu", crash_at_step=25), killed)
    assert json.loads((killed / "run.json").read_text())["method"] == toy_method.name
    marker = json.loads((killed / "run.json").read_text())
    (killed / "run.json").write_text(json.dumps({**marker, "method": "someone_else"}))
    with pytest.raises(ValueError, match="holds a run of someone_else"):
        toy_method.execute(toy_method.config.from_profile(device="cpu"), killed, resume=True)
    # its own finished folder resumes as before, and keeps no marker once result.json is there
    mine = tmp_path / "mine"
    first = toy_method.execute(toy_method.config.from_profile(device="cpu"), mine)
    again = toy_method.execute(toy_method.config.from_profile(device="cpu"), mine, resume=True)
    assert again.metrics == first.metrics
    assert not (mine / "run.json").exists()


def test_method_validates_its_fields() -> None:
    def run(config, out_dir, *, resume=False):  # pragma: no cover - never called
        raise AssertionError

    with pytest.raises(ValueError, match="Method.domain must be one of"):
        Method(name="x", domain="physics", paper="p", claim="c", config=ExperimentConfig, run=run)
    with pytest.raises(ValueError, match="Method.name"):
        Method(name="Bad Name", domain="rl", paper="p", claim="c", config=ExperimentConfig, run=run)
    with pytest.raises(ValueError, match="Method.config"):
        Method(name="x", domain="rl", paper="p", claim="c", config=dict, run=run)


def test_execute_keeps_what_a_run_adds_to_env(tmp_path: Path) -> None:
    def run(config, out_dir, *, resume=False):
        return Result(metrics={"a": {"x": 1.0}}, claims=[], env={"data_files": {"f.csv": "ab12"}})

    method = Method(name="x", domain="rl", paper="p", claim="c", config=ExperimentConfig, run=run)
    method.execute(ExperimentConfig(device="cpu"), tmp_path)
    env = json.loads((tmp_path / "result.json").read_text())["env"]
    assert env["data_files"] == {"f.csv": "ab12"}
    assert env["device"] == "cpu"


def test_execute_rejects_a_config_of_another_method(toy_method: Method, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config must be a Config"):
        toy_method.execute(ExperimentConfig(), tmp_path)


def test_every_public_name_resolves() -> None:
    import mixlab.shared

    assert sorted(mixlab.shared.__all__) == sorted(mixlab.shared._MODULE_OF)
    for name in mixlab.shared.__all__:
        assert getattr(mixlab.shared, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = mixlab.shared.nope


def test_a_run_named_by_import_path_loads_only_when_run(site_with_methods, tmp_path: Path) -> None:
    import sys

    site_with_methods(
        {"lazy": "mixlab_lazy_meta:METHOD"},
        {
            "mixlab_lazy_meta": (
                "from mixlab.shared.config import ExperimentConfig\n"
                "from mixlab.shared.registry import Method\n"
                "METHOD = Method(name='lazy', domain='rl', paper='p', claim='c',"
                " config=ExperimentConfig, run='mixlab_lazy_run:run')\n"
            ),
            "mixlab_lazy_run": (
                "from mixlab.shared import Result\n"
                "def run(config, out_dir, *, resume=False):\n"
                "    return Result(metrics={'a': {'x': 1.0}}, claims=[])\n"
            ),
        },
    )
    method = get_method("lazy")
    assert "mixlab_lazy_run" not in sys.modules
    assert method.execute(ExperimentConfig(device="cpu"), tmp_path).metrics == {"a": {"x": 1.0}}
    assert "mixlab_lazy_run" in sys.modules
    with pytest.raises(
        ValueError, match="Method.run must be a function or 'package.module:function'"
    ):
        Method(name="x", domain="rl", paper="p", claim="c", config=ExperimentConfig, run="nocolon")


def test_a_failed_run_leaves_no_earlier_result_behind(toy_method: Method, tmp_path: Path) -> None:
    toy_method.execute(toy_method.config.from_profile(device="cpu"), tmp_path)
    (tmp_path / "error.txt").write_text("an older failure")
    with pytest.raises(RuntimeError, match="simulated kill"):
        toy_method.execute(toy_method.config.from_profile(device="cpu", crash_at_step=5), tmp_path)
    assert not (tmp_path / "result.json").exists()
    assert not (tmp_path / "error.txt").exists()
