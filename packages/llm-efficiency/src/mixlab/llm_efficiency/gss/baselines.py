"""GSS and the memorization mitigations it is measured against, in one contract.

``method.mitigate(model, data)`` returns a :class:`Mitigated`: the model to evaluate (the base
itself under a hook, or an edited copy), used as ``with mitigated as m: ...``, and the wall time
the mitigation took (``seconds``), measured alike for every method.

- Steers (a hook on one decoder block, the weights untouched): :class:`GSS` (gated or not) and
  :class:`MeanDifference` (CAA: the mean memorized minus the mean general hidden state,
  subtracted everywhere or gated by the GSS rule).
- Optimisation (a copy of the model is trained; they stop as soon as ``data.stop(model)`` says
  the target is reached, checked every ``check_every`` steps and not timed, or at
  ``max_steps``): :class:`GradientAscent` and :class:`NPO` (unlearning on the memorized
  sequences), :class:`HardConcreteMask` (TinyMem's hard-concrete neuron masks) and
  :class:`BalancedSubnet` (TinyMem's weight-level subnet with a clean-loss term).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from mixlab.llm_efficiency.gss.steer import (
    GSSSteer,
    _batches,
    _block,
    fit_gss,
    hidden_states,
    memorized_activations,
)
from mixlab.llm_efficiency.lm import decoder_blocks
from mixlab.shared import progress

__all__ = [
    "GSS",
    "NPO",
    "BalancedSubnet",
    "GradientAscent",
    "HardConcreteMask",
    "MeanDifference",
    "Mitigated",
    "MitigationData",
]


@dataclass
class MitigationData:
    """What every mitigation is given: ``memorized`` sequences to forget (token ids),
    ``general`` sequences to keep, ``held_out`` general sequences (gate thresholds), an optional
    ``reference`` model (GSS's ω) and ``stop(model) -> bool``, the target the optimisation
    baselines stop at (None: run to their step cap)."""

    memorized: list[torch.Tensor]
    general: list[torch.Tensor]
    held_out: list[torch.Tensor]
    reference: Any = None
    stop: Callable[[Any], bool] | None = None
    seed: int = 0


@dataclass
class Mitigated:
    """A mitigated model: ``with mitigated as model:`` applies the hook (if any) and gives the
    model to evaluate; ``seconds`` the mitigation's wall time, ``steps`` its optimisation steps
    (None for closed forms), ``steer`` the steer of hook methods."""

    model: Any
    seconds: float
    steps: int | None = None
    steer: GSSSteer | None = None
    reached: bool | None = None

    def __enter__(self) -> Any:
        if self.steer is not None:
            self.steer.__enter__()
        return self.model

    def __exit__(self, *exc: object) -> None:
        if self.steer is not None:
            self.steer.__exit__(*exc)


# ------------------------------------------------------------------------------------------------
# steers


@dataclass
class GSS:
    """Gated subspace steering (:func:`~.steer.fit_gss`); ``gated=False`` is the static rank-K
    edit with the same probes and steers."""

    layer: int
    rank: int = 1
    delta: float = 0.05
    alpha_mode: str = "adaptive"
    strength: float = 1.0
    gated: bool = True
    top_fraction: float = 0.1

    def mitigate(self, model: Any, data: MitigationData) -> Mitigated:
        start = time.perf_counter()
        steer = fit_gss(
            model,
            data.memorized,
            data.general,
            reference=data.reference,
            held_out=data.held_out,
            layer=self.layer,
            rank=self.rank,
            delta=self.delta,
            alpha_mode=self.alpha_mode,
            strength=self.strength,
            top_fraction=self.top_fraction,
        )
        steer.gated = self.gated
        return Mitigated(model, time.perf_counter() - start, steer=steer)


@dataclass
class MeanDifference:
    """CAA-style steering: v = mean h(D_mem) − mean h(general tokens) at ``layer`` (D_mem the
    memorized tokens GSS uses, the top ``top_fraction`` by ω);
    h − strength · v at every position, or (``gated``) only where |v̂ᵀ(h − μ)| exceeds its
    ``quantile`` on held-out general tokens (the GSS gate with the CAA direction as probe)."""

    layer: int
    strength: float = 1.0
    gated: bool = False
    quantile: float = 0.95
    top_fraction: float = 0.1

    def mitigate(self, model: Any, data: MitigationData) -> Mitigated:
        start = time.perf_counter()
        _block(model, self.layer)
        mem_h, _ = memorized_activations(
            model,
            data.memorized,
            self.layer,
            reference=data.reference,
            top_fraction=self.top_fraction,
        )
        center = hidden_states(model, data.general, self.layer).mean(0)
        v = mem_h.mean(0) - center
        unit = v / v.norm()
        held = (hidden_states(model, data.held_out, self.layer) - center) @ unit
        eps = torch.quantile(held.abs(), self.quantile)[None]
        steer = GSSSteer(
            self.layer,
            unit[None],
            unit[None],
            eps,
            v.norm()[None],  # −α ν = −v
            delta=0.5,  # unused by the printed coefficient
            alpha_mode="printed",
            strength=self.strength,
            gated=self.gated,
            center=center,
        ).bind(model)
        return Mitigated(model, time.perf_counter() - start, steer=steer)


# ------------------------------------------------------------------------------------------------
# optimisation


def _log_probs(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of the token log-probs of each right-padded row, ``[B]``."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    token = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return (token * mask[:, 1:]).sum(1)


def _mean_nll(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()


@dataclass
class _Optimised:
    """The shared loop: AdamW on ``parameters(copy)`` minimising ``loss(copy, mem, gen)`` (a
    full batch of the memorized sequences and ``general_batch`` general ones), stopping at
    ``data.stop`` or ``max_steps``; the stop checks run in eval mode and are not timed."""

    lr: float = 1e-3
    max_steps: int = 200
    check_every: int = 10
    general_batch: int = 32

    def prepare(self, model: Any, mem: tuple) -> list[torch.nn.Parameter]:
        """Set up ``model`` (the copy, still equal to the original) and return what to train."""
        raise NotImplementedError

    def loss(self, model: Any, mem: tuple, gen: tuple) -> torch.Tensor:
        raise NotImplementedError

    def mitigate(self, model: Any, data: MitigationData) -> Mitigated:
        generator = torch.Generator().manual_seed(data.seed)
        device = next(model.parameters()).device
        seconds, start = 0.0, time.perf_counter()
        edited = copy.deepcopy(model)
        for p in edited.parameters():
            p.requires_grad_(False)
        mem = tuple(t.to(device) for t in next(_batches(data.memorized, len(data.memorized))))
        parameters = self.prepare(edited, mem)
        optimizer = torch.optim.AdamW(parameters, lr=self.lr, weight_decay=0.0)
        seconds += time.perf_counter() - start
        steps, reached = 0, False
        with progress(self.max_steps, f"{type(self).__name__} steps") as bar:
            while steps < self.max_steps:
                start = time.perf_counter()
                edited.train()
                pick = torch.randint(len(data.general), (self.general_batch,), generator=generator)
                gen = next(_batches([data.general[i] for i in pick.tolist()], self.general_batch))
                loss = self.loss(edited, mem, tuple(t.to(device) for t in gen))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                steps += 1
                edited.eval()
                seconds += time.perf_counter() - start
                bar.advance(loss=loss.item())  # not timed, as the stop checks
                if data.stop is not None and steps % self.check_every == 0:
                    with torch.no_grad():
                        reached = bool(data.stop(edited))
                    if reached:
                        break
        return Mitigated(edited, seconds, steps=steps, reached=reached)


@dataclass
class GradientAscent(_Optimised):
    """Raise the NLL of the memorized sequences (all weights)."""

    def prepare(self, model: Any, mem: tuple) -> list[torch.nn.Parameter]:
        for p in model.parameters():
            p.requires_grad_(True)
        return list(model.parameters())

    def loss(self, model: Any, mem: tuple, gen: tuple) -> torch.Tensor:
        return -_mean_nll(model, *mem)


@dataclass
class NPO(_Optimised):
    """Negative preference optimisation (Zhang et al. 2024): −(2/β) log σ(−β log(π_θ(y)/π_ref(y)))
    on each memorized sequence, π_ref the model before unlearning."""

    beta: float = 0.1

    def prepare(self, model: Any, mem: tuple) -> list[torch.nn.Parameter]:
        with torch.no_grad():  # the copy before any step is π_ref: its log-probs, once
            self.reference_log_probs = _log_probs(model, *mem)
        return GradientAscent.prepare(self, model, mem)

    def loss(self, model: Any, mem: tuple, gen: tuple) -> torch.Tensor:
        ratio = _log_probs(model, *mem) - self.reference_log_probs
        return -(2 / self.beta) * F.logsigmoid(-self.beta * ratio).mean()


def _mlp_down(block: torch.nn.Module) -> torch.nn.Module:
    """The MLP's output projection of a decoder block (Llama/Qwen2 ``mlp.down_proj``, GPT-2
    ``mlp.c_proj``)."""
    mlp = getattr(block, "mlp", None)
    for name in ("down_proj", "c_proj", "fc2"):
        if mlp is not None and hasattr(mlp, name):
            return getattr(mlp, name)
    raise ValueError(f"model: no MLP output projection found in {type(block).__name__}")


class _NeuronGate(torch.nn.Module):
    """A hard-concrete gate on the input units of an MLP's output projection (Louizos et al.
    2018): a stretched, clipped binary-concrete sample while training, its deterministic value
    (kept when the keep probability is over 1/2) in eval mode."""

    BETA, GAMMA, ZETA = 2 / 3, -0.1, 1.1

    def __init__(self, units: int, init: float, generator: torch.Generator) -> None:
        super().__init__()
        self.log_alpha = torch.nn.Parameter(torch.full((units,), init))
        self.generator = generator

    def keep_probability(self) -> torch.Tensor:
        """P(gate > 0), the expected L0 term of each unit."""
        return torch.sigmoid(self.log_alpha - self.BETA * math.log(-self.GAMMA / self.ZETA))

    def forward(self, module: torch.nn.Module, args: tuple) -> tuple:
        if self.training:
            u = torch.rand(self.log_alpha.shape, generator=self.generator).clamp(1e-6, 1 - 1e-6)
            s = torch.sigmoid((u.log() - (-u).log1p() + self.log_alpha) / self.BETA)
        else:
            s = (self.log_alpha > 0).float()
        gate = (s * (self.ZETA - self.GAMMA) + self.GAMMA).clamp(0, 1).to(args[0].device)
        return (args[0] * gate.to(args[0].dtype), *args[1:])


@dataclass
class HardConcreteMask(_Optimised):
    """TinyMem's hard-concrete neuron masks: gates on every MLP unit, trained to raise the
    memorized NLL while keeping the general NLL, with an L0 penalty on the units dropped."""

    lr: float = 0.1
    clean_weight: float = 1.0
    l0_weight: float = 1e-3
    init: float = 2.0

    def prepare(self, model: Any, mem: tuple) -> list[torch.nn.Parameter]:
        generator = torch.Generator().manual_seed(0)
        self.gates = []
        for block in decoder_blocks(model):
            down = _mlp_down(block)
            gate = _NeuronGate(down.in_features, self.init, generator)
            block.add_module("hard_concrete_gate", gate)  # model.eval() switches it
            down.register_forward_pre_hook(gate)
            self.gates.append(gate)
        return [g.log_alpha for g in self.gates]

    def loss(self, model: Any, mem: tuple, gen: tuple) -> torch.Tensor:
        dropped = sum((1 - g.keep_probability()).sum() for g in self.gates)
        return (
            -_mean_nll(model, *mem)
            + self.clean_weight * _mean_nll(model, *gen)
            + self.l0_weight * dropped
        )


@dataclass
class BalancedSubnet(_Optimised):
    """TinyMem's BalancedSubnet, small: a score per weight of every MLP output projection;
    the ``prune`` share with the lowest scores is cut (edge-popup, straight-through), the
    scores trained to raise the memorized NLL and keep the general NLL (the balance)."""

    lr: float = 0.01
    prune: float = 0.01
    clean_weight: float = 1.0
    scores: list[torch.nn.Parameter] = field(default_factory=list, repr=False)

    def prepare(self, model: Any, mem: tuple) -> list[torch.nn.Parameter]:
        self.scores = []
        prune = self.prune
        for block in decoder_blocks(model):
            down = _mlp_down(block)
            weight = down.weight.detach().clone()
            score = torch.nn.Parameter(weight.abs().float())
            block.register_parameter("subnet_score", score)

            def masked(module, args, output, weight=weight, score=score):
                k = max(1, int(prune * score.numel()))
                threshold = score.flatten().kthvalue(k).values
                hard = (score > threshold).float()
                mask = hard + score - score.detach() if torch.is_grad_enabled() else hard
                inputs = args[0]
                return F.linear(
                    inputs, weight.to(inputs.dtype) * mask.to(inputs.dtype), module.bias
                )

            down.register_forward_hook(masked)
            self.scores.append(score)
        return self.scores

    def loss(self, model: Any, mem: tuple, gen: tuple) -> torch.Tensor:
        return -_mean_nll(model, *mem) + self.clean_weight * _mean_nll(model, *gen)
