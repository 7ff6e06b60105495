"""MoL (Mixture of Layers): instruction-conditioned routing over a frozen vision encoder's layers
in a LLaVA-style MLLM (issue 23; the paper was not found, see ``seeds/mol.md``).

- :class:`MixtureOfLayers`: image, patch or hybrid routing of the layers' states by the
  instruction (and the instruction-blind ``static``/``uniform`` baselines), :class:`FixedLayer`
  and :class:`LayerConcat` (DenseConnector).
- :class:`MoLLlava`: any transformers ``LlavaForConditionalGeneration`` with its projector fed
  by MoL through ``mm_encoder_outputs``; the router saves and loads alone.
- :func:`vision_hidden_states`: every layer of a transformers, timm or open_clip vision tower.
- :func:`toy_llava`: the toy MLLM of the experiment, trained once into the cache.
"""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "GRANULARITIES": "layers",
    "FixedLayer": "layers",
    "LayerConcat": "layers",
    "MixtureOfLayers": "layers",
    "MoLOutput": "layers",
    "instruction_embedding": "layers",
    "MoLLlava": "llava",
    "hooked_hidden_states": "llava",
    "vision_hidden_states": "llava",
    "widen_projector": "llava",
    "encode_prompts": "data",
    "load_records": "data",
    "write_records": "data",
    "TrainSpec": "training",
    "train": "training",
    "answer_hits": "training",
    "ToySpec": "toy",
    "toy_llava": "toy",
    "toy_folder": "toy",
    "load_toy": "toy",
    "save_toy": "toy",
    "make_vqa": "tasks",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
