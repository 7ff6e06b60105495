"""MoL's experiment on a tiny config (every system, regime gating, resume after a kill gives the
same numbers), its config refusals, and the CLI (``mixlab-attn mol``) end to end with one-line
exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from mixlab.attention_arch.cli import main
from mixlab.attention_arch.mol.config import MOL_HYBRID, PENULTIMATE, Config

torch.set_num_threads(1)

TINY = {
    "size": 32, "vision_width": 16, "vision_depth": 3, "lm_width": 16, "lm_depth": 1,
    "encoder_images": 32, "encoder_steps": 2, "base_examples": 24, "base_steps": 2,
    "layers": (1, 2), "n_train": 24, "n_test": 12, "steps": 2, "batch_size": 4, "n_seeds": 1,
    "workers": 1,
}  # fmt: skip


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.attention_arch.mol import experiment

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(experiment, "PROBE_STEPS", 2)
    config = Config(**TINY)
    assert config.systems == ("last layer", "layer 1", PENULTIMATE, "uniform average",
                              "DenseConnector concat", "static mixture", "MoL-image",
                              "MoL-patch", MOL_HYBRID)  # fmt: skip
    result = experiment.run(config, tmp_path / "whole")
    assert set(config.systems) < set(result.metrics)
    hybrid = result.metrics[MOL_HYBRID]
    assert 0 <= hybrid["fine"] <= 1
    assert hybrid["pi_colour_layer1"] + hybrid["pi_colour_layer2"] == pytest.approx(1, abs=1e-5)
    assert result.metrics["toy base"]["probe_colour_layer3"] is not None  # embeddings + 3 blocks
    assert len(result.regime) == 3
    assert len(result.claims) == 3
    if not all(c.holds for c in result.regime):
        assert not any(c.tested for c in result.claims)
    for plot in ("task_accuracy.png", "routes.png", "probe.png"):
        assert (tmp_path / "whole" / plot).exists()

    real, calls = experiment._train_cell, []

    def dies_on_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "_train_cell", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "_train_cell", real)
    resumed = experiment.run(config, tmp_path / "killed", resume=True)
    for system, row in result.metrics.items():
        for key, value in row.items():
            if not key.startswith(("train_s", "toy_train_s", "prepare_s")):  # wall times differ
                assert resumed.metrics[system][key] == value, (system, key)


@pytest.mark.parametrize(
    ("field", "value"),
    [("layers", ()), ("layers", (1, 9)), ("layers", (1, 2)), ("size", 36), ("fine_gain", 2.0),
     ("n_test", 5)],
)  # fmt: skip
def test_config_refusals_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Config(**{field: value})


def test_cli_end_to_end(tmp_path, capsys):
    from mixlab.attention_arch.mol.toy import ToySpec, toy_llava

    spec = ToySpec(size=32, vision_width=16, vision_depth=3, lm_width=16, lm_depth=1,
                   encoder_images=16, encoder_steps=1, base_examples=12, base_steps=1)  # fmt: skip
    toy_llava(spec, tmp_path / "cache", log=lambda _: None)
    model = str(next((tmp_path / "cache").glob("toy-*")))
    data = tmp_path / "vqa"
    assert main(["mol", "data", "--out", str(data), "--n", "12", "--size", "32"]) == 0
    assert len((data / "data.jsonl").read_text().splitlines()) == 12
    args = ["mol", "train", "--model", model, "--data", str(data), "--out", str(tmp_path / "run"),
            "--layers", "1,2", "--steps", "4", "--batch-size", "4"]  # fmt: skip
    assert main(args) == 0
    assert (tmp_path / "run" / "mol" / "mol.safetensors").is_file()
    capsys.readouterr()
    assert main(["mol", "eval", "--model", str(tmp_path / "run"), "--data", str(data)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["n"] == 12
    assert set(scores) >= {"all", "vstar", "semantic"}
    image = str(data / "00000.png")
    assert main(["mol", "routes", "--model", str(tmp_path / "run"), "--image", image,
                 "--question", "what is the large shape ?"]) == 0  # fmt: skip
    pi = json.loads(capsys.readouterr().out)["pi"]
    assert set(pi) == {"1", "2"}
    assert sum(pi.values()) == pytest.approx(1, abs=1e-3)

    refusals = [
        (["mol", "train", "--model", model, "--data", str(data), "--granularity", "token"], "--granularity"),
        (["mol", "train", "--model", model, "--data", str(data), "--layers", "1,9"], "layers"),
        (["mol", "train", "--model", model, "--data", str(data), "--layers", "1,2", "--top-k", "3"], "top_k"),
        (["mol", "train", "--model", str(data), "--data", str(data)], "--model"),
        (["mol", "eval", "--model", model, "--data", str(tmp_path)], "data"),
        (["mol", "routes", "--model", model, "--image", image, "--question", " "], "--question"),
    ]  # fmt: skip
    for argv, name in refusals:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, (argv, err)
        assert name in err, (argv, err)
