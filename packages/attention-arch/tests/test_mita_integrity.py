"""MiTA: the light registry entry, config ranges, CLI checks before work, damaged checkpoints,
and the regime check."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from mixlab.shared import Claim, Result, save_state

CLI = Path(sys.executable).with_name("mixlab-attn")


def _cli(*args: str, timeout: float = 120) -> tuple[int, list[str], float]:
    start = time.perf_counter()
    done = subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    return done.returncode, done.stderr.strip().splitlines(), time.perf_counter() - start


def _one_line(stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# --- registry and config -----------------------------------------------------------------------


def test_registry_entry_and_cli_checks_import_nothing_heavy():
    """The registry entry loads without torch; the CLI refuses bad options before importing it."""
    script = """
import sys
from importlib.metadata import entry_points
method = next(e for e in entry_points(group="mixlab.methods") if e.name == "mita").load()
heavy = ("torch", "numpy", "timm", "safetensors", "sklearn", "matplotlib")
loaded = lambda: sorted({m.split(".")[0] for m in sys.modules} & set(heavy))
assert method.run == "mixlab.attention_arch.mita.experiment:run", method.run
assert method.headline_plot == "accuracy.png"
assert not loaded(), loaded()
from mixlab.attention_arch.cli import main
cases = [
    ["mita", "bench", "--heads", "0"],
    ["mita", "bench", "--head-dim", "0"],
    ["mita", "bench", "--tokens", "0"],
    ["mita", "bench", "--tokens", "300"],
    ["mita", "bench", "--tokens", "16", "--top-k", "48"],
    ["mita", "bench", "--repeats", "-1"],
    ["mita", "train", "--steps", "0"],
    ["mita", "train", "--canvas", "16", "--pool-size", "5"],
    ["mita", "train", "--seed", "-1"],
    ["mita", "swap", "--model", "vit_tiny_patch16_224", "--pool-size", "0"],
    ["mita", "swap", "--model", "vit_tiny_patch16_224", "--attention", "linear"],
]
print(json.dumps([main(case) for case in cases]))
assert not loaded(), loaded()
"""
    done = subprocess.run(
        [sys.executable, "-c", "import json\n" + script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2] * 11
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 11
    assert all(line.startswith("mixlab-attn: error: --") for line in lines)
    assert "--heads must be an integer >= 1, got 0" in lines[0]


def test_config_ranges_and_names():
    from mixlab.attention_arch.mita.config import ATTENTION_KIND_NAMES, Config
    from mixlab.attention_arch.mita.swap import ATTENTION_KINDS

    assert tuple(ATTENTION_KINDS) == ATTENTION_KIND_NAMES
    Config(clutter=0)  # documented in ALLOWED_EDGE_VALUES
    for bad in (
        {"clutter": -1},
        {"steps": 0},
        {"n_seeds": -1},
        {"lr": float("nan")},
        {"finetune_lr": 0.0},
        {"lr": -1e-3},
        {"systems": ("full", "mita", "moba", "topk", "topk")},
        {"systems": ("full", "mita", "moba", "topk", 3)},
        {"key_budget": 22},  # Agent's 2×11 agents do not fit the 8×8 grid
    ):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
            Config(**bad)


# --- CLI validation before work ------------------------------------------------------------------


def test_cli_paths_are_checked_before_any_model_is_built(tmp_path, capsys):
    from mixlab.attention_arch.cli import main

    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    cases = {
        "--checkpoint": ["swap", "--model", "vit_tiny_patch16_224", "--checkpoint",
                         str(tmp_path / "missing.safetensors")],
        "is not a file": ["swap", "--model", "vit_tiny_patch16_224", "--checkpoint", str(tmp_path)],
        "is a folder": ["swap", "--model", "vit_tiny_patch16_224", "--out",
                        str(tmp_path / "dir.safetensors")],
        "must end in .safetensors": ["swap", "--model", "vit_tiny_patch16_224", "--out",
                                     str(tmp_path / "x.pt")],
        "cannot create": ["swap", "--model", "vit_tiny_patch16_224", "--out",
                          str(a_file / "x.safetensors")],
        "must be a folder": ["train", "--out", str(a_file)],
        "timm model name": ["swap", "--model", "no_such_vit"],
    }  # fmt: skip
    (tmp_path / "dir.safetensors").mkdir()
    for expected, args in cases.items():
        assert main(["mita", *args]) == 2, args
        _one_line(capsys.readouterr().err, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.safetensors", "file.txt"]


# --- damaged checkpoints -------------------------------------------------------------------------


def _partial_checkpoint(folder: Path) -> Path:
    """What ``mixlab-attn mita train --out folder --steps 5`` leaves when killed mid-run."""
    from mixlab.attention_arch.mita.training import TrainSpec

    base = folder / "partial-mita"
    state = {
        "model": {"head.weight": torch.zeros(10, 64)},
        "optimizer": {"state": {}, "param_groups": []},
        "schedule": {"last_epoch": 2},
        "losses": [2.3, 2.2],
        "spec": asdict(TrainSpec(steps=5, seed=0)),
    }
    save_state(state, base)
    return base


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _drop_key(path: Path) -> None:
    _edit_json(path, lambda d: d.pop("format"))


def _wrong_type(path: Path) -> None:
    _edit_json(path, lambda d: d.update(format=7))


def _edited_number(path: Path) -> None:
    _edit_json(path, lambda d: d["state"]["losses"].__setitem__(0, 0.01))


@pytest.mark.parametrize(
    ("damage", "suffix"),
    [(_truncate, ".safetensors"), (_drop_key, ".json"), (_wrong_type, ".json"),
     (_edited_number, ".json")],
)  # fmt: skip
def test_train_refuses_a_damaged_checkpoint_in_one_line(tmp_path, damage, suffix):
    base = _partial_checkpoint(tmp_path / "run")
    damage(base.with_suffix(suffix))
    code, err, _ = _cli("mita", "train", "--steps", "5", "--out", str(tmp_path / "run"))
    assert code == 2
    assert len(err) == 1, err
    assert str(base.with_suffix(suffix)) in err[0]
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_train_refuses_a_foreign_checkpoint(tmp_path, capsys):
    """An intact checkpoint of another model: one line naming it, nothing trained."""
    from mixlab.attention_arch.cli import main

    _partial_checkpoint(tmp_path / "run")
    assert main(["mita", "train", "--steps", "5", "--out", str(tmp_path / "run")]) == 2
    _one_line(capsys.readouterr().err, "partial-mita.json: not a mita training checkpoint")
    save_state({"x": torch.zeros(2)}, tmp_path / "other" / "partial-mita")
    assert main(["mita", "train", "--steps", "5", "--out", str(tmp_path / "other")]) == 2
    _one_line(capsys.readouterr().err, "not a mita training checkpoint")


def test_swap_refuses_a_damaged_timm_checkpoint(tmp_path, capsys):
    from safetensors.torch import save_file

    from mixlab.attention_arch.cli import main

    model = ["mita", "swap", "--model", "vit_tiny_patch16_224", "--img-size", "32",
             "--pool-size", "1", "--top-k", "2"]  # fmt: skip
    truncated = tmp_path / "deit.safetensors"
    save_file({"cls_token": torch.zeros(1, 1, 192), "pos_embed": torch.zeros(1, 5, 192)}, truncated)
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(truncated.read_bytes())
    _truncate(truncated)
    text = tmp_path / "notes.pth"
    text.write_text("not a checkpoint")
    for path in (truncated, foreign, text):
        assert (
            main([*model, "--checkpoint", str(path), "--out", str(tmp_path / "o.safetensors")]) == 2
        )
        _one_line(capsys.readouterr().err, str(path), "timm checkpoint")
    assert not (tmp_path / "o.safetensors").exists()


# --- regime check --------------------------------------------------------------------------------


def _metrics(full: float, mita: float) -> dict[str, dict[str, float]]:
    row = {"accuracy": 0.0, "flops_vs_full": 1.0, "swap_finetuned": 0.5, "pruned_fraction": 0.2,
           "pruned_accuracy": 0.5, "random_pruned_accuracy": 0.4}  # fmt: skip
    kinds = ("full", "mita", "moba", "topk", "mita_shared_only", "window")
    metrics = {kind: dict(row) for kind in kinds}
    metrics["full"]["accuracy"], metrics["mita"]["accuracy"] = full, mita
    metrics["mita"]["flops_vs_full"] = 0.3
    return metrics


def _cells(metrics: dict[str, dict[str, float]]) -> list[dict]:
    """One seed's from-scratch cells carrying ``metrics``' numbers (the swaps in full's)."""
    pruning = ("pruned_fraction", "pruned_accuracy", "random_pruned_accuracy")
    swaps = {k: {"finetuned": r["swap_finetuned"]} for k, r in metrics.items()}
    return [
        {"part": "scratch", "system": kind, "seed": 0, "accuracy": row["accuracy"]}
        | ({name: row[name] for name in pruning} if kind == "mita" else {})
        | ({"swaps": swaps} if kind == "full" else {})
        for kind, row in metrics.items()
        if kind != "topk"  # swapped in only
    ]


def test_regime_check_gates_the_claims():
    from mixlab.attention_arch.mita.experiment import Config, claims, regime

    config = Config()
    low = _metrics(full=0.331, mita=0.329)  # today's quick testbed: every kind near 0.33
    check = regime(low)
    assert len(check) == 1
    assert not check[0].holds
    assert check[0].evidence == "full-attention accuracy 0.331 >= required 0.6"
    result = Result(metrics=low, claims=claims(config, _cells(low), low), regime=check)
    assert result.tally() == {"holds": 0, "fails": 0, "untested": 3, "vacuous": 0}

    high = _metrics(full=0.85, mita=0.845)
    result = Result(metrics=high, claims=claims(config, _cells(high), high), regime=regime(high))
    assert all(c.holds for c in result.regime)
    assert isinstance(result.claims[0], Claim)
    assert result.claims[0].state == "holds"


def test_swap_checks_the_sidecar_of_a_checkpoint_it_wrote(tmp_path, capsys):
    from mixlab.attention_arch.cli import main

    model = ["mita", "swap", "--model", "vit_tiny_patch16_224", "--img-size", "32",
             "--pool-size", "1", "--top-k", "2"]  # fmt: skip
    swapped = tmp_path / "swapped.safetensors"
    assert main([*model, "--out", str(swapped)]) == 0
    assert main([*model, "--checkpoint", str(swapped)]) == 0  # loads back: the keys are timm's
    capsys.readouterr()
    _edit_json(swapped.with_suffix(".json"), lambda d: d.update(attention="topk"))
    assert main([*model, "--checkpoint", str(swapped)]) == 2
    _one_line(capsys.readouterr().err, str(swapped.with_suffix(".json")), "changed")
