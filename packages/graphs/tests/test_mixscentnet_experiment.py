"""The MixScentNet experiment on the synthetic fixture (every code path, resume after a kill),
the missing-folder error of ``mixlab run``, and the ``mixlab-graphs mixscentnet`` CLI."""

import json

import pytest

from mixlab.graphs.cli import main
from mixlab.graphs.mixscentnet.config import METHOD, SYSTEMS, Config
from mixlab.graphs.mixscentnet.data import write_synthetic_olfaction

TINY = {
    "n_seeds": 1,
    "hidden": 8,
    "embedding": 8,
    "mixture_width": 8,
    "layers": 1,
    "pretrain_epochs": 1,
    "label_epochs": 1,
    "steps": 4,
    "white_sizes": (1, 2, 4),
    "white_pairs": 3,
    "bootstrap": 20,
    "workers": 1,
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_synthetic_olfaction(tmp_path_factory.mktemp("olfaction"), num_pairs=60)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path_factory.getbasetemp() / "mixscentnet-cache"))


def test_killed_experiment_resumes_to_the_same_result(data_dir, tmp_path, monkeypatch):
    from mixlab.graphs.mixscentnet import experiment

    config = Config(data_dir=str(data_dir), **TINY)
    whole = METHOD.execute(config, tmp_path / "whole")  # refuses a claim without its control
    assert whole.cache["state"] == "cold"  # the first run: Mordred table and both encoders made
    names = sorted(e["entry"].split("/")[1].rsplit("-", 1)[0] for e in whole.cache["entries"])
    # the shared encoders and the leave-molecules-out fold's inductive ones
    assert names == ["encoder-labels"] * 2 + ["encoder-mordred"] * 2 + ["mordred"]
    assert {f"random/{s}" for s in SYSTEMS} <= set(whole.metrics)
    assert {"white/mixscentnet", "labels/mordred@10", "labels/hgb@10", "pretrain/mordred",
            "molecules/hgb@25", "molecules/snitz@25"} <= set(whole.metrics)  # fmt: skip
    inductive = whole.metrics["pretrain/mordred@molecules"]
    assert inductive["excluded"] >= 1
    assert inductive["seen"] == 0
    assert whole.metrics["pretrain/labels@molecules"]["seen"] == 0
    cells = json.loads((tmp_path / "whole" / "cells.json").read_text())
    fits = [c for c in cells if c["task"] == "distance" and "steps_run" in c]
    assert fits
    assert all(1 <= c["best_step"] <= c["steps_run"] <= config.steps for c in fits)
    assert [c.key for c in whole.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.system for c in whole.claims)
    for claim in whole.claims[:3]:  # 4 steps: no fit stops early, so the premise fails
        assert claim.state == "untested"
        assert "the neural distance fits converged" in claim.evidence
    assert len(whole.regime) == 3
    assert len(whole.env["data_files"]["mixtures/mixtures_combined.csv"]) == 64  # SHA-256
    assert (tmp_path / "whole" / "distance.png").is_file()
    calls = []
    real = experiment.run_cell

    def dies_after_five(*args):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(experiment, "run_cell", dies_after_five)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "run_cell", lambda *a: calls.append(a[2]) or real(*a))
    resumed = METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # everything the first run made was found
    assert len(calls) == len(json.loads((tmp_path / "whole" / "cells.json").read_text()))
    for name, row in whole.metrics.items():
        for key, value in row.items():
            if key != "seconds":
                assert resumed.metrics[name][key] == value, (name, key)
    assert [c.to_dict() for c in resumed.claims] == [c.to_dict() for c in whole.claims]
    assert [c.to_dict() for c in resumed.regime] == [c.to_dict() for c in whole.regime]


def test_the_cached_work_is_made_by_code_its_entries_are_keyed_by():
    """A change to how an encoder is pretrained (or the Mordred table made) trains it again: the
    recipes live in modules of the entry's ``code``, not in the experiment."""
    from mixlab.graphs.mixscentnet import experiment

    assert "mixlab.graphs.mixscentnet.pretraining" in experiment.ENCODER_CODE
    for recipe in (experiment.pretrain_encoder, experiment.gslf_split, experiment.seeded_encoder):
        assert recipe.__module__ in experiment.ENCODER_CODE, recipe.__name__
    assert experiment.mordred_targets.__module__ in experiment.MORDRED_CODE


def test_quick_shares_out_the_mordred_molecules_and_the_white_fits(data_dir):
    """Quick computes Mordred descriptors of a share of each GS-LF part (full: every molecule,
    split as before) and fits olfactory white only for ``white_systems`` (full: every system)."""
    from mixlab.graphs.mixscentnet.data import load_gslf, load_mixture_pairs
    from mixlab.graphs.mixscentnet.experiment import _cells
    from mixlab.graphs.mixscentnet.pretraining import gslf_split, mordred_smiles, mordred_split

    labels, pairs = load_gslf(str(data_dir)), load_mixture_pairs(str(data_dir))
    train, test = gslf_split(labels)
    every = mordred_split(labels, 1.0)
    assert (every[0] == train).all()
    assert (every[1] == test).all()
    assert mordred_smiles(labels, pairs) == sorted(set(labels.smiles) | set(pairs.components))
    quick = Config(data_dir=str(data_dir))
    share = mordred_split(labels, quick.mordred_fraction)
    assert set(share[0]) < set(train)
    assert set(share[1]) <= set(test)
    assert len(share[1]) >= 2
    assert set(pairs.components) <= set(mordred_smiles(labels, pairs, quick.mordred_fraction))

    def white(config: Config) -> list[str]:
        return [c["system"] for c in _cells(config, pairs) if c["task"] == "white"]

    assert white(quick) == ["mixscentnet", "snitz", "hgb", "mean"]
    full = Config.from_profile("full", data_dir=str(data_dir))
    assert sorted(white(full)) == sorted(list(SYSTEMS) * full.white_seeds)  # every system, seed


def test_the_leave_molecules_out_encoders_never_see_the_held_out_molecules(data_dir):
    """Inductive pretraining (issue 69): on a leave-molecules-out fold both encoders are
    pretrained without the fold's held-out molecules, and the premise counts them from the fit
    set; the random split's encoders exclude nothing."""
    from mixlab.graphs.mixscentnet.data import load_mixture_pairs, split_pairs
    from mixlab.graphs.mixscentnet.experiment import held_out_molecules, inductive_pretraining

    pairs = load_mixture_pairs(str(data_dir))
    held = held_out_molecules(pairs, "molecules", 0, 5)
    train, _ = split_pairs(pairs, "molecules", 0, 5)
    in_train = {s for p in pairs.pairs[train] for m in p for s in pairs.mixtures[m]}
    assert held
    assert not set(held) & in_train
    assert held_out_molecules(pairs, "random", 0, 5) == []
    config = Config(data_dir=str(data_dir))

    def premise(seen: int, r2: float = 0.8):
        done = [{"task": "pretrain", "kind": k, "split": "molecules", "fold": 0,
                 "excluded": len(held), "seen": seen, "r2_excluded": r2 if k == "mordred" else None}
                for k in ("mordred", "labels")]  # fmt: skip
        return inductive_pretraining(done, config)

    assert premise(seen=0).holds
    assert not premise(seen=1).holds  # a leak in the recipe shows
    assert not premise(seen=0, r2=0.1).holds  # pretraining does not transfer to them
    assert not inductive_pretraining([], config).tested


def test_pretraining_leaves_out_the_excluded_molecules(data_dir, tmp_path):
    from mixlab.graphs.mixscentnet.data import load_gslf, load_mixture_pairs
    from mixlab.graphs.mixscentnet.experiment import mordred_folder
    from mixlab.graphs.mixscentnet.pretraining import pretrain_encoder

    labels, pairs = load_gslf(str(data_dir)), load_mixture_pairs(str(data_dir))
    config = Config(data_dir=str(data_dir), **TINY)
    exclude = sorted(set(pairs.components) & set(labels.smiles))[:3]
    assert len(exclude) == 3
    for kind in ("mordred", "labels"):
        folder = tmp_path / kind
        folder.mkdir()
        pretrain_encoder(folder, kind, labels, pairs, hidden=8, embedding=8, layers=1,
                         conv="gatv2", epochs=1, device="cpu",
                         mordred=lambda: mordred_folder(config), exclude=exclude)  # fmt: skip
        score = json.loads((folder / "score.json").read_text())
        assert score["excluded"] == 3
        assert score["seen"] == 0
        assert ("r2_excluded" in score) == (kind == "mordred")


def _distance_cells(pearson: dict[str, float], steps_run: int = 50) -> list[dict]:
    """Distance cells of both splits, fold 0 and three seeds, with ``pearson`` per system."""
    return [
        {"task": "distance", "split": split, "fold": 0, "seed": seed, "system": system,
         "fraction": 1.0, "pearson": value + 0.01 * seed, "steps_run": steps_run}
        for split in ("random", "molecules")
        for seed in (0, 1, 2)
        for system, value in pearson.items()
    ]  # fmt: skip


def test_a_claim_gradient_boosting_also_passes_is_vacuous():
    from mixlab.graphs.mixscentnet.experiment import claims

    config = Config(steps=100)
    aggregators = {"mixscentnet": 0.7, "mean-pool": 0.5, "self-attention": 0.55}

    def graph_beats_pooling(hgb: float, snitz: float = 0.3, steps_run: int = 50):
        done = _distance_cells({**aggregators, "hgb": hgb, "snitz": snitz}, steps_run)
        return {c.key: c for c in claims(done, config)}["graph_beats_pooling"]

    assert graph_beats_pooling(hgb=0.3).state == "holds"
    claim = graph_beats_pooling(hgb=0.8)  # descriptors beat the neural aggregators as well
    assert claim.state == "vacuous"
    assert claim.control.system == "hgb and snitz"
    assert "molecules: hgb − mean-pool Pearson: mean 0.3" in claim.control.evidence
    assert graph_beats_pooling(hgb=0.3, snitz=0.8).state == "vacuous"  # either control
    stopped_at_budget = graph_beats_pooling(hgb=0.3, steps_run=100)
    assert stopped_at_budget.state == "untested"  # the premise: training converged
    assert not stopped_at_budget.premises[0].holds


def test_a_missing_data_folder_is_one_line_naming_it(tmp_path, capsys):
    from mixlab.shared.cli import main as mixlab

    code = mixlab(["run", "mixscentnet", "--out", str(tmp_path / "run"),
                   "--set", f"data_dir={tmp_path / 'absent'}"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err
    assert "absent" in err
    assert "lacks gs-lf" in err


@pytest.mark.parametrize(
    ("override", "parameter"),
    [
        ({"systems": ("mixscentnet", "mean")}, "systems"),
        ({"fold_ids": (5,)}, "fold_ids"),
        ({"pair_fraction": 1.0}, "pair_fraction"),
        ({"encoder": "gcn"}, "encoder"),
        ({"white_sizes": (3,)}, "white_sizes"),
        ({"mordred_fraction": 0.0}, "mordred_fraction"),
        ({"white_systems": ("mixscentnet", "gcn")}, "white_systems"),
        ({"min_delta": -1e-3}, "min_delta"),
        ({"regime_margin": 0.9}, "regime_margin"),
        ({"patience": 0}, "patience"),
    ],
)
def test_config_names_the_bad_field(override, parameter):
    with pytest.raises(ValueError, match=parameter):
        Config(**override)


def test_cli_pretrain_train_predict_white(data_dir, tmp_path, capsys):
    from mixlab.graphs.mixscentnet.data import load_gslf

    smiles = tmp_path / "molecules.smi"
    smiles.write_text("\n".join(load_gslf(data_dir).smiles[:30]) + "\n")
    assert main(["mixscentnet", "pretrain", "--smiles", str(smiles), "--out",
                 str(tmp_path / "pre"), "--epochs", "1", "--cache", str(tmp_path / "c")]) == 0  # fmt: skip
    assert main(["mixscentnet", "train", "--data", str(data_dir), "--split", "molecules",
                 "--init", str(tmp_path / "pre"), "--steps", "3",
                 "--out", str(tmp_path / "model")]) == 0  # fmt: skip
    assert "Pearson" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["split"] == "molecules"
    assert -1 <= metrics["pearson"] <= 1
    mixtures = tmp_path / "mixtures.csv"
    mixtures.write_text("mixture,smiles\nA,CCO;CCCO\nB,c1ccccc1\n")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("mixture_1,mixture_2\nA,B\nB,A\n")
    out = tmp_path / "predicted.csv"
    assert main(["mixscentnet", "predict", "--model", str(tmp_path / "model"), "--mixtures",
                 str(mixtures), "--pairs", str(pairs), "--out", str(out)]) == 0  # fmt: skip
    rows = out.read_text().splitlines()
    assert rows[0] == "mixture_1,mixture_2,predicted_distance"
    assert rows[1].split(",")[2] == rows[2].split(",")[2]  # symmetric in the pair
    white = tmp_path / "white.csv"
    assert main(["mixscentnet", "white", "--model", str(tmp_path / "model"), "--pool",
                 str(smiles), "--sizes", "1,2,4", "--pairs-per-size", "2",
                 "--out", str(white)]) == 0  # fmt: skip
    assert len(white.read_text().splitlines()) == 1 + 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--data", "{tmp}/absent", "--out", "{tmp}/m"], "--data: .* does not exist"),
        (["train", "--data", "{tmp}", "--split", "scaffold", "--out", "{tmp}/m"], "--split must be one of"),
        (["train", "--data", "{tmp}", "--out", "{tmp}/m"], "lacks mixtures/mixtures_combined.csv"),
        (["predict", "--model", "{tmp}", "--mixtures", "{tmp}/bad.csv", "--pairs", "{tmp}/bad.csv",
          "--out", "{tmp}/o.csv"], "--model: .* has no model.safetensors"),
        (["pretrain", "--smiles", "{tmp}/bad.smi", "--out", "{tmp}/p"], r"unparsable SMILES 'C1CC\(' \(--smiles line 2\)"),
        (["white", "--model", "{tmp}", "--pool", "{tmp}/bad.smi", "--sizes", "a,b",
          "--out", "{tmp}/w.csv"], "--sizes must be comma-separated integers"),
    ],
)  # fmt: skip
def test_cli_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    (tmp_path / "bad.smi").write_text("CCO\nC1CC(\n")
    (tmp_path / "bad.csv").write_text("mixture,smiles\nA,CCO\n")
    code = main(["mixscentnet", *[a.replace("{tmp}", str(tmp_path)) for a in args]])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err
    import re

    assert re.search(message, err), err
