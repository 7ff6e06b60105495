"""MoP (Mixture of Probes) and MoP-X: MLLM training with a privileged modality (issue 28, in
progress; the paper was not found, everything specific to it is reconstructed from spec §4).

K probes of learnable queries read different layers of a shared, frozen encoder; a router weighs
them into the LM's visual prefix. MoP-X trains every modality alone, aligns each modality's probes
to the paired privileged modality's (stop-gradient) and keeps the probes apart (L_dis).

Built so far: the paired scenes, the shared encoder with per-modality tokenizers (toy ViT or a
transformers CLIPVisionModel), the probes and the resampler baselines, the losses and
diagnostics, and the MLLM wrapper around any transformers causal LM. Not yet: the trainer, the
experiment, the CLI, the benchmark; the method is not registered.
"""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "MixtureOfProbes": "probes",
    "MoPXLoss": "losses",
    "PrivilegedMLLM": "model",
    "ProbeOutput": "probes",
    "Resampler": "probes",
    "RoutedResamplers": "probes",
    "SharedEncoder": "encoder",
    "alignment_loss": "losses",
    "disentanglement_loss": "losses",
    "make_scenes": "scenes",
    "participation_ratio": "losses",
    "probe_diagnostics": "losses",
    "toy_trunk": "encoder",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "MixtureOfProbes",
    "MoPXLoss",
    "PrivilegedMLLM",
    "ProbeOutput",
    "Resampler",
    "RoutedResamplers",
    "SharedEncoder",
    "alignment_loss",
    "disentanglement_loss",
    "make_scenes",
    "participation_ratio",
    "probe_diagnostics",
    "toy_trunk",
]
