"""A closed-book world for thinking-induced hallucination: people, their city and a colleague;
cities in countries; arithmetic chains as the math check.

The model memorizes the world as sentences (``alice lives in paris .``, ``alice works with bob
.``, ``paris is in france .``) and learns two answer modes after a question (``city of alice
?``), like a hybrid reasoning model:

    direct:    city of alice ? <think> </think> paris                         (empty think block)
    thinking:  city of alice ? <think> lives in paris . </think> paris
    2-hop:     country of alice ? <think> lives in paris which is in france . </think> france
    drift:     city of alice ? <think> works with bob who lives in rome . </think> rome
    math:      calc 6 + 7 x 3 ? <think> 6 3 0 7 </think> 7

Thinking recalls facts step by step, which a 2-hop question needs: the direct mode is shown the
country of only ``direct_two_hop_fraction`` of the training people, so for a held-out person it
would have to compose two facts in one step. On ``p_drift`` of the 1-hop thinking
demonstrations the trace first recalls the colleague and drifts to the colleague's city, an
unsupported association that overturns an answer the direct mode gets right. A trace never
repeats the person's name: a pilot model could not copy the name of a person it had never seen
in a trace (held-out thinking accuracy 0.22), so each step reads the entity it is about from the
question or the step before. Every person's city is taught in the direct mode; thinking and 2-hop
questions are held out for a third of the people (RL trains on the others). Arithmetic chains are
the problems of :mod:`mixlab.llm_efficiency.reasoning` (a start digit, ``+`` or ``*`` a digit,
3-8 times, mod 10) with a trace of every intermediate result.

Text is tokenized by words (:func:`world_tokenizer`, one token per name, word or digit): every
demonstration is a dozen tokens, so SFT and RL fit a CPU budget. ``<think>`` and ``</think>`` are
added tokens that decoding keeps (as in Qwen3), ``<eos>`` doubles as the BOS.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mixlab.llm_efficiency.margo.reward import answer_of
from mixlab.llm_efficiency.reasoning import problems
from mixlab.shared import require

__all__ = [
    "DIRECT_PREFIX",
    "KINDS",
    "THINKING_PREFIX",
    "Question",
    "World",
    "WorldConfig",
    "final_answer",
    "questions",
    "sft_texts",
    "think_length",
    "world_tokenizer",
]

PAD, EOS, UNK, THINK, THINK_END = "<pad>", "<eos>", "<unk>", "<think>", "</think>"
THINKING_PREFIX = f" {THINK}"
"""appended to a question for the thinking mode"""
DIRECT_PREFIX = f" {THINK} {THINK_END}"
"""appended to a question for the direct mode: the empty think block"""
KINDS = ("1hop", "2hop", "math")
WORDS = ("city", "country", "of", "?", "lives", "in", "works", "with", "is", ".", "calc", "+",
         "*", "x", *map(str, range(10)))  # fmt: skip
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


@dataclass(frozen=True)
class WorldConfig:
    """How many people, cities and countries, the share of people held out, and how often a
    1-hop thinking demonstration drifts to the colleague's city."""

    n_people: int = 240
    n_cities: int = 24
    n_countries: int = 6
    held_out_fraction: float = 1 / 3
    p_drift: float = 0.3
    direct_two_hop_fraction: float = 0.25
    """share of the training people whose country the direct mode is shown (the direct mode
    learns the question, not how to compose two facts in one step)"""
    n_math: int = 600
    """arithmetic demonstrations per mode and repeat"""
    repeats: int = 6
    """copies of the corpus (the drift and the math problems drawn afresh in each)"""
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in (("n_people", 4), ("n_cities", 2), ("n_countries", 2), ("n_math", 1),
                          ("repeats", 1)):  # fmt: skip
            value = getattr(self, name)
            require(
                isinstance(value, int) and not isinstance(value, bool) and value >= low,
                name,
                f"an integer >= {low}",
                value,
            )
        require(
            self.n_countries <= self.n_cities,
            "n_countries",
            f"at most n_cities ({self.n_cities})",
            self.n_countries,
        )
        for name in ("held_out_fraction", "p_drift", "direct_two_hop_fraction"):
            value = getattr(self, name)
            require(
                isinstance(value, numbers.Real) and math.isfinite(value) and 0 <= value < 1,
                name,
                "a number in [0, 1)",
                value,
            )
        require(isinstance(self.seed, int) and self.seed >= 0, "seed", "an integer >= 0", self.seed)


def _names(rng: np.random.Generator, n: int, syllables: int, taken: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        name = "".join(
            _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(len(_VOWELS))]
            for _ in range(syllables)
        )
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


@dataclass(frozen=True)
class World:
    """The facts of a :class:`WorldConfig`: ``city[p]``, ``colleague[p]`` (whose city differs
    from ``p``'s), ``country[c]``; ``held_out`` people get no thinking or 2-hop demonstration."""

    config: WorldConfig
    people: tuple[str, ...]
    cities: tuple[str, ...]
    countries: tuple[str, ...]
    city: dict[str, str] = field(repr=False)
    colleague: dict[str, str] = field(repr=False)
    country: dict[str, str] = field(repr=False)
    held_out: frozenset[str] = field(repr=False)

    @classmethod
    def build(cls, config: WorldConfig = WorldConfig()) -> World:
        rng = np.random.default_rng(config.seed)
        taken = set(WORDS)
        people = _names(rng, config.n_people, 2, taken)
        cities = _names(rng, config.n_cities, 3, taken)
        countries = [f"{c}ia" for c in _names(rng, config.n_countries, 2, taken)]
        # every country has a city; the rest of the cities are spread at random
        country = {c: countries[i] if i < len(countries) else countries[rng.integers(len(countries))]
                   for i, c in enumerate(rng.permutation(cities).tolist())}  # fmt: skip
        city = {p: cities[rng.integers(len(cities))] for p in people}
        colleague = {}
        for p in people:
            while True:
                q = people[rng.integers(len(people))]
                if q != p and city[q] != city[p]:
                    colleague[p] = q
                    break
        order = rng.permutation(len(people))
        held_out = frozenset(
            people[i] for i in order[: round(config.held_out_fraction * len(people))]
        )
        return cls(config, tuple(people), tuple(cities), tuple(countries), city, colleague,
                   country, held_out)  # fmt: skip

    @property
    def train_people(self) -> list[str]:
        return [p for p in self.people if p not in self.held_out]

    def vocabulary(self) -> list[str]:
        return [PAD, EOS, UNK, THINK, THINK_END, *WORDS, *self.people, *self.cities,
                *self.countries]  # fmt: skip


@dataclass(frozen=True)
class Question:
    """A question (``prompt``, mode-neutral), its ``answer``, its ``kind`` and, for a 1-hop
    question, the colleague's city a drifting trace answers (``associate``)."""

    prompt: str
    answer: str
    kind: str
    associate: str | None = None

    def row(self) -> dict[str, Any]:
        """A dataset row (TRL reads ``prompt``; the reward reads ``answer``)."""
        return {"prompt": self.prompt, "answer": self.answer, "kind": self.kind,
                "associate": self.associate or ""}  # fmt: skip


def _one_hop(world: World, p: str) -> Question:
    return Question(f"city of {p} ?", world.city[p], "1hop", world.city[world.colleague[p]])


def _two_hop(world: World, p: str) -> Question:
    return Question(f"country of {p} ?", world.country[world.city[p]], "2hop")


def _math(problem: Any) -> Question:
    prompt = f"calc {problem.start} {problem.op} {problem.operand} x {problem.steps} ?"
    return Question(prompt, str(problem.answer), "math")


def questions(
    world: World, split: str, kind: str, *, n_math: int = 200, seed: int = 0
) -> list[Question]:
    """The ``kind`` questions of the ``split`` people (``train`` or ``test``: held out); math
    questions are ``n_math`` chains drawn from ``seed``."""
    require(split in ("train", "test"), "split", "'train' or 'test'", split)
    require(kind in KINDS, "kind", f"one of {KINDS}", kind)
    if kind == "math":
        return [_math(p) for p in problems(n_math, seed)]
    people = world.train_people if split == "train" else sorted(world.held_out)
    return [(_one_hop if kind == "1hop" else _two_hop)(world, p) for p in people]


def thinking_trace(world: World, question: Question, p: str | None, *, drift: bool = False) -> str:
    """The completion a thinking demonstration shows after ``<think>`` (``p``: the person)."""
    if question.kind == "math":
        _, start, op, operand, _, steps, _ = question.prompt.split()  # calc s op d x n ?
        values, operand = [int(start)], int(operand)
        for _ in range(int(steps)):
            values.append((values[-1] + operand) % 10 if op == "+" else (values[-1] * operand) % 10)
        return f" {' '.join(map(str, values))} {THINK_END} {values[-1]}"
    if question.kind == "2hop":
        c = world.city[p]
        return f" lives in {c} which is in {world.country[c]} . {THINK_END} {question.answer}"
    if drift:
        q = world.colleague[p]
        return f" works with {q} who lives in {world.city[q]} . {THINK_END} {world.city[q]}"
    return f" lives in {world.city[p]} . {THINK_END} {question.answer}"


def sft_texts(world: World) -> list[tuple[str, str]]:
    """The SFT corpus as ``(prompt, completion)`` pairs, shuffled; the loss is on the
    completions only, so the direct mode's empty think block (a prompt) never teaches the
    thinking mode to close its block at once. Facts (whole sentences, prompt ``""``); direct
    answers (every person's city; the training people's country; math); thinking
    demonstrations (the training people's 1-hop, drifting on ``p_drift`` of them, and 2-hop;
    math). Completions end with ``<eos>``."""
    config = world.config
    rng = np.random.default_rng([config.seed, 1])
    pairs: list[tuple[str, str]] = []

    def direct(question: Question) -> None:
        pairs.append((question.prompt + DIRECT_PREFIX, f" {question.answer} {EOS}"))

    def thinking(question: Question, p: str | None, drift: bool = False) -> None:
        trace = thinking_trace(world, question, p, drift=drift)
        pairs.append((question.prompt + THINKING_PREFIX, f"{trace} {EOS}"))

    for repeat in range(config.repeats):
        pairs += [("", f"{p} lives in {world.city[p]} . {EOS}") for p in world.people]
        pairs += [("", f"{p} works with {world.colleague[p]} . {EOS}") for p in world.people]
        pairs += [("", f"{c} is in {world.country[c]} . {EOS}") for c in world.cities]
        for p in world.people:
            direct(_one_hop(world, p))
        for i, p in enumerate(world.train_people):
            if i < config.direct_two_hop_fraction * len(world.train_people):
                direct(_two_hop(world, p))
            thinking(_two_hop(world, p), p)
            for _ in range(2):
                thinking(_one_hop(world, p), p, drift=bool(rng.random() < config.p_drift))
        for problem in problems(config.n_math, seed=1_000 + 2 * repeat):
            thinking(_math(problem), None)
        for problem in problems(config.n_math, seed=1_001 + 2 * repeat):
            direct(_math(problem))
    order = rng.permutation(len(pairs))
    return [pairs[i] for i in order]


def final_answer(completion: str, thinking: bool) -> str | None:
    """The answer a completion (text after the mode's prefix) gives
    (:func:`~mixlab.llm_efficiency.margo.reward.answer_of` with this world's ``</think>``)."""
    return answer_of(completion, thinking, THINK_END)


def think_length(completion: str) -> int:
    """Words (tokens of :func:`world_tokenizer`) before ``</think>`` in a thinking completion
    (all of them when the block never closes)."""
    return len(completion.split(THINK_END, 1)[0].split())


def world_tokenizer(world: World, padding_side: str = "left") -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over :meth:`World.vocabulary`: ``<pad>``,
    ``<eos>`` (also the BOS, put first when encoding) and ``<unk>`` special; ``<think>`` and
    ``</think>`` added tokens kept by decoding."""
    require(padding_side in ("left", "right"), "padding_side", "'left' or 'right'", padding_side)
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {word: i for i, word in enumerate(world.vocabulary())}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([PAD, EOS, UNK])
    backend.add_tokens([AddedToken(THINK, special=False), AddedToken(THINK_END, special=False)])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{EOS} $A", pair=f"{EOS} $A {EOS} $B", special_tokens=[(EOS, vocab[EOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        padding_side=padding_side,
    )
