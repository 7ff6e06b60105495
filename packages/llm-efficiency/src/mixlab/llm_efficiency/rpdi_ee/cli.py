"""``mixlab-llm rpdi_ee``: early exit for any local reasoning model.

mixlab-llm rpdi_ee generate --model DIR --prompts prompts.jsonl --out out.jsonl
mixlab-llm rpdi_ee eval --model DIR --tasks tasks.jsonl --methods vanilla,rpdi,deer
mixlab-llm rpdi_ee sweep --model DIR --tasks tasks.jsonl --windows 8,16,32 --thresholds 1.5,2,3 --out DIR

A prompts file holds one JSON object per line with ``prompt`` (the text the model continues,
chat template applied, ending where thinking starts); a tasks file adds ``answer``. A task is
right when its answer is the text inside the last ``\\boxed{...}`` after the think end, or else
the first word after it (punctuation stripped).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from mixlab.shared.checks import (
    check_count,
    check_input_folder,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
    read_jsonl,
)

app = typer.Typer(
    help="RPDI-EE: end thinking when the token entropy drifts, inside one generate call.",
    no_args_is_help=True,
)

METHOD_NAMES = ("vanilla", "budget", "rpdi", "deer", "dynasor", "eat")  # as evaluate.METHODS

Model = Annotated[Path, typer.Option(help="local model folder (config.json, weights, tokenizer)")]
ThinkEnd = Annotated[
    str | None,
    typer.Option(help="text that closes thinking (default '</think>', if the tokenizer has it)"),
]
ThinkStart = Annotated[str, typer.Option(help="text that opens thinking ('' : the prompt end)")]
Window = Annotated[int, typer.Option(help="RPDI window W (think tokens)")]
Threshold = Annotated[float, typer.Option(help="RPDI threshold lambda > 0")]
MinSteps = Annotated[int, typer.Option(help="no RPDI exit before max(W, min-steps)")]
CheckAt = Annotated[
    str,
    typer.Option(
        help="'every' token, or the characters that end a step (one token each), e.g. '.;\\n'"
    ),
]
Temperature = Annotated[float, typer.Option(help="sampling temperature; 0 decodes greedily")]


def _numbers(text: str, option: str, kind: type) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"{option} must be a comma-separated list of numbers, got {text!r}"
        ) from None
    if not values:
        raise ValueError(f"{option} must list at least one value, got {text!r}")
    return values


def _load(model_dir: Path, think_end: str | None, think_start: str):
    """``(model, tokenizer, think_end, think_start)`` after checking the folder and the texts."""
    check_input_folder(model_dir, "--model", containing=("config.json",))
    from transformers import AutoTokenizer

    from mixlab.llm_efficiency.lm import load_lm

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    if think_end is None:
        if "</think>" not in tokenizer.get_vocab():
            raise ValueError(
                f"--think-end: the tokenizer of {str(model_dir)!r} has no '</think>' token; "
                "pass the text that closes thinking with --think-end"
            )
        think_end = "</think>"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return load_lm(model_dir), tokenizer, think_end, think_start or None


def _rpdi_params(window: int, threshold: float, min_steps: int, check_at: str) -> dict[str, Any]:
    check_count(window, "--window")
    check_number(threshold, "--threshold", threshold > 0, "a finite number > 0")
    check_count(min_steps, "--min-steps", minimum=0)
    boundaries: Any = "every" if check_at == "every" else list(check_at.replace("\\n", "\n"))
    return {
        "window": window,
        "threshold": threshold,
        "min_steps": min_steps,
        "check_at": boundaries,
    }


def _sampling(temperature: float, max_new_tokens: int, batch_size: int, seed: int) -> None:
    check_number(temperature, "--temperature", temperature >= 0, "a number >= 0")
    check_count(max_new_tokens, "--max-new-tokens")
    check_count(batch_size, "--batch-size")
    check_seed(seed)


@app.command()
def generate(
    model: Model,
    prompts: Annotated[Path, typer.Option(help="JSON lines with 'prompt'")],
    out: Annotated[Path, typer.Option(help="JSON lines out: each prompt's output and exit")],
    window: Window = 512,
    threshold: Threshold = 2.0,
    min_steps: MinSteps = 0,
    check_at: CheckAt = "every",
    think_end: ThinkEnd = None,
    think_start: ThinkStart = "<think>",
    temperature: Temperature = 0.6,
    max_new_tokens: int = 4096,
    batch_size: int = 8,
    seed: int = 0,
) -> None:
    """Generate with the RPDI exit; writes each prompt's text, think tokens and exit step."""
    params = _rpdi_params(window, threshold, min_steps, check_at)
    _sampling(temperature, max_new_tokens, batch_size, seed)
    records = read_jsonl(prompts, "--prompts", ("prompt",), text=("prompt",))
    check_output_file(out, "--out", (".jsonl",))
    lm, tokenizer, think_end, think_start = _load(model, think_end, think_start)
    from mixlab.llm_efficiency.rpdi_ee.evaluate import generate_all, make_processor

    rows = generate_all(
        lm,
        tokenizer,
        [str(r["prompt"]) for r in records],
        lambda: make_processor(
            "rpdi", params, lm, tokenizer, think_end=think_end, think_start=think_start
        ),
        seed=seed,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        think_end=think_end,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for record, row in zip(records, rows, strict=True):
            f.write(json.dumps({**record, **row}) + "\n")
    exits = sum(r["exit_step"] is not None for r in rows)
    typer.echo(f"wrote {len(rows)} outputs to {out} ({exits} early exits)")


def answer_of(text_after_think: str, special_tokens: list[str]) -> str | None:
    """The answer after the think end: the last ``\\boxed{...}``, else the first word."""
    for token in special_tokens:
        text_after_think = text_after_think.replace(token, " ")
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text_after_think)
    if boxed:
        return boxed[-1].strip()
    words = text_after_think.split()
    return words[0].strip(".,;:!?") if words else None


def _evaluate(lm, tokenizer, tasks, method, params, think_end, think_start, options):
    from mixlab.llm_efficiency.rpdi_ee.evaluate import generate_all, make_processor

    rows = generate_all(
        lm,
        tokenizer,
        [str(t["prompt"]) for t in tasks],
        lambda: make_processor(
            method,
            params,
            lm,
            tokenizer,
            think_end=think_end,
            think_start=think_start,
            answer_prompt=options["answer_prompt"],
            transitions=options["transitions"],
        ),
        think_end=think_end,
        **{k: options[k] for k in ("seed", "batch_size", "max_new_tokens", "temperature")},
    )
    right = 0
    for task, row in zip(tasks, rows, strict=True):
        text = row["text"]
        after = text[text.index(think_end) + len(think_end) :] if think_end in text else ""
        right += answer_of(after, tokenizer.all_special_tokens) == str(task["answer"]).strip()
    n = len(rows)
    return {
        "method": method,
        **{k: v for k, v in params.items() if k != "check_at"},
        "accuracy": right / n,
        "think_tokens": sum(r["think_tokens"] for r in rows) / n,
        "forward_tokens": sum(r["forward_tokens"] for r in rows) / n,
        "probe_tokens": sum(r["probe_tokens"] for r in rows) / n,
        "seconds_per_problem": sum(r["seconds"] for r in rows) / n,
    }


def _common(
    model, tasks, think_end, think_start, temperature, max_new_tokens, batch_size, seed
) -> tuple:
    _sampling(temperature, max_new_tokens, batch_size, seed)
    records = read_jsonl(tasks, "--tasks", ("prompt", "answer"), text=("prompt",))
    lm, tokenizer, think_end, think_start = _load(model, think_end, think_start)
    options = {
        "seed": seed,
        "batch_size": batch_size,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
    }
    return records, lm, tokenizer, think_end, think_start, options


@app.command("eval")
def evaluate(
    model: Model,
    tasks: Annotated[Path, typer.Option(help="JSON lines with 'prompt' and 'answer'")],
    methods: Annotated[str, typer.Option(help=f"comma-separated, of {','.join(METHOD_NAMES)}")] = (
        "vanilla,rpdi"
    ),
    window: Window = 512,
    threshold: Threshold = 2.0,
    min_steps: MinSteps = 0,
    check_at: CheckAt = "every",
    budget: Annotated[int, typer.Option(help="fixed budget: think tokens")] = 1024,
    deer_threshold: Annotated[float, typer.Option(help="DEER: confidence theta")] = 0.95,
    probe_interval: Annotated[int, typer.Option(help="Dynasor/EAT: tokens between probes")] = 64,
    agree: Annotated[int, typer.Option(help="Dynasor: agreeing probes to exit")] = 3,
    eat_threshold: Annotated[float, typer.Option(help="EAT: EMA-variance delta")] = 1e-3,
    answer_prompt: Annotated[
        str | None, typer.Option(help="probes decode the answer after this (default: think end)")
    ] = None,
    transitions: Annotated[str, typer.Option(help="DEER: comma-separated transition words")] = (
        "Wait"
    ),
    think_end: ThinkEnd = None,
    think_start: ThinkStart = "<think>",
    temperature: Temperature = 0.6,
    max_new_tokens: int = 4096,
    batch_size: int = 8,
    seed: int = 0,
    out: Annotated[Path | None, typer.Option(help="also write the table as JSON")] = None,
) -> None:
    """Accuracy, think and forward tokens and wall time of each method on the tasks."""
    names = [m.strip() for m in methods.split(",") if m.strip()]
    if not names:  # an empty list evaluated nothing and exited 0 (issue 80)
        raise ValueError(
            f"--methods must name at least one of {list(METHOD_NAMES)}, got {methods!r}"
        )
    for name in names:
        if name not in METHOD_NAMES:
            raise ValueError(f"--methods must name methods of {list(METHOD_NAMES)}, got {name!r}")
    check_count(budget, "--budget")
    check_number(deer_threshold, "--deer-threshold", 0 < deer_threshold <= 1, "a number in (0, 1]")
    check_count(probe_interval, "--probe-interval")
    check_count(agree, "--agree")
    check_number(eat_threshold, "--eat-threshold", eat_threshold > 0, "a number > 0")
    if out is not None:
        check_output_file(out, "--out", (".json",))
    params = {
        "vanilla": {},
        "budget": {"budget": budget},
        "rpdi": _rpdi_params(window, threshold, min_steps, check_at),
        "deer": {"threshold": deer_threshold},
        "dynasor": {"interval": probe_interval, "agree": agree},
        "eat": {"interval": probe_interval, "threshold": eat_threshold},
    }
    records, lm, tokenizer, think_end, think_start, options = _common(
        model, tasks, think_end, think_start, temperature, max_new_tokens, batch_size, seed
    )
    options["answer_prompt"] = answer_prompt
    options["transitions"] = [w for w in transitions.split(",") if w]
    table = [
        _evaluate(lm, tokenizer, records, m, params[m], think_end, think_start, options)
        for m in names
    ]
    typer.echo(f"{'method':<10}{'accuracy':>10}{'think':>10}{'forward':>10}{'s/problem':>11}")
    for row in table:
        typer.echo(
            f"{row['method']:<10}{row['accuracy']:>10.3f}{row['think_tokens']:>10.1f}"
            f"{row['forward_tokens']:>10.1f}{row['seconds_per_problem']:>11.4f}"
        )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(table, indent=1))


@app.command()
def sweep(
    model: Model,
    tasks: Annotated[Path, typer.Option(help="JSON lines with 'prompt' and 'answer'")],
    out: Annotated[Path, typer.Option(help="folder for sweep.csv and pareto.png")],
    windows: Annotated[str, typer.Option(help="comma-separated W")] = "16,64,256,512",
    thresholds: Annotated[str, typer.Option(help="comma-separated lambda")] = "1.2,1.5,2,3",
    min_steps: MinSteps = 0,
    check_at: CheckAt = "every",
    think_end: ThinkEnd = None,
    think_start: ThinkStart = "<think>",
    temperature: Temperature = 0.6,
    max_new_tokens: int = 4096,
    batch_size: int = 8,
    seed: int = 0,
) -> None:
    """RPDI over a W x lambda grid (and vanilla): a CSV and an accuracy-vs-tokens Pareto PNG."""
    grid = [
        _rpdi_params(w, t, min_steps, check_at)
        for w in _numbers(windows, "--windows", int)
        for t in _numbers(thresholds, "--thresholds", float)
    ]
    check_output_folder(out, "--out")
    records, lm, tokenizer, think_end, think_start, options = _common(
        model, tasks, think_end, think_start, temperature, max_new_tokens, batch_size, seed
    )
    options.update(answer_prompt=None, transitions=[])
    table = [_evaluate(lm, tokenizer, records, "vanilla", {}, think_end, think_start, options)]
    table += [
        _evaluate(lm, tokenizer, records, "rpdi", p, think_end, think_start, options) for p in grid
    ]
    out.mkdir(parents=True, exist_ok=True)
    columns = ["method", "window", "threshold", "min_steps", "accuracy", "think_tokens"]
    columns += ["forward_tokens", "seconds_per_problem"]
    with (out / "sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
    _pareto_plot(table, out / "pareto.png")
    typer.echo(f"wrote {out / 'sweep.csv'} and {out / 'pareto.png'} ({len(table)} runs)")


def _pareto_plot(table: list[dict[str, Any]], path: Path) -> None:
    from mixlab.shared import line_plot

    rpdi = sorted((r["think_tokens"], r["accuracy"]) for r in table if r["method"] == "rpdi")
    front, best = [], -1.0
    for tokens, accuracy in rpdi:  # fewer tokens first: keep each point that beats all cheaper
        if accuracy > best:
            front.append((tokens, accuracy))
            best = accuracy
    vanilla = next(r for r in table if r["method"] == "vanilla")
    line_plot(
        path,
        {
            "RPDI grid": ([p[0] for p in rpdi], [p[1] for p in rpdi]),
            "RPDI Pareto front": ([p[0] for p in front], [p[1] for p in front]),
            "vanilla": ([vanilla["think_tokens"]], [vanilla["accuracy"]]),
        },
        xlabel="think tokens per problem",
        ylabel="accuracy",
        title="RPDI W x lambda sweep",
    )
