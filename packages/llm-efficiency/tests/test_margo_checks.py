"""MARGO's world (formats, splits, tokenizer), experiment (tiny config: runs, regime gating,
resume after a kill), config, CLI (``mixlab-llm margo``: train / eval / world and one-line
refusals) and two processes under ``accelerate launch``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mixlab.llm_efficiency.cli import main
from mixlab.llm_efficiency.margo.config import QUICK_CONDITIONS, Config
from mixlab.llm_efficiency.margo.world import (
    DIRECT_PREFIX,
    THINKING_PREFIX,
    World,
    WorldConfig,
    final_answer,
    questions,
    sft_texts,
    think_length,
    world_tokenizer,
)

torch.set_num_threads(1)

SMALL = WorldConfig(n_people=12, n_cities=4, n_countries=2, n_math=8, repeats=1)


# -- the world ---------------------------------------------------------------------------------


def test_the_world_holds_its_facts_and_splits_people():
    world = World.build(SMALL)
    assert World.build(SMALL) == world  # seeded
    assert len(world.held_out) == 4
    assert set(world.train_people).isdisjoint(world.held_out)
    assert all(world.city[world.colleague[p]] != world.city[p] for p in world.people)
    assert set(world.country.values()) == set(world.countries)  # every country has a city
    one = questions(world, "test", "1hop")
    assert {q.prompt.split()[2] for q in one} == world.held_out
    assert all(q.associate == world.city[world.colleague[q.prompt.split()[2]]] for q in one)
    two = questions(world, "train", "2hop")[0]
    assert two.answer == world.country[world.city[two.prompt.split()[2]]]
    math = questions(world, "test", "math", n_math=5, seed=2)
    assert len(math) == 5
    assert all(q.answer.isdigit() for q in math)


def test_sft_texts_teach_both_modes_and_drift_to_the_colleague():
    world = World.build(SMALL)
    pairs = sft_texts(world)
    thinking = [(p, c) for p, c in pairs if p.endswith(THINKING_PREFIX)]
    direct = [(p, c) for p, c in pairs if p.endswith(DIRECT_PREFIX)]
    assert thinking
    assert direct
    assert all(c.endswith("<eos>") for _, c in pairs)
    drifts = [c for p, c in thinking if " works with " in c]
    for completion in drifts:  # the drift answers the colleague's city
        colleague = completion.split()[2]
        assert final_answer(completion.removesuffix(" <eos>"), True) == world.city[colleague]
    held = [p for p, _ in thinking if p.split()[0] != "calc" and p.split()[2] in world.held_out]
    assert held == []  # no thinking demonstration for a held-out person
    assert final_answer(" lives in x . </think> x", thinking=True) == "x"
    assert final_answer(" lives in x .", thinking=True) is None  # an unfinished thought
    assert final_answer(" x", thinking=False) == "x"
    assert think_length(" lives in x . </think> x") == 4


def test_the_word_tokenizer_keeps_think_tags_when_decoding():
    world = World.build(SMALL)
    tokenizer = world_tokenizer(world)
    p = world.people[0]
    text = f"city of {p} ?{THINKING_PREFIX} lives in {world.city[p]} . </think> {world.city[p]}"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.eos_token_id  # <eos> doubles as the BOS
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == " ".join(text.split())


# -- the experiment ----------------------------------------------------------------------------

TINY = {
    "n_people": 12,
    "n_cities": 4,
    "n_countries": 2,
    "hidden_size": 32,
    "layers": 1,
    "sft_steps": 20,
    "steps": 2,
    "prompts_per_step": 1,
    "num_generations": 4,
    "n_math_test": 4,
    "test_samples": 1,
    "probe_every": 1,
    "n_seeds": 1,
    "conditions": (
        ("GRPO think-only", 0, 0.0, False),
        ("mixed lambda=0", 2, 0.0, False),
        ("MARGO lambda=1", 2, 1.0, False),
    ),
}


def test_experiment_runs_gates_and_resumes_after_a_kill(tmp_path, monkeypatch):
    from mixlab.llm_efficiency.margo import experiment

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(**TINY)
    result = experiment.METHOD.execute(config, tmp_path / "full")  # records its cache uses
    assert result.cache["state"] == "cold"  # its models trained into the empty cache
    assert set(result.metrics) == {"SFT", "GRPO think-only", "mixed lambda=0", "MARGO lambda=1"}
    assert len(result.regime) == 3
    assert len(result.claims) == 6
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.evidence for c in result.claims)
    assert [c.control.system for c in result.claims] == [spec.control for spec in Config.CLAIMS]
    if not all(c.holds for c in result.regime):  # a 20-step SFT model knows nothing
        assert not any(c.tested for c in result.claims)
    for plot in ("overturn_over_steps.png", "accuracy_over_steps.png"):
        assert (tmp_path / "full" / plot).exists()
    cells = json.loads((tmp_path / "full" / "cells.json").read_text())
    assert cells[1]["curves"]["probe_step"] == [1.0, 2.0]

    real, calls = experiment.evaluate, []

    def dies_on_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "evaluate", dies_on_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        experiment.run(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "evaluate", real)
    resumed = experiment.METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # every model found in the cache
    assert resumed.metrics == result.metrics


def _values():
    """Two seeds per condition: MARGO lambda=1 (two- and one-sided) clearly ahead of think-only
    and mixed lambda=0 on every claim; SFT's values, one each."""
    from mixlab.llm_efficiency.margo import experiment

    def row(overturn, qa):
        return {m: [1.0, 1.0] for m in experiment.METRICS} | {
            "overturn_1hop": overturn, "thinking_qa": qa, "thinking_2hop": [0.6, 0.6],
            "thinking_math": [0.5, 0.5], "think_length_2hop": [8.0, 8.0],
            "think_length_math": [8.0, 8.0],
        }  # fmt: skip

    return {
        "SFT": {m: [1.0] for m in experiment.METRICS} | {
            "overturn_1hop": [0.3], "thinking_2hop": [0.6], "thinking_math": [0.5],
            "think_length_2hop": [8.0], "think_length_math": [8.0],
        },
        "GRPO think-only": row([0.14, 0.12], [0.50, 0.52]),
        "mixed lambda=0": row([0.20, 0.13], [0.51, 0.53]),
        "MARGO lambda=1": row([0.05, 0.06], [0.60, 0.58]),
        "MARGO lambda=1 one-sided": row([0.05, 0.06], [0.60, 0.58]),
    }  # fmt: skip


def test_claims_are_judged_per_seed_against_their_controls():
    from mixlab.llm_efficiency.margo import experiment

    config = Config(conditions=QUICK_CONDITIONS, seed=3, n_seeds=2)  # seeds 3 and 4
    values = _values()
    judged = experiment.claims(values, config)
    assert len(judged) == 12  # six claims for each of the two MARGO conditions
    assert [c.key for c in judged[:6]] == [spec.key for spec in Config.CLAIMS]
    assert judged[6].text.startswith("MARGO lambda=1 one-sided: the 1-hop overturn rate")
    assert all(c.per_seed for c in judged)
    controls = {c.key: c.control.system for c in judged}
    assert controls.pop("qa_beats_mixed") == "GRPO think-only"
    assert set(controls.values()) == {"mixed lambda=0"}
    # mixed lambda=0 keeps SFT's 2-hop, arithmetic and think length too: vacuous
    assert [c.state for c in judged[:6]] == [
        "holds", "holds", "holds", "vacuous", "vacuous", "vacuous"
    ]  # fmt: skip
    values["mixed lambda=0"]["overturn_1hop"] = [0.12, 0.11]  # lambda=0 suppresses it as well
    assert experiment.claims(values, config)[0].state == "vacuous"
    values["MARGO lambda=1"]["overturn_1hop"] = [0.05, 0.13]  # one seed above think-only's
    failed = experiment.claims(values, config)[0]
    assert failed.state == "fails"
    assert "(seed 4)" in failed.evidence  # the seed the run trained, not its index


def test_qa_claims_compare_each_reference_with_its_own_control():
    """Beating mixed lambda=0 is vacuous when think-only beats it too; beating think-only by the
    margin is vacuous when mixed lambda=0 does too. Neither compares a system with itself."""
    from mixlab.llm_efficiency.margo import experiment

    config = Config(conditions=QUICK_CONDITIONS, n_seeds=2)
    values = _values()
    values["GRPO think-only"]["thinking_qa"] = [0.54, 0.54]  # think-only above mixed lambda=0
    judged = {c.key: c for c in experiment.claims(values, config)[:6]}
    assert judged["qa_beats_mixed"].state == "vacuous"
    assert "GRPO think-only thinking accuracy" in judged["qa_beats_mixed"].control.evidence
    assert judged["qa_beats_think_only"].state == "holds"
    values["mixed lambda=0"]["thinking_qa"] = [0.58, 0.59]  # lambda=0 clears think-only + 2 too
    judged = {c.key: c for c in experiment.claims(values, config)[:6]}
    assert judged["qa_beats_think_only"].state == "vacuous"
    assert judged["qa_beats_mixed"].state == "fails"  # 0.58 is not above 0.59 on seed 1


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="including 'mixed lambda=0'"):
        Config(conditions=(("GRPO think-only", 0, 0.0, False), ("MARGO", 4, 1.0, False)))
    with pytest.raises(ValueError, match="including 'GRPO think-only'"):
        Config(conditions=(("mixed lambda=0", 4, 0.0, False), ("MARGO", 4, 1.0, False)))
    with pytest.raises(ValueError, match="conditions must be"):
        Config(conditions=(("MARGO", 0, 1.0, False),))  # lambda without direct rollouts
    with pytest.raises(ValueError, match="conditions must be"):
        Config(conditions=(("MARGO", 4, -1.0, False),))
    with pytest.raises(ValueError, match="num_generations must be an integer >= 2"):
        Config(num_generations=1)
    with pytest.raises(ValueError, match="n_countries must be"):
        Config(n_cities=4, n_countries=5)
    with pytest.raises(ValueError, match="rl_mix must be"):
        Config(rl_mix=(0, 0, 0))


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("model")
    tokenizer = world_tokenizer(World.build(Config().policy_config().world))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_cli_world_train_eval(model_folder, tmp_path, capsys):
    data = tmp_path / "q.jsonl"
    assert main(["margo", "world", "--out", str(data), "--split", "train", "--kind", "1hop"]) == 0
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == 160
    assert {"prompt", "answer"} <= set(rows[0])
    out = tmp_path / "trained"
    prefixes = ["--thinking-prefix", THINKING_PREFIX]
    assert main(["margo", "train", "--model", str(model_folder), "--data", str(data), "--out",
                 str(out), "--lambda", "1", "--one-sided", "--steps", "2", "--prompts-per-step",
                 "1", "--num-generations", "4", "--num-direct", "2", *prefixes]) == 0  # fmt: skip
    assert (out / "config.json").exists()
    capsys.readouterr()
    assert main(["margo", "eval", "--model", str(out), "--data", str(data), "--samples", "1",
                 *prefixes]) == 0  # fmt: skip
    line = capsys.readouterr().out
    assert line.startswith("1hop (160 questions): thinking_accuracy")
    assert "overturn_rate" in line
    assert "think_length" in line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lambda", "-1"], "--lambda"),
        (["--num-direct", "0"], "--lambda must be 0 when --num-direct is 0"),
        (["--num-direct", "8"], "--num-direct"),
        (["--num-generations", "1"], "--num-generations"),
    ],
)
def test_cli_refuses_bad_input_in_one_line(model_folder, tmp_path, capsys, extra, message):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"prompt": "city of x ?", "answer": "y"}) + "\n")
    args = ["margo", "train", "--model", str(model_folder), "--data", str(data),
            "--out", str(tmp_path / "o"), *extra]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_refuses_data_without_prompt_or_answer_and_a_missing_model(model_folder, tmp_path,
                                                                       capsys):  # fmt: skip
    data = tmp_path / "q.jsonl"
    for row, column in (({"answer": "y"}, "'prompt'"), ({"prompt": "x"}, "'answer'")):
        data.write_text(json.dumps(row) + "\n")
        assert main(["margo", "eval", "--model", str(model_folder), "--data", str(data)]) == 2
        err = capsys.readouterr().err
        assert f"--data: line 1 of {str(data)!r} has no {column}" in err
        assert len(err.strip().splitlines()) == 1
    wrong = (({"prompt": 3, "answer": "y"}, ": 'prompt' must be non-empty text"),
             ({"prompt": "x", "answer": ["y"]}, " has no 'answer' (text)"))  # fmt: skip
    for row, message in wrong:  # a row of wrong types trained 0 steps and exited 0 (issue 80)
        data.write_text(json.dumps(row) + "\n")
        assert main(["margo", "train", "--model", str(model_folder), "--data", str(data),
                     "--out", str(tmp_path / "o")]) == 2  # fmt: skip
        assert f"--data: line 1 of {str(data)!r}{message}" in capsys.readouterr().err
    data.write_text(json.dumps({"prompt": "city of x ?", "answer": "y"}) + "\n")
    assert main(["margo", "eval", "--model", str(tmp_path / "none"), "--data", str(data)]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["margo", "world", "--out", str(data), "--kind", "3hop"]) == 2
    assert "--kind" in capsys.readouterr().err


# -- two processes -----------------------------------------------------------------------------


def test_groups_hold_under_accelerate_launch_with_two_processes(tmp_path):
    """Two CPU processes under ``accelerate launch``. Its ``--cpu`` launcher starts several
    processes only through mpirun; ``--multi_gpu`` goes through torchrun, which on a machine
    without GPUs starts CPU processes that talk over gloo (the trainer runs with use_cpu)."""
    script = Path(__file__).with_name("margo_two_processes.py")
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                        "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    with socket.socket() as probe:  # a free port, not torchrun's fixed 29500 another run may hold
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
              "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--main_process_port", str(port),
              str(script), str(tmp_path)]  # fmt: skip
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]  # a child's own error sits above the summary
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 2  # one generation per 3 steps
    for local0, local1 in zip(*ranks, strict=True):
        rows = local0 + local1  # the global batch: process 0's rows, then process 1's
        assert len(rows) == 12  # 2 processes x 2 rows x 3 steps per generation
        for start in range(0, 12, 4):  # 3 groups of 4; the middle one spans both processes
            group = rows[start : start + 4]
            assert len({prompt for prompt, _ in group}) == 1
            assert [text.endswith(DIRECT_PREFIX) for _, text in group] == [False] * 3 + [True]


def test_a_cut_tokenizer_is_one_line_and_exit_2(model_folder, tmp_path, capsys):
    """Issue 80: a truncated tokenizer.json of a --model folder was a traceback."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_folder, broken)
    tokenizer = broken / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes()[: len(tokenizer.read_bytes()) // 2])
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"prompt": "city of x ?", "answer": "y"}) + "\n")
    assert main(["margo", "eval", "--model", str(broken), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert "damaged or not a tokenizer folder" in err
    assert len(err.splitlines()) == 1


def test_a_damaged_trainer_checkpoint_is_refused_by_name(tmp_path):
    """Issue 80: a cut optimizer.pt (or trainer_state.json) of a TRL checkpoint was a traceback
    from inside Trainer.train; now resuming names the file first."""
    from safetensors.torch import save_file

    from mixlab.llm_efficiency.rl import latest_trainer_checkpoint
    from mixlab.shared.files import CheckpointError

    assert latest_trainer_checkpoint(tmp_path / "none") is None
    checkpoint = tmp_path / "out" / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    torch.save({"state": {}, "param_groups": []}, checkpoint / "optimizer.pt")
    save_file({"w": torch.ones(3)}, str(checkpoint / "model.safetensors"))
    assert latest_trainer_checkpoint(tmp_path / "out") == str(checkpoint)
    optimizer = checkpoint / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:30])
    with pytest.raises(CheckpointError, match="optimizer.pt: damaged or not a Trainer checkpoint"):
        latest_trainer_checkpoint(tmp_path / "out")
    torch.save({"state": {}}, optimizer)
    (checkpoint / "trainer_state.json").write_text("{cut")
    with pytest.raises(CheckpointError, match="trainer_state.json: damaged"):
        latest_trainer_checkpoint(tmp_path / "out")
