"""MoBiQuant's read paths and run-time knobs: the packed int4 read, graph breaks under
torch.compile, the budget under generate(), set_budget without a forward, and what a saved folder
holds."""

from __future__ import annotations

import functools

import pytest
import torch
from safetensors import safe_open

from mixlab.llm_efficiency.mobiquant import (
    MoBiLinear,
    MoBiQuantConfig,
    SliceSpec,
    average_bits,
    quantize_,
    save_quantized,
    set_budget,
    set_precision,
)
from mixlab.llm_efficiency.mobiquant.kernel import int4_applies
from mixlab.llm_efficiency.mobiquant.model import decoder_blocks, mobi_layers

FAST = {"calib_steps": 8, "router_steps": 8, "calib_batch": 2, "group_size": 32}


@functools.cache
def _calibrated():
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=640,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    calib = torch.randint(256, (16, 48), generator=torch.Generator().manual_seed(1))
    return quantize_(model, MoBiQuantConfig(**FAST), calib=calib), calib


@pytest.fixture
def calibrated():
    model, calib = _calibrated()
    set_precision(model, None)
    return model, calib


def _layer(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> MoBiLinear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(256, 96).to(dtype)
    return MoBiLinear.from_linear(linear, SliceSpec(bits=2, slices=4, group_size=64))


def test_packed_int4_read_equals_the_dequantized_matmul_in_bf16():
    layer = _layer()
    x = torch.randn(7, 256, dtype=torch.bfloat16)
    assert int4_applies(layer.spec, 2, x.device, layer.out_features)
    got = layer(x, precision=2).float()
    assert len(layer._int4) == 1  # the packed kernel ran
    exact = x.float() @ layer.weight_at(2).float().T + layer.bias.float()
    assert ((got - exact).norm() / exact.norm()).item() < 1e-2
    # new planes drop the packed copy, and the read follows them
    layer.set_weight(torch.randn(96, 256), *_layer(seed=1).weight_at(2).new_ones(2, 96, 4))
    assert not layer._int4
    exact = x.float() @ layer.weight_at(2).float().T + layer.bias.float()
    got = layer(x, precision=2).float()
    assert ((got - exact).norm() / exact.norm()).item() < 1e-2


@pytest.mark.parametrize("depth", [1, 3, 4])
def test_other_fixed_reads_equal_the_dequantized_matmul(depth):
    layer = _layer()
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    got = layer(x, precision=depth).float()
    exact = x.float() @ layer.weight_at(depth).float().T + layer.bias.float()
    assert not layer._int4
    assert ((got - exact).norm() / exact.norm()).item() < 1e-2


def test_wide_layer_reads_in_blocks_with_gradients_and_backend_reference():
    torch.manual_seed(0)
    layer = MoBiLinear.from_linear(torch.nn.Linear(128, 1040), SliceSpec(2, 4, 64))  # 3 blocks
    x = torch.randn(3, 128)
    for depth in (1, 3):
        exact = x @ layer.weight_at(depth).T + layer.bias
        torch.testing.assert_close(layer(x, precision=depth), exact, rtol=1e-5, atol=1e-5)
    x.requires_grad_(True)  # the blocked read writes no out=; autograd goes through F.linear
    layer(x, precision=3).sum().backward()
    torch.testing.assert_close(x.grad, layer.weight_at(3).sum(0).expand(3, -1))
    layer.backend = "reference"
    layer(x.detach(), precision=2)
    assert not layer._int4  # "reference" forces the dequantized read


def test_mixed_depths_equal_each_tokens_own_read():
    layer = _layer(dtype=torch.float32)
    x = torch.randn(6, 256)
    layer.token_depth, layer.token_depths = torch.tensor([1, 2, 3, 4, 2, 1]), None
    got = layer(x)
    for row, depth in enumerate([1, 2, 3, 4, 2, 1]):
        expected = x[row] @ layer.weight_at(depth).float().T + layer.bias
        torch.testing.assert_close(got[row], expected, rtol=1e-5, atol=1e-5)
    layer.token_depth, layer.token_depths = torch.tensor([2, 3, 3, 2, 2, 3]), (2, 3)
    expected = torch.stack([x[r] @ layer.weight_at(d).T for r, d in enumerate([2, 3, 3, 2, 2, 3])])
    torch.testing.assert_close(layer(x), expected + layer.bias, rtol=1e-5, atol=1e-5)


def _graph_breaks(module, *args) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(module)(*args)
    return explained.graph_break_count, [str(r.reason)[:200] for r in explained.break_reasons]


def test_no_graph_breaks_for_fixed_and_mixed_depths(calibrated):
    model, _ = calibrated
    ids = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(2))
    for knob in (lambda: set_precision(model, 2), lambda: set_budget(model, 3.0)):
        knob()
        model(ids)  # eager first: the 4-bit read packs its int4 copy here
        assert _graph_breaks(model, ids) == (0, [])
    assert model.model.layers[0].mlp.up_proj.token_depths == (1, 2)  # mixed depths ran
    layer = _layer(dtype=torch.float32)
    layer.token_depth = torch.randint(1, 5, (9,), generator=torch.Generator().manual_seed(3))
    assert _graph_breaks(layer, torch.randn(9, 256)) == (0, [])


def test_refitting_thresholds_and_a_refused_budget_keep_the_models_setting(calibrated):
    from mixlab.llm_efficiency.mobiquant import fit_thresholds
    from mixlab.llm_efficiency.mobiquant.model import run_settings

    model, calib = calibrated
    ids = torch.randint(256, (4, 48), generator=torch.Generator().manual_seed(5))
    set_budget(model, 3.0)
    fit_thresholds(model, calib[:8])
    assert run_settings(model)["budget"] == 3.0
    with torch.no_grad():
        model(ids)
    assert abs(average_bits(model) - 3.0) <= 0.1
    set_precision(model, 2)
    fit_thresholds(model, calib[:8])
    with pytest.raises(ValueError, match="multiple of 0.25 bits"):
        set_budget(model, 3.1)
    assert run_settings(model)["precision"] == 2
    assert {layer.precision for layer in mobi_layers(decoder_blocks(model)[1])} == {2}


def test_set_budget_runs_no_forward(calibrated):
    model, _ = calibrated
    calls = []
    handles = [
        b.register_forward_pre_hook(lambda *a: calls.append(1)) for b in decoder_blocks(model)
    ]
    try:
        for budget in (2.0, 2.5, 3.25, 6.0, 8.0):
            set_budget(model, budget)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == []
    with pytest.raises(ValueError, match="multiple of 0.25 bits"):
        set_budget(model, 3.1)


def test_generate_holds_the_budget_over_512_tokens(calibrated):
    model, _ = calibrated
    budget = 3.0
    set_budget(model, budget)
    prompt = torch.randint(256, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = model.generate(
            prompt, max_new_tokens=520, min_new_tokens=520, do_sample=True, top_k=0,
            pad_token_id=0,
        )  # fmt: skip
    assert out.shape[1] - prompt.shape[1] >= 512
    assert abs(average_bits(model) - budget) <= 0.1
    # the guard held each block within GUARD_TOKENS (+1: the last call's rounding) of it
    for router in (b.mobi_router for b in decoder_blocks(model)):
        assert abs(router.excess.item()) <= router.GUARD_TOKENS + 1


def test_cli_refuses_a_budget_without_thresholds(calibrated, tmp_path, capsys):
    from mixlab.llm_efficiency.cli import main

    model, _ = calibrated
    folder = save_quantized(model, tmp_path / "q")
    (tmp_path / "text.txt").write_bytes(bytes(range(256)) * 4)
    evaluate = ["mobiquant", "eval", "--model", str(folder), "--text", str(tmp_path / "text.txt")]
    assert main([*evaluate, "--avg-bits", "3.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--avg-bits must be a multiple of 0.25 for a routed model" in err[0]
    assert main([*evaluate, "--avg-bits", "3.25", "--seq-len", "64"]) == 0
    assert "average bits 3.2" in capsys.readouterr().out


def test_saved_folder_holds_no_calibration_tokens(calibrated, tmp_path):
    model, calib = calibrated
    set_budget(model, 3.0)
    folder = save_quantized(model, tmp_path / "q")
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        keys = list(handle.keys())
        integer = [k for k in keys if not handle.get_tensor(k).is_floating_point()]
    assert not [k for k in keys if "calib" in k or "token" in k.split(".")[-1]]
    # the only integer tensors are the bit planes (uint8); no token ids anywhere
    assert {k.rsplit(".", 1)[-1] for k in integer} == {"planes"}
    raw = (folder / "model.safetensors").read_bytes()
    assert calib[0].to(torch.int64).numpy().tobytes() not in raw
    assert len(mobi_layers(decoder_blocks(model)[0])) == 7
