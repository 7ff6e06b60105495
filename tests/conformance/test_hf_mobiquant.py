"""transformers' save/load on MoBiQuant models, and the fixes they rest on (issue 17).

A MoBiQuant model is a Hugging Face causal LM whose linear layers hold nested bit planes, with a
router per block, calibration tokens and a run-time precision. ``model.save_pretrained`` writes a
``quantization_config`` with the quant_method "mobiquant", which transformers' own registry maps
to MoBiQuant's quantizer once ``mixlab.llm_efficiency.mobiquant`` is imported, so that
``AutoModelForCausalLM.from_pretrained`` rebuilds the very same model; ``save_quantized`` /
``load_quantized`` (safetensors + a checked JSON sidecar) read and write the same folders. Each
test below fails if its fix is reverted.
"""

import copy
import importlib
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config

from mixlab.llm_efficiency.lm import LMConfig, llama_config
from mixlab.llm_efficiency.mobiquant import (
    MoBiLinear,
    MoBiQuantConfig,
    MoBiQuantHfConfig,
    load_quantized,
    quantize_,
    save_quantized,
    set_budget,
    set_precision,
)
from mixlab.llm_efficiency.mobiquant.model import mobi_layers
from mixlab.shared.files import CheckpointError

FAST = {"group_size": 32, "calib_steps": 4, "router_steps": 4, "calib_batch": 2}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tiny(kind: str = "llama", dtype: torch.dtype = torch.float32, *, cast: bool = False):
    """A random tiny causal LM built in ``dtype`` (``cast``: built in float32, then ``.to(dtype)``,
    which leaves ``config.dtype`` unset)."""
    if kind == "gpt2":
        config = GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=2, n_positions=64)
    else:
        config = llama_config(
            LMConfig(hidden_size=64, layers=2, heads=2, intermediate_size=128, seq_len=64)
        )
    torch.manual_seed(0)
    if cast:
        return AutoModelForCausalLM.from_config(config).to(dtype).eval()
    return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def tokens(sequences: int, length: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(256, (sequences, length), generator=torch.Generator().manual_seed(seed))


X = tokens(2, seed=9)


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(X).logits


def tensor_kinds(model) -> dict[str, tuple[torch.dtype, tuple[int, ...], bool]]:
    """dtype, shape and requires_grad of every saved tensor."""
    return {
        name: (tensor.dtype, tuple(tensor.shape), tensor.requires_grad)
        for name, tensor in model.state_dict(keep_vars=True).items()
    }


def round_trips(model, folder) -> dict[str, torch.nn.Module]:
    """``model`` saved and loaded back by each path (both writers' folders load both ways)."""
    save_quantized(model, folder / "q")  # first: save_pretrained sets config.dtype itself
    model.save_pretrained(folder / "hf")
    loaded = {}
    for source in ("hf", "q"):
        reloaded, info = AutoModelForCausalLM.from_pretrained(
            folder / source, local_files_only=True, output_loading_info=True
        )
        assert not any(info.values()), info  # no missing, unexpected or mis-shaped tensors
        loaded[f"{source} -> from_pretrained"] = reloaded
    loaded["q -> load_quantized"] = load_quantized(folder / "q")
    return loaded


@pytest.fixture(scope="module", params=DTYPES, ids=str)
def routed(request):
    """A tiny Llama in each dtype, calibrated with routers, at a routed budget of 3 bits."""
    model = tiny(dtype=request.param)
    quantize_(model, MoBiQuantConfig(**FAST), calib=tokens(8, 32))
    set_budget(model, 3.0)
    return model


def test_round_trip_rebuilds_the_same_model_in_its_dtype(routed, tmp_path):
    """Was: save_pretrained wrote the quantized tensors with no quantization_config, and
    from_pretrained returned the float model with random linear layers (a warning only)."""
    expected, kinds = logits(routed), tensor_kinds(routed)
    for path, loaded in round_trips(routed, tmp_path).items():
        assert isinstance(loaded.model.layers[0].self_attn.q_proj, MoBiLinear), path
        assert loaded.dtype == routed.dtype, path
        assert tensor_kinds(loaded) == kinds, path  # routers float32, scales float16, frozen
        assert torch.equal(logits(loaded), expected), path  # the routed thresholds
        for knob in (lambda m: set_budget(m, 2.5), lambda m: set_precision(m, 3)):
            knob(loaded)  # set_budget refits on the calibration tokens saved with the model
            knob(routed)
            assert torch.equal(logits(loaded), logits(routed)), path
    set_budget(routed, 3.0)


def test_precision_setting_is_saved_with_the_model(routed, tmp_path):
    model = copy.deepcopy(routed)
    set_precision(model, 2)
    for path, loaded in round_trips(model, tmp_path).items():
        assert {layer.precision for layer in mobi_layers(loaded.model.layers[1])} == {2}, path
        assert torch.equal(logits(loaded), logits(model)), path


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_router_free_budget_and_tied_conv1d_models_round_trip(kind, tmp_path):
    """GPT-2: Conv1D layers and an LM head tied to the embeddings; a router-free model mixes
    depths at random at a fractional budget, restarted from its seed on load."""
    model = quantize_(tiny(kind), MoBiQuantConfig(router=False, group_size=32))
    set_budget(model, 3.0, seed=5)
    for path, loaded in round_trips(model, tmp_path).items():
        set_budget(model, 3.0, seed=5)  # the saved model's draws, from the start
        assert torch.equal(logits(loaded), logits(model)), path


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_model_cast_after_building_keeps_its_dtype(dtype, tmp_path):
    """Was: a model cast with ``.to(dtype)`` (config.dtype unset) came back from load_quantized
    in float32. Both loaders now agree; transformers rebuilds the rotary table in float32 (as for
    any float model cast this way), so the logits match the original closely, not bit for bit."""
    model = quantize_(tiny(dtype=dtype, cast=True), MoBiQuantConfig(router=False, group_size=32))
    loaded = round_trips(model, tmp_path)
    reference = logits(loaded.pop("q -> load_quantized"))
    assert tensor_kinds(model) == tensor_kinds(load_quantized(tmp_path / "q"))
    for path, other in loaded.items():
        assert tensor_kinds(other) == tensor_kinds(model), path
        assert torch.equal(logits(other), reference), path
    assert (reference.float() - logits(model).float()).abs().max() < 0.05


def test_folder_missing_quantized_tensors_fails_loudly(tmp_path):
    """Not a warning and a partly random model: a named error."""
    quantize_(tiny(), MoBiQuantConfig(router=False, group_size=32)).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.1.mlp.down_proj.planes"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"1 quantized tensors missing .*down_proj\.planes"):
        AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True)


def test_quantizing_while_loading_is_refused_naming_quantize_(tmp_path):
    tiny().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"quantize_\(model"):
        AutoModelForCausalLM.from_pretrained(
            tmp_path, local_files_only=True, quantization_config=MoBiQuantHfConfig()
        )


def test_importing_the_package_registers_the_quantizer_with_transformers(monkeypatch):
    """The package imports no transformers of its own (``mixlab list`` stays light), yet a plain
    ``import mixlab.llm_efficiency.mobiquant`` registers "mobiquant" with transformers' registry
    when that is imported later. Replayed in this process: the package is re-imported with the
    registry (and the module that registers) unloaded, then the registry is imported afresh."""
    import transformers.quantizers

    package = importlib.import_module("mixlab.llm_efficiency.mobiquant")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # all restored after the test
    monkeypatch.setattr(transformers.quantizers, "auto", transformers.quantizers.auto)
    monkeypatch.setattr(package, "hf", package.hf)
    for name in ("transformers.quantizers.auto", "mixlab.llm_efficiency.mobiquant.hf"):
        monkeypatch.delitem(sys.modules, name)
    importlib.reload(package)  # import mixlab.llm_efficiency.mobiquant
    assert "transformers.quantizers.auto" not in sys.modules
    registry = importlib.import_module("transformers.quantizers.auto")
    assert registry.AUTO_QUANTIZER_MAPPING["mobiquant"].__name__ == "MoBiQuantHfQuantizer"
    assert registry.AUTO_QUANTIZATION_CONFIG_MAPPING["mobiquant"].__name__ == "MoBiQuantHfConfig"
