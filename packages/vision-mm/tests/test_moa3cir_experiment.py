"""The MoA3CIR experiment end to end at a tiny size (towers, cells, regime and claims), its
resume after a kill, and its config checks."""

from __future__ import annotations

import json

import pytest

from mixlab.vision_mm.moa3cir.config import Config

TINY = dict(n_seeds=2, one_phase_seeds=1, size=16, clip_width=16, clip_layers=1, clip_heads=2, embed_dim=16,
            context_length=16, tower_items=64, tower_triplets=64, tower_steps=4, classifier_steps=4,
            train_triplets=64, augment=32, test_queries=40, alignment_items=20, steps=4, batch_size=8,
            dim=16, heads=4, groups=2, shared_heads=2, projection_dim=32, hidden_dim=32, workers=1)  # fmt: skip


def test_experiment_runs_and_gates_claims_on_the_regime(cache):
    from mixlab.vision_mm.moa3cir.experiment import run

    result = run(Config(**TINY), cache / "run")
    rows = result.metrics
    assert set(Config().systems) | {"towers/phase-1"} == set(rows)
    assert len({tuple(sorted(r)) for r in rows.values()}) == 1  # every row has the same keys
    assert rows["moa3cir"]["seeds"] == 2
    assert rows["one-phase"]["seeds"] == 1
    assert 0 <= rows["moa3cir"]["R@1"] <= rows["moa3cir"]["R@10"] <= rows["moa3cir"]["R@50"] <= 1
    assert 0 <= rows["moa3cir"]["nmi"] <= 1
    assert rows["moa3-dense"]["nmi"] is None
    # at this size nothing is learned: the regime fails and every claim is untested
    assert not all(check.holds for check in result.regime)
    assert [c.text[:3] for c in result.claims] == ["(1)", "(2)", "(3)", "(4)"]
    assert not any(c.tested for c in result.claims)
    assert (cache / "run" / "recall.png").is_file()
    assert (cache / "run" / "routing.png").is_file()


def test_killed_mid_training_resumes_to_the_same_numbers(cache, monkeypatch):
    from mixlab.vision_mm.moa3cir import experiment, training

    config = Config(
        **{
            **TINY,
            "n_seeds": 1,
            "one_phase_seeds": 0,
            "systems": ("image-only", "combiner", "moa3cir"),
        }
    )
    whole = experiment.run(config, cache / "whole")
    real = training._rows

    def dies_at_step_three(count, batch_size, seed, step):
        if step == 3:  # the towers are cached: the combiner's phase 2, after step 2's checkpoint
            raise KeyboardInterrupt
        return real(count, batch_size, seed, step)

    monkeypatch.setattr(training, "_rows", dies_at_step_three)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, cache / "killed")
    assert (
        cache / "killed" / "training" / "combiner-0" / "checkpoints" / "step_00000002.json"
    ).is_file()
    monkeypatch.setattr(training, "_rows", real)
    resumed = experiment.run(config, cache / "killed", resume=True)
    assert json.dumps(resumed.metrics, sort_keys=True) == json.dumps(whole.metrics, sort_keys=True)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="groups must be"):
        Config(heads=16, shared_heads=4, groups=5)
    with pytest.raises(ValueError, match="systems must be"):
        Config(systems=("image-only", "combiner", "moa3cir", "blip"))
    with pytest.raises(ValueError, match="systems must be names including"):
        Config(systems=("image-only", "moa3cir"))
    with pytest.raises(ValueError, match="patch must be"):
        Config(patch=5)
    with pytest.raises(ValueError, match="one_phase_seeds must be"):
        Config(n_seeds=2, one_phase_seeds=3)
