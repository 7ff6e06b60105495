"""RPDI-EE's experiment (tiny config: runs, regime gating, resume after a kill) and its CLI
(``mixlab-llm rpdi_ee``: generate / eval / sweep, and one-line refusals of bad input)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mixlab.llm_efficiency.cli import main
from mixlab.llm_efficiency.rpdi_ee.config import Config

torch.set_num_threads(1)

TINY = dict(
    hidden_size=32, layers=1, lm_steps=10, n_traces=100, n_val=6, n_test=8, n_seeds=2,
    batch_size=8, max_new_tokens=40, windows=(4,), thresholds=(1.5,), deer_thresholds=(0.9,),
    dynasor_intervals=(8,), eat_thresholds=(0.01,), budgets=(16,),
)  # fmt: skip


def _without_time(metrics):
    return {
        s: {k: v for k, v in row.items() if not k.startswith("seconds")}
        for s, row in metrics.items()
    }


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.llm_efficiency.rpdi_ee import experiment

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(**TINY)
    result = experiment.METHOD.execute(config, tmp_path / "full")  # records its cache uses
    assert result.cache["state"] == "cold"  # its models trained into the empty cache
    assert set(result.metrics) == set(experiment.SYSTEMS)
    assert all(row["seeds"] == 2 for row in result.metrics.values())
    assert result.metrics["rpdi"]["window"] == 4
    assert result.metrics["vanilla"]["window"] is None
    assert result.metrics["rpdi"]["probe_tokens"] == 0
    assert len(result.regime) == 3
    assert len(result.claims) == 4
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.evidence for c in result.claims)
    regime_holds = all(check.holds for check in result.regime)
    assert all(claim.tested == regime_holds for claim in result.claims)  # a 10-step toy: gated
    assert (tmp_path / "full" / "accuracy_vs_forward_tokens.png").exists()

    calls = {"n": 0}
    real = experiment.generate_all

    def dies_on_the_fourth(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "generate_all", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "generate_all", real)
    resumed = experiment.METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # every model found in the cache
    assert _without_time(resumed.metrics) == _without_time(result.metrics)


def test_regime_is_computed_from_metrics():
    from mixlab.llm_efficiency.rpdi_ee import experiment

    row = dict.fromkeys(
        ["accuracy", "think_tokens", "probe_tokens", "seconds_per_problem"], 1.0
    ) | {"productive_wait_rate": 0.3, "premature_exit_rate": 0.0}
    metrics = {s: dict(row) for s in experiment.SYSTEMS}
    metrics["first_answer"]["accuracy"] = 0.9
    metrics["vanilla"]["accuracy"] = 0.7
    assert all(check.holds for check in experiment.regime(metrics))
    metrics["vanilla"]["accuracy"] = 0.85  # overthinking no longer hurts by 10 points
    assert [c.holds for c in experiment.regime(metrics)] == [True, False, True]


def _values(**systems):
    """Two seeds per system and measured value: every system at 1.0 unless ``systems`` says."""
    from mixlab.llm_efficiency.rpdi_ee import experiment

    names = ("accuracy", "think_tokens", "probe_tokens", "seconds_per_problem",
             "premature_exit_rate")  # fmt: skip
    values = {s: {n: [1.0, 1.0] for n in names} for s in experiment.SYSTEMS}
    for system, changes in systems.items():
        values[system].update(changes)
    return values


def test_claims_are_judged_per_seed_with_their_controls():
    from mixlab.llm_efficiency.rpdi_ee import experiment

    values = _values(
        dynasor={"accuracy": [0.7, 0.7]},
        eat={"accuracy": [0.7, 0.7]},
        vanilla={"accuracy": [0.6, 0.6], "think_tokens": [100.0, 100.0]},
        rpdi={"accuracy": [0.8, 0.8], "think_tokens": [70.0, 70.0], "probe_tokens": [0.0, 0.0],
              "seconds_per_problem": [1.0, 1.0], "premature_exit_rate": [0.0, 0.0]},
        deer={"accuracy": [0.7, 0.7], "seconds_per_problem": [2.0, 2.0],
              "premature_exit_rate": [0.2, 0.2]},
        budget={"accuracy": [0.7, 0.7], "think_tokens": [100.0, 100.0],
                "probe_tokens": [0.0, 0.0], "premature_exit_rate": [0.5, 0.5]},
    )  # fmt: skip
    config = Config(seed=5, n_seeds=2)  # the values' two sampling seeds are 5 and 6
    judged = experiment.claims(values, config)
    assert [c.key for c in judged] == [spec.key for spec in Config.CLAIMS]
    assert [c.state for c in judged] == ["holds", "holds", "vacuous", "holds"]
    assert all(c.per_seed and c.control is not None for c in judged)
    # the fixed budget also spends no probe tokens and beats DEER's wall time: vacuous
    assert judged[2].control.system == "budget"
    assert judged[2].control.holds
    values["rpdi"]["think_tokens"] = [70.0, 90.0]  # only 10 % fewer on the second seed
    failed = experiment.claims(values, config)[0]
    assert failed.state == "fails"
    assert "(seed 6)" in failed.evidence  # the sampling seed, not its index
    values["rpdi"]["think_tokens"] = [70.0, 70.0]
    values["budget"].update(accuracy=[0.65, 0.7], think_tokens=[60.0, 60.0])  # the control gains
    assert experiment.claims(values, config)[0].state == "vacuous"
    values["vanilla"]["accuracy"] = [0.75, 0.75]  # vanilla beats every early exit too
    assert experiment.claims(values, config)[1].state == "vacuous"


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("windows", (), "windows"),
        ("thresholds", (0.0,), "thresholds"),
        ("deer_thresholds", (1.5,), "deer_thresholds"),
        ("max_chain", 2, "max_chain"),
        ("hidden_size", 48, "hidden_size"),
        ("temperature", 0.0, "temperature"),
    ],
)
def test_config_refuses_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        Config(**{field: value})


def test_quick_config_is_the_default_reasoning_lm():
    from mixlab.llm_efficiency.reasoning import ReasoningLMConfig

    assert Config().lm_config() == ReasoningLMConfig()  # the same cached toy


# ------------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random tiny Llama with the reasoning tokenizer, saved as a Hugging Face folder."""
    from transformers import LlamaForCausalLM

    from mixlab.llm_efficiency.lm import LMConfig, llama_config
    from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

    folder = tmp_path_factory.mktemp("model")
    torch.manual_seed(0)
    config = llama_config(
        LMConfig(hidden_size=32, layers=1, heads=2, intermediate_size=64),
        vocab_size=260,
        eos_token_id=257,
        pad_token_id=256,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    reasoning_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from mixlab.llm_efficiency.reasoning import problems

    path = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    lines = [json.dumps({"prompt": p.model_input, "answer": str(p.answer)}) for p in problems(4, 0)]
    path.write_text("\n".join(lines) + "\n")
    return path


FAST = ["--max-new-tokens", "16", "--batch-size", "4"]


def test_cli_generate_eval_and_sweep(model_dir, tasks, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    args = ["rpdi_ee", "generate", "--model", str(model_dir), "--prompts", str(tasks)]
    assert main([*args, "--out", str(out), "--window", "2", "--threshold", "1.01", *FAST]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4
    assert {"prompt", "text", "exit_step", "think_tokens"} <= set(rows[0])
    capsys.readouterr()
    table = tmp_path / "table.json"
    evaluate = ["rpdi_ee", "eval", "--model", str(model_dir), "--tasks", str(tasks), *FAST]
    methods = "vanilla,budget,rpdi,deer,dynasor,eat"
    assert main([*evaluate, "--methods", methods, "--budget", "4", "--out", str(table)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[1:]] == methods.split(",")
    saved = json.loads(table.read_text())
    assert [r["method"] for r in saved] == methods.split(",")
    assert all(0 <= r["accuracy"] <= 1 and r["forward_tokens"] >= r["think_tokens"] for r in saved)
    assert saved[1]["think_tokens"] <= 4
    sweep = ["rpdi_ee", "sweep", "--model", str(model_dir), "--tasks", str(tasks), *FAST]
    assert (
        main([*sweep, "--out", str(tmp_path / "s"), "--windows", "2,4", "--thresholds", "1.1"]) == 0
    )
    lines = (tmp_path / "s" / "sweep.csv").read_text().splitlines()
    assert len(lines) == 1 + 1 + 2  # header, vanilla, 2 x 1 grid
    assert (tmp_path / "s" / "pareto.png").exists()


@pytest.fixture(scope="module")
def no_think_dir(tmp_path_factory, model_dir):
    """The same model with a tokenizer that has no </think> token."""
    import shutil

    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("plain")
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, folder / name)
    backend = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(folder)
    return folder


def test_cli_refuses_bad_input_in_one_line(model_dir, no_think_dir, tasks, tmp_path, capsys):
    out = str(tmp_path / "o.jsonl")
    base = ["rpdi_ee", "generate", "--model", str(model_dir), "--prompts", str(tasks), "--out", out]
    not_jsonl = tmp_path / "p.jsonl"
    not_jsonl.write_text("prompt: hello\n")
    no_prompt = tmp_path / "q.jsonl"
    no_prompt.write_text(json.dumps({"text": "hello"}) + "\n")
    (tmp_path / "empty_model").mkdir()
    cases = [
        (["--window", "0"], "--window must be an integer >= 1"),
        (["--threshold", "0"], "--threshold must be a finite number > 0"),
        (["--threshold", "-1"], "--threshold must be"),
        (["--min-steps", "-1"], "--min-steps must be an integer >= 0"),
        (["--prompts", str(not_jsonl)], "--prompts: "),
        (["--prompts", str(no_prompt)], "has no 'prompt'"),
        (["--model", str(tmp_path / "empty_model")], "has no config.json"),
        (["--model", str(no_think_dir)], "--think-end: the tokenizer of"),
        (["--out", str(tmp_path / "o.txt")], "--out must end in .jsonl"),
    ]
    for extra, fragment in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, (extra, err)
        assert fragment in err[0], (extra, err)
    evaluate = ["rpdi_ee", "eval", "--model", str(model_dir), "--tasks", str(tasks)]
    assert main([*evaluate, "--methods", "vanilla,magic"]) == 2
    assert "--methods must name methods of" in capsys.readouterr().err
    assert main([*evaluate, "--methods", " , "]) == 2  # nothing to evaluate (issue 80)
    assert "--methods must name at least one of" in capsys.readouterr().err
    no_answer = tmp_path / "t.jsonl"
    no_answer.write_text(json.dumps({"prompt": "x"}) + "\n")
    assert main(["rpdi_ee", "eval", "--model", str(model_dir), "--tasks", str(no_answer)]) == 2
    assert "has no 'answer'" in capsys.readouterr().err
    assert math.isinf(float("inf"))  # --threshold inf is refused: finite only on the CLI
    assert main([*base, "--threshold", "inf"]) == 2
    capsys.readouterr()
