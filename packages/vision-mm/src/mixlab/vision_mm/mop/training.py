"""One training step per system, all on the same batches of paired samples (issue 28, in progress).

A batch holds ``images`` per modality (paired rows), ``input_ids``, ``attention_mask`` and
``labels`` (the answer tokens, prompt positions ``-100``). Systems:

- ``unimodal``: the task loss on one modality (a model per modality);
- ``dropout``: each sample keeps one of its modalities at random (modality dropout);
- ``mop-x``: the task loss on every modality alone + λ_x·alignment of the deployed modality's
  probes to the privileged one's (stop-gradient) + λ_d·L_dis;
- ``mop-nodis``: MoP-X with λ_d = 0;
- ``resampler``: MoP-X's objective through one last-layer resampler (K = 1);
- ``onellm``: the task loss on every modality alone through OneLLM's routed resamplers;
- ``distill``: the deployed modality's task loss + the KL to a frozen teacher trained on the
  privileged modality (Hinton's T² scaling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mixlab.shared import progress
from mixlab.shared.checks import check_count, check_number
from mixlab.vision_mm.mop.losses import MoPXLoss
from mixlab.vision_mm.mop.model import PrivilegedMLLM

__all__ = [
    "CONNECTORS",
    "SYSTEMS",
    "SystemSpec",
    "accuracy_by_type",
    "fit",
    "paired_batches",
    "system_connector",
    "system_spec",
    "training_loss",
]

SYSTEMS = ("unimodal", "dropout", "resampler", "mop-nodis", "mop-x", "distill", "onellm")
CONNECTORS = {"unimodal": "mop", "dropout": "mop", "resampler": "resampler", "mop-nodis": "mop",
              "mop-x": "mop", "distill": "mop", "onellm": "routed"}  # fmt: skip
"""the connector each system trains (unimodal, dropout and distillation use the same MoP as MoP-X,
so only the objective differs)"""


def system_connector(
    system: str, dim: int, num_layers: int, *, num_probes: int = 4, queries: int = 8, heads: int = 4,
    layers=None, combine: str = "sum",
):  # fmt: skip
    """The connector of ``system`` for an encoder of width ``dim`` with ``num_layers`` hidden
    states; the resampler baselines get as many queries as MoP hands the LM tokens."""
    from mixlab.vision_mm.mop.probes import MixtureOfProbes, Resampler, RoutedResamplers

    if system not in CONNECTORS:
        raise ValueError(f"system must be one of {list(SYSTEMS)}, got {system!r}")
    tokens = queries * (num_probes if combine == "concat" else 1)
    if CONNECTORS[system] == "resampler":
        return Resampler(dim, queries=tokens, heads=heads)
    if CONNECTORS[system] == "routed":
        return RoutedResamplers(dim, queries=tokens, heads=heads)
    return MixtureOfProbes(dim, num_layers, num_probes=num_probes, queries=queries, heads=heads,
                           layers=layers, combine=combine)  # fmt: skip


@dataclass(frozen=True)
class SystemSpec:
    name: str
    trains_on: tuple[str, ...]
    """modalities whose task loss is trained"""
    loss: MoPXLoss
    pairs: tuple[tuple[str, str], ...] = ()
    dropout: bool = False
    distill_temperature: float | None = None


def system_spec(
    name: str, modalities: tuple[str, ...], *, deploy: str, privileged: str,
    lambda_x: float = 1.0, lambda_d: float = 0.1, aligned: tuple[int, ...] | None = None,
    symmetric: bool = False,
) -> SystemSpec:  # fmt: skip
    """The objective of system ``name``; ``unimodal`` and ``distill`` train ``deploy`` only.
    MoP-X aligns ``deploy``'s probes to ``privileged``'s, or with ``symmetric`` every modality's
    to every other's (each a stop-gradient target), when each will be served alone."""
    if name not in SYSTEMS:
        raise ValueError(f"system must be one of {list(SYSTEMS)}, got {name!r}")
    for label, modality in (("deploy", deploy), ("privileged", privileged)):
        if modality not in modalities:
            raise ValueError(
                f"{label} must be one of the modalities {list(modalities)}, got {modality!r}"
            )
    plain = MoPXLoss(lambda_x=0.0, lambda_d=0.0)
    align = ((deploy, privileged),)
    if symmetric:
        align = tuple((a, b) for a in modalities for b in modalities if a != b)
    if name == "unimodal":
        return SystemSpec(name, (deploy,), plain)
    if name == "dropout":
        return SystemSpec(name, tuple(modalities), plain, dropout=True)
    if name == "onellm":
        return SystemSpec(name, tuple(modalities), plain)
    if name == "distill":
        return SystemSpec(name, (deploy,), plain, distill_temperature=2.0)
    lambda_d = 0.0 if name in ("mop-nodis", "resampler") else lambda_d
    aligned = None if name == "resampler" else aligned  # K = 1: its one probe
    return SystemSpec(name, tuple(modalities), MoPXLoss(lambda_x, lambda_d, aligned=aligned), align)


def _forward(model: PrivilegedMLLM, batch: dict, modality: str, rows=slice(None), *, labels=True):
    """``model`` on one modality of ``batch`` (its ``images``, or cached ``features``)."""
    mask = batch.get("attention_mask")
    args = (batch["input_ids"][rows], None if mask is None else mask[rows],
            batch["labels"][rows] if labels else None)  # fmt: skip
    if "features" in batch:
        return model(modality, None, *args, features=batch["features"][modality][rows])
    return model(modality, batch["images"][modality][rows], *args)


def training_loss(
    model: PrivilegedMLLM, batch: dict, spec: SystemSpec, *, generator: torch.Generator | None = None,
    teacher: PrivilegedMLLM | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:  # fmt: skip
    """The loss of ``spec`` on one batch, and its parts for logging. ``batch`` holds
    ``input_ids``, ``attention_mask``, ``labels`` and, per modality, ``images`` or the frozen
    encoder's ``features``; optionally ``present`` per modality, a bool per sample (a sample
    trains each modality it has; alignment and distillation use the samples with both)."""
    inputs, ids = batch.get("features", batch.get("images", {})), batch["input_ids"]
    missing = [m for m in spec.trains_on if m not in inputs]
    if missing:
        raise ValueError(f"the batch has no images of {missing}; it has {list(inputs)}")
    everywhere = torch.ones(len(ids), dtype=torch.bool, device=ids.device)
    present = {m: batch.get("present", {}).get(m, everywhere) for m in inputs}
    if spec.dropout:  # each sample keeps one of the modalities it has, drawn uniformly
        draw = torch.rand(len(ids), len(spec.trains_on), generator=generator).to(ids.device)
        draw = draw.masked_fill(~torch.stack([present[m] for m in spec.trains_on], 1), -1.0)
        choice = draw.argmax(1)
        present = {m: present[m] & (choice == k) for k, m in enumerate(spec.trains_on)}
    task, probes, outputs = {}, {}, {}
    for modality in spec.trains_on:
        rows = present[modality].nonzero()[:, 0]
        if not len(rows):
            continue
        outputs[modality] = out = _forward(model, batch, modality, rows)
        task[modality] = out.loss * len(rows) / len(ids)
        probes[modality] = out.probes.probes.new_zeros(len(ids), *out.probes.probes.shape[1:])
        probes[modality] = probes[modality].index_put((rows,), out.probes.probes)
    if not task:
        raise ValueError(f"no sample of the batch has any of the modalities {list(spec.trains_on)}")
    total, logs = spec.loss(task, probes, spec.pairs, present={m: present[m] for m in probes})
    if spec.distill_temperature is not None:
        if teacher is None:
            raise ValueError("distill needs a teacher model trained on the privileged modality")
        (student_modality,) = spec.trains_on
        privileged = next(m for m in inputs if m != student_modality)
        both = (present[student_modality] & present[privileged]).nonzero()[:, 0]
        if len(both):
            with torch.no_grad():
                target = _forward(teacher, batch, privileged, both).logits
            student = _forward(model, batch, student_modality, both).logits
            t = spec.distill_temperature
            answer = batch["labels"][both] != -100  # the positions that predict answer tokens
            answer = torch.cat([answer[:, 1:], torch.zeros_like(answer[:, :1])], 1)
            kl = F.kl_div((student[answer] / t).log_softmax(-1), (target[answer] / t).log_softmax(-1),
                          log_target=True, reduction="batchmean") * t * t  # fmt: skip
            total = total + kl * len(both) / len(ids)
            logs["distill"] = float(kl.detach())
    return total, logs


def fit(
    model: PrivilegedMLLM, batches, spec: SystemSpec, steps: int, *, lr: float = 3e-3,
    lm_lr: float | None = 1e-3, seed: int = 0,
    teacher: PrivilegedMLLM | None = None, checkpoint: str | None = None, checkpoint_every: int = 100,
    callback=None,
) -> list[dict[str, float]]:  # fmt: skip
    """``steps`` AdamW steps of ``spec``'s loss on ``batches(step)`` (a function of the step, so
    a resumed run sees the same data) with accelerate; ``checkpoint``: a folder for
    ``Accelerator.save_state`` every ``checkpoint_every`` steps, resumed from when present.

    ``lr`` is the step size of the connector, projector and tokenizers, ``lm_lr`` the LM's
    (``None``: ``lr``): the probes learn where to look from scratch and need a larger step than a
    pre-trained LM tolerates (LLaVA's projector/LM split). Both warm up linearly over the first
    5 % of the steps, then follow a cosine to zero. ``callback(step, model)`` runs after each
    step, before that step's checkpoint. Returns the logged parts of each step run."""
    from pathlib import Path

    from accelerate import Accelerator

    check_count(steps, "steps", minimum=0)
    accelerator = Accelerator()
    check_number(lr, "lr", lr > 0, "a finite number > 0")
    lm_lr = lr if lm_lr is None else lm_lr
    check_number(lm_lr, "lm_lr", lm_lr > 0, "a finite number > 0")
    in_lm = {id(p) for p in model.lm.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in in_lm], "lr": lr},
              {"params": [p for p in trainable if id(p) in in_lm], "lr": lm_lr}]  # fmt: skip
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=0.01)
    warmup = max(1, round(0.05 * steps))

    def factor(step: int) -> float:  # LLaVA's schedule: linear warm-up, then cosine to zero
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    model, optimizer, schedule = accelerator.prepare(model, optimizer, schedule)
    done = 0
    marker = None if checkpoint is None else Path(checkpoint) / "step.txt"
    if marker is not None and marker.is_file():
        accelerator.load_state(checkpoint)
        done = int(marker.read_text())
    history = []
    model.train()
    with progress(steps, f"{spec.name} steps", completed=done) as bar:
        for step in range(done, steps):
            generator = torch.Generator().manual_seed(
                seed * 1_000_003 + step
            )  # modality dropout's draw
            loss, logs = training_loss(
                model, batches(step), spec, generator=generator, teacher=teacher
            )
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            schedule.step()
            history.append({"loss": float(loss.detach()), **logs})
            bar.advance(loss=history[-1]["loss"])
            if callback is not None:
                callback(step, model)
                model.train()
            if marker is not None and ((step + 1) % checkpoint_every == 0 or step + 1 == steps):
                accelerator.save_state(checkpoint)
                marker.write_text(str(step + 1))
    return history


def paired_batches(
    inputs: dict[str, torch.Tensor], encoded, batch_size: int, seed: int, *, key: str = "images",
    scene: torch.Tensor | None = None,
):  # fmt: skip
    """``batches(step)`` for :func:`fit`: ``batch_size`` paired rows drawn from (``seed``, step),
    so every system and a resumed run see the same batches; ``inputs`` per modality are the
    ``images`` or (``key="features"``) the frozen encoder's cached hidden states, row
    ``scene[i]`` for question ``i`` (default: row ``i``)."""
    count = len(encoded.input_ids)

    def batch(step: int) -> dict:
        rows = torch.randint(
            count, (batch_size,), generator=torch.Generator().manual_seed(seed * 1_000_003 + step)
        )
        where = rows if scene is None else scene[rows]
        return {key: {m: x[where] for m, x in inputs.items()}, "input_ids": encoded.input_ids[rows],
                "attention_mask": encoded.attention_mask[rows], "labels": encoded.labels[rows]}  # fmt: skip

    return batch


@torch.no_grad()
def accuracy_by_type(
    model: PrivilegedMLLM,
    modality: str,
    images: torch.Tensor | None,
    encoded,
    types: list[str],
    batch_size: int = 256,
    *,
    features: torch.Tensor | None = None,
) -> dict[str, float]:
    """Exact-match accuracy per question type of ``modality`` alone (and ``all``), from its
    ``images`` or cached ``features``."""
    from mixlab.vision_mm.mop.text import answer_hits

    model.eval()
    hits = []
    for start in range(0, len(encoded.input_ids), batch_size):
        rows = slice(start, start + batch_size)
        batch = {"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask,
                 "labels": encoded.labels}  # fmt: skip
        if features is None:
            batch["images"] = {modality: images}
        else:
            batch["features"] = {modality: features}
        out = _forward(model, batch, modality, rows, labels=False)
        hits.append(answer_hits(out.logits, encoded.labels[rows]))
    hits = torch.cat(hits).float()
    kinds = sorted(set(types))
    scores = {k: float(hits[[t == k for t in types]].mean()) for k in kinds}
    return {**scores, "all": float(hits.mean())}
