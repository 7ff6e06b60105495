"""Mix-Opt against BP-high, BP-low, ZO-high, random mixing and a matched BP-low
(``mixlab run mix_opt``).

The shapes UNet pre-trained here (cached; half its steps at the low resolution) is personalized
with a rank-4 LoRA to the subject, a striped three-coloured star, from 4 images on white, under
each system with the same steps, batch and seeds. First the step sizes (and BP-low's
resolution) are tuned on a validation subject, as many candidates for each tuned system
(:func:`tuning_candidates`, :func:`choose`); the mixing systems take their modes' choices.
Samples for "<sks> star on <background>" (every background, three of them never seen with the
subject) are scored for subject fidelity (DINO_local cosine, nearest SSIM), prompt fidelity
(background classifier) and structural distortion (edge IoU at 32²); the un-personalized model
is the ``base`` row. Peak training memory (in all, and what one step adds) and time per step of
each mode are measured on the experiment's UNet at ``memory_resolution``, each mode in a fresh
process (on CUDA the allocator's peak, on a CPU the resident set); a mixing schedule's peak is
the larger of its modes'.

Random mixing takes ZO-high steps with Mix-Opt's mean probability E[p_ZO] (same BP/ZO ratio);
the matched BP-low takes as many BP-low steps as Mix-Opt's run on the same seed
(:func:`~.trainer.planned_modes`).

Regime checks (:func:`regime`), with margins fixed before measuring:

- the base model draws what it is asked for: the evaluation networks read the asked shape and
  solid colour in at least :data:`RECOGNISABLE` (80 %) of its samples, one per colour × shape ×
  background caption;
- BP-high, the upper bound the claims measure against, beats the un-personalized model's
  DINO_local by more than :data:`~.config.ADAPT_MARGIN` (0.02) on every seed;

either failing leaves the quality claims untested. The memory claim needs every mode to add at
least :data:`MEMORY_FLOOR_MIB` (50 MiB) per step, where the probe is well above its noise.

Claims (declared with their controls in :data:`~.config.CLAIMS`): the memory claim (control:
BP-low alone); the quality claims on every seed, each assuming issue 63's premises
(:func:`premises`: BP-low alone adapts, ZO-high alone makes progress on its loss), with BP-low
alone (fidelity), the matched BP-low (distortion) and random mixing (schedule) as controls.
The config (:mod:`mixlab.vision_mm.mix_opt.config`) imports neither torch nor this package's
other modules.
"""

from __future__ import annotations

import functools
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
    ADAPT_MARGIN,
    CLOSE_TO_ZO,
    FIDELITY_SHARE,
    METHOD,
    PROGRESS_SHARE,
    WELL_BELOW_BP,
    Config,
)
from mixlab.vision_mm.mix_opt.data import (
    BACKGROUNDS,
    COLOURS,
    SHAPES,
    SUBJECT_TOKEN,
    VALIDATION_SUBJECT,
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
    model_spec,
    noise_scheduler,
    null_captions,
    pretrained_model,
    sample,
    save_grid,
)
from mixlab.vision_mm.mix_opt.profile import profile_modes
from mixlab.vision_mm.mix_opt.schedule import BPHigh, Constant, Schedule, TimestepAware
from mixlab.vision_mm.mix_opt.settings import MixOptConfig
from mixlab.vision_mm.mix_opt.trainer import MixOptTrainer, diffusion_loss, planned_modes

MODES_OF = {
    "bp_high": ("bp_high",),
    "bp_low": ("bp_low",),
    "zo_high": ("zo_high",),
    "random": ("bp_low", "zo_high"),
    "mix_opt": ("bp_low", "zo_high"),
    "bp_low_matched": ("bp_low",),
}
"""the modes each system trains with: its peak memory is the larger of theirs, and it takes their
tuned settings (a mixing system has no tuning of its own; a mode is tuned as the system of its
name)"""
RECOGNISABLE = 0.8
"""regime: the share of the base model's samples whose shape and colour the evaluation networks
read as the caption's (fixed before measuring)"""
MEMORY_FLOOR_MIB = 50.0
"""regime: every mode must add at least this much per step for the memory claim to be tested"""

__all__ = [
    "MEMORY_FLOOR_MIB",
    "METHOD",
    "RECOGNISABLE",
    "Config",
    "claims",
    "regime",
    "run",
    "summarise",
]


def schedule_of(config: Config, system: str) -> Schedule:
    """The p_ZO schedule of ``system``."""
    mix = TimestepAware(config.kappa, config.t0, config.gamma, config.p_min)
    if system == "random":  # the same expected BP/ZO ratio over this run's steps
        return Constant(mix.mean_p_zo(steps=config.steps))
    return {
        "bp_high": BPHigh(),
        "bp_low": Constant(0.0),
        "zo_high": Constant(1.0),
        "mix_opt": mix,
    }[system]


def tuning_candidates(config: Config) -> dict[str, list[dict[str, Any]]]:
    """Each tuned system's candidate settings, as many for each (the same tuning budget)."""
    return {
        "bp_high": [{"bp_lr": lr} for lr in config.tune_bp_lrs],
        "bp_low": [
            {"low_resolution": low, "bp_lr": lr}
            for low in config.tune_low_resolutions
            for lr in config.tune_low_bp_lrs
        ],
        "zo_high": [{"zo_lr": lr} for lr in config.tune_zo_lrs],
    }


def trainer_settings(
    config: Config,
    system: str,
    seed: int,
    tuned: dict[str, dict[str, Any]],
    *,
    steps: int | None = None,
) -> MixOptConfig:
    """The trainer settings of ``system`` at ``seed`` with the ``tuned`` choices of
    :func:`choose` (``steps``: the run's length when not ``config.steps``). The matched BP-low
    control runs as many steps as Mix-Opt's run at ``seed`` takes BP-low steps."""
    chosen = settings_of(system, tuned)
    if system == "bp_low_matched":
        mix = trainer_settings(config, "mix_opt", seed, tuned)
        steps = planned_modes(mix, model_spec(config).train_timesteps).count("bp_low")
    return MixOptConfig(
        resolution=config.resolution,
        low_resolution=chosen.get("low_resolution", config.low_resolution),
        steps=config.steps if steps is None else steps,
        batch_size=config.batch_size,
        schedule=schedule_of(config, "bp_low" if system == "bp_low_matched" else system),
        bp_lr=chosen.get("bp_lr", MixOptConfig.bp_lr),
        zo_lr=chosen.get("zo_lr", MixOptConfig.zo_lr),
        zo_eps=config.zo_eps,
        seed=seed,
    )


def settings_of(system: str, tuned: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The tuned settings ``system`` runs with: those of the modes it trains with
    (:data:`MODES_OF`); none for the un-personalized model."""
    chosen: dict[str, Any] = {}
    for mode in MODES_OF.get(system, ()):
        chosen |= tuned[mode]
    return chosen


def best_tuning_runs(cells: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tuned system's tuning run of the highest subject fidelity on the validation subject
    (:func:`run_tuning`), and the un-personalized model's score as ``base``."""
    scored = [c for c in cells if c["part"] == "tune"]
    return {
        system: max((c for c in scored if c["system"] == system),
                    key=lambda c: c["validation_fidelity"])
        for system in sorted({c["system"] for c in scored})
    }  # fmt: skip


def choose(cells: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tuned system's chosen candidate settings (:func:`best_tuning_runs`)."""
    best = best_tuning_runs(cells)
    return {system: run["settings"] for system, run in best.items() if system != "base"}


FIXED_DRAWS = 16
"""(noise, timestep) draws per photo in :func:`fixed_loss`"""


def fixed_loss(unet, encoder, photos, config: Config, seed: int) -> float:
    """The v-prediction loss at full resolution on ``photos`` (ShapeData) with fixed draws:
    :data:`FIXED_DRAWS` noises per photo at stratified timesteps, the same for every system at
    ``seed``, so two systems' losses differ only by their weights."""
    spec = model_spec(config)
    generator = torch.Generator().manual_seed(seed + 99_991)
    images = photos.images.repeat_interleave(FIXED_DRAWS, 0)
    n = len(images)
    t = ((torch.arange(n) + torch.rand(n, generator=generator)) * spec.train_timesteps / n).long()
    noise = torch.randn(images.shape, generator=generator)
    device = next(unet.parameters()).device
    with torch.inference_mode():
        text = encoder(photos.captions.to(device)).repeat_interleave(FIXED_DRAWS, 0)
        loss = diffusion_loss(unet, noise_scheduler(spec), images.to(device), noise.to(device),
                              t.to(device), text)  # fmt: skip
    return loss.item()


def personalize(
    config: Config, settings: MixOptConfig | None, photos, checkpoints: Path
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """The pre-trained UNet with a fresh LoRA trained on ``photos`` under ``settings`` (in eval
    mode), its caption encoder, and the training history; with no ``settings``, the
    un-personalized model and no history."""
    device = resolve_device(config.device)
    unet, encoder = pretrained_model(model_spec(config), device)
    if settings is None:
        return unet, encoder, []
    add_lora(unet, rank=config.rank)
    with torch.inference_mode():
        text = encoder(photos.captions.to(device))
    trainer = MixOptTrainer(
        unet, noise_scheduler(model_spec(config)), photos.images, text.clone(), settings
    )
    history = trainer.train(checkpoints)
    unet.eval()
    return unet, encoder, history


def run_tuning(
    config: Config, system: str, settings: dict[str, Any], out_dir: Path, nets
) -> dict[str, Any]:
    """One tuning run: ``system`` with candidate ``settings`` for ``tune_steps`` on the validation
    subject's photos (:data:`~.data.VALIDATION_SUBJECT`), scored by the subject fidelity
    (DINO_local) of its samples of that subject, the claims' metric; ``base`` is the
    un-personalized model's score, the floor."""
    seed_everything(config.seed)
    photos = subject_images(config.subject_images, background=config.subject_background,
                            size=config.resolution, seed=config.seed, **VALIDATION_SUBJECT)  # fmt: skip
    trainer = None
    if system != "base":
        tuned = {mode: settings for mode in MODES_OF[system]}
        trainer = trainer_settings(config, system, config.seed, tuned, steps=config.tune_steps)
    name = "-".join(f"{k}{v:g}" for k, v in sorted(settings.items()))
    folder = out_dir / "checkpoints" / f"tune-{system}-{name}"
    unet, encoder, _ = personalize(config, trainer, photos, folder)
    noun = VALIDATION_SUBJECT["noun"]
    scores = evaluate(unet, encoder, photos.images, config, config.seed, nets, noun=noun)
    return {"validation_fidelity": scores["subject_fidelity"],
            "validation_distortion": 1 - scores["edge_iou"]}  # fmt: skip


def evaluation_prompts(config: Config, noun: str = "star") -> tuple[torch.Tensor, torch.Tensor]:
    """(captions, background labels) of "<sks> ``noun``": ``samples_per_prompt`` per background,
    twice as many for the training background (the structural metrics use those)."""
    captions, labels = [], []
    for index, background in enumerate(BACKGROUNDS):
        n = config.samples_per_prompt * (2 if background == config.subject_background else 1)
        captions += [encode_caption(SUBJECT_TOKEN, noun, background)] * n
        labels += [index] * n
    return torch.tensor(captions), torch.tensor(labels)


def samples_of(unet, encoder, captions: torch.Tensor, config: Config, seed: int) -> torch.Tensor:
    """DDIM samples (on the CPU) of ``captions`` (N, 3) token ids, as the config samples."""
    device = next(unet.parameters()).device
    encoder.to(device)
    with torch.inference_mode():
        context = encoder(captions.to(device))
        empty = encoder(null_captions(len(captions)).to(device))
    spec = model_spec(config)
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


def evaluate(
    unet, encoder, references, config: Config, seed: int, nets, *, noun: str = "star"
) -> dict[str, Any]:
    """Samples for the evaluation prompts and their quality metrics."""
    captions, backgrounds = evaluation_prompts(config, noun)
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
    unet, encoder = pretrained_model(model_spec(config), device)
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


def run_system(
    config: Config, system: str, seed: int, tuned: dict[str, dict[str, Any]], out_dir: Path, nets
) -> dict[str, Any]:
    """``system`` personalized on the subject's photos at ``seed`` (``base``: not at all), its
    samples' metrics and its :func:`fixed_loss` on those photos."""
    seed_everything(seed)
    subject = subject_images(
        config.subject_images,
        background=config.subject_background,
        size=config.resolution,
        seed=seed,
    )
    start = time.perf_counter()
    settings = None if system == "base" else trainer_settings(config, system, seed, tuned)
    folder = out_dir / "checkpoints" / f"train-{system}-seed{seed}"
    unet, encoder, history = personalize(config, settings, subject, folder)
    seconds = time.perf_counter() - start
    scores = evaluate(unet, encoder, subject.images, config, seed, nets)
    modes = [h["mode"] for h in history]
    return {
        **scores,
        "subject_loss": fixed_loss(unet, encoder, subject, config, seed),
        "seconds": seconds,
        "steps": len(history),
        "zo_share": modes.count("zo_high") / len(modes) if modes else None,
        "final_loss": float(np.mean([h["loss"] for h in history[-50:]])) if history else None,
        "history": [[h["step"], h["mode"], h["timesteps"], h["loss"]] for h in history],
    }


def run_memory(config: Config, low_resolution: int) -> dict[str, Any]:
    modes = ("bp_high", "bp_low", "zo_high")
    common = {
        "resolution": config.memory_resolution,
        "low_resolution": config.memory_low_resolution(low_resolution),
        "batch_size": config.memory_batch_size,
        "rank": config.rank,
        "channels": list(model_spec(config).channels),
        "text_dim": model_spec(config).text_dim,
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


def _nets(config: Config):
    """The evaluation networks (cached) and the feature centre DINO_local subtracts."""
    feature_net, attribute_net = evaluation_nets(
        EvalSpec(config.eval_net_images, config.eval_net_steps)
    )
    return feature_net, attribute_net, feature_center(feature_net)


def _run_cell(
    config: Config, out_dir: Path, tuned: dict[str, dict[str, Any]], cell: dict[str, Any]
) -> dict[str, Any]:
    if config.workers > 1:
        torch.set_num_threads(1)  # one thread a worker: two on two cores slow each other down
    torch.set_flush_denormal(True)
    if cell["part"] == "tune":
        scores = run_tuning(config, cell["system"], cell["settings"], out_dir, _nets(config))
        return {**cell, **scores}
    if cell["part"] == "memory":
        return {**cell, "modes": run_memory(config, cell["low_resolution"])}
    if cell["part"] == "recognition":
        return {**cell, **base_recognition(config, _nets(config))}
    return {
        **cell,
        **run_system(config, cell["system"], cell["seed"], tuned, out_dir, _nets(config)),
    }


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    """Tuning on the validation subject (and the base model's recognition check), then the memory
    probe alone (it times steps), then every system on every seed."""
    torch.set_flush_denormal(True)
    pretrained_model(model_spec(config))  # the one-time pre-training, outside the timed cells
    _nets(config)  # the evaluation networks' one-time training too

    def run_phase(planned, tuned, label, *, first=False, workers=config.workers):
        job = functools.partial(_run_cell, config, out_dir, tuned)
        return run_cells(out_dir, config, planned, job, resume=resume or not first,
                         label=label, workers=workers)  # fmt: skip

    tuning = [{"part": "tune", "system": "base", "settings": {}}]
    tuning += [{"part": "tune", "system": system, "settings": settings}
               for system, candidates in tuning_candidates(config).items()
               for settings in candidates]  # fmt: skip
    first = run_phase([*tuning, {"part": "recognition"}], {}, "mix_opt tuning", first=True)
    tuned = choose(first)
    low = tuned["bp_low"]["low_resolution"]
    memory = run_phase([{"part": "memory", "low_resolution": low}], tuned, "mix_opt memory",
                       workers=1)  # fmt: skip
    seeds = [config.seed + offset for offset in range(config.n_seeds)]
    planned = [{"part": "train", "system": system, "seed": seed}
               for seed in seeds for system in ("base", *config.systems)]  # fmt: skip
    cells = [*first, *memory, *run_phase(planned, tuned, "mix_opt cells")]
    for system in ("base", *config.systems):
        first_seed = _rows(cells, system)[0]
        save_grid(
            out_dir / f"samples_{system}.png",
            first_seed["samples"],
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


def _rows(cells: list[dict[str, Any]], system: str) -> list[dict[str, Any]]:
    """``system``'s personalization cells (not its tuning runs), by seed."""
    rows = [c for c in cells if c["part"] == "train" and c["system"] == system]
    return sorted(rows, key=lambda c: c["seed"])


def regime(cells: list[dict[str, Any]], found: list[Claim] | None = None) -> list[Claim]:
    """Whether the setup can test the claims:

    1. the base model is recognisable: the evaluation networks read the caption's shape and colour
       in at least :data:`RECOGNISABLE` of its samples;
    2. personalization is visible in subject fidelity: BP-high (the upper bound the quality claims
       are measured against) beats the un-personalized model's DINO_local by more than
       :data:`ADAPT_MARGIN` on every seed;
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
                base + ADAPT_MARGIN,
                value_label=f"seed {seed}: BP-high DINO_local",
                reference_label=(
                    f"un-personalized {format_number(base)} + margin {ADAPT_MARGIN:g} ="
                ),
            )
        )
    check = Claim.all_of(
        "BP-high personalization beats the un-personalized base model in subject fidelity "
        f"(DINO_local) by more than {ADAPT_MARGIN:g} on every seed ({len(seeds)} of "
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
    distortion (1 − edge IoU), ZO share of steps, final training loss, the loss on the subject's
    photos with fixed draws (:func:`fixed_loss`), steps, the tuned settings it ran with and
    (tuned systems and the base model) the best subject fidelity on the validation subject,
    training seconds,
    peak training memory in all and added per step (MiB; mixing: the larger of its modes), the
    ratios of the total to ZO-high's and BP-high's, and seconds per step of its modes (mixing:
    weighted by its ZO share). The base row also carries how recognisably it draws
    (:func:`base_recognition`; None in the other rows)."""
    memory = next(c["modes"] for c in cells if c["part"] == "memory")
    recognition = next(c for c in cells if c["part"] == "recognition")
    tuned = choose(cells)
    validation = {s: run["validation_fidelity"] for s, run in best_tuning_runs(cells).items()}
    metrics: dict[str, dict[str, float | None]] = {}
    for system in ("base", *config.systems):
        mine = _rows(cells, system)
        row: dict[str, float | None] = {}
        for name in QUALITY:
            row[name], row[f"{name}_std"] = mean_std([c[name] for c in mine])
        row["structural_distortion"] = 1 - row["edge_iou"]
        shares = [c["zo_share"] for c in mine if c["zo_share"] is not None]
        row["zo_share"] = float(np.mean(shares)) if shares else None
        losses = [c["final_loss"] for c in mine if c["final_loss"] is not None]
        row["final_loss"] = float(np.mean(losses)) if losses else None
        row["train_seconds"] = float(np.mean([c["seconds"] for c in mine]))
        row["subject_loss"], row["subject_loss_std"] = mean_std([c["subject_loss"] for c in mine])
        row["steps"] = float(np.mean([c["steps"] for c in mine]))
        chosen = settings_of(system, tuned)
        for name in ("bp_lr", "zo_lr", "low_resolution"):
            row[name] = chosen.get(name)
        row["validation_fidelity"] = validation.get(system)
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
        rows = _rows(cells, system)
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
    subject fidelity over the un-personalized model by more than :data:`~.config.ADAPT_MARGIN`,
    and ZO-high alone makes progress on its loss: it lowers the loss on the subject's photos with
    fixed draws (:func:`fixed_loss`) by at least :data:`~.config.PROGRESS_SHARE` of what BP-high
    lowers it (the floor is the un-personalized model, the ceiling BP-high)."""
    base = {c["seed"]: c for c in _rows(cells, "base")}
    bp_high = {c["seed"]: c for c in _rows(cells, "bp_high")}
    bp_low, zo_high = _rows(cells, "bp_low"), _rows(cells, "zo_high")
    adapts = Claim.worst_seed(
        f"BP-low alone raises subject fidelity (DINO_local) over the un-personalized model by "
        f"more than {ADAPT_MARGIN:g} on every seed",
        [c["subject_fidelity"] for c in bp_low], ">",
        [base[c["seed"]]["subject_fidelity"] + ADAPT_MARGIN for c in bp_low],
        seeds=[c["seed"] for c in bp_low], value_label="BP-low DINO_local",
        reference_label=f"un-personalized + {ADAPT_MARGIN:g}",
    )  # fmt: skip

    def share(cell: dict[str, Any]) -> float:
        before = base[cell["seed"]]["subject_loss"]
        ceiling = before - bp_high[cell["seed"]]["subject_loss"]
        return (before - cell["subject_loss"]) / ceiling if ceiling > 0 else float("nan")

    progresses = Claim.worst_seed(
        "ZO-high alone makes progress on its loss on every seed: it lowers the full-resolution "
        "loss on the subject's photos (fixed noise and timesteps) by at least "
        f"{PROGRESS_SHARE:.0%} of what BP-high lowers it",
        [share(c) for c in zo_high], ">=", PROGRESS_SHARE, seeds=[c["seed"] for c in zo_high],
        value_label="ZO-high's share of BP-high's loss reduction",
    )  # fmt: skip
    return {"bp_low_adapts": adapts, "zo_high_progresses": progresses}


def claims(
    cells: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], config: Config
) -> list[Claim]:
    """The four claims (:data:`~.config.CLAIMS`), each judged on Mix-Opt and again on its
    control. The quality claims read each system's per-seed numbers (every seed must pass, against
    each reference on the same seed) and assume :func:`premises`; the memory claim reads the
    memory probe, which has no seed in it."""

    def per_seed(system: str, name: str) -> list[float]:
        rows = _rows(cells, system)
        if not rows:
            raise KeyError(system)
        return [1 - c["edge_iou"] if name == "distortion" else c[name] for c in rows]

    seeds = [c["seed"] for c in _rows(cells, "base")]
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
