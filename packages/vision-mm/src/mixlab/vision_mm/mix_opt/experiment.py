"""Mix-Opt against BP-high, BP-low, ZO-high and random mixing (``mixlab run mix_opt``).

The shapes UNet pre-trained here (cached) is personalized with a rank-4 LoRA to the subject, a
striped three-coloured star, from 4 images on white, under each system with the same steps,
batch, learning rates and seeds. Samples for "<sks> star on <background>" (every background,
three of them never seen with the subject) are scored for subject fidelity (DINO_local cosine,
nearest SSIM), prompt fidelity (background classifier) and structural distortion (edge IoU at
32²); the un-personalized model is the ``base`` row. Peak training memory (in all, and what
one step adds) and time per step of each mode are measured on the experiment's UNet at
``memory_resolution``, each mode in a fresh process (on CUDA the allocator's peak, on a CPU the
resident set); a mixing schedule's peak is the larger of its modes'.

Random mixing takes ZO-high steps with Mix-Opt's mean probability E[p_ZO] (same BP/ZO ratio).

Regime checks (:func:`regime`), with margins fixed before measuring:

- the base model draws what it is asked for: the evaluation networks read the asked shape and
  solid colour in at least :data:`RECOGNISABLE` (80 %) of its samples, one per colour × shape ×
  background caption;
- BP-high, the upper bound the claims measure against, beats the un-personalized model's
  DINO_local by more than :data:`REGIME_MARGIN` (0.02) on every seed;

either failing leaves the quality claims untested. The memory claim needs every mode to add at
least :data:`MEMORY_FLOOR_MIB` (50 MiB) per step, where the probe is well above its noise.

Claims (declared with their controls in :data:`~.config.CLAIMS`): the memory claim (control:
BP-low alone); the quality claims on every seed, each assuming issue 63's premises
(:func:`premises`: BP-low alone adapts, ZO-high alone makes progress on its loss), with BP-low
alone (fidelity) and random mixing (distortion, schedule) as controls. The config
(:mod:`mixlab.vision_mm.mix_opt.config`) loads without torch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from mixlab.shared import (
    Claim,
    Result,
    bar_plot,
    mean_std,
    resolve_device,
    run_cells,
    seed_everything,
)
from mixlab.shared.files import write_text_atomic
from mixlab.shared.result import format_number
from mixlab.vision_mm.mix_opt.config import (
    CLOSE_TO_ZO,
    FIDELITY_SHARE,
    METHOD,
    WELL_BELOW_BP,
    Config,
)
from mixlab.vision_mm.mix_opt.data import (
    BACKGROUNDS,
    COLOURS,
    SHAPES,
    SUBJECT_TOKEN,
    encode_caption,
    subject_images,
)
from mixlab.vision_mm.mix_opt.lora import add_lora
from mixlab.vision_mm.mix_opt.metrics import (
    EvalSpec,
    edge_iou,
    evaluation_nets,
    feature_center,
    feature_cosine,
    nearest_ssim,
    prompt_accuracy,
)
from mixlab.vision_mm.mix_opt.model import (
    noise_scheduler,
    null_captions,
    pretrained_model,
    sample,
    save_grid,
)
from mixlab.vision_mm.mix_opt.profile import profile_modes
from mixlab.vision_mm.mix_opt.trainer import MixOptTrainer

MODES_OF = {
    "bp_high": ("bp_high",),
    "bp_low": ("bp_low",),
    "zo_high": ("zo_high",),
    "random": ("bp_low", "zo_high"),
    "mix_opt": ("bp_low", "zo_high"),
}
REGIME_MARGIN = 0.02
"""regime: BP-high's DINO_local must exceed the un-personalized model's by more than this on every
seed (fixed before measuring), else personalization is not visible and the claims are untested"""
RECOGNISABLE = 0.8
"""regime: the share of the base model's samples whose shape and colour the evaluation networks
read as the caption's (fixed before measuring)"""
MEMORY_FLOOR_MIB = 50.0
"""regime: every mode must add at least this much per step for the memory claim to be tested"""
PROGRESS_ALPHA = 0.05
"""premise: ZO-high's training loss over its last quarter of steps is below its first quarter's
at this level (one-sided Welch t-test) on every seed"""

__all__ = [
    "MEMORY_FLOOR_MIB",
    "METHOD",
    "PROGRESS_ALPHA",
    "RECOGNISABLE",
    "REGIME_MARGIN",
    "Config",
    "claims",
    "regime",
    "run",
    "summarise",
]


def evaluation_prompts(config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """(captions, background labels): ``samples_per_prompt`` per background, twice as many for
    the training background (the structural metrics use those)."""
    captions, labels = [], []
    for index, background in enumerate(BACKGROUNDS):
        n = config.samples_per_prompt * (2 if background == config.subject_background else 1)
        captions += [encode_caption(SUBJECT_TOKEN, "star", background)] * n
        labels += [index] * n
    return torch.tensor(captions), torch.tensor(labels)


def samples_of(unet, encoder, captions: torch.Tensor, config: Config, seed: int) -> torch.Tensor:
    """DDIM samples (on the CPU) of ``captions`` (N, 3) token ids, as the config samples."""
    device = next(unet.parameters()).device
    encoder.to(device)
    with torch.inference_mode():
        context = encoder(captions.to(device))
        empty = encoder(null_captions(len(captions)).to(device))
    spec = config.model_spec
    return sample(
        unet,
        context,
        empty,
        steps=config.sampling_steps,
        guidance=config.guidance,
        seed=seed,
        train_timesteps=spec.train_timesteps,
        prediction_type=spec.prediction,
    ).cpu()


def evaluate(unet, encoder, references, config: Config, seed: int, nets) -> dict[str, Any]:
    """Samples for the evaluation prompts and their quality metrics."""
    captions, backgrounds = evaluation_prompts(config)
    samples = samples_of(unet, encoder, captions, config, seed + 4242)
    feature_net, attribute_net, center = nets
    own = backgrounds == list(BACKGROUNDS).index(config.subject_background)
    return {
        "samples": samples,
        "subject_fidelity": feature_cosine(feature_net, samples, references, center),
        "nearest_ssim": nearest_ssim(samples[own], references),
        "prompt_fidelity": prompt_accuracy(attribute_net, samples, backgrounds),
        "edge_iou": edge_iou(samples[own], references),
    }


def base_recognition(config: Config, nets) -> dict[str, Any]:
    """How recognisably the un-personalized model draws: one sample per colour × shape ×
    background caption, read by the evaluation networks (shape and fill heads, background
    head)."""
    device = resolve_device(config.device)
    unet, encoder = pretrained_model(config.model_spec, device)
    labels = [
        (shape, colour, background)
        for colour in range(len(COLOURS))
        for shape in range(len(SHAPES))
        for background in range(len(BACKGROUNDS))
    ]
    captions = torch.tensor(
        [encode_caption(list(COLOURS)[c], SHAPES[s], list(BACKGROUNDS)[b]) for s, c, b in labels]
    )
    samples = samples_of(unet, encoder, captions, config, seed=777)
    feature_net, attribute_net, _ = nets
    shape, colour, background = torch.tensor(labels).T
    with torch.inference_mode():
        read = feature_net(samples)
        read_background = attribute_net(samples)["background"].argmax(-1)
    shape_ok = read["shape"].argmax(-1) == shape
    colour_ok = read["fill"].argmax(-1) == colour  # the fill label of a solid fill is its colour
    return {
        "samples": samples,
        "recognised": (shape_ok & colour_ok).float().mean().item(),
        "shape_accuracy": shape_ok.float().mean().item(),
        "colour_accuracy": colour_ok.float().mean().item(),
        "background_accuracy": (read_background == background).float().mean().item(),
    }


def run_system(config: Config, system: str, seed: int, out_dir: Path, nets) -> dict[str, Any]:
    device = resolve_device(config.device)
    seed_everything(seed)
    unet, encoder = pretrained_model(config.model_spec, device)
    subject = subject_images(
        config.subject_images,
        background=config.subject_background,
        size=config.resolution,
        seed=seed,
    )
    start = time.perf_counter()
    history: list[dict[str, Any]] = []
    if system != "base":
        add_lora(unet, rank=config.rank)
        with torch.inference_mode():
            text = encoder(subject.captions.to(device))
        trainer = MixOptTrainer(
            unet,
            noise_scheduler(config.model_spec),
            subject.images,
            text.clone(),
            config.trainer_config(system, seed),
        )
        history = trainer.train(out_dir / "checkpoints" / f"train-{system}-seed{seed}")
        unet.eval()
    seconds = time.perf_counter() - start
    scores = evaluate(unet, encoder, subject.images, config, seed, nets)
    modes = [h["mode"] for h in history]
    return {
        **scores,
        "seconds": seconds,
        "zo_share": modes.count("zo_high") / len(modes) if modes else None,
        "final_loss": float(np.mean([h["loss"] for h in history[-50:]])) if history else None,
        "history": [[h["step"], h["mode"], h["timesteps"], h["loss"]] for h in history],
    }


def run_memory(config: Config) -> dict[str, Any]:
    modes = ("bp_high", "bp_low", "zo_high")
    common = {
        "resolution": config.memory_resolution,
        "low_resolution": config.memory_low_resolution,
        "batch_size": config.memory_batch_size,
        "rank": config.rank,
        "channels": list(config.model_spec.channels),
        "text_dim": config.model_spec.text_dim,
        "device": _probe_device(config),
        "steps": 3,  # the median of 3 timed steps (the benchmark times 5)
    }
    measured = profile_modes([{**common, "mode": mode} for mode in modes])
    return dict(zip(modes, measured, strict=True))


def _probe_device(config: Config) -> str:
    """Where the memory probe runs: the experiment's CUDA device (the allocator's figures), else
    the CPU (the resident set)."""
    device = resolve_device(config.device)
    return str(device) if device.type == "cuda" else "cpu"


def _cells(config: Config) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = [{"part": "memory"}, {"part": "recognition"}]
    for offset in range(config.n_seeds):
        for system in ("base", *config.systems):
            cells.append({"part": "train", "system": system, "seed": config.seed + offset})
    return cells


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    pretrained_model(config.model_spec)  # the one-time pre-training, outside the timed cells
    feature_net, attribute_net = evaluation_nets(
        EvalSpec(config.eval_net_images, config.eval_net_steps)
    )
    nets = (feature_net, attribute_net, feature_center(feature_net))

    def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
        if cell["part"] == "memory":
            return {**cell, "modes": run_memory(config)}
        if cell["part"] == "recognition":
            return {**cell, **base_recognition(config, nets)}
        return {**cell, **run_system(config, cell["system"], cell["seed"], out_dir, nets)}

    cells = run_cells(
        out_dir, config, _cells(config), run_cell, resume=resume, label="mix_opt cells"
    )
    for system in ("base", *config.systems):
        first = next(c for c in cells if c.get("system") == system)
        save_grid(
            out_dir / f"samples_{system}.png",
            first["samples"],
            columns=config.samples_per_prompt * 2,
        )
    recognition = next(c for c in cells if c["part"] == "recognition")
    columns = len(BACKGROUNDS) * len(SHAPES)
    save_grid(out_dir / "samples_base_captions.png", recognition["samples"], columns)
    plain = [{k: v for k, v in c.items() if k != "samples"} for c in cells]
    write_text_atomic(out_dir / "cells.json", json.dumps(plain, indent=1) + "\n")
    metrics = summarise(cells, config)
    _plots(metrics, out_dir)
    found = claims(cells, metrics, config)
    return Result(metrics=metrics, claims=found, regime=regime(cells, found))


def regime(cells: list[dict[str, Any]], found: list[Claim] | None = None) -> list[Claim]:
    """Whether the setup can test the claims:

    1. the base model is recognisable: the evaluation networks read the caption's shape and colour
       in at least :data:`RECOGNISABLE` of its samples;
    2. personalization is visible in subject fidelity: BP-high (the upper bound the quality claims
       are measured against) beats the un-personalized model's DINO_local by more than
       :data:`REGIME_MARGIN` on every seed;
    3. every mode adds at least :data:`MEMORY_FLOOR_MIB` per step in the memory probe.

    Given the run's claims (``found``), 1 and 2 gate the quality claims and 3 the memory claim:
    peak memory is measured on the same steps whatever the base model draws."""
    recognition = next(c for c in cells if c["part"] == "recognition")
    recognisable = Claim.compare(
        "The un-personalized base model draws what its caption asks for: the evaluation networks "
        f"read the caption's shape and solid colour in at least {RECOGNISABLE:.0%} of its samples (one "
        "per colour × shape × background)",
        recognition["recognised"],
        ">=",
        RECOGNISABLE,
        value_label="share of base samples read as asked",
    )
    memory = next(c["modes"] for c in cells if c["part"] == "memory")
    floor = Claim.all_of(
        f"Every mode adds at least {MEMORY_FLOOR_MIB:g} MiB per training step in the memory "
        "probe, well above its noise",
        [
            Claim.compare(
                mode,
                memory[mode]["added_peak_bytes"] / 2**20,
                ">=",
                MEMORY_FLOOR_MIB,
                value_label=f"{mode} MiB added per step",
            )
            for mode in ("bp_high", "bp_low", "zo_high")
        ],
    )
    fidelity = {
        (c["system"], c["seed"]): c["subject_fidelity"] for c in cells if c["part"] == "train"
    }
    seeds = sorted({seed for system, seed in fidelity if system == "base"})
    parts = []
    for seed in seeds:
        base = fidelity[("base", seed)]
        parts.append(
            Claim.compare(
                f"seed {seed}",
                fidelity[("bp_high", seed)],
                ">",
                base + REGIME_MARGIN,
                value_label=f"seed {seed}: BP-high DINO_local",
                reference_label=(
                    f"un-personalized {format_number(base)} + margin {REGIME_MARGIN:g} ="
                ),
            )
        )
    check = Claim.all_of(
        "BP-high personalization beats the un-personalized base model in subject fidelity "
        f"(DINO_local) by more than {REGIME_MARGIN:g} on every seed ({len(seeds)} of "
        f"{len(seeds)})",
        parts,
    )
    if found is None:
        return [recognisable, check, floor]
    memory_claims = [claim for claim in found if "peak training memory" in claim.text]
    quality = [claim for claim in found if claim not in memory_claims]
    return [recognisable.gating(*quality), check.gating(*quality), floor.gating(*memory_claims)]


QUALITY = ("subject_fidelity", "nearest_ssim", "prompt_fidelity", "edge_iou")
RECOGNITION = ("recognised", "shape_accuracy", "colour_accuracy", "background_accuracy")


def summarise(cells: list[dict[str, Any]], config: Config) -> dict[str, dict[str, float | None]]:
    """One row per system: quality metrics (mean and sample std over seeds), structural
    distortion (1 − edge IoU), ZO share of steps, final training loss, training seconds,
    peak training memory in all and added per step (MiB; mixing: the larger of its modes), the
    ratios of the total to ZO-high's and BP-high's, and seconds per step of its modes (mixing:
    weighted by its ZO share). The base row also carries how recognisably it draws
    (:func:`base_recognition`; None in the other rows)."""
    memory = next(c["modes"] for c in cells if c["part"] == "memory")
    recognition = next(c for c in cells if c["part"] == "recognition")
    metrics: dict[str, dict[str, float | None]] = {}
    for system in ("base", *config.systems):
        mine = [c for c in cells if c.get("system") == system]
        row: dict[str, float | None] = {}
        for name in QUALITY:
            row[name], row[f"{name}_std"] = mean_std([c[name] for c in mine])
        row["structural_distortion"] = 1 - row["edge_iou"]
        shares = [c["zo_share"] for c in mine if c["zo_share"] is not None]
        row["zo_share"] = float(np.mean(shares)) if shares else None
        losses = [c["final_loss"] for c in mine if c["final_loss"] is not None]
        row["final_loss"] = float(np.mean(losses)) if losses else None
        row["train_seconds"] = float(np.mean([c["seconds"] for c in mine]))
        for name in RECOGNITION:
            row[name] = recognition[name] if system == "base" else None
        modes = MODES_OF.get(system)
        if modes:
            peak = max(memory[m]["total_peak_bytes"] for m in modes)
            row["peak_memory_mb"] = peak / 2**20
            row["added_memory_mb"] = max(memory[m]["added_peak_bytes"] for m in modes) / 2**20
            row["memory_vs_zo_high"] = _ratio(peak, memory["zo_high"]["total_peak_bytes"])
            row["memory_vs_bp_high"] = _ratio(peak, memory["bp_high"]["total_peak_bytes"])
            zo = row["zo_share"] or 0.0
            per_step = {m: memory[m]["seconds_per_step"] for m in modes}
            row["seconds_per_step"] = (
                per_step[modes[0]]
                if len(modes) == 1
                else (1 - zo) * per_step["bp_low"] + zo * per_step["zo_high"]
            )
        else:
            for name in (
                "peak_memory_mb",
                "added_memory_mb",
                "memory_vs_zo_high",
                "memory_vs_bp_high",
                "seconds_per_step",
            ):
                row[name] = None
        metrics[system] = row
    _paired_by_seed(cells, metrics)
    return metrics


def _ratio(value: float, reference: float) -> float:
    """value / reference, NaN (recorded as null; a claim on it does not hold) when the reference
    is 0 (nothing measured)."""
    return value / reference if reference > 0 else float("nan")


PAIRED = (
    "gain_share_of_bp_high_min",
    "fidelity_over_zo_high_min",
    "distortion_over_bp_low_max",
    "fidelity_over_random_min",
    "distortion_over_random_max",
    "subject_fidelity_p_vs_random",
    "edge_iou_p_vs_random",
)
"""Mix-Opt's comparisons paired by seed, for the table (None in the other rows); the claims
compute theirs from the cells for any system (:func:`claims`)"""


def _paired_by_seed(cells, metrics) -> None:
    """Mix-Opt against each reference on the same seed, its worst seed kept: the share of
    BP-high's DINO_local gain over the base model it keeps, its DINO_local above ZO-high's and
    random mixing's, its distortion above BP-low's and random mixing's (so below 0 means lower
    on every seed); and paired t-test p-values against random mixing (None for 1 seed)."""

    def per_seed(system: str, name: str) -> np.ndarray:
        rows = sorted((c for c in cells if c.get("system") == system), key=lambda c: c["seed"])
        if name == "distortion":
            return np.array([1 - c["edge_iou"] for c in rows])
        return np.array([c[name] for c in rows])

    for system in metrics:
        metrics[system].update(dict.fromkeys(PAIRED))
    mix = {name: per_seed("mix_opt", name) for name in ("subject_fidelity", "distortion")}
    fidelity = {
        s: per_seed(s, "subject_fidelity") for s in ("base", "bp_high", "zo_high", "random")
    }
    gain = fidelity["bp_high"] - fidelity["base"]
    # a share of no gain is undefined: NaN (min keeps it), recorded as null, and the claim fails
    share = (mix["subject_fidelity"] - fidelity["base"]) / np.where(gain > 0, gain, np.nan)
    row = metrics["mix_opt"]
    row["gain_share_of_bp_high_min"] = float(share.min())
    row["fidelity_over_zo_high_min"] = float((mix["subject_fidelity"] - fidelity["zo_high"]).min())
    row["fidelity_over_random_min"] = float((mix["subject_fidelity"] - fidelity["random"]).min())
    for reference in ("bp_low", "random"):
        gap = mix["distortion"] - per_seed(reference, "distortion")
        row[f"distortion_over_{reference}_max"] = float(gap.max())
    for name in ("subject_fidelity", "edge_iou"):
        a, b = per_seed("mix_opt", name), per_seed("random", name)
        paired = len(a) > 1 and not np.array_equal(a, b)
        row[f"{name}_p_vs_random"] = float(stats.ttest_rel(a, b).pvalue) if paired else None


def premises(cells: list[dict[str, Any]]) -> dict[str, Claim]:
    """Issue 63's premises of the quality claims, each on every seed: BP-low alone raises
    subject fidelity over the un-personalized model by more than :data:`REGIME_MARGIN`, and
    ZO-high alone makes measurable progress on its training loss (its last quarter of steps
    below its first, one-sided Welch t-test at :data:`PROGRESS_ALPHA`)."""

    def rows(system: str) -> list[dict[str, Any]]:
        return sorted((c for c in cells if c.get("system") == system), key=lambda c: c["seed"])

    base = {c["seed"]: c["subject_fidelity"] for c in rows("base")}
    bp_low = rows("bp_low")
    adapts = Claim.worst_seed(
        f"BP-low alone raises subject fidelity (DINO_local) over the un-personalized model by "
        f"more than {REGIME_MARGIN:g} on every seed",
        [c["subject_fidelity"] for c in bp_low], ">", [base[c["seed"]] + REGIME_MARGIN for c in bp_low],
        seeds=[c["seed"] for c in bp_low], value_label="BP-low DINO_local",
        reference_label=f"un-personalized + {REGIME_MARGIN:g}",
    )  # fmt: skip
    zo_high = rows("zo_high")
    progresses = Claim.worst_seed(
        "ZO-high alone makes measurable progress on its training loss on every seed: its last "
        f"quarter of steps below its first (one-sided Welch t-test, p < {PROGRESS_ALPHA:g})",
        [_progress_p_value([h[3] for h in c["history"]]) for c in zo_high], "<", PROGRESS_ALPHA,
        seeds=[c["seed"] for c in zo_high], value_label="p (last quarter < first quarter)",
    )  # fmt: skip
    return {"bp_low_adapts": adapts, "zo_high_progresses": progresses}


def _progress_p_value(losses: list[float]) -> float:
    """One-sided Welch t-test p that the last quarter of ``losses`` lies below the first; NaN
    (the premise fails) with fewer than two steps a quarter."""
    quarter = len(losses) // 4
    if quarter < 2:
        return float("nan")
    first, last = np.asarray(losses[:quarter]), np.asarray(losses[-quarter:])
    return float(stats.ttest_ind(last, first, equal_var=False, alternative="less").pvalue)


def claims(
    cells: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], config: Config
) -> list[Claim]:
    """The four claims (:data:`~.config.CLAIMS`), each judged on Mix-Opt and again on its
    control. The quality claims read each system's per-seed numbers (every seed must pass, against
    each reference on the same seed) and assume :func:`premises`; the memory claim reads the
    memory probe, which has no seed in it."""

    def per_seed(system: str, name: str) -> list[float]:
        rows = sorted((c for c in cells if c.get("system") == system), key=lambda c: c["seed"])
        if not rows:
            raise KeyError(system)
        return [1 - c["edge_iou"] if name == "distortion" else c[name] for c in rows]

    seeds = [c["seed"] for c in sorted((c for c in cells if c.get("system") == "base"),
                                       key=lambda c: c["seed"])]  # fmt: skip
    checked = premises(cells)

    def memory_near_zo(system: str) -> Claim:
        row = metrics[system]
        return Claim.all_of(system, [
            Claim.compare("close to ZO-high", row["memory_vs_zo_high"], "<=", CLOSE_TO_ZO,
                          value_label=f"{system} peak / ZO-high peak"),
            Claim.compare("well below BP-high", row["memory_vs_bp_high"], "<=", WELL_BELOW_BP,
                          value_label=f"{system} peak / BP-high peak"),
        ])  # fmt: skip

    def fidelity_near_bp_high(system: str) -> Claim:
        fidelity = np.array(per_seed(system, "subject_fidelity"))
        base = np.array(per_seed("base", "subject_fidelity"))
        gain = np.array(per_seed("bp_high", "subject_fidelity")) - base
        # a share of no gain is undefined: NaN, and the claim fails
        share = (fidelity - base) / np.where(gain > 0, gain, np.nan)
        return Claim.all_of(system, [
            Claim.worst_seed("close to BP-high", share.tolist(), ">=", FIDELITY_SHARE, seeds=seeds,
                             value_label=f"{system}'s share of BP-high's DINO_local gain"),
            Claim.worst_seed("above ZO-high", fidelity.tolist(), ">", per_seed("zo_high", "subject_fidelity"),
                             seeds=seeds, value_label=f"{system} DINO_local", reference_label="ZO-high"),
        ])  # fmt: skip

    def less_distortion_than_bp_low(system: str) -> Claim:
        return Claim.worst_seed(system, per_seed(system, "distortion"), "<", per_seed("bp_low", "distortion"),
                                seeds=seeds, value_label=f"{system} 1 − edge IoU", reference_label="BP-low")  # fmt: skip

    def schedule_beats_random(system: str) -> Claim:
        return Claim.all_of(system, [
            Claim.worst_seed("subject fidelity", per_seed(system, "subject_fidelity"), ">",
                             per_seed("random", "subject_fidelity"), seeds=seeds,
                             value_label=f"{system} DINO_local", reference_label="random"),
            Claim.worst_seed("structural distortion", per_seed(system, "distortion"), "<",
                             per_seed("random", "distortion"), seeds=seeds,
                             value_label=f"{system} 1 − edge IoU", reference_label="random"),
        ])  # fmt: skip

    return [
        config.judge("memory_near_zo", memory_near_zo),
        config.judge("fidelity_near_bp_high", fidelity_near_bp_high, premises=checked),
        config.judge("less_distortion_than_bp_low", less_distortion_than_bp_low, premises=checked),
        config.judge("schedule_beats_random", schedule_beats_random, premises=checked),
    ]


def _plots(metrics: dict[str, dict[str, Any]], out_dir: Path) -> None:
    bar_plot(
        out_dir / "subject_fidelity.png",
        {s: m["subject_fidelity"] for s, m in metrics.items()},
        errors={s: m["subject_fidelity_std"] for s, m in metrics.items()},
        ylabel="DINO_local cosine to the subject",
        title="Subject fidelity after personalization",
    )
    bar_plot(
        out_dir / "peak_memory.png",
        {s: m["peak_memory_mb"] for s, m in metrics.items() if m["peak_memory_mb"] is not None},
        ylabel="peak training memory in all (MiB)",
        title="Peak training memory (memory probe)",
    )
