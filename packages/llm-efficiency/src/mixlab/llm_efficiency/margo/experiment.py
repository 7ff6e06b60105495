"""GRPO think-only, mixed-mode GRPO (lambda = 0) and MARGO on a closed-book world
(``mixlab run margo``).

A hybrid-mode Llama is SFT'd once (cached) on the world of :mod:`.world`: facts as sentences,
direct answers, and thinking traces that help on 2-hop questions and arithmetic but drift to a
colleague's city on some 1-hop questions. From it, every condition trains with TRL's GRPO
(:class:`.MARGOTrainer`; think-only is ``num_direct = 0``) for the same steps, prompts (the
training people's questions and arithmetic chains), rollouts and seeds, with an exact-match
reward. A probe of held-out questions every ``probe_every`` steps gives the over-steps plot; each
final model is sampled in both modes on the held-out people's questions and held-out chains.

Regime checks on the SFT model (fixed in advance by the issue; when one fails, the claims are
untested): direct 1-hop accuracy >= 85 %; thinking beats direct on 2-hop by >= 15 points;
thinking overturns >= 10 % of the correct direct 1-hop answers.

The claims (``Config.CLAIMS``) are judged for every MARGO condition seed by seed, each again with
its control in its place: mixed lambda = 0 (the same mixed groups without the cross-mode score),
or GRPO think-only for the claim whose reference is mixed lambda = 0.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.llm_efficiency.margo.config import (
    LENGTH_KEEP,
    MATH_SLACK,
    METHOD,
    MIXED,
    OVERTURN_CUT,
    QA_GAIN,
    THINK_ONLY,
    Config,
)
from mixlab.llm_efficiency.margo.policy import evaluate_modes, sft_policy
from mixlab.llm_efficiency.margo.world import (
    DIRECT_PREFIX,
    KINDS,
    THINKING_PREFIX,
    Question,
    World,
    questions,
)
from mixlab.llm_efficiency.rl import grpo_options, train_reporting
from mixlab.shared import Claim, Result, judge, line_plot, mean_std, progress, run_cells
from mixlab.shared.files import write_json_atomic

__all__ = [
    "METHOD",
    "Config",
    "claims",
    "per_seed_values",
    "regime",
    "rl_prompts",
    "run",
    "summarise",
]

TRAIN_MATH_SEED, TEST_MATH_SEED, PROMPT_SEED = 1, 2, 3
"""the RL arithmetic chains, the held-out ones and the RL prompt order have their own seeds"""
PROBE_PEOPLE, PROBE_SAMPLES = 60, 2
"""the over-steps probe: the 1-hop and 2-hop questions of this many held-out people, sampled
this many times per mode"""


def rl_prompts(world: World, config: Config, n: int) -> list[dict[str, Any]]:
    """``n`` training rows: the training people's 1-hop and 2-hop questions and arithmetic
    chains in the shares ``config.rl_mix``, shuffled (seeded)."""
    rng = np.random.default_rng(PROMPT_SEED)
    pools = {
        "1hop": questions(world, "train", "1hop"),
        "2hop": questions(world, "train", "2hop"),
        "math": questions(world, "train", "math", n_math=n, seed=TRAIN_MATH_SEED),
    }
    shares = np.array(config.rl_mix, dtype=float) / sum(config.rl_mix)
    kinds = rng.choice(KINDS, size=n, p=shares)
    return [pools[k][rng.integers(len(pools[k]))].row() for k in kinds]


def _test_sets(world: World, config: Config) -> dict[str, list[Question]]:
    return {
        kind: questions(world, "test", kind, n_math=config.n_math_test, seed=TEST_MATH_SEED)
        for kind in KINDS
    }


def evaluate(model: Any, tokenizer: Any, tests: dict[str, list[Question]], *, samples: int,
             seed: int, max_new_tokens: int) -> dict[str, float | None]:  # fmt: skip
    """Both modes on every kind of held-out question, flattened (``thinking_1hop``,
    ``overturn_1hop``, ...), plus ``thinking_qa``: thinking accuracy over 1-hop and 2-hop."""
    out: dict[str, float | None] = {}
    with progress(len(tests), "held-out evaluation") as bar:
        for kind, qs in tests.items():
            measured = evaluate_modes(
                model, tokenizer, qs, samples=samples, seed=seed, max_new_tokens=max_new_tokens
            )
            out |= {
                f"thinking_{kind}": measured["thinking_accuracy"],
                f"direct_{kind}": measured["direct_accuracy"],
                f"overturn_{kind}": measured["overturn_rate"],
                f"think_length_{kind}": measured["think_length"],
            }
            if kind == "1hop":
                out["associate_share_1hop"] = measured["associate_share"]
            bar.advance()
    if "1hop" in tests and "2hop" in tests:
        n1, n2 = len(tests["1hop"]), len(tests["2hop"])
        out["thinking_qa"] = (out["thinking_1hop"] * n1 + out["thinking_2hop"] * n2) / (n1 + n2)
    return out


def _probe_callback(tokenizer: Any, probe: dict[str, list[Question]], every: int,
                    max_new_tokens: int) -> Any:  # fmt: skip
    """A callback that samples the probe questions every ``every`` steps (and at the last) and
    writes ``probe/...`` rows into the trainer's log history (saved in its checkpoints, so a
    resumed run keeps them). Its sampling leaves the training RNG untouched."""
    from transformers import TrainerCallback

    class Probe(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every and state.global_step != state.max_steps:
                return
            was_training = model.training
            model.eval()
            with torch.random.fork_rng(devices=[]):
                measured = evaluate(model, tokenizer, probe, samples=PROBE_SAMPLES, seed=0,
                                    max_new_tokens=max_new_tokens)  # fmt: skip
            model.train(was_training)
            state.log_history.append(
                {"step": state.global_step} | {f"probe/{k}": v for k, v in measured.items()}
            )

    return Probe()


def _margo_args(config: Config, cell: dict[str, Any], out_dir: Path) -> Any:
    from mixlab.llm_efficiency.margo.trainer import MARGOConfig

    _, num_direct, lam, one_sided = _condition(config, cell["condition"])
    options = grpo_options(
        out_dir,
        steps=config.steps,
        prompts_per_step=config.prompts_per_step,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        learning_rate=config.learning_rate,
        warmup_ratio=config.warmup_ratio,
        seed=cell["seed"],
    )
    return MARGOConfig(
        **options,
        num_direct=num_direct,
        num_thinking=config.num_generations - num_direct,
        margo_lambda=lam,
        one_sided=one_sided,
        thinking_prefix=THINKING_PREFIX,
        direct_prefix=DIRECT_PREFIX,
    )


def _condition(config: Config, name: str) -> tuple[str, int, float, bool]:
    return next(tuple(c) for c in config.conditions if c[0] == name)


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from mixlab.llm_efficiency.margo.trainer import MARGOTrainer

    policy = config.policy_config()
    _, tokenizer, world = sft_policy(policy)
    # the RL steps are many small ops (one thread as fast as two); generation on a busy 2-core
    # machine ran 25x slower with two threads
    torch.set_num_threads(1)
    tests = _test_sets(world, config)
    probe = {kind: tests[kind][:PROBE_PEOPLE] for kind in ("1hop", "2hop")}
    rows = rl_prompts(world, config, config.steps * config.prompts_per_step * 4)
    measure = {"samples": config.test_samples, "max_new_tokens": config.max_completion_length}

    def train(cell: dict[str, Any]) -> dict[str, Any]:
        slug = "".join(ch if ch.isalnum() else "_" for ch in cell["condition"])
        run_dir = out_dir / "runs" / f"{slug}-{cell['seed']}"
        model, _, _ = sft_policy(policy)
        trainer = MARGOTrainer(
            model=model,
            args=_margo_args(config, cell, run_dir),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[
                _probe_callback(tokenizer, probe, config.probe_every, config.max_completion_length)
            ],
        )
        trainer.remove_callback(PrinterCallback)  # the per-step logs go to the result
        train_reporting(trainer, "GRPO steps")  # resumes from run_dir's last checkpoint
        measured = evaluate(trainer.model.eval(), tokenizer, tests, seed=cell["seed"], **measure)
        return {**cell, **measured, "curves": _curves(trainer.state.log_history)}

    def sft(cell: dict[str, Any]) -> dict[str, Any]:
        model, _, _ = sft_policy(policy)
        at_start = evaluate(model, tokenizer, probe, samples=PROBE_SAMPLES, seed=0,
                            max_new_tokens=config.max_completion_length)  # fmt: skip
        measured = evaluate(model, tokenizer, tests, seed=config.seed, **measure)
        return {**cell, **measured, "probe": at_start}

    seeds = [config.seed + s for s in range(config.n_seeds)]
    cells = [{"system": "sft"}] + [
        {"condition": c[0], "seed": s} for c in config.conditions for s in seeds
    ]
    done = run_cells(
        out_dir,
        config,
        cells,
        lambda cell: sft(cell) if "system" in cell else train(cell),
        resume=resume,
        label="margo",
    )
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    metrics = summarise(done, config)
    _plot(done, config, out_dir)
    tested = claims(per_seed_values(done, config), config)
    return Result(metrics=metrics, claims=tested, regime=regime(metrics, config))


def _curves(log_history: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """The probe rows (held-out, every ``probe_every`` steps) and the per-step training rows
    (mode rewards, overturn, think length) of a run."""
    probes = [row for row in log_history if "probe/overturn_1hop" in row]
    steps = [row for row in log_history if "reward" in row]

    def column(rows: list[dict[str, Any]], key: str) -> list[float | None]:
        values = [row.get(key) for row in rows]
        return [float(v) if v is not None and math.isfinite(float(v)) else None for v in values]

    out = {"probe_step": column(probes, "step")}
    out |= {k.removeprefix("probe/"): column(probes, k) for k in probes[0] if k != "step"}
    out["step"] = column(steps, "step")
    for key in ("margo/reward_thinking", "margo/reward_direct", "margo/overturn_rate",
                "margo/think_length"):  # fmt: skip
        out[key.removeprefix("margo/")] = column(steps, key)
    return out


METRICS = (
    "thinking_1hop", "direct_1hop", "overturn_1hop", "associate_share_1hop", "think_length_1hop",
    "thinking_2hop", "direct_2hop", "think_length_2hop",
    "thinking_math", "direct_math", "think_length_math", "thinking_qa",
)  # fmt: skip


def summarise(done: list[dict[str, Any]], config: Config) -> dict[str, dict[str, Any]]:
    """One row per system: SFT, then every condition (mean and std over seeds)."""

    def row(cells: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"n_seeds": len(cells)}
        for m in METRICS:
            values = [c[m] for c in cells if c.get(m) is not None]
            out[m], out[f"{m}_std"] = mean_std(values) if values else (None, None)
        return out

    metrics = {"SFT": row([d for d in done if d.get("system") == "sft"])}
    for name, *_ in config.conditions:
        metrics[name] = row([d for d in done if d.get("condition") == name])
    return metrics


def _value(row: dict[str, Any], key: str) -> float:
    """A metric for a claim: NaN when it was not measured (a claim on NaN does not hold)."""
    value = row.get(key)
    return math.nan if value is None else float(value)


def regime(metrics: dict[str, dict[str, Any]], config: Config) -> list[Claim]:
    """Can the setup show thinking-induced hallucination and beneficial thinking? Margins fixed
    in advance (issue 21), on the SFT model."""
    sft = metrics["SFT"]
    return [
        Claim.compare(
            f"the SFT model's direct 1-hop accuracy is at least {config.min_direct_one_hop:.0%}",
            _value(sft, "direct_1hop"),
            ">=",
            config.min_direct_one_hop,
            value_label="direct 1-hop accuracy",
        ),
        Claim.compare(
            f"its thinking beats its direct mode on 2-hop questions by at least "
            f"{config.min_two_hop_gain * 100:.0f} points",
            _value(sft, "thinking_2hop"),
            ">=",
            _value(sft, "direct_2hop") + config.min_two_hop_gain,
            value_label="thinking 2-hop accuracy",
            reference_label=f"direct + {config.min_two_hop_gain}",
        ),
        Claim.compare(
            f"its thinking overturns at least {config.min_overturn:.0%} of its correct direct "
            "1-hop answers",
            _value(sft, "overturn_1hop"),
            ">=",
            config.min_overturn,
            value_label="1-hop overturn rate",
        ),
    ]


def per_seed_values(
    done: list[dict[str, Any]], config: Config
) -> dict[str, dict[str, list[float]]]:
    """What the claims read: every condition's measured values per RL seed (in seed order,
    paired across conditions; NaN where not measured), and the SFT model's (one evaluation,
    one value each)."""

    def numbers(cells: list[dict[str, Any]]) -> dict[str, list[float]]:
        return {m: [_value(c, m) for c in cells] for m in METRICS}

    values = {"SFT": numbers([d for d in done if d.get("system") == "sft"])}
    for name, *_ in config.conditions:
        cells = sorted((d for d in done if d.get("condition") == name), key=lambda d: d["seed"])
        values[name] = numbers(cells)
    return values


def claims(values: dict[str, dict[str, list[float]]], config: Config) -> list[Claim]:
    """The issue's claims (``Config.CLAIMS``) for every MARGO condition (lambda > 0), each judged
    seed by seed on ``values`` (:func:`per_seed_values`) against SFT, GRPO think-only and mixed
    lambda = 0, and again with its control (mixed lambda = 0, or think-only for
    ``qa_beats_mixed``) in the condition's place."""
    seeds = [config.seed + s for s in range(config.n_seeds)]  # as run() trains them

    def seeds_of(system: str, name: str) -> list[float]:
        return values[system][name]  # a KeyError: the condition did not run

    def sft(name: str) -> float:
        return seeds_of("SFT", name)[0]

    def overturn_suppressed(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "at most half SFT's",
                    seeds_of(system, "overturn_1hop"),
                    "<=",
                    OVERTURN_CUT * sft("overturn_1hop"),
                    seeds=seeds,
                    value_label=f"{system} overturn rate",
                    reference_label=f"{OVERTURN_CUT} x SFT's",
                ),
                Claim.worst_seed(
                    "below GRPO think-only's",
                    seeds_of(system, "overturn_1hop"),
                    "<",
                    seeds_of(THINK_ONLY, "overturn_1hop"),
                    seeds=seeds,
                    value_label=f"{system} overturn rate",
                    reference_label="think-only's",
                ),
            ],
        )

    def qa_beats_think_only(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "thinking_qa"),
            ">=",
            [v + QA_GAIN for v in seeds_of(THINK_ONLY, "thinking_qa")],
            seeds=seeds,
            value_label=f"{system} thinking accuracy",
            reference_label=f"think-only's + {QA_GAIN}",
        )

    def qa_beats_mixed(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "thinking_qa"),
            ">",
            seeds_of(MIXED, "thinking_qa"),
            seeds=seeds,
            value_label=f"{system} thinking accuracy",
            reference_label="mixed lambda=0's",
        )

    def two_hop_kept(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "thinking_2hop"),
            ">=",
            sft("thinking_2hop"),
            seeds=seeds,
            value_label=f"{system} 2-hop thinking accuracy",
            reference_label="SFT's",
        )

    def math_kept(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "thinking_math"),
            ">=",
            sft("thinking_math") - MATH_SLACK,
            seeds=seeds,
            value_label=f"{system} arithmetic accuracy",
            reference_label=f"SFT's - {MATH_SLACK}",
        )

    def think_length_kept(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    kind,
                    seeds_of(system, f"think_length_{kind}"),
                    ">=",
                    LENGTH_KEEP * sft(f"think_length_{kind}"),
                    seeds=seeds,
                    value_label=f"{system} think length (tokens)",
                    reference_label=f"{LENGTH_KEEP} x SFT's",
                )
                for kind in ("2hop", "math")
            ],
        )

    tests = {
        "overturn_suppressed": overturn_suppressed,
        "qa_beats_think_only": qa_beats_think_only,
        "qa_beats_mixed": qa_beats_mixed,
        "two_hop_kept": two_hop_kept,
        "math_kept": math_kept,
        "think_length_kept": think_length_kept,
    }
    out = []
    for name, _, lam, _ in config.conditions:
        if lam == 0:
            continue
        for key, test in tests.items():  # the spec, about this MARGO condition
            spec = replace(config.claim_spec(key), system=name)
            out.append(judge(spec, test, config=config, text_values={"system": name}))
    return out


def _plot(done: list[dict[str, Any]], config: Config, out_dir: Path) -> None:
    for metric, name, label in (
        ("overturn_1hop", "overturn_over_steps.png", "1-hop overturn rate"),
        ("thinking_qa", "accuracy_over_steps.png", "thinking accuracy, 1- and 2-hop"),
    ):
        series = {}
        start = next(d for d in done if d.get("system") == "sft")["probe"][metric]
        for condition, *_ in config.conditions:
            curves = [d["curves"] for d in done if d.get("condition") == condition]
            steps = [0.0] + curves[0]["probe_step"]
            values = np.array(
                [[start, *c[metric]] for c in curves], dtype=float
            )  # None -> NaN: not measured (no correct direct answer to overturn)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a step no seed measured
                series[condition] = (steps, np.nanmean(values, 0).tolist())
        line_plot(
            out_dir / name,
            series,
            xlabel="GRPO step",
            ylabel=f"{label} (held-out probe)",
            title=f"{label} (mean of seeds; step 0: SFT)",
        )
