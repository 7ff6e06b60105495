"""GSS against ungated steering, mean-difference (CAA) steering, unlearning and TinyMem's masks
on the memorization lab (``mixlab run gss``).

The lab (:mod:`mixlab.llm_efficiency.memorization`) trains, once, a base model on TinyMem-style
math sequences with duplicated noised ones, and a reference on the clean ones alone. Per seed:

1. The memorized sequences not in the fixed test third are drawn into fit and validation
   halves, the held-out clean sequences into general (Σ_gen, and what the optimisation
   baselines keep), held-out (gate thresholds) and validation parts; the clean test sequences
   are fixed.
2. Validation, one rule for every system (issue 71): the lowest validation memorization among
   the settings whose validation accuracy is at most ``max_accuracy_drop`` below the base
   model's. It picks GSS's layer, K, δ, α reading and strength, gated CAA's layer and strength,
   and the step count of gradient ascent, NPO, hard-concrete masks and the BalancedSubnet-style
   mask (each trained to ``max_steps`` once, measured every ``check_every`` steps). CAA, the
   memorization claims' control, is picked at matched clean accuracy: the lowest validation
   memorization among its settings at least as accurate as GSS's pick. Ungated GSS uses GSS's
   probes and steers at the smallest strength whose validation memorization is at most GSS's
   (equal memorization; the strongest when none is). Every setting's validation point is kept:
   the plot draws each system's Pareto front of memorization against clean accuracy.
3. Every system is fitted again at its picked setting on the test cells, one after another in
   one process, so the fit times (wall time; the optimisation baselines' validation checks are
   not timed) are measured side by side.
4. Every system is measured on the test split: memorization (greedy extraction of the next
   ``window`` tokens from the clean prefix, TinyMem's), clean accuracy (teacher-forced digits
   after the prefix), perplexity, DS_0.05 = 100 √(m² + 0.05 · max(0, PPL/PPL_base − 1)²),
   gate rates and fit time.

Regime checks (fixed in advance; when one fails the claims are untested): the base model
memorizes at least half of the test sequences, the reference at most 5 %, and the base model's
clean accuracy is at least 90 %.

The claims (``Config.CLAIMS``) are judged seed by seed on the first task, each again with its
control in GSS's place: CAA at matched clean accuracy for memorization, DS_0.05 (against the
mitigations other than GSS) and fit time, gated CAA against CAA for the gate (ungated GSS is
that claim's own reference), and for ω's heavy tail the base model's log-prob alone (without the
reference), measured on the same fit sequences.
"""

from __future__ import annotations

import functools
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
from mixlab.llm_efficiency.gss.config import (
    CUT,
    EQUAL_MEMORIZATION,
    HEAVY_TAIL,
    KEEP,
    METHOD,
    MITIGATIONS,
    OPTIMISED,
    SPEEDUPS,
    SYSTEMS,
    UNGATED_COST,
    Config,
)
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
from mixlab.shared import Claim, Result, mean_std, progress, run_cells
from mixlab.shared.files import write_json_atomic

__all__ = [
    "METHOD",
    "Config",
    "claims",
    "deviation_score",
    "per_seed_values",
    "regime",
    "run",
    "summarise",
]

BASE_MEMORIZES, REFERENCE_MAX, BASE_ACCURACY = 0.5, 0.05, 0.90
"""regime: base extraction >= 50 %, reference <= 5 %, base clean accuracy >= 90 %"""
DS_LAMBDA = 0.05
UNGATED = {"gss": "gss_ungated", "caa_gated": "caa"}
"""the gating claim's pairs: each gated steer and the same steer without its gate"""
TEST_SHARE = 3  # a third of the memorized sequences is the fixed test split
N_TEST_CLEAN, N_GENERAL, N_HELD, N_VAL_CLEAN = 1000, 400, 400, 150


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


def _pick(rows: list[dict[str, Any]], min_accuracy: float | None) -> dict[str, Any]:
    """The lowest validation memorization among rows at least ``min_accuracy`` accurate (ties:
    higher accuracy; every row when ``min_accuracy`` is None, a text task); the most accurate
    row when none is."""
    if not rows:
        raise ValueError("the validation grid is empty: nothing to pick from")
    ok = [r for r in rows if min_accuracy is None or r["accuracy"] >= min_accuracy - 1e-12]
    if not ok:
        return max(rows, key=lambda r: r["accuracy"])
    return min(ok, key=lambda r: (r["memorization"], -(r["accuracy"] or 0.0)))


_LABS: dict[str, tuple[Any, Any, MemorizationData]] = {}
"""this process's labs by task, loaded once from the cache (a worker runs many cells)"""


def _lab(config: Config, task: str) -> tuple[Any, Any, MemorizationData]:
    """``(base, reference, data)`` of ``task``: trained and cached on first use."""
    key = f"{task}: {config.lm_config(task)!r}"
    if key not in _LABS:
        _LABS[key] = pretrained_memorization_lms(config.lm_config(task))
    return _LABS[key]


def _task(config: Config, cell: dict[str, Any]) -> _Task:
    return _Task(_lab(config, cell["task"])[2], cell["seed"], cell["task"] != "canaries")


def _validate(config: Config, cell: dict[str, Any]) -> dict[str, Any]:
    """One validation cell: ``part`` "steering" sweeps GSS, ungated GSS and CAA (gated and not)
    and picks them; an optimisation baseline's part trains it to ``max_steps`` once, measured
    every ``check_every`` steps (its pick needs the base model's accuracy, so it is made when
    the seed's cells are joined, :func:`_join_validation`)."""
    torch.set_num_threads(1)  # small ops: one thread is as fast, and safe beside a worker
    torch.set_flush_denormal(True)
    base, reference, _ = _lab(config, cell["task"])
    task = _task(config, cell)
    data = replace(task.mitigation_data, reference=reference)
    if cell["part"] != "steering":
        with progress(config.max_steps // config.check_every, f"{cell['part']} curve") as bar:
            rows: list[dict[str, Any]] = []

            def record(model: Any) -> bool:
                rows.append({**task.measure(model, "val"),
                             "params": {"steps": (len(rows) + 1) * config.check_every}})  # fmt: skip
                bar.advance(memorization=rows[-1]["memorization"])
                return False  # never stop early: the whole curve is the grid

            _mitigation(cell["part"], {}, config).mitigate(base, replace(data, stop=record))
        return {**cell, "rows": rows}
    per_layer = len(config.ranks) * len(config.deltas) * len(ALPHA_MODES)
    per_layer = per_layer * len(config.strengths) + 2 * len(config.caa_strengths)
    measures = 1 + len(config.steer_layers) * per_layer + len(_ungated_strengths(config))
    with progress(measures, "steering grid") as bar:
        return {**cell, **_steering_grid(config, base, task, data, bar)}


def _ungated_strengths(config: Config) -> list[float]:
    return sorted({*config.strengths, *(s / 4 for s in config.strengths)})


def _steering_grid(
    config: Config, base: Any, task: _Task, data: MitigationData, bar: Any
) -> dict[str, Any]:
    base_val = task.measure(base, "val")
    bar.advance()
    omega = torch.cat(memorization_signal(base, data.memorized, data.reference))
    logprob = torch.cat(memorization_signal(base, data.memorized))  # the heavy tail's control
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
                        bar.advance(memorization=row["memorization"])
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
                bar.advance(memorization=row["memorization"])
                params = {"layer": layer, "strength": strength, "gated": gated}
                caa_grid.append({**row, "params": params})
    floor = _floor(base_val, config)
    best = _pick(grid, floor)
    picked = best["params"]
    refit = GSS(
        **{k: picked[k] for k in ("layer", "rank", "delta", "alpha_mode")},
        top_fraction=config.top_fraction,
    )
    steer = refit.mitigate(base, data).steer
    ungated = []
    for strength in _ungated_strengths(config):
        with steer.replace(gated=False, strength=strength):
            ungated.append({**task.measure(base, "val"), "strength": strength})
        bar.advance(memorization=ungated[-1]["memorization"])
    reaching = [r for r in ungated if r["memorization"] <= best["memorization"]]
    ungated_pick = (
        min(reaching, key=lambda r: r["strength"])
        if reaching
        else max(ungated, key=lambda r: r["strength"])
    )
    picks = {
        "gss": {**picked, "gated": True},
        "gss_ungated": {**{**picked, "strength": ungated_pick["strength"]}, "gated": False},
        # the memorization claims' control at matched clean accuracy: as accurate as GSS
        "caa": _pick([r for r in caa_grid if not r["params"]["gated"]], best["accuracy"])["params"],
        "caa_gated": _pick([r for r in caa_grid if r["params"]["gated"]], floor)["params"],
    }
    return {
        "base_val": base_val,
        "target_memorization": best["memorization"],
        "picks": picks,
        "share_above_mean_omega": (omega > omega.mean()).float().mean().item(),
        "share_above_mean_logprob": (logprob > logprob.mean()).float().mean().item(),
        "grid": grid,
        "caa_grid": caa_grid,
        "ungated_grid": ungated,
    }


def _floor(base_val: dict[str, Any], config: Config) -> float | None:
    """The validation rule's accuracy floor (None for a text task: no accuracy)."""
    accuracy = base_val["accuracy"]
    return None if accuracy is None else accuracy - config.max_accuracy_drop


def _join_validation(parts: list[dict[str, Any]], config: Config) -> dict[str, Any]:
    """One seed's validation cells as one record: the steering part's picks and grids, and
    each optimisation baseline's curve (``optimised_grid``) and pick by the same rule."""
    steering = next(p for p in parts if p["part"] == "steering")
    curves = {p["part"]: p["rows"] for p in parts if p["part"] != "steering"}
    floor = _floor(steering["base_val"], config)
    record = {k: v for k, v in steering.items() if k != "part"}
    return {
        **record,
        "picks": {
            **steering["picks"],
            **{system: _pick(rows, floor)["params"] for system, rows in curves.items()},
        },
        "optimised_grid": curves,
    }


def _test(
    config: Config, picks: dict[str, dict[str, dict[str, Any]]], cell: dict[str, Any]
) -> list[dict[str, Any]]:
    """Every system of one seed at its pick, fitted one after another in this process (the fit
    times compare under the same load) and measured on the test split."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    base, reference, _ = _lab(config, cell["task"])
    task = _task(config, cell)
    chosen = picks[f"{cell['task']}/{cell['seed']}"]
    data = replace(task.mitigation_data, reference=reference)  # no stop: the picked steps
    rows = []
    with progress(len(SYSTEMS), "test systems") as bar:
        for system in SYSTEMS:
            if system in ("base", "reference"):
                model = base if system == "base" else reference
                row = {**task.measure(model, "test"), "seconds": 0.0, "steps": None}
            else:
                mitigated = _mitigation(system, chosen, config).mitigate(base, data)
                with mitigated as model:
                    row = task.measure(model, "test")
                    if mitigated.steer is not None:
                        row.update(_gate_rates(mitigated.steer, model, task))
                row.update(seconds=mitigated.seconds, steps=mitigated.steps)
            rows.append({**cell, "system": system, **row})
            bar.advance(memorization=row["memorization"])
    return rows


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    _LABS.clear()  # loaded anew from this run's cache
    for task in config.tasks:  # trained and cached here, before the workers load them
        _lab(config, task)
    seeds = [(t, config.seed + s) for t in config.tasks for s in range(config.n_seeds)]
    val_cells = [
        {"task": t, "seed": s, "part": part} for t, s in seeds for part in ("steering", *OPTIMISED)
    ]
    parts = run_cells(out_dir, config, val_cells, functools.partial(_validate, config),
                      resume=resume, label="gss validation", workers=config.workers)  # fmt: skip
    val = [
        _join_validation([p for p in parts if (p["task"], p["seed"]) == key], config)
        for key in seeds
    ]
    picks = {f"{v['task']}/{v['seed']}": v["picks"] for v in val}
    test_cells = [{"task": t, "seed": s} for t, s in seeds]
    tested = run_cells(out_dir, config, test_cells, functools.partial(_test, config, picks),
                       resume=True, label="gss test", workers=config.workers)  # fmt: skip
    tested = [row for rows in tested for row in rows]
    write_json_atomic(out_dir / "cells.json", {"validation": val, "test": tested}, indent=1)
    metrics = summarise(val, tested, config.tasks)
    _plot(val, metrics, config.tasks[0], out_dir)
    values = per_seed_values(val, tested, config.tasks[0])
    return Result(
        metrics=metrics,
        claims=claims(values, config),
        regime=regime(metrics, config.tasks[0]),
    )


def _mitigation(system: str, picks: dict[str, dict[str, Any]], config: Config) -> Any:
    """``system`` at its validation pick; an optimisation baseline without a pick trains to
    ``max_steps`` (the validation run that draws its curve)."""
    steps = {
        "max_steps": picks.get(system, {}).get("steps", config.max_steps),
        "check_every": config.check_every,
    }
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
_PICKED = ("layer", "rank", "strength", "adaptive", "gated", "steps")


def summarise(
    val: list[dict[str, Any]], tested: list[dict[str, Any]], tasks: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """One row per task and system (``<system>`` for the first task, ``<task>/<system>`` for
    the others), every row with the same keys (None where a system has no such value): each
    measured value's mean over seeds and its std (``<name>_std``); the optimisation baselines'
    fit time over GSS's (both at their picked settings); the validation picks (``picked_<name>``, the mean over seeds when they differ; ``adaptive`` and
    ``gated`` as shares of seeds); on GSS's row the heavy-tail share of ω
    (``share_above_mean_omega``) and on the base row the same share of the base model's log-prob
    alone (``share_above_mean_logprob``, the heavy-tail claim's control; None when the validation
    cells were cached before it was measured)."""
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
            logprob = [v.get("share_above_mean_logprob") for v in chosen]
            row["share_above_mean_logprob"] = (
                mean_std(logprob)[0] if system == "base" and None not in logprob else None
            )
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


def per_seed_values(
    val: list[dict[str, Any]], tested: list[dict[str, Any]], task: str
) -> dict[str, dict[str, list[float]]]:
    """What the claims read on ``task``, per system and seed (in seed order, paired across
    systems): memorization, clean accuracy (NaN for text tasks), DS_0.05 (set on the cells by
    :func:`summarise`) and fit seconds; ``share_above_mean_omega`` for GSS (ω) and
    ``share_above_mean_logprob`` for the base model (its log-prob alone, without the reference;
    absent when the validation cells were cached before it was measured)."""
    cells = [c for c in tested if c["task"] == task]
    seeds = sorted({c["seed"] for c in cells})
    by_key = {(c["system"], c["seed"]): c for c in cells}

    def number(value: Any) -> float:
        return math.nan if value is None else float(value)

    values: dict[str, dict[str, list[float]]] = {
        system: {
            name: [number(by_key[(system, s)].get(name)) for s in seeds]
            for name in ("memorization", "accuracy", "ds", "seconds")
        }
        for system in SYSTEMS
    }
    chosen = sorted((v for v in val if v["task"] == task), key=lambda v: v["seed"])
    values["gss"]["share_above_mean_omega"] = [v["share_above_mean_omega"] for v in chosen]
    if all("share_above_mean_logprob" in v for v in chosen):
        values["base"]["share_above_mean_logprob"] = [v["share_above_mean_logprob"] for v in chosen]
    return values


def claims(values: dict[str, dict[str, list[float]]], config: Config) -> list[Claim]:
    """The claims (``Config.CLAIMS``) on the first task, each judged seed by seed on ``values``
    (:func:`per_seed_values`) for GSS and again with its control in GSS's place."""

    seeds = [config.seed + offset for offset in range(config.n_seeds)]  # as run() draws them

    def seeds_of(system: str, name: str) -> list[float]:
        return values[system][name]  # a KeyError: the system has no such value in this run

    def heavy_tail(system: str) -> Claim:
        # GSS's ω, and for the control the base model's log-prob alone
        share = {"gss": "share_above_mean_omega", "base": "share_above_mean_logprob"}[system]
        if share not in values[system]:
            return Claim.not_run(
                system,
                f"no share above the mean for {system}: the validation cells were cached "
                "before it was measured",
            )
        return Claim.worst_seed(
            system,
            seeds_of(system, share),
            "<",
            HEAVY_TAIL,
            seeds=seeds,
            value_label=f"{system}: share above the mean",
        )

    def cuts_memorization(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "memorization",
                    seeds_of(system, "memorization"),
                    "<=",
                    [CUT * v for v in seeds_of("base", "memorization")],
                    seeds=seeds,
                    value_label=f"{system} extraction rate",
                    reference_label=f"{CUT} x base",
                ),
                Claim.worst_seed(
                    "accuracy",
                    seeds_of(system, "accuracy"),
                    ">=",
                    [v - KEEP for v in seeds_of("base", "accuracy")],
                    seeds=seeds,
                    value_label=f"{system} clean accuracy",
                    reference_label=f"base - {KEEP}",
                ),
            ],
        )

    def lowest_ds(system: str) -> Claim:
        # GSS against every other mitigation; a control against every other but GSS too, so
        # that it passes when it beats every mitigation except the method
        others = [m for m in MITIGATIONS if m not in (system, "gss")]
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    f"vs {other}",
                    seeds_of(system, "ds"),
                    "<",
                    seeds_of(other, "ds"),
                    seeds=seeds,
                    value_label=f"{system} DS_0.05",
                    reference_label=other,
                )
                for other in others
            ],
        )

    def gating_costs_ungated(system: str) -> Claim:
        ungated = UNGATED[system]
        missing = [s for s in (system, ungated) if s not in values]
        if missing:
            return Claim.not_run(system, f"the run has no {', '.join(missing)}")
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    "equal memorization",
                    seeds_of(ungated, "memorization"),
                    "<=",
                    [v + EQUAL_MEMORIZATION for v in seeds_of(system, "memorization")],
                    seeds=seeds,
                    value_label=f"{ungated} extraction rate",
                    reference_label=f"{system}'s + {EQUAL_MEMORIZATION}",
                ),
                Claim.worst_seed(
                    "accuracy",
                    seeds_of(ungated, "accuracy"),
                    "<=",
                    [v - UNGATED_COST for v in seeds_of(system, "accuracy")],
                    seeds=seeds,
                    value_label=f"{ungated} clean accuracy",
                    reference_label=f"{system}'s - {UNGATED_COST}",
                ),
            ],
        )

    def fits_faster(system: str) -> Claim:
        own = seeds_of(system, "seconds")
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    f"vs {other}",
                    [
                        o / s if s > 0 else math.nan
                        for o, s in zip(seeds_of(other, "seconds"), own, strict=True)
                    ],
                    ">=",
                    SPEEDUPS[0],
                    seeds=seeds,
                    value_label=f"fit time / {system}'s",
                )
                for other in OPTIMISED
            ],
        )

    return [
        config.judge("heavy_tail", heavy_tail),
        config.judge("cuts_memorization", cuts_memorization),
        config.judge("lowest_ds", lowest_ds),
        config.judge("gating_costs_ungated", gating_costs_ungated),
        config.judge("fits_faster", fits_faster),
    ]


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memorization, accuracy) points no other point beats on both (lower memorization,
    higher accuracy), by rising memorization."""
    front: list[tuple[float, float]] = []
    for point in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or point[1] > front[-1][1]:
            front.append(point)
    return front


def _validation_points(cell: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Every system's validation settings of one validation cell as (memorization, accuracy)."""
    rows = {
        "gss": cell["grid"],
        "gss_ungated": cell["ungated_grid"],
        "caa": [r for r in cell["caa_grid"] if not r["params"]["gated"]],
        "caa_gated": [r for r in cell["caa_grid"] if r["params"]["gated"]],
        **cell.get("optimised_grid", {}),
    }
    return {
        system: [(r["memorization"], r["accuracy"]) for r in found if r["accuracy"] is not None]
        for system, found in rows.items()
    }


def _plot(
    val: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], task: str, out_dir: Path
) -> None:
    """Each system's Pareto front of validation memorization against clean accuracy over the
    settings validation tried (the first seed), and its test point at the picked setting (the
    mean over seeds, a larger marker of the same colour)."""
    from matplotlib.figure import Figure

    from mixlab.shared import save_figure

    first = min((v for v in val if v["task"] == task), key=lambda v: v["seed"])
    figure = Figure(figsize=(7.5, 5), layout="constrained")
    axes = figure.add_subplot()
    for system, points in _validation_points(first).items():
        front = pareto_front(points)
        if not front:
            continue
        (line,) = axes.plot(*zip(*front, strict=True), marker=".", label=f"{system} (validation)")
        row = metrics[system]
        if row["accuracy"] is not None:
            axes.plot(row["memorization"], row["accuracy"], marker="*", markersize=13,
                      color=line.get_color(), linestyle="none")  # fmt: skip
    base = metrics["base"]
    if base["accuracy"] is not None:
        axes.plot(base["memorization"], base["accuracy"], "kx", markersize=10, label="base (test)")
    axes.set(
        xlabel="memorization (extraction rate)",
        ylabel="clean accuracy",
        title=f"{task}: Pareto fronts on validation (seed {first['seed']}); ★ = test at the pick",
    )
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    save_figure(figure, out_dir / "memorization_vs_accuracy.png")
