"""The RND-RFF experiment at a tiny size (every code path, resume after a kill) and the
``mixlab-rl rnd_rff`` CLI (train with resume, novelty, kernel, one-line errors)."""

import json

import numpy as np
import pytest

from mixlab.rl.cli import main
from mixlab.rl.rnd_rff import make_bonus
from mixlab.rl.rnd_rff.config import PROBE_TARGETS, Config

TINY = {
    "n_seeds": 2,
    "probe_train": 200,
    "probe_test": 40,
    "probe_steps": 20,
    "gp_points": 60,
    "bandwidths": (0.25, 1.0),
    "probe_targets": PROBE_TARGETS,
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
    whole = experiment.METHOD.execute(config, tmp_path / "whole")  # refuses undeclared claims
    assert whole.cache["state"] == "none"  # nothing one-time to reuse
    assert {
        "probe/rnd",
        "probe/drnd",
        "probe/rff@0.25",
        "probe/rff-laplace@1",
        "probe/rff-multiscale@1",
    } <= set(whole.metrics)
    assert {f"maze-xy/{s}" for s in config.explorers} <= set(whole.metrics)
    assert {f"maze-onehot/{s}" for s in config.onehot_explorers} <= set(whole.metrics)
    assert "maze-onehot/drnd" not in whole.metrics  # quick runs four explorers there
    assert [c.text[:4] for c in whole.claims] == ["(1) ", "(2a)", "(2b)", "(3a)", "(3b)", "(4) "]
    assert all(c.key and c.control is not None for c in whole.claims)
    assert [c.control.system for c in whole.claims] == [
        "rnd", "drnd", "drnd", "drnd", "drnd", "ppo",
    ]  # fmt: skip
    assert len(whole.regime) == 3
    assert whole.metrics["probe/rff@1"]["spearman"] is not None
    assert whole.metrics["probe/rnd"]["spearman"] is not None  # claim 1's control, the same σ²
    assert whole.metrics["probe/drnd"]["spearman"] is None
    assert whole.metrics["probe/rff@1"]["spearman_all"] is not None  # far-OOD points apart
    assert 0 <= whole.metrics["probe/rff@1"]["gp_near_auroc"] <= 1
    assert "no explorer covers more than 90%" in whole.regime[1].text
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


def _done(explore=None, probe=None, seeds=3):
    """Fake cells of ``seeds`` seeds: the probe rows of the claims and both mazes for every
    explorer. ``explore``: {(env, system): [cells per seed]}; ``probe``: {(system, scale): {key:
    [values per seed]}}; both update the defaults, under which every claim holds and no control
    passes. The maze has 808 cells (Config's default rooms)."""
    probes = {
        ("rnd", 1.0): {"near_auroc": [0.70, 0.71, 0.72], "id_error": [2e-4] * 3,
                       "spearman": [0.84, 0.85, 0.83]},
        ("drnd", 1.0): {"near_auroc": [0.55, 0.56, 0.54]},
        ("rff", 1.0): {"near_auroc": [0.80, 0.81, 0.82], "id_error": [0.001] * 3,
                       "spearman": [0.95, 0.94, 0.96]},
        ("rff", 0.25): {"id_error": [0.020, 0.021, 0.022]},
        ("rff-multiscale", 1.0): {"near_auroc": [0.80, 0.81, 0.82]},
    } | (probe or {})  # fmt: skip
    mazes = {
        "rnd": [300, 305, 310], "rff": [400, 410, 405], "rff-multiscale": [390, 392, 395],
        "count": [450, 460, 455], "drnd": [300, 300, 300], "ppo": [250, 240, 245],
    }  # fmt: skip
    cells = {(env, system): values for env in ("maze-xy", "maze-onehot")
             for system, values in mazes.items()} | (explore or {})  # fmt: skip
    done = []
    for seed in range(seeds):
        done += [{"task": "probe", "system": system, "scale": scale, "seed": seed,
                  **{key: values[seed] for key, values in columns.items()}}
                 for (system, scale), columns in probes.items()]  # fmt: skip
        done += [{"task": "explore", "env": env, "system": system, "seed": seed,
                  "cells": values[seed], "cell_share": values[seed] / 808,
                  "reached": system != "ppo"}
                 for (env, system), values in cells.items()]  # fmt: skip
    return done


def test_claims_are_computed_from_the_seeds():
    from mixlab.rl.rnd_rff.experiment import claims, regime

    config = Config(n_seeds=3)
    found = claims({}, config, _done())
    assert [c.key for c in found] == [
        "tracks_gp", "near_ood_a", "near_ood_b", "coverage_a", "coverage_b", "tie_onehot",
    ]  # fmt: skip
    assert all(c.per_seed and c.control is not None for c in found)
    assert [c.state for c in found[:5]] == ["holds"] * 5  # no control passes its claim's test
    assert found[0].control.system == "rnd"
    assert "probe/rnd Spearman(bonus, σ²_ℓ) 0.83 >= 0.9" in found[0].control.evidence
    assert (found[5].holds, found[5].state) == (False, "fails")  # rff 400 vs RND 300: no tie
    # RND-RFF ties RND on the one-hot maze, but so does PPO without a bonus: the tie says nothing
    ties = {("maze-onehot", s): [301, 306, 311] for s in ("rff", "ppo")}
    assert claims({}, config, _done(explore=ties))[5].state == "vacuous"
    # the ID error at ¼ × median only 5× that at the median, on one seed of three
    low = {("rff", 0.25): {"id_error": [0.020, 0.005, 0.022]}}
    tracks = claims({}, config, _done(probe=low))[0]
    assert tracks.state == "fails"
    assert "worst of 3 seeds (seed 1)" in tracks.evidence
    metrics = {
        "probe/rnd": {"near_auroc": 0.71, "far_auroc": 0.99},
        "maze-xy/ppo": {"reached": 1}, "maze-xy/count": {"reached": 2},
        "maze-onehot/ppo": {"reached": 2}, "maze-onehot/count": {"reached": 3},
    }  # fmt: skip
    assert [c.holds for c in regime(metrics, config)] == [True, True, False]


def test_a_claim_its_control_also_passes_is_vacuous():
    from mixlab.rl.rnd_rff.experiment import claims

    config = Config(n_seeds=3)
    drnd = {("drnd", 1.0): {"near_auroc": [0.85, 0.86, 0.87]}}  # DRND beats RND by 0.15 too
    near = claims({}, config, _done(probe=drnd))[1]
    assert (near.holds, near.state) == (True, "vacuous")
    assert near.control.system == "drnd"
    assert near.control.holds


def test_coverage_is_judged_between_rnd_and_the_count_oracle_on_an_unsaturated_maze():
    from mixlab.rl.rnd_rff.experiment import claims

    config = Config(n_seeds=3)
    coverage = claims({}, config, _done())[3]
    assert "(seed 2): maze-xy/rff cells 405 >= RND + 0.5 × (count − RND) 382.5" in coverage.evidence
    # halfway on two seeds, short of it on one: the worst seed decides
    short = {("maze-xy", "rff"): [400, 410, 370]}
    assert claims({}, config, _done(explore=short))[3].state == "fails"
    # the count oracle covers no more than RND on one seed: there is no gap to close
    flat = {("maze-xy", "count"): [450, 300, 455]}
    coverage = claims({}, config, _done(explore=flat))[3]
    assert coverage.state == "untested"
    assert "maze-xy/count cells 300 > RND's 305" in coverage.evidence
    # the count bonus covers 93 % of the cells on one seed: coverage no longer separates bonuses
    saturated = {("maze-xy", "count"): [450, 750, 455]}
    coverage = claims({}, config, _done(explore=saturated))[3]
    assert coverage.state == "untested"
    assert "largest share of the xy maze's cells covered 0.9282 <= 0.9" in coverage.evidence


def test_near_ood_threshold_must_lie_below_a_perfect_detector():
    from mixlab.rl.rnd_rff.experiment import claims

    # RND already at 0.97: RND + 0.05 exceeds an AUROC's ceiling of 1
    high = {("rnd", 1.0): {"near_auroc": [0.97, 0.96, 0.98], "id_error": [2e-4] * 3,
                           "spearman": [0.84, 0.85, 0.83]}}  # fmt: skip
    near = claims({}, Config(n_seeds=3), _done(probe=high))[1]
    assert near.state == "untested"
    assert "ceiling 1" in near.evidence


def test_the_probe_spearman_leaves_the_far_points_out():
    from scipy.stats import spearmanr

    from mixlab.rl.rnd_rff.kernels import gp_posterior_variance
    from mixlab.rl.rnd_rff.probe import cluster_probe, score_bonus

    probe = cluster_probe(grid=3, n_train=300, n_test=60, seed=0)
    bonus = make_bonus("rff", (2,), seed=0, lr=1e-3)
    scores = score_bonus(bonus, probe, steps=30)
    close = np.concatenate([probe.inside, probe.near])
    posterior = gp_posterior_variance(
        bonus.target.kernel, bonus.normalize(probe.train).cpu(), bonus.normalize(close).cpu(), 1e-2
    )
    assert scores["spearman"] == pytest.approx(spearmanr(bonus.bonus(close), posterior).statistic)
    assert scores["spearman_all"] != pytest.approx(scores["spearman"])


def test_the_tie_claim_is_judged_on_every_seed():
    from mixlab.rl.rnd_rff.experiment import claims

    config = Config(n_seeds=3)
    steady = {("maze-onehot", "rnd"): [400, 400, 400], ("maze-onehot", "rff"): [398, 402, 400]}
    assert claims({}, config, _done(explore=steady))[-1].holds
    # the same mean, but one seed far off: not a tie
    erratic = {("maze-onehot", "rnd"): [400, 400, 400], ("maze-onehot", "rff"): [340, 460, 400]}
    assert not claims({}, config, _done(explore=erratic))[-1].holds


def test_config_names_the_bad_field():
    for override, parameter in [
        ({"explorers": ("ppo", "rnd")}, "explorers"),
        ({"explorers": ("ppo", "rnd", "rff", "count")}, "explorers"),  # DRND: claim 3's control
        ({"probe_targets": ("rff-laplace",)}, "probe_targets"),
        ({"probe_targets": ("rff",)}, "probe_targets"),  # multiscale explores: (2b) needs it
        ({"onehot_explorers": ("ppo", "rnd", "rff")}, "onehot_explorers"),
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


def test_cli_novelty_refuses_points_that_are_not_finite(tmp_path, capsys):
    """Issue 80: a NaN in --train reached the median bandwidth and surfaced as the RuntimeError
    "bandwidth is 'median' and unset"; the CLI refuses it before fitting."""
    points = np.random.default_rng(0).normal(size=(50, 3))
    points[3, 1] = np.nan
    np.save(tmp_path / "nan.npy", points)
    np.save(tmp_path / "ok.npy", np.ones((5, 3)))
    code = main(["rnd_rff", "novelty", "--train", str(tmp_path / "nan.npy"), "--test",
                 str(tmp_path / "ok.npy"), "--out", str(tmp_path / "n.csv")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.endswith("--train points must be finite numbers: the file holds NaN or inf")


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
