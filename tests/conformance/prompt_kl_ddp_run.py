"""Two steps of Prompt-KL GRPO whose loss is the prompt KL alone, for the DDP test of
``test_trl_prompt_kl.py``: ``python prompt_kl_ddp_run.py OUT PER_DEVICE`` (one process) or the
same under ``accelerate launch --multi_gpu --num_processes 2`` (two CPU processes, gloo) with
half the rows per process. Every rollout is paid the same, so GRPO's advantages are zero and the
sampled completions do not enter the loss: both runs see the same global batch and must log the
same losses and end with the same weights. The main process writes ``OUT/losses.json``."""

from __future__ import annotations

import json
import os
import sys

import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

from mixlab.llm_efficiency.prompt_kl import PromptKLConfig, PromptKLGRPOTrainer, examples
from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

torch.set_num_threads(1)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    """A 2-block Llama on the byte vocabulary of :func:`reasoning_tokenizer` (also the policy
    of ``test_trl_prompt_kl.py``)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=256, eos_token_id=257,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def same_pay(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def main(out: str, per_device: int) -> None:
    args = PromptKLConfig(
        output_dir=out, per_device_train_batch_size=per_device, num_generations=2,
        max_completion_length=4, learning_rate=1e-2, max_steps=2, logging_steps=1,
        save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True, seed=0, bf16=False,
        gradient_checkpointing=False, prompt_kl_beta=1.0,
    )  # fmt: skip
    trainer = PromptKLGRPOTrainer(
        model=tiny_llama(0),
        reward_funcs=same_pay,
        args=args,
        ref_model=tiny_llama(1),  # another start: the prompt KL and its gradient are not zero
        train_dataset=Dataset.from_list([e.row() for e in examples("test_override", 16, 0)]),
        processing_class=reasoning_tokenizer(),
    )
    start = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    if trainer.accelerator.is_main_process:
        logs = [h for h in trainer.state.log_history if "loss" in h]
        record = {
            "processes": trainer.accelerator.num_processes,
            "wrapped": type(trainer.model_wrapped).__name__,
            "loss": [h["loss"] for h in logs],
            "prompt_kl": [h["prompt_kl"] for h in logs],
            "weights": [p.detach().double().sum().item() for p in trainer.model.parameters()],
            "moved": sum(
                (p.detach() - p0).abs().sum().item()
                for p, p0 in zip(trainer.model.parameters(), start, strict=True)
            ),
        }
        with open(f"{out}/losses.json", "w") as f:
            json.dump(record, f)
    if torch.distributed.is_initialized():
        # leaving gloo's threads to the interpreter's exit aborts one run in five
        # ("terminate called without an active exception")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    # the abort can still come at interpreter exit (as in MARGO's two-process test): the work
    # and its file are done, so leave without the interpreter's teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
