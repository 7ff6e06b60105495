"""Prompt-KL as a TRL trainer: a few steps through ``trainer.train()`` on a tiny Llama, resume
from a checkpoint continues the same run, the saved policy reloads with
``AutoModelForCausalLM``, chat-template prompts (``content`` positions) and a LoRA policy whose
reference is the policy with its adapter disabled."""

from __future__ import annotations

import shutil

import pytest
import torch
from conformance.prompt_kl_ddp_run import tiny_llama  # pytest's pythonpath holds tests/
from datasets import Dataset
from transformers import AutoModelForCausalLM

from mixlab.llm_efficiency.prompt_kl import (
    PromptKLConfig,
    PromptKLGRPOTrainer,
    ProxyReward,
    examples,
)
from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

torch.set_num_threads(1)

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def args(out, **kwargs):
    defaults = dict(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=2,
        max_completion_length=6, learning_rate=1e-2, max_steps=4, save_steps=2,
        logging_steps=1, report_to=[], disable_tqdm=True, use_cpu=True, seed=0,
        gradient_checkpointing=False, prompt_kl_beta=0.5, bf16=False,
    )  # fmt: skip
    return PromptKLConfig(**(defaults | kwargs))


def trainer_for(out, model=None, conversational=False, **kwargs):
    tokenizer = reasoning_tokenizer()
    rows = [e.row() for e in examples("test_override", 16, 0)]
    if conversational:
        tokenizer.chat_template = TEMPLATE
        rows = [r | {"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows]
    return PromptKLGRPOTrainer(
        model=model if model is not None else tiny_llama(),
        reward_funcs=ProxyReward("test_override"),
        args=args(out, **kwargs),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )


def test_resume_from_checkpoint_continues_the_same_run_and_the_policy_reloads(tmp_path):
    full = trainer_for(tmp_path / "full")
    full.train()
    logs = [h for h in full.state.log_history if "prompt_kl" in h]
    assert len(logs) == 4
    assert all(h["prompt_kl"] >= 0 for h in logs)
    assert all("response_kl" in h for h in logs)
    assert logs[-1]["prompt_kl"] > 0  # the policy moved off the reference

    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "full" / "checkpoint-2", resumed_dir / "checkpoint-2")
    resumed = trainer_for(resumed_dir)
    resumed.train(resume_from_checkpoint=True)
    for a, b in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

    full.save_model(str(tmp_path / "saved"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    ids = torch.tensor([[257, 115, 111, 114, 116, 32, 49, 32, 61]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, full.model.eval()(ids).logits)


def test_chat_template_prompts_and_content_positions(tmp_path):
    trainer = trainer_for(tmp_path, conversational=True, prompt_kl_positions="content", max_steps=2)
    trainer.train()
    tokenizer = trainer.processing_class
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "sort 12 ="}], tokenize=False, add_generation_prompt=True
    )
    enc = tokenizer([text], return_tensors="pt", add_special_tokens=False)
    content = trainer.content_mask(enc["input_ids"], enc["attention_mask"])[0]
    kept = tokenizer.decode(enc["input_ids"][0][content])
    assert kept == "sort 12 ="  # the template's "<|user|>" and "\n<|assistant|>" are left out


def test_a_lora_policy_uses_its_disabled_adapter_as_the_reference(tmp_path):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_llama(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8)
    )
    trainer = trainer_for(tmp_path, model=model, max_steps=3)
    assert trainer.prompt_kl_ref is None
    ids = torch.tensor([[257, 115, 111, 114, 116, 32, 49, 32, 61]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert trainer.prompt_kl_of(trainer.model, ids, mask).item() == 0.0  # LoRA B starts at 0
    trainer.train()
    with torch.no_grad():
        assert trainer.prompt_kl_of(trainer.model, ids, mask).item() > 0.0


def test_two_ddp_processes_train_as_one_on_the_same_global_batch(tmp_path):
    """Issue 62: under ``accelerate launch`` the policy is a DistributedDataParallel wrapper; the
    prompt KL must read the module inside it, and its gradient must be averaged like TRL's."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).with_name("prompt_kl_ddp_run.py"))
    env = os.environ | {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
              "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--main_process_port", "0"]  # fmt: skip
    runs = {"two": [*launch, script, str(tmp_path / "two"), "2"],
            "one": [sys.executable, script, str(tmp_path / "one"), "4"]}  # fmt: skip
    records = {}
    for name, command in runs.items():
        (tmp_path / name).mkdir()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        records[name] = json.loads((tmp_path / name / "losses.json").read_text())
    two, one = records["two"], records["one"]
    assert (two["processes"], two["wrapped"]) == (2, "DistributedDataParallel")
    assert one["processes"] == 1
    assert one["loss"][0] > 0  # the reference differs: the loss and its gradient are not zero
    torch.testing.assert_close(two["loss"], one["loss"], rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(two["prompt_kl"], one["prompt_kl"], rtol=1e-5, atol=1e-8)
    # Adam's normalised steps amplify float-order differences of near-zero gradients a little;
    # the weights moved four orders of magnitude more than this tolerance
    assert one["moved"] > 1.0
    torch.testing.assert_close(two["weights"], one["weights"], rtol=0, atol=1e-4)
