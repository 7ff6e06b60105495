"""MoA3CIR against CLIP4Cir's combiner and the simple fusions (``mixlab run moa3cir``).

Towers, trained once and cached: a tiny open_clip CLIP (phase 1) on image–description pairs and
sum-fusion triplets of catalogue items disjoint from the test renders, with no held-out
(category, colour) pair; the attribute classifier that checks controlled edits beside them.
Every phase-2 system trains its head on the frozen towers' outputs with the same steps, batches
and seeds, and is tested on 1,000 queries against the whole catalogue (every combination once).
Cells, per (system, seed): train, then R@1/10/50 overall, per edited attribute and on held-out
pairs, and the router's groups.

Systems: ``image-only`` (the reference alone, blind to the edit), ``text-only``, ``sum``
(CLIP4Cir's phase-1 fusion), ``sum-5tower`` (phase 1's five-tower sum: what the descriptions give
with no fusion learned), ``combiner`` (CLIP4Cir), ``combiner-5tower`` (CLIP4Cir's combiner
reading the descriptions too), ``moa3-dense`` (one group, no router), ``moa3cir`` (five towers,
its router supervised with the edited attribute where the training triplet states one),
``moa3cir-unsupervised`` (the same router trained by the retrieval loss alone), and the ablations
``moa3cir-3tower`` (no descriptions: the FashionIQ/Shoes-like setting), ``moa3cir-noaug`` (no
controlled edits) and ``one-phase`` (towers and head trained together from scratch, its router
unsupervised; ``one_phase_seeds``, 0 in the quick profile). Only :data:`DESCRIBED` systems read
descriptions.

Regime (fixed before any run): phase-1 image→description R@1 >= ``alignment`` over
``alignment_items`` items (distinct visible attributes; chance 1/items); the combiner's R@10 >=
image-only's + ``combiner_margin``. Claims (declared with their controls in
:data:`~.config.CLAIMS`), on differences paired by seed (one-sided paired t-tests) or on the
worst seed: (0) MoA3CIR's R@1 above the five-tower sum it starts from; (1) ECCIR-like:
MoA3CIR's R@10 >= 3 points above the combiner's; (2) five towers
beat three (R@1, where material is decidable: R@10 holds all four material variants of a
visible item) with the largest gain on material edits on every seed; (3) routed beats dense
MoA³ (R@10) and the NMI between the top router group and the edited attribute is >= 0.3 on
every seed; (4) FashionIQ-like: three-tower MoA3CIR within 1 point of the combiner (R@10).
Claim 0 is judged again on the combiner that reads the descriptions, claims 1–2 on the
parameter-free five-tower sum and that combiner, claim 3 on the five-tower sum and the
unsupervised router, claim 4 on the three-tower sum.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.shared import Claim, Result, cells_by_system, checkpoint_spacing, mean_std, run_cells
from mixlab.shared.cache import cached
from mixlab.shared.files import write_json_atomic
from mixlab.vision_mm.moa3cir import bases
from mixlab.vision_mm.moa3cir.config import (
    BEATS_COMBINER,
    LEVEL_WITH_COMBINER,
    METHOD,
    NMI_MIN,
    Config,
)

DESCRIBED = ("sum-5tower", "combiner-5tower", "moa3-dense", "moa3cir", "moa3cir-unsupervised",
             "moa3cir-noaug", "one-phase")  # fmt: skip
"""the systems that read descriptions (the ECCIR-like setting)"""
SIMPLE = {"image-only": "image", "text-only": "text", "sum": "sum", "sum-5tower": "sum"}

__all__ = ["METHOD", "Config", "claims", "regime", "run", "summarise", "towers"]


# ------------------------------------------------------------------------------------ towers
TOWER_CODE = ("mixlab.vision_mm.moa3cir.bases", "mixlab.vision_mm.moa3cir.towers",
              "mixlab.vision_mm.moa3cir.training", "mixlab.vision_mm.moa3cir.catalogue",
              "mixlab.vision_mm.moa3cir.augment")  # fmt: skip
"""the code that draws the data, trains the towers and the classifier and encodes the splits:
part of every cache entry's key"""


def _tower_key(config: Config) -> dict[str, Any]:
    return {"clip": bases.clip_config(config), "items": config.tower_items, "triplets": config.tower_triplets,
            "steps": config.tower_steps, "lr": config.tower_lr, "batch": config.batch_size,
            "classifier": config.classifier_steps, "confound": config.confound, "noise": config.noise,
            "seed": config.seed}  # fmt: skip


def _towers_folder(config: Config) -> Path:
    """The cache entry of the phase-1 towers and the attribute classifier (``towers.safetensors``,
    ``classifier.safetensors``, ``facts.json``), trained on first use. A killed tower training
    resumes from its checkpoints, kept beside the entries under the same key until it ends."""
    from safetensors.torch import save_model

    from mixlab.vision_mm.moa3cir.augment import train_attribute_classifier
    from mixlab.vision_mm.moa3cir.training import train_towers

    key, name = _tower_key(config), f"towers-{config.size}px"

    def build(folder: Path) -> None:
        checkpoint = folder / "training"  # kept by a kill: the next run resumes there
        started = time.perf_counter()
        model = bases.new_towers(config, config.seed)
        items, images, descriptions, data = bases.phase1_data(config)
        losses = train_towers(model, images, descriptions, data, config.tower_steps,
                              batch_size=config.batch_size, lr=config.tower_lr, seed=config.seed,
                              checkpoint=checkpoint)  # fmt: skip
        tower_seconds = time.perf_counter() - started
        classifier = train_attribute_classifier(
            images, items, config.classifier_steps, seed=config.seed
        )
        save_model(model, str(folder / "towers.safetensors"))
        save_model(classifier, str(folder / "classifier.safetensors"))
        facts = {"tower_seconds": tower_seconds, "classifier_seconds": time.perf_counter() - started - tower_seconds,
                 "tower_final_loss": float(np.mean(losses[-50:]))}  # fmt: skip
        write_json_atomic(folder / "facts.json", facts)
        shutil.rmtree(checkpoint, ignore_errors=True)

    return cached("moa3cir", name, key, build, code=TOWER_CODE, resumable=True)


def towers(config: Config):
    """(frozen towers, attribute classifier, facts): trained on the first call, cached after."""
    from safetensors.torch import load_model

    from mixlab.vision_mm.moa3cir.augment import AttributeClassifier

    folder = _towers_folder(config)
    model = bases.new_towers(config, config.seed)
    classifier = AttributeClassifier(config.size)
    load_model(model, str(folder / "towers.safetensors"))
    load_model(classifier, str(folder / "classifier.safetensors"))
    model.requires_grad_(False).eval()
    return model, classifier.eval(), json.loads((folder / "facts.json").read_text())


# -------------------------------------------------------------------------------------- data
def _split_key(config: Config, name: str) -> dict[str, Any]:
    """What the features of split ``name`` depend on: the towers and the split's own size."""
    size = {"natural": config.train_triplets, "augment": config.augment,
            "validation": config.test_queries, "test": config.test_queries, "gallery": None}[name]  # fmt: skip
    return {"towers": _tower_key(config), "split": name, "count": size}


def split(config: Config, name: str):
    """(features, facts) of ``natural``, ``augment``, ``test`` or ``gallery``: the frozen
    towers' outputs, computed once and cached."""
    from mixlab.vision_mm.moa3cir.training import TripletFeatures

    def build(folder: Path) -> None:
        model, classifier, _ = towers(config)
        if name == "gallery":
            images, descriptions = bases.gallery(config)
            features = bases.gallery_features(model, images, descriptions)
            facts = {"count": len(images)}
        else:
            from mixlab.vision_mm.moa3cir.training import encode_triplets

            data, facts = bases.make_split(config, name, model, classifier)
            features = encode_triplets(model, data, dtype=torch.float16) if len(data) else None
        if features is not None:  # None: the classifier kept no controlled edit
            bases.save_features(features, folder / "features.safetensors")
        write_json_atomic(folder / "facts.json", facts)

    folder = cached(
        "moa3cir", f"features-{name}-{config.size}px", _split_key(config, name), build,
        code=TOWER_CODE,
    )  # fmt: skip
    facts = json.loads((folder / "facts.json").read_text())
    features: TripletFeatures | None = None
    if facts["count"]:
        features = bases.load_features(folder / "features.safetensors")
    return features, facts


# ------------------------------------------------------------------------------------- cells
def _cells(config: Config) -> list[dict[str, Any]]:
    cells = []
    for seed in range(config.seed, config.seed + config.n_seeds):
        for system in config.systems:
            if system == "one-phase" and seed >= config.seed + config.one_phase_seeds:
                continue
            cells.append({"system": system, "seed": seed})
    return cells


def make_head(config: Config, system: str):
    """The fusion head of ``system`` (fresh, seeded by the caller)."""
    from mixlab.vision_mm.moa3cir.model import Combiner, MoA3Head, SimpleHead

    if system in SIMPLE:
        return SimpleHead(SIMPLE[system], descriptions=system == "sum-5tower")
    if system in ("combiner", "combiner-5tower"):
        return Combiner(config.embed_dim, config.projection_dim, config.hidden_dim,
                        descriptions=system == "combiner-5tower")  # fmt: skip
    dense = system == "moa3-dense"
    return MoA3Head(config.clip_width, config.clip_width, config.embed_dim, dim=config.dim, heads=config.heads,
                    groups=1 if dense else config.groups, shared_heads=0 if dense else config.shared_heads,
                    depth=config.depth, routed=not dense, temperature=config.temperature,
                    top_k=config.top_k or None, descriptions=system != "moa3cir-3tower")  # fmt: skip


def _training_features(config: Config, system: str):
    """The phase-2 triplets of ``system``, each with its edited attribute where the data knows it
    (a single stated attribute: every controlled edit, most natural triplets), which the
    attribute-aware router learns from."""
    from dataclasses import replace

    from mixlab.vision_mm.moa3cir.catalogue import EDITABLE
    from mixlab.vision_mm.moa3cir.training import concat_features

    names = (
        ("natural",) if system == "moa3cir-noaug" or not config.augment else ("natural", "augment")
    )
    parts = []
    for name in names:
        features, facts = split(config, name)
        if features is None:  # the classifier kept no controlled edit
            continue
        stated = facts["stated"]
        attribute = torch.tensor([EDITABLE.index(s[0]) if len(s) == 1 else -1 for s in stated])
        parts.append(replace(features, attribute=attribute))
    return parts[0] if len(parts) == 1 else concat_features(parts)


def route_supervision(config: Config, system: str) -> float:
    """The router's attribute supervision weight of ``system`` (the MoA3CIR heads; 0 for
    ``moa3cir-unsupervised``, whose router learns from the retrieval loss alone)."""
    return (
        config.route_supervision
        if system.startswith("moa3cir") and system != "moa3cir-unsupervised"
        else 0.0
    )


def _one_phase(config: Config, seed: int, out_dir: Path):
    """Towers and a MoA3CIR head trained together from scratch: the tower data and the phase-2
    triplets, ``tower_steps + steps`` steps; (test features, gallery features, head)."""
    from mixlab.vision_mm.moa3cir.model import CIRModel
    from mixlab.vision_mm.moa3cir.training import encode_triplets, train_end_to_end

    _, images, descriptions, _ = bases.phase1_data(config)
    model_towers = bases.new_towers(config, config.seed)
    torch.manual_seed(seed)
    model = CIRModel(model_towers, make_head(config, "moa3cir"))
    natural, _ = bases.make_split(config, "natural", None, None)
    train_end_to_end(model, images, descriptions, natural, config.tower_steps + config.steps,
                     batch_size=config.batch_size, lr=config.tower_lr, seed=seed, balance=config.balance,
                     checkpoint=out_dir / "training" / f"one-phase-{seed}",
                     checkpoint_every=checkpoint_spacing(config.tower_steps + config.steps))  # fmt: skip
    test, _ = bases.make_split(config, "test", None, None)
    gallery_images, gallery_descriptions = bases.gallery(config)
    return (encode_triplets(model.towers, test), bases.gallery_features(model.towers, gallery_images, gallery_descriptions),
            model.head)  # fmt: skip


@torch.no_grad()
def evaluate(head, test, gallery, facts: dict[str, Any]) -> dict[str, Any]:
    """R@1/10/50 overall, per stated attribute (a query stating two counts for both), on held-out
    targets; the router's top group per query against the edited attribute (single edits)."""
    from sklearn.metrics import normalized_mutual_info_score

    from mixlab.vision_mm.moa3cir.attention import routing_statistics
    from mixlab.vision_mm.moa3cir.catalogue import EDITABLE
    from mixlab.vision_mm.moa3cir.model import recall_at_k, target_ranks

    head.eval()
    queries = head.query(test.query.float())
    targets = head.target(gallery.target_image, gallery.target_description)
    ranks = target_ranks(queries, targets, torch.tensor(facts["target"]))
    out: dict[str, Any] = recall_at_k(ranks)
    held = torch.tensor(facts["held_out"])
    out["R@10_held_out"] = recall_at_k(ranks[held], (10,))["R@10"]
    for attribute in EDITABLE:
        rows = torch.tensor([attribute in s for s in facts["stated"]])
        for k, value in recall_at_k(ranks[rows], (1, 10)).items():
            out[f"{k}_{attribute}"] = value
    if getattr(head, "routed", False):
        weights = head.last_weights[0]
        first = weights if weights.ndim == 2 else weights.mean(1)  # per token: mean over tokens
        single = [i for i, s in enumerate(facts["stated"]) if len(s) == 1]
        edited = [EDITABLE.index(facts["stated"][i][0]) for i in single]
        out["nmi"] = float(normalized_mutual_info_score(edited, first[single].argmax(-1).numpy()))
        stats = routing_statistics(first)
        out["router_entropy"] = stats["entropy"]
        out["group_use"] = {a: first[[i for i, e in zip(single, edited, strict=True) if EDITABLE[e] == a]]
                            .mean(0).tolist() for a in EDITABLE}  # fmt: skip
    return out


def run_cell(config: Config, out_dir: Path, cell: dict[str, Any]) -> dict[str, Any]:
    from mixlab.vision_mm.moa3cir.training import train_head

    torch.set_num_threads(1)  # two workers side by side on 2 cores
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    system, seed = cell["system"], cell["seed"]
    test, facts = split(config, "test")
    if system == "one-phase":
        test, gallery, head = _one_phase(config, seed, out_dir)
    else:
        gallery, _ = split(config, "gallery")
        torch.manual_seed(seed)
        head = make_head(config, system)
        train_head(head, _training_features(config, system), config.steps, batch_size=config.batch_size,
                   lr=config.lr, seed=seed, balance=config.balance,
                   route_supervision=route_supervision(config, system),
                   checkpoint_every=checkpoint_spacing(config.steps),
                   checkpoint=out_dir / "training" / f"{system}-{seed}")  # fmt: skip
    return {
        **cell,
        **evaluate(head, test, gallery, facts),
        "seconds": time.perf_counter() - started,
    }


@torch.no_grad()
def alignment(config: Config) -> float:
    """Phase-1 image→description R@1 over ``alignment_items`` gallery items with distinct
    visible attributes (material, invisible, drawn at random)."""
    from mixlab.vision_mm.moa3cir.model import recall_at_k, target_ranks

    gallery, _ = split(config, "gallery")
    rng = np.random.default_rng(config.seed + 404)
    visible = rng.permutation(576)[: config.alignment_items]  # (category, colour, pattern, length)
    rows = torch.from_numpy(visible * 4 + rng.integers(4, size=len(visible)))  # material is last
    image = torch.nn.functional.normalize(gallery.target_image[rows], dim=-1)
    text = torch.nn.functional.normalize(gallery.target_description[rows], dim=-1)
    return recall_at_k(target_ranks(image, text, torch.arange(len(rows))), (1,))["R@1"]


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    _, _, facts = towers(config)  # once, on every core, before the workers share them
    names = (
        ("natural", "augment", "test", "gallery")
        if config.augment
        else ("natural", "test", "gallery")
    )
    split_facts = {name: split(config, name)[1] for name in names}
    torch.set_num_threads(1)
    setup_seconds = time.perf_counter() - started
    done = run_cells(
        out_dir, config, _cells(config), functools.partial(run_cell, config, out_dir),
        resume=resume, label="moa3cir", workers=config.workers,
    )  # fmt: skip
    write_json_atomic(out_dir / "cells.json", done, indent=1)
    aligned = alignment(config)
    metrics = summarise(done, aligned, config)
    _plot(metrics, done, config, out_dir)
    env = {**facts, "setup_seconds": setup_seconds, "augment_kept": split_facts.get("augment", {}).get("kept"),
           "test_held_out_share": float(np.mean(split_facts["test"]["held_out"])),
           "cell_seconds": {s: float(np.mean([c["seconds"] for c in cells])) for s, cells in cells_by_system(done).items()}}  # fmt: skip
    return Result(
        metrics=metrics, claims=claims(done, config), regime=regime(metrics, config), env=env
    )


# ---------------------------------------------------------------------------------- summary
RECALLS = ("R@1", "R@10", "R@50", "R@10_held_out", "R@1_colour", "R@1_pattern", "R@1_length",
           "R@1_material", "R@10_colour", "R@10_pattern", "R@10_length", "R@10_material")  # fmt: skip
ROW_KEYS = (*RECALLS, "R@1_std", "R@10_std", "nmi", "router_entropy", "descriptions", "seeds",
            "image_to_description_R@1")  # fmt: skip


def summarise(
    done: list[dict[str, Any]], aligned: float, config: Config
) -> dict[str, dict[str, Any]]:
    """Rows per system (means over seeds, sd of R@1 and R@10) and ``towers/phase-1`` (the
    image→description alignment check)."""
    rows: dict[str, dict[str, Any]] = {}
    for system, seeds in cells_by_system(done).items():
        row: dict[str, Any] = {k: None for k in ROW_KEYS}
        for key in (*RECALLS, "nmi", "router_entropy"):
            values = [s[key] for s in seeds if s.get(key) is not None]
            if values:
                row[key] = float(np.mean(values))
        row["R@1_std"] = mean_std([s["R@1"] for s in seeds])[1]
        row["R@10_std"] = mean_std([s["R@10"] for s in seeds])[1]
        row["descriptions"] = int(system in DESCRIBED)
        row["seeds"] = len(seeds)
        rows[system] = row
    rows["towers/phase-1"] = {
        **{k: None for k in ROW_KEYS},
        "image_to_description_R@1": aligned,
        "seeds": 1,
    }
    return rows


def _paired(done: list[dict[str, Any]], a: str, b: str, key: str) -> np.ndarray:
    seeds = cells_by_system(done)
    n = min(len(seeds[a]), len(seeds[b]))
    return np.array([x[key] - y[key] for x, y in zip(seeds[a][:n], seeds[b][:n], strict=True)])


def _paired_seeds(done: list[dict[str, Any]], a: str, b: str) -> list[int]:
    """The seeds of :func:`_paired`'s differences, in their order (both systems run the seeds
    from ``config.seed`` up)."""
    seeds = cells_by_system(done)
    n = min(len(seeds[a]), len(seeds[b]))
    return [cell["seed"] for cell in seeds[a][:n]]


def claims(done: list[dict[str, Any]], config: Config) -> list[Claim]:
    """The issue's claims (1)–(4), judged seed by seed (one-sided paired t-tests over seeds, the
    worst seed for the material ranking and the NMI) on MoA3CIR and again on its control
    (:data:`~.config.CLAIMS`). A claim whose systems did not run is not judged."""
    from mixlab.vision_mm.moa3cir.catalogue import EDITABLE

    systems = set(config.systems)

    def beats_sum(system: str) -> Claim:
        return Claim.paired(system, _paired(done, system, "sum-5tower", "R@1"), 0.0,
                            label=f"{system} − five-tower sum R@1")  # fmt: skip

    def beats_combiner(system: str) -> Claim:
        return Claim.paired(system, _paired(done, system, "combiner", "R@10"), BEATS_COMBINER,
                            label=f"{system} − combiner R@10")  # fmt: skip

    def five_beat_three(system: str) -> Claim:
        gains = {a: _paired(done, system, "moa3cir-3tower", f"R@1_{a}") for a in EDITABLE}
        others = np.max([gains[a] for a in EDITABLE if a != "material"], axis=0)
        return Claim.all_of(system, [
            Claim.paired("overall", _paired(done, system, "moa3cir-3tower", "R@1"), 0.0,
                         label=f"{system} − three-tower MoA3CIR R@1"),
            Claim.worst_seed("material first", gains["material"].tolist(), ">=", others.tolist(),
                             seeds=_paired_seeds(done, system, "moa3cir-3tower"),
                             value_label="R@1 gain on material edits",
                             reference_label="largest gain on another attribute"),
        ])  # fmt: skip

    def routing_tracks_attribute(system: str) -> Claim:
        # a head without a router sends every query to its one group: a constant top group,
        # whose NMI with the edited attribute is 0
        cells = cells_by_system(done)[system]
        nmi = [c.get("nmi", 0.0) for c in cells]
        return Claim.all_of(system, [
            Claim.paired("routed vs dense", _paired(done, system, "moa3-dense", "R@10"), 0.0,
                         label=f"{system} − dense MoA³ R@10"),
            Claim.worst_seed("NMI", nmi, ">=", NMI_MIN, seeds=[c["seed"] for c in cells],
                             value_label=f"{system} NMI(top group, edited attribute)"),
        ])  # fmt: skip

    def level_with_combiner(system: str) -> Claim:
        return Claim.paired(system, _paired(done, system, "combiner", "R@10"), LEVEL_WITH_COMBINER,
                            label=f"{system} − combiner R@10")  # fmt: skip

    found = []
    if {"sum-5tower", "combiner-5tower"} <= systems:
        found.append(config.judge("beats_sum", beats_sum))
        found.append(config.judge("beats_combiner", beats_combiner))
    if {"moa3cir-3tower", "sum-5tower", "combiner-5tower"} <= systems:
        found.append(config.judge("five_towers_beat_three", five_beat_three))
    if {"moa3-dense", "sum-5tower", "moa3cir-unsupervised"} <= systems:
        found.append(config.judge("routing_tracks_attribute", routing_tracks_attribute))
    if {"moa3cir-3tower", "sum"} <= systems:
        found.append(config.judge("level_without_descriptions", level_with_combiner))
    return found


def regime(metrics: dict[str, Any], config: Config) -> list[Claim]:
    """The towers align images with descriptions and the combiner uses the edit."""
    aligned = metrics["towers/phase-1"]["image_to_description_R@1"]
    return [
        Claim.compare(f"Phase-1 towers: image→description R@1 >= {config.alignment:g} over "
                      f"{config.alignment_items} items (chance {1 / config.alignment_items:.3f})",
                      aligned, ">=", config.alignment, value_label="image→description R@1"),
        Claim.compare(f"CLIP4Cir's combiner beats image-only retrieval by >= {config.combiner_margin:g} R@10",
                      metrics["combiner"]["R@10"], ">=", metrics["image-only"]["R@10"] + config.combiner_margin,
                      value_label="combiner R@10", reference_label="image-only + margin"),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------- plots
def _plot(
    metrics: dict[str, Any], done: list[dict[str, Any]], config: Config, out_dir: Path
) -> None:
    from matplotlib.figure import Figure

    from mixlab.shared import save_figure
    from mixlab.vision_mm.moa3cir.catalogue import EDITABLE

    systems = [s for s in config.systems if s in metrics]
    figure = Figure(figsize=(13, 4), layout="constrained")
    overall, per_attribute = figure.subplots(1, 2)
    x = np.arange(3)
    width = 0.8 / len(systems)
    for k, system in enumerate(systems):
        row = metrics[system]
        offset = width * (k - (len(systems) - 1) / 2)
        overall.bar(x + offset, [row[r] for r in ("R@1", "R@10", "R@50")], width, label=system)
        per_attribute.bar(np.arange(len(EDITABLE)) + offset, [row[f"R@1_{a}"] for a in EDITABLE], width,
                          label=system)  # fmt: skip
    overall.set_xticks(x, ["R@1", "R@10", "R@50"])
    overall.set(ylim=(0, 1), ylabel="recall", title="test queries (mean over seeds)")
    per_attribute.set_xticks(np.arange(len(EDITABLE)), EDITABLE)
    per_attribute.set(ylim=(0, 1), ylabel="R@1", title="R@1 by stated attribute")
    overall.legend(fontsize=7, ncol=2)
    save_figure(figure, out_dir / "recall.png")

    use = [c["group_use"] for c in done if c["system"] == "moa3cir" and "group_use" in c]
    if use:
        table = np.array(
            [[np.mean([u[a][g] for u in use]) for g in range(config.groups)] for a in EDITABLE]
        )
        figure = Figure(figsize=(5, 3.4), layout="constrained")
        ax = figure.subplots()
        image = ax.imshow(table, cmap="viridis", vmin=0, vmax=1)
        ax.set_yticks(range(len(EDITABLE)), EDITABLE)
        ax.set_xticks(range(config.groups), [f"group {g}" for g in range(config.groups)])
        ax.set(title="MoA3CIR router: mean group weight by edited attribute")
        figure.colorbar(image, ax=ax)
        save_figure(figure, out_dir / "routing.png")
