"""``mixlab-llm margo``: MARGO (mixed-mode GRPO) on a JSONL of questions, evaluation of both
modes, and the closed-book world's questions as JSONL.

mixlab-llm margo train --model DIR --data FILE.jsonl --lambda 1 [--one-sided] --out DIR
mixlab-llm margo eval --model DIR --data FILE.jsonl
mixlab-llm margo world --out FILE.jsonl --split train --kind 1hop

``--model`` is any local causal LM folder with its tokenizer. A data row is ``{"prompt": text or
chat messages, "answer": text}`` (other columns go to the reward; ``kind`` and ``associate``
label rows in ``eval``). The reward is exact match of the text after the last ``</think>``. A
hybrid model's direct mode is an empty think block after the prompt (``--direct-prefix``); its
thinking mode is the prompt plus ``--thinking-prefix`` (``mixlab run margo``'s world model
needs ``--thinking-prefix " <think>"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_fresh_output,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
    read_jsonl,
)

app = typer.Typer(
    help="MARGO: mixed-mode GRPO that scores thinking rollouts against the same model's direct "
    "answers (TRL).",
    no_args_is_help=True,
)

Model = Annotated[Path, typer.Option(help="local causal LM folder with its tokenizer")]
Data = Annotated[Path, typer.Option(help="JSONL rows with 'prompt' and 'answer'")]
ThinkingPrefix = Annotated[str, typer.Option(help="text after the prompt in the thinking mode")]
DirectPrefix = Annotated[
    str | None,
    typer.Option(help="text after the prompt in the direct mode (default: an empty think block)"),
]
MaxNew = Annotated[int, typer.Option(help="generated tokens per completion")]


def read_rows(path: Path, option: str = "--data") -> list[dict[str, Any]]:
    """The JSONL rows of ``path``, each an object with a non-empty text ``prompt`` and an
    ``answer`` (text or a number): a row of other types trained 0 steps and saved the untrained
    model (issue 80)."""
    return read_jsonl(path, option, ("prompt", "answer"), text=("prompt",), suffixes=(".jsonl",))


def _direct_prefix(direct_prefix: str | None, tokenizer: Any) -> str:
    if direct_prefix is not None:
        return direct_prefix
    from mixlab.llm_efficiency.margo.trainer import empty_think_block

    return empty_think_block(tokenizer, option="--direct-prefix")


@app.command()
def train(
    model: Model,
    data: Data,
    out: Annotated[Path, typer.Option(help="folder for the trained model and checkpoints")],
    lam: Annotated[float, typer.Option("--lambda", help="weight of the direct reference")] = 1.0,
    one_sided: Annotated[bool, typer.Option(help="only penalise thinking below direct")] = False,
    num_generations: Annotated[int, typer.Option(help="rollouts per prompt")] = 8,
    num_direct: Annotated[int, typer.Option(help="direct rollouts among them")] = 4,
    steps: int = 100,
    prompts_per_step: int = 2,
    lr: float = 2e-4,
    warmup: Annotated[float, typer.Option(help="share of the steps that warm the lr up")] = 0.1,
    max_new_tokens: MaxNew = 16,
    thinking_prefix: ThinkingPrefix = "",
    direct_prefix: DirectPrefix = None,
    seed: int = 0,
    resume: Annotated[
        bool, typer.Option(help="continue from the last checkpoint in --out")
    ] = False,
) -> None:
    """GRPO with mixed thinking/direct groups and the MARGO advantage (exact-match reward)."""
    check_number(lam, "--lambda", lam >= 0, "a finite number >= 0")
    check_count(num_generations, "--num-generations", minimum=2)
    check_count(num_direct, "--num-direct", minimum=0, maximum=num_generations - 1)
    if num_direct == 0 and lam != 0:
        raise ValueError(
            f"--lambda must be 0 when --num-direct is 0 (no direct reference); got {lam}"
        )
    for option, value in {"--steps": steps, "--prompts-per-step": prompts_per_step,
                          "--max-new-tokens": max_new_tokens}.items():  # fmt: skip
        check_count(value, option)
    check_number(lr, "--lr", 0 < lr < 1, "a number in (0, 1)")
    check_number(warmup, "--warmup", 0 <= warmup < 1, "a number in [0, 1)")
    check_seed(seed)
    rows = read_rows(data)
    check_output_folder(out, "--out")
    check_fresh_output(out, "--out", resume=resume, made=("checkpoint-*", "model.safetensors"))
    from mixlab.llm_efficiency.lm import load_generator

    policy, tokenizer = load_generator(model, "--model")

    from datasets import Dataset

    from mixlab.llm_efficiency.margo.trainer import MARGOConfig, MARGOTrainer
    from mixlab.llm_efficiency.rl import grpo_options

    options = grpo_options(
        out,
        steps=steps,
        prompts_per_step=prompts_per_step,
        num_generations=num_generations,
        max_completion_length=max_new_tokens,
        learning_rate=lr,
        warmup_ratio=warmup,
        seed=seed,
    )
    args = MARGOConfig(
        **options | {"logging_steps": 10, "disable_tqdm": False},
        num_direct=num_direct,
        num_thinking=num_generations - num_direct,
        margo_lambda=lam,
        one_sided=one_sided,
        thinking_prefix=thinking_prefix,
        direct_prefix=_direct_prefix(direct_prefix, tokenizer),
    )
    trainer = MARGOTrainer(
        model=policy, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    from mixlab.llm_efficiency.rl import latest_trainer_checkpoint

    trainer.train(resume_from_checkpoint=latest_trainer_checkpoint(out) if resume else None)
    trainer.save_model(str(out))
    tokenizer.save_pretrained(out)
    typer.echo(f"saved {out}")


@app.command("eval")
def evaluate(
    model: Model,
    data: Data,
    samples: Annotated[int, typer.Option(help="samples per question and mode (temperature 1)")] = 4,
    seed: int = 0,
    max_new_tokens: MaxNew = 16,
    thinking_prefix: ThinkingPrefix = "",
    direct_prefix: DirectPrefix = None,
) -> None:
    """Accuracy of each mode, overturn rate and think length, per ``kind`` of row."""
    check_count(samples, "--samples")
    check_count(max_new_tokens, "--max-new-tokens")
    check_seed(seed)
    rows = read_rows(data)
    from mixlab.llm_efficiency.lm import load_generator

    policy, tokenizer = load_generator(model, "--model")
    from mixlab.llm_efficiency.margo.policy import evaluate_modes
    from mixlab.llm_efficiency.margo.world import Question

    def text(prompt: Any) -> str:
        if isinstance(prompt, str):
            return prompt
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)

    kinds: dict[str, list[Question]] = {}
    for row in rows:
        kind = str(row.get("kind") or "all")
        question = Question(text(row["prompt"]), str(row["answer"]).strip(), kind,
                            row.get("associate") or None)  # fmt: skip
        kinds.setdefault(kind, []).append(question)
    prefix = _direct_prefix(direct_prefix, tokenizer)
    for kind, qs in kinds.items():
        measured = evaluate_modes(policy, tokenizer, qs, samples=samples, seed=seed,
                                  max_new_tokens=max_new_tokens, thinking_prefix=thinking_prefix,
                                  direct_prefix=prefix)  # fmt: skip
        values = " ".join(
            f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in measured.items()
        )
        typer.echo(f"{kind} ({len(qs)} questions): {values}")


@app.command()
def world(
    out: Annotated[Path, typer.Option(help="JSONL file to write")],
    split: Annotated[
        str, typer.Option(help="train (RL people) or test (held-out people)")
    ] = "test",
    kind: Annotated[str, typer.Option(help="1hop, 2hop or math")] = "1hop",
    n_math: Annotated[int, typer.Option(help="arithmetic chains (kind math)")] = 200,
    seed: Annotated[int, typer.Option(help="seed of the arithmetic chains")] = 2,
) -> None:
    """The questions of ``mixlab run margo``'s world (quick profile) as JSONL rows."""
    check_choice(split, "--split", ("train", "test"))
    check_choice(kind, "--kind", ("1hop", "2hop", "math"))
    check_count(n_math, "--n-math")
    check_seed(seed)
    check_output_file(out, "--out", suffixes=(".jsonl",))
    from mixlab.llm_efficiency.margo.config import Config
    from mixlab.llm_efficiency.margo.world import World, questions

    built = World.build(Config().policy_config().world)
    qs = questions(built, split, kind, n_math=n_math, seed=seed)
    out.write_text("".join(json.dumps(q.row()) + "\n" for q in qs))
    typer.echo(f"wrote {len(qs)} rows to {out}")
