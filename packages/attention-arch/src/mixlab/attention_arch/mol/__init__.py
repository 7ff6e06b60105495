"""MoL (Mixture of Layers): instruction-conditioned routing over a vision encoder's layers in an
MLLM; in progress (issue 23). So far the layer itself (:mod:`.layers`); the method is not
registered until its LLaVA wrapper, toy lab, experiment and CLI land."""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "GRANULARITIES": "layers",
    "MixtureOfLayers": "layers",
    "MoLOutput": "layers",
    "instruction_embedding": "layers",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
