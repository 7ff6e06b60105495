"""MoBiQuant: slices, layer, router, model walker, save/load, baselines, CLI and experiment.

The kernel against its reference (under TRITON_INTERPRET=1) is in test_mobiquant_kernel.py.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json

import pytest
import torch

from mixlab.llm_efficiency.mobiquant import (
    MoBiLinear,
    MoBiQuantConfig,
    SliceSpec,
    average_bits,
    gptq_,
    load_quantized,
    matryoshka_,
    quantize_,
    rtn_,
    save_quantized,
    set_budget,
    set_precision,
)
from mixlab.llm_efficiency.mobiquant.baselines import gptq_weight, minmax_affine
from mixlab.llm_efficiency.mobiquant.model import decoder_blocks, mobi_layers
from mixlab.llm_efficiency.mobiquant.slices import (
    combine,
    dequantize,
    group_range,
    search_clip,
    slice_codes,
)

FAST = {"calib_steps": 12, "router_steps": 12, "calib_batch": 2}


def tiny(kind: str, seed: int = 0):
    """A randomly initialised tiny causal LM of the family ``kind`` (hidden 64)."""
    from transformers import (
        AutoModelForCausalLM,
        GPT2Config,
        LlamaConfig,
        MistralConfig,
        Qwen2Config,
    )

    torch.manual_seed(seed)
    common = {"vocab_size": 256}
    if kind == "gpt2":
        config = GPT2Config(n_embd=64, n_layer=2, n_head=2, n_positions=64, **common)
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[kind]
        config = cls(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **common,
        )
    return AutoModelForCausalLM.from_config(config).eval()


def tokens(sequences: int, length: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randint(256, (sequences, length), generator=torch.Generator().manual_seed(seed))


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return ((approx - exact).pow(2).mean() / exact.pow(2).mean()).sqrt().item()


# --- MoBiSlice ------------------------------------------------------------------------------


def test_lower_precision_is_the_higher_one_with_bits_dropped():
    spec = SliceSpec(bits=2, slices=4, group_size=32)
    weight = torch.randn(16, 64)
    scale, zero = group_range(weight, spec)
    codes = slice_codes(weight, scale, zero, spec)
    full = combine(codes, 4, 2)
    for depth in range(1, 4):
        assert torch.equal(combine(codes, depth, 2), full >> (2 * (4 - depth)))
    # and the recursion is the floor quantizer at the finest step, truncated
    finest = (
        (weight / scale.repeat_interleave(32, 1) + zero.repeat_interleave(32, 1)) * 64
    ).floor()
    assert torch.equal(full, finest.clamp(0, 255).int())


def test_error_falls_at_least_3_5x_per_slice_and_clipping_saturates_deep_reads():
    spec = SliceSpec(bits=2, slices=4, group_size=64)
    weight = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))

    def errors(clip: float) -> list[float]:
        scale, zero = group_range(weight, spec, clip)
        codes = slice_codes(weight, scale, zero, spec)
        return [
            relative_error(dequantize(codes, scale, zero, spec, d), weight) for d in range(1, 5)
        ]

    unclipped, clipped = errors(1.0), errors(0.85)
    for coarse, fine in itertools.pairwise(unclipped):
        assert coarse / fine >= 3.5
    # the clipping question: clipping helps the 2-bit read but ruins the 8-bit one (saturation)
    assert clipped[0] < unclipped[0]
    assert clipped[3] > 5 * unclipped[3]
    # and the depth-averaged search therefore keeps Gaussian groups unclipped
    assert (search_clip(weight, spec) == 1.0).float().mean() > 0.9


def test_bad_configs_raise_clear_errors():
    with pytest.raises(ValueError, match="bits must divide 8"):
        SliceSpec(bits=3)
    with pytest.raises(ValueError, match="group_size=48 must divide the input width"):
        quantize_(tiny("llama"), MoBiQuantConfig(group_size=48, router=False))
    with pytest.raises(ValueError, match="unknown layer type LlamaRMSNorm"):
        quantize_(
            tiny("llama"), MoBiQuantConfig(router=False, target_modules=(r"input_layernorm",))
        )
    with pytest.raises(ValueError, match="calib: router=True needs calibration tokens"):
        quantize_(tiny("llama"), MoBiQuantConfig(group_size=32))
    with pytest.raises(ValueError, match="clip must be"):
        MoBiQuantConfig(clip="mse")
    model = quantize_(tiny("llama"), MoBiQuantConfig(group_size=32, router=False))
    with pytest.raises(ValueError, match="precision must be in 1..4"):
        set_precision(model, 5)
    with pytest.raises(ValueError, match="avg_bits must be in"):
        set_budget(model, 9.0)


def test_constant_group_stays_finite_in_float16():
    spec = SliceSpec(bits=2, slices=4, group_size=32)
    weight = torch.full((4, 64), 0.5)
    layer = MoBiLinear(64, 4, bias=False, spec=spec)
    layer.set_weight(weight, *group_range(weight, spec))
    for depth in range(1, 5):
        assert torch.isfinite(layer.weight_at(depth)).all()
        assert (layer.weight_at(depth) - weight).abs().max() < 1e-2


# --- layer and router ----------------------------------------------------------------------


def test_layer_reads_the_depth_it_is_given_for_linear_and_conv1d():
    from transformers.pytorch_utils import Conv1D

    spec = SliceSpec(bits=2, slices=4, group_size=32)
    conv = Conv1D(24, 64)  # GPT-2's layer: weight [in, out]
    layer = MoBiLinear.from_linear(conv, spec)
    x = torch.randn(5, 64)
    outs = []
    with torch.no_grad():
        exact = conv(x)
        for depth in range(1, 5):
            outs.append(layer(x, precision=depth))
            assert layer.last_avg_bits == 2 * depth
            assert torch.allclose(outs[-1], x @ layer.weight_at(depth).t() + conv.bias, atol=1e-5)
    assert relative_error(outs[3], exact) < relative_error(outs[0], exact) / 20
    layer.token_depth = torch.tensor([1, 2, 3, 4, 4])
    with torch.no_grad():
        mixed = layer(x)
    for row, depth in enumerate([1, 2, 3, 4, 4]):
        assert torch.allclose(mixed[row], outs[depth - 1][row], atol=1e-5)
    assert layer.last_avg_bits == pytest.approx(2 * 14 / 5)


@pytest.fixture(scope="module")
def calibrated():
    """A tiny Llama and its MoBiQuant copy calibrated on 32 sequences of 64 tokens (router on)."""
    fp = tiny("llama")
    model = quantize_(
        copy.deepcopy(fp), MoBiQuantConfig(group_size=32, **FAST), calib=tokens(32, 64)
    )
    return fp, model


def test_router_budget_is_respected_within_a_tenth_of_a_bit(calibrated):
    _, model = calibrated
    held_out = tokens(32, 64, seed=7)
    for budget in (2.5, 3.0, 4.0, 6.0):
        set_budget(model, budget)
        with torch.no_grad():
            model(held_out)
        assert abs(average_bits(model) - budget) <= 0.1
    # the precision knob bypasses the router
    set_precision(model, 2)
    with torch.no_grad():
        model(held_out)
    assert average_bits(model) == 4.0


def test_router_sends_tokens_to_different_depths(calibrated):
    _, model = calibrated
    set_budget(model, 3.0)  # 1.5 slices on average: half the tokens at 1, half at 2
    with torch.no_grad():
        model(tokens(4, seed=3))
    depths = mobi_layers(decoder_blocks(model)[0])[0].token_depth
    assert set(depths.unique().tolist()) == {1, 2}
    set_budget(model, 4.0)  # an integer budget is uniform: one depth, the fixed-precision read
    with torch.no_grad():
        model(tokens(4, seed=3))
    assert mobi_layers(decoder_blocks(model)[0])[0].token_depth == 2


def test_learned_clipping_is_dropped_where_it_does_not_help():
    from mixlab.llm_efficiency.mobiquant.calibrate import (
        _keep_ranges_if_better,
        capture_block_inputs,
        run_block_chunked,
    )

    fp = tiny("llama")
    block = decoder_blocks(fp)[0]
    hidden, kwargs = capture_block_inputs(fp, tokens(4))
    target = run_block_chunked(block, hidden, kwargs)
    state = (block, hidden, kwargs, target)
    spec = SliceSpec(bits=2, slices=4, group_size=32)
    layer = MoBiLinear(128, 64, bias=False, spec=spec)
    layer.start_calibration(block.mlp.down_proj.weight.data)
    block.mlp.down_proj = layer
    calibration = layer.calibration
    with torch.no_grad():
        calibration.theta_low.fill_(-2.0)  # clip every range to a quarter: bad at every depth
        calibration.theta_high.fill_(-2.0)
    _keep_ranges_if_better(state, [layer])
    assert calibration.theta_low.abs().max() == 0
    assert calibration.theta_high.abs().max() == 0


def test_save_and_load_give_identical_logits(calibrated, tmp_path):
    _, model = calibrated
    save_quantized(model, tmp_path / "q")
    loaded = load_quantized(tmp_path / "q")
    x = tokens(3, seed=9)
    for knob in (lambda m: set_budget(m, 3.0), lambda m: set_precision(m, 3)):
        knob(model)
        knob(loaded)
        with torch.no_grad():
            assert torch.equal(model(x).logits, loaded(x).logits)


def test_router_free_model_round_trips_and_router_trains_under_no_grad(tmp_path):
    fp = tiny("llama")
    plain = quantize_(
        copy.deepcopy(fp), MoBiQuantConfig(group_size=32, router=False, **FAST), calib=tokens(8)
    )
    save_quantized(plain, tmp_path / "plain")
    loaded = load_quantized(tmp_path / "plain")
    x = tokens(2, seed=4)
    with torch.no_grad():
        assert torch.equal(plain(x).logits, loaded(x).logits)
    routers = {}
    for lr in (0.0, 2e-3):
        torch.manual_seed(0)  # the same router initialisation in both runs
        with torch.no_grad():  # a caller's no_grad must not freeze the router
            config = MoBiQuantConfig(group_size=32, router_lr=lr, **FAST)
            model = quantize_(copy.deepcopy(fp), config, calib=tokens(8))
        routers[lr] = decoder_blocks(model)[0].mobi_router.down.weight
    assert not torch.equal(routers[0.0], routers[2e-3])


def test_block_capture_replays_the_model_exactly_for_eager_gpt2():
    from mixlab.llm_efficiency.mobiquant.calibrate import capture_block_inputs, run_block

    fp = tiny("gpt2")
    fp.config._attn_implementation = "eager"  # the mask is then passed explicitly, positionally
    x = tokens(3)
    outputs = {}
    handle = decoder_blocks(fp)[0].register_forward_hook(
        lambda m, a, out: outputs.setdefault("block", out)
    )
    with torch.no_grad():
        fp(x, use_cache=False)
        handle.remove()
        hidden, call = capture_block_inputs(fp, x)
        replay = run_block(decoder_blocks(fp)[0], hidden, call)
        one = run_block(decoder_blocks(fp)[0], hidden, call, torch.tensor([1]))
    expected = outputs["block"][0] if isinstance(outputs["block"], tuple) else outputs["block"]
    assert torch.allclose(replay, expected, atol=1e-6)
    assert torch.allclose(one[0], expected[1], atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "gpt2"])
def test_families_quantize_and_generate(kind):
    fp = tiny(kind)
    linears = sum(
        1
        for block in decoder_blocks(fp)
        for m in block.modules()
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"
    )
    model = quantize_(copy.deepcopy(fp), MoBiQuantConfig(group_size=32, **FAST), calib=tokens(8))
    assert sum(len(mobi_layers(b)) for b in decoder_blocks(model)) == linears  # Conv1D included
    set_budget(model, 3.0)
    prompt = tokens(1, length=8)
    out = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 14)
    set_precision(model, 4)
    with torch.no_grad():
        close = relative_error(model(prompt).logits, fp(prompt).logits)
    assert close < 0.05


# --- baselines ----------------------------------------------------------------------------------


def test_gptq_beats_round_to_nearest_on_correlated_inputs():
    generator = torch.Generator().manual_seed(0)
    mixing = torch.randn(64, 64, generator=generator)
    x = torch.randn(2048, 64, generator=generator) @ mixing  # strongly correlated columns
    weight = torch.randn(32, 64, generator=generator)
    hessian = 2 * x.t() @ x / len(x)
    gptq = gptq_weight(weight, hessian, 3, 32)
    grouped = weight.view(32, 2, 32)
    scale, zero = minmax_affine(weight, 3, 32)
    rtn = (
        scale[..., None]
        * ((grouped / scale[..., None] + zero[..., None]).round().clamp(0, 7) - zero[..., None])
    ).view(32, 64)
    assert ((x @ (gptq - weight).t()).pow(2).mean()) < 0.7 * (
        (x @ (rtn - weight).t()).pow(2).mean()
    )


def test_upscaling_refines_inside_the_seed_bins():
    from mixlab.llm_efficiency.mobiquant.baselines import upscale

    torch.manual_seed(0)
    weight = torch.randn(32, 64)
    step = torch.full_like(weight, 0.5)
    seed = (weight / 0.5).round() * 0.5
    seed[0, 0] += 0.5  # GPTQ may pick a neighbouring level: the weight is outside its bin
    assert torch.equal(upscale(weight, seed, step, 0), seed)  # no extra bits: the seed itself
    errors = []
    for extra in range(4):
        fine = upscale(weight, seed, step, extra)
        assert ((fine - seed).abs() < 0.25).all()  # inside the seed's bin: the seed is its top bits
        errors.append((fine - weight)[1:].pow(2).mean().item())
    assert all(a / b > 3.5 for a, b in itertools.pairwise(errors))  # 4x per bit on uniform bins


def test_per_bit_baselines_error_falls_with_bits_and_matryoshka_rounds():
    fp = tiny("llama")
    x = tokens(4)
    with torch.no_grad():
        reference = fp(x).logits
        errors = {}
        for name, fn in (("rtn", rtn_), ("matryoshka", matryoshka_)):
            for bits in (2, 4, 8):
                errors[name, bits] = relative_error(
                    fn(copy.deepcopy(fp), bits, 32)(x).logits, reference
                )
        gptq = gptq_(copy.deepcopy(fp), 4, 32, tokens(8))(x).logits
    assert errors["rtn", 2] > errors["rtn", 4] > errors["rtn", 8]
    assert errors["matryoshka", 8] == pytest.approx(errors["rtn", 8])
    assert errors["matryoshka", 2] > errors["matryoshka", 4]
    assert relative_error(gptq, reference) < 2 * errors["rtn", 4]


# --- lab, CLI and experiment ----------------------------------------------------------------------


def test_corpus_is_split_by_file():
    from mixlab.llm_efficiency.lm import corpus_split, stdlib_files

    splits, digest = corpus_split()
    assert len(digest) == 64
    assert len(splits["train"]) > 3 * len(splits["test"]) > 0
    files = stdlib_files()
    assert len(files) > 100
    first, second = files[0].read_bytes(), files[1].read_bytes()  # file 0 -> test, 1 -> val
    assert bytes(splits["test"][: len(first)].tolist()) == first
    assert bytes(splits["val"][: len(second)].tolist()) == second


def test_cli_quantizes_and_evaluates_a_local_model(tmp_path, capsys):
    from mixlab.llm_efficiency.cli import main

    folder = tmp_path / "tiny"
    tiny("llama").save_pretrained(folder)
    text = tmp_path / "text.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 60)
    calib = ["--model", str(folder), "--calib", str(text), "--out", str(tmp_path / "q")]
    args = [
        *calib,
        "--group-size",
        "32",
        "--seq-len",
        "32",
        "--calib-steps",
        "4",
        "--calib-sequences",
        "8",
    ]
    assert main(["mobiquant", "quantize", *args]) == 0
    assert "quantized" in capsys.readouterr().out
    evaluate = [
        "mobiquant",
        "eval",
        "--model",
        str(tmp_path / "q"),
        "--text",
        str(text),
        "--seq-len",
        "32",
    ]
    assert main([*evaluate, "--avg-bits", "3"]) == 0
    assert "perplexity" in capsys.readouterr().out
    assert main([*evaluate, "--bits", "3"]) == 2
    err = capsys.readouterr().err
    assert "--bits must be a multiple of the slice bits 2 in [2, 8]" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["lm", "eval", "--model", str(tmp_path / "none"), "--text", str(text)]) == 2
    assert "--model: " in capsys.readouterr().err
    assert main(["lm", "eval", "--model", str(tmp_path / "q"), "--text", str(text)]) == 2
    assert "use `mixlab-llm mobiquant eval`" in capsys.readouterr().err


def test_experiment_runs_and_resumes(tmp_path, monkeypatch):
    from mixlab.llm_efficiency.mobiquant.experiment import METHOD, Config, run

    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    config = Config(
        hidden_size=64, layers=2, intermediate_size=128, seq_len=32, lm_steps=3, lm_batch=4,
        calib_sequences=8, calib_steps=4, eval_tokens=512,
    )  # fmt: skip
    result = METHOD.execute(config, tmp_path / "run")  # records its cache uses
    assert result.cache["state"] == "cold"  # the tiny LM trained into the empty cache
    systems = {"fp", "rtn", "hqq", "gptq", "matryoshka", "anyprec", "clip_rtn", "nested"}
    assert set(result.metrics) == {*systems, "mobiquant"}
    assert len(result.claims) == 8
    assert [check.text.split()[:2] for check in result.regime] == [
        ["2-bit", "RTN"],
        ["3-bit", "GPTQ"],
    ]
    assert all(c.tested == all(r.holds for r in result.regime) for c in result.claims)
    mob = result.metrics["mobiquant"]
    for budget in ("2", "2.5", "3", "3.5", "4", "6"):
        assert mob[f"ppl@{budget}"] > 1
        assert abs(mob[f"bits@{budget}"] - float(budget)) < 0.5
    assert mob["stored_layer_bytes"] < result.metrics["gptq"]["stored_layer_bytes"]
    assert result.metrics["rtn"]["ppl@2.5"] is None
    assert (tmp_path / "run" / "perplexity_vs_bits.png").exists()
    assert (tmp_path / "run" / "mobiquant_checkpoint" / "model.safetensors").exists()
    cells = json.loads((tmp_path / "run" / "cells.json").read_text())
    assert any(c["part"] == "migration" for c in cells)
    again = run(config, tmp_path / "run", resume=True)
    assert again.metrics == result.metrics
    # every claim is judged with its control; the numbers the claims read are in per_seed.json
    from mixlab.llm_efficiency.mobiquant.experiment import claims
    from mixlab.shared import Result

    assert [c.key for c in result.claims] == [spec.key for spec in config.CLAIMS]
    assert all(c.control is not None for c in result.claims)
    values = json.loads((tmp_path / "run" / "per_seed.json").read_text())
    rejudged = Result(metrics=result.metrics, claims=claims(values, config), regime=result.regime)
    assert rejudged.claims == result.claims

    def judged(edit, n_seeds: int = 1) -> dict:
        edited = copy.deepcopy(values)
        edit(edited)
        return {c.key: c for c in claims(edited, dataclasses.replace(config, n_seeds=n_seeds))}

    def router_gains(gains: list[float]):
        def edit(v):
            for row in v.values():  # as many seeds as gains, each seed like the measured one
                for name, numbers in row.items():
                    if name != "stored_layer_bytes":
                        row[name] = numbers[:1] * len(gains)
            for budget in ("2.5", "3", "3.5"):
                v["nested"][f"ppl@{budget}"] = [5.0] * len(gains)
                v["mobiquant"][f"ppl@{budget}"] = [5.0 - g for g in gains]

        return judged(edit, n_seeds=len(gains))["router_beats_random_depths"]

    assert router_gains([0.05, 0.06, 0.04]).state == "holds"  # paired t = 8.7 over 3 seeds
    assert router_gains([0.05, -0.02, 0.09]).state == "fails"  # within the spread
    assert router_gains([0.05]).state == "untested"  # one seed: no spread
    assert router_gains([0.05, 0.06, 0.04]).control.holds is False  # random vs itself

    def near_gptq(system: str, factor: float):
        def edit(v):
            v[system]["ppl@4"] = [factor * g for g in v["gptq"]["ppl@4"]]

        return edit

    claim = judged(lambda v: (near_gptq("mobiquant", 1.01)(v), near_gptq("rtn", 1.04)(v)))
    assert claim["within_gptq_at_4_bits"].state == "vacuous"  # RTN is within 5 % too
    claim = judged(lambda v: (near_gptq("mobiquant", 1.01)(v), near_gptq("rtn", 1.2)(v)))
    assert claim["within_gptq_at_4_bits"].state == "holds"
