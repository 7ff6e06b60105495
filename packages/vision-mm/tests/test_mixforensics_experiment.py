"""The MixForensics experiment end to end at a tiny size (data, leak check, cells, regime and
claims), its resume after a kill, and its config checks."""

from __future__ import annotations

import json

import pytest

from mixlab.vision_mm.mixforensics.config import Config

TINY = dict(n_seeds=2, frames=4, size=16, train_clips=24, test_real=8, test_per_kind=6, steps=4, batch_size=4,
            encoder_steps=2, timesformer_width=8, workers=1)  # fmt: skip


def test_experiment_runs_and_gates_claims_on_the_regime(cache):
    from mixlab.vision_mm.mixforensics.experiment import run

    result = run(Config(**TINY), cache / "run")
    rows = result.metrics
    assert set(Config().systems) | {"data/leak-check"} == set(rows)
    assert len({tuple(sorted(r)) for r in rows.values()}) == 1  # every row has the same keys
    assert rows["sfb-bir"]["seeds"] == 2
    assert rows["sfb-bir"]["passes"] == 2
    assert rows["voting"]["passes"] == 4
    assert rows["timesformer"]["passes"] == 1
    assert rows["frame-difference"]["passes"] == 3
    for system in ("voting", "sfb-bir"):
        assert 0 <= rows[system]["auc_seen_1f"] <= 1
        assert rows[system]["auc_seen_4f"] is not None
    assert rows["decof"]["auc_seen_1f"] is None
    assert rows["voting"]["auc_seen_majority"] is not None
    assert [c.text[:3] for c in result.regime] == ["Lea", "Lea", "Not"]
    assert [c.text[:3] for c in result.claims] == ["(1)", "(2)", "(3)", "(4)"]
    if not all(check.holds for check in result.regime):
        assert not any(c.tested for c in result.claims)
    assert (cache / "run" / "auc.png").is_file()


def test_killed_mid_training_resumes_to_the_same_numbers(cache, monkeypatch):
    from mixlab.vision_mm.mixforensics import experiment, training

    config = Config(**{**TINY, "n_seeds": 1, "systems": ("voting", "sfb", "sfb-bir")})
    whole = experiment.run(config, cache / "whole")
    real = training.batch_rows

    def dies_at_step_three(count, batch_size, seed, step):
        if step == 3:  # inside the first cell, after step 2's checkpoint
            raise KeyboardInterrupt
        return real(count, batch_size, seed, step)

    monkeypatch.setattr(training, "batch_rows", dies_at_step_three)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, cache / "killed")
    assert (cache / "killed" / "training" / "voting-0" / "step.txt").read_text() == "2"
    monkeypatch.setattr(training, "batch_rows", real)
    resumed = experiment.run(config, cache / "killed", resume=True)
    assert json.dumps(resumed.metrics, sort_keys=True) == json.dumps(whole.metrics, sort_keys=True)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="systems must be"):
        Config(systems=("voting", "sfb", "sfb-bir", "x3d"))
    with pytest.raises(ValueError, match="systems must be names including"):
        Config(systems=("voting", "sfb"))
    with pytest.raises(ValueError, match="n_max must be"):
        Config(n_max=1)
    with pytest.raises(ValueError, match="alpha must be"):
        Config(alpha=0.0)
    with pytest.raises(ValueError, match="backbone must be"):
        Config(backbone="vgg11")
    with pytest.raises(ValueError, match="frames must be"):
        Config(frames=1)
