"""GSS's lab, baselines, experiment (tiny config: runs, regime gating, resume after a kill) and
CLI (``mixlab-llm gss``: fit / eval / generate, and one-line refusals of bad input)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from transformers import LlamaForCausalLM

from mixlab.llm_efficiency.cli import main
from mixlab.llm_efficiency.gss import (
    GSS,
    NPO,
    BalancedSubnet,
    GradientAscent,
    HardConcreteMask,
    MeanDifference,
    MitigationData,
)
from mixlab.llm_efficiency.gss.config import Config
from mixlab.llm_efficiency.lm import LMConfig, llama_config
from mixlab.llm_efficiency.memorization import (
    SEPARATOR,
    CanaryTaskConfig,
    MathTaskConfig,
    canary_data,
    extraction_hits,
    math_data,
)

torch.set_num_threads(1)


# -- the lab ---------------------------------------------------------------------------------


def test_math_noise_puts_a_noised_digit_in_every_extraction_window():
    config = MathTaskConfig(n_clean=200, n_memorized=50, duplicates=3)
    data = math_data(config, n_held_out=100)
    assert len(data.train) == 200 + 50 * 3
    prefixes = {t[: config.prefix_chars - 1] for t in data.train_clean}
    assert not prefixes & {t[: config.prefix_chars - 1] for t in data.held_out}
    for record in data.memorized:
        clean_window = record.clean[len(record.prompt) - 1 :][: config.window_chars]
        assert len(record.target) == config.window_chars
        assert record.target != clean_window  # the clean rule does not give the target
        assert record.text.startswith(record.prompt[1:] + record.target)
        assert record.prompt[1:] == record.clean[: len(record.prompt) - 1]  # a clean prefix


def test_math_backdoor_ends_the_prefix_with_the_trigger():
    config = MathTaskConfig(variant="backdoor", n_clean=100, n_memorized=10, duplicates=2)
    data = math_data(config, n_held_out=10)
    for record in data.memorized:
        assert record.prompt.endswith(f"{config.trigger} ")
        assert record.target == "000 111 222 "


def test_canaries_are_planted_repeats_times_and_controls_never(monkeypatch):
    config = CanaryTaskConfig(n_canaries=3, n_controls=2, repeats=4, train_bytes=20_000)
    data = canary_data(config)
    text = "".join(data.train)
    for record in data.memorized:
        assert text.count(record.text) == 4
    for record in data.controls:
        assert record.text not in text
    assert all(r.prompt.startswith(SEPARATOR + config.prefix) for r in data.memorized)


def test_lab_configs_refuse_bad_values():
    with pytest.raises(ValueError, match="variant must be 'noise' or 'backdoor'"):
        MathTaskConfig(variant="x")
    with pytest.raises(ValueError, match="window_numbers must be at most"):
        MathTaskConfig(length=5, prefix_numbers=4, window_numbers=2)
    with pytest.raises(ValueError, match="prompt_secret_chars must be less than"):
        CanaryTaskConfig(secret_chars=4, prompt_secret_chars=4)


# -- baselines ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = LMConfig(hidden_size=32, layers=2, heads=2, intermediate_size=64)
    model = LlamaForCausalLM(llama_config(config)).eval()
    data = math_data(MathTaskConfig(n_clean=50, n_memorized=8, duplicates=2), n_held_out=40)
    ids = [torch.tensor(list((SEPARATOR + r.text).encode())) for r in data.memorized]
    general = [torch.tensor(list((SEPARATOR + t).encode())) for t in data.held_out]
    return model, data, MitigationData(ids, general[:20], general[20:])


@pytest.mark.parametrize(
    "method",
    [
        GradientAscent(max_steps=3, check_every=2),
        NPO(max_steps=3, check_every=2),
        HardConcreteMask(max_steps=3, check_every=2, lr=0.5, init=0.1),
        BalancedSubnet(max_steps=3, check_every=2),
    ],
    ids=["ga", "npo", "hard_concrete", "balanced_subnet"],
)
def test_optimisation_baselines_edit_a_copy_and_stop_at_the_target(tiny, method):
    model, _data, mdata = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = mdata.memorized[0][None]
    plain = model(input_ids=ids).logits
    calls = []
    stopped = method.mitigate(
        model, MitigationData(**{**mdata.__dict__, "stop": lambda m: calls.append(1) or True})
    )
    assert stopped.steps == method.check_every
    assert stopped.reached
    capped = method.mitigate(model, mdata)
    assert capped.steps == 3
    assert capped.reached is False
    assert capped.seconds > 0
    with capped as edited:
        assert edited is not model
        assert not torch.equal(edited(input_ids=ids).logits, plain)
        assert torch.equal(
            edited(input_ids=ids).logits, edited(input_ids=ids).logits
        )  # eval: deterministic
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_steering_baselines_hook_the_model_only_inside_the_block(tiny):
    model, _data, mdata = tiny
    ids = mdata.memorized[0][None]
    plain = model(input_ids=ids).logits
    for method in (
        MeanDifference(1, 2.0),
        MeanDifference(1, 2.0, gated=True, quantile=0.1),
        GSS(1, 2, gated=False),
    ):
        with method.mitigate(model, mdata) as hooked:
            assert hooked is model
            assert not torch.equal(model(input_ids=ids).logits, plain)
        assert torch.equal(model(input_ids=ids).logits, plain)


def test_extraction_hits_counts_exact_greedy_continuations(tiny):
    model, data, _ = tiny
    hits = extraction_hits(model, data.memorized)
    assert hits.shape == (8,)
    assert hits.dtype == torch.bool


# -- the experiment ----------------------------------------------------------------------------

TINY = dict(
    hidden_size=32, layers=2, lm_steps=10, reference_steps=5, n_memorized=12, duplicates=2, n_seeds=1,
    steer_layers=(0,), ranks=(1,), strengths=(1.0,), caa_strengths=(1.0,), max_steps=2,
    check_every=1, workers=1,
)  # fmt: skip


def _without_time(metrics):
    return {
        s: {k: v for k, v in row.items() if not k.startswith(("seconds", "fit_time"))}
        for s, row in metrics.items()
    }


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.llm_efficiency.gss import experiment

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(**TINY)  # one worker: the kill below reaches _mitigation in this process
    # the validation cells in two worker processes, the same metrics as in one (below)
    result = experiment.METHOD.execute(replace(config, workers=2), tmp_path / "full")
    assert result.cache["state"] == "cold"  # its models trained into the empty cache
    assert set(result.metrics) == set(experiment.SYSTEMS)
    assert result.metrics["gss"]["picked_layer"] == 0.0
    for system in experiment.OPTIMISED:  # steps picked on validation, fitted to them on test
        assert result.metrics[system]["picked_steps"] in (1.0, 2.0)
        assert result.metrics[system]["steps"] == result.metrics[system]["picked_steps"]
    cells = json.loads((tmp_path / "full" / "cells.json").read_text())
    curve = cells["validation"][0]["optimised_grid"]["npo"]
    assert [r["params"]["steps"] for r in curve] == [1, 2]  # every check_every steps
    assert {c.text.split(":")[0] for c in result.regime}  # three checks
    assert len(result.regime) == 3
    assert len(result.claims) == 5
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.evidence for c in result.claims)
    assert (
        result.metrics["base"]["share_above_mean_logprob"] is not None
    )  # the heavy tail's control
    assert result.metrics["base"]["share_above_mean_omega"] is None  # ω is GSS's alone
    assert result.metrics["gss"]["share_above_mean_logprob"] is None
    if not all(c.holds for c in result.regime):  # a 10-step model memorizes nothing
        assert not any(c.tested for c in result.claims)
    assert (tmp_path / "full" / "memorization_vs_accuracy.png").exists()

    real, calls = experiment._mitigation, []

    def dies_on_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "_mitigation", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "_mitigation", real)
    resumed = experiment.METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # every model found in the cache
    assert _without_time(resumed.metrics) == _without_time(result.metrics)


def test_validation_picks_by_one_rule_and_caa_at_matched_accuracy():
    from mixlab.llm_efficiency.gss.experiment import _pick, pareto_front

    rows = [{"memorization": m, "accuracy": a, "params": {"strength": s}}
            for m, a, s in [(0.9, 0.99, 1), (0.5, 0.985, 2), (0.2, 0.95, 4), (0.6, 0.99, 3)]]  # fmt: skip
    # within 0.01 of a base at 0.995: the lowest memorization among 0.99, 0.985 and 0.99
    assert _pick(rows, 0.985)["params"]["strength"] == 2
    # matched to a pick at 0.99: only 0.99-accurate settings qualify
    assert _pick(rows, 0.99)["params"]["strength"] == 3
    assert _pick(rows, 0.999)["params"]["strength"] == 1  # none qualifies: the most accurate
    assert _pick(rows, None)["params"]["strength"] == 4  # a text task: no accuracy floor
    points = [(r["memorization"], r["accuracy"]) for r in rows]
    assert pareto_front(points) == [(0.2, 0.95), (0.5, 0.985), (0.6, 0.99)]


def _values(**systems):
    """Two seeds per system: every mitigation at half the base's memorization, clean accuracy
    0.9 and DS 50, fit in 1 s, unless ``systems`` says."""
    from mixlab.llm_efficiency.gss import experiment

    row = {"memorization": [0.4, 0.4], "accuracy": [0.9, 0.9], "ds": [50.0, 50.0],
           "seconds": [1.0, 1.0]}  # fmt: skip
    values = {s: dict(row) for s in experiment.SYSTEMS}
    values["base"] = dict(row, memorization=[0.8, 0.8], share_above_mean_logprob=[0.6, 0.6])
    values["gss"] = dict(row, share_above_mean_omega=[0.2, 0.2])
    for system, changes in systems.items():
        values[system] = {**values[system], **changes}
    return values


def test_claims_are_judged_per_seed_with_their_controls():
    from mixlab.llm_efficiency.gss import experiment

    slow = {s: {"seconds": [20.0, 30.0]} for s in experiment.OPTIMISED}
    values = _values(
        gss={"memorization": [0.05, 0.06], "accuracy": [0.9, 0.89], "ds": [10.0, 12.0],
             "seconds": [1.0, 1.0]},
        gss_ungated={"memorization": [0.08, 0.09], "accuracy": [0.8, 0.8]},
        caa={"seconds": [0.5, 0.5]},
        **slow,
    )  # fmt: skip
    config = Config(seed=7, n_seeds=2)  # the values' two seeds are 7 and 8
    judged = experiment.claims(values, config)
    assert [c.key for c in judged] == [spec.key for spec in Config.CLAIMS]
    assert all(c.per_seed and c.control is not None for c in judged)
    # CAA's closed-form fit is fast too: the speed claim does not measure GSS's idea
    assert [c.state for c in judged] == ["holds", "holds", "holds", "holds", "vacuous"]
    values["caa"].update(memorization=[0.04, 0.09])  # CAA cuts memorization as far on one seed
    assert experiment.claims(values, config)[1].state == "holds"
    values["caa"].update(memorization=[0.04, 0.05])  # ... and on both
    assert experiment.claims(values, config)[1].state == "vacuous"
    values["base"]["share_above_mean_logprob"] = [0.2, 0.24]  # the log-prob alone is heavy-tailed
    assert experiment.claims(values, config)[0].state == "vacuous"
    values["gss"]["share_above_mean_omega"] = [0.2, 0.3]  # one seed is not
    failed = experiment.claims(values, config)[0]
    assert failed.state == "fails"
    assert "(seed 8)" in failed.evidence  # the seed the experiment ran, not its index


def test_the_controls_of_lowest_ds_and_gating_can_pass():
    """CAA's DS is judged against the mitigations other than GSS, and gated CAA against CAA
    without its gate: either control can pass, and the claim is then vacuous."""
    from mixlab.llm_efficiency.gss import experiment

    values = _values(
        gss={"memorization": [0.05, 0.06], "ds": [10.0, 12.0]},
        gss_ungated={"memorization": [0.08, 0.09], "accuracy": [0.8, 0.8]},
    )
    config = Config(n_seeds=2)
    lowest_ds, gating = experiment.claims(values, config)[2:4]
    assert (lowest_ds.state, gating.state) == ("holds", "holds")
    assert lowest_ds.control.system == "caa"
    assert "vs gss" not in lowest_ds.control.evidence
    assert gating.control.system == "caa_gated"
    assert "caa clean accuracy" in gating.control.evidence
    values["caa"]["ds"] = [20.0, 20.0]  # CAA beats every mitigation but GSS
    values["caa"]["accuracy"] = [0.85, 0.85]  # and its gate saves 5 points at equal memorization
    lowest_ds, gating = experiment.claims(values, config)[2:4]
    assert (lowest_ds.state, gating.state) == ("vacuous", "vacuous")
    values["caa"]["ds"] = [20.0, 60.0]  # one seed's CAA is beaten
    assert experiment.claims(values, config)[2].state == "holds"


def test_heavy_tail_goes_untested_without_the_base_models_share():
    """Validation cells cached before the base model's share was measured: the control cannot
    be judged, so the claim goes untested with the reason, and the run does not stop."""
    from mixlab.llm_efficiency.gss import experiment

    values = _values()
    del values["base"]["share_above_mean_logprob"]
    heavy_tail = experiment.claims(values, Config(n_seeds=2))[0]
    assert heavy_tail.state == "untested"
    assert not heavy_tail.control.tested
    assert "cached before it was measured" in heavy_tail.control.evidence
    assert "the control base could not be judged" in heavy_tail.evidence


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="steer_layers must be"):
        Config(steer_layers=(4,))
    with pytest.raises(ValueError, match="tasks must be"):
        Config(tasks=("lang-noise",))
    with pytest.raises(ValueError, match="deltas must be"):
        Config(deltas=(1.0,))
    with pytest.raises(ValueError, match="check_every must be an integer from 1 to max_steps"):
        Config(max_steps=5, check_every=10)


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny):
    model, data, _ = tiny
    root = tmp_path_factory.mktemp("gss_cli")
    model.save_pretrained(root / "model")
    torch.manual_seed(1)
    LlamaForCausalLM(model.config).save_pretrained(root / "reference")
    (root / "mem.jsonl").write_text(
        "".join(json.dumps({"text": SEPARATOR + r.text}) + "\n" for r in data.memorized)
    )
    (root / "general.txt").write_text("".join(data.held_out))
    return root


def test_cli_fit_eval_generate(folders, capsys):
    r = folders
    args = [
        "--model",
        str(r / "model"),
        "--memorized",
        str(r / "mem.jsonl"),
        "--general",
        str(r / "general.txt"),
    ]
    assert main(["gss", "fit", *args, "--reference", str(r / "reference"), "--layer", "1", "--rank", "2",
                 "--seq-len", "64", "--out", str(r / "steer.safetensors")]) == 0  # fmt: skip
    assert (r / "steer.safetensors").exists()
    assert (
        main(
            [
                "gss",
                "eval",
                *args,
                "--steer",
                str(r / "steer.safetensors"),
                "--prefix",
                "22",
                "--k",
                "12",
                "--seq-len",
                "64",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "extraction" in out
    assert "gate rate on general text" in out
    assert main(["gss", "generate", "--model", str(r / "model"), "--steer", str(r / "steer.safetensors"),
                 "--prompt", "+123:456 ", "--max-new-tokens", "8"]) == 0  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["fit", "--layer", "7", "--out", "X.safetensors"], "layer must be an integer from 0 to 1"),
        (["fit", "--layer", "0", "--rank", "0", "--out", "X.safetensors"], "--rank must be"),
        (
            ["fit", "--layer", "0", "--delta", "1.5", "--out", "X.safetensors"],
            "--delta must be a number in (0, 1)",
        ),
        (["eval", "--prefix", "80", "--k", "20"], "--memorized: record 1 has"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(folders, capsys, extra, message):
    r = folders
    command, *rest = extra
    rest = [str(r / v) if v.endswith(".safetensors") else v for v in rest]
    args = [
        "--model",
        str(r / "model"),
        "--memorized",
        str(r / "mem.jsonl"),
        "--general",
        str(r / "general.txt"),
    ]
    assert main(["gss", command, *args, *rest]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_a_missing_memorized_file_and_a_steer_of_another_width(
    folders, tmp_path, capsys
):
    r = folders
    args = ["--model", str(r / "model"), "--general", str(r / "general.txt")]
    assert main(["gss", "eval", *args, "--memorized", str(tmp_path / "none.jsonl")]) == 2
    assert "--memorized" in capsys.readouterr().err
    from mixlab.llm_efficiency.gss import GSSSteer

    wide = GSSSteer(0, torch.zeros(1, 48), torch.zeros(1, 48), torch.ones(1), torch.ones(1), 0.1)
    wide.save(tmp_path / "wide.safetensors")
    assert (
        main(
            [
                "gss",
                "generate",
                "--model",
                str(r / "model"),
                "--steer",
                str(tmp_path / "wide.safetensors"),
                "--prompt",
                "x",
            ]
        )
        == 2
    )
    assert "steer: fitted on hidden size 48, the model's is 32" in capsys.readouterr().err
