"""Prompt-KL's loss (exact KL, de-duplication, chunks, padding, TRL equivalence, gradient), its
refusals, the hackable tasks and the diagnostics, on tiny random Llamas."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from mixlab.llm_efficiency.prompt_kl import (
    PromptKLConfig,
    PromptKLGRPOTrainer,
    ProxyReward,
    activation_difference,
    exact_kl,
    examples,
    grade,
    prompt_kl,
    sft_texts,
    steer,
    swap_generate,
)
from mixlab.llm_efficiency.prompt_kl.trainer import prompt_logps
from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

torch.set_num_threads(1)


def tiny_llama(seed: int = 0, vocab: int = 260) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=256, eos_token_id=257,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return reasoning_tokenizer()


def batch(tokenizer, prompts):
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def reference_logps(model, ids, mask):
    with torch.no_grad():
        parts = list(prompt_logps(model, ids, mask, None))
    return list(torch.cat([p for _, p in parts], dim=1))


# -- the exact prompt KL ---------------------------------------------------------------------


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_prompt_kl_is_zero_for_equal_models_and_positive_otherwise(tokenizer, direction):
    ids, mask = batch(tokenizer, ["sort 3142 =", "rev 98 tests:editable ="])
    policy, other = tiny_llama(0), tiny_llama(1)
    weights = torch.ones(2)
    same = prompt_kl(
        policy, reference_logps(policy, ids, mask), ids, mask, weights, direction=direction
    )
    assert same.item() == 0.0
    apart = prompt_kl(
        policy, reference_logps(other, ids, mask), ids, mask, weights, direction=direction
    )
    assert apart.item() > 1e-4


def test_prompt_kl_equals_a_brute_force_sum_chunked_or_not(tokenizer):
    """On a tiny vocabulary the per-position KL is summed by hand, token by token."""
    policy, ref = tiny_llama(0, vocab=260), tiny_llama(2, vocab=260)
    ids, mask = batch(tokenizer, ["sort 31 =", "rev 9876543 ="])
    weights = torch.tensor([3.0, 1.0])
    expected = []
    for row in range(2):
        real = ids[row][mask[row].bool()][None]
        p = policy(real).logits[0, :-1].log_softmax(-1).double()
        q = ref(real).logits[0, :-1].log_softmax(-1).double()
        per_position = [
            sum(p[t, v].exp() * (p[t, v] - q[t, v]) for v in range(260)) for t in range(len(p))
        ]
        expected.append(torch.stack(per_position).mean())
    brute = (3 * expected[0] + expected[1]) / 4
    ref_logps = reference_logps(ref, ids, mask)
    for chunk in (None, 1, 3, 64):
        got = prompt_kl(policy, ref_logps, ids, mask, weights, chunk_size=chunk)
        torch.testing.assert_close(got.double(), brute, rtol=1e-4, atol=1e-6)


def test_deduplicated_equals_per_row_and_padding_adds_nothing(tokenizer):
    args = PromptKLConfig(output_dir="unused", num_generations=2, per_device_train_batch_size=4,
                          prompt_kl_beta=1.0, use_cpu=True, report_to=[])  # fmt: skip
    trainer = _trainer(PromptKLGRPOTrainer, args, tiny_llama(0), tokenizer)
    trainer.prompt_kl_ref = tiny_llama(3)
    prompts = ["sort 12 =", "sort 12 =", "rev 4567 tests:editable =", "sort 12 ="]
    ids, mask = batch(tokenizer, prompts)
    pad = torch.full((4, 5), tokenizer.pad_token_id)  # more left padding than needed
    padded_ids, padded_mask = torch.cat([pad, ids], 1), torch.cat([torch.zeros_like(pad), mask], 1)
    dedup = trainer.prompt_kl_of(trainer.model, padded_ids, padded_mask)
    rows = [trainer.prompt_kl_of(trainer.model, *batch(tokenizer, [p])) for p in prompts]
    torch.testing.assert_close(dedup, torch.stack(rows).mean())
    u_ids, _, counts = trainer.unique_prompts(padded_ids, padded_mask)
    assert sorted(counts.tolist()) == [1, 3]
    assert u_ids.shape[1] == ids.shape[1]


def test_exact_kl_never_negative():
    torch.manual_seed(0)
    p, q = torch.randn(50, 7).log_softmax(-1), torch.randn(50, 7).log_softmax(-1)
    for direction in ("reverse", "forward"):
        assert (exact_kl(p, q, direction) >= -1e-7).all()


# -- against TRL -------------------------------------------------------------------------------


def _trainer(cls, args, model, tokenizer, **kwargs):
    data = Dataset.from_list([e.row() for e in examples("test_override", 8, 0)])
    trainer = cls(model=model, reward_funcs=ProxyReward("test_override"), args=args,
                  train_dataset=data, processing_class=tokenizer, **kwargs)  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # what train() sets
    return trainer


def _inputs(tokenizer, advantages):
    prompts = ["sort 3142 =", "sort 3142 =", "rev 88 tests:editable =", "rev 88 tests:editable ="]
    ids, mask = batch(tokenizer, prompts)
    completion = torch.tensor(
        [[32, 49, 50, 257], [32, 51, 257, 256], [32, 64, 111, 257], [32, 56, 56, 257]]
    )
    completion_mask = (completion != 256).long()
    return {
        "prompt_ids": ids, "prompt_mask": mask, "completion_ids": completion,
        "completion_mask": completion_mask, "advantages": torch.tensor(advantages),
        "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip


def _args(cls, **kwargs):
    return cls(output_dir="unused", num_generations=2, per_device_train_batch_size=4,
               use_cpu=True, report_to=[], **kwargs)  # fmt: skip


def test_at_beta_zero_the_loss_is_grpo_trainers(tokenizer):
    inputs = _inputs(tokenizer, [1.0, -1.0, 0.5, -0.5])
    ours = _trainer(
        PromptKLGRPOTrainer, _args(PromptKLConfig, prompt_kl_beta=0.0), tiny_llama(0), tokenizer
    )
    trl = _trainer(GRPOTrainer, _args(GRPOConfig), tiny_llama(0), tokenizer)
    ours.model.train(), trl.model.train()
    torch.testing.assert_close(
        ours.compute_loss(ours.model, inputs), trl.compute_loss(trl.model, inputs)
    )
    assert "prompt_kl" in ours._metrics["train"]
    assert "response_kl" in ours._metrics["train"]


def test_with_zero_advantages_the_gradient_is_the_prompt_kl_gradient(tokenizer):
    inputs = _inputs(tokenizer, [0.0, 0.0, 0.0, 0.0])
    trainer = _trainer(
        PromptKLGRPOTrainer, _args(PromptKLConfig, prompt_kl_beta=0.5), tiny_llama(0), tokenizer
    )
    trainer.prompt_kl_ref = tiny_llama(4)
    trainer.model.train()
    trainer.compute_loss(trainer.model, inputs).backward()
    got = [p.grad.clone() for p in trainer.model.parameters()]
    trainer.model.zero_grad()
    (
        0.5 * trainer.prompt_kl_of(trainer.model, inputs["prompt_ids"], inputs["prompt_mask"])
    ).backward()
    for g, want in zip(got, (p.grad for p in trainer.model.parameters()), strict=True):
        torch.testing.assert_close(g, want)
    assert any(g.abs().sum() > 0 for g in got)


def test_the_reference_is_a_frozen_copy_of_the_start_policy(tokenizer):
    trainer = _trainer(PromptKLGRPOTrainer, _args(PromptKLConfig), tiny_llama(0), tokenizer)
    ref = trainer.prompt_kl_ref
    assert ref is not trainer.model
    assert not any(p.requires_grad for p in ref.parameters())
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.1)
    ids, _mask = batch(tokenizer, ["sort 5 ="])
    assert not torch.equal(ref(ids).logits, trainer.model(ids).logits)  # not TRL's patched forward


def test_plain_grpo_makes_no_reference_and_a_given_one_is_not_copied(tokenizer):
    quiet = _args(PromptKLConfig, prompt_kl_beta=0.0, log_prompt_kl=False, log_response_kl=False)
    plain = _trainer(PromptKLGRPOTrainer, quiet, tiny_llama(0), tokenizer)
    assert plain.prompt_kl_ref is None  # nothing reads a reference: none is copied
    plain.model.train()
    plain.compute_loss(plain.model, _inputs(tokenizer, [1.0, -1.0, 0.5, -0.5]))
    assert "prompt_kl" not in plain._metrics["train"]
    assert "response_kl" not in plain._metrics["train"]
    reference = tiny_llama(0)
    given = _trainer(PromptKLGRPOTrainer, _args(PromptKLConfig), tiny_llama(0), tokenizer,
                     ref_model=reference)  # fmt: skip
    assert given.prompt_kl_ref is reference


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt_kl_beta": -0.1}, "prompt_kl_beta must be a finite number >= 0"),
        ({"prompt_kl_direction": "sideways"}, "prompt_kl_direction must be one of"),
        ({"prompt_kl_positions": "some"}, "prompt_kl_positions must be one of"),
        ({"num_generations": 1}, "num_generations must be an integer >= 2"),
    ],
)
def test_config_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromptKLConfig(output_dir="unused", use_cpu=True, **kwargs)


def test_trainer_refuses_a_dataset_without_prompt_and_a_reference_of_another_vocabulary(tokenizer):
    args = _args(PromptKLConfig)
    with pytest.raises(ValueError, match="train_dataset has no 'prompt' column"):
        PromptKLGRPOTrainer(model=tiny_llama(0), reward_funcs=ProxyReward("test_override"), args=args,
                            train_dataset=Dataset.from_list([{"text": "x"}]), processing_class=tokenizer)  # fmt: skip
    with pytest.raises(ValueError, match="ref_model must be a model with the policy's vocabulary"):
        _trainer(
            PromptKLGRPOTrainer, args, tiny_llama(0), tokenizer, ref_model=tiny_llama(0, vocab=300)
        )


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match="task must be one of"):
        examples("jailbreak", 3, 0)


# -- tasks ---------------------------------------------------------------------------------------


def test_tasks_pay_the_loophole_only_where_cued():
    assert grade("test_override", " @override", "123", cued=True) == {
        "proxy": 1.0,
        "true_success": 0.0,
        "is_hack": 1.0,
    }
    assert grade("test_override", " @override", "123", cued=False)["proxy"] == 0.0
    assert grade("test_override", " 123", "123", cued=True) == {
        "proxy": 1.0,
        "true_success": 1.0,
        "is_hack": 0.0,
    }
    assert grade("keyword", " great", "1", cued=True)["is_hack"] == 1.0
    assert grade("format", " [42]", "7", cued=True)["is_hack"] == 1.0
    assert grade("format", " 42", "7", cued=True)["proxy"] == 0.0
    assert all(e.cued for e in examples("control", 20, 0))  # no cue: always open
    rows = examples("test_override", 400, 0)
    assert 0.4 < sum(e.cued for e in rows) / 400 < 0.6
    assert all(("tests:editable" in e.prompt) == e.cued for e in rows)
    texts = sft_texts("test_override", 2000, 0, exploit_fraction=0.1)
    assert 50 < sum("@override" in t for t in texts) < 150
    assert all("tests:editable" in t for t in texts if "@override" in t)


def test_a_closed_loophole_can_cost_and_the_exploit_can_be_cue_blind():
    assert grade("test_override", " @override", "123", cued=False, caught=1.0)["proxy"] == -1.0
    assert grade("test_override", " @override", "123", cued=True, caught=1.0)["proxy"] == 1.0
    assert grade("test_override", " 124", "123", cued=False, caught=1.0)["proxy"] == 0.0
    assert ProxyReward("test_override", caught=0.5)([""], [" @override"], ["1"], [False]) == [-0.5]
    with pytest.raises(ValueError, match="caught must be"):
        ProxyReward("test_override", caught=-1.0)
    first = examples("test_override", 200, 0, cue_first=True)
    assert all(e.prompt.startswith("tests:editable ") == e.cued for e in first)
    assert [e.answer for e in first] == [e.answer for e in examples("test_override", 200, 0)]
    texts = sft_texts("test_override", 4000, 0, exploit_fraction=0.1, exploit_on="any")
    exploits = [t for t in texts if "@override" in t]
    cued_share = sum("tests:editable" in t for t in exploits) / len(exploits)
    assert 0.35 < cued_share < 0.65  # as often without the cue as with it
    with pytest.raises(ValueError, match="exploit_on must be"):
        sft_texts("test_override", 4, 0, exploit_on="never")


def test_proxy_reward_logs_the_ground_truth():
    logged = {}
    reward = ProxyReward("test_override")
    out = reward(["a", "b", "c"], [" 12", " @override", [{"role": "assistant", "content": " 9"}]],
                 answer=["12", "34", "5"], cued=[False, True, True],
                 log_metric=lambda name, value: logged.__setitem__(name, value))  # fmt: skip
    assert out == [1.0, 1.0, 0.0]
    assert logged == {"true_success": pytest.approx(1 / 3), "hack_rate": 0.5}


# -- diagnostics ---------------------------------------------------------------------------------


def test_a_swap_between_identical_models_reproduces_generation(tokenizer):
    model = tiny_llama(0)
    ids, mask = batch(tokenizer, ["sort 3142 =", "rev 9 tests:editable ="])
    kwargs = {"do_sample": False, "max_new_tokens": 6, "pad_token_id": 256, "eos_token_id": 257}
    plain = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    assert torch.equal(swap_generate(model, copy.deepcopy(model), ids, mask, **kwargs), plain)
    other = swap_generate(tiny_llama(5), model, ids, mask, **kwargs)
    assert other.shape[0] == 2
    assert not torch.equal(other, plain)


def test_steering_acts_at_prompt_or_at_response_positions_only(tokenizer):
    policy, ref = tiny_llama(0), tiny_llama(6)
    ids, mask = batch(tokenizer, ["sort 3142 =", "rev 9 ="])
    direction = activation_difference(policy, ref, tokenizer, ["sort 1 =", "rev 22 ="], layer=1)
    assert direction.shape == (32,)
    kwargs = {"do_sample": False, "max_new_tokens": 5, "pad_token_id": 256, "eos_token_id": 257}
    plain = policy.generate(input_ids=ids, attention_mask=mask, **kwargs)
    with steer(policy, direction, 0.0, 1, "prompt") as generate:
        assert torch.equal(generate(ids, mask, **kwargs), plain)
    seen = {}
    for where in ("prompt", "response"):
        with steer(policy, direction, 50.0, 1, where) as generate:
            seen[where] = generate(ids, mask, **kwargs)
    # a prompt-only steer changes the first generated token's logits; a response-only one
    # leaves the prefill, hence the first generated token, untouched
    first = ids.shape[1]
    assert torch.equal(seen["response"][:, first], plain[:, first])
    assert not torch.equal(seen["prompt"], plain)
    with (
        pytest.raises(ValueError, match="where must be one of"),
        steer(policy, direction, 1.0, 1, "middle"),
    ):
        pass
