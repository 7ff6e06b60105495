"""MoL's experiment on a tiny config (every system, regime gating, resume after a kill gives the
same numbers), its config refusals, and the CLI (``mixlab-attn mol``) end to end with one-line
exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from mixlab.attention_arch.cli import main
from mixlab.attention_arch.mol.config import BEST_FIXED, MOL_HYBRID, PENULTIMATE, Config

torch.set_num_threads(1)

TINY = {
    "size": 32, "vision_width": 16, "vision_depth": 3, "lm_width": 16, "lm_depth": 1,
    "encoder_images": 32, "encoder_steps": 2, "base_examples": 24, "base_steps": 2,
    "layers": (1, 2), "n_train": 24, "n_val": 12, "n_test": 12, "steps": 2, "batch_size": 4,
    "n_seeds": 1, "workers": 1,
}  # fmt: skip


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.attention_arch.mol import experiment
    from mixlab.attention_arch.mol.config import METHOD

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(experiment, "PROBE_STEPS", 2)
    config = Config(**TINY)
    assert config.systems == ("last layer", "layer 1", PENULTIMATE, "uniform average",
                              "DenseConnector concat", "static mixture", MOL_HYBRID)  # fmt: skip
    assert "MoL-patch" in Config.from_profile("full").systems
    result = METHOD.execute(config, tmp_path / "whole")  # refuses a claim without its control
    assert result.cache["state"] == "cold"  # the toy and the vision states were built
    assert sorted(e["entry"].split("-")[0] for e in result.cache["entries"]) == [
        "mol/states", "mol/states", "mol/states", "mol/toy"]  # fmt: skip
    assert set(config.systems) < set(result.metrics)
    chosen = result.metrics[BEST_FIXED]["chosen_layer"]  # picked on validation: a fixed layer
    system = {3: "last layer", 1: "layer 1", 2: PENULTIMATE}[chosen]
    assert result.metrics[BEST_FIXED]["fine"] == result.metrics[system]["fine"]  # one seed
    prior = result.metrics["toy base"]
    assert prior["prior_position"] >= 0.5 - 1e-9  # two answers: the commoner is right >= half
    assert 0 <= prior["prior_colour"] <= 1
    hybrid = result.metrics[MOL_HYBRID]
    assert 0 <= hybrid["fine"] <= 1
    assert hybrid["pi_colour_layer1"] + hybrid["pi_colour_layer2"] == pytest.approx(1, abs=1e-5)
    assert result.metrics["toy base"]["probe_colour_layer3"] is not None  # embeddings + 3 blocks
    assert len(result.regime) == 3
    assert len(result.claims) == 3
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None for c in result.claims)  # each judged against its control
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
        METHOD.execute(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "_train_cell", real)
    resumed = METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # the toy and the states came from the cache
    for system, row in result.metrics.items():
        for key, value in row.items():
            if not key.startswith(("train_s", "toy_train_s", "prepare_s")):  # wall times differ
                assert resumed.metrics[system][key] == value, (system, key)


def _claim_inputs(fine: dict[str, list[float]], shift: float, probe_gap: float, semantic=None,
                  prior: float = 0.3):  # fmt: skip
    """(cells, metrics, config) as the experiment leaves them: per system and seed a fine-grained accuracy
    (semantic 0.95, or ``semantic[system]``), MoL-hybrid's layer index ``shift`` shallower on
    fine-grained questions; the fixed layers' mean accuracies (0.7); the colour probe
    ``probe_gap`` better at layer 2 than at the penultimate (5), the answer prior at ``prior``
    on every task."""
    from mixlab.attention_arch.mol.experiment import FINE_QUESTIONS

    cells = []
    for system, values in fine.items():
        for seed, value in enumerate(values):
            accuracy = {**dict.fromkeys(FINE_QUESTIONS, value),
                        "shape": (semantic or {}).get(system, 0.95)}  # fmt: skip
            index = {**dict.fromkeys(FINE_QUESTIONS, 3.0 - shift * (system == MOL_HYBRID)),
                     "shape": 3.0}  # fmt: skip
            cells.append({"system": system, "seed": seed, "accuracy": accuracy,
                          "layer_index": index})  # fmt: skip
    config = Config(n_seeds=2)
    metrics = {
        s: dict.fromkeys(("vstar", "hrbench", "charxiv"), 0.7)
        for s in (*config.systems, BEST_FIXED)
    }
    probe = {f"probe_colour_layer{i}": 0.6 for i in range(config.vision_depth + 1)}
    probe["probe_colour_layer2"] += probe_gap
    floor = {f"prior_{task}": prior for task in ("vstar", "hrbench", "charxiv")}
    metrics["toy base"] = {**probe, **floor}
    return cells, metrics, config


def test_claims_are_judged_per_seed_against_their_controls():
    from mixlab.attention_arch.mol.experiment import claims

    fine = {
        MOL_HYBRID: [0.80, 0.82],
        PENULTIMATE: [0.70, 0.72],
        BEST_FIXED: [0.76, 0.78],  # a shallow layer: gains, but loses the semantic control
        "static mixture": [0.72, 0.73],
        "DenseConnector concat": [0.71, 0.70],
        "uniform average": [0.70, 0.71],
    }
    semantic = {BEST_FIXED: 0.90}
    states = {c.key: c.state for c in claims(*_claim_inputs(fine, 1.5, 0.3, semantic))}
    assert states == {
        "beats_penultimate": "holds",
        "beats_blind_mixtures": "holds",
        "routes_shallower_for_detail": "holds",
    }
    # the parameter-free uniform average beats the static mixture and the concat too: vacuous
    fine["uniform average"] = [0.75, 0.76]
    judged = {c.key: c for c in claims(*_claim_inputs(fine, 1.5, 0.3, semantic))}
    assert judged["beats_blind_mixtures"].state == "vacuous"
    assert judged["beats_blind_mixtures"].control.system == "uniform average"
    # the best fixed layer keeps the semantic control too: one shallower layer is all it takes
    judged = {c.key: c for c in claims(*_claim_inputs(fine, 1.5, 0.3))}
    assert judged["beats_penultimate"].state == "vacuous"
    assert judged["beats_penultimate"].control.system == BEST_FIXED
    # one seed below the penultimate's gain fails the claim, whatever the mean says
    fine[MOL_HYBRID] = [0.90, 0.73]
    assert claims(*_claim_inputs(fine, 1.5, 0.3, semantic))[0].state == "fails"
    # the probe finds the detail as well in the penultimate layer: nothing to route to, untested
    judged = claims(*_claim_inputs(fine, 1.5, 0.0, semantic))
    assert [c.state for c in judged] == ["untested"] * 3
    assert "deep layers drop the detail" in judged[2].evidence
    # no fixed layer beats the answer prior by 0.05 (0.7 against 0.68): the tasks are not
    # learnable here, so the claims about them are untested
    judged = claims(*_claim_inputs(fine, 1.5, 0.3, semantic, prior=0.68))
    assert [c.state for c in judged][:2] == ["untested"] * 2
    assert "answer prior + 0.05" in judged[0].evidence


@pytest.mark.parametrize(
    ("field", "value"),
    [("layers", ()), ("layers", (1, 9)), ("layers", (1, 2)), ("size", 36), ("fine_gain", 2.0),
     ("n_test", 5), ("n_val", 5), ("routed", ("MoL-image",)), ("invariant_layers", 9),
     ("invariance_weight", -1.0)],
)  # fmt: skip
def test_config_refusals_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Config(**{field: value})


def test_cli_end_to_end(tmp_path, capsys, monkeypatch):
    from mixlab.attention_arch.mol.toy import ToySpec, toy_folder

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    spec = ToySpec(size=32, vision_width=16, vision_depth=3, lm_width=16, lm_depth=1,
                   encoder_images=16, encoder_steps=1, base_examples=12, base_steps=1)  # fmt: skip
    model = str(toy_folder(spec))
    assert model == str(toy_folder(spec))  # the second call finds it
    assert list((tmp_path / "cache" / "mol").glob("toy-*/toy.json"))
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


def test_recoloured_views_keep_the_scene_and_change_only_its_hues():
    """The encoder's view pairs (``palette_seed``): the same scenes and answers, only the
    coloured pixels (small objects, bars) change; the grey background and shapes do not."""
    from mixlab.attention_arch.mol.tasks import encoder_labels, make_vqa

    plain, recoloured = make_vqa(24, size=32, seed=3), make_vqa(24, size=32, seed=3, palette_seed=5)
    assert plain.answers == recoloured.answers
    changed = (plain.images != recoloured.images).any(1)  # [n, H, W]
    achromatic = (plain.images.amax(1) - plain.images.amin(1)) < 1e-6
    assert changed.any()
    assert not (changed & achromatic).any()
    images, labels, views = encoder_labels(8, size=32, seed=1, recoloured=True)
    assert images.shape == views.shape
    assert len(labels) == 8


def test_no_invariance_term_is_a_valid_toy():
    """``invariance_weight=0`` (the encoder on caption labels and views, no invariance term) is
    allowed by the Config and reaches the toy's spec as a weight, not as a count."""
    from mixlab.attention_arch.mol.experiment import toy_spec

    assert toy_spec(Config(invariance_weight=0)).invariance_weight == 0.0
