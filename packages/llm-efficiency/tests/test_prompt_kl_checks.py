"""Prompt-KL's experiment (tiny config: runs, regime gating, resume after a kill), config and CLI
(``mixlab-llm prompt_kl``: train / eval / swap / steer, and one-line refusals of bad input)."""

from __future__ import annotations

import pytest
import torch

from mixlab.llm_efficiency.cli import main
from mixlab.llm_efficiency.prompt_kl.config import Config

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
    result = experiment.run(config, tmp_path / "full")
    assert {"sft", "untrained", "no KL", "prompt KL 0.1", "swap reference prompt"} <= set(
        result.metrics
    )
    assert len({tuple(sorted(row)) for row in result.metrics.values()}) == 1  # same keys everywhere
    assert len(result.regime) == 2
    assert len(result.claims) == 4
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
    resumed = experiment.run(config, tmp_path / "killed", resume=True)
    assert _measured(resumed.metrics) == _measured(result.metrics)


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
