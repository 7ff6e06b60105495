"""MiTA against full, window, MoBA and top-k attention on 1,024-token canvases (``mixlab run mita``).

1. Accuracy at a matched budget: every kind trained from scratch attends to ``key_budget`` keys
   (or slots) per query (MiTA: M landmarks + k routed keys; MoBA: 2 blocks of budget/2; window:
   a window of budget patches; shared-only and Agent: budget agents; routed-only: budget keys),
   with the same steps, data, optimiser and seeds. With the algorithms' attention FLOPs per image
   (and the FLOPs the path each layer takes executes) and the peak memory of one layer's forward
   + backward (measured in a fresh process). Top-k, whose selection costs O(N²), is swapped in
   only (part 2).
2. Easy generalisation: each seed's trained full-attention ViT with MiTA, MoBA, top-k and
   shared-only MiTA swapped in (same weights), zero-shot and after ``finetune_steps``; full
   attention fine-tuned as long shows what the extra steps alone give.
3. Emergent token pruning, on each seed's MiTA model: coverage |∪S_m|/N over training, precision
   and recall of the selected tokens against the objects, and test accuracy with the
   never-selected tokens dropped against dropping as many at random.

Regime check (issues 32, 66): the claims are tested only when full attention, trained from scratch
like every system, reaches FULL_ACCURACY_REGIME (0.6) test accuracy, mean over seeds; otherwise
the testbed cannot tell attention kinds apart and every claim is reported untested.

Each claim (:data:`~.config.CLAIMS`) is judged seed by seed on MiTA and again on its control (MoBA
at the same FLOPs; the shared-only swap; random pruning): a claim its control passes too is
vacuous. "Matches full attention" assumes attention's reach matters here (window attention at
the same budget loses more than REACH_MARGIN to full attention on every seed); without it, it
is untested.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.attention_arch.mita.config import (
    FLOP_FRACTION,
    FULL_ACCURACY_REGIME,
    METHOD,
    MIN_PRUNED,
    RANDOM_PRUNING,
    REACH_MARGIN,
    SWAP_RIVALS,
    SWAPPED,
    WITHIN_POINTS,
    Config,
)
from mixlab.attention_arch.mita.data import cluttered_digits, counting_squares
from mixlab.attention_arch.mita.introspection import (
    coverage,
    mask_precision_recall,
    random_keep_like,
    selected_tokens,
)
from mixlab.attention_arch.mita.profile import peak_memory
from mixlab.attention_arch.mita.swap import (
    ATTENTION_KINDS,
    matched_config,
    replace_attention,
)
from mixlab.attention_arch.mita.training import TrainSpec, accuracy, build_vit, train
from mixlab.shared import (
    Claim,
    Result,
    bar_plot,
    line_plot,
    load_state,
    mean_std,
    resolve_device,
    run_cells,
    save_state,
    seed_everything,
)
from mixlab.shared.files import write_json_atomic


def attention_config(system: str, config: Config) -> dict[str, Any]:
    return matched_config(system, config.key_budget, config.pool_size)


def attention_cost(system: str, config: Config) -> tuple[int, int]:
    """(the algorithm's, our executed) attention FLOPs per image over all layers."""
    grid = config.canvas // config.patch_size
    layer = ATTENTION_KINDS[system](
        config.embed_dim,
        config.num_heads,
        num_prefix_tokens=int(config.shape.class_token),
        grid_size=(grid, grid),
        **attention_config(system, config),
    )
    tokens = config.shape.num_tokens
    algorithm = layer.attention_flops(tokens)
    return config.depth * algorithm, config.depth * layer.executed_flops(tokens, config.batch_size)


def _datasets(config: Config):
    """(training, test) canvases of ``config.task``, drawn once per process."""
    fields = ("task", "canvas", "square", "max_count", "digit_scale", "clutter")
    sizes = (config.train_size, config.test_size, config.seed)
    return _draw(tuple(getattr(config, name) for name in fields), *sizes)


@functools.lru_cache(maxsize=1)
def _draw(task: tuple, train_size: int, test_size: int, seed: int):
    kind, canvas, square, max_count, digit_scale, clutter = task
    if kind == "count":
        draw = functools.partial(counting_squares, canvas=canvas, size=square, max_count=max_count)
    else:
        draw = functools.partial(
            cluttered_digits, canvas=canvas, scale=digit_scale, clutter=clutter
        )
    return draw(train_size, split="train", seed=seed), draw(test_size, split="test", seed=seed)


def _spec(
    config: Config, seed: int, steps: int | None = None, lr: float | None = None
) -> TrainSpec:
    return TrainSpec(
        steps=steps or config.steps, batch_size=config.batch_size, lr=lr or config.lr, seed=seed
    )


def run_scratch(config: Config, system: str, seed: int, data, out_dir: Path) -> dict[str, Any]:
    """Train one system from scratch; for MiTA also the pruning measurements, for full attention
    also the swaps into the trained model (:func:`run_swap`). A killed cell resumes from its last
    training checkpoint (every 200 steps; its coverage trace then has a gap up to that step and
    ``seconds`` counts the resumed part only); full attention's cell also keeps its trained model
    and each finished swap until the cell is done, so a kill during the swaps loses at most the
    fine-tuning steps since that swap's last checkpoint."""
    train_data, test_data = data
    device = resolve_device(config.device)
    checkpoints = out_dir / "checkpoints"
    trained = checkpoints / f"trained-{system}-seed{seed}"  # full attention's, before its swaps
    if trained.with_suffix(".json").exists():  # killed during its swaps: trained already
        saved = load_state(trained, map_location=device)
        return _swap_all(config, saved["cell"], saved["model"], saved["swaps"], data, trained)
    seed_everything(seed)
    model = build_vit(config.shape, system, **attention_config(system, config)).to(device)
    probe = train_data.images[:128].to(device)
    trace: list[tuple[int, float]] = []
    tracks = system == "mita"

    def on_step(step: int, model) -> None:
        if step % config.coverage_every == 0 or step == 1:
            trace.append((step, coverage(model, probe).mean().item()))

    start = time.perf_counter()
    if tracks:
        trace.append((0, coverage(model, probe).mean().item()))
    train(
        model,
        train_data,
        _spec(config, seed),
        device=device,
        checkpoint=checkpoints / f"train-{system}-seed{seed}",
        on_step=on_step if tracks else None,
    )
    cell = {
        "system": system,
        "seed": seed,
        "accuracy": accuracy(model, test_data),
        "seconds": time.perf_counter() - start,
        "coverage_trace": trace,
    }
    if tracks:
        cell.update(pruning(model, test_data, config, seed))
    if system != "full":
        return cell
    state = {name: value.detach().clone() for name, value in model.state_dict().items()}
    return _swap_all(config, cell, state, {}, data, trained)


def _swap_all(
    config: Config, cell: dict, state: dict, swaps: dict, data, trained: Path
) -> dict[str, Any]:
    """Every kind of SWAPPED swapped into the trained full-attention ``state`` (those not in
    ``swaps`` yet), the progress saved at ``trained`` before each; the cell with its swaps."""
    for kind in SWAPPED:
        if kind not in swaps:
            save_state({"model": state, "cell": cell, "swaps": swaps}, trained)
            checkpoint = trained.with_name(f"swap-{kind}-seed{cell['seed']}")
            swaps[kind] = run_swap(config, kind, data, state, cell["seed"], checkpoint)
    for suffix in (".json", ".safetensors"):
        trained.with_suffix(suffix).unlink(missing_ok=True)
    return {**cell, "swaps": swaps}


def pruning(model, test_data, config: Config, seed: int) -> dict[str, Any]:
    """Selection precision/recall against the objects and accuracy with never-selected tokens
    dropped (per image: tokens no landmark of any head of any layer selected) against dropping
    as many at random."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    object_tokens = test_data.token_masks(config.patch_size)
    model.eval()
    batches = [test_data.images[i : i + 256].to(device) for i in range(0, len(test_data), 256)]
    selected = torch.cat([selected_tokens(model, batch).cpu() for batch in batches])
    prefix = model.num_prefix_tokens
    keep = selected.clone()
    keep[:, :prefix] = True  # a CLS token or registers stay
    random_keep = random_keep_like(keep, prefix, generator)
    precision, recall = mask_precision_recall(selected[:, prefix:], object_tokens)
    return {
        "coverage_test": coverage(model, test_data.images[:256].to(device)).tolist(),
        "selection_precision": precision,
        "selection_recall": recall,
        "object_token_share": object_tokens.float().mean().item(),
        "pruned_fraction": 1 - keep[:, prefix:].float().mean().item(),
        "pruned_accuracy": accuracy(model, test_data, keep=keep),
        "random_pruned_accuracy": accuracy(model, test_data, keep=random_keep),
    }


def run_swap(
    config: Config,
    kind: str,
    data,
    trained_state: dict,
    seed: int,
    checkpoint: Path | None = None,
) -> dict[str, float]:
    """``kind`` swapped into seed ``seed``'s trained full-attention model: zero-shot and
    fine-tuned accuracy (fine-tuning seed ``seed + 7919``; resumable at ``checkpoint``)."""
    train_data, test_data = data
    device = resolve_device(config.device)
    model = build_vit(config.shape, "full")
    model.load_state_dict(trained_state, strict=True)
    replace_attention(model, kind, **attention_config(kind, config))
    model.load_state_dict(trained_state, strict=True)  # the swap keeps every key
    model.to(device)
    zero_shot = accuracy(model, test_data)
    seed_everything(seed + 7919)
    spec = _spec(config, seed + 7919, config.finetune_steps, config.finetune_lr)
    train(
        model,
        train_data,
        spec,
        device=device,
        checkpoint=checkpoint,
        description=f"fine-tune {kind}",
    )
    return {"zero_shot": zero_shot, "finetuned": accuracy(model, test_data)}


def run_memory(config: Config) -> dict[str, Any]:
    """Peak memory of one attention layer's forward + backward per system, at the experiment's
    batch and token count (one fresh process for all)."""
    grid = config.canvas // config.patch_size
    common = {
        "heads": config.num_heads,
        "head_dim": config.embed_dim // config.num_heads,
        "grid": [grid, grid],
        "prefix": int(config.shape.class_token),
        "batch": config.batch_size,
        "backward": True,
    }
    specs = [{**common, "kind": s, "config": attention_config(s, config)} for s in config.systems]
    return {"peak_bytes": dict(zip(config.systems, peak_memory(specs), strict=True))}


def _cells(config: Config) -> list[dict[str, Any]]:
    """Longest first, so that two workers finish together: full attention's cells (training and
    the five swaps), then the kinds whose steps cost most at N = 1,024 (measured in quick)."""
    cost = {"full": 0, "topk": 1, "moba": 2, "mita": 3, "mita_dwc": 3, "mita_routed_only": 3}
    systems = sorted(config.systems, key=lambda system: cost.get(system, 4))
    cells: list[dict[str, Any]] = [
        {"part": "scratch", "system": system, "seed": config.seed + offset}
        for system in systems
        for offset in range(config.n_seeds)
    ]
    cells.append({"part": "memory"})
    return cells


def run_cell(config: Config, out_dir: Path, cell: dict[str, Any]) -> dict[str, Any]:
    """One cell, in this process or in a worker (with workers, one torch thread each: two cells
    share 2 cores)."""
    threads = torch.get_num_threads()
    if config.workers > 1:
        torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    try:
        if cell["part"] == "scratch":
            data = _datasets(config)
            return {**cell, **run_scratch(config, cell["system"], cell["seed"], data, out_dir)}
        return {**cell, **run_memory(config)}
    finally:
        torch.set_num_threads(threads)


def run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    cells = run_cells(
        out_dir,
        config,
        _cells(config),
        functools.partial(run_cell, config, out_dir),
        resume=resume,
        label="mita cells",
        workers=config.workers,
    )
    write_json_atomic(out_dir / "cells.json", cells, indent=1)
    metrics = summarise(cells, config)
    _plots(cells, metrics, config, out_dir)
    return Result(metrics=metrics, claims=claims(config, cells, metrics), regime=regime(metrics))


def summarise(cells: list[dict[str, Any]], config: Config) -> dict[str, dict[str, float | None]]:
    """One row per system: test accuracy (mean, sample std over seeds), attention GFLOPs per
    image and their ratio to full attention, peak memory of one layer's forward + backward; for
    swapped kinds the zero-shot and fine-tuned accuracy (means over the seeds' models); for MiTA
    the pruning numbers. A kind only swapped in (top-k in quick) has no from-scratch numbers."""
    scratch = [c for c in cells if c["part"] == "scratch"]
    swaps = [c["swaps"] for c in scratch if c["system"] == "full"]
    memory = next(c["peak_bytes"] for c in cells if c["part"] == "memory")
    full_flops = attention_cost("full", config)[0]
    metrics: dict[str, dict[str, float | None]] = {}
    for system in (*config.systems, *(k for k in SWAPPED if k not in config.systems)):
        mine = [c for c in scratch if c["system"] == system]
        mean, std = mean_std([c["accuracy"] for c in mine]) if mine else (None, None)
        flops, executed = attention_cost(system, config)
        pruning = [c for c in mine if "pruned_accuracy" in c]
        row: dict[str, float | None] = {
            "accuracy": mean,
            "accuracy_std": std,
            "attention_gflops": flops / 1e9,
            "flops_vs_full": flops / full_flops,
            "executed_flops_vs_full": executed / full_flops,
            "peak_memory_mb": memory[system] / 2**20 if system in memory else None,
            "train_seconds": float(sum(c["seconds"] for c in mine)) if mine else None,
            "swap_zero_shot": None,
            "swap_finetuned": None,
        }
        for name in ("zero_shot", "finetuned"):  # mean over the seeds' full-attention models
            if system in SWAPPED:
                row[f"swap_{name}"] = float(np.mean([s[system][name] for s in swaps]))
        for name in (
            "coverage_start", "coverage_end", "selection_precision", "selection_recall",
            "object_token_share", "pruned_fraction", "pruned_accuracy", "random_pruned_accuracy",
        ):  # fmt: skip
            row[name] = None
        if pruning:
            row["coverage_start"] = float(np.mean([c["coverage_trace"][0][1] for c in pruning]))
            row["coverage_end"] = float(np.mean([c["coverage_trace"][-1][1] for c in pruning]))
            for name in (
                "selection_precision", "selection_recall", "object_token_share",
                "pruned_fraction", "pruned_accuracy", "random_pruned_accuracy",
            ):  # fmt: skip
                row[name] = float(np.mean([c[name] for c in pruning]))
        metrics[system] = row
    return metrics


def regime(metrics: dict[str, dict[str, Any]]) -> list[Claim]:
    """Whether the testbed can tell attention kinds apart at all: full attention, trained from
    scratch like every system, must reach FULL_ACCURACY_REGIME test accuracy (its mean over the
    seeds; chance is 0.1) before MiTA's accuracy is compared with it (issue 32)."""
    return [
        Claim.compare(
            f"full attention learns the task: its test accuracy (mean over seeds) reaches "
            f"{FULL_ACCURACY_REGIME:g}",
            metrics["full"]["accuracy"],
            ">=",
            FULL_ACCURACY_REGIME,
            value_label="full-attention accuracy",
            reference_label="required",
        )
    ]


def per_seed(cells: list[dict[str, Any]], system: str, name: str) -> list[float]:
    """``name`` of each of ``system``'s from-scratch cells, in seed order (the claims' values)."""
    mine = sorted(
        (c for c in cells if c["part"] == "scratch" and c["system"] == system),
        key=lambda c: c["seed"],
    )
    if not mine:
        raise KeyError(system)
    return [float(c[name]) for c in mine]


def claims(
    config: Config, cells: list[dict[str, Any]], metrics: dict[str, dict[str, Any]]
) -> list[Claim]:
    """The three claims of :data:`~.config.CLAIMS`, each judged on MiTA and on its control, seed by
    seed (the swaps start from each seed's trained full-attention model)."""
    seeds = [c["seed"] for c in cells if c["part"] == "scratch" and c["system"] == "full"]
    seeds.sort()
    full = per_seed(cells, "full", "accuracy")

    def matches_full(system: str) -> Claim:
        return Claim.all_of(
            "matches full attention",
            [
                Claim.worst_seed(
                    "accuracy",
                    per_seed(cells, system, "accuracy"),
                    ">=",
                    [a - WITHIN_POINTS for a in full],
                    seeds=seeds,
                    value_label=f"{system} accuracy",
                    reference_label="full accuracy − 0.01",
                ),
                Claim.worst_seed(  # the FLOPs are the same on every seed: one value
                    "attention FLOPs",
                    [metrics[system]["flops_vs_full"]],
                    "<=",
                    FLOP_FRACTION,
                    value_label=f"{system} FLOPs / full FLOPs",
                ),
            ],
        )

    reach = Claim.worst_seed(
        f"attention's reach matters: window attention at the same key budget loses more than "
        f"{REACH_MARGIN:g} to full attention on every seed",
        per_seed(cells, "window", "accuracy"),
        "<",
        [a - REACH_MARGIN for a in full],
        seeds=seeds,
        value_label="window accuracy",
        reference_label=f"full accuracy − {REACH_MARGIN:g}",
    )
    swaps = [
        c["swaps"]
        for c in sorted(cells, key=lambda c: c.get("seed", 0))
        if c["part"] == "scratch" and c["system"] == "full"
    ]
    best_rival = [max(s[kind]["finetuned"] for kind in SWAP_RIVALS) for s in swaps]

    def swap_recovers_most(system: str) -> Claim:
        return Claim.worst_seed(
            "swap recovers most",
            [s[system]["finetuned"] for s in swaps],
            ">",
            best_rival,
            seeds=seeds,
            value_label=f"{system} swap, fine-tuned",
            reference_label=f"best of the {' and '.join(SWAP_RIVALS)} swaps, fine-tuned",
        )

    def pruned(system: str) -> tuple[list[float], list[float], list[float]]:
        """(share dropped, accuracy after dropping, reference accuracy) per seed of ``system``'s
        pruning: MiTA drops its never-selected tokens, random pruning as many at random."""
        fraction = per_seed(cells, "mita", "pruned_fraction")
        random = per_seed(cells, "mita", "random_pruned_accuracy")
        if system == RANDOM_PRUNING:
            return fraction, random, random
        return fraction, per_seed(cells, system, "pruned_accuracy"), random

    dropped = {"mita": "never-selected dropped", RANDOM_PRUNING: "as many dropped at random"}

    def selection_prunes_tokens(system: str) -> Claim:
        fraction, kept, random = pruned(system)
        mita_seeds = sorted(
            c["seed"] for c in cells if c["part"] == "scratch" and c["system"] == "mita"
        )
        return Claim.all_of(
            "selection prunes tokens",
            [
                Claim.worst_seed(
                    "tokens never selected",
                    fraction,
                    ">=",
                    MIN_PRUNED,
                    seeds=mita_seeds,
                    value_label="share of tokens dropped",
                ),
                Claim.worst_seed(
                    "pruning by selection beats random pruning",
                    kept,
                    ">",
                    random,
                    seeds=mita_seeds,
                    value_label=f"accuracy, {dropped[system]}",
                    reference_label="accuracy, as many dropped at random",
                ),
            ],
        )

    return [
        config.judge("matches_full_attention", matches_full, premises={"reach_matters": reach}),
        config.judge("swap_recovers_most", swap_recovers_most),
        config.judge("selection_prunes_tokens", selection_prunes_tokens),
    ]


def _plots(
    cells: list[dict[str, Any]],
    metrics: dict[str, dict[str, Any]],
    config: Config,
    out_dir: Path,
) -> None:
    bar_plot(
        out_dir / "accuracy.png",
        {s: m["accuracy"] for s, m in metrics.items() if m["accuracy"] is not None},
        errors={s: m["accuracy_std"] for s, m in metrics.items() if m["accuracy"] is not None},
        ylabel="test accuracy",
        title=f"{config.task}, N = {config.shape.num_tokens} tokens, matched key budget",
    )
    traces = [
        c["coverage_trace"] for c in cells if c["part"] == "scratch" and c["system"] == "mita"
    ]
    line_plot(
        out_dir / "coverage.png",
        {f"seed {i}": ([s for s, _ in t], [v for _, v in t]) for i, t in enumerate(traces)},
        xlabel="training step",
        ylabel="coverage |∪S_m| / N (mean over layers, heads)",
        title="MiTA: coverage of the routed experts",
    )


__all__ = ["METHOD", "Config", "claims", "regime", "run", "summarise"]
