"""FlatNSD: the light registry entry, config ranges, the regime check, CLI validation before work
and saved-model integrity (through the ``mixlab-graphs`` console script)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mixlab.graphs.flatnsd.config import Config
from mixlab.shared.files import write_sidecar

CONSOLE = Path(sys.executable).with_name("mixlab-graphs")
HEAVY = ("torch", "numpy", "scipy", "torch_geometric", "networkx", "safetensors", "matplotlib")


def _console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE), "flatnsd", *args], capture_output=True, text=True, timeout=120
    )


def _one_error_line(done: subprocess.CompletedProcess[str], *names: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("mixlab-graphs: error:"), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# --- the registry entry and the config -----------------------------------------------------


def test_registry_entry_imports_nothing_heavy():
    code = textwrap.dedent(
        f"""
        import sys
        from importlib.metadata import entry_points
        (entry,) = [e for e in entry_points(group="mixlab.methods") if e.name == "flatnsd"]
        method = entry.load()
        assert method.name == "flatnsd" and method.headline_plot == "ring_accuracy.png"
        assert method.config.__name__ == "Config" and isinstance(method.run, str)
        print(sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_experiment_module_keeps_exporting_the_config():
    from mixlab.graphs.flatnsd import experiment
    from mixlab.graphs.flatnsd.config import METHOD

    assert experiment.Config is Config
    assert experiment.METHOD is METHOD
    assert METHOD.load_run() is experiment.run


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ring_sizes", ()),
        ("ring_sizes", (4, 4)),
        ("ring_sizes", (4, 0)),
        ("ring_sizes", (4, True)),
        ("tree_depths", (9,)),
        ("tree_depths", (2, -1)),
        ("systems", ("flatnsd", "gin")),  # no GCN: no regime check
        ("systems", ("flatnsd", "gcn", "gcn")),
        ("lr", -1e-3),
        ("n_seeds", 2**33),
    ],
)
def test_config_checks_every_field(field, value):
    with pytest.raises(ValueError, match=field):
        Config(**{field: value})


def test_both_profiles_are_valid():
    for profile in Config.PROFILES:
        Config.from_profile(profile)


# --- the regime check -----------------------------------------------------------------------


def _metrics(ring: float, tree: float) -> dict[str, dict[str, float]]:
    """GCN's worst seeds at ``ring`` and ``tree``; the means are higher, and must not count."""
    return {
        "gcn": {
            "ring4_test_accuracy_min": ring,
            "tree2_train_accuracy_min": tree,
            "ring4_test_accuracy": 1.0,
            "tree2_train_accuracy": 1.0,
        }
    }


@pytest.mark.parametrize(
    ("ring", "tree", "holds"),
    [(0.95, 1.0, [True, True]), (0.9, 0.4, [True, False]), (0.2, 0.95, [False, True])],
)
def test_regime_is_gcn_at_the_smallest_sizes(ring, tree, holds):
    from mixlab.graphs.flatnsd.experiment import REGIME_ACCURACY, regime

    config = Config(ring_sizes=(6, 4), tree_depths=(3, 2))
    checks = regime(_metrics(ring, tree), config)
    assert REGIME_ACCURACY == 0.9
    assert [check.holds for check in checks] == holds
    assert f"gcn ring 4 test accuracy, worst seed {ring:.4g} >= 0.9" == checks[0].evidence
    assert f"gcn tree 2 train accuracy, worst seed {tree:.4g} >= 0.9" == checks[1].evidence


def test_a_failed_regime_check_gates_only_the_claims_of_its_task():
    from mixlab.graphs.flatnsd.experiment import regime
    from mixlab.shared.result import Claim, Result

    theory = Claim.compare(
        "Orthogonal flat bundles leave effective resistance unchanged", 0, "<=", 1
    )
    ring = Claim.compare("FlatNSD keeps accuracy at the largest ring", 1.0, ">=", 0.9)
    tree = Claim.compare("FlatNSD keeps accuracy at the largest tree depth", 1.0, ">=", 0.9)
    config = Config(ring_sizes=(4,), tree_depths=(2,))

    def states(ring_accuracy: float, tree_accuracy: float) -> list[str]:
        metrics = _metrics(ring_accuracy, tree_accuracy)
        found = [theory, ring, tree]
        result = Result(metrics=metrics, claims=found, regime=regime(metrics, config, found))
        return [claim.state for claim in result.claims]

    assert states(1.0, 1.0) == ["holds", "holds", "holds"]
    assert states(0.5, 1.0) == ["holds", "untested", "holds"]
    assert states(1.0, 0.4) == ["holds", "holds", "untested"]


# --- CLI: every input is checked before any work ------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "edges.csv").write_text("u,v\n0,1\n1,2\n")
    (root / "edges.json").write_text("{}")
    (root / "a_file").write_text("x")
    (root / "a_folder").mkdir()
    return root


def _bad_calls(root: Path) -> list[tuple[list[str], str]]:
    """(arguments, what the error must name); ``new`` must never be created."""
    new = str(root / "new")
    ring = ["train", "--task", "ring", "--size", "4"]
    return [
        (["train", "--task", "grid", "--size", "4", "--out", new], "--task"),
        (["train", "--task", "ring", "--size", "2", "--out", new], "--size"),
        (["train", "--task", "tree", "--size", "9", "--out", new], "--size"),
        ([*ring, "--out", new, "--model", "mlp"], "--model"),
        ([*ring, "--out", new, "--width", "0"], "--width"),
        ([*ring, "--out", new, "--stalk-dim", "-1"], "--stalk-dim"),
        ([*ring, "--out", new, "--epochs", "0"], "--epochs"),
        ([*ring, "--out", new, "--lr", "nan"], "--lr"),
        ([*ring, "--out", new, "--lr", "0"], "--lr"),
        ([*ring, "--out", new, "--graphs", "0"], "--graphs"),
        ([*ring, "--out", new, "--seed", "-1"], "--seed"),
        ([*ring, "--out", str(root / "a_file")], "--out"),
        ([*ring, "--out", str(root / "a_file" / "sub")], "--out"),
        (["resistance", str(root / "missing.csv")], "missing.csv"),
        (["resistance", str(root / "edges.json")], "edges.json"),
        (["resistance", str(root / "a_folder")], "a_folder"),
        (["resistance", str(root / "edges.csv"), "--out", str(root / "a_folder")], "--out"),
        (["resistance", str(root / "edges.csv"), "--out", str(root / "edges.csv")], "--out"),
        (["resistance", str(root / "edges.csv"), "--out", f"{new}.csv", "--top", "-1"], "--top"),
        (["resistance", str(root / "edges.csv"), "--node-maps", f"{new}.npy"], "--node-maps"),
        (["theory", "--stalk-dim", "0", "--out", f"{new}.json"], "--stalk-dim"),
        (["theory", "--stalk-dim", "1000"], "--stalk-dim"),
        (["theory", "--seed", "-1"], "--seed"),
        (["theory", "--out", str(root / "a_folder")], "--out"),
        (["evaluate", new], "does not exist"),
        (["evaluate", str(root / "a_file")], "not a folder"),
        (["evaluate", str(root / "a_folder"), "--graphs", "0"], "--graphs"),
    ]


def test_bad_input_is_refused_before_any_work(inputs):
    """Every case in one process: exit 2, one line each, and no torch/PyG import, nothing created."""
    calls = _bad_calls(inputs)
    code = textwrap.dedent(
        f"""
        import json, sys
        from mixlab.graphs.cli import main
        codes = [main(["flatnsd", *args]) for args, _ in {calls!r}]
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print(json.dumps({{"codes": codes, "heavy": heavy}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert report["codes"] == [2] * len(calls)
    assert report["heavy"] == []
    lines = done.stderr.strip().splitlines()
    assert len(lines) == len(calls), done.stderr
    for line, (args, name) in zip(lines, calls, strict=True):
        assert line.startswith("mixlab-graphs: error:"), (args, line)
        assert name in line, (args, line)
    assert not [p for p in inputs.iterdir() if p.name.startswith("new")]


@pytest.mark.parametrize("case", [0, 7, 11, 16, 21, 24])
def test_bad_input_through_the_console_script(inputs, case):
    args, name = _bad_calls(inputs)[case]
    _one_error_line(_console(*args), name)
    assert not [p for p in inputs.iterdir() if p.name.startswith("new")]


# --- saved models: the sidecar's SHA-256, and one line for anything damaged ---------------


@pytest.fixture
def saved(tmp_path) -> Path:
    """A small saved GCN (no training: the weights of a fresh model)."""
    import torch

    from mixlab.graphs.flatnsd.training import build_model, save_trained

    torch.manual_seed(0)
    folder = tmp_path / "model"
    info = {"task": "ring", "size": 4, "model": "gcn", "in_channels": 7, "classes": 5}
    info |= {"layers": 2, "width": 4, "stalk_dim": 2, "train_accuracy": 0.5, "seed": 0}
    save_trained(build_model("gcn", 7, 5, 2, 4, 2), folder, info)
    return folder


def _sidecar(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def _resign(folder: Path, data: dict) -> None:
    """Write ``data`` as a sidecar with a valid SHA-256 (what a careless tool would do)."""
    data = {k: v for k, v in data.items() if k != "integrity"}
    write_sidecar(folder / "metrics.json", data, covers=[folder / "model.safetensors"])


def test_saved_model_round_trips(saved):
    from mixlab.graphs.flatnsd.training import load_trained

    _network, info = load_trained(saved)
    assert info["model"] == "gcn"
    assert info["format"] == "mixlab.graphs.flatnsd.model/2"
    assert "integrity" in _sidecar(saved)
    assert not list(saved.glob(".*partial"))


def _truncate(folder: Path) -> str:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return "model.safetensors"


def _remove_key(folder: Path) -> str:
    data = _sidecar(folder)
    del data["width"]
    (folder / "metrics.json").write_text(json.dumps(data))
    return "metrics.json"


def _wrong_type(folder: Path) -> str:
    data = _sidecar(folder)
    data["layers"] = "two"
    (folder / "metrics.json").write_text(json.dumps(data))
    return "metrics.json"


def _edit_number(folder: Path) -> str:
    text = (folder / "metrics.json").read_text()
    (folder / "metrics.json").write_text(text.replace('"width": 4', '"width": 5'))
    return "metrics.json"


def _resigned_without_key(folder: Path) -> str:
    data = _sidecar(folder)
    del data["stalk_dim"]
    _resign(folder, data)
    return "metrics.json"


def _resigned_wrong_type(folder: Path) -> str:
    _resign(folder, {**_sidecar(folder), "in_channels": 5.5})
    return "metrics.json"


def _foreign(folder: Path) -> str:
    (folder / "metrics.json").write_text(json.dumps({"task": "ring", "size": 4}))
    return "metrics.json"


def _not_json(folder: Path) -> str:
    (folder / "metrics.json").write_bytes(b"\xff\xfe not json")
    return "metrics.json"


def _no_sidecar(folder: Path) -> str:
    (folder / "metrics.json").unlink()
    return "metrics.json"


def _no_weights(folder: Path) -> str:
    (folder / "model.safetensors").unlink()
    return "model.safetensors"


@pytest.mark.parametrize(
    "damage",
    [
        _truncate,
        _remove_key,
        _wrong_type,
        _edit_number,
        _resigned_without_key,
        _resigned_wrong_type,
        _foreign,
        _not_json,
        _no_sidecar,
        _no_weights,
    ],
)
def test_damaged_saved_model_is_one_line(saved, damage):
    names = damage(saved)
    _one_error_line(_console("evaluate", str(saved)), names)


def test_weights_that_do_not_fit_the_sidecar_are_one_line(saved, capsys):
    """A sidecar re-signed with another width: loading builds a model the weights do not fit."""
    from mixlab.graphs.cli import main

    _resign(saved, {**_sidecar(saved), "width": 6})
    assert main(["flatnsd", "evaluate", str(saved)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "model.safetensors" in line
    assert "does not fit" in line
