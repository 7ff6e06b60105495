"""GSS: the closed form against a brute-force optimum, the probe budget, the hook (identity when
no gate fires, the sign of the steer, KV cache and bf16, removal), save/load, and clear errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from mixlab.llm_efficiency.gss import GSSSteer, closed_form, fit_gss, load_steer
from mixlab.llm_efficiency.gss.steer import _token_logprobs
from mixlab.llm_efficiency.lm import LMConfig, llama_config

torch.set_num_threads(1)


def _spd(d: int, generator: torch.Generator) -> torch.Tensor:
    a = torch.randn(d, d, generator=generator, dtype=torch.float64)
    return a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)


def test_closed_form_equals_a_brute_force_constrained_optimum():
    generator = torch.Generator().manual_seed(0)
    d, delta = 8, 0.05
    m = torch.randn(d, d, generator=generator, dtype=torch.float64)
    sigma = _spd(d, generator)
    probes, steers, s = closed_form(m, sigma, 1, delta)
    u, v = probes[0].double(), steers[0].double()
    closed = (u @ m @ v).item()
    assert closed == pytest.approx(math.sqrt(delta) * s[0].item(), rel=1e-5)

    # max uᵀMν s.t. uᵀΣu <= δ, ‖ν‖ = 1 by SLSQP from random starts (no use of the theorem)
    mn, sn = m.numpy(), sigma.numpy()
    rng = np.random.default_rng(0)
    best = -np.inf
    for _ in range(20):
        x0 = rng.normal(size=2 * d) * 0.1
        result = minimize(
            lambda x: -(x[:d] @ mn @ x[d:]),
            x0,
            method="SLSQP",
            constraints=[
                {"type": "ineq", "fun": lambda x: delta - x[:d] @ sn @ x[:d]},
                {"type": "eq", "fun": lambda x: x[d:] @ x[d:] - 1},
            ],
            options={"maxiter": 500, "ftol": 1e-12},
        )
        if result.success:
            best = max(best, -result.fun)
    assert best == pytest.approx(closed, rel=1e-4)


def test_probes_spend_exactly_the_budget_delta_and_steers_are_unit():
    generator = torch.Generator().manual_seed(1)
    d, delta = 16, 0.1
    m = torch.randn(d, d, generator=generator, dtype=torch.float64)
    sigma = _spd(d, generator)
    probes, steers, _ = closed_form(m, sigma, 5, delta)
    budget = torch.einsum("kd,de,ke->k", probes.double(), sigma, probes.double())
    assert torch.allclose(budget, torch.full((5,), delta, dtype=torch.float64), rtol=1e-4)
    assert torch.allclose(steers.norm(dim=1), torch.ones(5), atol=1e-5)


def _llama(seed: int = 0, vocab: int = 64):
    torch.manual_seed(seed)
    config = LMConfig(hidden_size=32, layers=2, heads=2, intermediate_size=64)
    return LlamaForCausalLM(llama_config(config, vocab_size=vocab)).eval()


def _qwen2():
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def _gpt2():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64)
    return GPT2LMHeadModel(config).eval()


def _data(seed: int = 0, vocab: int = 64):
    g = torch.Generator().manual_seed(seed)
    memorized = torch.randint(vocab, (6, 16), generator=g)
    general = torch.randint(vocab, (20, 16), generator=g)
    return memorized, general


@pytest.fixture(scope="module")
def model():
    return _llama()


@pytest.fixture(scope="module")
def steer(model):
    memorized, general = _data()
    return fit_gss(model, memorized, general, reference=_llama(1), layer=1, rank=3)


def test_with_infinite_thresholds_the_logits_are_the_unsteered_models_bit_for_bit(model, steer):
    ids = torch.randint(64, (3, 12), generator=torch.Generator().manual_seed(5))
    plain = model(input_ids=ids).logits
    with steer.replace(eps=torch.full((3,), math.inf)) as off:
        assert torch.equal(model(input_ids=ids).logits, plain)
        assert off.gate_rate.sum() == 0
    with steer.replace(gated=False, strength=4.0):
        assert not torch.equal(model(input_ids=ids).logits, plain)
    assert torch.equal(model(input_ids=ids).logits, plain)  # leaving the block removed the hook


def test_the_steer_lowers_the_log_prob_of_the_memorized_tokens(model):
    """The sign trap: with the NLL as the score, the same closed form would raise it."""
    memorized, general = _data(2)
    steer = fit_gss(model, memorized, general, layer=0, rank=2, top_fraction=1.0)
    before = _token_logprobs(model(input_ids=memorized).logits, memorized).sum()
    for mode in ("adaptive", "printed"):
        with steer.replace(gated=False, strength=0.5, alpha_mode=mode):
            after = _token_logprobs(model(input_ids=memorized).logits, memorized).sum()
        assert after < before, mode


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_and_uncached_generation_agree_under_the_hook(dtype):
    model = _llama().to(dtype)
    memorized, general = _data()
    steer = fit_gss(model, memorized, general, layer=1, rank=2, quantile=0.5)
    prompt = memorized[:3, :6]
    with steer:
        cached = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=True)
        fired_cached = steer.any_gate_rate
        steer.reset_stats()
        plain = model.generate(prompt, max_new_tokens=10, do_sample=False, use_cache=False)
    assert fired_cached > 0
    assert torch.equal(cached, plain)


def test_save_load_round_trip(tmp_path, model, steer):
    path = steer.save(tmp_path / "steer.safetensors")
    loaded = load_steer(path, model)
    for name in ("probes", "steers", "eps", "alpha"):
        assert torch.equal(getattr(loaded, name), getattr(steer, name))
    assert loaded.metadata() == steer.metadata()
    ids = torch.randint(64, (2, 10), generator=torch.Generator().manual_seed(3))
    with steer.replace(strength=3.0, gated=False):
        a = model(input_ids=ids).logits
    with loaded.replace(strength=3.0, gated=False):
        b = model(input_ids=ids).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("build", [_llama, _qwen2, _gpt2], ids=["llama", "qwen2", "gpt2"])
def test_fits_and_steers_llama_qwen2_and_gpt2(build):
    model = build()
    memorized, general = _data()
    steer = fit_gss(model, memorized, general, reference=build(), layer=1, rank=2, quantile=0.5)
    ids = memorized[:2]
    plain = model(input_ids=ids).logits
    with steer:
        steered = model(input_ids=ids).logits
    assert steer.any_gate_rate > 0
    assert not torch.equal(steered, plain)


def test_bad_inputs_are_clear_value_errors(model):
    memorized, general = _data()
    cases = [
        (dict(layer=2), "layer must be an integer from 0 to 1"),
        (dict(layer=0, rank=0), "rank must be an integer from 1"),
        (dict(layer=0, rank=33), "rank must be an integer from 1 to the hidden size 32"),
        (dict(layer=0, delta=1.0), "delta must be a number in \\(0, 1\\)"),
        (dict(layer=0, delta=0), "delta must be a number in \\(0, 1\\)"),
        (dict(layer=0, reference=_llama(vocab=80)), "reference: its vocabulary has 80"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            fit_gss(model, memorized, general, **kwargs)
    with pytest.raises(ValueError, match="memorized must be a non-empty list"):
        fit_gss(model, [], general, layer=0)
    with pytest.raises(ValueError, match="memorized must be sequences of at least 2 tokens"):
        fit_gss(model, [[1]], general, layer=0)


def test_a_steer_of_another_width_or_an_unknown_architecture_is_refused(steer):
    wide = LlamaForCausalLM(
        llama_config(
            LMConfig(hidden_size=64, layers=2, heads=2, intermediate_size=64), vocab_size=64
        )
    )
    with pytest.raises(ValueError, match="steer: fitted on hidden size 32, the model's is 64"):
        steer.replace(model=None).bind(wide)

    class NoBlocks(torch.nn.Module):
        config = None

    with pytest.raises(ValueError, match="model: no decoder block list found in NoBlocks"):
        steer.replace(model=None).bind(NoBlocks())
    with pytest.raises(ValueError, match="steer: not bound to a model"), steer.replace(model=None):
        pass


def test_a_file_that_holds_no_steer_is_refused(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="steer: .* is not a safetensors file"):
        load_steer(bad)
    with pytest.raises(ValueError, match="steer: .* is not a file"):
        load_steer(tmp_path / "missing.safetensors")
    from safetensors.torch import save_file

    save_file({"U": torch.zeros(1, 2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="holds no GSS steer"):
        load_steer(tmp_path / "other.safetensors")


def test_steer_fields_are_checked():
    with pytest.raises(ValueError, match="steers must be a 2 x 4 tensor"):
        GSSSteer(0, torch.zeros(2, 4), torch.zeros(3, 4), torch.zeros(2), torch.zeros(2), 0.1)
    with pytest.raises(ValueError, match="alpha_mode must be one of"):
        GSSSteer(0, torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(2), torch.zeros(2), 0.1, "x")
