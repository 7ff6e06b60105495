"""The RND-RFF experiment at a tiny size (every code path, resume after a kill) and the
``mixlab-rl rnd_rff`` CLI (train with resume, novelty, kernel, one-line errors)."""

import json

import numpy as np
import pytest

from mixlab.rl.cli import main
from mixlab.rl.rnd_rff.config import Config

TINY = {
    "n_seeds": 2,
    "probe_train": 200,
    "probe_test": 40,
    "probe_steps": 20,
    "gp_points": 60,
    "bandwidths": (0.25, 1.0),
    "maze_steps": 256,
    "onehot_steps": 128,
    "rooms": (1, 2),
    "room_size": 3,
    "max_steps": 30,
    "num_envs": 2,
    "num_steps": 64,
    "workers": 1,
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_killed_experiment_resumes_to_the_same_result(tmp_path, monkeypatch):
    from mixlab.rl.rnd_rff import experiment

    config = Config(**TINY)
    whole = experiment.run(config, tmp_path / "whole")
    assert {
        "probe/rnd",
        "probe/drnd",
        "probe/rff@0.25",
        "probe/rff-laplace@1",
        "probe/rff-multiscale@1",
    } <= set(whole.metrics)
    assert {f"maze-{o}/{s}" for o in ("xy", "onehot") for s in config.explorers} <= set(
        whole.metrics
    )
    assert [c.text[:4] for c in whole.claims] == ["(1) ", "(2a)", "(2b)", "(3a)", "(3b)", "(4) "]
    assert len(whole.regime) == 3
    assert whole.metrics["probe/rff@1"]["spearman"] is not None
    assert whole.metrics["probe/rnd"]["spearman"] is None
    assert (tmp_path / "whole" / "exploration.png").is_file()
    calls = []
    real = experiment.run_cell

    def dies_after_five(config, cell):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(cell)
        return real(config, cell)

    monkeypatch.setattr(experiment, "run_cell", dies_after_five)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "run_cell", lambda c, cell: calls.append(cell) or real(c, cell))
    resumed = experiment.run(config, tmp_path / "killed", resume=True)
    assert len(calls) == len(json.loads((tmp_path / "whole" / "cells.json").read_text()))
    for name, row in whole.metrics.items():
        for key, value in row.items():
            if key != "seconds":
                assert resumed.metrics[name][key] == value, (name, key)
    assert [c.to_dict() for c in resumed.claims] == [c.to_dict() for c in whole.claims]
    assert [c.to_dict() for c in resumed.regime] == [c.to_dict() for c in whole.regime]


def test_claims_are_computed_from_the_metrics():
    from mixlab.rl.rnd_rff.experiment import claims, regime

    config = Config(n_seeds=3)
    done = []
    for seed in range(3):
        done += [
            {
                "task": "probe",
                "system": "rnd",
                "scale": 1.0,
                "seed": seed,
                "near_auroc": 0.70 + 0.01 * seed,
            },
            {
                "task": "probe",
                "system": "rff",
                "scale": 1.0,
                "seed": seed,
                "near_auroc": 0.80 + 0.01 * seed,
                "id_error": 0.001,
            },
            {
                "task": "probe",
                "system": "rff",
                "scale": 0.25,
                "seed": seed,
                "id_error": 0.02 + 0.001 * seed,
            },
        ]
    metrics = {
        "probe/rnd": {"near_auroc": 0.71, "far_auroc": 0.99},
        "probe/rff@1": {"near_auroc": 0.81, "spearman": 0.95, "id_error": 0.001},
        "probe/rff@0.25": {"id_error": 0.02},
        "maze-xy/ppo": {"reached": 1}, "maze-xy/count": {"reached": 2},
        "maze-onehot/ppo": {"reached": 2}, "maze-onehot/count": {"reached": 3},
    }  # fmt: skip
    found = claims(metrics, config, done)
    assert found[0].holds  # Spearman 0.95, ID error 20×
    assert found[1].holds  # +0.10 with a constant paired difference
    metrics["probe/rff@0.25"]["id_error"] = 0.005
    assert not claims(metrics, config, done)[0].holds
    checks = regime(metrics, config)
    assert [c.holds for c in checks] == [True, True, False]


def test_the_tie_claim_is_judged_on_the_seeds_not_the_means():
    from mixlab.rl.rnd_rff.experiment import claims

    config = Config(n_seeds=3)
    metrics = {"maze-onehot/rnd": {"cells": 400.0}, "maze-onehot/rff": {"cells": 400.0}}

    def explore(system, cells):
        return [{"task": "explore", "env": "maze-onehot", "system": system, "seed": s, "cells": c}
                for s, c in enumerate(cells)]  # fmt: skip

    steady = explore("rnd", [400, 400, 400]) + explore("rff", [398, 402, 400])
    assert claims(metrics, config, steady)[-1].holds
    # the same means, but one seed far off: not a tie
    erratic = explore("rnd", [400, 400, 400]) + explore("rff", [340, 460, 400])
    assert not claims(metrics, config, erratic)[-1].holds


def test_config_names_the_bad_field():
    for override, parameter in [
        ({"explorers": ("ppo", "rnd")}, "explorers"),
        ({"bandwidths": (0.5, 2.0)}, "bandwidths"),
        ({"rooms": (1, 1)}, "rooms"),
        ({"minigrid": ("CartPole-v1",)}, "minigrid"),
        ({"probe_sd": 0.7}, "probe_sd"),
    ]:
        with pytest.raises(ValueError, match=parameter):
            Config(**override)


def test_cli_train_resume_novelty_and_kernel(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["rnd_rff", "train", "--steps", "1024", "--rooms", "1x2", "--room-size", "3",
            "--num-envs", "4", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert (out / "curves.csv").read_text().startswith("step,cells,")
    first = json.loads((out / "summary.json").read_text())
    assert first["steps"] == 1024
    assert first["bandwidth"] > 0
    assert main([*args[:3], "2048", *args[4:], "--resume"]) == 0
    assert "resumed at step 1024" in capsys.readouterr().out
    assert len((out / "curves.csv").read_text().splitlines()) == 1 + 2048 // 512
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "a.npz", x=rng.normal(size=(300, 3)))
    np.save(tmp_path / "b.npy", rng.normal(size=(40, 3)) * 4)
    code = main(["rnd_rff", "novelty", "--train", str(tmp_path / "a.npz"), "--test", str(tmp_path / "b.npy"),
                 "--steps", "200", "--out", str(tmp_path / "scores.csv")])  # fmt: skip
    assert code == 0
    assert "AUROC" in capsys.readouterr().out
    assert len((tmp_path / "scores.csv").read_text().splitlines()) == 41
    code = main(
        [
            "rnd_rff",
            "kernel",
            "--bandwidths",
            "0.5,1",
            "--steps",
            "30",
            "--out",
            str(tmp_path / "k"),
        ]
    )
    assert code == 0
    assert len((tmp_path / "k" / "kernel.csv").read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--bandwidth", "0"], "--bandwidth must be 'median' or a number > 0"),
        (["train", "--bandwidth", "wide"], "--bandwidth"),
        (["train", "--bonus", "icm"], "--bonus must be one of"),
        (["train", "--steps", "0"], "--steps"),
        (["train", "--update-proportion", "0"], "--update-proportion must be a number in (0, 1]"),
        (["train", "--update-proportion", "1.5"], "--update-proportion"),
        (["train", "--rooms", "1x1"], "--rooms"),
        (["train", "--env", "NoSuchEnv-v0"], "env must be"),
        (["novelty", "--train", "absent.npz", "--test", "absent.npz"], "--train"),
        (["kernel", "--bandwidths", "-1"], "--bandwidths"),
        (["kernel", "--spectrum", "cauchy"], "--spectrum"),
    ],
)
def test_cli_bad_inputs_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    code = main(["rnd_rff", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err
    assert message in err


def test_cli_trains_on_minigrid_and_refuses_to_resume_another_run(tmp_path, capsys):
    out = tmp_path / "mg"
    args = ["rnd_rff", "train", "--env", "MiniGrid-Empty-5x5-v0", "--bonus", "rnd", "--steps", "64",
            "--num-envs", "1", "--out", str(out)]  # fmt: skip
    assert main(args) == 0  # MiniGrid's Dict observations are flattened by make_vector_env
    assert main([*args, "--seed", "1", "--resume"]) == 2
    assert "--resume: the checkpoint" in capsys.readouterr().err


def test_cli_refuses_a_test_file_of_another_shape(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((20, 3)))
    np.save(tmp_path / "b.npy", np.zeros((20, 2)))
    code = main(["rnd_rff", "novelty", "--train", str(tmp_path / "a.npy"), "--test", str(tmp_path / "b.npy"),
                 "--out", str(tmp_path / "s.csv")])  # fmt: skip
    assert code == 2
    assert "--test points have shape (2,)" in capsys.readouterr().err
