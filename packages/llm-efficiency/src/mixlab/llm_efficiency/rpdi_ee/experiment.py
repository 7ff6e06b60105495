"""RPDI early exit against vanilla thinking, fixed budgets and DEER-, Dynasor- and EAT-style
probing exits on the reasoning toy (``mixlab run rpdi_ee``).

The toy (:mod:`mixlab.llm_efficiency.reasoning`) is a tiny Llama trained here, once, on
generated mod-10 chains whose traces hold productive self-corrections ("wait" after a wrong
step) before the first answer and harmful overthinking rounds after it. Every method samples
at ``temperature`` with the same seeds; a problem is right when the digit after ``</think>``
is its answer.

1. Validation problems (their own seed, one sampling seed) pick each method's parameters:
   RPDI's W x lambda (checked at step boundaries, the ``.`` ending each step), DEER's theta,
   Dynasor's N (k = 2), EAT's delta (a probe every 8 tokens), the fixed budget: the highest
   accuracy, ties to fewer forward tokens. The probing baselines decode their trial answer
   after ``"</think> "`` (the toy writes the digit next: after ``</think>`` alone the probed
   token would be the space, certain every time).
2. Test problems (their own seed) x ``n_seeds`` sampling seeds give the claims, with
   ``first_answer`` (``</think>`` forced right after the first ``answer=<d>.``, the exit an
   oracle would pick) as the regime reference.

Regime checks (fixed in advance; when one fails every claim is untested): first-answer accuracy
>= 0.85 (chance 0.1); vanilla at least 10 points below it (overthinking hurts); at least 20 % of
vanilla traces hold a productive "wait" before their first answer.

The claims (``Config.CLAIMS``) are judged seed by seed on the test cells, each again with its
control in RPDI's place (the tuned fixed budget; vanilla for "largest gain").
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from mixlab.llm_efficiency.reasoning import (
    THINK_END,
    parse_answer,
    pretrained_reasoning_lm,
    problems,
)
from mixlab.llm_efficiency.rpdi_ee.config import (
    FEWER,
    GAIN,
    METHOD,
    PREMATURE_MAX,
    RIVALS,
    SYSTEMS,
    TUNED,
    Config,
)
from mixlab.llm_efficiency.rpdi_ee.evaluate import generate_all, make_processor
from mixlab.llm_efficiency.rpdi_ee.processor import ThinkExitProcessor
from mixlab.shared import Claim, Result, line_plot, mean_std, run_cells
from mixlab.shared.files import write_json_atomic

__all__ = ["METHOD", "Config", "claims", "per_seed_values", "regime", "run", "summarise"]

VAL_SEED, TEST_SEED = 1_000, 2_000  # problem seeds, offset by config.seed
ANSWER_PROMPT = f"{THINK_END} "
"""what the probing baselines decode a trial answer after: the toy writes the digit next"""
TRANSITIONS = ("wait ", "hmm ")
"""the toy's transition words, where DEER-style probes"""
FIRST_ANSWER_MIN = 0.85
"""regime: accuracy with </think> forced after the first stated answer (chance 0.1)"""
OVERTHINKING_COST = 0.10
"""regime: vanilla at least this far below the first answer"""
PRODUCTIVE_MIN = 0.20
"""regime: share of vanilla traces with a productive "wait" before the first answer"""
_ANSWER = re.compile(r"answer=\d\.")
_STATED = re.compile(r"answer=\d\.$")


class FirstAnswerExit(ThinkExitProcessor):
    """The regime's reference: forces the think end right after the first ``answer=<d>.``."""

    def __init__(self, think_end_ids, tokenizer, **kwargs) -> None:
        super().__init__(think_end_ids, **kwargs)
        self.tokenizer = tokenizer

    def _decide(self, active, input_ids, scores):
        tails = self.tokenizer.batch_decode(input_ids[active, -9:])
        return [b for b, tail in zip(active, tails, strict=True) if _STATED.search(tail)]


def _grid(config: Config) -> dict[str, list[dict[str, Any]]]:
    return {
        "budget": [{"budget": b} for b in config.budgets],
        "rpdi": [
            {"window": w, "threshold": t, "check_at": ["."]}
            for w in config.windows
            for t in config.thresholds
        ],
        "deer": [{"threshold": t} for t in config.deer_thresholds],
        "dynasor": [{"interval": n, "agree": 2} for n in config.dynasor_intervals],
        "eat": [{"interval": 8, "threshold": t} for t in config.eat_thresholds],
    }


def score(rows: list[dict[str, Any]], answers: list[int]) -> dict[str, float]:
    """Per-run metrics of generated rows (text after ``<think>``) against the answers."""
    n = len(rows)
    right = productive = premature = exits = 0
    for row, answer in zip(rows, answers, strict=True):
        text = row["text"]
        end = text.find(THINK_END)
        think = text if end < 0 else text[:end]
        after = "" if end < 0 else text[end + len(THINK_END) :]
        right += parse_answer(after) == answer
        first = _ANSWER.search(think)
        before_first = think if first is None else think[: first.start()]
        has_productive = "wait " in before_first  # a correction before any answer was stated
        productive += has_productive
        exited = row["exit_step"] is not None
        exits += exited
        premature += has_productive and exited and first is None
    return {
        "accuracy": right / n,
        "think_tokens": sum(r["think_tokens"] for r in rows) / n,
        "forward_tokens": sum(r["forward_tokens"] for r in rows) / n,
        "probe_tokens": sum(r["probe_tokens"] for r in rows) / n,
        "seconds_per_problem": sum(r["seconds"] for r in rows) / n,
        "exit_rate": exits / n,
        "productive_wait_rate": productive / n,
        "premature_exit_rate": premature / productive if productive else 0.0,
    }


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    model, tokenizer = pretrained_reasoning_lm(config.lm_config())  # cached, outside the cells
    think_end_ids = tokenizer.encode(THINK_END, add_special_tokens=False)
    think_start_id = tokenizer.convert_tokens_to_ids("<think>")
    splits = {
        "val": problems(config.n_val, config.seed + VAL_SEED, max_steps=config.max_chain),
        "test": problems(config.n_test, config.seed + TEST_SEED, max_steps=config.max_chain),
    }

    def factory(method: str, params: dict[str, Any]):
        if method == "first_answer":
            return lambda: FirstAnswerExit(
                think_end_ids,
                tokenizer,
                think_start_id=think_start_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        return lambda: make_processor(
            method,
            params,
            model,
            tokenizer,
            answer_prompt=ANSWER_PROMPT,
            transitions=TRANSITIONS,
        )

    def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
        chosen = splits[cell["split"]]
        rows = generate_all(
            model,
            tokenizer,
            [p.model_input for p in chosen],
            factory(cell["method"], cell["params"]),
            seed=cell["seed"],
            batch_size=config.batch_size,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
        )
        return {**cell, **score(rows, [p.answer for p in chosen])}

    grid = _grid(config)
    val_cells = [
        {"split": "val", "method": m, "params": p, "seed": config.seed}
        for m in TUNED
        for p in grid[m]
    ]
    val = run_cells(out_dir, config, val_cells, run_cell, resume=resume, label="rpdi_ee validation")
    picked = {m: pick([c for c in val if c["method"] == m]) for m in TUNED}
    params = {"first_answer": {}, "vanilla": {}, **picked}
    test_cells = [
        {"split": "test", "method": m, "params": params[m], "seed": config.seed + s}
        for s in range(config.n_seeds)
        for m in SYSTEMS
    ]
    test = run_cells(out_dir, config, test_cells, run_cell, resume=True, label="rpdi_ee test")
    write_json_atomic(out_dir / "cells.json", [*val, *test], indent=1)
    metrics = summarise(test, picked)
    _plot(val, metrics, out_dir)
    claimed = claims(per_seed_values(test), config)
    return Result(metrics=metrics, claims=claimed, regime=regime(metrics))


def pick(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The validation cell's parameters with the highest accuracy, ties to fewer forward tokens."""
    best = max(cells, key=lambda c: (c["accuracy"], -c["forward_tokens"]))
    return best["params"]


_MEASURED = (
    "accuracy",
    "think_tokens",
    "forward_tokens",
    "probe_tokens",
    "seconds_per_problem",
    "exit_rate",
    "productive_wait_rate",
    "premature_exit_rate",
)
_PARAMS = ("budget", "window", "threshold", "interval")


def summarise(
    cells: list[dict[str, Any]], picked: dict[str, dict[str, Any]]
) -> dict[str, dict[str, float | None]]:
    """One row per system: each measured value's mean over the sampling seeds (``<name>``) and
    its std (``<name>_std``), the number of seeds, and the parameters validation picked (None
    where a system has no such parameter)."""
    metrics = {}
    for system in SYSTEMS:
        mine = [c for c in cells if c["method"] == system]
        row: dict[str, float | None] = {}
        for name in _MEASURED:
            row[name], row[f"{name}_std"] = mean_std([c[name] for c in mine])
        row["seeds"] = len(mine)
        for name in _PARAMS:
            row[name] = picked.get(system, {}).get(name)
        metrics[system] = row
    return metrics


def regime(metrics: dict[str, dict[str, Any]]) -> list[Claim]:
    """Can this toy show overthinking at all? Margins fixed in advance (issue 18)."""
    first, vanilla = metrics["first_answer"], metrics["vanilla"]
    return [
        Claim.compare(
            f"Forcing </think> right after the first stated answer is at least "
            f"{FIRST_ANSWER_MIN:.0%} accurate (chance 10%)",
            first["accuracy"],
            ">=",
            FIRST_ANSWER_MIN,
            value_label="first-answer accuracy",
        ),
        Claim.compare(
            f"Overthinking hurts: vanilla is at least {OVERTHINKING_COST * 100:.0f} points below "
            "the first answer",
            vanilla["accuracy"],
            "<=",
            first["accuracy"] - OVERTHINKING_COST,
            value_label="vanilla accuracy",
            reference_label=f"first-answer accuracy - {OVERTHINKING_COST}",
        ),
        Claim.compare(
            f'At least {PRODUCTIVE_MIN:.0%} of vanilla traces hold a productive "wait" before '
            "their first answer",
            vanilla["productive_wait_rate"],
            ">=",
            PRODUCTIVE_MIN,
            value_label="share of vanilla traces",
        ),
    ]


def per_seed_values(cells: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """What the claims read: per system, each measured value on every test sampling seed (in
    seed order, paired across systems)."""
    seeds = sorted({c["seed"] for c in cells})
    by_key = {(c["method"], c["seed"]): c for c in cells}
    return {
        system: {name: [float(by_key[(system, s)][name]) for s in seeds] for name in _MEASURED}
        for system in SYSTEMS
    }


def claims(values: dict[str, dict[str, list[float]]], config: Config) -> list[Claim]:
    """The claims (``Config.CLAIMS``), each judged seed by seed on ``values``
    (:func:`per_seed_values`) for RPDI and again with its control in RPDI's place."""
    seeds = [config.seed + s for s in range(config.n_seeds)]  # test sampling seeds, as run() draws

    def seeds_of(system: str, name: str) -> list[float]:
        return values[system][name]  # a KeyError: the system did not run

    def gain_with_fewer_tokens(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "accuracy",
                    seeds_of(system, "accuracy"),
                    ">=",
                    [v + GAIN for v in seeds_of("vanilla", "accuracy")],
                    seeds=seeds,
                    value_label=f"{system} accuracy",
                    reference_label=f"vanilla + {GAIN}",
                ),
                Claim.worst_seed(
                    "think tokens",
                    seeds_of(system, "think_tokens"),
                    "<=",
                    [(1 - FEWER) * v for v in seeds_of("vanilla", "think_tokens")],
                    seeds=seeds,
                    value_label=f"{system} think tokens",
                    reference_label=f"{1 - FEWER:g} x vanilla's",
                ),
            ],
        )

    def largest_gain(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    f"vs {rival}",
                    seeds_of(system, "accuracy"),
                    ">",
                    seeds_of(rival, "accuracy"),
                    seeds=seeds,
                    value_label=f"{system} accuracy",
                    reference_label=rival,
                )
                for rival in RIVALS
                if rival != system
            ],
        )

    def no_probe_cost(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "probe tokens",
                    seeds_of(system, "probe_tokens"),
                    "<=",
                    0.0,
                    seeds=seeds,
                    value_label=f"{system} probe tokens per problem",
                ),
                Claim.worst_seed(
                    "wall time",
                    seeds_of(system, "seconds_per_problem"),
                    "<",
                    seeds_of("deer", "seconds_per_problem"),
                    seeds=seeds,
                    value_label=f"{system} s/problem",
                    reference_label="DEER-style",
                ),
            ],
        )

    def few_premature_exits(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "rate",
                    seeds_of(system, "premature_exit_rate"),
                    "<=",
                    PREMATURE_MAX,
                    seeds=seeds,
                    value_label=f"{system} premature exits",
                ),
                Claim.worst_seed(
                    "vs DEER",
                    seeds_of(system, "premature_exit_rate"),
                    "<",
                    seeds_of("deer", "premature_exit_rate"),
                    seeds=seeds,
                    value_label=system,
                    reference_label="DEER-style",
                ),
            ],
        )

    return [
        config.judge("gain_with_fewer_tokens", gain_with_fewer_tokens),
        config.judge("largest_gain", largest_gain),
        config.judge("no_probe_cost", no_probe_cost),
        config.judge("few_premature_exits", few_premature_exits),
    ]


def _plot(val: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], out_dir: Path) -> None:
    series = {}
    for method in TUNED:  # each method's validation grid, by compute
        points = sorted((c["forward_tokens"], c["accuracy"]) for c in val if c["method"] == method)
        series[f"{method} (validation grid)"] = ([p[0] for p in points], [p[1] for p in points])
    for system in SYSTEMS:  # the test result of each system, as picked
        row = metrics[system]
        series[f"{system} (test)"] = ([row["forward_tokens"]], [row["accuracy"]])
    line_plot(
        out_dir / "accuracy_vs_forward_tokens.png",
        series,
        xlabel="forward tokens per problem (generated + probes)",
        ylabel="accuracy",
        title="reasoning toy: early exit",
    )
