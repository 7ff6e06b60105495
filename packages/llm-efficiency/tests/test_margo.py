"""MARGO's advantage (hand-computed group, one-sided bound, equal rewards, TRL equivalence at
lambda = 0), the trainer's mixed-mode groups (rendering, positions, steps_per_generation > 1,
resume) and its refusals, on tiny random Llamas and the world's word tokenizer."""

from __future__ import annotations

import shutil

import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOTrainer

from mixlab.llm_efficiency.margo import MARGOConfig, MARGOTrainer, margo_advantages
from mixlab.llm_efficiency.margo.advantages import nanstd
from mixlab.llm_efficiency.margo.trainer import check_trl_version
from mixlab.llm_efficiency.margo.world import (
    DIRECT_PREFIX,
    THINKING_PREFIX,
    World,
    WorldConfig,
    questions,
    world_tokenizer,
)

torch.set_num_threads(1)

WORLD = World.build(WorldConfig(n_people=12, n_cities=4, n_countries=2))
QWEN_LIKE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)


def tiny_llama(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return LlamaForCausalLM(config)


@pytest.fixture
def tokenizer():
    return world_tokenizer(WORLD)


def rows(n: int = 8) -> list[dict]:
    return [q.row() for q in questions(WORLD, "train", "1hop")[:n]]


def margo_args(out, **kwargs) -> MARGOConfig:
    defaults = dict(
        output_dir=str(out), per_device_train_batch_size=8, num_generations=4, num_direct=2,
        max_completion_length=6, learning_rate=1e-2, max_steps=2, save_steps=2,
        logging_steps=1, report_to=[], disable_tqdm=True, use_cpu=True, seed=0, bf16=False,
        gradient_checkpointing=False, thinking_prefix=THINKING_PREFIX,
        direct_prefix=DIRECT_PREFIX, margo_lambda=1.0,
    )  # fmt: skip
    return MARGOConfig(**(defaults | kwargs))


def trainer_for(out, tokenizer, reward=None, data=None, **kwargs) -> MARGOTrainer:
    return MARGOTrainer(
        model=tiny_llama(len(tokenizer)),
        reward_funcs=reward,
        args=margo_args(out, **kwargs),
        train_dataset=Dataset.from_list(data if data is not None else rows()),
        processing_class=tokenizer,
    )


# -- the advantage -------------------------------------------------------------------------------


def test_a_hand_computed_group():
    # thinking r = 1, 0, 0; direct r = 1, 1: mean 0.6, sample std sqrt(0.3), direct mean 1
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    direct = torch.tensor([False, False, False, True, True])
    sigma = 0.3**0.5 + 1e-4
    grpo = (rewards - 0.6) / sigma
    two = margo_advantages(rewards, direct, 5, 1.0)
    expected = grpo + torch.tensor([0.0, -1.0, -1.0, 0.0, 0.0]) / sigma
    assert torch.allclose(two, expected, atol=1e-6)
    half = margo_advantages(rewards, direct, 5, 0.5, one_sided=True)
    assert torch.allclose(half, grpo + torch.tensor([0.0, -0.5, -0.5, 0.0, 0.0]) / sigma, atol=1e-6)
    # direct mean 0: two-sided rewards the thinking that recovered the answer, one-sided does not
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    direct = torch.tensor([False, False, True, True])
    sigma = float(nanstd(rewards)) + 1e-4
    two = margo_advantages(rewards, direct, 4, 1.0)
    assert float(two[0]) == pytest.approx(((1 - 0.25) + 1.0) / sigma, abs=1e-5)
    one = margo_advantages(rewards, direct, 4, 1.0, one_sided=True)
    assert float(one[0]) == pytest.approx((1 - 0.25) / sigma, abs=1e-5)


def test_one_sided_never_raises_a_thinking_advantage_and_equal_rewards_give_zero():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        rewards = torch.randint(0, 3, (24,), generator=generator).float()
        direct = (torch.arange(24) % 6) >= 4
        base = margo_advantages(rewards, direct, 6, 0.0)
        for lam in (0.5, 1.0, 2.0):
            one = margo_advantages(rewards, direct, 6, lam, one_sided=True)
            assert (one[~direct] <= base[~direct] + 1e-6).all()
            assert torch.equal(one[direct], base[direct])  # direct rows are GRPO either way
    for scale in ("group", "batch", "none"):
        equal = margo_advantages(torch.full((12,), 0.7), (torch.arange(12) % 4) >= 2, 4, 2.0,
                                 scale=scale)  # fmt: skip
        assert torch.equal(equal, torch.zeros(12))


def test_groups_without_a_direct_rollout_fall_back_to_grpo_or_raise():
    rewards = torch.tensor([1.0, 0.0, float("nan"), float("nan")])
    direct = torch.tensor([False, False, True, True])  # both direct rollouts unscorable
    assert torch.allclose(margo_advantages(rewards, direct, 4, 1.0),
                          margo_advantages(rewards, direct, 4, 0.0))  # fmt: skip
    assert margo_advantages(rewards, direct, 4, 0.0)[2:].eq(0).all()  # unscorable: 0, as TRL
    with pytest.raises(ValueError, match="no scored direct rollout"):
        margo_advantages(rewards, direct, 4, 1.0, missing_direct="error")
    with pytest.raises(ValueError, match="lam must be a finite number >= 0"):
        margo_advantages(rewards, direct, 4, -1.0)


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_lambda_zero_equals_trls_own_advantages_on_the_mixed_group(
    tmp_path, tokenizer, monkeypatch, scale
):
    trl_advantages, ours = [], []
    trl_method = GRPOTrainer._generate_and_score_completions
    margo_method = MARGOTrainer._generate_and_score_completions

    def trl_spy(self, inputs):
        out = trl_method(self, inputs)
        trl_advantages.append(out["advantages"].clone())
        return out

    def margo_spy(self, inputs):
        out = margo_method(self, inputs)
        ours.append(out["advantages"].clone())
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", trl_spy)
    monkeypatch.setattr(MARGOTrainer, "_generate_and_score_completions", margo_spy)

    def length_reward(prompts, completions, **kwargs):  # varied rewards: nonzero advantages
        return [float(len(c.split()) % 3) for c in completions]

    trainer = trainer_for(tmp_path, tokenizer, reward=length_reward, margo_lambda=0.0,
                          scale_rewards=scale, save_strategy="no")  # fmt: skip
    trainer.train()
    assert len(ours) == len(trl_advantages) == 2
    for theirs, mine in zip(trl_advantages, ours, strict=True):
        assert mine.abs().sum() > 0
        assert torch.allclose(mine, theirs, atol=1e-6)


# -- the trainer: modes and groups ---------------------------------------------------------------


def record_rows(monkeypatch):
    """Spy on the rendering: (dataset prompt, rendered text) of every row, in batch order."""
    seen = []
    render = MARGOTrainer.render

    def spy(self, prompts, direct):
        texts = render(self, prompts, direct)
        seen.append(list(zip(prompts, texts, strict=True)))
        return texts

    monkeypatch.setattr(MARGOTrainer, "render", spy)
    return seen


@pytest.mark.parametrize("steps_per_generation", [1, 2])
def test_each_group_has_exactly_num_direct_direct_rows(tmp_path, tokenizer, monkeypatch,
                                                       steps_per_generation):  # fmt: skip
    seen = record_rows(monkeypatch)
    modes = []

    def mode_reward(prompts, completions, mode, **kwargs):
        modes.append(list(mode))
        return [0.0] * len(completions)

    trainer = trainer_for(tmp_path, tokenizer, reward=mode_reward, num_generations=4,
                          num_direct=1, steps_per_generation=steps_per_generation,
                          save_strategy="no")  # fmt: skip
    trainer.train()
    assert seen
    for batch, batch_modes in zip(seen, modes, strict=True):
        assert len(batch) == 8 * steps_per_generation
        for start in range(0, len(batch), 4):
            group = batch[start : start + 4]
            assert len({prompt for prompt, _ in group}) == 1  # one prompt per group
            rendered = [text for _, text in group]
            assert [t.endswith(DIRECT_PREFIX) for t in rendered] == [False, False, False, True]
            assert all(t.endswith(THINKING_PREFIX) for t in rendered[:3])
            assert batch_modes[start : start + 4] == ["thinking"] * 3 + ["direct"]


def test_the_direct_prompt_renders_the_empty_think_block(tmp_path, tokenizer):
    plain = trainer_for(tmp_path / "plain", tokenizer, direct_prefix=None, thinking_prefix="")
    texts = plain.render(["city of x ?", "city of x ?"], [False, True])
    assert texts == ["city of x ?", "city of x ?<think>\n\n</think>\n\n"]
    ids = tokenizer(texts[1])["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids[-2:]) == ["<think>", "</think>"]

    tokenizer.chat_template = QWEN_LIKE
    chat = [q | {"prompt": [{"role": "user", "content": q["prompt"]}]} for q in rows()]
    by_kwargs = trainer_for(tmp_path / "chat", tokenizer, data=chat, direct_prefix=None,
                            thinking_prefix="", direct_chat_template_kwargs={"enable_thinking": False})  # fmt: skip
    message = [{"role": "user", "content": "city of x ?"}]
    thinking, direct = by_kwargs.render([message, message], [False, True])
    assert thinking == "<|user|>city of x ?\n<|assistant|>"
    assert direct == "<|user|>city of x ?\n<|assistant|><think>\n\n</think>\n\n"
    by_kwargs.train()  # conversational rows train through the same path


def test_resume_from_checkpoint_continues_the_same_run(tmp_path, tokenizer):
    full = trainer_for(tmp_path / "full", tokenizer, max_steps=4, save_steps=2)
    full.train()
    logs = [h for h in full.state.log_history if "margo/reward_thinking" in h]
    assert len(logs) == 4
    assert all("margo/think_length" in h for h in logs)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = trainer_for(resumed_dir, tokenizer, max_steps=4, save_steps=2)
    resumed.train(resume_from_checkpoint=True)
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_thinking": 3, "num_direct": 2}, "num_thinking \\+ num_direct must equal"),
        ({"num_direct": 0, "margo_lambda": 1.0}, "margo_lambda must be 0 when num_direct is 0"),
        ({"margo_lambda": -0.5}, "margo_lambda must be a finite number >= 0"),
        ({"missing_direct": "skip"}, "missing_direct must be"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation"),
    ],
)
def test_config_refuses_bad_values(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        margo_args(tmp_path, **kwargs)


def test_trainer_refuses_missing_think_tags_columns_and_other_trl_versions(tmp_path, tokenizer,
                                                                          monkeypatch):  # fmt: skip
    with pytest.raises(ValueError, match="direct_prefix: the tokenizer has no"):
        trainer_for(tmp_path, tokenizer, direct_prefix=None, think_open="<reflect>",
                    think_close="</reflect>")  # fmt: skip
    for drop in ("prompt", "answer"):
        data = [{k: v for k, v in r.items() if k != drop} for r in rows()]
        with pytest.raises(ValueError, match=f"train_dataset has no '{drop}' column"):
            trainer_for(tmp_path, tokenizer, data=data)
    with pytest.raises(ValueError, match="trl: MARGOTrainer overrides"):
        check_trl_version("1.15.2")
    with pytest.raises(ValueError, match="install trl>=1.16,<1.17"):
        check_trl_version("1.17.0")
    import trl

    monkeypatch.setattr(trl, "__version__", "2.0.0")
    with pytest.raises(ValueError, match="found 2.0.0"):
        trainer_for(tmp_path, tokenizer)
