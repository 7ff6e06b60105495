"""Run by ``accelerate launch --num_processes 2`` from ``test_margo_checks.py``: six MARGO steps
(two generations of three steps each) whose rendered rows each process writes to
``OUT/rank<i>.json``."""

import json
import os
import sys
from pathlib import Path

import torch
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

from mixlab.llm_efficiency.margo import MARGOConfig, MARGOTrainer
from mixlab.llm_efficiency.margo.world import (
    DIRECT_PREFIX,
    THINKING_PREFIX,
    World,
    WorldConfig,
    questions,
    world_tokenizer,
)

torch.set_num_threads(1)
out = Path(sys.argv[1])
world = World.build(WorldConfig(n_people=12, n_cities=4, n_countries=2))
tokenizer = world_tokenizer(world)
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    pad_token_id=0, eos_token_id=1,
))  # fmt: skip
rendered = []
render = MARGOTrainer.render


def spy(self, prompts, direct):
    texts = render(self, prompts, direct)
    rendered.append(list(zip(prompts, texts, strict=True)))
    return texts


MARGOTrainer.render = spy
args = MARGOConfig(
    output_dir=str(out / "run"), per_device_train_batch_size=2, steps_per_generation=3,
    num_generations=4, num_direct=1, max_completion_length=4, max_steps=6, save_strategy="no", report_to=[], disable_tqdm=True,
    use_cpu=True, bf16=False, seed=0, thinking_prefix=THINKING_PREFIX, direct_prefix=DIRECT_PREFIX,
)  # fmt: skip
trainer = MARGOTrainer(
    model=model, args=args, processing_class=tokenizer,
    train_dataset=Dataset.from_list([q.row() for q in questions(world, "train", "1hop")]),
)  # fmt: skip
trainer.train()
rank = trainer.accelerator.process_index
assert trainer.accelerator.num_processes == 2
(out / f"rank{rank}.json").write_text(json.dumps(rendered))
# Tear the process group down before exit: a rank that exits with gloo's threads still running can
# abort ("terminate called without an active exception", SIGABRT), as one fresh-ci run saw.
trainer.accelerator.wait_for_everyone()
torch.distributed.destroy_process_group()
# ... and still, 2 fresh-ci runs in about 10 saw that abort at interpreter exit, after this rank's
# file was written: leave without the interpreter's teardown (the work and its file are done)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
