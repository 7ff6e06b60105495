"""CURB's checks: config ranges, CLI validation before any work, the regime check and the DQN
learning precondition, and a damaged resume checkpoint through the console scripts."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mixlab.rl.curb.config import METHOD, Config
from mixlab.rl.curb.experiment import claims, dqn_learned, regime

MIXLAB_RL = Path(sys.executable).with_name("mixlab-rl")
MIXLAB = Path(sys.executable).with_name("mixlab")


def _run(script: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


# --- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"beta": 0.0}, "beta"),
        ({"dqn_beta": 0.0}, "dqn_beta"),
        ({"alpha": 1.5}, "alpha"),
        ({"penalty": 0.0}, "penalty"),
        ({"grid_alphas": (0.1, math.nan), "grid_betas": (1e-6,)}, "grid_alphas"),
        ({"grid_alphas": (0.1,), "grid_betas": (math.inf,)}, "grid_betas"),
        ({"grid_alphas": (0.1,), "grid_betas": (0.0,)}, "grid_betas"),
        ({"grid_alphas": (0.1, 0.1), "grid_betas": (1e-6,)}, "grid_alphas"),
        ({"penalty_sweep": (0.1, math.inf)}, "penalty_sweep"),
        ({"penalty_sweep": ("x",)}, "penalty_sweep"),
        ({"penalty_sweep": (True,)}, "penalty_sweep"),
        ({"n_actions": 1}, "n_actions"),
        ({"n_actions": 400}, "n_actions"),  # Q tables of 20 sessions: 19 GiB
        ({"n_sessions": True}, "n_sessions"),
    ],
)
def test_config_ranges(changes, field):
    with pytest.raises(ValueError, match=field):
        Config(**changes)


def test_profiles_are_valid_and_method_points_at_the_experiment():
    for profile in Config.PROFILES:
        Config.from_profile(profile)
    assert METHOD.run == "mixlab.rl.curb.experiment:run"
    assert METHOD.headline_plot == "collusion.png"


def test_config_module_imports_nothing_heavy():
    code = (
        "import sys; import mixlab.rl.curb.config, mixlab.rl.cli, mixlab.rl.curb; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('numpy', 'torch', 'numba', 'scipy', 'matplotlib', 'gymnasium', 'pettingzoo')]; "
        "print(heavy)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


# --- regime check and the DQN precondition ----------------------------------------------------


def _metrics(
    q_collusion=0.86, q_punished=0.95, dqn=(0.45, 0.0, 0.25), curb_dqn=0.1, curb=None, myopic=None
):
    """Metric rows as summarise() writes them; ``curb`` overrides CURB's rows in both games and
    ``myopic`` the control's (by default the committed quick run's myopic learner, which fails
    the unwinding test: 45 % of sessions in band)."""
    row = {
        "collusion": 0.05,
        "collusion_median": 0.05,
        "share_in_band": 0.9,
        "lock_in_share": 0.0,
        "punished_share": 0.0,
        "tv_cooperate_defect": 0.0,
        "grid_collusion_max": None,
        "grid_collusion_min": None,
        "belief_effect": None,
        "belief_effect_p": None,
        "closer_than_penalty": None,
        "closer_than_penalty_p": None,
    }
    metrics = {
        f"{game}/{system}": dict(row)
        for game in ("bertrand", "cournot")
        for system in ("q-learning", "penalty", "curb", "myopic")
    }
    metrics["bertrand/q-learning"].update(collusion=q_collusion, punished_share=q_punished)
    for game in ("bertrand", "cournot"):
        paired = {"closer_than_penalty": 0.05, "closer_than_penalty_p": 0.01}
        metrics[f"{game}/curb"].update(
            belief_effect=0.05, belief_effect_p=0.01, **paired, **(curb or {})
        )
        competitive = {
            "collusion_median": 0.205,
            "share_in_band": 0.45,
            "punished_share": 0.55,
            "closer_than_penalty": 0.0,
            "closer_than_penalty_p": 0.5,
        }
        metrics[f"{game}/myopic"].update({**competitive, **(myopic or {})})
    metrics["bertrand/dqn"] = {
        **row,
        "collusion": dqn[0],
        "collusion_median": dqn[0],
        "punished_share": dqn[1],
        "tv_cooperate_defect": dqn[2],
    }
    metrics["bertrand/curb-dqn"] = {**row, "collusion": curb_dqn, "collusion_median": curb_dqn}
    return metrics


@pytest.mark.parametrize(
    ("curb", "part"),
    [
        ({}, None),
        ({"collusion_median": 0.25}, "median Δ 0.25"),
        ({"share_in_band": 0.65}, "share in band 0.65"),
        # The full Cournot run: a good-looking mean hid 47 % of sessions frozen at the start.
        ({"collusion": -0.013, "lock_in_share": 0.47}, "lock-in share 0.47"),
        ({"punished_share": 0.3}, "share punishing 0.3"),
    ],
)
def test_curb_is_judged_on_the_distribution_of_sessions(curb, part):
    bertrand, cournot, belief, *_ = claims(_metrics(curb=curb), Config())
    for claim in (bertrand, cournot):
        assert claim.holds is (part is None)
        assert claim.state == ("holds" if part is None else "fails")
        if part is not None:
            assert part in claim.evidence
        assert claim.control is not None
        assert claim.control.system == "myopic"
        assert not claim.control.holds
        assert "share in band 0.45 >= 0.7" in claim.control.evidence
    assert belief.state == "holds"


def test_every_claim_has_a_key_and_a_control_outcome():
    found = claims(_metrics(dqn=(0.89, 0.5, 0.0)), Config())  # a DQN that learned
    assert [c.key for c in found] == [
        "unwinds_bertrand",
        "unwinds_cournot",
        "belief_adds",
        "dqn_colludes",
        "curb_dqn_unwinds",
    ]
    assert all(c.control is not None and c.control.tested for c in found)
    # statistics over independently seeded sessions: declared, not dressed as one seed
    assert not any(c.per_seed for c in found)
    assert all("independently seeded" in c.not_per_seed for c in found)


def test_a_claim_the_myopic_control_also_passes_is_vacuous():
    competitive = {"collusion_median": 0.05, "share_in_band": 0.9, "punished_share": 0.0}
    bertrand, cournot, belief, *_ = claims(
        _metrics(myopic={**competitive, "closer_than_penalty_p": 0.01}), Config()
    )
    assert (bertrand.holds, bertrand.state) == (True, "vacuous")
    assert (cournot.state, belief.state) == ("vacuous", "vacuous")
    assert bertrand.control.holds


def test_the_grid_claim_is_controlled_by_q_learning():
    config = Config(grid_alphas=(0.1, 0.2), grid_betas=(1e-6,))
    metrics = _metrics()
    for game in ("bertrand", "cournot"):
        metrics[f"{game}/curb"].update(grid_collusion_max=0.15, grid_collusion_min=0.05)
        metrics[f"{game}/q-learning"].update(grid_collusion_max=0.9, grid_collusion_min=0.7)
    grid = next(c for c in claims(metrics, config) if c.key == "grid_unwinds")
    assert grid.text.startswith("The effect holds across the (α, β) grid (2 × 1)")
    assert grid.state == "holds"
    assert grid.control.system == "q-learning"
    assert not grid.control.holds


def test_belief_injection_needs_a_significant_paired_effect_in_each_game():
    metrics = _metrics()
    metrics["cournot/curb"].update(closer_than_penalty=-0.02, closer_than_penalty_p=0.9)
    belief = claims(metrics, Config())[2]
    assert not belief.holds
    assert "cournot p (mean distance reduction -0.020) 0.9" in belief.evidence


@pytest.mark.parametrize(
    ("q_collusion", "q_punished", "holds"),
    [(0.86, 0.95, True), (0.70, 0.95, False), (0.97, 0.95, False), (0.86, 0.4, False)],
)
def test_regime_is_calvanos_collusion_with_punishment(q_collusion, q_punished, holds):
    (check,) = regime(_metrics(q_collusion, q_punished), Config())
    assert check.holds is holds
    assert "Δ" in check.evidence
    assert "punishing" in check.evidence


def test_dqn_claims_need_a_dqn_that_learned():
    from mixlab.shared import Result

    config = Config()
    # The quick profile's committed DQN: Δ 0.32, no punishment, TV^cd 0.25: did not learn.
    metrics = _metrics(dqn=(0.32, 0.0, 0.25))
    assert not dqn_learned(metrics).holds
    assert "0.25" in dqn_learned(metrics).evidence
    result = Result(metrics=metrics, claims=claims(metrics, config), regime=regime(metrics, config))
    assert result.regime_holds
    curb, _, _, dqn_colludes, curb_dqn = result.claims
    assert curb.tested
    assert not dqn_colludes.tested
    assert not curb_dqn.tested
    assert "DQN learned" in dqn_colludes.evidence
    # Punishment in half the sessions, or TV^cd at 0.5, counts as learned: the claims are tested.
    for learned in ((0.89, 0.5, 0.0), (0.89, 0.0, 0.5)):
        metrics = _metrics(dqn=learned)
        assert dqn_learned(metrics).holds
        result = Result(metrics=metrics, claims=claims(metrics, config))
        assert all(claim.tested for claim in result.claims)
        assert result.claims[3].holds
        assert result.claims[4].holds
        # the myopic learner's median Δ (0.205) clears the "colludes" line too
        assert result.claims[3].state == "vacuous"
        assert result.claims[4].state == "holds"
    # A failed regime check leaves every claim untested.
    metrics = _metrics(q_collusion=0.5, dqn=(0.89, 0.75, 0.75))
    result = Result(metrics=metrics, claims=claims(metrics, config), regime=regime(metrics, config))
    assert [claim.state for claim in result.claims] == ["untested"] * 5


# --- CLI: every option checked before any work ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["simulate", "--sessions", "0"], "--sessions"),
        (["simulate", "--n-actions", "1"], "--n-actions"),
        (["simulate", "--n-firms", "1"], "--n-firms"),
        (["simulate", "--learner", "curb", "--n-firms", "3"], "--n-firms"),
        (["simulate", "--n-firms", "6"], "--sessions"),  # 150 GiB of Q tables
        (["simulate", "--seed", "-1"], "--seed"),
        (["simulate", "--market", "hotelling"], "--market"),
        (["simulate", "--learner", "sarsa"], "--learner"),
        (["simulate", "--alpha", "0"], "--alpha"),
        (["simulate", "--beta", "0"], "--beta"),
        (["simulate", "--beta", "nan"], "--beta"),
        (["simulate", "--penalty", "inf"], "--penalty"),
        (["dqn", "--steps", "0"], "--steps"),
        (["dqn", "--seeds", "0"], "--seeds"),
        (["dqn", "--seeds", "-1"], "--seeds"),
        (["dqn", "--penalty", "-1"], "--penalty"),
        (["dqn", "--beta", "-1"], "--beta"),
        (["dqn", "--seed", "-2"], "--seed"),
        (["dqn", "--device", "gpu"], "--device"),
        (["equilibria", "--n-actions", "0"], "--n-actions"),
        (["equilibria", "--n-firms", "0"], "--n-firms"),
        (["equilibria", "--xi", "-0.5"], "--xi"),
        (["equilibria", "--market", "hotelling"], "--market"),
    ],
)
def test_cli_refuses_bad_options_before_work(args, option, tmp_path, capsys, monkeypatch):
    from mixlab.rl.cli import main
    from mixlab.rl.curb import dqn, markets, qlearning

    def no_work(*_, **__):
        raise AssertionError("work started before the options were checked")

    monkeypatch.setattr(qlearning, "train_sessions", no_work)
    monkeypatch.setattr(dqn, "train_dqn", no_work)
    monkeypatch.setattr(markets, "equilibria", no_work)
    out = tmp_path / "out"
    extra = [] if args[0] == "equilibria" else ["--out", str(out)]
    assert main(["curb", *args, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing printed before the error (equilibria used to)
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert option in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("verb", ["simulate", "dqn"])
def test_cli_out_that_is_a_file_fails_at_once(verb, tmp_path):
    existing = tmp_path / "taken.txt"
    existing.write_text("not a folder")
    done = _run(MIXLAB_RL, "curb", verb, "--out", str(existing))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--out" in lines[0]
    assert str(existing) in lines[0]
    assert done.stdout == ""
    assert existing.read_text() == "not a folder"
    # refused before simulating or training: nothing was printed (stdout is empty above)
    below = _run(MIXLAB_RL, "curb", verb, "--out", str(existing / "sub"))
    assert below.returncode == 2
    assert len(below.stderr.strip().splitlines()) == 1


def test_cli_writes_complete_outputs(tmp_path):
    from mixlab.rl.cli import main

    out = tmp_path / "deep" / "run"
    assert main(["curb", "simulate", "--sessions", "1", "--beta", "2e-5", "--out", str(out)]) == 0
    saved = json.loads((out / "sessions.json").read_text())
    assert len(saved["sessions"]) == 1
    assert np.load(out / "greedy_policies.npy").shape == (1, 2, 225)
    assert sorted(p.name for p in out.iterdir()) == ["greedy_policies.npy", "sessions.json"]


# --- a damaged resume checkpoint -----------------------------------------------------------------
# No verb of `mixlab-rl curb` loads anything back (simulate and dqn only write sessions.json and
# greedy_policies.npy); the experiment's cells are resumed by `mixlab run curb --resume`.

TINY = ["n_sessions=1", "dqn_steps=10", "dqn_seeds=1", "beta=2e-5"]


def _damage(case: str, folder: Path) -> Path:
    sidecar = folder / "checkpoints" / "step_00000001.json"
    tensors = sidecar.with_suffix(".safetensors")
    if case == "truncated":
        data = tensors.read_bytes()
        tensors.write_bytes(data[: len(data) // 2])
        return tensors
    data = json.loads(sidecar.read_text())
    if case == "key-removed":
        del data["format"]
    elif case == "wrong-type":
        data["format"] = 1
    else:  # a stored number edited by hand
        text = json.dumps(data)
        assert '"collusion": 0.85' in text
        data = json.loads(text.replace('"collusion": 0.85', '"collusion": 0.05'))
    sidecar.write_text(json.dumps(data))
    return sidecar


@pytest.mark.parametrize("case", ["truncated", "key-removed", "wrong-type", "edited-number"])
def test_damaged_resume_checkpoint_is_one_line(case, tmp_path):
    from mixlab.shared.checkpoint import Checkpointer

    config = Config.from_profile("quick", **Config.parse_overrides(TINY), device="cpu", seed=0)
    cell = {"kind": "tabular", "game": "bertrand", "system": "q-learning"}
    done = {json.dumps(cell): {**cell, "sessions": [{"collusion": 0.85}], "q": np.ones(4)}}
    Checkpointer(tmp_path, resume=True).save_run(1, config, done=done)
    damaged = _damage(case, tmp_path)
    args = ["run", "curb", "--device", "cpu", "--out", str(tmp_path), "--resume"]
    for assignment in TINY:
        args += ["--set", assignment]
    result = _run(MIXLAB, *args, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert damaged.name in lines[0]
    assert not (tmp_path / "result.json").exists()
    assert not (tmp_path / "cells.json").exists()
