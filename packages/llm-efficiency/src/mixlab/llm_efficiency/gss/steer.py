"""Gated subspace steering: the closed-form probe/steer pairs, their fit and the decoder-layer hook.

At one decoder layer's output h ∈ R^d, rank K (arXiv 2602.08901)::

    h' = h − strength · Σ_k α_k(h) · 1[|u_kᵀh| > ε_k] · ν_k

- ω_t = log p_model(x_t | x_<t) − log p_ref(x_t | x_<t), the excess code length of each token
  of the memorized sequences over a reference model that did not see them; D_mem = the tokens
  with the top ``top_fraction`` of ω (h read at the position that predicts them).
- g = ∂S/∂h with S = Σ_{t ∈ D_mem} log p_model(x_t | x_<t): a score whose *decrease* means less
  memorization. Steering h by Δh = −(uᵀh)ν changes S by ≈ −uᵀ(h gᵀ)ν, so maximising uᵀMν with
  M = E_{D_mem}[h gᵀ] lowers it (the sign trap: with the NLL as the score the steer would
  *raise* memorization).
- Σ_gen = Cov(h) on general tokens + ρI = LLᵀ; max Σ_k u_kᵀMν_k s.t. u_kᵀΣ_gen u_k ≤ δ (by
  Chebyshev the probe reaches 1 on at most a δ share of general tokens), ‖ν_k‖ = 1 is solved by
  the SVD L⁻¹M = ŨSṼᵀ: u_k = √δ L⁻ᵀũ_k, ν_k = ṽ_k (:func:`closed_form`).
- ε_k = the ``quantile`` of |u_kᵀ(h − μ)| on held-out general tokens, μ the general tokens'
  mean: the gate fires on about 1 − quantile of general tokens per probe. The paper writes uᵀh;
  its Chebyshev reading of the budget (P(|uᵀ(h − μ)| ≥ 1) ≤ uᵀΣu ≤ δ) is about centred states,
  and M is centred alike.
- α, two readings (the paper prints an h-independent Tikhonov solution of an h-dependent
  objective): ``"printed"`` α_k = |c_k| / (c_k² + δ) with c_k = ⟨u_k, ν_k⟩; ``"adaptive"`` the
  stationary point of (⟨h,u⟩ − α⟨ν,u⟩ − ε)² + δα², α_k(h) = |c_k| (u_kᵀh − sign(u_kᵀh) ε_k) /
  (c_k² + δ), which moves the probe back to the gate's edge. The paper's α has c_k, not |c_k|:
  with c_k < 0 (a sign no flip of the pair changes) it would steer towards more memorization.
  ``strength`` scales either (1 is the paper's; the experiment picks it on validation).

Each pair's sign is fixed so that the memorized tokens' mean probe value is positive: the pair
(−u, −ν) has the same objective, but the printed steer −α ν is not sign-symmetric.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mixlab.llm_efficiency.lm import decoder_blocks
from mixlab.shared import is_count, require

__all__ = [
    "ALPHA_MODES",
    "GSSSteer",
    "closed_form",
    "fit_gss",
    "hidden_states",
    "load_steer",
    "memorization_signal",
    "memorized_activations",
]

ALPHA_MODES = ("printed", "adaptive")
FORMAT = "mixlab.gss/1"


def _open_unit(value: object) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and 0 < value < 1


def _hidden_size(model: Any) -> int:
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not isinstance(size, int):
        raise ValueError(f"model: {type(model).__name__} has no config.hidden_size")
    return size


def _block(model: Any, layer: int) -> torch.nn.Module:
    blocks = decoder_blocks(model)
    require(
        is_count(layer, 0) and layer < len(blocks),
        "layer",
        f"an integer from 0 to {len(blocks) - 1} (the model has {len(blocks)} decoder blocks)",
        layer,
    )
    return blocks[layer]


def _sequences(sequences: Any, name: str, min_length: int = 2) -> list[torch.Tensor]:
    """Token-id sequences (lists, 1-D tensors or the rows of a 2-D tensor) as 1-D LongTensors."""
    if isinstance(sequences, torch.Tensor):
        sequences = list(sequences) if sequences.dim() == 2 else [sequences]
    rows = [torch.as_tensor(s, dtype=torch.long).flatten() for s in sequences or []]
    require(len(rows) > 0, name, "a non-empty list of token-id sequences", sequences)
    short = [len(r) for r in rows if len(r) < min_length]
    require(
        not short,
        name,
        f"sequences of at least {min_length} tokens",
        f"one of {short[0]}" if short else "",
    )
    return rows


def _batches(rows: list[torch.Tensor], batch_size: int):
    """Right-padded batches ``(ids, mask)`` of ``rows``."""
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(r) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            ids[i, : len(r)], mask[i, : len(r)] = r, 1
        yield ids, mask


class _Capture:
    """A forward hook that keeps a block's output hidden state (Llama blocks return a tensor,
    GPT-2 blocks a tuple whose first element is it)."""

    def __init__(self, block: torch.nn.Module, *, leaf: bool = False) -> None:
        self.hidden: torch.Tensor | None = None
        self.leaf = leaf
        self.handle = block.register_forward_hook(self)

    def __call__(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if not self.leaf:
            self.hidden = hidden
            return None
        # a leaf that needs a gradient: ∂/∂h works on frozen models and stops backprop here
        self.hidden = hidden.detach().requires_grad_()
        return (self.hidden, *output[1:]) if isinstance(output, tuple) else self.hidden

    def close(self) -> None:
        self.handle.remove()


def _token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log p(x_{t+1} | x_≤t) at every position t < T − 1, ``[B, T − 1]``."""
    return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]


@torch.no_grad()
def hidden_states(model: Any, sequences: Any, layer: int, *, batch_size: int = 64) -> torch.Tensor:
    """The output of decoder block ``layer`` at every token of ``sequences``, ``[tokens, d]``
    (float32, on the CPU)."""
    block = _block(model, layer)
    rows = _sequences(sequences, "sequences", min_length=1)
    device = next(model.parameters()).device
    capture, out = _Capture(block), []
    try:
        for ids, mask in _batches(rows, batch_size):
            model(input_ids=ids.to(device), attention_mask=mask.to(device))
            out.append(capture.hidden.float()[mask.bool().to(device)].cpu())
    finally:
        capture.close()
    return torch.cat(out)


def memorization_signal(
    model: Any, sequences: Any, reference: Any = None, *, batch_size: int = 64
) -> list[torch.Tensor]:
    """ω_t per predicted token of each sequence (length − 1 values each): the model's log-prob
    minus the reference's, or the model's log-prob alone without a reference (weaker: it is
    high on every easy token, memorized or not)."""
    rows = _sequences(sequences, "memorized")
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for ids, mask in _batches(rows, batch_size):
            ids_d, mask_d = ids.to(device), mask.to(device)
            omega = _token_logprobs(model(input_ids=ids_d, attention_mask=mask_d).logits, ids_d)
            if reference is not None:
                ref_logits = reference(input_ids=ids_d, attention_mask=mask_d).logits
                omega = omega - _token_logprobs(ref_logits, ids_d)
            for i, length in enumerate(mask.sum(1).tolist()):
                out.append(omega[i, : length - 1].float().cpu())
    return out


def memorized_activations(
    model: Any,
    memorized: Any,
    layer: int,
    *,
    reference: Any = None,
    top_fraction: float = 0.1,
    batch_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, g)`` over D_mem, each ``[tokens, d]`` (float32, CPU): the output of block ``layer``
    at the positions that predict the memorized sequences' top-``top_fraction`` tokens by ω,
    and g = ∂S/∂h there, S the sum of those tokens' log-probs (a score whose decrease means
    less memorization)."""
    block = _block(model, layer)
    rows = _sequences(memorized, "memorized")
    omega = memorization_signal(model, rows, reference, batch_size=batch_size)
    cutoff = torch.quantile(torch.cat(omega), 1 - top_fraction) if top_fraction < 1 else -math.inf
    device = next(model.parameters()).device
    capture = _Capture(block, leaf=True)
    hs, gs = [], []
    try:
        for start in range(0, len(rows), batch_size):
            ids, mask = next(_batches(rows[start : start + batch_size], batch_size))
            chosen = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
            for i, w in enumerate(omega[start : start + batch_size]):
                chosen[i, : len(w)] = w >= cutoff
            if not chosen.any():
                continue
            with torch.enable_grad():
                ids_d = ids.to(device)
                logits = model(input_ids=ids_d, attention_mask=mask.to(device)).logits
                hidden = capture.hidden
                score = _token_logprobs(logits, ids_d)[chosen.to(device)].sum()
                (grad,) = torch.autograd.grad(score, hidden)
            picked = chosen.to(device)
            hs.append(hidden.detach()[:, :-1][picked].float().cpu())
            gs.append(grad[:, :-1][picked].float().cpu())
    finally:
        capture.close()
    if not hs:
        raise ValueError("memorized: no token passed the top_fraction cut-off of the signal ω")
    return torch.cat(hs), torch.cat(gs)


def closed_form(
    memorization: torch.Tensor, covariance: torch.Tensor, rank: int, delta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(U, V, S)``: the top-``rank`` probes u_k (rows of U), unit steers ν_k (rows of V) and
    singular values s_k maximising Σ_k u_kᵀMν_k subject to u_kᵀΣu_k ≤ δ, ‖ν_k‖ = 1 (each pair
    attains √δ s_k). Σ must be symmetric positive definite (add the ridge before)."""
    d = memorization.shape[0]
    require(is_count(rank) and rank <= d, "rank", f"an integer from 1 to d = {d}", rank)
    require(_open_unit(delta), "delta", "a number in (0, 1)", delta)
    m, sigma = memorization.double(), covariance.double()
    chol = torch.linalg.cholesky(sigma)
    m_op = torch.linalg.solve_triangular(chol, m, upper=False)  # L⁻¹M
    u_tilde, s, v_tilde_t = torch.linalg.svd(m_op)
    probes = math.sqrt(delta) * torch.linalg.solve_triangular(
        chol.T, u_tilde[:, :rank], upper=True
    )  # √δ L⁻ᵀ ũ_k, as columns
    return probes.T.float(), v_tilde_t[:rank].float(), s[:rank].float()


@dataclass
class GSSSteer:
    """A fitted gated steer at decoder block ``layer``, and a context manager that applies it::

        steer = fit_gss(model, memorized, general, reference=ref, layer=2, rank=5)
        with steer:                       # hooks model's block 2; removed on exit
            model.generate(input_ids, max_new_tokens=20)
        steer.gate_rate                   # share of the positions each probe fired on

    ``probes`` (U, K×d), ``steers`` (V, K×d), ``eps`` (K), ``alpha`` (K, the printed α_k),
    ``center`` (μ, d: probes read u_kᵀ(h − μ); zeros by default). With
    ``gated=False`` every position is steered (ε read as 0): the static rank-K edit. Works under
    ``generate`` with a KV cache (each new position is gated on its own h) and in any dtype (the
    steer is computed in float32 and cast back)."""

    layer: int
    probes: torch.Tensor
    steers: torch.Tensor
    eps: torch.Tensor
    alpha: torch.Tensor
    delta: float
    alpha_mode: str = "adaptive"
    strength: float = 1.0
    gated: bool = True
    center: torch.Tensor | None = None
    model: Any = field(default=None, repr=False, compare=False)
    fired: torch.Tensor = field(init=False, repr=False, compare=False)
    seen: int = field(default=0, init=False, repr=False, compare=False)
    fired_any: int = field(default=0, init=False, repr=False, compare=False)
    last_fired: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    _handle: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require(is_count(self.layer, 0), "layer", "an integer >= 0", self.layer)
        k, d = self.probes.shape
        for name in ("steers",):
            require(
                getattr(self, name).shape == (k, d),
                name,
                f"a {k} x {d} tensor",
                tuple(getattr(self, name).shape),
            )
        for name in ("eps", "alpha"):
            require(
                getattr(self, name).shape == (k,),
                name,
                f"a tensor of {k} values",
                tuple(getattr(self, name).shape),
            )
        require(_open_unit(self.delta), "delta", "a number in (0, 1)", self.delta)
        require(
            self.alpha_mode in ALPHA_MODES, "alpha_mode", f"one of {ALPHA_MODES}", self.alpha_mode
        )
        require(
            isinstance(self.strength, float | int)
            and math.isfinite(self.strength)
            and self.strength >= 0,
            "strength",
            "a finite number >= 0",
            self.strength,
        )
        self.probes, self.steers = self.probes.float(), self.steers.float()
        self.eps, self.alpha = self.eps.float(), self.alpha.float()
        if self.center is None:
            self.center = torch.zeros(d)
        require(
            self.center.shape == (d,), "center", f"a tensor of {d} values", tuple(self.center.shape)
        )
        self.center = self.center.float()
        self.fired = torch.zeros(k, dtype=torch.long)

    @property
    def rank(self) -> int:
        return self.probes.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.probes.shape[1]

    @property
    def gate_rate(self) -> torch.Tensor:
        """Per probe, the share of the positions seen since the last :meth:`reset_stats` it fired on."""
        return self.fired.float() / max(self.seen, 1)

    @property
    def any_gate_rate(self) -> float:
        """The share of the positions seen since the last :meth:`reset_stats` that were steered."""
        return self.fired_any / max(self.seen, 1)

    def reset_stats(self) -> None:
        self.fired.zero_()
        self.seen, self.fired_any, self.last_fired = 0, 0, None

    def replace(self, **changes: Any) -> GSSSteer:
        """A copy with some settings changed (``gated``, ``strength``, ``alpha_mode``, ``model``)."""
        values = {
            name: getattr(self, name)
            for name in (
                "layer",
                "probes",
                "steers",
                "eps",
                "alpha",
                "delta",
                "alpha_mode",
                "strength",
                "gated",
                "center",
                "model",
            )
        }
        return GSSSteer(**{**values, **changes})

    def bind(self, model: Any) -> GSSSteer:
        """Attach to ``model`` (checked: the layer exists, the widths agree); returns self."""
        _block(model, self.layer)
        width = _hidden_size(model)
        if width != self.hidden_size:
            raise ValueError(
                f"steer: fitted on hidden size {self.hidden_size}, the model's is {width}"
            )
        self.model = model
        return self

    # -- the hook -------------------------------------------------------------------------------

    def delta_h(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(Δh, fired)`` for hidden states ``[..., d]``: the steer to add and the gates ``[..., K]``."""
        h = hidden.float()
        projection = (h - self.center.to(h.device)) @ self.probes.to(h.device).T  # u_kᵀ(h − μ)
        eps = self.eps.to(h.device)
        alpha = self.alpha.to(h.device)
        if self.gated:
            fired = projection.abs() > eps
        else:
            fired = torch.ones_like(projection, dtype=torch.bool)
            eps = torch.zeros_like(eps)
        if self.alpha_mode == "adaptive":  # α_k(h) = c_k (u_kᵀh − sign(u_kᵀh) ε_k) / (c_k² + δ)
            coefficient = alpha * (projection - projection.sign() * eps)
        else:
            coefficient = alpha.expand_as(projection)
        coefficient = coefficient * fired * self.strength
        return -(coefficient @ self.steers.to(h.device)), fired

    def _hook(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        change, fired = self.delta_h(hidden)
        self.seen += fired.numel() // self.rank
        self.fired += fired.reshape(-1, self.rank).sum(0).cpu()
        self.fired_any += int(fired.any(-1).sum())
        self.last_fired = fired.detach().cpu()
        if not fired.any():
            return None  # untouched: the unsteered model's output, bit for bit
        steered = (hidden.float() + change).to(hidden.dtype)
        return (steered, *output[1:]) if isinstance(output, tuple) else steered

    def __enter__(self) -> GSSSteer:
        if self.model is None:
            raise ValueError("steer: not bound to a model: call steer.bind(model) first")
        if self._handle is not None:
            raise RuntimeError("steer: already active (its with-block is not reentrant)")
        # first among the block's hooks: transformers records output_hidden_states with its own
        # forward hooks, which then see the steered state, as the next block does
        self._handle = _block(self.model, self.layer).register_forward_hook(
            self._hook, prepend=True
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # -- files ----------------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "layer": self.layer,
            "rank": self.rank,
            "hidden_size": self.hidden_size,
            "delta": self.delta,
            "alpha_mode": self.alpha_mode,
            "strength": self.strength,
            "gated": self.gated,
        }

    def save(self, path: str | Path) -> Path:
        """Write ``{U, V, eps, alpha, center}`` as safetensors with the settings as JSON in its
        header."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {
            "U": self.probes,
            "V": self.steers,
            "eps": self.eps,
            "alpha": self.alpha,
            "center": self.center,
        }
        save_file(
            {k: v.contiguous() for k, v in tensors.items()},
            str(path),
            metadata={"gss": json.dumps(self.metadata())},
        )
        return path


def load_steer(path: str | Path, model: Any = None) -> GSSSteer:
    """A steer saved by :meth:`GSSSteer.save`, bound to ``model`` when given."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"steer: {path} is not a file")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("gss", "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise ValueError(f"steer: {path} is not a safetensors file ({error})") from None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != FORMAT
        or set(tensors) != {"U", "V", "eps", "alpha", "center"}
    ):
        raise ValueError(f"steer: {path} holds no GSS steer (format {FORMAT})")
    steer = GSSSteer(
        layer=meta["layer"],
        probes=tensors["U"],
        steers=tensors["V"],
        eps=tensors["eps"],
        alpha=tensors["alpha"],
        delta=meta["delta"],
        alpha_mode=meta["alpha_mode"],
        strength=meta["strength"],
        gated=meta["gated"],
        center=tensors["center"],
    )
    return steer.bind(model) if model is not None else steer


def fit_gss(
    model: Any,
    memorized: Any,
    general: Any,
    *,
    reference: Any = None,
    layer: int,
    rank: int = 1,
    delta: float = 0.05,
    quantile: float = 0.95,
    top_fraction: float = 0.1,
    ridge: float = 1e-3,
    held_out: Any = None,
    alpha_mode: str = "adaptive",
    strength: float = 1.0,
    batch_size: int = 64,
) -> GSSSteer:
    """Fit a gated steer on ``model`` in closed form and return it bound to the model.

    ``memorized``: token-id sequences the model regurgitates; ``general``: sequences of text it
    should keep (their tokens give Σ_gen); ``held_out``: more general sequences for the gate
    thresholds ε (default: every second sequence of ``general``); ``reference``: a model with
    the same vocabulary that did not see the memorized data (without it ω is the model's own
    log-prob, a weaker signal). ``top_fraction`` of the memorized tokens by ω form D_mem; the
    ridge is relative (ρ = ridge · tr(Σ)/d)."""
    _block(model, layer)  # checks the layer first
    d = _hidden_size(model)
    require(is_count(rank) and rank <= d, "rank", f"an integer from 1 to the hidden size {d}", rank)
    require(_open_unit(delta), "delta", "a number in (0, 1)", delta)
    require(_open_unit(quantile), "quantile", "a number in (0, 1)", quantile)
    require(
        _open_unit(top_fraction) or top_fraction == 1,
        "top_fraction",
        "a number in (0, 1]",
        top_fraction,
    )
    require(isinstance(ridge, float | int) and ridge > 0, "ridge", "a number > 0", ridge)
    require(alpha_mode in ALPHA_MODES, "alpha_mode", f"one of {ALPHA_MODES}", alpha_mode)
    if reference is not None:
        vocab, ref_vocab = (
            model.get_output_embeddings().out_features,
            reference.get_output_embeddings().out_features,
        )
        if vocab != ref_vocab:
            raise ValueError(
                f"reference: its vocabulary has {ref_vocab} tokens, the model's {vocab}"
            )
    mem_rows = _sequences(memorized, "memorized")
    general_rows = _sequences(general, "general", min_length=1)
    if held_out is None:
        require(
            len(general_rows) >= 2,
            "general",
            "at least 2 sequences (half hold out the thresholds)",
            len(general_rows),
        )
        general_rows, held_rows = general_rows[::2], general_rows[1::2]
    else:
        held_rows = _sequences(held_out, "held_out", min_length=1)

    mem_h, mem_g = memorized_activations(
        model,
        mem_rows,
        layer,
        reference=reference,
        top_fraction=top_fraction,
        batch_size=batch_size,
    )
    gen_h = hidden_states(model, general_rows, layer, batch_size=batch_size).double()
    if len(gen_h) < 2:
        raise ValueError("general: at least 2 tokens are needed for a covariance")
    center = gen_h.mean(0)
    # M = E_{D_mem}[(h − μ) gᵀ]: centred, as the Chebyshev reading of the budget needs (uᵀΣu is
    # the variance of uᵀ(h − μ), not of uᵀh); uncentred, M = E[(h − μ)gᵀ] + μ E[g]ᵀ would also
    # carry the residual stream's common mean, which no token-level gate can use
    mem_c = mem_h.double() - center
    m = mem_c.T @ mem_g.double() / len(mem_h)
    covariance = torch.cov(gen_h.T)
    covariance += ridge * covariance.trace() / d * torch.eye(d, dtype=torch.float64)
    probes, steers, _ = closed_form(m, covariance, rank, delta)
    # orient each pair so that memorized tokens sit on the positive side of the probe
    side = torch.sign((mem_c.float() @ probes.T).mean(0))
    side[side == 0] = 1
    probes, steers = probes * side[:, None], steers * side[:, None]
    held = hidden_states(model, held_rows, layer, batch_size=batch_size)
    eps = torch.quantile(((held - center.float()) @ probes.T).abs(), quantile, dim=0)
    c = (probes * steers).sum(1)
    # the printed α_k = c_k / (c_k² + δ), c_k = ⟨u_k, ν_k⟩, taken positive: the pair's sign
    # does not change c_k, and with c_k < 0 the printed α would push h along +ν (more memorization)
    alpha = c.abs() / (c**2 + delta)
    steer = GSSSteer(
        layer, probes, steers, eps, alpha, delta, alpha_mode, strength, center=center.float()
    )
    return steer.bind(model)
