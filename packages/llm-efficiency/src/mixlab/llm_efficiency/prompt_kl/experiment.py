"""GRPO with no KL, response KL and prompt KL on hackable tasks (``mixlab run prompt_kl``).

Per task, a byte-level Llama is SFT'd once (cached) on honest demonstrations with the exploit on
a few cued ones (:mod:`.policy`). From it, every condition trains with TRL's GRPO
(:class:`.PromptKLGRPOTrainer`; TRL's own ``beta`` for the response KL) for the same steps,
prompts, rollouts and seeds, on the same training prompts; the ground truth of every rollout is
logged per step. Each final policy is then sampled on held-out test prompts: hack rate (on cued
prompts), true success, proxy reward.

On each no-KL policy the diagnostics run (:mod:`.diagnostics`): steering by the mean
policy-minus-SFT activation of one block, subtracted at prompt or at response positions over a
grid of strengths; and prompt swapping between the policy and the SFT policy.

Regime checks (fixed in advance by the issue; when one fails the task's claims are untested):
the SFT policy's true success is at least 60 % and 30 points above an untrained policy's; the
no-KL runs' mean test hack rate reaches 50 %.

The claims (``Config.CLAIMS``) are judged seed by seed, each again with its control in the
method's place; the two about prompt KL assume issue 62's premise (swapping in the SFT policy's
prompt encoding at least halves the no-KL policy's hack rate on every seed), untested without it.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.llm_efficiency.prompt_kl.config import (
    HACK_MARGIN,
    KEEP_SUCCESS,
    MATCHED,
    METHOD,
    NO_KL,
    PROMPT_KL,
    RESPONSE_KL_COST,
    SWAP_CUT,
    Config,
)
from mixlab.llm_efficiency.prompt_kl.diagnostics import (
    activation_difference,
    steer,
    swap_generate,
)
from mixlab.llm_efficiency.prompt_kl.policy import evaluate_policy, grpo_config, sft_policy
from mixlab.llm_efficiency.prompt_kl.tasks import ProxyReward, examples
from mixlab.llm_efficiency.rl import train_reporting
from mixlab.shared import Claim, Result, line_plot, mean_std, progress, run_cells
from mixlab.shared.claims import where_run
from mixlab.shared.files import write_json_atomic

__all__ = ["METHOD", "Config", "claims", "per_seed_values", "regime", "run", "summarise"]

TRAIN_SEED, TEST_SEED = 1, 2
"""the training prompts and the held-out test prompts are drawn from their own seeds"""
METRICS = ("hack_rate", "exploit_rate_uncued", "true_success", "proxy_reward")
CONTROL = "control"


def _eval_kwargs(config: Config, seed: int) -> dict[str, Any]:
    return {
        "samples": config.test_samples,
        "seed": seed,
        "max_new_tokens": config.max_completion_length,
    }


def _grpo_args(config: Config, cell: dict[str, Any], out_dir: Path) -> Any:
    _, beta_response, beta_prompt = _condition(config, cell["condition"])
    return grpo_config(
        out_dir,
        steps=config.steps,
        prompts_per_step=config.prompts_per_step,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        learning_rate=config.learning_rate,
        warmup_ratio=config.warmup_ratio,
        beta_response=beta_response,
        beta_prompt=beta_prompt,
        seed=cell["seed"],
    )


def _condition(config: Config, name: str) -> tuple[str, float, float]:
    return next(tuple(c) for c in config.conditions if c[0] == name)


def _curves(log_history: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per-step training logs: the rollouts' ground truth, reward and both KLs."""
    keys = {"hack_rate": "hack_rate", "true_success": "true_success", "reward": "reward",
            "prompt_kl": "prompt_kl", "response_kl": "response_kl"}  # fmt: skip
    rows = [entry for entry in log_history if "reward" in entry]

    def value(row: dict[str, Any], key: str) -> float | None:  # None: not logged at that step
        number = row.get(key)
        return float(number) if number is not None and math.isfinite(float(number)) else None

    return {name: [value(row, key) for row in rows] for name, key in keys.items()} | {
        "step": [float(row["step"]) for row in rows]
    }


def _array(values: list[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)


def _final(curve: list[float | None]) -> float:
    """A logged KL at the end of training: its mean over the last tenth of the steps (NaN when
    it was never logged)."""
    tail = _array(curve)[-max(1, len(curve) // 10) :]
    return math.nan if np.isnan(tail).all() else float(np.nanmean(tail))


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from mixlab.llm_efficiency.prompt_kl.trainer import PromptKLGRPOTrainer

    policies = {task: sft_policy(config.policy_config(task)) for task in config.tasks}
    # the RL steps are many small ops (one thread as fast as two); generation on a busy 2-core
    # machine ran 25x slower with two threads
    torch.set_num_threads(1)
    form = config.policy_config(config.tasks[0]).prompt_format
    test_sets = {task: examples(task, config.n_test, TEST_SEED, **form) for task in config.tasks}
    train_sets = {task: examples(task, config.n_train, TRAIN_SEED, **form) for task in config.tasks}

    def fresh_policy(task: str) -> Any:
        model, _ = sft_policy(config.policy_config(task))
        return model

    def train(cell: dict[str, Any]) -> dict[str, Any]:
        task, seed = cell["task"], cell["seed"]
        tokenizer = policies[task][1]
        run_dir = out_dir / "runs" / f"{task}-{cell['condition'].replace(' ', '_')}-{seed}"
        trainer = PromptKLGRPOTrainer(
            model=fresh_policy(task),
            reward_funcs=ProxyReward(task, caught=config.caught),
            args=_grpo_args(config, cell, run_dir),
            ref_model=policies[task][0],  # the cached SFT policy, frozen: no copy per run
            train_dataset=Dataset.from_list([e.row() for e in train_sets[task]]),
            processing_class=tokenizer,
        )
        trainer.remove_callback(
            PrinterCallback
        )  # the per-step logs go to the result, not the console
        train_reporting(trainer, "GRPO steps")  # resumes from run_dir's last checkpoint
        model = trainer.model.eval()
        measured = evaluate_policy(
            model, tokenizer, task, test_sets[task], **_eval_kwargs(config, seed)
        )
        if cell["condition"] == "no KL":
            model.save_pretrained(out_dir / "policies" / f"{task}-{seed}")
        shutil.rmtree(run_dir, ignore_errors=True)  # the outcome is saved by run_cells
        return {**cell, **measured, "curves": _curves(trainer.state.log_history)}

    def diagnose(cell: dict[str, Any]) -> dict[str, Any]:
        from transformers import AutoModelForCausalLM

        task, seed = cell["task"], cell["seed"]
        reference, tokenizer = policies[task]
        policy = AutoModelForCausalLM.from_pretrained(
            out_dir / "policies" / f"{task}-{seed}"
        ).eval()
        kwargs = _eval_kwargs(config, seed)
        prompts = [e.prompt for e in train_sets[task][:256]]
        direction = activation_difference(policy, reference, tokenizer, prompts, config.steer_layer)
        front = []
        alphas = (0.0, *config.steer_alphas)
        with progress(2 * len(alphas) + 2, "steering and swaps") as bar:
            for where in ("prompt", "response"):
                for alpha in alphas:
                    with steer(policy, direction, alpha, config.steer_layer, where) as generate:
                        point = evaluate_policy(
                            policy, tokenizer, task, test_sets[task], generate=generate, **kwargs
                        )
                    front.append({"where": where, "alpha": alpha, **point})
                    bar.advance()

            def swapped(prompt_model: Any, response_model: Any) -> dict[str, float]:
                def generate(ids: torch.Tensor, mask: torch.Tensor, **kw: Any) -> torch.Tensor:
                    return swap_generate(prompt_model, response_model, ids, mask, **kw)

                measured = evaluate_policy(
                    response_model, tokenizer, task, test_sets[task], generate=generate, **kwargs
                )
                bar.advance()
                return measured

            return {
                **cell,
                "front": front,
                "swap_reference_prompt": swapped(reference, policy),
                "swap_policy_prompt": swapped(policy, reference),
            }

    def baseline(cell: dict[str, Any]) -> dict[str, Any]:
        from transformers import LlamaForCausalLM

        task = cell["task"]
        model, tokenizer = policies[task]
        if cell["system"] == "untrained":
            torch.manual_seed(config.seed)
            model = LlamaForCausalLM(model.config).eval()
        return {
            **cell,
            **evaluate_policy(
                model, tokenizer, task, test_sets[task], **_eval_kwargs(config, config.seed)
            ),
        }

    seeds = [config.seed + s for s in range(config.n_seeds)]
    base_cells = [{"task": t, "system": s} for t in config.tasks for s in ("sft", "untrained")]
    train_cells = [
        {"task": t, "condition": c[0], "seed": s}
        for t in config.tasks
        for c in config.conditions
        for s in seeds
    ]
    diagnose_cells = [
        {"task": t, "seed": s, "diagnostic": True} for t in config.tasks for s in seeds
    ]

    def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
        if "system" in cell:
            return baseline(cell)
        return diagnose(cell) if cell.get("diagnostic") else train(cell)

    done = run_cells(
        out_dir,
        config,
        base_cells + train_cells + diagnose_cells,
        run_cell,
        resume=resume,
        label="prompt_kl",
    )
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    metrics = summarise(done, config)
    _plot(done, config, out_dir)
    checks, tested = [], []
    for task in config.tasks:
        task_claims = (
            claims(per_seed_values(done, task, config), task, config) if task != CONTROL else []
        )
        tested += task_claims
        checks += [
            check.gating(*task_claims) if task_claims else check
            for check in regime(metrics, task, config)
        ]
    return Result(metrics=metrics, claims=tested, regime=checks)


def _key(system: str, task: str, config: Config) -> str:
    return system if task == config.tasks[0] else f"{task}/{system}"


def summarise(done: list[dict[str, Any]], config: Config) -> dict[str, dict[str, Any]]:
    """One row per task and system: the SFT and untrained policies, every condition (mean and
    std over seeds, final training KLs), the steering points and both swaps (means over the
    no-KL seeds)."""
    empty = {m: None for m in METRICS} | {f"{m}_std": None for m in METRICS}
    empty |= {"prompt_kl": None, "response_kl": None, "n_seeds": None}

    def row(
        values: list[dict[str, Any]], kls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        out = dict(empty, n_seeds=len(values))
        for m in METRICS:
            finite = [v[m] for v in values if v[m] is not None and math.isfinite(v[m])]
            if finite:  # the control task has no uncued prompts
                out[m], out[f"{m}_std"] = mean_std(finite)
        if kls:  # the mean of the last tenth of the steps, over seeds
            for k in ("prompt_kl", "response_kl"):
                tails = [_final(c[k]) for c in kls]
                out[k] = None if np.isnan(tails).all() else float(np.nanmean(tails))
        return out

    metrics: dict[str, dict[str, Any]] = {}
    for task in config.tasks:
        for system in ("sft", "untrained"):
            cell = next(d for d in done if d.get("system") == system and d["task"] == task)
            metrics[_key(system, task, config)] = row([cell])
        for name, _, _ in config.conditions:
            cells = [d for d in done if d.get("condition") == name and d["task"] == task]
            metrics[_key(name, task, config)] = row(cells, [c["curves"] for c in cells])
        diagnosed = [d for d in done if d.get("diagnostic") and d["task"] == task]
        for where in ("prompt", "response"):
            for alpha in config.steer_alphas:
                points = [
                    p
                    for d in diagnosed
                    for p in d["front"]
                    if p["where"] == where and p["alpha"] == alpha
                ]
                metrics[_key(f"steer {where} a={alpha:g}", task, config)] = row(points)
        for swap in ("swap_reference_prompt", "swap_policy_prompt"):
            metrics[_key(swap.replace("_", " "), task, config)] = row([d[swap] for d in diagnosed])
    return metrics


def _dominated(point: dict[str, Any], front: list[dict[str, Any]]) -> bool:
    """Some point of ``front`` hacks no more and succeeds no less than ``point``."""
    return any(
        p["hack_rate"] <= point["hack_rate"] and p["true_success"] >= point["true_success"]
        for p in front
    )


def regime(metrics: dict[str, dict[str, Any]], task: str, config: Config) -> list[Claim]:
    """Can this task show hacking and its prevention? Margins fixed in advance (issue 20)."""
    sft, untrained = metrics[_key("sft", task, config)], metrics[_key("untrained", task, config)]
    no_kl = metrics[_key("no KL", task, config)]
    return [
        Claim.all_of(
            f"{task}: the SFT policy's true success is at least {config.min_sft_success:.0%} and "
            f"{config.min_sft_margin * 100:.0f} points above an untrained policy's",
            [
                Claim.compare(
                    "SFT",
                    sft["true_success"],
                    ">=",
                    config.min_sft_success,
                    value_label="SFT true success",
                ),
                Claim.compare(
                    "margin",
                    sft["true_success"],
                    ">=",
                    untrained["true_success"] + config.min_sft_margin,
                    value_label="SFT true success",
                    reference_label=f"untrained + {config.min_sft_margin}",
                ),
            ],
        ),
        Claim.compare(
            f"{task}: GRPO without KL hacks at least {config.min_hack_rate:.0%} of the cued test "
            "prompts",
            no_kl["hack_rate"],
            ">=",
            config.min_hack_rate,
            value_label="no-KL hack rate",
        ),
    ]


def per_seed_values(
    done: list[dict[str, Any]], task: str, config: Config
) -> dict[str, dict[str, list[float]]]:
    """What ``task``'s claims read, per system and RL seed (in seed order, paired across
    systems): every condition's ``hack_rate`` and ``true_success``; the SFT policy's (one
    evaluation, one value); per steering side, the share of the other side's points (at
    ``steer_alphas``) that one of its points matches or beats (``dominated_share``); per swap
    side, the hack rate when the no-KL policy supplies only the other side (``hack_without``)
    and only this side (``hack_only``)."""

    def number(value: Any) -> float:
        return math.nan if value is None else float(value)

    seeds = sorted({d["seed"] for d in done if "condition" in d and d["task"] == task})
    values: dict[str, dict[str, list[float]]] = {}
    sft = next(d for d in done if d.get("system") == "sft" and d["task"] == task)
    values["sft"] = {m: [number(sft[m])] for m in ("hack_rate", "true_success")}
    for name, _, _ in config.conditions:
        cells = {d["seed"]: d for d in done if d.get("condition") == name and d["task"] == task}
        values[name] = {
            m: [number(cells[s][m]) for s in seeds] for m in ("hack_rate", "true_success")
        }
        values[name]["response_kl"] = [_final(cells[s]["curves"]["response_kl"]) for s in seeds]
    responses = config.response_kl_conditions()
    if PROMPT_KL in values and responses:
        budget = values[PROMPT_KL]["response_kl"]
        picks = [
            min(responses, key=lambda r: abs(values[r[0]]["response_kl"][i] - budget[i]))
            for i in range(len(seeds))
        ]
        values[MATCHED] = {
            m: [values[name][m][i] for i, (name, _) in enumerate(picks)]
            for m in ("hack_rate", "true_success", "response_kl")
        } | {"beta_response": [beta for _, beta in picks]}
    diagnosed = {d["seed"]: d for d in done if d.get("diagnostic") and d["task"] == task}
    fronts = {
        s: {
            where: [
                p
                for p in diagnosed[s]["front"]
                if p["where"] == where and p["alpha"] in config.steer_alphas
            ]
            for where in ("prompt", "response")
        }
        for s in seeds
    }
    for where, other in (("prompt", "response"), ("response", "prompt")):
        values[f"{where} steering"] = {
            "dominated_share": [
                float(np.mean([_dominated(p, fronts[s][where]) for p in fronts[s][other]]))
                for s in seeds
            ]
        }
    # the swap with the reference's prompt: the policy supplies only its response; and back
    reference_prompt = [number(diagnosed[s]["swap_reference_prompt"]["hack_rate"]) for s in seeds]
    policy_prompt = [number(diagnosed[s]["swap_policy_prompt"]["hack_rate"]) for s in seeds]
    values["prompt swap"] = {"hack_without": reference_prompt, "hack_only": policy_prompt}
    values["response swap"] = {"hack_without": policy_prompt, "hack_only": reference_prompt}
    return values


def claims(values: dict[str, dict[str, list[float]]], task: str, config: Config) -> list[Claim]:
    """``task``'s claims (``Config.CLAIMS``), each judged seed by seed on ``values``
    (:func:`per_seed_values`) and again with its control in the system's place; the claims about
    prompt KL assume the swap premise (issue 62)."""
    seeds = [config.seed + s for s in range(config.n_seeds)]  # the RL seeds, as run() trains them

    def seeds_of(system: str, name: str) -> list[float]:
        return values[system][name]  # a KeyError: the system did not run

    def judge(key: str, test: Any, **options: Any) -> Claim:
        return config.judge(key, test, text_values={"task": task}, **options)

    no_kl_hack = seeds_of(NO_KL, "hack_rate")
    sft_hack = seeds_of("sft", "hack_rate")[0]

    def halves_hack(text: str, swap: str) -> Claim:
        """``swap``'s hack rate when the no-KL policy supplies only the other side is at most
        ``SWAP_CUT`` times the policy's own, on every seed."""
        return Claim.worst_seed(
            text,
            seeds_of(swap, "hack_without"),
            "<=",
            [SWAP_CUT * v for v in no_kl_hack],
            seeds=seeds,
            value_label="hack rate",
            reference_label=f"{SWAP_CUT} x no-KL policy's",
        )

    def swap_moves_hacking(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                halves_hack("the policy's other side alone", system),
                Claim.worst_seed(
                    "the policy's side alone",
                    seeds_of(system, "hack_only"),
                    ">",
                    sft_hack,
                    seeds=seeds,
                    value_label="hack rate",
                    reference_label="SFT policy's",
                ),
            ],
        )

    premise = {
        "prompt_carries_hack": halves_hack(
            f"{task}: swapping in the SFT policy's prompt encoding at least halves the no-KL "
            "policy's hack rate",
            "prompt swap",
        )
    }

    def prompt_kl_stops_hacking(system: str) -> Claim:
        label = system
        if "beta_response" in values[system]:  # the matched control: which beta on each seed
            betas = ", ".join(f"{b:g}" for b in values[system]["beta_response"])
            label = f"{system} (beta_response per seed: {betas})"
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "hack rate",
                    seeds_of(system, "hack_rate"),
                    "<=",
                    sft_hack + HACK_MARGIN,
                    seeds=seeds,
                    value_label=f"{label} hack rate",
                    reference_label=f"SFT policy's + {HACK_MARGIN}",
                ),
                Claim.worst_seed(
                    "true success",
                    seeds_of(system, "true_success"),
                    ">=",
                    [v - KEEP_SUCCESS for v in seeds_of(NO_KL, "true_success")],
                    seeds=seeds,
                    value_label=f"{system} true success",
                    reference_label=f"no KL's - {KEEP_SUCCESS}",
                ),
            ],
        )

    responses = [name for name, _ in config.response_kl_conditions()]

    def response_kl_hacks_or_costs(system: str) -> Claim:
        # not the judged system itself, should a config name a condition against its betas
        rivals = [name for name in responses if name != system]
        if not rivals:
            return Claim.not_run(system, "the run has no response-KL setting")
        hack, success = seeds_of(system, "hack_rate"), seeds_of(system, "true_success")

        def margin(name: str) -> list[float]:
            theirs = zip(seeds_of(name, "hack_rate"), seeds_of(name, "true_success"), strict=True)
            return [
                max(h - hs, (ss - RESPONSE_KL_COST) - s)
                for (h, s), hs, ss in zip(theirs, hack, success, strict=True)
            ]

        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    name,
                    margin(name),
                    ">",
                    0.0,
                    seeds=seeds,
                    value_label=f"max(hack-rate excess over {system}, true-success loss "
                    "beyond 5 points)",
                )
                for name in rivals
            ],
        )

    out = [  # without prompt KL in the run, its claims are untested with the reason
        judge("prompt_kl_stops_hacking", where_run(prompt_kl_stops_hacking, values),
              premises=premise, threshold=sft_hack + HACK_MARGIN),
        judge("response_kl_hacks_or_costs", where_run(response_kl_hacks_or_costs, values),
              premises=premise),
    ]  # fmt: skip

    def prompt_steering_dominates(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "dominated_share"),
            ">=",
            1.0,
            seeds=seeds,
            value_label="share of the other side's points dominated",
        )

    out.append(judge("prompt_steering_dominates", prompt_steering_dominates))
    out.append(judge("swap_moves_hacking", swap_moves_hacking))
    return out


def _plot(done: list[dict[str, Any]], config: Config, out_dir: Path) -> None:
    task = config.tasks[0]
    for metric, name in (("hack_rate", "hack_rate_over_steps.png"),
                         ("true_success", "true_success_over_steps.png")):  # fmt: skip
        series = {}
        for condition, _, _ in config.conditions:
            curves = [
                d["curves"] for d in done if d.get("condition") == condition and d["task"] == task
            ]
            values = np.nanmean(np.stack([_array(c[metric]) for c in curves]), axis=0)
            window = 10  # rollouts of 1-2 cued prompts per step: smooth over 10 steps
            smooth = np.convolve(np.nan_to_num(values), np.ones(window) / window, mode="valid")
            series[condition] = (list(range(window, window + len(smooth))), smooth.tolist())
        line_plot(
            out_dir / name,
            series,
            xlabel="GRPO step",
            ylabel=f"{metric.replace('_', ' ')} of the rollouts (10-step mean)",
            title=f"{task}: {metric.replace('_', ' ')} over training (mean over seeds)",
        )
    diagnosed = [d for d in done if d.get("diagnostic") and d["task"] == task]
    series = {}
    for where in ("prompt", "response"):
        points = []
        for alpha in (0.0, *config.steer_alphas):
            at = [
                p
                for d in diagnosed
                for p in d["front"]
                if p["where"] == where and p["alpha"] == alpha
            ]
            points.append(
                (np.mean([p["hack_rate"] for p in at]), np.mean([p["true_success"] for p in at]))
            )
        series[f"steer at {where} positions"] = ([p[0] for p in points], [p[1] for p in points])
    line_plot(
        out_dir / "steering_fronts.png",
        series,
        xlabel="hack rate (cued test prompts)",
        ylabel="true success (test)",
        title=f"{task}: steering the no-KL policy (alpha 0 to {max(config.steer_alphas):g})",
    )
