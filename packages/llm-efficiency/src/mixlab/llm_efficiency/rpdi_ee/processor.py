"""RPDI early exit as a Hugging Face ``LogitsProcessor``.

The Reasoning Path Deviation Index (arXiv 2603.14251) watches the entropy of the next-token
distribution while a reasoning model thinks. The paper's body was not found; the formula below
follows a third-party re-implementation (research notes, llm-efficiency.md §3(a)):

    H_i    = -sum_v p_i(v) log p_i(v)             entropy at think step i (untempered p_i)
    GTF_t  = (1/t) sum_{i=1..t} H_i                global mean since the think start
    LTF_t  = (1/W) sum_{i=t-W+1..t} H_i            local mean over the last W think tokens
    RPDI_t = LTF_t / GTF_t
    exit when t >= max(W, min_steps) and RPDI_t > lambda: force the think-end ids

Step t is the t-th think token, and H_t is the entropy of the distribution it is drawn from,
so the exit replaces think token t by the first think-end id (``exit_steps`` holds that t).
Entropies exist only for generated tokens: think tokens already in the prompt are not counted.

Everything happens inside one ``generate`` call (the KV cache is kept) and without extra
forward passes: the index is updated in O(1) per token from running sums and a ring buffer of
the last W values per row.
"""

import math
from collections.abc import Iterable, Sequence

import torch
from transformers import LogitsProcessor

VARIANTS = ("window", "ema", "transitions")


class _Row:
    """Running state of one batch row (a subclass adds its own fields in ``_new_row``)."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking  # inside the think segment, still monitored
        self.done = False  # think ended (on its own or forced), or the row hit an eos id
        self.pending: list[int] = []  # think-end ids still to force
        self.t = 0  # think tokens seen
        self.exit_step: int | None = None
        self.probe_tokens = 0  # extra forward tokens spent on probes (0 for RPDI)


def _ids(value: object, name: str) -> list[int]:
    """A non-empty list of non-negative ints, or a ValueError naming ``name``."""
    items = [value] if isinstance(value, int) else value
    if not isinstance(items, Iterable) or isinstance(items, str):
        raise ValueError(f"{name} must be a token id or a list of token ids, got {value!r}")
    items = list(items)
    if not items or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items
    ):
        raise ValueError(
            f"{name} must be a non-empty list of non-negative int token ids, got {value!r}"
        )
    return items


def token_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(scores) over the last dim; -inf scores count as p = 0
    (their 0 * -inf terms are NaN, which ``nansum`` skips): three passes over the vocabulary."""
    logp = torch.log_softmax(scores.float(), dim=-1)
    return -(logp.exp() * logp).nansum(-1)


class ThinkExitProcessor(LogitsProcessor):
    """What every early-exit processor of this package shares: per-row think-segment tracking
    and the forced exit. A subclass decides, once per decoding step, which thinking rows exit
    now (:meth:`_decide`); the base class then forces the think-end ids in the same ``generate``
    call (over consecutive steps when there are several), so the KV cache is kept.

    A new ``generate`` call is detected when the sequence length does not grow by exactly one
    or the batch size changes; :meth:`reset` makes it explicit. After generation,
    ``exit_steps[b]`` is row b's exit step t (the think token replaced by the first think-end
    id; None: no forced exit) and ``probe_tokens[b]`` the extra forward tokens its decisions
    cost (0 for methods that only read the scores, as RPDI and a fixed budget).
    """

    def __init__(
        self,
        think_end_ids: int | Sequence[int],
        *,
        think_start_id: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
    ) -> None:
        self.think_end_ids = _ids(think_end_ids, "think_end_ids")
        if think_start_id is not None and (
            not isinstance(think_start_id, int)
            or isinstance(think_start_id, bool)
            or think_start_id < 0
        ):
            raise ValueError(
                f"think_start_id must be one non-negative int token id or None, got {think_start_id!r}"
            )
        self.think_start_id = think_start_id
        self.eos_ids = (
            frozenset(_ids(eos_token_id, "eos_token_id"))
            if eos_token_id is not None
            else frozenset()
        )
        self.reset()

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer,
        think_end: str = "</think>",
        think_start: str | None = "<think>",
        **kwargs,
    ):
        """Looks the think-end ids (and ``<think>``) up with ``tokenizer``: ``think_end`` must
        encode to known tokens that decode back to it, ``think_start`` to one token.
        ``eos_token_id`` defaults to the tokenizer's. Other arguments go to the constructor."""
        think_end_ids, kwargs = think_ids(tokenizer, think_end, think_start, kwargs)
        return cls(think_end_ids, **kwargs)

    def reset(self) -> None:
        """Forgets all rows; the next call starts a new generation."""
        self._rows: list = []
        self._prev: torch.Tensor | None = None

    @property
    def exit_steps(self) -> list[int | None]:
        return [r.exit_step for r in self._rows]

    @property
    def probe_tokens(self) -> list[int]:
        return [r.probe_tokens for r in self._rows]

    def _new_row(self, thinking: bool) -> _Row:
        return _Row(thinking)

    def _decide(
        self, active: list[int], input_ids: torch.LongTensor, scores: torch.FloatTensor
    ) -> list[int]:
        """The rows of ``active`` (thinking, ``t`` already counts this step) that exit now."""
        raise NotImplementedError

    def _start(self, input_ids: torch.Tensor) -> None:
        self._rows = []
        n = len(self.think_end_ids)
        for row in input_ids.tolist():
            if self.think_start_id is None:
                thinking = True
            else:  # thinking if the row's last <think> is not followed by a complete think end
                starts = [i for i, tok in enumerate(row) if tok == self.think_start_id]
                tail = row[starts[-1] + 1 :] if starts else None
                thinking = tail is not None and not any(
                    tail[i : i + n] == self.think_end_ids for i in range(len(tail) - n + 1)
                )
            self._rows.append(self._new_row(thinking))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.dim() != 2 or input_ids.shape[1] == 0 or len(scores) != len(input_ids):
            raise ValueError(  # an empty prompt was an IndexError in the row tracking (issue 80)
                f"input_ids must be [batch, length >= 1] with one scores row each, got "
                f"{tuple(input_ids.shape)} and scores {tuple(scores.shape)}"
            )
        prev = self._prev
        if (
            prev is None
            or prev.shape[0] != input_ids.shape[0]
            or input_ids.shape[1] != prev.shape[1] + 1
        ):
            self._start(input_ids)
        elif not torch.equal(input_ids[:, :-1], prev):
            raise ValueError(
                f"rows changed between decoding steps: beam search (num_beams > 1) is not "
                f"supported by {type(self).__name__}; use greedy or sampling, and call reset() "
                "between generate calls"
            )
        self._prev = input_ids  # the O(B L) prefix check above guards the per-row state
        n = len(self.think_end_ids)
        tails = input_ids[:, -n:].tolist()
        force: dict[int, int] = {}  # row -> id to force now
        active: list[int] = []
        for b, r in enumerate(self._rows):
            if r.pending:
                force[b] = r.pending.pop(0)
                r.done = not r.pending
                continue
            if r.done:
                continue
            last = tails[b][-1]
            if last in self.eos_ids or (r.thinking and r.t and tails[b] == self.think_end_ids):
                r.done = True  # finished, or closed thinking on its own
                continue
            if not r.thinking and last == self.think_start_id:
                r.thinking = True  # <think> emitted during this generation
            if r.thinking:
                r.t += 1
                active.append(b)
        for b in self._decide(active, input_ids, scores) if active else ():
            r = self._rows[b]
            r.exit_step = r.t
            r.thinking = False
            force[b] = self.think_end_ids[0]
            r.pending = self.think_end_ids[1:]
            r.done = not r.pending
        if not force:
            return scores
        rows = torch.tensor(list(force), device=scores.device)
        ids = torch.tensor(list(force.values()), device=scores.device)
        scores = scores.clone()  # generate keeps the scores it was given (output_scores)
        scores[rows] = -float("inf")
        scores[rows, ids] = 0.0  # the only finite score: chosen by greedy and by sampling
        return scores


def encode_text(tokenizer, text: str, name: str, single: bool = False) -> list[int]:
    """``text``'s ids under ``tokenizer`` (no special tokens added), or a ValueError naming
    ``name`` when the tokenizer does not know it (unknown ids, or it does not decode back)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    unk = tokenizer.unk_token_id
    if not ids or (unk is not None and unk in ids) or tokenizer.decode(ids).strip() != text.strip():
        raise ValueError(f"{name}={text!r} is not text this tokenizer knows (it encodes to {ids})")
    if single and len(ids) != 1:
        raise ValueError(f"{name}={text!r} must be a single token, it encodes to {ids}")
    return ids


def think_ids(
    tokenizer, think_end: str, think_start: str | None, kwargs: dict
) -> tuple[list[int], dict]:
    """``think_end``'s ids, and ``kwargs`` with ``think_start_id`` (one token, or None) and
    ``eos_token_id`` (default: the tokenizer's), looked up with ``tokenizer``."""
    start_id = (
        None
        if think_start is None
        else encode_text(tokenizer, think_start, "think_start", single=True)[0]
    )
    kwargs = {"eos_token_id": tokenizer.eos_token_id, **kwargs, "think_start_id": start_id}
    return encode_text(tokenizer, think_end, "think_end"), kwargs


class _RPDIRow(_Row):
    def __init__(self, thinking: bool, window: int) -> None:
        super().__init__(thinking)
        self.sum_h = 0.0  # sum of H_i, for GTF
        self.sum_h2 = 0.0  # sum of H_i^2, for the running std (transitions variant)
        self.ring = [0.0] * window  # last W values (H_i, or transition flags)
        self.ring_sum = 0.0
        self.ema = 0.0
        self.entropies: list[float] = []
        self.trace: list[float] = []


class RPDIExitProcessor(ThinkExitProcessor):
    """Ends thinking early when the RPDI exceeds ``threshold``, by forcing the think-end ids.

    Use it as ``model.generate(..., logits_processor=[RPDIExitProcessor(...)])`` with greedy
    decoding or sampling. In transformers 5 the user's processors run after the built-in
    processors (repetition penalty, min length, ...) and *before* the sampling warpers
    (temperature, top-k, top-p), so the entropy is that of the untempered distribution and
    the exit does not depend on ``temperature``. Put it first in your own list, before any
    warper you add yourself. Beam search (``num_beams > 1``) is refused: it reorders rows.

    State is kept per batch row (left padding is fine). A new ``generate`` call is detected
    when the sequence length does not grow by exactly one or the batch size changes; call
    :meth:`reset` between calls to be explicit (e.g. when continuing from a previous output).

    Args:
        think_end_ids: the id(s) that close thinking, e.g. ``</think>`` (several are forced
            over consecutive steps).
        window: W, the local window (tokens; the EMA span for ``variant="ema"``).
            Default 512 is what the re-implementation labels as the paper's setting.
        threshold: lambda > 0; ``float("inf")`` never exits. Default 2.0 (as ``window``).
        min_steps: no exit before ``max(window, min_steps)`` think tokens.
        think_start_id: ``<think>``; the think segment starts after its last occurrence in
            the row (prompt or generated). ``None``: thinking starts at the prompt end.
        check_at: ``"every"`` token, or a set of step-boundary token ids: exit only right
            after the row emitted one of them (the re-implementation used ``. \\n ; ? ! ,``).
        variant: ``"window"`` (LTF/GTF), ``"ema"`` (LTF an EMA with span W, alpha =
            2/(W+1)), or ``"transitions"`` (the fraction of the last W think tokens whose
            entropy exceeds the running mean + std of the tokens before them; in [0, 1]).
        eos_token_id: id(s) after which a row is finished and no longer monitored.

    After generation, ``exit_steps[b]`` is row b's exit step t (or None), ``traces[b]`` its
    index per think step and ``entropies[b]`` its H_i.
    """

    def __init__(
        self,
        think_end_ids: int | Sequence[int],
        window: int = 512,
        threshold: float = 2.0,
        min_steps: int = 0,
        think_start_id: int | None = None,
        check_at: str | Iterable[int] = "every",
        variant: str = "window",
        eos_token_id: int | Sequence[int] | None = None,
    ) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window must be an int >= 1, got {window!r}")
        if (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or not threshold > 0
        ):
            raise ValueError(
                f"threshold must be a number > 0 (float('inf') never exits), got {threshold!r}"
            )
        if not isinstance(min_steps, int) or isinstance(min_steps, bool) or min_steps < 0:
            raise ValueError(f"min_steps must be an int >= 0, got {min_steps!r}")
        if isinstance(check_at, str):
            if check_at != "every":
                raise ValueError(
                    f"check_at must be 'every' or a set of token ids, got {check_at!r}"
                )
            self.check_at: frozenset[int] | None = None
        else:
            self.check_at = frozenset(_ids(check_at, "check_at"))
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.window = window
        self.threshold = float(threshold)
        self.min_steps = min_steps
        self.variant = variant
        self.alpha = 2.0 / (window + 1)  # EMA with span W (pandas convention)
        super().__init__(think_end_ids, think_start_id=think_start_id, eos_token_id=eos_token_id)

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer,
        think_end: str = "</think>",
        think_start: str | None = "<think>",
        check_at: str | Iterable[str] | Iterable[int] = "every",
        **kwargs,
    ) -> "RPDIExitProcessor":
        """As :meth:`ThinkExitProcessor.from_tokenizer`; each boundary string in ``check_at``
        must be one token."""
        if not isinstance(check_at, str):
            check_at = [
                encode_text(tokenizer, c, "check_at", single=True)[0] if isinstance(c, str) else c
                for c in check_at
            ]
        return super().from_tokenizer(
            tokenizer, think_end, think_start, check_at=check_at, **kwargs
        )

    @property
    def traces(self) -> list[list[float]]:
        return [r.trace for r in self._rows]

    @property
    def entropies(self) -> list[list[float]]:
        return [r.entropies for r in self._rows]

    def _new_row(self, thinking: bool) -> _RPDIRow:
        return _RPDIRow(thinking, self.window)

    def _index(self, r: _RPDIRow, h: float) -> float:
        """Adds H_t to row r's running sums (``r.t`` already counts it) and returns RPDI_t, O(1)."""
        seen = r.t - 1  # H_1..H_{t-1} before this one
        prev_mean = r.sum_h / seen if seen else 0.0
        prev_var = max(r.sum_h2 / seen - prev_mean**2, 0.0) if seen else 0.0
        r.sum_h += h
        r.sum_h2 += h * h
        r.entropies.append(h)
        gtf = r.sum_h / r.t
        if self.variant == "transitions":  # flag: H_t above mean + std of H_1..H_{t-1}
            value = float(r.t > 1 and h > prev_mean + math.sqrt(prev_var))
        else:
            value = h
        slot = (r.t - 1) % self.window
        r.ring_sum += value - r.ring[slot]
        r.ring[slot] = value
        filled = min(r.t, self.window)
        if self.variant == "transitions":
            return r.ring_sum / filled
        if self.variant == "ema":
            r.ema = h if r.t == 1 else self.alpha * h + (1 - self.alpha) * r.ema
            ltf = r.ema
        else:
            ltf = r.ring_sum / filled
        return ltf / gtf if gtf > 0 else 1.0  # all H_i = 0: no deviation

    def _decide(self, active, input_ids, scores):
        h_all = token_entropy(scores[active]).tolist()
        start = max(self.window, self.min_steps)
        last = input_ids[:, -1].tolist()
        exits = []
        for b, h in zip(active, h_all, strict=True):
            r = self._rows[b]
            rpdi = self._index(r, h)
            r.trace.append(rpdi)
            at_boundary = self.check_at is None or last[b] in self.check_at
            if r.t >= start and rpdi > self.threshold and at_boundary:
                exits.append(b)
        return exits
