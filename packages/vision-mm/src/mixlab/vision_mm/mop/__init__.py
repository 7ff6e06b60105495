"""MoP (Mixture of Probes) and MoP-X: MLLM training with a privileged modality (issue 28; the
paper was not found, everything specific to it is reconstructed from spec §4, see seeds/mop.md).

K probes of learnable queries read different layers of a shared, frozen encoder (a transformers
``CLIPVisionModel`` or the toy ViT, one patch tokenizer per modality); a router weighs them into
the visual prefix of any transformers causal LM (``inputs_embeds``). MoP-X trains every modality
alone, aligns each modality's probes to the paired modality's (stop-gradient) and keeps the
probes apart (L_dis); each modality is then served alone::

    model = PrivilegedMLLM(SharedEncoder(clip, {"rgb": (3, 224, 14), "depth": (1, 224, 14)}),
                           MixtureOfProbes(1024, 25, num_probes=4, queries=8), llama)
    spec = system_spec("mop-x", ("rgb", "depth"), deploy="rgb", privileged="depth")
    fit(model, batches, spec, steps=1000)
    model.generate("rgb", images, input_ids, attention_mask, max_new_tokens=8)
"""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "MixtureOfProbes": "probes",
    "MoPXLoss": "losses",
    "ModalityTokenizer": "encoder",
    "PrivilegedMLLM": "model",
    "ProbeOutput": "probes",
    "Resampler": "probes",
    "RoutedResamplers": "probes",
    "SYSTEMS": "training",
    "SharedEncoder": "encoder",
    "accuracy_by_type": "training",
    "alignment_loss": "losses",
    "answer_hits": "text",
    "build_connector": "probes",
    "disentanglement_loss": "losses",
    "encode_qa": "text",
    "fit": "training",
    "grid_positions": "probes",
    "make_scenes": "scenes",
    "paired_batches": "training",
    "participation_ratio": "losses",
    "probe_cosine": "losses",
    "probe_diagnostics": "losses",
    "read_samples": "data",
    "system_spec": "training",
    "toy_trunk": "encoder",
    "training_loss": "training",
    "variance_hinge": "losses",
    "word_tokenizer": "text",
    "write_samples": "data",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "SYSTEMS",
    "MixtureOfProbes",
    "MoPXLoss",
    "ModalityTokenizer",
    "PrivilegedMLLM",
    "ProbeOutput",
    "Resampler",
    "RoutedResamplers",
    "SharedEncoder",
    "accuracy_by_type",
    "alignment_loss",
    "answer_hits",
    "build_connector",
    "disentanglement_loss",
    "encode_qa",
    "fit",
    "grid_positions",
    "make_scenes",
    "paired_batches",
    "participation_ratio",
    "probe_cosine",
    "probe_diagnostics",
    "read_samples",
    "system_spec",
    "toy_trunk",
    "training_loss",
    "variance_hinge",
    "word_tokenizer",
    "write_samples",
]
