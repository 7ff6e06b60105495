"""MoBiQuant against per-bit RTN / HQQ / GPTQ, Matryoshka slicing, Any-Precision-LLM-style
upscaling of a 2-bit GPTQ seed and router-free nested slices (``mixlab run mobiquant``).

A tiny Llama trained here on the standard library's sources (cached) is quantized by every
system with the same groups (``group_size`` columns, one float16 scale and zero each) and the
same calibration sequences (drawn from the VALIDATION files with the seed); perplexity is
measured on the first ``eval_tokens`` bytes of the TEST files. Measured in one run:

(a) outlier migration: Jaccard overlap of the top-10% tokens by loss increase (GPTQ, and RTN
    as its control, at 3 vs 4 bits and at 2 vs 4), and the penalty of calibrating clipping at one precision and running at
    another (clip-calibrated RTN, calibrated at 3 and run at 4, against calibrated at 4);
(b) elasticity: test perplexity at 2, 2.5, 3, 3.5, 4 and 6 average code bits for MoBiQuant
    (ONE checkpoint, budgets set at run time) and the router-free nested slices (same
    calibration without router; fractional budgets mix depths at random per token), and at the
    integer bits for the per-bit baselines. Effective bits add the scales and zeros (32 bits per
    group) and, for MoBiQuant, its routers;
(c) bytes of weight read per token, ``quantized weights * effective bits / 8`` (the CPU proxy of
    decoding throughput; Matryoshka is counted at its sliced width, as a bit-plane kernel would
    read it).

The regime checks (:func:`regime`) say whether this testbed can tell quantizers apart: 2-bit
RTN must cost at least +30 % and 3-bit GPTQ at least +2 % perplexity over full precision, else
every claim is reported untested.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mixlab.llm_efficiency.lm import (
    corpus_split,
    perplexity_of,
    pretrained_lm,
    token_nll,
)
from mixlab.llm_efficiency.mobiquant.baselines import (
    BASELINES,
    clip_rtn_,
    gptq_,
    per_bit_storage_bits,
)
from mixlab.llm_efficiency.mobiquant.config import (
    CHANCE_JACCARD,
    METHOD,
    MIGRATION_JACCARD,
    TOP_FRACTION,
    WITHIN,
    Config,
)
from mixlab.llm_efficiency.mobiquant.model import (
    average_bits,
    quantize_,
    save_quantized,
    set_budget,
    set_precision,
    storage_bits,
)
from mixlab.shared import (
    Claim,
    Result,
    line_plot,
    mean_std,
    progress,
    run_cells,
    seed_everything,
)
from mixlab.shared.files import write_json_atomic
from mixlab.shared.result import format_number

__all__ = ["METHOD", "Config", "claims", "per_seed_values", "regime", "run", "summarise"]

PER_BIT = ("rtn", "hqq", "gptq", "matryoshka", "anyprec")
ANYPREC_SEED_BITS = 2
"""the any-precision baseline upscales a GPTQ model of this many bits (Any-Precision LLM's seed)"""
NESTED = ("nested", "mobiquant")
DATA_FREE = ("rtn", "hqq", "matryoshka")
"""per-bit systems that read no calibration data: one run serves every seed"""
MIGRATION_SYSTEMS = ("gptq", "rtn")
"""per-bit systems whose token losses at 2, 3 and 4 bits are kept for outlier migration"""
BUDGET_SLACK = (
    0.05  # measured code bits may exceed the budget by this much (threshold fitted on val)
)
RTN2_MIN_COST = 0.30
"""regime: 2-bit RTN must cost at least +30 % perplexity over full precision (fixed in advance)"""
GPTQ3_MIN_COST = 0.02
"""regime: 3-bit GPTQ must cost at least +2 % perplexity over full precision (fixed in advance)"""


def _calibration(config: Config, seed: int) -> torch.Tensor:
    """``calib_sequences`` random windows of the validation files (the seed picks them)."""
    val = corpus_split()[0]["val"]
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(
        len(val) - config.seq_len, (config.calib_sequences,), generator=generator
    )
    return torch.stack([val[s : s + config.seq_len] for s in starts.tolist()]).long()


def _test_tokens(config: Config) -> torch.Tensor:
    return corpus_split()[0]["test"][: config.eval_tokens + 1]


def _nll(model: torch.nn.Module, config: Config) -> torch.Tensor:
    return token_nll(model, _test_tokens(config), config.seq_len)


def run_per_bit(
    config: Config, system: str, bits: int, seed: int, fp: torch.nn.Module
) -> dict[str, Any]:
    model = copy.deepcopy(fp)
    if system == "gptq":
        gptq_(model, bits, config.group_size, _calibration(config, seed))
    elif system == "anyprec":
        calib = _calibration(config, seed)
        gptq_(model, ANYPREC_SEED_BITS, config.group_size, calib, upscale_to=bits)
    else:
        BASELINES[system](model, bits, config.group_size)
    nll = _nll(model, config)
    out: dict[str, Any] = {"ppl": perplexity_of(nll)}
    if system in MIGRATION_SYSTEMS and bits in (2, 3, 4):  # outlier migration reads these losses
        out["nll"] = nll.tolist()
    return out


def run_nested(
    config: Config, system: str, seed: int, fp: torch.nn.Module, out_dir: Path
) -> dict[str, Any]:
    """Calibrate once (with or without router), then read the ONE checkpoint at every budget."""
    model = copy.deepcopy(fp)
    seed_everything(seed)
    quantize_(
        model,
        config.quant_config(router=system == "mobiquant", seed=seed),
        _calibration(config, seed),
    )
    out: dict[str, Any] = {"budgets": {}, "depths": {}}
    with progress(len(config.budgets) + config.slices, "test perplexity per budget") as bar:
        for budget in config.budgets:
            set_budget(model, budget, seed=seed)
            nll = _nll(model, config)  # average_bits below: over every test token, all batches
            ppl = perplexity_of(nll)
            out["budgets"][f"{budget:g}"] = {"ppl": ppl, "bits": average_bits(model)}
            bar.advance(ppl=ppl)
        for depth in range(1, config.slices + 1):
            set_precision(model, depth)
            out["depths"][str(depth)] = perplexity_of(_nll(model, config))
            bar.advance(ppl=out["depths"][str(depth)])
    out["storage"] = storage_bits(model)
    if system == "mobiquant" and seed == config.seed:
        folder = save_quantized(model, out_dir / "mobiquant_checkpoint")
        out["checkpoint_bytes"] = (folder / "model.safetensors").stat().st_size
    return out


def run_migration(config: Config, seed: int, fp: torch.nn.Module) -> dict[str, Any]:
    """Clip-calibrated RTN run at 4 (and 3) bits, calibrated at its own and at the other precision."""
    calib = _calibration(config, seed)
    out = {}
    runs = ((4, 4), (4, 3), (3, 3), (3, 4))
    with progress(len(runs), "clip-calibrated RTN") as bar:
        for run_bits, calibrate_bits in runs:
            model = clip_rtn_(
                copy.deepcopy(fp), run_bits, config.group_size, calib, calibrate_bits=calibrate_bits
            )
            out[f"calib{calibrate_bits}_run{run_bits}"] = perplexity_of(_nll(model, config))
            bar.advance()
    return out


def _cells(config: Config) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = [{"part": "fp"}]
    for system in DATA_FREE:  # the seed changes nothing
        cells += [
            {"part": "per_bit", "system": system, "bits": b, "seed": config.seed}
            for b in config.per_bit
        ]
    for offset in range(config.n_seeds):
        seed = config.seed + offset
        cells += [
            {"part": "per_bit", "system": system, "bits": b, "seed": seed}
            for system in ("gptq", "anyprec")
            for b in config.per_bit
        ]
        cells += [{"part": "nested", "system": s, "seed": seed} for s in NESTED]
        cells.append({"part": "migration", "seed": seed})
    return cells


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    fp = pretrained_lm(config.lm_config())  # cached; trained once, outside the cells

    def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
        if cell["part"] == "fp":
            nll = _nll(fp, config)
            return {**cell, "ppl": perplexity_of(nll), "nll": nll.tolist()}
        if cell["part"] == "per_bit":
            return {**cell, **run_per_bit(config, cell["system"], cell["bits"], cell["seed"], fp)}
        if cell["part"] == "nested":
            return {**cell, **run_nested(config, cell["system"], cell["seed"], fp, out_dir)}
        return {**cell, **run_migration(config, cell["seed"], fp)}

    cells = run_cells(
        out_dir, config, _cells(config), run_cell, resume=resume, label="mobiquant cells"
    )
    weights = next(c for c in cells if c["part"] == "nested")["storage"]["weights"]
    metrics = summarise(cells, config, weights)
    plain = [{k: v for k, v in c.items() if k != "nll"} for c in cells]
    write_json_atomic(out_dir / "cells.json", plain, indent=1)
    _plot(metrics, config, out_dir)
    values = per_seed_values(cells, config, metrics)
    write_json_atomic(out_dir / "per_seed.json", values, indent=1)  # what the claims read
    return Result(metrics=metrics, claims=claims(values, config), regime=regime(metrics))


def _jaccard_top(delta_a: torch.Tensor, delta_b: torch.Tensor, fraction: float) -> float:
    k = max(1, int(fraction * len(delta_a)))
    top_a = set(delta_a.topk(k).indices.tolist())
    top_b = set(delta_b.topk(k).indices.tolist())
    return len(top_a & top_b) / len(top_a | top_b)


def _points(config: Config) -> list[float]:
    return sorted({float(b) for b in config.budgets} | {float(b) for b in config.per_bit})


_PER_POINT = ("ppl", "ppl_std", "bits", "effective_bits", "bytes_per_token")


def summarise(
    cells: list[dict[str, Any]], config: Config, weights: int
) -> dict[str, dict[str, float | None]]:
    """One row per system, the same columns in each (None where a column does not apply).

    At each bit point ``P``: ``ppl@P`` (mean over seeds), ``ppl_std@P``, ``bits@P`` (code bits
    per weight the run measured), ``effective_bits@P`` (+ scales/zeros and routers) and
    ``bytes_per_token@P`` (weight bytes read per token). Also: ``uniform_ppl@K`` (nested systems
    at a uniform K bits), ``router_bits_per_weight``, ``stored_layer_bytes`` (the quantized
    layers' bytes needed to serve EVERY evaluated precision: the per-bit set for per-bit
    systems, one checkpoint for the nested ones and Matryoshka), ``cross_calibrated_ppl@3/4``
    (clip_rtn calibrated at the other precision) and ``top10_jaccard@2/3`` (GPTQ's top-10%
    tokens by loss increase at 2 or 3 bits against those at 4)."""
    overhead = 32 / config.group_size  # a float16 scale and zero per group
    fp_cell = next(c for c in cells if c["part"] == "fp")
    depths = [d * config.slice_bits for d in range(1, config.slices + 1)]
    columns = [f"{name}@{p:g}" for p in _points(config) for name in _PER_POINT]
    columns += [f"uniform_ppl@{k}" for k in depths]
    columns += ["full_precision_ppl", "router_bits_per_weight", "stored_layer_bytes"]
    columns += ["cross_calibrated_ppl@3", "cross_calibrated_ppl@4", "top10_jaccard@2"]
    columns += ["top10_jaccard@3", "top10_jaccard_chance"]
    fractional = _fractional(config)
    columns += [f"{name}@{b:g}" for b in fractional for name in ("router_gain", "router_gain_std")]
    metrics = {s: dict.fromkeys(columns) for s in ("fp", *PER_BIT, "clip_rtn", *NESTED)}
    for row in metrics.values():
        row["full_precision_ppl"] = fp_cell["ppl"]

    def put(system: str, point: float, ppls: list[float], bits: float, extra: float) -> None:
        row, key = metrics[system], f"{point:g}"
        row[f"ppl@{key}"], row[f"ppl_std@{key}"] = mean_std(ppls)
        row[f"bits@{key}"] = bits
        row[f"effective_bits@{key}"] = bits + extra
        row[f"bytes_per_token@{key}"] = weights * (bits + extra) / 8

    for system in PER_BIT:
        for bits in config.per_bit:
            mine = [c for c in cells if c.get("system") == system and c.get("bits") == bits]
            put(system, bits, [c["ppl"] for c in mine], float(bits), overhead)
        per_bit_set = sum(
            per_bit_storage_bits(weights, b, config.group_size) for b in config.per_bit
        )
        metrics[system]["stored_layer_bytes"] = per_bit_set / 8
    metrics["matryoshka"]["stored_layer_bytes"] = (
        per_bit_storage_bits(weights, 8, config.group_size) / 8
    )
    metrics["anyprec"]["stored_layer_bytes"] = (  # one checkpoint at the widest read
        per_bit_storage_bits(weights, max(config.per_bit), config.group_size) / 8
    )
    metrics["fp"]["stored_layer_bytes"] = weights * 2.0  # float16
    runs = [c for c in cells if c["part"] == "migration"]
    clip = metrics["clip_rtn"]
    for bits, other in ((3, 4), (4, 3)):
        put("clip_rtn", bits, [c[f"calib{bits}_run{bits}"] for c in runs], float(bits), overhead)
        cross = [c[f"calib{other}_run{bits}"] for c in runs]
        clip[f"cross_calibrated_ppl@{bits}"] = mean_std(cross)[0]
    for system in NESTED:
        mine = [c for c in cells if c.get("system") == system]
        storage = mine[0]["storage"]
        router_bits = storage["routers"] / storage["weights"]
        for budget in config.budgets:
            key = f"{budget:g}"
            measured = sum(c["budgets"][key]["bits"] for c in mine) / len(mine)
            ppls = [c["budgets"][key]["ppl"] for c in mine]
            put(system, budget, ppls, measured, overhead + router_bits)
        for depth, k in enumerate(depths, start=1):
            uniform = [c["depths"][str(depth)] for c in mine]
            metrics[system][f"uniform_ppl@{k}"] = mean_std(uniform)[0]
        metrics[system]["router_bits_per_weight"] = router_bits
        stored = storage["codes"] + storage["scales"] + storage["routers"]
        metrics[system]["stored_layer_bytes"] = stored / 8
    for budget in fractional:  # random-depth ppl minus routed ppl, paired by seed
        key = f"{budget:g}"
        gains = [
            random["budgets"][key]["ppl"] - routed["budgets"][key]["ppl"]
            for random, routed in _paired_nested(cells)
        ]
        mean, std = mean_std(gains)
        metrics["mobiquant"][f"router_gain@{key}"] = mean
        metrics["mobiquant"][f"router_gain_std@{key}"] = std if len(gains) > 1 else None
    for system in MIGRATION_SYSTEMS:
        for bits, by_seed in _jaccards(cells, fp_cell, system).items():
            metrics[system][f"top10_jaccard@{bits}"] = mean_std(list(by_seed.values()))[0]
        metrics[system]["top10_jaccard_chance"] = CHANCE_JACCARD
    return metrics


def _fractional(config: Config) -> list[float]:
    """The budgets between whole depths, where routed and random depths differ."""
    return [b for b in config.budgets if (b / config.slice_bits) % 1]


def _paired_nested(cells: list[dict[str, Any]]) -> list[tuple[dict, dict]]:
    """``(router-free cell, MoBiQuant cell)`` of each seed."""
    by_seed = {(c["system"], c["seed"]): c for c in cells if c["part"] == "nested"}
    return [
        (by_seed[("nested", seed)], by_seed[("mobiquant", seed)])
        for system, seed in sorted(by_seed)
        if system == "mobiquant"
    ]


def _jaccards(
    cells: list[dict[str, Any]], fp_cell: dict[str, Any], system: str
) -> dict[int, dict[int, float]]:
    """Per bit width (2, 3) and per seed ``system`` ran, the Jaccard overlap of its top-10% tokens
    by loss increase at that width with those at 4 bits (outlier migration, paper §3)."""
    fp_nll = torch.tensor(fp_cell["nll"])
    seeds = sorted({c["seed"] for c in cells if c.get("system") == system})

    def delta(bits: int, seed: int) -> torch.Tensor:
        for c in cells:
            if c.get("system") == system and c["bits"] == bits and c["seed"] == seed:
                return torch.tensor(c["nll"]) - fp_nll
        raise KeyError((system, bits, seed))

    return {
        bits: {s: _jaccard_top(delta(bits, s), delta(4, s), TOP_FRACTION) for s in seeds}
        for bits in (2, 3)
    }


def per_seed_values(
    cells: list[dict[str, Any]], config: Config, metrics: dict[str, dict[str, Any]]
) -> dict[str, dict[str, list[float]]]:
    """What the claims read, per system and seed (seed order ``config.seed``, ``+1``, ...):
    ``ppl@P`` and ``bits@P`` at every bit point the system runs, ``top10_jaccard@3`` for the
    migration systems, ``cross_calibrated_ppl@4`` for clip_rtn (rtn's is its own perplexity:
    it calibrates nothing) and ``stored_layer_bytes``. A data-free system's one run stands for
    every seed."""
    seeds = [config.seed + offset for offset in range(config.n_seeds)]
    values: dict[str, dict[str, list[float]]] = {s: {} for s in metrics}

    def cell(system: str, seed: int, **match: Any) -> dict[str, Any]:
        seed = config.seed if system in DATA_FREE else seed
        return next(
            c
            for c in cells
            if c.get("system") == system
            and c["seed"] == seed
            and all(c.get(k) == v for k, v in match.items())
        )

    for system in PER_BIT:
        for bits in config.per_bit:
            values[system][f"ppl@{bits:g}"] = [cell(system, s, bits=bits)["ppl"] for s in seeds]
            values[system][f"bits@{bits:g}"] = [float(bits)] * len(seeds)
    for system in NESTED:
        for budget in config.budgets:
            key = f"{budget:g}"
            read = [cell(system, s)["budgets"][key] for s in seeds]
            values[system][f"ppl@{key}"] = [r["ppl"] for r in read]
            values[system][f"bits@{key}"] = [r["bits"] for r in read]
    fp_cell = next(c for c in cells if c["part"] == "fp")
    for system in MIGRATION_SYSTEMS:
        by_seed = _jaccards(cells, fp_cell, system)[3]
        run_seed = {s: config.seed if system in DATA_FREE else s for s in seeds}  # as cell() maps
        values[system]["top10_jaccard@3"] = [by_seed[run_seed[s]] for s in seeds]
    migration = {c["seed"]: c for c in cells if c["part"] == "migration"}
    values["clip_rtn"]["ppl@4"] = [migration[s]["calib4_run4"] for s in seeds]
    values["clip_rtn"]["cross_calibrated_ppl@4"] = [migration[s]["calib3_run4"] for s in seeds]
    values["rtn"]["cross_calibrated_ppl@4"] = values["rtn"]["ppl@4"]
    for system, row in metrics.items():
        values[system]["stored_layer_bytes"] = [row["stored_layer_bytes"]]
    return values


def regime(metrics: dict[str, dict[str, Any]]) -> list[Claim]:
    """Whether the testbed can tell quantizers apart at all (issue 31): low-bit quantization must
    visibly hurt the full-precision model, else every "within x % of GPTQ" claim holds vacuously.
    Margins fixed in advance: 2-bit RTN >= +30 % and 3-bit GPTQ >= +2 % perplexity over full
    precision."""
    fp = metrics["fp"]["full_precision_ppl"]
    return [
        Claim.compare(
            f"2-bit RTN costs at least +{RTN2_MIN_COST:.0%} perplexity over full precision",
            metrics["rtn"]["ppl@2"],
            ">=",
            (1 + RTN2_MIN_COST) * fp,
            value_label="RTN ppl@2",
            reference_label=f"{1 + RTN2_MIN_COST:g} x full-precision ppl {format_number(fp)} =",
        ),
        Claim.compare(
            f"3-bit GPTQ costs at least +{GPTQ3_MIN_COST:.0%} perplexity over full precision",
            metrics["gptq"]["ppl@3"],
            ">=",
            (1 + GPTQ3_MIN_COST) * fp,
            value_label="GPTQ ppl@3",
            reference_label=f"{1 + GPTQ3_MIN_COST:g} x full-precision ppl {format_number(fp)} =",
        ),
    ]


def claims(values: dict[str, dict[str, list[float]]], config: Config) -> list[Claim]:
    """The claims, each judged seed by seed on ``values`` (:func:`per_seed_values`) and again
    with its control in MoBiQuant's place (``Config.CLAIMS``)."""

    seeds = [config.seed + offset for offset in range(config.n_seeds)]

    def seeds_of(system: str, name: str) -> list[float]:
        return values[system][name]  # a KeyError: the system does not run this point

    def within_gptq(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "ppl@4"),
            "<=",
            [(1 + WITHIN) * g for g in seeds_of("gptq", "ppl@4")],
            seeds=seeds,
            value_label=f"{system} ppl@4",
            reference_label=f"{1 + WITHIN:g} x GPTQ ppl@4",
        )

    def beats_matryoshka(bits: int) -> Callable[[str], Claim]:
        def test(system: str) -> Claim:
            return Claim.all_of(
                system,
                [
                    Claim.worst_seed(
                        "vs Matryoshka",
                        seeds_of(system, f"ppl@{bits}"),
                        "<",
                        seeds_of("matryoshka", f"ppl@{bits}"),
                        seeds=seeds,
                        value_label=f"{system} ppl",
                        reference_label="MSB slicing of 8-bit RTN ppl",
                    ),
                    Claim.worst_seed(
                        "within its budget on the test text",
                        seeds_of(system, f"bits@{bits}"),
                        "<=",
                        bits + BUDGET_SLACK,
                        seeds=seeds,
                        value_label="measured code bits",
                        reference_label=f"budget + {BUDGET_SLACK}",
                    ),
                ],
            )

        return test

    fractional = _fractional(config)

    def router_gain(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.paired(
                    f"at {b:g} bits",
                    [
                        random - routed
                        for random, routed in zip(
                            seeds_of("nested", f"ppl@{b:g}"),
                            seeds_of(system, f"ppl@{b:g}"),
                            strict=True,
                        )
                    ],
                    0.0,
                    label=f"ppl gain of {system} over random depths at {b:g} bits",
                )
                for b in fractional
            ],
        )

    def beats_upscaling(system: str) -> Claim:
        return Claim.all_of(
            system,
            [
                Claim.worst_seed(
                    f"at {bits}",
                    seeds_of(system, f"ppl@{bits}"),
                    "<",
                    seeds_of("anyprec", f"ppl@{bits}"),
                    seeds=seeds,
                    value_label=f"{system} ppl",
                    reference_label="upscaled ppl",
                )
                for bits in (2, 3, 4)
            ],
        )

    def smaller_checkpoint(system: str) -> Claim:
        return Claim.compare(
            system,
            seeds_of(system, "stored_layer_bytes")[0],
            "<",
            seeds_of("gptq", "stored_layer_bytes")[0],
            value_label=f"{system} bytes",
            reference_label="per-bit set bytes",
        )

    def migrates(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "top10_jaccard@3"),
            "<",
            MIGRATION_JACCARD,
            seeds=seeds,
            value_label=f"Jaccard ({system} 3 vs 4 bits)",
        )

    def cross_costs(system: str) -> Claim:
        return Claim.worst_seed(
            system,
            seeds_of(system, "cross_calibrated_ppl@4"),
            ">",
            seeds_of(system, "ppl@4"),
            seeds=seeds,
            value_label=f"{system} ppl, calibrated at 3",
            reference_label="at 4",
        )

    out = [config.judge("within_gptq_at_4_bits", within_gptq)]
    out += [config.judge(f"beats_matryoshka_at_{b}_bits", beats_matryoshka(b)) for b in (2, 3)]
    if fractional:
        budgets = ", ".join(f"{b:g}" for b in fractional)
        out.append(
            config.judge(
                "router_beats_random_depths", router_gain, text_values={"fractional": budgets}
            )
        )
    out += [
        config.judge("beats_upscaling", beats_upscaling),
        config.judge(
            "one_checkpoint_is_smaller",
            smaller_checkpoint,
            text_values={"per_bit_set": "+".join(str(b) for b in config.per_bit)},
        ),
        config.judge("outliers_migrate", migrates),
        config.judge("cross_calibration_costs", cross_costs),
    ]
    return out


def _plot(metrics: dict[str, dict[str, Any]], config: Config, out_dir: Path) -> None:
    series = {}
    for system in (*PER_BIT, *NESTED):
        row = metrics[system]
        keys = [f"{p:g}" for p in _points(config) if row[f"ppl@{p:g}"] is not None]
        xs = [row[f"effective_bits@{k}"] for k in keys]
        series[system] = (xs, [row[f"ppl@{k}"] for k in keys])
    line_plot(
        out_dir / "perplexity_vs_bits.png",
        series,
        xlabel="effective bits per weight (codes + scales/zeros + routers)",
        ylabel="test perplexity",
        title=f"tiny Llama (full precision {metrics['fp']['full_precision_ppl']:.3f})",
    )
