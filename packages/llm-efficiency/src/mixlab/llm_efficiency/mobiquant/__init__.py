"""MoBiQuant: any-precision Mixture-of-Bits weight quantization of Hugging Face causal LMs.

One nested checkpoint (MoBiSlice: recursive residual bit slices with one scale and zero per
group, floor-aligned so that a lower precision is the higher one with bits dropped) read per
token at the depth a small learned router picks (MoBiRoute), with one knob for the average
precision at run time.

- :func:`quantize_` / :class:`MoBiQuantConfig`: quantize any HF causal LM in place (Llama,
  Qwen2, Mistral, GPT-2's ``Conv1D`` ...), calibrated block-wise when given calibration tokens.
- :func:`set_budget` (average bits, routed), :func:`set_precision` (uniform depth),
  :func:`average_bits` (what the last forward read), :func:`storage_bits`.
- :func:`save_quantized` / :func:`load_quantized`: safetensors + JSON, identical logits.
- :class:`MoBiLinear`, :class:`MoBiRouter`, :class:`SliceSpec`; the kernel
  :func:`nested_matmul` (Triton on CUDA, pure torch elsewhere).
- Baselines: :func:`rtn_`, :func:`gptq_`, :func:`hqq_`, :func:`matryoshka_`, :func:`clip_rtn_`.

    from mixlab.llm_efficiency.lm import load_lm
    from mixlab.llm_efficiency.mobiquant import MoBiQuantConfig, quantize_, set_budget

    model = load_lm("path/to/local/model")
    quantize_(model, MoBiQuantConfig(bits=2, slices=4, group_size=128), calib=token_ids)
    set_budget(model, 3.0)
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "MoBiLinear": "layer",
    "MoBiQuantConfig": "model",
    "MoBiRouter": "layer",
    "SliceSpec": "slices",
    "average_bits": "model",
    "clip_rtn_": "baselines",
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
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "MoBiLinear",
    "MoBiQuantConfig",
    "MoBiRouter",
    "SliceSpec",
    "average_bits",
    "clip_rtn_",
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
]

if TYPE_CHECKING:
    from mixlab.llm_efficiency.mobiquant.baselines import clip_rtn_, gptq_, hqq_, matryoshka_, rtn_
    from mixlab.llm_efficiency.mobiquant.kernel import nested_matmul
    from mixlab.llm_efficiency.mobiquant.layer import MoBiLinear, MoBiRouter
    from mixlab.llm_efficiency.mobiquant.model import (
        MoBiQuantConfig,
        average_bits,
        load_quantized,
        quantize_,
        save_quantized,
        set_budget,
        set_precision,
        storage_bits,
    )
    from mixlab.llm_efficiency.mobiquant.slices import SliceSpec
