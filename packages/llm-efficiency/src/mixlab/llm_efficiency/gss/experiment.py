"""GSS against ungated steering, mean-difference (CAA) steering, unlearning and TinyMem's masks
on the memorization lab (``mixlab run gss``).

The lab (:mod:`mixlab.llm_efficiency.memorization`) trains, once, a base model on TinyMem-style
math sequences with duplicated noised ones, and a reference on the clean ones alone. Per seed:

1. The memorized sequences not in the fixed test third are drawn into fit and validation
   halves, the held-out clean sequences into general (Σ_gen, and what the optimisation
   baselines keep), held-out (gate thresholds) and validation parts; the clean test sequences
   are fixed.
2. Validation picks GSS's layer, K, δ, α reading and strength, and the mean-difference
   steers' layer and strength: the lowest validation memorization among the settings whose
   validation accuracy is at most ``max_accuracy_drop`` below the base model's. Ungated GSS uses
   GSS's probes and steers at the smallest strength whose validation memorization is at most
   GSS's (equal memorization; the strongest when none is).
3. Gradient ascent, NPO, hard-concrete masks and the BalancedSubnet-style mask train until their
   validation memorization is at most GSS's, or ``max_steps``; their wall time is measured like
   GSS's fit.
4. Every system is measured on the test split: memorization (greedy extraction of the next
   ``window`` tokens from the clean prefix, TinyMem's), clean accuracy (teacher-forced digits
   after the prefix), perplexity, DS_0.05 = 100 √(m² + 0.05 · max(0, PPL/PPL_base − 1)²),
   gate rates and fit time.

Regime checks (fixed in advance; when one fails the claims are untested): the base model
memorizes at least half of the test sequences, the reference at most 5 %, and the base model's
clean accuracy is at least 90 %.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.llm_efficiency.gss.baselines import (
    GSS,
    NPO,
    BalancedSubnet,
    GradientAscent,
    HardConcreteMask,
    MeanDifference,
    MitigationData,
)
from mixlab.llm_efficiency.gss.config import METHOD, Config
from mixlab.llm_efficiency.gss.steer import ALPHA_MODES, GSSSteer, memorization_signal
from mixlab.llm_efficiency.lm import token_nll
from mixlab.llm_efficiency.memorization import (
    SEPARATOR,
    MemorizationData,
    digit_accuracy,
    encode,
    extraction_rate,
    pretrained_memorization_lms,
)
from mixlab.shared import Claim, Result, line_plot, mean_std, run_cells
from mixlab.shared.files import write_json_atomic

__all__ = ["METHOD", "Config", "claims", "deviation_score", "regime", "run", "summarise"]

OPTIMISED = ("gradient_ascent", "npo", "hard_concrete", "balanced_subnet")
STEERED = ("gss", "gss_ungated", "caa", "caa_gated")
SYSTEMS = ("base", "reference", *STEERED, *OPTIMISED)
MITIGATIONS = (*STEERED, *OPTIMISED)
BASE_MEMORIZES, REFERENCE_MAX, BASE_ACCURACY = 0.5, 0.05, 0.90
"""regime: base extraction >= 50 %, reference <= 5 %, base clean accuracy >= 90 %"""
HEAVY_TAIL = 0.25
"""claim: under 25 % of the memorized sequences' tokens lie above the mean ω (paper 18.7 %)"""
CUT, KEEP = 0.10, 0.02
"""claim: GSS memorization <= 10 % of the base's, clean accuracy within 2 points"""
UNGATED_COST = 0.02
"""claim: ungated GSS at equal memorization loses >= 2 points more accuracy"""
EQUAL_MEMORIZATION = 0.05
"""ungated GSS counts as at GSS's memorization when within 5 points of it on the test split"""
SPEEDUPS = (10.0, 100.0)
"""the compute claim as the NeurIPS abstract (10x) and arXiv v1 (100x) state its lower end"""
DS_LAMBDA = 0.05
TEST_SHARE = 3  # a third of the memorized sequences is the fixed test split
N_TEST_CLEAN, N_GENERAL, N_HELD, N_VAL_CLEAN = 1000, 400, 400, 300


def deviation_score(memorization: float, perplexity: float, base_perplexity: float) -> float:
    """DS_λ = 100 √(m² + λ · PPLDeg²), PPLDeg = max(0, PPL / PPL_base − 1) (λ = 0.05)."""
    degradation = max(0.0, perplexity / base_perplexity - 1)
    return 100 * math.sqrt(memorization**2 + DS_LAMBDA * degradation**2)


class _Task:
    """One task's data split for one seed, and how a model is scored on it."""

    def __init__(self, data: MemorizationData, seed: int, math_task: bool) -> None:
        self.data, self.math_task = data, math_task
        records = data.memorized
        n_test = len(records) // TEST_SHARE
        rng = np.random.default_rng(seed)
        rest = [records[i] for i in rng.permutation(range(n_test, len(records)))]
        self.test_records = records[:n_test]
        self.fit_records, self.val_records = rest[: len(rest) // 2], rest[len(rest) // 2 :]
        held = data.held_out if math_task else [t for t in data.held_out if len(t.strip()) >= 8]
        self.test_clean = held[:N_TEST_CLEAN]
        pool = [held[i] for i in rng.permutation(range(N_TEST_CLEAN, len(held)))]
        general = pool[:N_GENERAL]
        held_out = pool[N_GENERAL : N_GENERAL + N_HELD]
        self.val_clean = pool[N_GENERAL + N_HELD : N_GENERAL + N_HELD + N_VAL_CLEAN]
        self.seed = seed
        self.mitigation_data = MitigationData(
            memorized=[
                _ids(r.prompt + r.target) if not math_task else _ids(SEPARATOR + r.text)
                for r in self.fit_records
            ],
            general=[_ids(SEPARATOR + t) for t in general],
            held_out=[_ids(SEPARATOR + t) for t in held_out],
            seed=seed,
        )

    def utility(self, model: Any, texts: list[str]) -> tuple[float | None, float]:
        """``(clean accuracy, perplexity)`` (accuracy None for text tasks)."""
        if self.math_task:
            return digit_accuracy(model, texts, self.data.prefix_chars)
        tokens = torch.tensor(list("".join(texts).encode()), dtype=torch.long)
        return None, math.exp(token_nll(model, tokens, 128).mean().item())

    def measure(self, model: Any, split: str) -> dict[str, Any]:
        records = self.val_records if split == "val" else self.test_records
        clean = self.val_clean if split == "val" else self.test_clean
        accuracy, perplexity = self.utility(model, clean)
        row = {
            "memorization": extraction_rate(model, records),
            "accuracy": accuracy,
            "perplexity": perplexity,
        }
        if split == "test" and self.data.controls:
            row["control_memorization"] = extraction_rate(model, self.data.controls)
        return row


def _ids(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.long)


def _gate_rates(steer: GSSSteer, model: Any, task: _Task) -> dict[str, float]:
    """Share of positions where any probe fires: on clean test text (teacher forced), and at the
    positions that predict the test records' memorized tokens (those that differ from what the
    clean rule gives; every target token for canaries)."""
    with torch.no_grad():
        steer.reset_stats()
        task.utility(model, task.test_clean)
        clean = steer.any_gate_rate
        records = task.test_records
        ids = encode([r.prompt + r.target for r in records])
        model(input_ids=ids[:, :-1])
        start = len(records[0].prompt) - 1
        fired = steer.last_fired.any(-1)[:, start:]
        steer.reset_stats()
    cut = len(records[0].prompt) - 1  # the texts have no leading separator
    memorized = torch.tensor(
        [
            [
                r.text == r.clean or a != b
                for a, b in zip(r.target, r.clean[cut : cut + len(r.target)], strict=True)
            ]
            for r in records
        ]
    )
    return {
        "gate_rate_clean": clean,
        "gate_rate_memorized": fired[memorized].float().mean().item(),
    }


def _pick(rows: list[dict[str, Any]], base_accuracy: float, drop: float) -> dict[str, Any]:
    """The lowest validation memorization among rows within ``drop`` of the base accuracy
    (ties: higher accuracy); the most accurate row when none is."""
    ok = [r for r in rows if r["accuracy"] is None or r["accuracy"] >= base_accuracy - drop]
    if not ok:
        return max(rows, key=lambda r: r["accuracy"])
    return min(ok, key=lambda r: (r["memorization"], -(r["accuracy"] or 0.0)))


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    labs = {task: pretrained_memorization_lms(config.lm_config(task)) for task in config.tasks}

    def task_split(task: str, seed: int) -> _Task:
        return _Task(labs[task][2], seed, task != "canaries")

    def validate(cell: dict[str, Any]) -> dict[str, Any]:
        base, reference, _ = labs[cell["task"]]
        task = task_split(cell["task"], cell["seed"])
        data = replace(task.mitigation_data, reference=reference)
        base_val = task.measure(base, "val")
        omega = torch.cat(memorization_signal(base, data.memorized, reference))
        grid, caa_grid = [], []
        for layer in config.steer_layers:
            for rank in config.ranks:
                for delta in config.deltas:
                    mitigated = GSS(layer, rank, delta, top_fraction=config.top_fraction).mitigate(
                        base, data
                    )
                    for mode in ALPHA_MODES:
                        for strength in config.strengths:
                            steer = mitigated.steer.replace(alpha_mode=mode, strength=strength)
                            with steer:
                                row = task.measure(base, "val")
                            params = {
                                "layer": layer,
                                "rank": rank,
                                "delta": delta,
                                "alpha_mode": mode,
                                "strength": strength,
                            }
                            grid.append({**row, "params": params, "seconds": mitigated.seconds})
            for gated in (False, True):
                fitted = MeanDifference(
                    layer, 1.0, gated, config.quantile, config.top_fraction
                ).mitigate(base, data)
                for strength in config.caa_strengths:
                    with fitted.steer.replace(strength=strength):
                        row = task.measure(base, "val")
                    params = {"layer": layer, "strength": strength, "gated": gated}
                    caa_grid.append({**row, "params": params})
        best = _pick(grid, base_val["accuracy"] or 0.0, config.max_accuracy_drop)
        picked = best["params"]
        refit = GSS(
            **{k: picked[k] for k in ("layer", "rank", "delta", "alpha_mode")},
            top_fraction=config.top_fraction,
        )
        steer = refit.mitigate(base, data).steer
        ungated = []
        for strength in sorted({*config.strengths, *(s / 4 for s in config.strengths)}):
            with steer.replace(gated=False, strength=strength):
                ungated.append({**task.measure(base, "val"), "strength": strength})
        reaching = [r for r in ungated if r["memorization"] <= best["memorization"]]
        ungated_pick = (
            min(reaching, key=lambda r: r["strength"])
            if reaching
            else max(ungated, key=lambda r: r["strength"])
        )
        picks = {
            "gss": {**picked, "gated": True},
            "gss_ungated": {**{**picked, "strength": ungated_pick["strength"]}, "gated": False},
            "caa": _pick(
                [r for r in caa_grid if not r["params"]["gated"]],
                base_val["accuracy"] or 0.0,
                config.max_accuracy_drop,
            )["params"],
            "caa_gated": _pick(
                [r for r in caa_grid if r["params"]["gated"]],
                base_val["accuracy"] or 0.0,
                config.max_accuracy_drop,
            )["params"],
        }
        return {
            **cell,
            "base_val": base_val,
            "target_memorization": best["memorization"],
            "picks": picks,
            "share_above_mean_omega": (omega > omega.mean()).float().mean().item(),
            "grid": grid,
            "caa_grid": caa_grid,
            "ungated_grid": ungated,
        }

    val_cells = [
        {"task": t, "seed": config.seed + s} for t in config.tasks for s in range(config.n_seeds)
    ]
    val = run_cells(out_dir, config, val_cells, validate, resume=resume, label="gss validation")
    by_key = {(v["task"], v["seed"]): v for v in val}

    def test(cell: dict[str, Any]) -> dict[str, Any]:
        base, reference, _ = labs[cell["task"]]
        task = task_split(cell["task"], cell["seed"])
        chosen = by_key[(cell["task"], cell["seed"])]
        system = cell["system"]
        if system in ("base", "reference"):
            model = base if system == "base" else reference
            return {**cell, **task.measure(model, "test"), "seconds": 0.0, "steps": None}
        target = chosen["target_memorization"]
        data = replace(
            task.mitigation_data,
            reference=reference,
            stop=lambda model: extraction_rate(model, task.val_records) <= target,
        )
        mitigated = _mitigation(system, chosen["picks"], config).mitigate(base, data)
        with mitigated as model:
            row = task.measure(model, "test")
            if mitigated.steer is not None:
                row.update(_gate_rates(mitigated.steer, model, task))
        return {
            **cell,
            **row,
            "seconds": mitigated.seconds,
            "steps": mitigated.steps,
            "reached": mitigated.reached,
        }

    test_cells = [
        {"task": t, "seed": config.seed + s, "system": system}
        for t in config.tasks
        for s in range(config.n_seeds)
        for system in SYSTEMS
    ]
    tested = run_cells(out_dir, config, test_cells, test, resume=True, label="gss test")
    write_json_atomic(out_dir / "cells.json", {"validation": val, "test": tested}, indent=1)
    metrics = summarise(val, tested, config.tasks)
    _plot(val, metrics, config.tasks[0], out_dir)
    return Result(
        metrics=metrics,
        claims=claims(metrics, config.tasks[0]),
        regime=regime(metrics, config.tasks[0]),
    )


def _mitigation(system: str, picks: dict[str, dict[str, Any]], config: Config) -> Any:
    steps = {"max_steps": config.max_steps}
    if system in ("gss", "gss_ungated"):
        return GSS(**picks[system], top_fraction=config.top_fraction)
    if system in ("caa", "caa_gated"):
        return MeanDifference(
            **picks[system], quantile=config.quantile, top_fraction=config.top_fraction
        )
    return {
        "gradient_ascent": lambda: GradientAscent(lr=1e-4, **steps),
        "npo": lambda: NPO(lr=1e-4, **steps),
        "hard_concrete": lambda: HardConcreteMask(**steps),
        "balanced_subnet": lambda: BalancedSubnet(**steps),
    }[system]()


_MEASURED = (
    "memorization",
    "accuracy",
    "perplexity",
    "ds",
    "seconds",
    "steps",
    "gate_rate_clean",
    "gate_rate_memorized",
    "control_memorization",
)
_PICKED = ("layer", "rank", "strength", "adaptive", "gated")


def summarise(
    val: list[dict[str, Any]], tested: list[dict[str, Any]], tasks: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """One row per task and system (``<system>`` for the first task, ``<task>/<system>`` for
    the others), every row with the same keys (None where a system has no such value): each
    measured value's mean over seeds and its std (``<name>_std``); the optimisation baselines'
    share of seeds that reached GSS's validation memorization and fit time over GSS's; the
    validation picks (``picked_<name>``, the mean over seeds when they differ; ``adaptive`` and
    ``gated`` as shares of seeds); and on GSS's row the heavy-tail share of ω."""
    metrics: dict[str, dict[str, Any]] = {}
    for task in tasks:
        cells = [c for c in tested if c["task"] == task]
        chosen = [v for v in val if v["task"] == task]
        base_ppl = {c["seed"]: c["perplexity"] for c in cells if c["system"] == "base"}
        gss_seconds = {c["seed"]: c["seconds"] for c in cells if c["system"] == "gss"}
        for c in cells:
            c["ds"] = deviation_score(c["memorization"], c["perplexity"], base_ppl[c["seed"]])
        for system in SYSTEMS:
            mine = [c for c in cells if c["system"] == system]
            row: dict[str, Any] = {"seeds": len(mine)}
            for name in _MEASURED:
                values = [c.get(name) for c in mine]
                if any(v is None for v in values):
                    row[name], row[f"{name}_std"] = None, None
                else:
                    row[name], row[f"{name}_std"] = mean_std([float(v) for v in values])
            optimised = system in OPTIMISED
            row["reached_target"] = (
                sum(bool(c["reached"]) for c in mine) / len(mine) if optimised else None
            )
            row["fit_time_vs_gss"] = (
                mean_std([c["seconds"] / gss_seconds[c["seed"]] for c in mine])[0]
                if optimised
                else None
            )
            for name in _PICKED:
                picks = [_picked(v["picks"][system], name) for v in chosen if system in v["picks"]]
                row[f"picked_{name}"] = (
                    mean_std([float(p) for p in picks])[0]
                    if picks and all(p is not None for p in picks)
                    else None
                )
            shares = [v["share_above_mean_omega"] for v in chosen]
            row["share_above_mean_omega"] = mean_std(shares)[0] if system == "gss" else None
            row["target_memorization"] = (
                mean_std([v["target_memorization"] for v in chosen])[0] if system == "gss" else None
            )
            metrics[_key(system, task, tasks)] = row
    return metrics


def _picked(params: dict[str, Any], name: str) -> Any:
    """A validation pick as a number: ``adaptive`` is whether the α reading is (None where the
    system has no α)."""
    if name == "adaptive":
        return params["alpha_mode"] == "adaptive" if "alpha_mode" in params else None
    return params.get(name)


def _key(system: str, task: str, tasks: tuple[str, ...]) -> str:
    return system if task == tasks[0] else f"{task}/{system}"


def regime(metrics: dict[str, dict[str, Any]], task: str) -> list[Claim]:
    """Can this lab show memorization and its mitigation? Margins fixed in advance (issue 19)."""
    base, reference = metrics["base"], metrics["reference"]
    return [
        Claim.compare(
            f"The base model memorizes at least {BASE_MEMORIZES:.0%} of the {task} test sequences",
            base["memorization"],
            ">=",
            BASE_MEMORIZES,
            value_label="base extraction rate",
        ),
        Claim.compare(
            f"The clean-only reference memorizes at most {REFERENCE_MAX:.0%} of them",
            reference["memorization"],
            "<=",
            REFERENCE_MAX,
            value_label="reference extraction rate",
        ),
        Claim.compare(
            f"The base model's clean accuracy is at least {BASE_ACCURACY:.0%}",
            base["accuracy"] if base["accuracy"] is not None else math.nan,
            ">=",
            BASE_ACCURACY,
            value_label="base clean accuracy",
        ),
    ]


def claims(metrics: dict[str, dict[str, Any]], task: str) -> list[Claim]:
    base, gss, ungated = metrics["base"], metrics["gss"], metrics["gss_ungated"]
    return [
        Claim.compare(
            f"The token-level signal is heavy-tailed: under {HEAVY_TAIL:.0%} of the memorized "
            "sequences' tokens lie above the mean ω (paper: 18.7%)",
            gss["share_above_mean_omega"],
            "<",
            HEAVY_TAIL,
            value_label="share above the mean",
        ),
        Claim.all_of(
            f"GSS cuts memorization to at most {CUT:.0%} of the base rate with clean accuracy "
            f"within {KEEP * 100:.0f} points",
            [
                Claim.compare(
                    "memorization",
                    gss["memorization"],
                    "<=",
                    CUT * base["memorization"],
                    value_label="GSS extraction rate",
                    reference_label=f"{CUT} x base",
                ),
                Claim.compare(
                    "accuracy",
                    gss["accuracy"],
                    ">=",
                    base["accuracy"] - KEEP,
                    value_label="GSS clean accuracy",
                    reference_label=f"base - {KEEP}",
                ),
            ],
        ),
        Claim.all_of(
            "GSS's DS_0.05 is the lowest of all mitigations",
            [
                Claim.compare(
                    f"vs {other}",
                    gss["ds"],
                    "<",
                    metrics[other]["ds"],
                    value_label="GSS DS_0.05",
                    reference_label=other,
                )
                for other in MITIGATIONS
                if other != "gss"
            ],
        ),
        Claim.all_of(
            f"Ungated GSS at equal memorization loses at least {UNGATED_COST * 100:.0f} points "
            "more clean accuracy than gated GSS",
            [
                Claim.compare(
                    "equal memorization",
                    ungated["memorization"],
                    "<=",
                    gss["memorization"] + EQUAL_MEMORIZATION,
                    value_label="ungated extraction rate",
                    reference_label=f"GSS's + {EQUAL_MEMORIZATION}",
                ),
                Claim.compare(
                    "accuracy",
                    ungated["accuracy"],
                    "<=",
                    gss["accuracy"] - UNGATED_COST,
                    value_label="ungated clean accuracy",
                    reference_label=f"GSS's - {UNGATED_COST}",
                ),
            ],
        ),
        Claim.all_of(
            f"GSS fits at least {SPEEDUPS[0]:.0f}x faster than every optimisation baseline "
            f"(NeurIPS abstract: 10-100x; arXiv v1: 100-1000x)",
            [
                Claim.compare(
                    f"vs {system}",
                    metrics[system]["fit_time_vs_gss"],
                    ">=",
                    SPEEDUPS[0],
                    value_label="fit time / GSS's",
                )
                for system in OPTIMISED
            ],
        ),
    ]


def _plot(
    val: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], task: str, out_dir: Path
) -> None:
    grid = [r for v in val if v["task"] == task and v["seed"] == val[0]["seed"] for r in v["grid"]]
    points = sorted((r["memorization"], r["accuracy"]) for r in grid if r["accuracy"] is not None)
    series = {
        "GSS settings (validation, one seed)": ([p[0] for p in points], [p[1] for p in points])
    }
    for system in SYSTEMS:
        row = metrics[system]
        if row["accuracy"] is not None:
            series[system] = ([row["memorization"]], [row["accuracy"]])
    line_plot(
        out_dir / "memorization_vs_accuracy.png",
        series,
        xlabel="memorization (extraction rate, test)",
        ylabel="clean accuracy (test)",
        title=f"{task}: memorization against accuracy",
    )
