"""Benchmark: what the prompt KL costs per GRPO step against TRL's own response KL, side by side,
and what computing it once per distinct prompt saves.

    uv run python benchmarks/prompt_kl.py                  # -> benchmarks/results/prompt_kl/
    uv run python benchmarks/prompt_kl.py --out /tmp/bench --steps 5

Systems, each a fresh process (so its peak resident memory is its own), same model, prompts,
rollouts, seed and steps:

- ``trl_response_kl``: TRL's ``GRPOTrainer`` with ``beta`` 0.1 (its k3 response KL, reference
  log-probs of every completion);
- ``prompt_kl``: :class:`PromptKLGRPOTrainer` with ``prompt_kl_beta`` 0.1 and ``beta`` 0 (its
  reference log-probs cached per prompt, the response KL logged, as by default);
- ``grpo``: TRL's ``GRPOTrainer`` without a KL, the floor both are measured against.

Two models: ``tiny``, the SFT policy of ``mixlab run prompt_kl`` (0.9 M parameters, vocabulary
260, prompts of about 20 tokens); ``wide``, a random-init Llama of width 1024 (2 blocks, a 32,000
token vocabulary, 128-token prompts), where the exact KL over the vocabulary is what costs.
Step time is TRL's own ``step_time`` metric (median over the steps after the first); memory is
the process's peak resident set.

De-duplication: on the wide model, the prompt KL of a batch of 2 prompts x 8 rollouts, forward
and backward, computed per row (16 prompt forwards) against once per distinct prompt (2, each
weighted by its rows; equal values), median over ``--repeats``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from mixlab.shared import Claim, median_seconds
from mixlab.shared.result import write_benchmark

SYSTEMS = ("grpo", "trl_response_kl", "prompt_kl")
GENERATIONS, PROMPTS = 8, 2
STEP_RATIO_MAX = 1.5
"""claim: a prompt-KL step costs at most 1.5x a TRL response-KL step (both models)"""
DEDUP_MIN = 4.0
"""claim: computing the prompt KL once per distinct prompt is at least 4x faster (G = 8)"""


def _model(kind: str, folder: str = "") -> tuple[Any, Any, list[dict[str, Any]]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixlab.llm_efficiency.prompt_kl.config import Config
    from mixlab.llm_efficiency.prompt_kl.policy import sft_policy
    from mixlab.llm_efficiency.prompt_kl.tasks import examples
    from mixlab.llm_efficiency.reasoning import reasoning_tokenizer

    if kind == "tiny":
        model, tokenizer = sft_policy(Config().policy_config("test_override"))
        return model, tokenizer, [e.row() for e in examples("test_override", 256, 1)]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32_000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
        pad_token_id=256, eos_token_id=257,
    )  # fmt: skip
    if folder:  # TRL's response KL loads its reference from the policy's folder
        LlamaForCausalLM(config).save_pretrained(Path(folder) / "wide")
        model = LlamaForCausalLM.from_pretrained(Path(folder) / "wide")
    else:
        model = LlamaForCausalLM(config)
    rows = []
    for e in examples("test_override", 256, 1):
        rows.append(e.row() | {"prompt": (e.prompt + " ") * (128 // (len(e.prompt) + 1))})
    return model, reasoning_tokenizer(), rows


def _train(system: str, kind: str, steps: int, out: str) -> dict[str, float]:
    """In a fresh process: ``steps`` GRPO steps; median step time and peak memory."""
    torch.set_num_threads(2)
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from mixlab.llm_efficiency.prompt_kl import PromptKLConfig, PromptKLGRPOTrainer, ProxyReward

    model, tokenizer, rows = _model(kind, out)
    common = dict(
        output_dir=out, per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=16, learning_rate=1e-5,
        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], seed=0,
        disable_tqdm=True, gradient_checkpointing=False, bf16=False, use_cpu=True,
    )  # fmt: skip
    if system == "prompt_kl":
        cls, args = PromptKLGRPOTrainer, PromptKLConfig(**common, beta=0.0, prompt_kl_beta=0.1)
    else:
        cls, args = (
            GRPOTrainer,
            GRPOConfig(**common, beta=0.1 if system == "trl_response_kl" else 0.0),
        )
    trainer = cls(model=model, reward_funcs=ProxyReward("test_override"), args=args,
                  train_dataset=Dataset.from_list(rows), processing_class=tokenizer)  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    return {
        "step_s": statistics.median(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _dedup(repeats: int) -> dict[str, float]:
    """In a fresh process: the prompt KL per row against once per distinct prompt."""
    torch.set_num_threads(2)
    from mixlab.llm_efficiency.prompt_kl.trainer import prompt_kl, prompt_logps

    model, tokenizer, rows = _model("wide")
    prompts = [r["prompt"] for r in rows[:PROMPTS] for _ in range(GENERATIONS)]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    torch.manual_seed(1)
    ref = type(model)(model.config).eval()  # another random Llama: the KL is not zero
    with torch.no_grad():
        ref_logps = list(torch.cat([p for _, p in prompt_logps(ref, ids, mask, 64)], dim=1))

    def per_row() -> None:
        model.zero_grad()
        prompt_kl(model, ref_logps, ids, mask, torch.ones(len(ids))).backward()

    unique = slice(0, None, GENERATIONS)

    def once_per_prompt() -> None:
        model.zero_grad()
        weights = torch.full((PROMPTS,), float(GENERATIONS))
        prompt_kl(model, ref_logps[unique], ids[unique], mask[unique], weights).backward()

    with torch.no_grad():
        same = torch.isclose(
            prompt_kl(model, ref_logps, ids, mask, torch.ones(len(ids))),
            prompt_kl(
                model, ref_logps[unique], ids[unique], mask[unique], torch.full((PROMPTS,), 8.0)
            ),
        )
    return {
        "per_row_s": median_seconds(per_row, repeats),
        "once_per_prompt_s": median_seconds(once_per_prompt, repeats),
        "values_equal": float(same),
    }


def _in_process(fn: Any, *args: Any) -> dict[str, float]:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def claims(metrics: dict[str, dict[str, float | None]]) -> list[Claim]:
    return [
        Claim.all_of(
            f"A prompt-KL step costs at most {STEP_RATIO_MAX}x a TRL response-KL step",
            [
                Claim.compare(
                    kind,
                    metrics[kind]["prompt_kl_step_vs_trl_response_kl"],
                    "<=",
                    STEP_RATIO_MAX,
                    value_label="step time ratio",
                )
                for kind in ("tiny", "wide")
            ],
        ),
        Claim.compare(
            f"Computing the prompt KL once per distinct prompt is at least {DEDUP_MIN:.0f}x "
            f"faster than per rollout (G = {GENERATIONS})",
            metrics["dedup"]["speedup"],
            ">=",
            DEDUP_MIN,
            value_label="per-row time / per-prompt time",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "prompt_kl")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    metrics: dict[str, dict[str, float | None]] = {}
    for kind in ("tiny", "wide"):
        row: dict[str, float | None] = {}
        for system in SYSTEMS:
            measured = _in_process(_train, system, kind, args.steps, str(args.out / "runs"))
            row |= {f"{system}_{k}": v for k, v in measured.items()}
        row["prompt_kl_step_vs_trl_response_kl"] = (
            row["prompt_kl_step_s"] / row["trl_response_kl_step_s"]
        )
        row["prompt_kl_step_vs_grpo"] = row["prompt_kl_step_s"] / row["grpo_step_s"]
        metrics[kind] = row
    dedup = _in_process(_dedup, args.repeats)
    metrics["dedup"] = dedup | {"speedup": dedup["per_row_s"] / dedup["once_per_prompt_s"]}
    for row in metrics.values():  # same keys in every row
        for key in {k for r in metrics.values() for k in r}:
            row.setdefault(key, None)
    write_benchmark(
        args.out,
        method="prompt_kl",
        metrics=metrics,
        claims=claims(metrics),
        config={
            "steps": args.steps,
            "repeats": args.repeats,
            "prompts": PROMPTS,
            "generations": GENERATIONS,
            "threads": 2,
        },
        started=started,
    )


if __name__ == "__main__":
    main()
