"""Prompt-KL: TRL's GRPO with a KL penalty on the prompt tokens (reconstructed from the abstract).

The objective is TRL's GRPO loss (with its own response KL ``beta``, zero by default) plus

    β_p · KL_prompt(θ),   KL_prompt = mean over prompts x of
                          1/|T_x| Σ_{t ∈ T_x} KL( π_θ(·|x_<t) ‖ π_ref(·|x_<t) )          (reverse)

where T_x are the prompt positions (every next-token prediction inside the prompt, or only those
of user content). The prompt tokens are not sampled from the policy, so TRL's single-sample k3
estimator of the response KL does not apply: the KL is exact, summed over the whole vocabulary at
each position (``forward`` swaps the two distributions). Hacking a cued loophole means reading
the prompt differently; pinning the prompt's next-token predictions to the reference constrains
that reading and leaves the response free.

Efficiency: the G rollouts of a prompt share it, so the KL is computed once per unique prompt and
weighted by its rows (equal to the per-row mean); the policy's logits are made a chunk of
positions at a time under activation checkpointing (memory of one chunk's vocabulary, not the
prompt's); the frozen reference's log-probs are cached per prompt.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from trl import GRPOConfig, GRPOTrainer

from mixlab.shared import require

__all__ = [
    "PromptKLConfig",
    "PromptKLGRPOTrainer",
    "exact_kl",
    "prompt_kl",
    "prompt_positions",
]

DIRECTIONS = ("reverse", "forward")
POSITIONS = ("all", "content")


@dataclass
class PromptKLConfig(GRPOConfig):
    """:class:`trl.GRPOConfig` with the prompt-KL penalty (every GRPO option keeps its meaning)."""

    prompt_kl_beta: float = field(
        default=0.1, metadata={"help": "weight β_p of the prompt KL (0 logs it without a penalty)"}
    )
    prompt_kl_direction: str = field(
        default="reverse",
        metadata={
            "help": "'reverse' KL(π_θ ‖ π_ref), the RLHF default, or 'forward' KL(π_ref ‖ π_θ)"
        },
    )
    prompt_kl_positions: str = field(
        default="all",
        metadata={
            "help": "'all' prompt positions (chat template included) or 'content': only predictions "
            "of user content (special tokens and the chat template's fixed prefix and suffix left out)"
        },
    )
    prompt_kl_chunk_size: int | None = field(
        default=64,
        metadata={
            "help": "prompt positions whose logits are made at once (None: the whole prompt)"
        },
    )
    prompt_kl_ref_cache: int = field(
        default=1024,
        metadata={
            "help": "prompts whose reference log-probs are kept (each holds positions × vocabulary "
            "floats; 0 turns the cache off)"
        },
    )
    log_prompt_kl: bool = field(
        default=True,
        metadata={"help": "log the prompt KL also when prompt_kl_beta = 0 (one more forward)"},
    )
    log_response_kl: bool = field(
        default=True,
        metadata={"help": "log the response KL (k3, as TRL) also when beta = 0 (one more forward)"},
    )

    def __post_init__(self) -> None:
        validate_prompt_kl_args(self)
        super().__post_init__()


def validate_prompt_kl_args(args: Any) -> None:
    beta = args.prompt_kl_beta
    require(
        isinstance(beta, int | float) and not isinstance(beta, bool) and beta >= 0
        and beta < float("inf"),
        "prompt_kl_beta",
        "a finite number >= 0",
        beta,
    )  # fmt: skip
    require(
        args.prompt_kl_direction in DIRECTIONS,
        "prompt_kl_direction",
        f"one of {DIRECTIONS}",
        args.prompt_kl_direction,
    )
    require(
        args.prompt_kl_positions in POSITIONS,
        "prompt_kl_positions",
        f"one of {POSITIONS}",
        args.prompt_kl_positions,
    )
    chunk = args.prompt_kl_chunk_size
    require(
        chunk is None or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1),
        "prompt_kl_chunk_size",
        "None or an integer >= 1",
        chunk,
    )
    cache = args.prompt_kl_ref_cache
    require(
        isinstance(cache, int) and not isinstance(cache, bool) and cache >= 0,
        "prompt_kl_ref_cache",
        "an integer >= 0",
        cache,
    )
    generations = args.num_generations
    require(
        generations is None or (isinstance(generations, int) and generations >= 2),
        "num_generations",
        "an integer >= 2 (GRPO compares the rollouts of a prompt)",
        generations,
    )


# ------------------------------------------------------------------------------------------------
# the exact KL


def exact_kl(policy_logps: torch.Tensor, ref_logps: torch.Tensor, direction: str) -> torch.Tensor:
    """KL over the last (vocabulary) dimension between two log-softmaxed tensors: reverse is
    Σ_v p_θ (log p_θ − log p_ref), forward Σ_v p_ref (log p_ref − log p_θ). Never negative up to
    rounding; exactly 0 for equal inputs."""
    if direction == "reverse":
        return (policy_logps.exp() * (policy_logps - ref_logps)).sum(-1)
    return (ref_logps.exp() * (ref_logps - policy_logps)).sum(-1)


def _causal_lm(model: Any) -> Any:
    """The transformers causal LM inside a PEFT wrapper (its adapters stay in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The LM head on final hidden states, with the logit scaling and soft-capping some
    configs ask for (Gemma 2, Cohere, Granite), as the models' own forward does."""
    model = _causal_lm(model)
    logits = model.get_output_embeddings()(hidden)
    config = model.config.get_text_config()
    if (scale := getattr(config, "logit_scale", None)) is not None:
        logits = logits * scale
    if (scaling := getattr(config, "logits_scaling", None)) is not None:
        logits = logits / scaling
    if (cap := getattr(config, "final_logit_softcapping", None)) is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids counted from each row's first real token, so that a prompt reads the same
    however much left padding its batch has."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def _hidden(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states (position ids from :func:`_positions`)."""
    positions = _positions(mask)
    return (
        _causal_lm(model)
        .base_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        .last_hidden_state
    )


def prompt_logps(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, chunk_size: int | None = None
) -> Iterator[tuple[slice, torch.Tensor]]:
    """``(positions, log-probs [rows, len(positions), vocab])`` of the next-token predictions at
    prompt positions ``0 .. P-2`` in chunks of ``chunk_size`` positions (``None``: all at once,
    through the model's own forward)."""
    if chunk_size is None:
        logits = model(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
        yield slice(0, ids.shape[1] - 1), logits[:, :-1].float().log_softmax(-1)
        return
    hidden = _hidden(model, ids, mask)[:, :-1]
    for start in range(0, hidden.shape[1], chunk_size):
        part = slice(start, min(start + chunk_size, hidden.shape[1]))
        yield part, _logits(model, hidden[:, part]).float().log_softmax(-1)


def prompt_positions(
    ids: torch.Tensor, mask: torch.Tensor, content: torch.Tensor | None = None
) -> torch.Tensor:
    """``[rows, P-1]`` float mask of the next-token predictions that count: position ``t``
    (predicting token ``t+1``) when both are real tokens, and, given a ``content`` mask over
    tokens, only when token ``t+1`` is content."""
    valid = mask[:, :-1].bool() & mask[:, 1:].bool()
    if content is not None:
        valid &= content[:, 1:].bool()
    return valid.float()


def prompt_kl(
    model: Any,
    ref_logps: list[torch.Tensor],
    ids: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    *,
    direction: str = "reverse",
    content: torch.Tensor | None = None,
    chunk_size: int | None = 64,
) -> torch.Tensor:
    """The weighted mean over rows of each row's mean prompt KL (rows are unique prompts,
    ``weights`` how many rollouts share each). ``ref_logps[i]``: the reference's log-probs at
    row ``i``'s positions ``0 .. P-2`` (``[P-1, vocab]``). Differentiable in ``model``; each chunk's
    log-softmax is recomputed in the backward pass instead of kept."""
    valid = prompt_positions(ids, mask, content)
    ref = torch.stack(ref_logps).to(valid.device)
    per_row = torch.zeros(ids.shape[0], device=valid.device)

    def chunk_kl(policy: torch.Tensor, part_ref: torch.Tensor, part_valid: torch.Tensor):
        return (exact_kl(policy, part_ref, direction) * part_valid).sum(-1)

    if chunk_size is None:
        for part, policy in prompt_logps(model, ids, mask, None):
            per_row = per_row + chunk_kl(policy, ref[:, part], valid[:, part])
    else:
        hidden = _hidden(model, ids, mask)[:, :-1]

        def head_kl(h: torch.Tensor, part_ref: torch.Tensor, part_valid: torch.Tensor):
            return chunk_kl(_logits(model, h).float().log_softmax(-1), part_ref, part_valid)

        for start in range(0, hidden.shape[1], chunk_size):
            part = slice(start, min(start + chunk_size, hidden.shape[1]))
            args = (hidden[:, part], ref[:, part], valid[:, part])
            if torch.is_grad_enabled() and hidden.requires_grad:
                per_row = per_row + checkpoint(head_kl, *args, use_reentrant=False)
            else:
                per_row = per_row + head_kl(*args)
    per_row = per_row / valid.sum(-1).clamp(min=1.0)
    weights = weights.to(per_row)
    return (per_row * weights).sum() / weights.sum()


# ------------------------------------------------------------------------------------------------
# the trainer


class PromptKLGRPOTrainer(GRPOTrainer):
    """:class:`trl.GRPOTrainer` whose loss adds ``prompt_kl_beta`` × the exact prompt KL against
    a frozen copy of the start policy (a PEFT policy: the adapter disabled; or ``ref_model``).

    Only :meth:`compute_loss` changes the training; ``__init__`` sets up the reference. Logs
    ``prompt_kl`` and ``response_kl`` (TRL's k3 on the completions, also when ``beta`` = 0) with
    TRL's other metrics, as means over the processes of a distributed run. With
    ``prompt_kl_beta`` = 0 and neither KL logged, no reference is made: plain GRPO.
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, *,
                 ref_model: Any = None, **kwargs: Any) -> None:  # fmt: skip
        if args is None:
            args = PromptKLConfig(output_dir="prompt-kl")
        require(
            hasattr(args, "prompt_kl_beta"),
            "args",
            "a PromptKLConfig (GRPOConfig with the prompt_kl_* fields)",
            type(args).__name__,
        )
        validate_prompt_kl_args(args)
        for split in ("train_dataset", "eval_dataset"):
            data = kwargs.get(split)
            columns = getattr(data, "column_names", None)
            if isinstance(columns, list) and "prompt" not in columns:
                raise ValueError(f"{split} has no 'prompt' column (columns: {columns})")
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)
        from accelerate.utils import is_peft_model

        self._logs_response_kl = self.beta == 0.0 and args.log_response_kl
        self._needs_prompt_kl = args.prompt_kl_beta > 0 or args.log_prompt_kl
        if ref_model is not None:
            self.prompt_kl_ref = ref_model
        elif not (self._needs_prompt_kl or self._logs_response_kl):
            self.prompt_kl_ref = None  # plain GRPO: no reference is read, none is copied
        elif is_peft_model(self.model):
            self.prompt_kl_ref = None  # the policy with its adapter disabled
        elif self.ref_model is not None:
            self.prompt_kl_ref = self.ref_model  # TRL's own frozen copy (beta > 0)
        else:
            self.prompt_kl_ref = copy.deepcopy(self.model)  # the start policy
            # TRL patched the policy's forward (a fused LM head bound to the policy itself): the
            # copy must run its own class forward, not a closure over the policy
            self.prompt_kl_ref.__dict__.pop("forward", None)
        if self.prompt_kl_ref is not None:
            self.prompt_kl_ref.eval().requires_grad_(False)
            self.prompt_kl_ref.to(self.accelerator.device)
            policy_vocab = self.model.get_output_embeddings().weight.shape[0]
            ref_vocab = self.prompt_kl_ref.get_output_embeddings().weight.shape[0]
            require(
                ref_vocab == policy_vocab,
                "ref_model",
                f"a model with the policy's vocabulary ({policy_vocab} logits)",
                f"{ref_vocab} logits",
            )
        self._ref_cache: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self._template = _template_ends(self.processing_class)
        self._special = set(getattr(self.processing_class, "all_special_ids", []) or [])

    # -- the reference ------------------------------------------------------------------------

    @contextmanager
    def _reference(self, model: Any) -> Iterator[Any]:
        if self.prompt_kl_ref is not None:
            yield self.prompt_kl_ref
            return
        unwrapped = self.accelerator.unwrap_model(model)
        with unwrapped.disable_adapter():
            yield unwrapped

    def _reference_logps(
        self, model: Any, ids: torch.Tensor, mask: torch.Tensor
    ) -> list[torch.Tensor]:
        """The reference's log-probs at each row's positions ``0 .. P-2`` (``[P-1, vocab]``,
        zeros at padding). Each prompt's real positions are cached, so a prompt reads the same
        in any batch."""
        width = ids.shape[1] - 1
        lengths = mask.sum(-1).tolist()
        keys = [tuple(row[m.bool()].tolist()) for row, m in zip(ids, mask, strict=True)]
        missing = [i for i, key in enumerate(keys) if key not in self._ref_cache]
        real: dict[int, torch.Tensor] = {}  # [n - 1, vocab]: predictions of tokens 2 .. n
        if missing:
            with torch.no_grad(), self._reference(model) as ref:
                parts = list(
                    prompt_logps(ref, ids[missing], mask[missing], self.args.prompt_kl_chunk_size)
                )
            fresh = torch.cat([p for _, p in parts], dim=1)
            for j, i in enumerate(missing):
                real[i] = fresh[j, width - (lengths[i] - 1) :]
                if self.args.prompt_kl_ref_cache > 0:
                    self._ref_cache[keys[i]] = real[i]
        for i, key in enumerate(keys):
            if i not in real:
                real[i] = self._ref_cache[key]
                self._ref_cache.move_to_end(key)
        while len(self._ref_cache) > self.args.prompt_kl_ref_cache:
            self._ref_cache.popitem(last=False)
        return [F.pad(real[i], (0, 0, width - len(real[i]), 0)) for i in range(len(keys))]

    # -- the loss -----------------------------------------------------------------------------

    def unique_prompts(
        self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ids, mask, rows per prompt)`` of the batch's distinct prompts, left padding cut to
        the longest of them."""
        rows = torch.cat([prompt_ids * prompt_mask, prompt_mask], dim=1)
        unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
        counts = torch.bincount(inverse, minlength=len(unique))
        first = torch.full((len(unique),), len(rows), dtype=torch.long, device=rows.device)
        first = first.scatter_reduce(
            0, inverse, torch.arange(len(rows), device=rows.device), "amin"
        )
        ids, mask = prompt_ids[first], prompt_mask[first]
        keep = mask.any(0).nonzero()
        start = int(keep.min()) if len(keep) else 0
        return ids[:, start:], mask[:, start:], counts

    def prompt_kl_of(
        self, model: Any, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor
    ) -> torch.Tensor:
        """KL_prompt of a batch of rollouts (one forward per distinct prompt).

        ``model`` may be wrapped (DistributedDataParallel, DeepSpeed): the KL reads the causal
        LM's internals (its decoder and LM head), so it runs on the unwrapped module. Its
        gradient still reaches the wrapper's all-reduce, which hooks the parameters, not the
        forward; a second forward through the wrapper in one step would be refused by DDP."""
        model = self.accelerator.unwrap_model(model)
        ids, mask, counts = self.unique_prompts(prompt_ids, prompt_mask)
        ref = self._reference_logps(model, ids, mask)
        content = (
            self.content_mask(ids, mask) if self.args.prompt_kl_positions == "content" else None
        )
        return prompt_kl(
            model,
            ref,
            ids,
            mask,
            counts,
            direction=self.args.prompt_kl_direction,
            content=content,
            chunk_size=self.args.prompt_kl_chunk_size,
        )

    def content_mask(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Tokens of user content: real, not special, and (with a chat template) between the
        template's fixed prefix and suffix."""
        content = mask.bool().clone()
        if self._special:
            special = torch.tensor(sorted(self._special), device=ids.device)
            content &= ~torch.isin(ids, special)
        if self._template is not None:
            prefix, suffix = self._template
            for r in range(len(ids)):
                real = mask[r].nonzero().flatten()
                if len(real) == 0:
                    continue
                row = ids[r, real].tolist()
                lo = len(prefix) if row[: len(prefix)] == prefix else 0
                hi = (
                    len(row) - len(suffix) if suffix and row[-len(suffix) :] == suffix else len(row)
                )
                keep = torch.zeros(len(row), dtype=torch.bool, device=ids.device)
                keep[lo:hi] = True
                content[r, real] &= keep
        return content

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        beta = self.args.prompt_kl_beta
        if self._needs_prompt_kl:
            with nullcontext() if beta > 0 else torch.no_grad():
                kl = self.prompt_kl_of(model, inputs["prompt_ids"], inputs["prompt_mask"])
            self._metrics[mode]["prompt_kl"].append(self._mean_over_processes(kl))
        if beta > 0:
            # the same scaling as TRL's own loss under gradient accumulation (grpo/bnpo/dr_grpo)
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + beta * kl / normalizer
        if self._logs_response_kl:
            response_kl = torch.tensor(self._response_kl(model, inputs), device=loss.device)
            self._metrics[mode]["response_kl"].append(self._mean_over_processes(response_kl))
        elif self.beta != 0.0 and self._metrics[mode].get("kl"):
            self._metrics[mode]["response_kl"].append(self._metrics[mode]["kl"][-1])
        return loss

    def _mean_over_processes(self, value: torch.Tensor) -> float:
        """A per-process batch mean as one number for the global batch (processes hold equal
        shares of it), as TRL gathers its own metrics."""
        return float(self.accelerator.gather(value.detach().reshape(1)).mean())

    @torch.no_grad()
    def _response_kl(self, model: Any, inputs: dict[str, Any]) -> float:
        """TRL's k3 estimate of KL(π_θ ‖ π_ref) on the sampled completion tokens."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = inputs["completion_ids"].shape[1]
        logps = self._get_per_token_logps_and_entropies(model, ids, mask, keep)[0]
        with self._reference(model) as ref:
            logits = ref(input_ids=ids, attention_mask=mask).logits[:, -keep - 1 : -1]
        ref_logps = (logits.float() / self.temperature).log_softmax(-1)
        ref_logps = ref_logps.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
        delta = ref_logps - logps
        k3 = delta.exp() - delta - 1
        completion = inputs["completion_mask"].float()
        return float((k3 * completion).sum() / completion.sum().clamp(min=1.0))


def _template_ends(processing_class: Any) -> tuple[list[int], list[int]] | None:
    """The token ids a chat template puts before and after a user message's content, found by
    rendering it around a sentinel (None without a chat template)."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    sentinel = "\u2063SENTINEL\u2063"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": sentinel}], tokenize=False, add_generation_prompt=True
    )
    before, _, after = text.partition(sentinel)
    prefix = tokenizer(before, add_special_tokens=False)["input_ids"]
    suffix = tokenizer(after, add_special_tokens=False)["input_ids"]
    return prefix, suffix
