"""MARGO as a TRL trainer: mixed-mode rollout groups and the MARGO advantage in GRPO.

TRL groups rollouts by their position in the global generation batch (its sampler repeats each
prompt ``num_generations`` times in a row). :class:`MARGOTrainer` renders the last
``num_direct`` copies of each prompt in the direct mode (an empty think block after the prompt,
or chat-template kwargs such as ``enable_thinking=False``) and the first ``num_thinking`` in the
thinking mode, captures the rewards TRL gathers, and replaces TRL's advantages with
:func:`~.advantages.margo_advantages`. Everything else (generation, the clipped loss, KL,
checkpoints, logging) is TRL's.

It overrides three methods of :class:`trl.GRPOTrainer`, whose internals change between TRL
releases; the trainer refuses TRL versions outside :data:`TESTED_TRL`:

- ``_generate_and_score_completions``: marks each row's mode, then swaps the advantages;
- ``_tokenize_prompts``: renders each row in its mode;
- ``_calculate_rewards``: keeps the gathered rewards (and passes ``mode`` to reward functions).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from trl import GRPOConfig, GRPOTrainer
from trl.data_utils import is_conversational

from mixlab.llm_efficiency.margo.advantages import SCALES, margo_advantages
from mixlab.llm_efficiency.margo.reward import ExactMatch
from mixlab.shared import require

__all__ = ["TESTED_TRL", "MARGOConfig", "MARGOTrainer", "check_trl_version", "empty_think_block"]

TESTED_TRL = ("1.16", "1.17")
"""TRL versions the overridden internals were tested with: ``>= [0]`` and ``< [1]``"""


def check_trl_version(version: str | None = None) -> None:
    """Raise ``ValueError`` when ``version`` (default: the installed TRL) is outside
    :data:`TESTED_TRL`."""
    found = version or trl.__version__
    low, high = TESTED_TRL

    def release(text: str) -> tuple[int, ...]:  # "1.16.0.dev0" -> (1, 16)
        return tuple(int(part) for part in re.findall(r"\d+", text)[:2])

    if not release(low) <= release(found) < release(high):
        raise ValueError(
            f"trl: MARGOTrainer overrides GRPOTrainer._generate_and_score_completions, "
            f"_tokenize_prompts and _calculate_rewards as of trl >={low},<{high}; found {found} "
            f"(install trl>={low},<{high})"
        )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class MARGOConfig(GRPOConfig):
    """:class:`trl.GRPOConfig` with mixed-mode groups and the MARGO advantage (every GRPO option
    keeps its meaning; ``num_generations`` = ``num_thinking`` + ``num_direct``)."""

    num_thinking: int | None = field(
        default=None,
        metadata={"help": "thinking rollouts per prompt (None: num_generations - num_direct)"},
    )
    num_direct: int | None = field(
        default=None,
        metadata={"help": "direct rollouts per prompt (None: half of num_generations, or the "
                  "rest after num_thinking)"},
    )  # fmt: skip
    margo_lambda: float = field(
        default=1.0,
        metadata={"help": "weight λ of the direct-reference term (0: GRPO on the mixed group)"},
    )
    one_sided: bool = field(
        default=False,
        metadata={"help": "only penalise thinking rollouts that score below the direct mean"},
    )
    thinking_prefix: str = field(
        default="",
        metadata={"help": "text appended to a thinking rollout's prompt (after the chat "
                  "template), e.g. '<think>\\n' to force the think block open"},
    )  # fmt: skip
    direct_prefix: str | None = field(
        default=None,
        metadata={"help": "text appended to a direct rollout's prompt (None: the empty think "
                  "block '<think>\\n\\n</think>\\n\\n' of think_open/think_close, or nothing "
                  "when direct_chat_template_kwargs is set)"},
    )  # fmt: skip
    direct_chat_template_kwargs: dict | None = field(
        default=None,
        metadata={"help": "chat-template kwargs of the direct mode for conversational prompts, "
                  "e.g. {'enable_thinking': False} (Qwen3)"},
    )  # fmt: skip
    think_open: str = field(default="<think>", metadata={"help": "the tag that opens thinking"})
    think_close: str = field(default="</think>", metadata={"help": "the tag that closes it"})
    train_direct: bool = field(
        default=True,
        metadata={"help": "train on the direct rollouts too (False: their advantage is 0, they "
                  "only serve as the reference)"},
    )  # fmt: skip
    missing_direct: str = field(
        default="grpo",
        metadata={"help": "a group with no scored direct rollout: 'grpo' advantages or 'error'"},
    )
    correct_reward: float = field(
        default=1.0,
        metadata={"help": "a rollout counts as correct for the logged overturn rate when its "
                  "reward reaches this"},
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_margo_args(self)


def validate_margo_args(args: Any) -> None:
    """Check the MARGO fields of ``args`` (and resolve ``num_thinking``/``num_direct``)."""
    generations = args.num_generations
    require(
        isinstance(generations, int) and generations >= 2,
        "num_generations",
        "an integer >= 2 (a group compares rollouts of one prompt)",
        generations,
    )
    thinking, direct = args.num_thinking, args.num_direct
    for name, value in (("num_thinking", thinking), ("num_direct", direct)):
        require(value is None or _count(value), name, "None or an integer >= 0", value)
    if thinking is None and direct is None:
        direct = generations // 2
    if thinking is None:
        thinking = generations - direct
    elif direct is None:
        direct = generations - thinking
    if thinking + direct != generations:
        raise ValueError(
            f"num_thinking + num_direct must equal num_generations ({generations}); "
            f"got {thinking} + {direct}"
        )
    require(thinking >= 1, "num_thinking", f"an integer in [1, {generations}]", thinking)
    require(direct >= 0, "num_direct", f"an integer in [0, {generations - 1}]", direct)
    args.num_thinking, args.num_direct = thinking, direct
    lam = args.margo_lambda
    require(
        isinstance(lam, numbers.Real) and not isinstance(lam, bool) and math.isfinite(lam)
        and lam >= 0,
        "margo_lambda",
        "a finite number >= 0",
        lam,
    )  # fmt: skip
    if direct == 0 and lam != 0:
        raise ValueError(
            f"margo_lambda must be 0 when num_direct is 0 (no direct reference); got {lam}"
        )
    require(
        args.missing_direct in ("grpo", "error"),
        "missing_direct",
        "'grpo' or 'error'",
        args.missing_direct,
    )
    require(
        args.num_generations_eval in (None, generations),
        "num_generations_eval",
        f"None or num_generations ({generations}): eval groups split the same way",
        args.num_generations_eval,
    )
    require(
        args.multi_objective_aggregation == "sum_then_normalize",
        "multi_objective_aggregation",
        "'sum_then_normalize' (MARGO compares summed rewards)",
        args.multi_objective_aggregation,
    )
    require(args.scale_rewards in SCALES, "scale_rewards", f"one of {SCALES}", args.scale_rewards)
    require(
        not args.use_vllm,
        "use_vllm",
        "False: the vLLM path generates num_generations completions per distinct prompt, not "
        "one per rendered row",
        args.use_vllm,
    )
    for name in ("thinking_prefix", "think_open", "think_close"):
        require(isinstance(getattr(args, name), str), name, "a string", getattr(args, name))
    require(
        args.direct_prefix is None or isinstance(args.direct_prefix, str),
        "direct_prefix",
        "None or a string",
        args.direct_prefix,
    )
    kwargs = args.direct_chat_template_kwargs
    require(kwargs is None or isinstance(kwargs, dict), "direct_chat_template_kwargs",
            "None or a dict", kwargs)  # fmt: skip


def _has_token(tokenizer: Any, text: str) -> bool:
    """Whether ``text`` is one token of ``tokenizer`` (not the unknown token)."""
    if not text:
        return False
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(ids) == 1 and ids[0] != getattr(tokenizer, "unk_token_id", None)


def empty_think_block(
    tokenizer: Any, think_open: str = "<think>", think_close: str = "</think>",
    option: str = "direct_prefix",
) -> str:  # fmt: skip
    """The direct mode's default prefix, Qwen3's empty think block; a ValueError naming
    ``option`` when the tokenizer has no single-token think tags."""
    if not (_has_token(tokenizer, think_open) and _has_token(tokenizer, think_close)):
        raise ValueError(
            f"{option}: the tokenizer has no {think_open!r}/{think_close!r} tokens for an empty "
            "think block; set it to text that makes the model answer at once (or, for chat "
            "prompts, use direct_chat_template_kwargs)"
        )
    return f"{think_open}\n\n{think_close}\n\n"


class MARGOTrainer(GRPOTrainer):
    """:class:`trl.GRPOTrainer` with mixed thinking/direct groups and MARGO advantages.

    ``reward_funcs`` default to :class:`~.reward.ExactMatch` on the dataset's ``answer`` column.
    Reward functions receive each rollout's ``mode`` (``"thinking"`` or ``"direct"``). Logs
    ``margo/reward_thinking``, ``margo/reward_direct``, ``margo/overturn_rate`` (a direct
    rollout correct and a thinking rollout of the same group wrong, over pairs whose direct
    rollout is correct) and ``margo/think_length`` (thinking completion tokens before the
    closing tag) with TRL's metrics. Text prompts (plain or conversational) with transformers
    generation; no vLLM, tools, environments or images.
    """

    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None, **kwargs: Any) -> None:  # fmt: skip
        check_trl_version()
        if args is None:
            args = MARGOConfig(output_dir="margo")
        require(
            hasattr(args, "margo_lambda"),
            "args",
            "a MARGOConfig (GRPOConfig with the MARGO fields)",
            type(args).__name__,
        )
        validate_margo_args(args)
        for name in ("tools", "rollout_func", "environment_factory"):
            require(kwargs.get(name) is None, name, "None (MARGOTrainer renders text prompts)",
                    type(kwargs.get(name)).__name__)  # fmt: skip
        needed = ("prompt", "answer") if reward_funcs is None else ("prompt",)
        for split, data in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            columns = getattr(data, "column_names", None)
            if isinstance(columns, list):
                missing = [c for c in needed if c not in columns]
                if missing:
                    raise ValueError(
                        f"{split} has no {' or '.join(repr(c) for c in missing)} column "
                        f"(columns: {columns})"
                    )
                if "mode" in columns:
                    raise ValueError(
                        f"{split} has a 'mode' column: MARGOTrainer passes each rollout's mode "
                        "to the reward functions under that name; rename the column"
                    )
        if reward_funcs is None:
            reward_funcs = ExactMatch(args.think_close)
        super().__init__(model=model, reward_funcs=reward_funcs, args=args,
                         train_dataset=train_dataset, eval_dataset=eval_dataset, **kwargs)  # fmt: skip
        require(not self._is_vlm, "processing_class", "a text tokenizer (no images)",
                type(self.processing_class).__name__)  # fmt: skip
        tokenizer = self._tokenizer
        self._direct_kwargs = dict(args.direct_chat_template_kwargs or {})
        if args.direct_prefix is not None:
            self._direct_prefix = args.direct_prefix
        elif args.direct_chat_template_kwargs is not None:
            self._direct_prefix = ""
        else:
            self._direct_prefix = empty_think_block(tokenizer, args.think_open, args.think_close)
        close = tokenizer(args.think_close, add_special_tokens=False)["input_ids"]
        self._think_close_id = close[0] if _has_token(tokenizer, args.think_close) else None
        self._row_direct: list[bool] = []
        self._gathered_rewards: torch.Tensor | None = None

    # -- modes --------------------------------------------------------------------------------

    def _global_modes(self, local_rows: int) -> torch.Tensor:
        """``[rows of all processes]`` bool: direct rows. TRL's sampler puts a prompt's
        ``num_generations`` copies in a row of the global batch, each process taking the next
        ``local_rows``; the last ``num_direct`` of each group are direct."""
        rows = local_rows * self.accelerator.num_processes
        position = torch.arange(rows, device=self.accelerator.device) % self.num_generations
        return position >= self.args.num_thinking

    def render(self, prompts: list[Any], direct: list[bool]) -> list[str]:
        """Each prompt as text in its mode: the chat template (conversational prompts; the
        direct mode with ``direct_chat_template_kwargs``) then the mode's prefix."""
        conversational = is_conversational({"prompt": prompts[0]})
        texts = []
        for prompt, is_direct in zip(prompts, direct, strict=True):
            if conversational:
                kwargs = self.chat_template_kwargs | (self._direct_kwargs if is_direct else {})
                prompt = self.processing_class.apply_chat_template(
                    prompt, chat_template=self.chat_template, add_generation_prompt=True,
                    tokenize=False, **kwargs,
                )  # fmt: skip
            texts.append(prompt + (self._direct_prefix if is_direct else self.args.thinking_prefix))
        return texts

    def _tokenize_prompts(self, prompts: list) -> tuple[list[list[int]], None, dict]:
        require(len(self._row_direct) == len(prompts), "prompts",
                f"{len(self._row_direct)} rows (one per marked rollout)", len(prompts))  # fmt: skip
        texts = self.render(prompts, self._row_direct)
        # a rendered chat template carries its own special tokens
        special = not is_conversational({"prompt": prompts[0]})
        ids = self.processing_class(text=texts, add_special_tokens=special)["input_ids"]
        return ids, None, {}

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._gathered_rewards = super()._calculate_rewards(
            inputs, prompts, completions, completion_ids_list
        )
        return self._gathered_rewards

    # -- advantages ---------------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        direct = self._global_modes(len(inputs))
        start = self.accelerator.process_index * len(inputs)
        self._row_direct = direct[start : start + len(inputs)].tolist()
        inputs = [
            {**x, "mode": "direct" if d else "thinking"}
            for x, d in zip(inputs, self._row_direct, strict=True)
        ]
        output = super()._generate_and_score_completions(inputs)

        per_func = self._gathered_rewards
        weights = self.reward_weights.to(per_func.device).unsqueeze(0)
        rewards = (per_func * weights).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = math.nan  # unscorable, as TRL
        advantages = margo_advantages(
            rewards,
            direct,
            self.num_generations,
            self.args.margo_lambda,
            self.args.one_sided,
            scale=self.scale_rewards,
            missing_direct=self.args.missing_direct,
        )
        if not self.args.train_direct:
            advantages = torch.where(direct, 0.0, advantages)
        output["advantages"] = advantages[start : start + len(inputs)].to(output["advantages"])
        logged = self._logs["advantages"]  # TRL logged its own advantages for the table
        for _ in range(min(len(advantages), len(logged))):
            logged.pop()
        logged.extend(advantages.tolist())
        self._log_modes(mode, rewards, direct, output)
        return output

    def _log_modes(self, mode: str, rewards: torch.Tensor, direct: torch.Tensor,
                   output: dict[str, Any]) -> None:  # fmt: skip
        metrics = self._metrics[mode]
        thinking = ~direct
        metrics["margo/reward_thinking"].append(torch.nanmean(rewards[thinking]).item())
        if direct.any():
            metrics["margo/reward_direct"].append(torch.nanmean(rewards[direct]).item())
            r = rewards.view(-1, self.num_generations)
            d = direct.view(-1, self.num_generations)
            correct = r >= self.args.correct_reward
            direct_right = (correct & d).sum(1).float()
            thinking_wrong = (~correct & ~d).sum(1).float()
            pairs = (direct_right * (~d).sum(1)).sum()
            if pairs > 0:
                metrics["margo/overturn_rate"].append(
                    ((direct_right * thinking_wrong).sum() / pairs).item()
                )
        if self._think_close_id is not None:
            ids, mask = output["completion_ids"], output["completion_mask"].bool()
            start = self.accelerator.process_index * len(ids)
            local_thinking = thinking[start : start + len(ids)]
            closed = (ids == self._think_close_id) & mask
            length = torch.where(closed.any(1), closed.int().argmax(1), mask.sum(1))
            stats = torch.stack([length[local_thinking].sum().float(),
                                 local_thinking.sum().float()])  # fmt: skip
            total, count = self.accelerator.gather(stats).view(-1, 2).sum(0).tolist()
            if count:
                metrics["margo/think_length"].append(total / count)
