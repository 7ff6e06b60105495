"""The early-exit baselines RPDI is measured against, in the same contract as
:class:`~.processor.RPDIExitProcessor`: a ``LogitsProcessor`` for one ``generate`` call that
forces the think-end ids, records ``exit_steps`` and counts ``probe_tokens``, the extra
forward tokens its decisions cost.

- :class:`FixedBudgetProcessor`: a token budget for thinking (no probe).
- :class:`DEERExitProcessor` (DEER, arXiv 2504.15895): when a row has just written a
  transition word ("wait"), decode a trial answer after an answer prompt on the prefix
  *without* that word, and exit when the mean max-probability of its tokens exceeds θ.
- :class:`DynasorExitProcessor` (Dynasor-CoT, arXiv 2412.20993): every N think tokens decode a
  trial answer; exit once the last k agree.
- :class:`EATExitProcessor` (EAT, arXiv 2509.26522): every N think tokens, the entropy of the
  first answer token after the answer prompt; exit once the EMA variance of that entropy is
  below δ (after ``min_probes`` probes).

A probe never calls ``generate`` again and never recomputes the prefix: it reads ``generate``'s
own KV cache (captured by a forward pre-hook on the model), copies the probed rows' entries and
runs only the probe tokens on the copy, as a prefix-cached server (DEER and Dynasor run on
vLLM) would. So ``probe_tokens`` is the answer prompt plus the decoded answer tokens but the
last, per probe, and the wall time is that of a fair implementation. Close a probing processor
(``close()`` or ``with``) to remove its hook from the model.
"""

from collections.abc import Sequence

import torch

from mixlab.llm_efficiency.rpdi_ee.processor import (
    ThinkExitProcessor,
    _ids,
    _Row,
    encode_text,
    think_ids,
    token_entropy,
)


def _positive_int(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class FixedBudgetProcessor(ThinkExitProcessor):
    """Thinking ends after ``budget`` think tokens: think token ``budget + 1`` is replaced by
    the think end (rows that close thinking earlier are left alone)."""

    def __init__(self, think_end_ids: int | Sequence[int], budget: int, **kwargs) -> None:
        self.budget = _positive_int(budget, "budget")
        super().__init__(think_end_ids, **kwargs)

    def _decide(self, active, input_ids, scores):
        return [b for b in active if self._rows[b].t > self.budget]


class _ProbeRow(_Row):
    def __init__(self, thinking: bool) -> None:
        super().__init__(thinking)
        self.answers: list[tuple[int, ...]] = []  # Dynasor: trial answers so far
        self.ema_mean: float | None = None  # EAT: EMA of the probed entropy
        self.ema_var = 0.0
        self.probes = 0


class _ProbingProcessor(ThinkExitProcessor):
    """Base of the processors that decode trial answers: holds the model, captures the KV
    cache ``generate`` passes to it, and runs ``answer_prompt_ids`` (then greedy answer
    tokens) on a copy of the probed rows' cache."""

    def __init__(
        self,
        model,
        think_end_ids: int | Sequence[int],
        *,
        answer_prompt_ids: int | Sequence[int] | None = None,
        answer_tokens: int = 1,
        **kwargs,
    ) -> None:
        super().__init__(think_end_ids, **kwargs)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be the torch.nn.Module that generates, got {model!r}")
        self.model = model
        self.answer_prompt_ids = (
            list(self.think_end_ids)
            if answer_prompt_ids is None
            else _ids(answer_prompt_ids, "answer_prompt_ids")
        )
        self.answer_tokens = _positive_int(answer_tokens, "answer_tokens")
        self._inputs: dict | None = None
        self._probing = False
        self._hook = model.register_forward_pre_hook(self._capture, with_kwargs=True)

    @classmethod
    def from_tokenizer(
        cls,
        model,
        tokenizer,
        think_end: str = "</think>",
        think_start: str | None = "<think>",
        answer_prompt: str | None = None,
        **kwargs,
    ):
        """As :meth:`ThinkExitProcessor.from_tokenizer`; ``answer_prompt`` (text, default the
        think end) is what the trial answer is decoded after."""
        if answer_prompt is not None:
            kwargs["answer_prompt_ids"] = encode_text(tokenizer, answer_prompt, "answer_prompt")
        end_ids, kwargs = think_ids(tokenizer, think_end, think_start, kwargs)
        return cls(model, end_ids, **kwargs)

    def close(self) -> None:
        """Removes the forward hook from the model."""
        self._hook.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _new_row(self, thinking: bool) -> _ProbeRow:
        return _ProbeRow(thinking)

    def _capture(self, module, args, kwargs) -> None:
        if not self._probing:
            self._inputs = kwargs

    @torch.no_grad()
    def _probe(self, rows: list[int], drop: Sequence[int] | None = None):
        """Trial answers of ``rows``: ``(answer ids [R, m], max-probs [R, m], first-token
        log-probs [R, V])``, decoded greedily after the answer prompt. ``drop[i]``: the last
        tokens of row i to leave out (masked in the copied cache). Adds the forward tokens
        spent to each row's ``probe_tokens``."""
        from transformers import DynamicCache

        inputs = self._inputs or {}
        # transformers 5 passes the cache as ``cache`` (``past_key_values`` before)
        cache_key = "cache" if "cache" in inputs else "past_key_values"
        cache = inputs.get(cache_key)
        if cache is None or not hasattr(cache, "layers"):
            raise ValueError(
                f"{type(self).__name__} reads generate's KV cache: call generate with "
                "use_cache=True (the default) on a model with a standard (dynamic) cache"
            )
        device = next(self.model.parameters()).device
        index = torch.tensor(rows, device=device)
        copy = DynamicCache()
        for layer_idx, layer in enumerate(cache.layers):
            copy.update(layer.keys[index], layer.values[index], layer_idx)
        length = copy.get_seq_length()
        mask = inputs.get("attention_mask")
        mask = (
            torch.ones(len(rows), length, dtype=torch.long, device=device)
            if mask is None
            else mask[index, :length].clone()
        )
        positions = inputs.get("position_ids")
        last = (
            torch.full((len(rows),), length - 1, device=device)
            if positions is None
            else positions[index, -1].clone()
        )
        if drop is not None:  # mask the dropped tail, continue the positions from before it
            for i, d in enumerate(drop):
                if d:
                    mask[i, length - d :] = 0
                    last[i] -= d
        step = torch.tensor([self.answer_prompt_ids] * len(rows), device=device)
        answers, confidences = [], []
        first_logp = None
        self._probing = True
        try:
            for _ in range(self.answer_tokens):
                k = step.shape[1]
                mask = torch.cat([mask, mask.new_ones(len(rows), k)], dim=1)
                pos = last[:, None] + torch.arange(1, k + 1, device=device)
                logits = self.model(
                    input_ids=step,
                    attention_mask=mask,
                    position_ids=pos,
                    **{cache_key: copy},
                    use_cache=True,
                ).logits[:, -1]
                logp = torch.log_softmax(logits.float(), dim=-1)
                first_logp = logp if first_logp is None else first_logp
                conf, token = logp.max(dim=-1)
                answers.append(token)
                confidences.append(conf.exp())
                last = pos[:, -1]
                step = token[:, None]
        finally:
            self._probing = False
        spent = len(self.answer_prompt_ids) + self.answer_tokens - 1
        for b in rows:
            self._rows[b].probe_tokens += spent
            self._rows[b].probes += 1
        return torch.stack(answers, 1), torch.stack(confidences, 1), first_logp


class DEERExitProcessor(_ProbingProcessor):
    """DEER-style exit: at each transition word a row writes (``transition_ids``: one id
    sequence per word, e.g. ``"wait "``), decode a trial answer on the prefix before the word
    and exit if the mean max-probability of its tokens exceeds ``threshold`` (θ)."""

    def __init__(
        self,
        model,
        think_end_ids,
        *,
        transition_ids: Sequence[Sequence[int]],
        threshold: float = 0.95,
        **kwargs,
    ) -> None:
        super().__init__(model, think_end_ids, **kwargs)
        if isinstance(transition_ids, str | int) or not transition_ids:
            raise ValueError(
                f"transition_ids must be a non-empty list of token-id lists, got {transition_ids!r}"
            )
        self.transition_ids = [_ids(t, "transition_ids") for t in transition_ids]
        self._ending_with: dict[int, list[list[int]]] = {}  # last id -> words: O(1) per row
        for word in self.transition_ids:
            self._ending_with.setdefault(word[-1], []).append(word)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
        self.threshold = float(threshold)

    def _decide(self, active, input_ids, scores):
        longest = max(len(t) for t in self.transition_ids)
        tails = input_ids[:, -longest:].tolist()
        rows, drop = [], []
        for b in active:
            r = self._rows[b]
            for word in self._ending_with.get(tails[b][-1], ()):
                if r.t > len(word) and tails[b][-len(word) :] == word:
                    rows.append(b)
                    drop.append(len(word))
                    break
        if not rows:
            return []
        _, confidence, _ = self._probe(rows, drop)
        keep = (confidence.mean(1) > self.threshold).tolist()
        return [b for b, k in zip(rows, keep, strict=True) if k]


class DynasorExitProcessor(_ProbingProcessor):
    """Dynasor-CoT-style exit: every ``interval`` think tokens decode a trial answer; exit
    when the last ``agree`` trial answers are the same."""

    def __init__(self, model, think_end_ids, *, interval: int = 32, agree: int = 3, **kwargs):
        super().__init__(model, think_end_ids, **kwargs)
        self.interval = _positive_int(interval, "interval")
        self.agree = _positive_int(agree, "agree")

    def _decide(self, active, input_ids, scores):
        rows = [b for b in active if self._rows[b].t % self.interval == 0]
        if not rows:
            return []
        answers, _, _ = self._probe(rows)
        exits = []
        for b, answer in zip(rows, answers.tolist(), strict=True):
            r = self._rows[b]
            r.answers.append(tuple(answer))
            recent = r.answers[-self.agree :]
            if len(recent) == self.agree and len(set(recent)) == 1:
                exits.append(b)
        return exits


class EATExitProcessor(_ProbingProcessor):
    """EAT-style exit: every ``interval`` think tokens, the entropy H of the first answer token
    after the answer prompt; its EMA mean and variance (weight ``alpha``) are updated, and the
    row exits once it has ``min_probes`` probes and the EMA variance is below ``threshold``."""

    def __init__(
        self,
        model,
        think_end_ids,
        *,
        interval: int = 8,
        threshold: float = 1e-3,
        alpha: float = 0.2,
        min_probes: int = 3,
        **kwargs,
    ) -> None:
        super().__init__(model, think_end_ids, **kwargs)
        self.interval = _positive_int(interval, "interval")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold <= 0:
            raise ValueError(f"threshold must be a number > 0, got {threshold!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha <= 1:
            raise ValueError(f"alpha must be a number in (0, 1], got {alpha!r}")
        self.threshold = float(threshold)
        self.alpha = float(alpha)
        self.min_probes = _positive_int(min_probes, "min_probes")

    def _decide(self, active, input_ids, scores):
        rows = [b for b in active if self._rows[b].t % self.interval == 0]
        if not rows:
            return []
        _, _, first_logp = self._probe(rows)
        entropy = token_entropy(first_logp).tolist()
        exits = []
        for b, h in zip(rows, entropy, strict=True):
            r = self._rows[b]
            if r.ema_mean is None:
                r.ema_mean = h
            else:  # exponentially weighted mean and variance (West 1979, incremental form)
                delta = h - r.ema_mean
                r.ema_mean += self.alpha * delta
                r.ema_var = (1 - self.alpha) * (r.ema_var + self.alpha * delta * delta)
            if r.probes >= self.min_probes and r.ema_var < self.threshold:
                exits.append(b)
        return exits
