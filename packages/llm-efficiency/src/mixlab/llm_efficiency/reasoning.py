"""A reasoning toy: mod-10 chains with a think scratchpad, for early-exit and other LLM methods.

A problem is a start digit, an operation (``+`` or ``*`` a digit) and how many times to apply
it (3–8); every result is taken mod 10::

    6 +7 x3 =                                 the prompt: 6, then 3, 0, 7 (each +7, mod 10)

A trace is the prompt, ``<think>``, a scratchpad, ``</think>``, a space, the answer digit and
``<eos>``. Each derivation in the scratchpad restates the start as ``<start>.``, then each step
as ``<step number>:<result>.`` and ends with ``answer=<digit>.``::

    6 +7 x3 = <think>6.1:4.wait 1:3.2:0.3:7.answer=7.hmm 6.1:3.2:0.3:8.answer=8.</think> 8<eos>
                       ^ wrong, then corrected  ^ first answer ^ overthinking round, a wrong step

Every value a step needs is local (the previous result, the step number) or the one operation
and count of the prompt, found by what surrounds them (the only ``+``/``*`` and the digits after
``x``). A 0.9 M-parameter Llama learns that within its training budget; in pilots of 2,000–3,000
steps it learned no lookup that depends on the current step (keyed steps ``a5 b8`` whose operand
follows the key the model just wrote: first answer at chance after 1,650 of 3,000 steps).

Every wrong result is the right one plus 1 (mod 10), one systematic slip, so that it keeps its
probability when sampling below temperature 1.

- **Main-line errors** (``p_step_error`` per step): a wrong result that the chain carries on from.
- **Productive self-corrections** (``p_correction`` per step): a wrong result, ``wait ``, then
  the same step done right (a benign transition before the first answer).
- **Overthinking** (``p_overthink``): after each stated answer, another round starts with this
  probability (at most ``max_rounds``): a transition word (``wait ``/``hmm ``) and a
  re-derivation from the start whose steps err with ``p_overthink_error``, so it can flip the
  answer. The final answer is the last stated one.
- **Cut traces** (``p_cut``, traces with overthinking only): the scratchpad ends at a step or
  answer boundary inside the overthinking, closed by ``</think>`` and the last stated answer, so
  a model learns that a forced ``</think>`` is followed by the last answer it stated.

The tokenizer (:func:`reasoning_tokenizer`) keeps ids 0–255 as the bytes (as :mod:`.lm`) and adds
``<pad>`` 256, ``<eos>`` 257, ``<think>`` 258, ``</think>`` 259. ``<eos>`` is also the BOS (as
GPT-2's ``<|endoftext|>``): training packs traces after one another, so every trace follows an
``<eos>``, and encoding a prompt puts one before it to match (a model without it, at position 0,
misread the prompt in a pilot: first-answer accuracy 0.36 instead of 0.82).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mixlab.llm_efficiency.lm import (
    LMConfig,
    cached_lm_folder,
    fit_lm,
    llama_config,
    load_cached_lm,
)
from mixlab.shared import require

__all__ = [
    "EOS",
    "PAD",
    "SPECIAL_TOKENS",
    "THINK",
    "THINK_END",
    "Problem",
    "ReasoningLMConfig",
    "Trace",
    "TraceConfig",
    "cached_text_lm",
    "fit_text_lm",
    "generate_trace",
    "generate_traces",
    "pack_traces",
    "parse_answer",
    "pretrained_reasoning_lm",
    "problems",
    "reasoning_tokenizer",
    "train_reasoning_lm",
]

PAD, EOS, THINK, THINK_END = "<pad>", "<eos>", "<think>", "</think>"
SPECIAL_TOKENS = (PAD, EOS, THINK, THINK_END)
"""ids 256, 257, 258, 259, in this order"""
MAX_STEPS = 99
OPS = "+*"  # with "-" too, a pilot model applied the opposite sign on a fifth of its steps
CORRECTION = "wait "


# ------------------------------------------------------------------------------------------------
# tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for every byte (what ``ByteLevel`` works on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def reasoning_tokenizer(padding_side: str = "left") -> Any:
    """A byte-level ``PreTrainedTokenizerFast`` built locally: ids 0–255 are the bytes, then
    ``<pad>``, ``<eos>``, ``<think>``, ``</think>`` (256–259) as single special tokens. Encoding
    puts ``<eos>`` first as the BOS (not with ``add_special_tokens=False``); decoding with
    ``skip_special_tokens=False`` gives back the exact text after it. ``padding_side``: ``"left"`` (for
    batched generation) or ``"right"``."""
    require(padding_side in ("left", "right"), "padding_side", "'left' or 'right'", padding_side)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {char: b for b, char in _bytes_to_unicode().items()}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))  # appended in order: 256, 257, 258, 259
    eos_id = backend.token_to_id(EOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", pair=f"{EOS} $A {EOS} $B", special_tokens=[(EOS, eos_id)]
    )  # add_special_tokens=True (the default) puts the BOS <eos> first
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=EOS,
        additional_special_tokens=[THINK, THINK_END],
        clean_up_tokenization_spaces=False,
        padding_side=padding_side,
    )


def _token_count(text: str) -> int:
    """How many tokens :func:`reasoning_tokenizer` gives ``text`` (bytes, specials count one)."""
    count = len(text.encode())
    for special in SPECIAL_TOKENS:
        count -= text.count(special) * (len(special) - 1)
    return count


# ------------------------------------------------------------------------------------------------
# problems and traces


@dataclass(frozen=True)
class TraceConfig:
    """How traces are drawn. Probabilities are per main-line step (errors, corrections), per
    stated answer (another overthinking round), per re-derivation step (overthinking errors)
    and per trace with overthinking (a cut)."""

    min_steps: int = 3
    max_steps: int = 8  # at most 99
    p_step_error: float = 0.005
    p_correction: float = 0.15
    p_overthink: float = 0.6
    p_overthink_error: float = 0.15
    max_rounds: int = 3
    p_cut: float = 0.2
    transitions: tuple[str, ...] = ("wait", "hmm")  # words that open an overthinking round

    def __post_init__(self) -> None:
        def integer(value: object) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        require(
            integer(self.min_steps) and self.min_steps >= 1,
            "min_steps",
            "an integer >= 1",
            self.min_steps,
        )
        require(
            integer(self.max_steps) and self.min_steps <= self.max_steps <= MAX_STEPS,
            "max_steps",
            f"an integer from min_steps ({self.min_steps}) to {MAX_STEPS}",
            self.max_steps,
        )
        for name in ("p_step_error", "p_correction", "p_overthink", "p_overthink_error", "p_cut"):
            value = getattr(self, name)
            require(
                isinstance(value, numbers.Real)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and 0 <= value <= 1,
                name,
                "a probability in [0, 1]",
                value,
            )
        require(
            self.p_step_error + self.p_correction <= 1,
            "p_correction",
            f"at most 1 - p_step_error = {1 - self.p_step_error}",
            self.p_correction,
        )
        require(
            integer(self.max_rounds) and self.max_rounds >= 0,
            "max_rounds",
            "an integer >= 0",
            self.max_rounds,
        )
        require(
            isinstance(self.transitions, tuple)
            and len(self.transitions) >= 1
            and all(
                isinstance(w, str) and re.fullmatch(r"[a-z]+", w) and not w.startswith("answer")
                for w in self.transitions
            ),
            "transitions",
            "a non-empty tuple of lowercase words (a-z)",
            self.transitions,
        )


@dataclass(frozen=True)
class Problem:
    """A chain: ``start``, then ``op`` ``operand`` applied ``steps`` times, mod 10."""

    start: int
    op: str
    operand: int
    steps: int

    @property
    def prompt(self) -> str:
        """``"6 +7 x3 ="``"""
        return f"{self.start} {self.op}{self.operand} x{self.steps} ="

    @property
    def model_input(self) -> str:
        """What a model is given to generate from: the prompt, a space and ``<think>``."""
        return f"{self.prompt} {THINK}"

    @property
    def answer(self) -> int:
        value = self.start
        for _ in range(self.steps):
            value = self.apply(value)
        return value

    def apply(self, value: int) -> int:
        """One step: ``value op operand`` mod 10."""
        if self.op == "+":
            return (value + self.operand) % 10
        if self.op == "-":
            return (value - self.operand) % 10
        return (value * self.operand) % 10


@dataclass(frozen=True)
class Trace:
    """One generated trace and what an experiment needs to know about it.

    Character indices are into ``text``; token indices count :func:`reasoning_tokenizer` tokens
    of ``text`` (a special token is one). ``exit_char``/``exit_token`` are just after the first
    ``answer=<digit>.``: where to force ``</think>`` to get the first stated answer."""

    text: str
    problem: Problem
    answer: int  # the correct answer
    first_answer: int  # the first stated answer=
    final_answer: int  # the digit after </think>
    productive_wait: bool  # a main-line wrong step followed by "wait " and its correction
    rounds: int  # overthinking rounds in the text (started, possibly cut)
    cut: bool  # closed early at a step inside the overthinking
    first_answer_char: int  # where the first "answer=" starts
    first_answer_token: int
    exit_char: int
    exit_token: int
    error_chars: tuple[int, ...]  # where each deliberately wrong step starts

    @property
    def prompt(self) -> str:
        return self.problem.prompt


def _problem(rng: np.random.Generator, min_steps: int, max_steps: int) -> Problem:
    steps = int(rng.integers(min_steps, max_steps + 1))
    op = OPS[int(rng.integers(len(OPS)))]
    return Problem(int(rng.integers(10)), op, int(rng.integers(10)), steps)


def problems(n: int, seed: int, *, min_steps: int = 3, max_steps: int = 8) -> list[Problem]:
    """``n`` evaluation problems (``.prompt``, ``.model_input``, ``.answer``), seeded."""
    require(isinstance(n, int) and n >= 0, "n", "an integer >= 0", n)
    config = TraceConfig(min_steps=min_steps, max_steps=max_steps)  # validates the lengths
    rng = np.random.default_rng(seed)
    return [_problem(rng, config.min_steps, config.max_steps) for _ in range(n)]


def _wrong(right: int) -> int:
    """The one systematic slip: the right result plus 1 (mod 10). A slip spread over nine wrong
    digits is what sampling below temperature 1 suppresses (each is unlikely); one slip keeps its
    probability, so corrections and harmful overthinking survive the temperature the experiment
    samples at."""
    return (right + 1) % 10


def generate_trace(rng: np.random.Generator, config: TraceConfig = TraceConfig()) -> Trace:
    """One trace drawn with ``rng`` (see the module docstring for the format)."""
    problem = _problem(rng, config.min_steps, config.max_steps)
    scratch = f"{problem.prompt} {THINK}"
    errors: list[int] = []  # where each wrong step starts
    step_ends: list[int] = []

    def derive(p_error: float, p_correction: float) -> tuple[int, bool]:
        nonlocal scratch
        value, corrected = problem.start, False
        scratch += f"{value}."
        for step in range(1, problem.steps + 1):
            right = problem.apply(value)
            u = rng.random()
            if u < p_error + p_correction:
                wrong = _wrong(right)
                errors.append(len(scratch))
                scratch += f"{step}:{wrong}."
                if u < p_error:
                    right = wrong  # a main-line error: the chain carries on from it
                else:  # a productive self-correction
                    scratch += f"{CORRECTION}{step}:{right}."
                    corrected = True
            else:
                scratch += f"{step}:{right}."
            step_ends.append(len(scratch))
            value = right
        return value, corrected

    first, productive_wait = derive(config.p_step_error, config.p_correction)
    first_answer_char = len(scratch)
    scratch += f"answer={first}."
    exit_char = len(scratch)
    stated, rounds = first, 0
    cuts: list[tuple[int, int, int]] = []  # (end, last stated answer, rounds) inside overthinking
    while rounds < config.max_rounds and rng.random() < config.p_overthink:
        if rounds:
            cuts.append((len(scratch), stated, rounds))  # right after a re-derived answer
        rounds += 1
        scratch += f"{config.transitions[int(rng.integers(len(config.transitions)))]} "
        step_ends.clear()
        value, _ = derive(config.p_overthink_error, 0.0)
        cuts += [(end, stated, rounds) for end in step_ends]
        scratch += f"answer={value}."
        stated = value
    cut = rounds > 0 and rng.random() < config.p_cut
    if cut:  # close at a step or answer boundary inside the overthinking (not the natural end)
        end, stated, rounds = cuts[int(rng.integers(len(cuts)))]
        scratch = scratch[:end]
        errors = [e for e in errors if e < end]
    text = f"{scratch}{THINK_END} {stated}{EOS}"
    return Trace(
        text=text,
        problem=problem,
        answer=problem.answer,
        first_answer=first,
        final_answer=stated,
        productive_wait=productive_wait,
        rounds=rounds,
        cut=cut,
        first_answer_char=first_answer_char,
        first_answer_token=_token_count(text[:first_answer_char]),
        exit_char=exit_char,
        exit_token=_token_count(text[:exit_char]),
        error_chars=tuple(errors),
    )


def generate_traces(n: int, seed: int, config: TraceConfig = TraceConfig()) -> list[Trace]:
    """``n`` traces from ``numpy.random.default_rng(seed)``: the same seed, the same traces."""
    require(isinstance(n, int) and n >= 0, "n", "an integer >= 0", n)
    rng = np.random.default_rng(seed)
    return [generate_trace(rng, config) for _ in range(n)]


def parse_answer(text_after_think_end: str) -> int | None:
    """The answer digit a model wrote after ``</think>`` (leading spaces skipped), else None."""
    match = re.match(r"\s*(\d)", text_after_think_end)
    return int(match.group(1)) if match else None


# ------------------------------------------------------------------------------------------------
# training data


def pack_traces(traces: list[Trace] | list[str], tokenizer: Any, seq_len: int) -> torch.Tensor:
    """Token ids of the traces' texts, concatenated (each ends with ``<eos>``) and cut into
    ``[blocks, seq_len]`` rows (a LongTensor); the tail shorter than a block is dropped. For
    next-token training on ``seq_len`` inputs, pass ``seq_len + 1``."""
    require(isinstance(seq_len, int) and seq_len >= 1, "seq_len", "an integer >= 1", seq_len)
    texts = [t.text if isinstance(t, Trace) else t for t in traces]
    ids = [i for row in tokenizer(texts, add_special_tokens=False)["input_ids"] for i in row]
    if len(ids) < seq_len:
        raise ValueError(
            f"the traces hold {len(ids)} tokens: at least seq_len = {seq_len} needed for a block"
        )
    blocks = len(ids) // seq_len
    return torch.tensor(ids[: blocks * seq_len], dtype=torch.long).view(blocks, seq_len)


# ------------------------------------------------------------------------------------------------
# the reasoning LM: trained once on generated traces, cached by config and code


@dataclass(frozen=True)
class ReasoningLMConfig:
    """A tiny Llama trained on ``n_traces`` traces of ``traces`` (drawn from seed ``lm.seed``).

    The defaults (about 0.9 M parameters, 3,000 steps of 8 × 256 tokens) train in about 14
    minutes on 2 CPU cores; tests pass smaller ones."""

    lm: LMConfig = field(
        default_factory=lambda: LMConfig(
            hidden_size=128,
            layers=4,
            heads=4,
            intermediate_size=384,
            seq_len=256,
            steps=3_000,
            batch_size=8,
            lr=3e-3,
        )
    )
    traces: TraceConfig = field(default_factory=TraceConfig)
    n_traces: int = 20_000

    def __post_init__(self) -> None:
        require(isinstance(self.lm, LMConfig), "lm", "an LMConfig", self.lm)
        require(isinstance(self.traces, TraceConfig), "traces", "a TraceConfig", self.traces)
        require(
            isinstance(self.n_traces, int) and not isinstance(self.n_traces, bool)
            and self.n_traces >= 1,
            "n_traces",
            "an integer >= 1",
            self.n_traces,
        )  # fmt: skip


def train_reasoning_lm(
    config: ReasoningLMConfig, out_dir: str | Path, *, resume: bool = True
) -> Any:
    """Train the reasoning LM of ``config`` on its generated traces and save it with its
    tokenizer to ``out_dir`` (:func:`fit_text_lm`). Returns the model in eval mode."""
    traces = generate_traces(config.n_traces, config.lm.seed, config.traces)
    return fit_text_lm(
        config.lm,
        [t.text for t in traces],
        out_dir,
        marker={"tokenizer": "reasoning", "config": asdict(config)},
        resume=resume,
        what="training the reasoning LM",
    )


def _pack_pairs(
    pairs: list[tuple[str, str]], tokenizer: Any, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pack_traces` of ``prompt + completion`` texts, and the same blocks as targets with
    -100 at the prompt tokens (which train nothing)."""
    ids: list[int] = []
    targets: list[int] = []
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    completions = tokenizer([c for _, c in pairs], add_special_tokens=False)["input_ids"]
    for prompt, completion in zip(prompts, completions, strict=True):
        ids += prompt + completion
        targets += [-100] * len(prompt) + completion
    if len(ids) < seq_len:
        raise ValueError(
            f"the texts hold {len(ids)} tokens: at least seq_len = {seq_len} needed for a block"
        )
    blocks = len(ids) // seq_len
    shape = (blocks, seq_len)
    return (
        torch.tensor(ids[: blocks * seq_len], dtype=torch.long).view(shape),
        torch.tensor(targets[: blocks * seq_len], dtype=torch.long).view(shape),
    )


def fit_text_lm(
    config: LMConfig,
    texts: list[str] | list[tuple[str, str]],
    out_dir: str | Path,
    *,
    marker: dict[str, Any],
    resume: bool = True,
    what: str = "training a tiny LM",
    tokenizer: Any = None,
) -> Any:
    """Train a tiny Llama with ``tokenizer`` (default :func:`reasoning_tokenizer`) on ``texts``
    (each should end with the tokenizer's end token; ``(prompt, completion)`` pairs train
    only on the completion's tokens; packed into blocks of ``config.seq_len + 1`` tokens, rows drawn at random) and
    save it with the tokenizer to ``out_dir`` through :func:`mixlab.llm_efficiency.lm.fit_lm`
    (checkpoints, resume, a marker over the saved files: ``marker`` plus a digest of the
    blocks). Returns the model in eval mode."""
    tokenizer = reasoning_tokenizer() if tokenizer is None else tokenizer
    if texts and isinstance(texts[0], tuple):
        blocks, targets = _pack_pairs(texts, tokenizer, config.seq_len + 1)
    else:
        blocks = targets = pack_traces(texts, tokenizer, config.seq_len + 1)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)  # before training: the marker covers its files too

    def draw_batch(generator: torch.Generator) -> Any:
        rows = torch.randint(len(blocks), (config.batch_size,), generator=generator)
        return blocks[rows] if targets is blocks else (blocks[rows], targets[rows])

    model_config = llama_config(
        config,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    digest = hashlib.sha256(blocks.numpy().tobytes()).hexdigest()
    if targets is not blocks:  # the loss mask is part of the corpus
        digest = hashlib.sha256((digest + str(targets.eq(-100).sum().item())).encode()).hexdigest()
    return fit_lm(
        config,
        model_config,
        draw_batch,
        out_dir,
        marker={**marker, "corpus_sha256": digest},
        resume=resume,
        what=what,
    )


def cached_text_lm(
    name: str,
    key: Mapping[str, Any],
    train: Callable[[Path], Any],
    *,
    code: Iterable[str] = (),
    device: torch.device | str = "cpu",
    tokenizer: Any = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the mixlab cache entry ``name`` for ``key`` (the configs that
    shape it), trained there first by ``train(folder)`` when absent; the entry is also keyed by
    the source of this module, of :data:`~mixlab.llm_efficiency.lm.LM_CODE` and of ``code`` (the
    modules that write its texts). ``tokenizer`` defaults to :func:`reasoning_tokenizer`. A
    damaged cached model raises :class:`~mixlab.shared.files.CheckpointError` naming the folder
    to delete."""
    folder = cached_lm_folder(name, key, train, code=[__name__, *code])
    model = load_cached_lm(folder, device)
    return model, reasoning_tokenizer() if tokenizer is None else tokenizer


def pretrained_reasoning_lm(
    config: ReasoningLMConfig = ReasoningLMConfig(), device: torch.device | str = "cpu"
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of ``config``, from the mixlab cache (entry ``reasoning-llama``)
    when there, else trained now."""
    return cached_text_lm(
        "reasoning-llama",
        asdict(config),
        lambda folder: train_reasoning_lm(config, folder, resume=True),
        device=device,
    )
