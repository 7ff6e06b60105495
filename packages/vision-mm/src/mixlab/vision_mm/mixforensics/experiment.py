"""MixForensics against encode-then-fuse detectors on procedural clips (``mixlab run mixforensics``).

Data (:mod:`~.clips`, generated once and cached): training clips of the train pictures, half real
and half fakes of the seen families A–C; test clips of the other pictures: real, every family
A–E, A–C and real re-compressed as JPEG, and the partial forgeries (splice, continuation) with
real-to-real splices as their controls. Cells, per (system, seed): train with the same steps,
batches and seeds, then AUC/AP/ACC per family and scenario and the seen-family AUC against the
frame budget (1, 2, 4, … frames spread over the clip).

Systems, all on one image backbone but TimeSformer: ``voting`` (CNNSpot recipe, end to end, mean
vote; its majority vote is scored from the same model), ``voting-residual`` (the same on the
high-pass residuals SFB blends: what the residual input gives without blending), ``univfd`` (a linear head on a frozen
encoder pre-trained here to name the source picture of real frames, mean vote), ``decof`` (frame
consistency on that frozen encoder), ``frame-difference``, ``timesformer`` (HF, from config),
``mean-frame`` (deterministic composite), ``sfb`` (SFB alone: two blends per clip, BCE only) and
``sfb-bir`` (SFB + BIR, the method).

Regime (fixed before any run): a logistic regression on global statistics (mean, std, per-frame
means) of the training clips scores the seen test families at AUC <= ``leak_max``; per-frame
voting reaches seen AUC >= ``learnable`` from 1 frame and <= ``saturated`` from all frames.
Claims, on differences paired by seed that hold when mean − sd clears the threshold: (1) seen
families: SFB+BIR within 0.01 AUC of voting, or above, with at most half its passes; (2) SFB+BIR
beats SFB alone by >= 0.02 AUC on unseen families and under JPEG; (3) SFB+BIR beats voting by
>= 0.03 AUC on temporal splicing and on continuation; (4) from 1 frame to all, SFB+BIR's seen AUC
gain is >= 2× voting's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.shared import Claim, Result, mean_std, run_cells
from mixlab.shared.files import write_json_atomic
from mixlab.shared.paths import cache_dir
from mixlab.vision_mm.mixforensics.config import METHOD, Config

LEVEL_WITH_VOTING = -0.01
BEATS_SFB = 0.02
BEATS_VOTING_PARTIAL = 0.03
GAIN_RATIO = 2.0
FRAME_SYSTEMS = ("voting", "voting-residual", "univfd", "sfb", "sfb-bir")
"""systems scored against the frame budget"""

__all__ = ["METHOD", "Config", "claims", "dataset", "make_detector", "regime", "run", "summarise"]


# -------------------------------------------------------------------------------------- data
def traces(config: Config):
    from mixlab.vision_mm.mixforensics.clips import Traces

    return Traces(flicker=config.flicker, checker=config.checker, checker_drift=config.checker_drift,
                  smooth=config.smooth, drift=config.drift, warp=config.warp,
                  sensor=(config.sensor_low, config.sensor_high))  # fmt: skip


def _data_key(config: Config) -> dict[str, Any]:
    return {"traces": traces(config).__dict__, "frames": config.frames, "size": config.size,
            "train": config.train_clips, "real": config.test_real, "per_kind": config.test_per_kind,
            "jpeg": config.jpeg_quality, "seed": config.seed, "version": 1}  # fmt: skip


def _folder(config: Config) -> Path:
    key = json.dumps(_data_key(config), sort_keys=True, default=list)
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return cache_dir("mixforensics", "data") / f"{config.frames}x{config.size}px-{digest}"


def train_kinds(config: Config) -> list[str]:
    from mixlab.vision_mm.mixforensics.clips import SEEN

    real = config.train_clips // 2
    return ["real"] * real + [SEEN[i % len(SEEN)] for i in range(config.train_clips - real)]


def test_kinds(config: Config) -> dict[str, list[str]]:
    """Test set name → the kinds of its clips (``jpeg-*`` sets are re-compressed copies)."""
    from mixlab.vision_mm.mixforensics.clips import FAMILIES, PARTIAL

    sets = {"real": ["real"] * config.test_real}
    sets.update({kind: [kind] * config.test_per_kind for kind in (*FAMILIES, *PARTIAL)})
    return sets


def dataset(config: Config, split: str = "test") -> dict[str, torch.Tensor]:
    """``split="train"``: {"clips", "labels"}; ``"test"``: set name → uint8 clips, with the
    JPEG copies ``jpeg-real`` and ``jpeg-A``…; ``"validation"``: like test, from other seeds
    (for pilots: the test split is not looked at while the design changes). Cached."""
    from safetensors.torch import load_file, save_file

    from mixlab.vision_mm.mixforensics.clips import SEEN, jpeg, make_set

    path = _folder(config) / f"{split}.safetensors"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        made: dict[str, torch.Tensor] = {}
        common = {"frames": config.frames, "size": config.size, "traces": traces(config)}
        if split == "train":
            kinds = train_kinds(config)
            made["clips"] = make_set(kinds, config.seed * 7919 + 1, split="train", **common)
            made["labels"] = torch.tensor([k != "real" for k in kinds], dtype=torch.uint8)
        else:
            base = {"test": 2026, "validation": 505}[split]
            for i, (name, kinds) in enumerate(test_kinds(config).items()):
                made[name] = make_set(kinds, config.seed * 7919 + base + i, split="test", **common)
            for name in ("real", *SEEN):
                made[f"jpeg-{name}"] = torch.stack(
                    [jpeg(c, config.jpeg_quality) for c in made[name]]
                )
        save_file(made, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)
    return load_file(str(path))


def leak_check(config: Config) -> dict[str, float]:
    """AUC of a logistic regression on global statistics (clip mean and std, per-frame means)
    fitted on the training clips, per seen family of the test split and their mean."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from mixlab.vision_mm.mixforensics.clips import FAMILIES, SEEN

    def statistics(clips: torch.Tensor) -> np.ndarray:
        x = clips.float() / 255
        return torch.cat(
            [x.mean((1, 2, 3, 4))[:, None], x.std((1, 2, 3, 4))[:, None], x.mean((2, 3, 4))], 1
        ).numpy()

    train, test = dataset(config, "train"), dataset(config, "test")
    model = LogisticRegression(max_iter=2000).fit(
        statistics(train["clips"]), train["labels"].numpy()
    )
    real = model.predict_proba(statistics(test["real"]))[:, 1]
    out = {}
    for family in FAMILIES:
        fake = model.predict_proba(statistics(test[family]))[:, 1]
        out[family] = float(
            roc_auc_score(np.r_[np.zeros(len(real)), np.ones(len(fake))], np.r_[real, fake])
        )
    out["seen"] = float(np.mean([out[f] for f in SEEN]))
    return out


# ------------------------------------------------------------------------------------ models
def _encoder_folder(config: Config) -> Path:
    key = {
        "data": _data_key(config),
        "backbone": config.backbone,
        "steps": config.encoder_steps,
        "version": 1,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=list).encode()).hexdigest()[:10]
    return cache_dir("mixforensics", "encoder") / f"{config.backbone}-{digest}"


def frozen_encoder(config: Config) -> torch.nn.Module:
    """UnivFD's and DeCoF's generic encoder, trained once (cached) to name the source picture of
    single real training frames: it learns content, not traces, like CLIP for UnivFD."""
    from safetensors.torch import load_model, save_model

    from mixlab.vision_mm.mixforensics.clips import TRAIN_PICTURES, make_set
    from mixlab.vision_mm.mixforensics.model import build_backbone

    torch.manual_seed(config.seed)
    encoder = build_backbone(config.backbone)
    path = _encoder_folder(config) / "encoder.safetensors"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        count = max(200, config.train_clips // 4)
        pictures = np.random.default_rng(config.seed + 11).integers(len(TRAIN_PICTURES), size=count)
        clips = make_set(
            ["real"] * count,
            config.seed * 7919 + 31,
            frames=config.frames,
            size=config.size,
            split="train",
            traces=traces(config),
            sources=[TRAIN_PICTURES[p] for p in pictures],
        )
        head = torch.nn.Linear(encoder.feature_dim, len(TRAIN_PICTURES))
        model = torch.nn.Sequential(encoder, head)
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
        labels = torch.from_numpy(pictures)
        generator = torch.Generator().manual_seed(config.seed)
        for _ in range(config.encoder_steps):
            rows = torch.randint(len(clips), (config.batch_size * 2,), generator=generator)
            frames = torch.randint(config.frames, (len(rows),), generator=generator)
            images = (clips[rows, frames].float() / 255 - 0.5) / 0.25
            loss = torch.nn.functional.cross_entropy(model(images), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        save_model(encoder, str(path))
    load_model(encoder, str(path))
    return encoder.requires_grad_(False).eval()


def make_detector(config: Config, system: str) -> torch.nn.Module:
    """A fresh detector of ``system`` (seeded by the caller)."""
    from mixlab.vision_mm.mixforensics.model import build_detector

    encoder = frozen_encoder(config) if system in ("univfd", "decof") else None
    return build_detector(system, backbone=config.backbone, frames=config.frames, size=config.size,
                          blends=config.blends, n_max=config.n_max, alpha=config.alpha, domain=config.domain,
                          encoder=encoder, timesformer_width=config.timesformer_width,
                          timesformer_patch=config.timesformer_patch)  # fmt: skip


def _loss(config: Config, system: str):
    from mixlab.vision_mm.mixforensics.blend import BlendInvarianceLoss

    if system == "sfb-bir":
        return BlendInvarianceLoss(config.consistency, config.embedding)
    return BlendInvarianceLoss(0.0, 0.0)


# ------------------------------------------------------------------------------------- cells
def scores_metrics(real: np.ndarray, fake: np.ndarray) -> dict[str, float]:
    """AUC, AP and ACC (threshold 0.5, balanced by class) of fake against real scores."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    truth = np.r_[np.zeros(len(real)), np.ones(len(fake))]
    scores = np.r_[real, fake]
    accuracy = 0.5 * (float(np.mean(real < 0.5)) + float(np.mean(fake >= 0.5)))
    return {"auc": float(roc_auc_score(truth, scores)), "ap": float(average_precision_score(truth, scores)),
            "acc": accuracy}  # fmt: skip


def budgets(frames: int) -> list[int]:
    """1, 2, 4, … up to ``frames`` (and ``frames`` itself)."""
    out = [1]
    while out[-1] * 2 < frames:
        out.append(out[-1] * 2)
    return [*out, frames]


def evaluate(
    detector, test: dict[str, torch.Tensor], system: str, config: Config
) -> dict[str, Any]:
    """AUC/AP/ACC per family and scenario, control and real false-positive rates, passes, and
    (:data:`FRAME_SYSTEMS`) the seen-family AUC at every frame budget."""
    from mixlab.vision_mm.mixforensics.clips import FAMILIES, SEEN, UNSEEN
    from mixlab.vision_mm.mixforensics.model import FrameVoting, evenly_spaced
    from mixlab.vision_mm.mixforensics.training import frame_probabilities, predict

    voter = isinstance(detector, FrameVoting)
    if voter:  # every vote and budget from one pass over the frames
        frames = {name: frame_probabilities(detector, clips) for name, clips in test.items()}
        p = {
            name: f.mean(1) if detector.vote == "mean" else (f > 0.5).mean(1)
            for name, f in frames.items()
        }
    else:
        p = {name: predict(detector, clips) for name, clips in test.items()}
    out: dict[str, Any] = {"passes": int(detector.passes)}
    for family in FAMILIES:
        for k, v in scores_metrics(p["real"], p[family]).items():
            out[f"{k}_{family}"] = v
    for k in ("auc", "ap", "acc"):
        out[f"{k}_seen"] = float(np.mean([out[f"{k}_{f}"] for f in SEEN]))
        out[f"{k}_unseen"] = float(np.mean([out[f"{k}_{f}"] for f in UNSEEN]))
    out["auc_jpeg"] = float(
        np.mean([scores_metrics(p["jpeg-real"], p[f"jpeg-{f}"])["auc"] for f in SEEN])
    )
    for kind in ("splice", "continuation"):
        for k, v in scores_metrics(p["control"], p[kind]).items():
            out[f"{k}_{kind}"] = v
    out["control_scored_fake"] = float(np.mean(p["control"] >= 0.5))
    out["real_scored_fake"] = float(np.mean(p["real"] >= 0.5))

    def seen_auc(scores: dict[str, np.ndarray]) -> float:
        return float(np.mean([scores_metrics(scores["real"], scores[f])["auc"] for f in SEEN]))

    if system == "voting":  # the majority vote of the same model
        out["auc_seen_majority"] = seen_auc({n: (frames[n] > 0.5).mean(1) for n in ("real", *SEEN)})
    if system in FRAME_SYSTEMS:
        for count in budgets(config.frames):
            rows = evenly_spaced(config.frames, count)
            if voter:
                scores = {n: frames[n][:, rows.numpy()].mean(1) for n in ("real", *SEEN)}
            else:
                scores = {n: predict(detector, test[n][:, rows]) for n in ("real", *SEEN)}
            out[f"auc_seen_{count}f"] = seen_auc(scores)
    return out


def _every(steps: int) -> int:
    return max(1, min(100, steps // 2))


def run_cell(config: Config, out_dir: Path, cell: dict[str, Any]) -> dict[str, Any]:
    from mixlab.vision_mm.mixforensics.training import train_detector

    torch.set_num_threads(1)  # two workers side by side on 2 cores
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    system, seed = cell["system"], cell["seed"]
    train = dataset(config, "train")
    torch.manual_seed(seed)
    detector = make_detector(config, system)
    train_detector(detector, train["clips"], train["labels"], config.steps, batch_size=config.batch_size,
                   lr=config.lr, seed=seed, loss=_loss(config, system), checkpoint_every=_every(config.steps),
                   checkpoint=out_dir / "training" / f"{system}-{seed}")  # fmt: skip
    trained = time.perf_counter() - started
    return {**cell, **evaluate(detector, dataset(config, "test"), system, config), "train_seconds": trained,
            "seconds": time.perf_counter() - started,
            "parameters": sum(p.numel() for p in detector.parameters())}  # fmt: skip


def _cells(config: Config) -> list[dict[str, Any]]:
    return [{"system": s, "seed": seed} for seed in range(config.seed, config.seed + config.n_seeds)
            for s in config.systems]  # fmt: skip


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    for split in ("train", "test"):
        dataset(config, split)  # once, before the workers share it
    if {"univfd", "decof"} & set(config.systems):
        frozen_encoder(config)
    leak = leak_check(config)
    torch.set_num_threads(1)
    setup_seconds = time.perf_counter() - started
    done = run_cells(out_dir, config, _cells(config), functools.partial(run_cell, config, out_dir),
                     resume=resume, label="mixforensics", workers=config.workers)  # fmt: skip
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    metrics = summarise(done, leak, config)
    _plot(metrics, config, out_dir)
    env = {"setup_seconds": setup_seconds, "leak_auc": leak,
           "cell_seconds": {s: float(np.mean([c["seconds"] for c in cells])) for s, cells in per_seed(done).items()}}  # fmt: skip
    return Result(
        metrics=metrics, claims=claims(done, config), regime=regime(metrics, config), env=env
    )


# ---------------------------------------------------------------------------------- summary
def _row_keys(config: Config) -> tuple[str, ...]:
    from mixlab.vision_mm.mixforensics.clips import FAMILIES

    per_family = tuple(f"{k}_{f}" for k in ("auc", "ap", "acc") for f in FAMILIES)
    scenarios = tuple(
        f"{k}_{s}"
        for s in ("seen", "unseen", "splice", "continuation")
        for k in ("auc", "ap", "acc")
    )
    frames = tuple(f"auc_seen_{n}f" for n in budgets(config.frames))
    return (*scenarios, "auc_seen_std", "auc_unseen_std", "auc_jpeg", "auc_seen_majority", *frames, *per_family,
            "control_scored_fake", "real_scored_fake", "passes", "parameters", "seeds", "leak_auc")  # fmt: skip


def per_seed(done: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for cell in sorted(done, key=lambda c: c["seed"]):
        out.setdefault(cell["system"], []).append(cell)
    return out


def summarise(
    done: list[dict[str, Any]], leak: dict[str, float], config: Config
) -> dict[str, dict[str, Any]]:
    """Rows per system (means over seeds; the sd of seen and unseen AUC) and ``data/leak-check``."""
    keys = _row_keys(config)
    rows: dict[str, dict[str, Any]] = {}
    for system, seeds in per_seed(done).items():
        row: dict[str, Any] = dict.fromkeys(keys)
        for key in keys:
            values = [s[key] for s in seeds if s.get(key) is not None]
            if values:
                row[key] = float(np.mean(values))
        row["auc_seen_std"] = mean_std([s["auc_seen"] for s in seeds])[1]
        row["auc_unseen_std"] = mean_std([s["auc_unseen"] for s in seeds])[1]
        row["passes"], row["parameters"] = seeds[0]["passes"], seeds[0]["parameters"]
        row["seeds"] = len(seeds)
        rows[system] = row
    rows["data/leak-check"] = {**dict.fromkeys(keys), "leak_auc": leak["seen"], "seeds": 1}
    return rows


def _paired(
    done: list[dict[str, Any]], a: str, b: str, key: str, key_b: str | None = None
) -> np.ndarray:
    seeds = per_seed(done)
    n = min(len(seeds[a]), len(seeds[b]))
    return np.array(
        [x[key] - y[key_b or key] for x, y in zip(seeds[a][:n], seeds[b][:n], strict=True)]
    )


def claims(done: list[dict[str, Any]], config: Config) -> list[Claim]:
    """The issue's claims (1)–(4) on differences paired by seed."""
    seeds = per_seed(done)
    passes = {s: seeds[s][0]["passes"] for s in ("voting", "sfb-bir")}
    last = f"auc_seen_{config.frames}f"
    gain = {
        s: np.array([c[last] - c["auc_seen_1f"] for c in seeds[s]]) for s in ("voting", "sfb-bir")
    }
    n = min(len(gain["voting"]), len(gain["sfb-bir"]))
    return [
        Claim.all_of(
            "(1) Seen families: SFB+BIR within 0.01 AUC of per-frame voting, or above, with at most half its "
            "encoder passes",
            [Claim.paired("AUC", _paired(done, "sfb-bir", "voting", "auc_seen"), LEVEL_WITH_VOTING,
                          label="SFB+BIR − voting seen AUC"),
             Claim.compare("passes", passes["sfb-bir"], "<=", passes["voting"] / 2, value_label="SFB+BIR passes",
                           reference_label="half of voting's")],
        ),
        Claim.all_of(
            "(2) SFB+BIR beats SFB alone by >= 0.02 AUC on unseen families and under JPEG re-compression",
            [Claim.paired("unseen", _paired(done, "sfb-bir", "sfb", "auc_unseen"), BEATS_SFB,
                          label="SFB+BIR − SFB unseen AUC"),
             Claim.paired("JPEG", _paired(done, "sfb-bir", "sfb", "auc_jpeg"), BEATS_SFB,
                          label="SFB+BIR − SFB JPEG AUC")],
        ),
        Claim.all_of(
            "(3) SFB+BIR beats per-frame voting by >= 0.03 AUC on temporal splicing and on conditional continuation",
            [Claim.paired("splice", _paired(done, "sfb-bir", "voting", "auc_splice"), BEATS_VOTING_PARTIAL,
                          label="SFB+BIR − voting splice AUC"),
             Claim.paired("continuation", _paired(done, "sfb-bir", "voting", "auc_continuation"),
                          BEATS_VOTING_PARTIAL, label="SFB+BIR − voting continuation AUC")],
        ),
        Claim.paired(
            f"(4) From 1 to {config.frames} frames, SFB+BIR's seen AUC gain is >= {GAIN_RATIO:g}x voting's",
            gain["sfb-bir"][:n] - GAIN_RATIO * gain["voting"][:n], 0.0,
            label=f"SFB+BIR gain − {GAIN_RATIO:g} × voting gain",
        ),
    ]  # fmt: skip


def regime(metrics: dict[str, Any], config: Config) -> list[Claim]:
    """No shortcut in global statistics; per-frame voting learns and does not saturate."""
    last = f"auc_seen_{config.frames}f"
    return [
        Claim.compare(f"Leak check: a logistic regression on global statistics scores the seen families at AUC <= "
                      f"{config.leak_max:g}", metrics["data/leak-check"]["leak_auc"], "<=", config.leak_max,
                      value_label="leak AUC"),
        Claim.compare(f"Learnable: per-frame voting's seen AUC from 1 frame >= {config.learnable:g}",
                      metrics["voting"]["auc_seen_1f"], ">=", config.learnable, value_label="voting 1-frame AUC"),
        Claim.compare(f"Not saturated: per-frame voting's seen AUC from {config.frames} frames <= {config.saturated:g}",
                      metrics["voting"][last], "<=", config.saturated, value_label=f"voting {config.frames}-frame AUC"),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------- plots
def _plot(metrics: dict[str, Any], config: Config, out_dir: Path) -> None:
    from matplotlib.figure import Figure

    from mixlab.shared import save_figure
    from mixlab.vision_mm.mixforensics.clips import FAMILIES

    systems = [s for s in config.systems if s in metrics]
    groups = [*FAMILIES, "jpeg", "splice", "continuation"]
    figure = Figure(figsize=(13, 4.2), layout="constrained")
    bars, budget = figure.subplots(1, 2, width_ratios=(2.2, 1))
    width = 0.8 / len(systems)
    for k, system in enumerate(systems):
        row = metrics[system]
        values = [row[f"auc_{g}"] for g in groups]
        bars.bar(
            np.arange(len(groups)) + width * (k - (len(systems) - 1) / 2),
            values,
            width,
            label=system,
        )
    bars.axhline(0.5, color="grey", lw=0.8, ls="--")
    bars.set_xticks(
        np.arange(len(groups)), ["A*", "B*", "C*", "D", "E", "JPEG*", "splice", "contin."]
    )
    bars.set(
        ylim=(0.3, 1.0), ylabel="AUC (mean over seeds)", title="AUC per family (* seen in training)"
    )
    bars.legend(fontsize=7, ncol=2)
    counts = budgets(config.frames)
    for system in FRAME_SYSTEMS:
        if system in metrics:
            budget.plot(
                counts,
                [metrics[system][f"auc_seen_{n}f"] for n in counts],
                marker="o",
                label=system,
            )
    budget.set_xscale("log", base=2)
    budget.set_xticks(counts, [str(n) for n in counts])
    budget.set(xlabel="frames seen", ylabel="seen-family AUC", title="AUC against frame budget")
    budget.legend(fontsize=7)
    save_figure(figure, out_dir / "auc.png")
