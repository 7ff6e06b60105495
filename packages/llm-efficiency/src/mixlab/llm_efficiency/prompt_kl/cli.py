"""``mixlab-llm prompt_kl``: GRPO with a prompt-KL penalty on a hackable task, and its diagnostics.

mixlab-llm prompt_kl train --model DIR --task test_override --beta-prompt 0.1 --beta-response 0 --out DIR
mixlab-llm prompt_kl eval --model DIR --task test_override
mixlab-llm prompt_kl swap --prompt-model DIR --response-model DIR --task test_override
mixlab-llm prompt_kl steer --policy DIR --reference DIR --task test_override --layer 2 --alpha 2 --where prompt

``--model`` is any local causal LM folder with its tokenizer (a policy this command trained, or
``mixlab run prompt_kl``'s cached SFT policy). The task draws its prompts and grades every
completion: hack rate (on cued prompts), true success, proxy reward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_fresh_output,
    check_number,
    check_output_folder,
    check_seed,
)

app = typer.Typer(
    help="Prompt-KL: GRPO with an exact KL on the prompt tokens against reward hacking (TRL).",
    no_args_is_help=True,
)

TASK_HELP = "hackable task: test_override, keyword, format or control"
Task = Annotated[str, typer.Option(help=TASK_HELP)]
N = Annotated[int, typer.Option(help="test prompts (their own seed)")]
Samples = Annotated[int, typer.Option(help="sampled completions per prompt (temperature 1)")]
MaxNew = Annotated[int, typer.Option(help="generated tokens per completion")]


def _task(task: str) -> None:
    from mixlab.llm_efficiency.prompt_kl.tasks import TASKS

    check_choice(task, "--task", tuple(TASKS))


def _prompts(task: str, n: int, seed: int) -> list:
    """``n`` prompts of ``task`` in the experiment's format (its digit range and cue options)."""
    from mixlab.llm_efficiency.prompt_kl.config import Config
    from mixlab.llm_efficiency.prompt_kl.tasks import examples

    return examples(task, n, seed, **Config().policy_config(task).prompt_format)


def _test(task: str, n: int, samples: int, seed: int, max_new_tokens: int) -> tuple[list, dict]:
    check_count(n, "--n")
    check_count(samples, "--samples")
    check_count(max_new_tokens, "--max-new-tokens")
    check_seed(seed)
    from mixlab.llm_efficiency.prompt_kl.experiment import TEST_SEED

    kwargs = {"samples": samples, "seed": seed, "max_new_tokens": max_new_tokens}
    return _prompts(task, n, TEST_SEED), kwargs


def _echo(measured: dict[str, float]) -> None:
    typer.echo(" ".join(f"{k} {v:.4f}" for k, v in measured.items()))


@app.command()
def train(
    model: Annotated[Path, typer.Option(help="local causal LM folder with its tokenizer")],
    task: Task,
    out: Annotated[Path, typer.Option(help="folder for the trained policy and checkpoints")],
    beta_prompt: Annotated[float, typer.Option(help="prompt-KL weight beta_p")] = 0.1,
    beta_response: Annotated[float, typer.Option(help="TRL's response-KL weight beta")] = 0.0,
    direction: Annotated[str, typer.Option(help="prompt KL: reverse or forward")] = "reverse",
    positions: Annotated[str, typer.Option(help="prompt KL over all positions or content")] = "all",
    steps: int = 100,
    prompts_per_step: int = 2,
    num_generations: int = 8,
    lr: float = 3e-4,
    warmup: Annotated[float, typer.Option(help="share of the steps that warm the lr up")] = 0.1,
    max_new_tokens: MaxNew = 12,
    n_train: Annotated[int, typer.Option(help="training prompts")] = 2000,
    caught: Annotated[
        float, typer.Option(help="the proxy pays -caught for the loophole where it is closed")
    ] = 0.0,
    seed: int = 0,
    resume: Annotated[
        bool, typer.Option(help="continue from the last checkpoint in --out")
    ] = False,
) -> None:
    """GRPO on a task's proxy reward with a prompt-KL (and optional response-KL) penalty."""
    _task(task)
    check_number(beta_prompt, "--beta-prompt", beta_prompt >= 0, "a finite number >= 0")
    check_number(beta_response, "--beta-response", beta_response >= 0, "a finite number >= 0")
    check_choice(direction, "--direction", ("reverse", "forward"))
    check_choice(positions, "--positions", ("all", "content"))
    for option, value in {"--steps": steps, "--prompts-per-step": prompts_per_step,
                          "--max-new-tokens": max_new_tokens, "--n-train": n_train}.items():  # fmt: skip
        check_count(value, option)
    check_count(num_generations, "--num-generations", minimum=2)
    check_number(lr, "--lr", 0 < lr < 1, "a number in (0, 1)")
    check_number(caught, "--caught", 0 <= caught <= 10, "a number in [0, 10]")
    check_number(warmup, "--warmup", 0 <= warmup < 1, "a number in [0, 1)")
    check_seed(seed)
    check_output_folder(out, "--out")
    check_fresh_output(out, "--out", resume=resume, made=("checkpoint-*", "model.safetensors"))
    from mixlab.llm_efficiency.lm import load_generator

    policy, tokenizer = load_generator(model, "--model")

    from datasets import Dataset

    from mixlab.llm_efficiency.prompt_kl.experiment import TRAIN_SEED
    from mixlab.llm_efficiency.prompt_kl.policy import grpo_config
    from mixlab.llm_efficiency.prompt_kl.tasks import ProxyReward
    from mixlab.llm_efficiency.prompt_kl.trainer import PromptKLGRPOTrainer

    args = grpo_config(
        out,
        steps=steps,
        prompts_per_step=prompts_per_step,
        num_generations=num_generations,
        max_completion_length=max_new_tokens,
        learning_rate=lr,
        warmup_ratio=warmup,
        beta_response=beta_response,
        beta_prompt=beta_prompt,
        seed=seed,
        prompt_kl_direction=direction,
        prompt_kl_positions=positions,
        logging_steps=10,
        disable_tqdm=False,
    )
    trainer = PromptKLGRPOTrainer(
        model=policy,
        reward_funcs=ProxyReward(task, caught=caught),
        args=args,
        train_dataset=Dataset.from_list([e.row() for e in _prompts(task, n_train, TRAIN_SEED)]),
        processing_class=tokenizer,
    )
    from mixlab.llm_efficiency.rl import latest_trainer_checkpoint

    trainer.train(resume_from_checkpoint=latest_trainer_checkpoint(out) if resume else None)
    trainer.save_model(str(out))
    tokenizer.save_pretrained(out)
    typer.echo(f"saved {out}")


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option(help="local causal LM folder with its tokenizer")],
    task: Task,
    n: N = 200,
    samples: Samples = 2,
    seed: int = 0,
    max_new_tokens: MaxNew = 12,
) -> None:
    """Hack rate, true success and proxy reward of sampled completions on the task's test prompts."""
    _task(task)
    test, kwargs = _test(task, n, samples, seed, max_new_tokens)
    from mixlab.llm_efficiency.lm import load_generator

    policy, tokenizer = load_generator(model, "--model")
    from mixlab.llm_efficiency.prompt_kl.policy import evaluate_policy

    _echo(evaluate_policy(policy, tokenizer, task, test, **kwargs))


@app.command()
def swap(
    prompt_model: Annotated[Path, typer.Option(help="model that encodes the prompt")],
    response_model: Annotated[Path, typer.Option(help="model that writes the response")],
    task: Task,
    n: N = 200,
    samples: Samples = 2,
    seed: int = 0,
    max_new_tokens: MaxNew = 12,
) -> None:
    """Hack rate and success when one model's prompt encoding (KV cache) feeds another's response."""
    _task(task)
    test, kwargs = _test(task, n, samples, seed, max_new_tokens)
    from mixlab.llm_efficiency.lm import load_generator

    encoder, _ = load_generator(prompt_model, "--prompt-model")
    writer, tokenizer = load_generator(response_model, "--response-model")
    from mixlab.llm_efficiency.prompt_kl.diagnostics import swap_generate
    from mixlab.llm_efficiency.prompt_kl.policy import evaluate_policy

    def generate(ids: Any, mask: Any, **kw: Any) -> Any:
        return swap_generate(encoder, writer, ids, mask, **kw)

    _echo(evaluate_policy(writer, tokenizer, task, test, generate=generate, **kwargs))


@app.command()
def steer(
    policy: Annotated[Path, typer.Option(help="the RL-trained policy")],
    reference: Annotated[Path, typer.Option(help="the policy it started from")],
    task: Task,
    layer: Annotated[int, typer.Option(help="decoder block whose output is shifted")],
    alpha: Annotated[
        float, typer.Option(help="strength: alpha x mean policy-minus-reference activation")
    ],
    where: Annotated[str, typer.Option(help="prompt or response positions")] = "prompt",
    n: N = 200,
    samples: Samples = 2,
    seed: int = 0,
    max_new_tokens: MaxNew = 12,
) -> None:
    """Hack rate and success of the policy steered at prompt or response positions."""
    _task(task)
    check_choice(where, "--where", ("prompt", "response"))
    check_number(alpha, "--alpha", alpha >= 0, "a finite number >= 0")
    test, kwargs = _test(task, n, samples, seed, max_new_tokens)
    from mixlab.llm_efficiency.lm import load_generator

    model, tokenizer = load_generator(policy, "--policy")
    ref, _ = load_generator(reference, "--reference")
    from mixlab.llm_efficiency.lm import decoder_blocks
    from mixlab.llm_efficiency.prompt_kl.diagnostics import activation_difference
    from mixlab.llm_efficiency.prompt_kl.diagnostics import steer as steering
    from mixlab.llm_efficiency.prompt_kl.policy import evaluate_policy

    blocks = len(decoder_blocks(model))
    if not 0 <= layer < blocks:
        raise ValueError(f"--layer must be a block index in [0, {blocks}), got {layer}")
    prompts = [e.prompt for e in _prompts(task, 256, 1)]
    direction = activation_difference(model, ref, tokenizer, prompts, layer)
    with steering(model, direction, alpha, layer, where) as generate:
        _echo(evaluate_policy(model, tokenizer, task, test, generate=generate, **kwargs))
