"""MoBiQuant: any-precision Mixture-of-Bits weight quantization of Hugging Face causal LMs.

One nested checkpoint (MoBiSlice: recursive residual bit slices with one scale and zero per
group, floor-aligned so that a lower precision is the higher one with bits dropped) read per
token at the depth a small learned router picks (MoBiRoute), with one knob for the average
precision at run time.

- :func:`quantize_` / :class:`MoBiQuantConfig`: quantize any HF causal LM in place (Llama,
  Qwen2, Mistral, GPT-2's ``Conv1D`` ...), calibrated block-wise when given calibration tokens.
- :func:`set_budget` (average bits, routed; no forward), :func:`fit_thresholds` (refit the
  routers' per-budget thresholds on other text), :func:`set_precision` (uniform depth),
  :func:`average_bits` (what the last forward read), :func:`storage_bits`.
- :func:`save_quantized` / :func:`load_quantized`: safetensors + JSON, identical logits.
- ``model.save_pretrained`` / ``AutoModelForCausalLM.from_pretrained``: the same, through the
  quant_method "mobiquant" (:class:`MoBiQuantHfConfig`), registered with transformers by
  importing this package (before or after transformers).
- :class:`MoBiLinear`, :class:`MoBiRouter`, :class:`SliceSpec`; the kernel
  :func:`nested_matmul` (Triton on CUDA, pure torch elsewhere).
- Baselines: :func:`rtn_`, :func:`gptq_` (with ``upscale_to=``: Any-Precision-LLM-style
  :func:`upscale`), :func:`hqq_`, :func:`matryoshka_`, :func:`clip_rtn_`.

    from mixlab.llm_efficiency.lm import load_lm
    from mixlab.llm_efficiency.mobiquant import MoBiQuantConfig, quantize_, set_budget

    model = load_lm("path/to/local/model")
    quantize_(model, MoBiQuantConfig(bits=2, slices=4, group_size=128), calib=token_ids)
    set_budget(model, 3.0)
"""

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "MoBiLinear": "layer",
    "MoBiQuantConfig": "model",
    "MoBiQuantHfConfig": "hf",
    "MoBiRouter": "layer",
    "SliceSpec": "slices",
    "average_bits": "model",
    "clip_rtn_": "baselines",
    "fit_thresholds": "model",
    "gptq_": "baselines",
    "hqq_": "baselines",
    "load_quantized": "model",
    "matryoshka_": "baselines",
    "nested_matmul": "kernel",
    "quantize_": "model",
    "rtn_": "baselines",
    "save_quantized": "model",
    "set_budget": "model",
    "set_precision": "model",
    "storage_bits": "model",
    "upscale": "baselines",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "MoBiLinear",
    "MoBiQuantConfig",
    "MoBiQuantHfConfig",
    "MoBiRouter",
    "SliceSpec",
    "average_bits",
    "clip_rtn_",
    "fit_thresholds",
    "gptq_",
    "hqq_",
    "load_quantized",
    "matryoshka_",
    "nested_matmul",
    "quantize_",
    "rtn_",
    "save_quantized",
    "set_budget",
    "set_precision",
    "storage_bits",
    "upscale",
]

if TYPE_CHECKING:
    from mixlab.llm_efficiency.mobiquant.baselines import (
        clip_rtn_,
        gptq_,
        hqq_,
        matryoshka_,
        rtn_,
        upscale,
    )
    from mixlab.llm_efficiency.mobiquant.hf import MoBiQuantHfConfig
    from mixlab.llm_efficiency.mobiquant.kernel import nested_matmul
    from mixlab.llm_efficiency.mobiquant.layer import MoBiLinear, MoBiRouter
    from mixlab.llm_efficiency.mobiquant.model import (
        MoBiQuantConfig,
        average_bits,
        fit_thresholds,
        load_quantized,
        quantize_,
        save_quantized,
        set_budget,
        set_precision,
        storage_bits,
    )
    from mixlab.llm_efficiency.mobiquant.slices import SliceSpec


class _ImportAfter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the module ``then`` right after the module ``after`` is imported (once)."""

    def __init__(self, after: str, then: str) -> None:
        self.after, self.then, self.loader = after, then, None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.after:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)  # the real one, found by the other finders
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        importlib.import_module(self.then)


def _register_with_transformers() -> None:
    """Register the quant_method "mobiquant" (module ``.hf``) with transformers' quantizer registry
    without importing transformers here (``mixlab list`` and ``--help`` stay light): now if the
    registry is loaded, else right after it is."""
    registry, hf = "transformers.quantizers.auto", f"{__name__}.hf"
    if registry in sys.modules:
        importlib.import_module(hf)
    elif not any(isinstance(finder, _ImportAfter) for finder in sys.meta_path):
        sys.meta_path.insert(0, _ImportAfter(registry, hf))


_register_with_transformers()
