"""Run early-exit methods on a batch of prompts and measure them the same way.

:func:`make_processor` builds any method from its name and parameters (``"vanilla"`` is plain
``generate``); :func:`generate_all` runs one method over prompts in left-padded batches, one
``generate`` call per batch, with the same sampling seed for every method, and returns per
prompt the text after the prompt, think tokens, generated tokens, probe tokens, the exit step
and the batch's wall time share.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mixlab.llm_efficiency.rpdi_ee.baselines import (
    DEERExitProcessor,
    DynasorExitProcessor,
    EATExitProcessor,
    FixedBudgetProcessor,
)
from mixlab.llm_efficiency.rpdi_ee.processor import (
    RPDIExitProcessor,
    ThinkExitProcessor,
    encode_text,
)
from mixlab.shared import progress

METHODS = ("vanilla", "budget", "rpdi", "deer", "dynasor", "eat")
"""method names :func:`make_processor` knows"""
PARAMETERS = {
    "vanilla": (),
    "budget": ("budget",),
    "rpdi": ("window", "threshold", "min_steps", "variant", "check_at"),
    "deer": ("threshold", "answer_tokens"),
    "dynasor": ("interval", "agree", "answer_tokens"),
    "eat": ("interval", "threshold", "alpha", "min_probes"),
}
"""the parameters each method takes (all optional but ``budget``'s)"""


class _DecodingSteps:
    """A ``generate`` streamer that advances ``bar`` at each decoding step (``generate`` hands
    it the prompt first, then each step's new tokens)."""

    def __init__(self, bar: Any) -> None:
        self.bar, self.steps, self.prompt = bar, 0, True

    def put(self, value: torch.Tensor) -> None:
        if self.prompt:
            self.prompt = False
            return
        self.steps += 1
        self.bar.advance()

    def end(self) -> None:
        pass


def make_processor(
    method: str,
    params: dict[str, Any],
    model: Any,
    tokenizer: Any,
    *,
    think_end: str = "</think>",
    think_start: str | None = "<think>",
    answer_prompt: str | None = None,
    transitions: Sequence[str] = ("wait ",),
) -> ThinkExitProcessor | None:
    """The processor of ``method`` with ``params`` (None for ``"vanilla"``). ``answer_prompt``:
    what probing methods decode a trial answer after (default: the think end);
    ``transitions``: the words DEER probes at (text, as the model writes them)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    unknown = set(params) - set(PARAMETERS[method])
    if unknown:
        raise ValueError(
            f"{method} takes the parameters {list(PARAMETERS[method])}, got {sorted(unknown)}"
        )
    if method == "vanilla":
        return None
    if method == "budget":
        if "budget" not in params:
            raise ValueError("budget needs its parameter 'budget' (think tokens)")
        return FixedBudgetProcessor.from_tokenizer(tokenizer, think_end, think_start, **params)
    if method == "rpdi":
        params = dict(params)
        check_at = params.pop("check_at", "every")
        return RPDIExitProcessor.from_tokenizer(
            tokenizer, think_end, think_start, check_at=check_at, **params
        )
    kwargs = dict(params, answer_prompt=answer_prompt)
    if method == "deer":
        kwargs["transition_ids"] = [encode_text(tokenizer, w, "transitions") for w in transitions]
        cls = DEERExitProcessor
    else:
        cls = DynasorExitProcessor if method == "dynasor" else EATExitProcessor
    return cls.from_tokenizer(model, tokenizer, think_end, think_start, **kwargs)


def _first(ids: list[int], pattern: list[int]) -> int | None:
    n = len(pattern)
    for i in range(len(ids) - n + 1):
        if ids[i : i + n] == pattern:
            return i
    return None


@torch.no_grad()
def generate_all(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    processor: Callable[[], ThinkExitProcessor | None],
    *,
    seed: int = 0,
    batch_size: int = 64,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    think_end: str = "</think>",
) -> list[dict[str, Any]]:
    """Generate from every prompt with a fresh ``processor()`` per batch (None: plain
    ``generate``). ``temperature`` 0 decodes greedily, else samples (``torch.manual_seed(seed)``
    before each batch, so methods share their random draws until one of them exits). Returns,
    per prompt: ``text`` (after the prompt, special tokens kept, padding removed),
    ``think_tokens`` (before the think end, the end not counted), ``generated_tokens``,
    ``probe_tokens``, ``forward_tokens`` (their sum), ``exit_step`` and ``seconds`` (its
    batch's wall time over the batch size)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not isinstance(temperature, int | float) or not (
        math.isfinite(temperature) and temperature >= 0
    ):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    end_ids = encode_text(tokenizer, think_end, "think_end")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    sampling = {"do_sample": True, "temperature": float(temperature), "top_k": 0}
    if temperature == 0:
        sampling = {"do_sample": False}
    rows: list[dict[str, Any]] = []
    batches = range(0, len(prompts), batch_size)
    try:
        with progress(len(batches) * max_new_tokens, "decoding steps") as bar:
            for start in batches:
                batch = list(prompts[start : start + batch_size])
                inputs = tokenizer(batch, return_tensors="pt", padding=True).to(device)
                proc, steps = processor(), _DecodingSteps(bar)
                torch.manual_seed(seed)
                began = time.perf_counter()
                try:
                    out = model.generate(
                        **inputs,
                        max_new_tokens=max_new_tokens,
                        logits_processor=[] if proc is None else [proc],
                        pad_token_id=pad,
                        eos_token_id=eos,
                        top_p=1.0,
                        streamer=steps,
                        **sampling,
                    )
                finally:
                    if hasattr(proc, "close"):
                        proc.close()
                seconds = (time.perf_counter() - began) / len(batch)
                bar.advance(max_new_tokens - steps.steps)  # the steps skipped by an early end
                new = out[:, inputs["input_ids"].shape[1] :].tolist()
                for b, ids in enumerate(new):
                    if eos in ids:  # keep the eos, drop the padding after it
                        ids = ids[: ids.index(eos) + 1]
                    end = _first(ids, end_ids)
                    probe = proc.probe_tokens[b] if proc is not None else 0
                    rows.append(
                        {
                            "text": tokenizer.decode(ids, skip_special_tokens=False),
                            "think_tokens": len(ids) if end is None else end,
                            "generated_tokens": len(ids),
                            "probe_tokens": probe,
                            "forward_tokens": len(ids) + probe,
                            "exit_step": proc.exit_steps[b] if proc is not None else None,
                            "seconds": seconds,
                        }
                    )
    finally:
        tokenizer.padding_side = side
    return rows
