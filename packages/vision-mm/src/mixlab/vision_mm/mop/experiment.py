"""MoP-X against unimodal, modality-dropout, K = 1 and no-L_dis training (``mixlab run mop``).

Bases, trained once and cached (:mod:`~.bases`): the shared toy ViT pre-trained on both
modalities unpaired on per-patch shape kinds, then frozen with its tokenizers, and the toy Llama
pre-trained on the question–answer text. Every system trains the probes, the projector and the
LM on the frozen encoder's cached hidden states, with the same steps, batches and seeds, and is
tested on each modality alone on held-out scenes. Cells:

- ``system``: per (system, seed) (and per deployed modality for ``unimodal`` and ``distill``):
  train, then the accuracy per question type of each modality alone, and the probe diagnostics on
  held-out scenes every ``diagnostics_every`` steps;
- ``information``: a CNN trained on RGB alone on ``information_scale``× the scenes answers depth
  order (cached): the cue is in the pixels.

Regime (fixed before any run): each unimodal model's mean accuracy over the question types its
modality answers (:data:`~.scenes.ANSWERABLE`) is >= ``answerable`` and >= the blind LM's on the
same questions + ``blind_margin``; the information CNN reaches ``information`` on RGB depth
order and the unimodal RGB model is >= ``room`` below it. Claims (declared with their controls
in :data:`~.config.CLAIMS`), each a one-sided paired t-test over seeds that the difference clears
the threshold: (1) MoP-X's accuracy (mean over question types) beats unimodal and modality
dropout by >= 3 points on each modality alone (control: the K = 1 resampler); (2) RGB-alone depth
order >= 5 points above unimodal RGB (control: modality dropout); (3) MoP-X beats the K = 1
last-layer resampler (same objective) by >= 2 points (mean over modalities; control: the
resampler itself); (4) without L_dis the mean pairwise probe cosine is >= 0.2 higher and the
effective rank >= 1 lower (final diagnostics, mean over modalities; control: modality dropout's
probes, trained without L_dis).
"""

from __future__ import annotations

import copy
import functools
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.shared import Claim, Result, mean_std, run_cells
from mixlab.shared.cache import cached
from mixlab.shared.files import write_json_atomic
from mixlab.vision_mm.mop.config import (
    BEATS_BASELINES,
    BEATS_FINAL_LAYER,
    COSINE_GAP,
    METHOD,
    PRIVILEGED_GAIN,
    RANK_GAP,
    Config,
)

TEST_SEED = 2026
TRAIN_SEED = 1
DIAGNOSTIC_SAMPLES = 256

__all__ = ["METHOD", "Config", "bases", "claims", "regime", "run", "summarise"]


# ------------------------------------------------------------------------------------ bases
def _encoder_spec(config: Config):
    from mixlab.vision_mm.mop.bases import EncoderSpec

    return EncoderSpec(
        size=config.size, patch=config.patch, dim=config.encoder_dim, depth=config.encoder_layers,
        heads=config.encoder_heads, scenes=config.encoder_scenes, steps=config.encoder_steps,
        modalities=tuple(config.modalities), seed=config.seed,
    )  # fmt: skip


def _lm_spec(config: Config):
    from mixlab.vision_mm.mop.bases import LMSpec

    return LMSpec(
        width=config.lm_width, depth=config.lm_layers, steps=config.lm_steps, seed=config.seed
    )


ENCODER_CODE = ("mixlab.vision_mm.mop.bases", "mixlab.vision_mm.mop.encoder",
                "mixlab.vision_mm.mop.scenes", "mixlab.shared.shapes")  # fmt: skip
"""the code that pre-trains the shared encoder (and draws its scenes) and encodes the train and
test scenes (:func:`~.bases.encode_scenes`): part of its cache key and of the features'"""
LM_CODE = ("mixlab.vision_mm.mop.bases", "mixlab.vision_mm.mop.text", "mixlab.vision_mm.mop.scenes",
           "mixlab.shared.shapes")  # fmt: skip
"""the code that pre-trains the toy Llama and its tokenizer"""


def _encoder_folder(config: Config) -> Path:
    """The cache entry of the pre-trained encoder (``encoder.safetensors``, ``facts.json``),
    trained on first use."""
    from safetensors.torch import save_model

    from mixlab.vision_mm.mop.bases import pretrain_encoder

    spec = _encoder_spec(config)

    def build(folder: Path) -> None:
        started = time.perf_counter()
        encoder, patch_accuracy = pretrain_encoder(spec)
        save_model(encoder, folder / "encoder.safetensors")
        facts = {"patch_accuracy": patch_accuracy, "encoder_seconds": time.perf_counter() - started}
        write_json_atomic(folder / "facts.json", facts)

    return cached("mop", f"encoder-{config.size}px", asdict(spec), build, code=ENCODER_CODE)


def _lm_folder(config: Config) -> Path:
    """The cache entry of the pre-trained toy Llama and its tokenizer (``facts.json`` beside)."""
    from mixlab.vision_mm.mop.bases import pretrain_lm

    spec = _lm_spec(config)

    def build(folder: Path) -> None:
        started = time.perf_counter()
        lm, tokenizer, blind = pretrain_lm(spec)
        lm.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        facts = {"lm_blind_accuracy": blind, "lm_seconds": time.perf_counter() - started}
        write_json_atomic(folder / "facts.json", facts)

    return cached("mop", "llama", asdict(spec), build, code=LM_CODE)


def _load_encoder(config: Config, folder: Path):
    from safetensors.torch import load_model

    encoder = _encoder_spec(config).build()
    load_model(encoder, folder / "encoder.safetensors")
    return encoder.requires_grad_(False)


def bases(config: Config) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(encoder, LM, tokenizer, facts), each base trained on the first call and cached after
    (apart, so changing one keeps the other); facts hold the encoder's held-out per-patch
    accuracy, the blind LM's accuracy and both trainings' seconds."""
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    encoder_folder, lm_folder = _encoder_folder(config), _lm_folder(config)
    facts = {**json.loads((encoder_folder / "facts.json").read_text()),
             **json.loads((lm_folder / "facts.json").read_text())}  # fmt: skip
    encoder = _load_encoder(config, encoder_folder)
    lm = LlamaForCausalLM.from_pretrained(lm_folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(lm_folder)
    return encoder, lm, tokenizer, facts


def _features_folder(config: Config, split: str) -> Path:
    """The cache entry of the train or test scenes as the frozen encoder's hidden states per
    modality (``<modality>.npy``, float16) and their questions (``questions.json``)."""
    from mixlab.vision_mm.mop.bases import encode_scenes

    count, seed = (
        (config.train_scenes, TRAIN_SEED) if split == "train" else (config.test_scenes, TEST_SEED)
    )
    key = {"encoder": asdict(_encoder_spec(config)), "split": split, "scenes": count,
           "seed": seed + config.seed}  # fmt: skip

    def build(folder: Path) -> None:
        encoder = _load_encoder(config, _encoder_folder(config))
        encode_scenes(folder, encoder, split, count, seed + config.seed, size=config.size,
                      modalities=config.modalities)  # fmt: skip

    return cached("mop", f"features-{split}", key, build, code=ENCODER_CODE)


def _split(config: Config, split: str) -> dict[str, Any]:
    """The train or test scenes as the frozen encoder's hidden states per modality (float16,
    cached), the questions' token ids and their types."""
    from transformers import PreTrainedTokenizerFast

    from mixlab.vision_mm.mop.text import encode_qa

    folder = _features_folder(config, split)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(_lm_folder(config))
    qa = json.loads((folder / "questions.json").read_text())
    features = {
        m: torch.from_numpy(np.load(folder / f"{m}.npy")).float() for m in config.modalities
    }
    encoded = encode_qa(tokenizer, qa["questions"], qa["answers"])
    return {"features": features, "encoded": encoded, "types": qa["types"],
            "scene": torch.tensor(qa["scene"])}  # fmt: skip


# ------------------------------------------------------------------------------------ cells
def _cells(config: Config) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = [{"task": "information"}]
    for seed in range(config.seed, config.seed + config.n_seeds):
        for system in config.systems:
            deploys = config.modalities if system in ("unimodal",) else (None,)
            if system == "distill":
                deploys = [m for m in config.modalities if m != "depth"]
            cells += [
                {"task": "system", "system": system, "deploy": d, "seed": seed} for d in deploys
            ]
    return cells


def _connector(config: Config, system: str, num_layers: int):
    from mixlab.vision_mm.mop.training import system_connector

    return system_connector(system, config.encoder_dim, num_layers, num_probes=config.num_probes,
                            queries=config.queries, heads=config.encoder_heads,
                            layers=config.probe_layers, combine=config.combine)  # fmt: skip


def _train(config: Config, system: str, deploy: str | None, seed: int, train: dict, test: dict,
           checkpoint: Path | None, teacher=None) -> tuple[Any, list[dict[str, Any]], float]:  # fmt: skip
    """One system trained on ``train``'s cached features; (model, diagnostics over training,
    seconds)."""
    from mixlab.vision_mm.mop.losses import probe_diagnostics
    from mixlab.vision_mm.mop.model import PrivilegedMLLM
    from mixlab.vision_mm.mop.training import fit, paired_batches, system_spec

    encoder, lm, _, _ = bases(config)
    torch.manual_seed(seed)
    model = PrivilegedMLLM(encoder, _connector(config, system, encoder.num_hidden_states),
                           copy.deepcopy(lm), train_tokenizers=False)  # fmt: skip
    others = [m for m in config.modalities if m != (deploy or "rgb")]
    spec = system_spec(system, tuple(config.modalities), deploy=deploy or "rgb", privileged=others[0],
                       lambda_x=config.lambda_x, lambda_d=config.lambda_d,
                       aligned=tuple(config.aligned_probes), symmetric=True)  # fmt: skip
    log = None if checkpoint is None else checkpoint / "diagnostics.json"
    diagnostics = json.loads(log.read_text()) if log is not None and log.is_file() else []

    def record(step: int, model: PrivilegedMLLM) -> None:
        if (step + 1) % config.diagnostics_every and step + 1 != config.steps:
            return
        model.eval()
        row: dict[str, Any] = {"step": step + 1}
        with torch.no_grad():
            for modality in spec.trains_on:
                features = test["features"][modality][:DIAGNOSTIC_SAMPLES]
                _, probes = model.visual_prefix(modality, None, features=features)
                for key, value in probe_diagnostics(probes.probes, probes.weights).items():
                    row[f"{modality}/{key}"] = value
        diagnostics[:] = [d for d in diagnostics if d["step"] < step + 1] + [row]
        if log is not None:
            write_json_atomic(log, diagnostics)

    started = time.perf_counter()
    batches = paired_batches(train["features"], train["encoded"], config.batch_size, seed,
                             key="features", scene=train["scene"])  # fmt: skip
    fit(model, batches, spec, config.steps, lr=config.lr, lm_lr=config.lm_lr, seed=seed, teacher=teacher,
        checkpoint=None if checkpoint is None else str(checkpoint),
        checkpoint_every=config.diagnostics_every, callback=record)  # fmt: skip
    return model.eval(), diagnostics, time.perf_counter() - started


def _system_cell(config: Config, cell: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from mixlab.vision_mm.mop.training import accuracy_by_type

    train, test = _split(config, "train"), _split(config, "test")
    name = "-".join(str(cell[k]) for k in ("system", "deploy", "seed") if cell[k] is not None)
    checkpoint = out_dir / "training" / name
    teacher = None
    if cell["system"] == "distill":  # the teacher: unimodal on the privileged modality, same seed
        teacher, _, _ = _train(config, "unimodal", "depth", cell["seed"], train, test,
                               out_dir / "training" / f"{name}-teacher")  # fmt: skip
    model, diagnostics, seconds = _train(config, cell["system"], cell["deploy"], cell["seed"], train,
                                         test, checkpoint, teacher)  # fmt: skip
    tested = [cell["deploy"]] if cell["system"] in ("unimodal", "distill") else config.modalities
    accuracy = {
        m: accuracy_by_type(
            model, m, None, test["encoded"], test["types"], features=test["features"][m]
        )
        for m in tested
    }
    return {"accuracy": accuracy, "diagnostics": diagnostics, "train_seconds": seconds}


def _information_cell(config: Config, cell: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    from mixlab.vision_mm.mop.bases import depth_order_cnn

    count = config.information_scale * config.train_scenes
    key = {"size": config.size, "scenes": count, "test_scenes": config.test_scenes,
           "test_seed": TEST_SEED, "steps": config.information_steps, "seed": config.seed}  # fmt: skip

    def build(folder: Path) -> None:
        started = time.perf_counter()
        accuracy = depth_order_cnn(count, config.test_scenes, size=config.size, seed=config.seed,
                                   steps=config.information_steps, test_seed=TEST_SEED)  # fmt: skip
        write_json_atomic(
            folder / "information.json",
            {"accuracy": accuracy, "seconds": time.perf_counter() - started},
        )

    folder = cached("mop", "information", key, build, code=("mixlab.vision_mm.mop.bases",
                    "mixlab.vision_mm.mop.scenes", "mixlab.shared.shapes"))  # fmt: skip
    return json.loads((folder / "information.json").read_text())


def _blind(config: Config) -> dict[str, float]:
    """The pre-trained LM alone (no visual prefix) on the test questions, per type."""
    from mixlab.vision_mm.mop.text import answer_hits

    _, lm, _, _ = bases(config)
    test = _split(config, "test")
    encoded = test["encoded"]
    with torch.no_grad():
        logits = lm(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask).logits
    hits = answer_hits(logits, encoded.labels).float().numpy()
    types = np.asarray(test["types"])
    return {
        **{t: float(hits[types == t].mean()) for t in sorted(set(types))},
        "all": float(hits.mean()),
    }


def run_cell(config: Config, out_dir: Path, cell: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)  # two workers side by side on 2 cores
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    task = {"system": _system_cell, "information": _information_cell}[cell["task"]]
    return {**cell, **task(config, cell, out_dir), "seconds": time.perf_counter() - started}


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_num_threads(1)
    started = time.perf_counter()
    _, _, _, facts = bases(config)  # once, before the workers share them
    for split in ("train", "test"):
        _split(config, split)
    setup_seconds = time.perf_counter() - started
    done = run_cells(
        out_dir, config, _cells(config), functools.partial(run_cell, config, out_dir),
        resume=resume, label="mop", workers=config.workers,
    )  # fmt: skip
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    blind = _blind(config)
    metrics = summarise(done, blind, config)
    _plot(metrics, done, config, out_dir)
    found = claims(done, config)
    information = next(c for c in done if c["task"] == "information")
    env = {**facts, "setup_seconds": setup_seconds, "information_seconds": information["seconds"]}
    return Result(metrics=metrics, claims=found, regime=regime(metrics, config), env=env)


# ---------------------------------------------------------------------------------- summary
QUESTION_KEYS = ("colour", "shape", "count", "depth", "all")
ROW_KEYS = (*QUESTION_KEYS, "all_std", "depth_std", "probe_cosine", "effective_rank",
            "router_entropy", "seeds")  # fmt: skip


def _system_name(cell: dict[str, Any]) -> str:
    return cell["system"] if cell["deploy"] is None else f"{cell['system']}@{cell['deploy']}"


def per_seed(done: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, float]]]:
    """(system, modality) → the accuracy per question type of each seed, plus that seed's final
    diagnostics on the modality, in seed order."""
    out: dict[tuple[str, str], list[dict[str, float]]] = {}
    for cell in sorted((c for c in done if c["task"] == "system"), key=lambda c: c["seed"]):
        for modality, accuracy in cell["accuracy"].items():
            final = cell["diagnostics"][-1] if cell["diagnostics"] else {}
            extra = {
                k.split("/", 1)[1]: v for k, v in final.items() if k.startswith(f"{modality}/")
            }
            out.setdefault((cell["system"], modality), []).append({**accuracy, **extra})
    return out


def summarise(
    done: list[dict[str, Any]], blind: dict[str, float], config: Config
) -> dict[str, dict[str, Any]]:
    """Rows ``<modality>/<system>`` (means over seeds, sd of ``all`` and ``depth``, final probe
    diagnostics), ``text/blind`` (the LM without images) and ``rgb/information`` (the RGB CNN on
    10× the scenes, depth order only)."""
    rows: dict[str, dict[str, Any]] = {}
    for (system, modality), seeds in per_seed(done).items():
        row: dict[str, Any] = {k: None for k in ROW_KEYS}
        for key in (*QUESTION_KEYS, "probe_cosine", "effective_rank", "router_entropy"):
            values = [s[key] for s in seeds if key in s]
            if values:
                row[key] = float(np.mean(values))
        row["all_std"] = mean_std([s["all"] for s in seeds])[1]
        row["depth_std"] = mean_std([s["depth"] for s in seeds])[1]
        row["seeds"] = len(seeds)
        rows[f"{modality}/{system}"] = row
    rows["text/blind"] = {**{k: None for k in ROW_KEYS}, **blind, "seeds": 1}
    information = next(c for c in done if c["task"] == "information")
    rows["rgb/information"] = {
        **{k: None for k in ROW_KEYS},
        "depth": information["accuracy"],
        "seeds": 1,
    }
    return dict(sorted(rows.items()))


def _gaps(
    seeds: dict[tuple[str, str], list[dict[str, float]]],
    system: str,
    reference: str,
    modality: str,
    key: str,
) -> np.ndarray:
    """``key`` of ``system`` minus ``reference``'s on ``modality`` alone, per seed (paired)."""
    return np.array(
        [
            x[key] - y[key]
            for x, y in zip(seeds[system, modality], seeds[reference, modality], strict=True)
        ]
    )


def claims(done: list[dict[str, Any]], config: Config) -> list[Claim]:
    """The issue's claims (1)–(4), each a one-sided paired t-test over seeds (:meth:`Claim.paired`)
    judged on MoP-X and again on its control (:data:`~.config.CLAIMS`). A claim whose systems did
    not run (a custom ``systems``) is not judged."""
    systems = set(config.systems)
    seeds = per_seed(done)

    def beats_baselines(system: str) -> Claim:
        parts = [
            Claim.paired(f"{m}: {system} vs {ref}", _gaps(seeds, system, ref, m, "all"), BEATS_BASELINES,
                         label=f"{system} − {ref} accuracy on {m} alone")
            for m in config.modalities
            for ref in ("unimodal", "dropout") if ref in systems
        ]  # fmt: skip
        return Claim.all_of(system, parts)

    def privileged_gain(system: str) -> Claim:
        gain = _gaps(seeds, system, "unimodal", "rgb", "depth")
        return Claim.paired(system, gain, PRIVILEGED_GAIN,
                            label=f"{system} − unimodal RGB depth-order accuracy")  # fmt: skip

    def beats_final_layer(system: str) -> Claim:
        lead = np.mean([_gaps(seeds, system, "resampler", m, "all") for m in config.modalities], 0)
        return Claim.paired(system, lead, BEATS_FINAL_LAYER,
                            label=f"{system} − resampler accuracy (mean over modalities)")  # fmt: skip

    def keeps_probes_apart(system: str) -> Claim:
        cosine = np.mean([_gaps(seeds, "mop-nodis", system, m, "probe_cosine")
                          for m in config.modalities], 0)  # fmt: skip
        rank = np.mean([_gaps(seeds, system, "mop-nodis", m, "effective_rank")
                        for m in config.modalities], 0)  # fmt: skip
        return Claim.all_of(system, [
            Claim.paired("cosine", cosine, COSINE_GAP, label=f"no-L_dis − {system} probe cosine"),
            Claim.paired("rank", rank, RANK_GAP, label=f"{system} − no-L_dis effective rank"),
        ])  # fmt: skip

    found = []
    if "resampler" in systems:
        found.append(config.judge("beats_unimodal_and_dropout", beats_baselines))
    if "dropout" in systems:
        found.append(config.judge("privileged_gain", privileged_gain))
    if "resampler" in systems:
        found.append(config.judge("beats_final_layer", beats_final_layer))
    if {"mop-nodis", "dropout"} <= systems:
        found.append(config.judge("dis_keeps_probes_apart", keeps_probes_apart))
    return found


def _answered(row: dict[str, Any], modality: str) -> float:
    from mixlab.vision_mm.mop.scenes import ANSWERABLE

    return float(np.mean([row[t] for t in ANSWERABLE[modality]]))


def regime(metrics: dict[str, Any], config: Config) -> list[Claim]:
    """The unimodal models learned what their modality shows, well above the blind LM, and RGB
    holds a depth cue that unimodal training leaves room to use."""
    checks = []
    blind = metrics["text/blind"]
    for modality in config.modalities:
        row = metrics[f"{modality}/unimodal"]
        checks.append(Claim.all_of(
            f"Unimodal {modality} answers its modality's questions: mean accuracy >= {config.answerable:g} "
            f"and >= the blind LM's + {config.blind_margin:g}",
            [Claim.compare("accuracy", _answered(row, modality), ">=", config.answerable,
                           value_label=f"unimodal {modality} accuracy"),
             Claim.compare("blind", _answered(row, modality), ">=", _answered(blind, modality) + config.blind_margin,
                           value_label=f"unimodal {modality} accuracy", reference_label="blind + margin")],
        ))  # fmt: skip
    information = metrics["rgb/information"]["depth"]
    checks.append(Claim.all_of(
        f"RGB holds the depth cue (a CNN on {config.information_scale}× the scenes >= {config.information:g}) "
        f"and unimodal RGB leaves >= {config.room:g} of it",
        [Claim.compare("information", information, ">=", config.information, value_label="RGB CNN depth order"),
         Claim.compare("room", metrics["rgb/unimodal"]["depth"], "<=", information - config.room,
                       value_label="unimodal RGB depth order", reference_label=f"CNN − {config.room:g}")],
    ))  # fmt: skip
    return checks


# ------------------------------------------------------------------------------------- plot
def _plot(
    metrics: dict[str, Any], done: list[dict[str, Any]], config: Config, out_dir: Path
) -> None:
    from matplotlib.figure import Figure

    from mixlab.shared import save_figure

    figure = Figure(figsize=(6 * len(config.modalities), 3.8), layout="constrained")
    axes = np.atleast_1d(figure.subplots(1, len(config.modalities)))
    for ax, modality in zip(axes, config.modalities, strict=True):
        systems = [s for s in config.systems if f"{modality}/{s}" in metrics]
        x = np.arange(len(QUESTION_KEYS))
        width = 0.8 / len(systems)
        for k, system in enumerate(systems):
            row = metrics[f"{modality}/{system}"]
            ax.bar(x + width * (k - (len(systems) - 1) / 2), [row[q] for q in QUESTION_KEYS], width,
                   label=system)  # fmt: skip
        ax.set_xticks(x, QUESTION_KEYS)
        ax.set(ylim=(0, 1), ylabel="accuracy", title=f"{modality} alone (mean over seeds)")
        ax.legend(fontsize=7, ncol=2)
    save_figure(figure, out_dir / "accuracy.png")

    figure = Figure(figsize=(10, 3.6), layout="constrained")
    cosine_ax, rank_ax = figure.subplots(1, 2)
    for system in ("mop-x", "mop-nodis"):
        runs = [c["diagnostics"] for c in done if c["task"] == "system" and c["system"] == system]
        if not runs:
            continue
        steps = [row["step"] for row in runs[0]]
        for ax, key in ((cosine_ax, "probe_cosine"), (rank_ax, "effective_rank")):
            values = [
                [np.mean([row[f"{m}/{key}"] for m in config.modalities]) for row in run]
                for run in runs
            ]
            ax.plot(steps, np.mean(values, 0), marker="o", ms=3, label=system)
    cosine_ax.set(
        xlabel="step", ylabel="mean pairwise probe cosine", title="probe cosine (held out)"
    )
    rank_ax.set(xlabel="step", ylabel="effective rank", title="effective rank of the K probes")
    for ax in (cosine_ax, rank_ax):
        ax.legend(fontsize=8)
    save_figure(figure, out_dir / "probes.png")
