"""The MoP experiment end to end at a tiny size (bases, cells, regime and claims), and its resume."""

from __future__ import annotations

import json

import pytest

from mixlab.vision_mm.mop.config import Config

TINY = dict(n_seeds=2, systems=("unimodal", "dropout", "resampler", "mop-nodis", "mop-x"),
            train_scenes=24, test_scenes=16, information_scale=1, information_steps=2,
            encoder_dim=16, encoder_layers=2, encoder_heads=2, encoder_scenes=16, encoder_steps=2,
            lm_width=16, lm_layers=1, lm_steps=2, num_probes=2, queries=2, probe_layers=(0, 2),
            aligned_probes=(1,), steps=4, batch_size=8, diagnostics_every=2, workers=1)  # fmt: skip


def test_experiment_runs_and_gates_claims_on_the_regime(cache):
    from mixlab.vision_mm.mop.config import METHOD

    result = METHOD.execute(Config(**TINY), cache / "run")
    assert result.cache["state"] == "cold"  # an empty cache: the bases were trained
    assert {e["entry"].split("/")[1].rsplit("-", 1)[0] for e in result.cache["entries"]} == {
        "encoder-32px", "llama", "features-train", "features-test", "information"
    }  # fmt: skip
    rows = result.metrics
    assert {"rgb/unimodal", "depth/unimodal", "rgb/mop-x", "text/blind", "rgb/information"} <= set(
        rows
    )
    assert len({tuple(sorted(r)) for r in rows.values()}) == 1  # every row has the same keys
    assert rows["rgb/mop-x"]["seeds"] == 2
    assert 0 <= rows["rgb/mop-x"]["all"] <= 1
    # at this size nothing is learned: the regime fails and every claim is untested
    assert not all(check.holds for check in result.regime)
    assert [c.text[:3] for c in result.claims] == ["(1)", "(2)", "(3)", "(4)"]
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.system for c in result.claims)
    assert (cache / "run" / "accuracy.png").is_file()
    assert (cache / "run" / "probes.png").is_file()


def test_killed_mid_training_resumes_to_the_same_numbers(cache, monkeypatch):
    from mixlab.vision_mm.mop import experiment, training

    config = Config(**{**TINY, "n_seeds": 1, "systems": ("unimodal", "mop-x")})
    whole = experiment.run(config, cache / "whole")
    real = training.paired_batches

    def dies_at_step_three(*args, **kwargs):
        batches = real(*args, **kwargs)

        def batch(step):
            if step == 3:  # after the checkpoint of step 2
                raise KeyboardInterrupt
            return batches(step)

        return batch

    monkeypatch.setattr(training, "paired_batches", dies_at_step_three)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, cache / "killed")
    assert (cache / "killed" / "training" / "unimodal-rgb-0" / "step.txt").read_text() == "2"
    monkeypatch.setattr(training, "paired_batches", real)
    resumed = experiment.METHOD.execute(config, cache / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # the bases and features of the first run
    assert json.dumps(resumed.metrics, sort_keys=True) == json.dumps(whole.metrics, sort_keys=True)


def test_the_cached_features_are_made_by_code_their_entry_is_keyed_by(cache, monkeypatch):
    """A change to how the scenes are encoded makes the features again: the recipe lives in a
    module of the entry's ``code``, not in the experiment."""
    from mixlab.vision_mm.mop import bases, experiment

    assert bases.encode_scenes.__module__ in experiment.ENCODER_CODE
    made = []
    monkeypatch.setattr(experiment, "_encoder_folder", lambda config: cache / "no-encoder")
    monkeypatch.setattr(experiment, "_load_encoder", lambda config, folder: "the encoder")
    monkeypatch.setattr(bases, "encode_scenes", lambda folder, *args, **kw: made.append(args))
    experiment._features_folder(Config(**TINY), "test")
    assert made == [("the encoder", "test", 16, experiment.TEST_SEED)]  # the build only calls it


def _cells(depth_order: dict[str, float], seeds=(0, 1, 2)) -> list[dict]:
    """System cells as the experiment records them: every system answers 0.7 of each question
    type, but for RGB-alone depth order (``depth_order``) and MoP-X, which leads by 10 points."""
    done = []
    for seed in seeds:
        for system in ("unimodal", "dropout", "resampler", "mop-nodis", "mop-x"):
            deploys = ("rgb", "depth") if system == "unimodal" else (None,)
            for deploy in deploys:
                tested = (deploy,) if deploy else ("rgb", "depth")
                base = 0.8 if system == "mop-x" else 0.7
                accuracy = {m: {"all": base + 0.01 * seed, "depth": base} for m in tested}
                if "rgb" in accuracy:
                    accuracy["rgb"]["depth"] = depth_order.get(system, 0.7) + 0.01 * seed
                cosine = 0.5 if system == "mop-nodis" else 0.0
                diagnostics = [{"step": 4, **{f"{m}/probe_cosine": cosine + 0.01 * seed for m in tested},
                                **{f"{m}/effective_rank": 3.0 - 4 * cosine for m in tested}}]  # fmt: skip
                done.append({"task": "system", "system": system, "deploy": deploy, "seed": seed,
                             "accuracy": accuracy, "diagnostics": diagnostics})  # fmt: skip
    return done


def test_a_claim_the_control_also_passes_is_vacuous():
    from mixlab.vision_mm.mop.experiment import claims

    config = Config(systems=("unimodal", "dropout", "resampler", "mop-nodis", "mop-x"))
    found = {c.key: c for c in claims(_cells({"mop-x": 0.9}), config)}
    assert found["privileged_gain"].state == "holds"  # modality dropout gains no depth order
    assert found["privileged_gain"].control.system == "dropout"
    assert found["beats_final_layer"].state == "holds"  # the resampler never beats itself
    # modality dropout's probes sit as far apart as MoP-X's: L_dis is not what keeps them apart
    assert found["dis_keeps_probes_apart"].state == "vacuous"
    both = {c.key: c for c in claims(_cells({"mop-x": 0.9, "dropout": 0.9}), config)}
    assert both["privileged_gain"].state == "vacuous"  # dropout gains as much: not MoP-X's idea
    assert "dropout − unimodal RGB depth-order" in both["privileged_gain"].control.evidence
    one_seed = claims(_cells({"mop-x": 0.9}, seeds=(0,)), config)
    assert all(c.state == "untested" for c in one_seed)  # a paired test needs a spread over seeds


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="probe_layers must be"):
        Config(probe_layers=(0, 2, 4, 9))
    with pytest.raises(ValueError, match="aligned_probes must be"):
        Config(aligned_probes=(4,))
    with pytest.raises(ValueError, match="systems must be"):
        Config(systems=("unimodal", "mop-x", "clip"))
    with pytest.raises(ValueError, match="patch must be"):
        Config(patch=5)
