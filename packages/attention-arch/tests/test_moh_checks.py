"""MoH's experiment on a tiny config (regime gating, resume after a kill gives the same
numbers), its config refusals, and the CLI (``mixlab-attn moh``) end to end with one-line exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from mixlab.attention_arch.cli import main
from mixlab.attention_arch.moh.config import MOH, PLAIN, PLAIN_FLOPS, STATIC, Config

torch.set_num_threads(1)

TINY = {
    "width": 16, "depth": 2, "d_state": 4, "steps": 4, "batch_size": 8, "n_samples": 24,
    "sample_steps": 2, "curve_points": 2, "curve_samples": 12, "curve_sample_steps": 2,
    "feature_steps": 10, "systems": (PLAIN, PLAIN_FLOPS, STATIC, MOH), "workers": 1,
    "n_seeds": 1,
}  # fmt: skip


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.attention_arch.moh import experiment
    from mixlab.attention_arch.moh.config import METHOD

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(**TINY)
    result = METHOD.execute(config, tmp_path / "full")  # refuses a claim without its control
    assert result.cache["state"] == "cold"  # the feature net of the metrics was trained
    rows = {"real", "Gaussian fit", "untrained MoH", PLAIN, PLAIN_FLOPS, STATIC, MOH}
    assert {f"digits8: {row}" for row in rows} == set(result.metrics)
    moh, plain = result.metrics["digits8: MoH"], result.metrics["digits8: plain Mamba"]
    assert moh["params"] > 0
    assert 0 <= moh["block_share"] <= 1
    assert moh["route_tv"] >= 0
    # top-1 routes: at most one expert call per block, as plain Mamba; FLOPs and wall per step
    assert moh["expert_calls"] <= plain["expert_calls"] == 2
    assert moh["mflops"] > 0
    assert moh["train_mflops"] > 0
    assert result.metrics["digits8: plain Mamba (equal FLOPs)"]["mflops"] <= plain["mflops"]
    assert moh["train_step_s"] > 0
    # the untrained model scores far worse than the real-vs-real floor (the ceiling)
    untrained = result.metrics["digits8: untrained MoH"]["fid_local"]
    assert untrained > result.metrics["digits8: real"]["fid_local"]
    assert len(result.regime) == 5
    assert len(result.claims) == 5
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None for c in result.claims)  # each judged against its control
    if not all(c.holds for c in result.regime):  # 4 steps draw nothing recognisable
        assert not any(c.tested for c in result.claims)
    for plot in ("fid_over_steps.png", "routes.png", "samples.png"):
        assert (tmp_path / "full" / plot).exists()
    cells = json.loads((tmp_path / "full" / "cells.json").read_text())
    assert cells[-1]["curve"]["step"] == [2, 4]

    real, calls = experiment.sample, []

    def dies_on_the_fifth(*args, **kwargs):  # inside the second system's training
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "sample", dies_on_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        METHOD.execute(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "sample", real)
    resumed = METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # the feature net came from the cache
    for system, row in result.metrics.items():
        for key, value in row.items():
            if key not in Config.TIMINGS:  # wall times differ
                assert resumed.metrics[system][key] == value, (system, key)


def _cells(fid: dict[str, list[float]], block_share: dict[str, float]) -> list[dict]:
    """Cells as the experiment leaves them: the real-vs-real floor at 0.5, and per system and seed
    an FID_local, a route total variation (MoH 0.4, the static MoE 0), a block share and a
    training curve that ends at the final FID_local."""
    cells = [
        {"dataset": "digits", "size": 8, "system": "real", "fid_local": 0.5},
        {"dataset": "digits", "size": 8, "system": "untrained MoH", "fid_local": 9.0},
    ]
    for system, values in fid.items():
        for seed, value in enumerate(values):
            cells.append({
                "dataset": "digits", "size": 8, "system": system, "seed": seed, "fid_local": value,
                "route_tv": {MOH: 0.4, STATIC: 0.0}.get(system), "block_share": block_share[system],
                "curve": {"step": [2, 4], "fid_local": [value + 0.1, value]},
            })  # fmt: skip
    return cells


def test_claims_are_judged_per_seed_against_their_controls():
    from mixlab.attention_arch.moh.experiment import claims

    config = Config(n_seeds=2)
    fid = {PLAIN: [2.0, 2.2], PLAIN_FLOPS: [2.3, 2.4], STATIC: [2.1, 2.0], MOH: [1.0, 1.2]}
    shares = {PLAIN: 1.0, PLAIN_FLOPS: 1.0, STATIC: 0.9, MOH: 0.5}
    states = {c.key: c.state for c in claims(_cells(fid, shares), config)}
    assert states == {
        "fid_below_plain": "holds",
        "fid_below_static": "holds",
        "converges_faster": "holds",
        "routes_move_with_t": "holds",
        "skips_blocks": "holds",
    }
    # the static MoE skips as many blocks: the depth gate's saving is not MoH's routing
    shares[STATIC] = 0.6
    judged = {c.key: c for c in claims(_cells(fid, shares), config)}
    assert judged["skips_blocks"].state == "vacuous"
    assert judged["skips_blocks"].control.system == STATIC
    # plain Mamba at MoH's FLOPs beats the static MoE as well: beating it says nothing about
    # routing on t
    fid[PLAIN_FLOPS] = [1.9, 1.9]
    assert {c.key: c.state for c in claims(_cells(fid, shares), config)}[
        "fid_below_static"
    ] == "vacuous"
    # one seed on which MoH is no better fails the claim, whatever the mean says
    fid[MOH] = [0.6, 2.1]
    assert {c.key: c.state for c in claims(_cells(fid, shares), config)}[
        "fid_below_plain"
    ] == "fails"
    # plain Mamba below the real-vs-real floor: beating it would mean beating the data
    fid = {PLAIN: [0.45, 0.4], PLAIN_FLOPS: [0.5, 0.5], STATIC: [0.6, 0.7], MOH: [0.3, 0.3]}
    judged = {c.key: c for c in claims(_cells(fid, shares), config)}
    assert judged["fid_below_plain"].state == "untested"
    assert judged["converges_faster"].state == "untested"
    assert "real-vs-real floor" in judged["converges_faster"].evidence
    # the static MoE no better than the untrained model: no margin below it can be judged
    fid = {PLAIN: [2.0, 2.2], PLAIN_FLOPS: [2.3, 2.4], STATIC: [9.5, 9.5], MOH: [1.0, 1.2]}
    assert {c.key: c.state for c in claims(_cells(fid, shares), config)}[
        "fid_below_static"
    ] == "untested"


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="systems must be"):
        Config(systems=("plain Mamba", "DiT"))  # no MoH
    with pytest.raises(ValueError, match="systems must be"):
        Config(systems=("plain Mamba", "MoH"))  # no static MoE: the controls need it
    with pytest.raises(ValueError, match="max_block_share must lie strictly between"):
        Config(max_block_share=1.0)  # every system passes a 100 % bar
    with pytest.raises(ValueError, match="datasets must be"):
        Config(datasets=(("cifar", 32),))
    with pytest.raises(ValueError, match="patch_size must be a divisor"):
        Config(patch_size=3)
    with pytest.raises(ValueError, match="datasets must be image sizes whose token grid"):
        Config(datasets=(("digits", 12),))
    with pytest.raises(ValueError, match="curve_points must be at most"):
        Config(steps=3, curve_points=5)


def test_cli_train_sample_routes_score(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["moh", "train", "--data", "digits", "--out", str(out), "--width", "16", "--depth",
            "2", "--d-state", "4", "--steps", "3", "--batch-size", "8"]  # fmt: skip
    assert main(args) == 0
    assert (out / "model" / "config.json").exists()
    assert main(["moh", "sample", "--model", str(out), "--n", "4", "--steps", "2", "--out",
                 str(tmp_path / "s.png")]) == 0  # fmt: skip
    assert (tmp_path / "s.png").exists()
    assert main(["moh", "routes", "--model", str(out), "--out", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").exists()
    capsys.readouterr()
    assert main(["moh", "score", "--model", str(out), "--n", "16", "--steps", "2",
                 "--feature-steps", "10"]) == 0  # fmt: skip
    scores = json.loads(capsys.readouterr().out)
    assert scores["fid_local"] > 0
    assert 0 <= scores["recognisable"] <= 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--data", "cifar10"], "--data"),
        (["train", "--system", "Transformer"], "--system must be one of"),
        (["train", "--patch-size", "3"], "--patch-size must divide the image size 8"),
        (["train", "--d-state", "0"], "--d-state"),
        (["train", "--top-k", "3"], "--top-k must be one of [0, 1, 2]"),
        (["sample", "--model", "nowhere"], "--model"),
        (["sample", "--model", ".", "--n", "0"], "--n"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(args, message, capsys, tmp_path):
    args = [*args, "--out", str(tmp_path / ("x.png" if args[0] == "sample" else "run"))]
    assert main(["moh", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert message in err, err
