"""Benchmark: what a MARGO step costs against a TRL GRPO step at equal rollouts, side by side.

    uv run python benchmarks/margo.py                  # -> benchmarks/results/margo/
    uv run python benchmarks/margo.py --out /tmp/bench --steps 5

Systems, the same model (built afresh for every run), prompts, rollouts per step (2 prompts x 8),
seed and steps, alternating in one process per model over ``--rounds`` rounds (in separate
processes the wide model's step time moved by 10-20 % from process to process, more than the two
systems differ):

- ``grpo``: TRL's ``GRPOTrainer``, every rollout in the thinking mode (the prompt plus the
  thinking prefix), exact-match reward;
- ``margo``: :class:`MARGOTrainer` with 4 thinking and 4 direct rollouts per prompt, lambda 1
  (the mode rendering, the reward capture and the MARGO advantage on top of TRL's step).

Two models: ``world``, the SFT model of ``mixlab run margo`` (0.8 M parameters), whose direct
answers are shorter than its thoughts (so a mixed group generates fewer tokens); ``wide``, a
random-init Llama of width 1024 (2 blocks, a 32,000-token vocabulary) that never stops before
``max_completion_length``, so both systems generate the same number of tokens and the ratio is
MARGO's own overhead. Step time is TRL's ``step_time`` metric (median over the steps after the
first, then over rounds); the ratio's spread is the lowest and highest per-round ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark

SYSTEMS = ("grpo", "margo")
GENERATIONS, PROMPTS, DIRECT = 8, 2, 4
OVERHEAD_MAX = 1.10
"""claim: a MARGO step costs at most 1.1x a GRPO step at equal rollouts (both models)"""


def _model(kind: str) -> tuple[Any, Any, list[dict[str, Any]]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixlab.llm_efficiency.margo.config import Config
    from mixlab.llm_efficiency.margo.experiment import rl_prompts
    from mixlab.llm_efficiency.margo.policy import sft_policy

    config = Config()
    model, tokenizer, world = sft_policy(config.policy_config())
    rows = rl_prompts(world, config, 256)
    if kind == "world":
        return model, tokenizer, rows
    torch.manual_seed(0)
    wide = LlamaConfig(
        vocab_size=32_000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(wide), tokenizer, rows


def _train(system: str, kind: str, steps: int, out: str) -> float:
    """``steps`` steps of ``system`` on a fresh ``kind`` model; the median step time after the
    first."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from mixlab.llm_efficiency.margo import ExactMatch, MARGOConfig, MARGOTrainer
    from mixlab.llm_efficiency.margo.world import DIRECT_PREFIX, THINKING_PREFIX

    model, tokenizer, rows = _model(kind)
    common = dict(
        output_dir=out, per_device_train_batch_size=PROMPTS * GENERATIONS,
        num_generations=GENERATIONS, max_completion_length=16, learning_rate=1e-5,
        max_steps=steps, logging_steps=1, save_strategy="no", report_to=[], seed=0,
        disable_tqdm=True, gradient_checkpointing=False, bf16=False, use_cpu=True,
        temperature=1.0, top_k=0,
    )  # fmt: skip
    if system == "margo":
        args = MARGOConfig(**common, num_direct=DIRECT, margo_lambda=1.0,
                           thinking_prefix=THINKING_PREFIX, direct_prefix=DIRECT_PREFIX)  # fmt: skip
        trainer = MARGOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                               processing_class=tokenizer)  # fmt: skip
    else:
        thinking = [r | {"prompt": r["prompt"] + THINKING_PREFIX} for r in rows]
        trainer = GRPOTrainer(model=model, reward_funcs=ExactMatch(), args=GRPOConfig(**common),
                              train_dataset=Dataset.from_list(thinking),
                              processing_class=tokenizer)  # fmt: skip
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][1:]
    return statistics.median(times)


def _compare(kind: str, steps: int, rounds: int, out: str) -> dict[str, list[float]]:
    """In a fresh process: both systems on ``kind``, alternating, ``rounds`` times each."""
    torch.set_num_threads(2)
    times: dict[str, list[float]] = {system: [] for system in SYSTEMS}
    for _ in range(rounds):
        for system in SYSTEMS:
            times[system].append(_train(system, kind, steps, out))
    return times


def _in_process(fn: Any, *args: Any) -> Any:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def claims(metrics: dict[str, dict[str, float]]) -> list[Claim]:
    return [
        Claim.all_of(
            f"A MARGO step costs at most {OVERHEAD_MAX}x a TRL GRPO step at equal rollouts",
            [
                Claim.compare(
                    kind,
                    metrics[kind]["margo_step_vs_grpo"],
                    "<=",
                    OVERHEAD_MAX,
                    value_label="step time ratio",
                )
                for kind in ("world", "wide")
            ],
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "margo")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    metrics: dict[str, dict[str, float]] = {}
    for kind in ("world", "wide"):
        times = _in_process(_compare, kind, args.steps, args.rounds, str(args.out / "runs"))
        row = {f"{system}_step_s": statistics.median(times[system]) for system in SYSTEMS}
        row["margo_step_vs_grpo"] = row["margo_step_s"] / row["grpo_step_s"]
        ratios = [m / g for m, g in zip(times["margo"], times["grpo"], strict=True)]
        row["ratio_min"], row["ratio_max"] = min(ratios), max(ratios)
        metrics[kind] = row
    write_benchmark(
        args.out,
        method="margo",
        metrics=metrics,
        claims=claims(metrics),
        config={
            "steps": args.steps,
            "rounds": args.rounds,
            "prompts": PROMPTS,
            "generations": GENERATIONS,
            "direct": DIRECT,
            "threads": 2,
        },
        started=started,
    )


if __name__ == "__main__":
    main()
