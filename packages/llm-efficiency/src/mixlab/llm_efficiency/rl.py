"""What the GRPO methods of this package share: the training arguments the experiments and CLIs
train with, a training run that reports its steps (:func:`train_reporting`), and seeded sampling
of completions for evaluation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from mixlab.shared import progress, require

__all__ = ["grpo_options", "sample_completions", "train_reporting"]


def grpo_options(
    output_dir: Any,
    *,
    steps: int,
    prompts_per_step: int,
    num_generations: int,
    max_completion_length: int,
    learning_rate: float,
    warmup_ratio: float,
    seed: int,
) -> dict[str, Any]:
    """Keyword arguments of a :class:`trl.GRPOConfig` (or a subclass): pure sampling at
    temperature 1, a linear warm-up, four checkpoints a run, per-step logs, and on a CPU neither
    bf16 autocast (about 4x slower there) nor activation checkpointing (a small policy only pays
    its recomputation)."""
    return {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": prompts_per_step * num_generations,
        "num_generations": num_generations,
        "max_completion_length": max_completion_length,
        "learning_rate": learning_rate,
        "warmup_steps": warmup_ratio,  # a float below 1: a share of max_steps
        "max_steps": steps,
        "temperature": 1.0,
        "top_k": 0,
        "seed": seed,
        "save_strategy": "steps",
        "save_steps": max(1, steps // 4),
        "save_total_limit": 1,
        "gradient_checkpointing": False,
        "use_cpu": not torch.cuda.is_available(),
        "bf16": torch.cuda.is_available(),
        "logging_steps": 1,
        "disable_tqdm": True,
        "report_to": [],
    }


def check_trainer_checkpoint(folder: str | Path) -> None:
    """Every file of a Hugging Face Trainer checkpoint folder (``checkpoint-N``) reads: its JSON
    parses, its safetensors headers and torch zip archives open. A cut or garbage file raises
    :class:`~mixlab.shared.files.CheckpointError` naming it now, not a traceback from inside
    ``Trainer.train`` after the model has loaded (issue 80)."""
    import zipfile

    from safetensors import safe_open

    from mixlab.shared.files import checkpoint_errors

    for path in sorted(Path(folder).iterdir()):
        with checkpoint_errors(path, "Trainer checkpoint file"):
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as f:
                    list(f.keys())
            elif path.suffix in (".pt", ".pth", ".bin"):
                try:
                    with zipfile.ZipFile(path) as archive:  # torch.save writes a zip archive
                        damaged = archive.testzip()
                except zipfile.BadZipFile as error:
                    raise ValueError(f"not a torch archive ({error})") from None
                if damaged is not None:
                    raise ValueError(f"its archive member {damaged} is damaged")


def latest_trainer_checkpoint(output_dir: str | Path) -> str | None:
    """The latest ``checkpoint-N`` folder of a Trainer's ``output_dir`` (checked with
    :func:`check_trainer_checkpoint`), or None when there is none."""
    from transformers.trainer_utils import get_last_checkpoint

    output_dir = Path(output_dir)
    checkpoint = get_last_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    if checkpoint is not None:
        check_trainer_checkpoint(checkpoint)
    return checkpoint


def train_reporting(trainer: Any, description: str) -> Any:
    """``trainer.train()``, resumed from the latest checkpoint in its output folder when there is
    one (a killed run goes on), with its optimiser steps shown by :func:`mixlab.shared.progress`
    and the latest logged loss and reward beside them. Returns what ``train`` returns."""
    from transformers import TrainerCallback

    checkpoint = latest_trainer_checkpoint(trainer.args.output_dir)
    shown: dict[str, float] = {}

    with progress(trainer.args.max_steps, description) as bar:

        class Report(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                bar.advance(state.global_step)  # the steps a resumed checkpoint already took

            def on_step_end(self, args, state, control, **kwargs):
                bar.advance(max(0, state.global_step - bar.done), **shown)

            def on_log(self, args, state, control, logs=None, **kwargs):
                logs = logs or {}
                shown.update({k: float(logs[k]) for k in ("loss", "reward") if k in logs})
                bar.advance(0, **shown)  # the step's numbers, logged after its end

        report = Report()
        trainer.add_callback(report)
        try:
            return trainer.train(resume_from_checkpoint=checkpoint)
        finally:
            trainer.remove_callback(report)


@torch.no_grad()
def sample_completions(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    samples: int = 1,
    seed: int = 0,
    temperature: float = 1.0,
    max_new_tokens: int = 12,
    batch_size: int = 256,
    generate: Any = None,
) -> list[list[str]]:
    """``samples`` sampled completions (text, special tokens dropped) per prompt, from a fixed
    seed; ``generate(ids, mask, **kwargs)`` replaces ``model.generate`` (steering, swaps)."""
    require(math.isfinite(temperature) and temperature > 0, "temperature", "> 0", temperature)
    if generate is None:

        def generate(ids: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return model.generate(input_ids=ids, attention_mask=mask, **kwargs)

    torch.manual_seed(seed)
    rows = [p for p in prompts for _ in range(samples)]
    texts: list[str] = []
    for start in range(0, len(rows), batch_size):
        batch = tokenizer(rows[start : start + batch_size], return_tensors="pt", padding=True)
        batch = batch.to(model.device)
        out = generate(
            batch["input_ids"],
            batch["attention_mask"],
            do_sample=True,
            temperature=temperature,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts += tokenizer.batch_decode(
            out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
        )
    return [texts[i * samples : (i + 1) * samples] for i in range(len(prompts))]
