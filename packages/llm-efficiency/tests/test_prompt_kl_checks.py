"""Prompt-KL's experiment (tiny config: runs, regime gating, resume after a kill), config and CLI
(``mixlab-llm prompt_kl``: train / eval / swap / steer, and one-line refusals of bad input)."""

from __future__ import annotations

import pytest
import torch

from mixlab.llm_efficiency.cli import main
from mixlab.llm_efficiency.prompt_kl.config import MATCHED, Config

torch.set_num_threads(1)

TINY = {
    "hidden_size": 32,
    "layers": 2,
    "sft_steps": 30,
    "steps": 3,
    "prompts_per_step": 1,
    "num_generations": 2,
    "n_train": 16,
    "n_test": 6,
    "test_samples": 1,
    "steer_layer": 1,
    "steer_alphas": (1.0,),
    "n_seeds": 1,
    "conditions": (("no KL", 0.0, 0.0), ("response KL 0.1", 0.1, 0.0), ("prompt KL 0.1", 0.0, 0.1)),
}


def _measured(metrics):
    return {k: {m: v for m, v in row.items()} for k, row in metrics.items()}


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.llm_efficiency.prompt_kl import experiment

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(**TINY)
    result = experiment.METHOD.execute(config, tmp_path / "full")  # records its cache uses
    assert result.cache["state"] == "cold"  # its models trained into the empty cache
    assert {"sft", "untrained", "no KL", "prompt KL 0.1", "swap reference prompt"} <= set(
        result.metrics
    )
    assert len({tuple(sorted(row)) for row in result.metrics.values()}) == 1  # same keys everywhere
    assert len(result.regime) == 2
    assert len(result.claims) == 4
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.evidence for c in result.claims)
    assert result.claims[0].premises[0].text.startswith("test_override: swapping")
    if not all(c.holds for c in result.regime):  # a 30-step SFT policy solves nothing
        assert not any(c.tested for c in result.claims)
    for plot in ("hack_rate_over_steps.png", "true_success_over_steps.png", "steering_fronts.png"):
        assert (tmp_path / "full" / plot).exists()

    real, calls = experiment.evaluate_policy, []

    def dies_on_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "evaluate_policy", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "evaluate_policy", real)
    resumed = experiment.METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # every model found in the cache
    assert _measured(resumed.metrics) == _measured(result.metrics)


def _values():
    """Two seeds: prompt KL hacks 5 % and succeeds as no KL does, response KL still hacks, prompt
    steering dominates, and the SFT policy's prompt encoding halves the hack."""
    hack = {"no KL": 0.9, "response KL 0.1": 0.5, "prompt KL 0.1": 0.05}
    values = {name: {"hack_rate": [h, h], "true_success": [0.8, 0.8]} for name, h in hack.items()}
    values[MATCHED] = values["response KL 0.1"] | {"beta_response": [0.1, 0.1]}
    values["sft"] = {"hack_rate": [0.1], "true_success": [0.8]}
    values["prompt steering"] = {"dominated_share": [1.0, 1.0]}
    values["response steering"] = {"dominated_share": [0.5, 0.0]}
    values["prompt swap"] = {"hack_without": [0.2, 0.3], "hack_only": [0.6, 0.7]}
    values["response swap"] = {"hack_without": [0.6, 0.7], "hack_only": [0.2, 0.3]}
    return values


def test_claims_are_judged_per_seed_with_their_controls_and_the_swap_premise():
    from mixlab.llm_efficiency.prompt_kl import experiment

    config, values = Config(**{**TINY, "seed": 4, "n_seeds": 2}), _values()  # seeds 4 and 5
    judged = experiment.claims(values, "test_override", config)
    assert [c.key for c in judged] == [spec.key for spec in Config.CLAIMS]
    assert [c.state for c in judged] == ["holds", "holds", "holds", "holds"]
    assert all(c.per_seed and c.control is not None for c in judged)
    assert judged[0].text.startswith("test_override: prompt KL at beta_p = 0.1")
    values[MATCHED]["hack_rate"] = [0.05, 0.08]  # response KL stops the hack too
    assert experiment.claims(values, "test_override", config)[0].state == "vacuous"
    values["response steering"]["dominated_share"] = [1.0, 1.0]  # the fronts coincide
    assert experiment.claims(values, "test_override", config)[2].state == "vacuous"
    values["prompt swap"]["hack_without"] = [0.2, 0.8]  # one seed still hacks with SFT's prompt
    judged = experiment.claims(values, "test_override", config)
    states = [c.state for c in judged]
    assert states[:2] == ["untested", "untested"]  # the premise of the prompt-KL claims fails
    assert "(seed 5)" in judged[0].premises[0].evidence  # the RL seed, not its index
    assert states[3] == "fails"


def test_the_matched_control_is_the_response_kl_run_nearest_the_prompt_kl_runs_budget():
    """Per seed, the response-KL run whose final response KL is nearest the prompt-KL run's."""
    from mixlab.llm_efficiency.prompt_kl import experiment

    conditions = (("no KL", 0.0, 0.0), ("response KL 0.04", 0.04, 0.0),
                  ("response KL 0.3", 0.3, 0.0), ("prompt KL 0.1", 0.0, 0.1))  # fmt: skip
    config = Config(**{**TINY, "n_seeds": 2, "conditions": conditions})
    final_kl = {"no KL": (0.5, 0.5), "response KL 0.04": (0.3, 0.1),
                "response KL 0.3": (0.05, 0.02), "prompt KL 0.1": (0.25, 0.04)}  # fmt: skip
    hack = {"no KL": 0.9, "response KL 0.04": 0.6, "response KL 0.3": 0.2, "prompt KL 0.1": 0.05}
    done = [{"task": "test_override", "system": "sft", "hack_rate": 0.1, "true_success": 0.8}]
    for name, _, _ in conditions:
        for seed, kl in zip((0, 1), final_kl[name], strict=True):
            curve = [None] * 10 + [kl] * 10  # logged late, as a KL that is not yet measured
            done.append({"task": "test_override", "condition": name, "seed": seed,
                         "hack_rate": hack[name], "true_success": 0.7,
                         "curves": {"response_kl": curve}})  # fmt: skip
    point = {"where": "prompt", "alpha": 1.0, "hack_rate": 0.5, "true_success": 0.5}
    for seed in (0, 1):
        done.append({"task": "test_override", "seed": seed, "diagnostic": True,
                     "front": [point, point | {"where": "response"}],
                     "swap_reference_prompt": {"hack_rate": 0.2},
                     "swap_policy_prompt": {"hack_rate": 0.6}})  # fmt: skip
    values = experiment.per_seed_values(done, "test_override", config)
    assert values[MATCHED]["beta_response"] == [0.04, 0.3]  # 0.25 is nearest 0.3; 0.04 to 0.02
    assert values[MATCHED]["hack_rate"] == [0.6, 0.2]
    judged = experiment.claims(values, "test_override", config)[0]
    assert "beta_response per seed: 0.04, 0.3" in judged.control.evidence


def test_without_prompt_kl_its_claims_go_untested_with_the_reason():
    from mixlab.llm_efficiency.prompt_kl import experiment

    config = Config(**{**TINY, "n_seeds": 2, "conditions": (("no KL", 0.0, 0.0),)})
    values = _values()
    del values["prompt KL 0.1"], values["response KL 0.1"], values[MATCHED]
    judged = experiment.claims(values, "test_override", config)
    assert [c.key for c in judged] == [spec.key for spec in Config.CLAIMS]  # none vanishes
    assert [c.state for c in judged] == ["untested", "untested", "holds", "holds"]
    assert all("the run has no prompt KL 0.1" in c.evidence for c in judged[:2])
    assert judged[0].premises[0].holds  # the premise is still measured and recorded


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="tasks must be"):
        Config(tasks=("jailbreak",))
    with pytest.raises(ValueError, match="num_generations must be an integer >= 2"):
        Config(num_generations=1)
    with pytest.raises(ValueError, match="conditions must be"):
        Config(conditions=(("prompt KL", 0.0, -1.0),))
    with pytest.raises(ValueError, match="steer_layer must be"):
        Config(steer_layer=4)


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

    folder = tmp_path_factory.mktemp("policy")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=256, eos_token_id=257,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    reasoning_tokenizer().save_pretrained(folder)
    return folder


def test_cli_train_eval_swap_steer(policy_folder, tmp_path, capsys):
    out = tmp_path / "trained"
    model = ["--model", str(policy_folder), "--task", "test_override"]
    assert main(["prompt_kl", "train", *model, "--out", str(out), "--steps", "2",
                 "--prompts-per-step", "1", "--num-generations", "2", "--n-train", "8"]) == 0  # fmt: skip
    assert (out / "config.json").exists()
    small = ["--task", "test_override", "--n", "4", "--samples", "1"]
    assert main(["prompt_kl", "eval", "--model", str(out), *small]) == 0
    assert "hack_rate" in capsys.readouterr().out
    assert main(["prompt_kl", "swap", "--prompt-model", str(policy_folder),
                 "--response-model", str(out), *small]) == 0  # fmt: skip
    assert main(["prompt_kl", "steer", "--policy", str(out), "--reference", str(policy_folder),
                 "--layer", "1", "--alpha", "2", "--where", "response", *small]) == 0  # fmt: skip
    assert capsys.readouterr().out.count("true_success") == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--beta-prompt", "-1"], "--beta-prompt"),
        (["--direction", "up"], "--direction"),
        (["--positions", "some"], "--positions"),
        (["--num-generations", "1"], "--num-generations"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(policy_folder, tmp_path, capsys, extra, message):
    args = ["prompt_kl", "train", "--model", str(policy_folder), "--task", "test_override",
            "--out", str(tmp_path / "o"), *extra]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_an_unknown_task_and_a_missing_model(policy_folder, tmp_path, capsys):
    assert main(["prompt_kl", "eval", "--model", str(policy_folder), "--task", "jailbreak"]) == 2
    assert "--task" in capsys.readouterr().err
    assert main(["prompt_kl", "eval", "--model", str(tmp_path / "none"), "--task", "keyword"]) == 2
    assert "--model" in capsys.readouterr().err
