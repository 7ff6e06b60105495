"""Exact-match reward for mixed-mode rollouts (no TRL import: the world and the CLI use it)."""

from __future__ import annotations

from typing import Any

__all__ = ["ExactMatch", "answer_of"]


def answer_of(completion: str, thinking: bool, think_end: str = "</think>") -> str | None:
    """The final answer of a completion (the text generated after the mode's prompt): what
    follows the last ``think_end``, stripped. A thinking completion that never closes its think
    block has none; a direct one is its whole text."""
    if think_end in completion:
        return completion.rsplit(think_end, 1)[1].strip()
    return None if thinking else completion.strip()


def _text(completion: Any) -> str:
    """A completion's text: plain, or the last message of a conversational one."""
    if isinstance(completion, list):
        return str(completion[-1]["content"]) if completion else ""
    return str(completion)


class ExactMatch:
    """A TRL reward function: 1.0 when a completion's final answer (:func:`answer_of`) equals
    the dataset's ``answer`` column (both stripped), else 0.0. Reads each rollout's ``mode``
    (``"thinking"`` or ``"direct"``, passed by :class:`~.trainer.MARGOTrainer`; thinking when
    absent), so that an unfinished thought earns nothing."""

    __name__ = "exact_match"  # TRL names the logged reward after it

    def __init__(self, think_end: str = "</think>") -> None:
        self.think_end = think_end

    def __call__(
        self, prompts: list[Any], completions: list[Any], answer: list[Any],
        mode: list[str] | None = None, **kwargs: Any,
    ) -> list[float]:  # fmt: skip
        modes = mode if mode is not None else ["thinking"] * len(completions)
        return [
            float(answer_of(_text(c), m == "thinking", self.think_end) == str(a).strip())
            for c, a, m in zip(completions, answer, modes, strict=True)
        ]
