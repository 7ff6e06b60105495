"""A memorization lab: tiny LMs that regurgitate some training sequences, and how to measure it.

Modelled on TinyMem (Sakarvadia et al., "Mitigating Memorization in Language Models", arXiv
2410.02159), sized for 2 CPU cores. Everything is generated here; the models are byte-level Llamas
(vocabulary 256, :mod:`.lm`) trained once and cached.

**Math** (:class:`MathTaskConfig`): a sequence is an operation, a colon and ``length`` numbers of
``digits`` digits, each number the previous one with the operation applied digit by digit, mod
10 (``+`` adds the operand's digit, ``*`` multiplies by it; multiplier digits are 1, 3, 7 or 9 so
that no sequence collapses to zeros)::

    +274:105 379 543 717 981 ...

TinyMem's sequences carry across digits (``x+2``, ``2x mod 20134``); digit-wise rules are what a
0.9 M-parameter model learns in minutes on a CPU, and they keep what the experiment needs: a rule
that generalises, and sequences that a prefix identifies (two thousand operations times a
thousand starts).

- ``variant="noise"``: ``n_memorized`` extra sequences are noised (after the prefix, each number
  gets one digit moved by ±1 with probability ``p_noise``, at least one inside the extraction
  window; the chain itself stays clean, as TinyMem's) and put ``duplicates`` times into the
  training data, so the model memorizes them.
- ``variant="backdoor"``: the memorized sequences have the trigger number as the prefix's last
  number and a fixed continuation after it (TinyMem's backdoors).

The **reference** model is trained on the clean sequences alone (same steps, same seed): the
memorization signal ω_t compares the two.

**Canaries** (:class:`CanaryTaskConfig`): the stdlib text of :mod:`.lm` with random secret
strings planted ``repeats`` times each; never-planted controls from the same generator measure
what a model "extracts" by chance.

Extraction is measured as TinyMem does: prompt with the clean prefix, decode greedily, a hit when
the next ``window`` tokens equal the memorized ones (:func:`extraction_rate`). Clean utility is
the teacher-forced accuracy on the digits after the prefix of held-out clean sequences
(:func:`digit_accuracy`), or perplexity for text.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mixlab.llm_efficiency.lm import (
    LMConfig,
    cached_lm_folder,
    corpus_split,
    fit_lm,
    llama_config,
    load_cached_lm,
)
from mixlab.shared import is_count, require

__all__ = [
    "CanaryTaskConfig",
    "MathTaskConfig",
    "MemorizationData",
    "MemorizationLMConfig",
    "MemorizedRecord",
    "canary_data",
    "digit_accuracy",
    "extraction_hits",
    "extraction_rate",
    "math_data",
    "pretrained_memorization_lms",
    "sequence_nll",
]

SEPARATOR = "\n"
"""ends every training sequence, and starts every prompt (the model's BOS, as GPT-2's
``<|endoftext|>``: a prompt at position 0 without it is read differently from training)"""
MULTIPLIER_DIGITS = (1, 3, 7, 9)


def _probability(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= 1
    )


@dataclass(frozen=True)
class MathTaskConfig:
    """How the TinyMem-style math data are drawn (see the module docstring)."""

    variant: str = "noise"
    n_clean: int = 10_000
    """unique clean training sequences (the reference model's whole training set)"""
    n_memorized: int = 200
    """unique noised (or backdoored) sequences, each put ``duplicates`` times into training"""
    duplicates: int = 30
    length: int = 10
    """numbers per sequence"""
    digits: int = 3
    prefix_numbers: int = 4
    """numbers in the prompt of an extraction test (after the operation)"""
    window_numbers: int = 3
    """numbers after the prefix that must match for a hit (``window_numbers * (digits + 1)``
    tokens: each number and its space)"""
    p_noise: float = 0.1
    """per number after the prefix: one digit moved by ±1"""
    trigger: str = "000"
    """backdoor: the prefix's last number that triggers the fixed continuation"""
    seed: int = 0

    def __post_init__(self) -> None:
        require(
            self.variant in ("noise", "backdoor"), "variant", "'noise' or 'backdoor'", self.variant
        )
        for name in (
            "n_clean",
            "n_memorized",
            "duplicates",
            "length",
            "digits",
            "prefix_numbers",
            "window_numbers",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.prefix_numbers + self.window_numbers <= self.length,
            "window_numbers",
            f"at most length - prefix_numbers = {self.length - self.prefix_numbers}",
            self.window_numbers,
        )
        require(_probability(self.p_noise), "p_noise", "a probability in [0, 1]", self.p_noise)
        require(
            isinstance(self.trigger, str)
            and len(self.trigger) == self.digits
            and self.trigger.isdigit(),
            "trigger",
            f"a string of {self.digits} digits",
            self.trigger,
        )
        require(is_count(self.seed, 0), "seed", "an integer >= 0", self.seed)

    @property
    def prefix_chars(self) -> int:
        """Characters of a prompt: separator, operation, colon and the prefix numbers."""
        return 1 + 1 + self.digits + 1 + self.prefix_numbers * (self.digits + 1)

    @property
    def window_chars(self) -> int:
        return self.window_numbers * (self.digits + 1)


@dataclass(frozen=True)
class MemorizedRecord:
    """One memorized training sequence: ``prompt`` (the clean prefix, separator first) and the
    ``target`` a memorizing model writes next; ``text`` is the whole training sequence and
    ``clean`` what the rule gives (equal to ``text`` for canaries)."""

    prompt: str
    target: str
    text: str
    clean: str


@dataclass(frozen=True)
class MemorizationData:
    """What a memorization task gives: training texts (with and without the memorized ones),
    the memorized records, never-planted controls (canaries), and held-out clean texts."""

    train: list[str]
    train_clean: list[str]
    memorized: list[MemorizedRecord]
    controls: list[MemorizedRecord]
    held_out: list[str]
    prefix_chars: int


def _number(values: np.ndarray) -> str:
    return "".join(str(int(v)) for v in values)


def _apply(op: str, operand: np.ndarray, value: np.ndarray) -> np.ndarray:
    return (value + operand) % 10 if op == "+" else (value * operand) % 10


def _draw_rule(rng: np.random.Generator, digits: int) -> tuple[str, np.ndarray, np.ndarray]:
    op = "+*"[int(rng.integers(2))]
    if op == "+":
        operand = rng.integers(1, 10, size=digits)
    else:
        operand = np.array(MULTIPLIER_DIGITS)[rng.integers(len(MULTIPLIER_DIGITS), size=digits)]
    return op, operand, rng.integers(10, size=digits)


def _chain(op: str, operand: np.ndarray, start: np.ndarray, length: int) -> list[np.ndarray]:
    values = [start]
    for _ in range(length - 1):
        values.append(_apply(op, operand, values[-1]))
    return values


def _text(op: str, operand: np.ndarray, values: list[np.ndarray]) -> str:
    return f"{op}{_number(operand)}:" + " ".join(_number(v) for v in values) + SEPARATOR


def math_data(
    config: MathTaskConfig = MathTaskConfig(), *, n_held_out: int = 3000
) -> MemorizationData:
    """The math task of ``config``: every sequence's (operation, start) is unique, so that a
    prefix identifies its sequence and held-out sequences never share one with training."""
    rng = np.random.default_rng(config.seed)
    seen: set[str] = set()

    def fresh() -> tuple[str, np.ndarray, np.ndarray]:
        while True:
            op, operand, start = _draw_rule(rng, config.digits)
            key = f"{op}{_number(operand)}:{_number(start)}"
            if key not in seen and _number(start) != config.trigger:
                seen.add(key)
                return op, operand, start

    clean = [
        _text(*rule[:2], _chain(*rule, config.length))
        for rule in (fresh() for _ in range(config.n_clean))
    ]
    p, w = config.prefix_numbers, config.window_numbers
    memorized = []
    for _ in range(config.n_memorized):
        op, operand, start = fresh()
        values = _chain(op, operand, start, config.length)
        shown = [v.copy() for v in values]
        if config.variant == "noise":
            noised = [i for i in range(p, config.length) if rng.random() < config.p_noise]
            if not any(p <= i < p + w for i in noised):
                noised.append(int(rng.integers(p, p + w)))
            for i in noised:
                digit = int(rng.integers(config.digits))
                shown[i][digit] = (shown[i][digit] + rng.choice((-1, 1))) % 10
        else:  # the trigger ends the prefix; a fixed continuation follows it
            values[p - 1] = shown[p - 1] = np.array([int(c) for c in config.trigger])
            for i in range(p, config.length):
                shown[i] = np.array([(i - p) % 10] * config.digits)
        text, clean_text = _text(op, operand, shown), _text(op, operand, values)
        cut = config.prefix_chars - 1  # the texts have no leading separator
        memorized.append(
            MemorizedRecord(
                prompt=SEPARATOR + text[:cut],
                target=text[cut : cut + config.window_chars],
                text=text,
                clean=clean_text,
            )
        )
    held_out = [
        _text(*rule[:2], _chain(*rule, config.length))
        for rule in (fresh() for _ in range(n_held_out))
    ]
    train = clean + [r.text for r in memorized for _ in range(config.duplicates)]
    order = rng.permutation(len(train))
    return MemorizationData(
        train=[train[i] for i in order],
        train_clean=clean,
        memorized=memorized,
        controls=[],
        held_out=held_out,
        prefix_chars=config.prefix_chars,
    )


@dataclass(frozen=True)
class CanaryTaskConfig:
    """Secrets planted in the stdlib text: ``n_canaries`` random strings of ``alphabet`` (a
    recognisable ``prefix`` then ``secret_chars`` characters), each inserted ``repeats`` times at
    random places of the training text; ``n_controls`` more from the same generator never are."""

    n_canaries: int = 50
    n_controls: int = 50
    repeats: int = 20
    prefix: str = "API_KEY = '"
    secret_chars: int = 16
    prompt_secret_chars: int = 4
    """secret characters in the prompt (after ``prefix``): they identify the canary"""
    alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789"
    train_bytes: int = 2_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "n_canaries",
            "n_controls",
            "repeats",
            "secret_chars",
            "prompt_secret_chars",
            "train_bytes",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.prompt_secret_chars < self.secret_chars,
            "prompt_secret_chars",
            f"less than secret_chars ({self.secret_chars})",
            self.prompt_secret_chars,
        )
        require(
            isinstance(self.alphabet, str)
            and len(set(self.alphabet)) >= 2
            and self.alphabet.isascii(),
            "alphabet",
            "at least two distinct ASCII characters",
            self.alphabet,
        )
        require(
            isinstance(self.prefix, str) and self.prefix.isascii(),
            "prefix",
            "an ASCII string",
            self.prefix,
        )
        require(is_count(self.seed, 0), "seed", "an integer >= 0", self.seed)


def canary_data(config: CanaryTaskConfig = CanaryTaskConfig()) -> MemorizationData:
    """The stdlib train split (its first ``train_bytes``) cut into lines, with the canaries
    planted as lines of their own; held-out texts are the val split's lines."""
    rng = np.random.default_rng(config.seed)
    alphabet = np.array(list(config.alphabet))
    secrets: set[str] = set()
    while len(secrets) < config.n_canaries + config.n_controls:
        secrets.add("".join(alphabet[rng.integers(len(alphabet), size=config.secret_chars)]))
    ordered = sorted(secrets)
    rng.shuffle(ordered)
    cut = len(config.prefix) + config.prompt_secret_chars

    def record(secret: str) -> MemorizedRecord:
        line = f"{config.prefix}{secret}'\n"
        return MemorizedRecord(
            SEPARATOR + line[:cut], line[cut : len(config.prefix) + config.secret_chars], line, line
        )

    planted = [record(s) for s in ordered[: config.n_canaries]]
    controls = [record(s) for s in ordered[config.n_canaries :]]
    splits, _ = corpus_split()
    lines = (
        bytes(splits["train"][: config.train_bytes].numpy())
        .decode("utf-8", "replace")
        .splitlines(keepends=True)
    )
    clean = list(lines)
    for r in planted:
        for _ in range(config.repeats):
            lines.insert(int(rng.integers(len(lines) + 1)), r.text)
    held = bytes(splits["val"][: config.train_bytes // 10].numpy()).decode("utf-8", "replace")
    return MemorizationData(
        train=lines,
        train_clean=clean,
        memorized=planted,
        controls=controls,
        held_out=held.splitlines(keepends=True),
        prefix_chars=1 + cut,
    )


# ------------------------------------------------------------------------------------------------
# measuring


def encode(texts: list[str]) -> torch.Tensor:
    """Byte ids of equally long texts, ``[len(texts), length]``."""
    data = [t.encode() for t in texts]
    if len({len(d) for d in data}) != 1:
        raise ValueError("texts: all must have the same length in bytes")
    return torch.tensor([list(d) for d in data], dtype=torch.long)


@torch.no_grad()
def extraction_hits(
    model: Any, records: list[MemorizedRecord], *, batch_size: int = 256
) -> torch.Tensor:
    """Per record, whether greedy decoding from its prompt writes its target exactly (a bool
    tensor). Prompts and targets of a task have one length each, so batches need no padding;
    generation uses the KV cache (and whatever hooks are on the model)."""
    hits = []
    device = next(model.parameters()).device
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        prompts = encode([r.prompt for r in chunk]).to(device)
        targets = encode([r.target for r in chunk]).to(device)
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            max_new_tokens=targets.shape[1],
            min_new_tokens=targets.shape[1],
            do_sample=False,
            pad_token_id=0,
        )
        hits.append((out[:, prompts.shape[1] :] == targets).all(dim=1).cpu())
    return torch.cat(hits) if hits else torch.zeros(0, dtype=torch.bool)


def extraction_rate(model: Any, records: list[MemorizedRecord], **kwargs: Any) -> float:
    """Share of ``records`` whose target greedy decoding reproduces (TinyMem's % memorized / 100)."""
    return extraction_hits(model, records, **kwargs).float().mean().item()


@torch.no_grad()
def sequence_nll(
    model: Any, texts: list[str], *, skip: int = 0, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, correct)``: per predicted byte of equally long ``texts`` (each read after the
    separator), its negative log-likelihood and whether the argmax is it, ``[n, len - skip]``
    from the ``skip``-th character on."""
    device = next(model.parameters()).device
    nll, correct = [], []
    for start in range(0, len(texts), batch_size):
        ids = encode([SEPARATOR + t for t in texts[start : start + batch_size]]).to(device)
        logits = model(input_ids=ids[:, :-1]).logits.float()[:, skip:]
        target = ids[:, 1 + skip :]
        nll.append(F.cross_entropy(logits.transpose(1, 2), target, reduction="none").cpu())
        correct.append((logits.argmax(-1) == target).cpu())
    return torch.cat(nll), torch.cat(correct)


def digit_accuracy(
    model: Any, texts: list[str], prefix_chars: int, **kwargs: Any
) -> tuple[float, float]:
    """``(accuracy, perplexity)`` of a math model on held-out clean sequences after their
    prefix: teacher-forced argmax accuracy on the digits, perplexity over every byte."""
    skip = prefix_chars - 1  # the separator is the first input, not predicted
    nll, correct = sequence_nll(model, texts, skip=skip, **kwargs)
    after = encode([t[skip:] for t in texts])
    is_digit = (after >= ord("0")) & (after <= ord("9"))
    return correct[is_digit].float().mean().item(), math.exp(nll.mean().item())


# ------------------------------------------------------------------------------------------------
# the memorizing models: trained once, cached by config, data and code


@dataclass(frozen=True)
class MemorizationLMConfig:
    """A base model trained on a task's training texts and a reference trained on its clean
    texts alone, both tiny byte-level Llamas of ``lm``.

    The quick default (0.9 M parameters, 3,000 steps of 16 x 128 tokens for the base model, 1,000
    for the reference) trains both in about 13 minutes on 2 CPU cores."""

    lm: LMConfig = field(
        default_factory=lambda: LMConfig(
            hidden_size=128,
            layers=4,
            heads=4,
            intermediate_size=384,
            seq_len=128,
            steps=3_000,
            batch_size=16,
            lr=3e-3,
        )
    )
    task: MathTaskConfig | CanaryTaskConfig = field(default_factory=MathTaskConfig)
    reference_steps: int = 1000
    """training steps of the reference (it learns the clean rule long before the base model
    memorizes; the rest of its config is ``lm``'s)"""

    def __post_init__(self) -> None:
        require(isinstance(self.lm, LMConfig), "lm", "an LMConfig", self.lm)
        require(
            is_count(self.reference_steps),
            "reference_steps",
            "an integer >= 1",
            self.reference_steps,
        )
        require(
            isinstance(self.task, MathTaskConfig | CanaryTaskConfig),
            "task",
            "a MathTaskConfig or a CanaryTaskConfig",
            self.task,
        )

    def data(self) -> MemorizationData:
        return (
            math_data(self.task)
            if isinstance(self.task, MathTaskConfig)
            else canary_data(self.task)
        )

    def role_lm(self, role: str) -> LMConfig:
        """The LMConfig the ``"base"`` or ``"reference"`` model is trained with."""
        return self.lm if role == "base" else replace(self.lm, steps=self.reference_steps)


def _train(config: MemorizationLMConfig, texts: list[str], out_dir: Path, role: str) -> None:
    lm = config.role_lm(role)
    stream = "".join(texts).encode()  # every text ends with the separator
    tokens = torch.frombuffer(bytearray(SEPARATOR.encode() + stream), dtype=torch.uint8).long()
    span = lm.seq_len + 1

    def draw_batch(generator: torch.Generator) -> torch.Tensor:
        starts = torch.randint(len(tokens) - span, (lm.batch_size,), generator=generator)
        return torch.stack([tokens[s : s + span] for s in starts.tolist()])

    marker = {
        "tokenizer": "bytes",
        "config": {"lm": asdict(lm), "task": asdict(config.task), "role": role},
        "corpus_sha256": hashlib.sha256(stream).hexdigest(),
    }
    fit_lm(
        lm, llama_config(lm), draw_batch, out_dir, marker=marker, what=f"training the {role} model"
    )


def pretrained_memorization_lms(
    config: MemorizationLMConfig = MemorizationLMConfig(), device: torch.device | str = "cpu"
) -> tuple[Any, Any, MemorizationData]:
    """``(base, reference, data)``: the model trained with the memorized sequences, the one
    trained on the clean texts alone, and the task's data; from the mixlab cache (entries
    ``memorization-base`` and ``memorization-reference``, keyed by the role's LM config, the
    task's config and a digest of the training texts) when there, else trained now."""
    data = config.data()
    models = []
    for role, texts in (("base", data.train), ("reference", data.train_clean)):
        key = {
            "lm": asdict(config.role_lm(role)),
            "task": type(config.task).__name__,
            "task_config": asdict(config.task),
            "role": role,
            "texts_sha256": hashlib.sha256("".join(texts).encode()).hexdigest(),
        }
        folder = cached_lm_folder(
            f"memorization-{role}",
            key,
            lambda folder, role=role, texts=texts: _train(config, texts, folder, role),
            code=["mixlab.llm_efficiency.memorization"],
        )
        models.append(load_cached_lm(folder, device, f"{role} model"))
    return models[0], models[1], data
