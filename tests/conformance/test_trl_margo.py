"""MARGO as a TRL trainer: steps through ``trainer.train()`` on a tiny Llama with TRL's own
response KL (``beta`` > 0, its reference model) and ``num_iterations`` > 1 (TRL's clipped
ratio); ``save_model`` reloads with ``AutoModelForCausalLM``; a Qwen3-style chat template whose
direct mode is ``enable_thinking=False``; a LoRA policy."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from mixlab.llm_efficiency.margo import MARGOConfig, MARGOTrainer
from mixlab.llm_efficiency.margo.world import (
    DIRECT_PREFIX,
    THINKING_PREFIX,
    World,
    WorldConfig,
    questions,
    world_tokenizer,
)

WORLD = World.build(WorldConfig(n_people=12, n_cities=4, n_countries=2))
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def tiny_llama(vocab: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=96,
        pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def trainer_for(out, model=None, chat=False, **kwargs) -> MARGOTrainer:
    tokenizer = world_tokenizer(WORLD)
    rows = [q.row() for q in questions(WORLD, "train", "2hop")]
    prefixes = {"thinking_prefix": THINKING_PREFIX, "direct_prefix": DIRECT_PREFIX}
    if chat:
        tokenizer.chat_template = QWEN3_LIKE
        rows = [r | {"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
        prefixes = {"thinking_prefix": "<think>\n", "direct_chat_template_kwargs":
                    {"enable_thinking": False}}  # fmt: skip
    args = MARGOConfig(
        output_dir=str(out), per_device_train_batch_size=8, num_generations=4, num_direct=2,
        max_completion_length=6, learning_rate=1e-2, max_steps=3, logging_steps=1,
        save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True, seed=0, bf16=False,
        gradient_checkpointing=False, **(prefixes | kwargs),
    )  # fmt: skip
    return MARGOTrainer(
        model=model if model is not None else tiny_llama(len(tokenizer)),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )


def test_trl_response_kl_and_iterations_and_the_saved_model_reloads(tmp_path):
    tiny_llama(len(world_tokenizer(WORLD))).save_pretrained(tmp_path / "start")
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "start")  # TRL's reference: a copy
    trainer = trainer_for(tmp_path, model=policy, beta=0.1, num_iterations=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "margo/reward_thinking" in h]
    assert logs
    assert all("kl" in h for h in logs)  # TRL's own k3 response KL against its reference
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    ids = trainer.processing_class(["country of x ? <think>"], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, trainer.model.eval()(ids).logits)


def test_a_qwen3_style_template_renders_the_direct_mode_with_enable_thinking_false(tmp_path):
    trainer = trainer_for(tmp_path, chat=True)
    message = [{"role": "user", "content": "city of x ?"}]
    thinking, direct = trainer.render([message, message], [False, True])
    assert thinking.endswith("<|im_start|>assistant\n<think>\n")
    assert direct.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    trainer.train()


def test_a_lora_policy_trains(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_llama(len(world_tokenizer(WORLD))),
        peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8),
    )
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = trainer_for(tmp_path, model=model)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the adapter moved
