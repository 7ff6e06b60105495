"""MoH (Mixture-of-Hierarchical Experts): a timestep-routed Mamba diffusion backbone.

- :class:`MoHDiffusion`: a diffusers ``ModelMixin``/``ConfigMixin`` backbone (patchify,
  adaLN-Zero, ``forward(sample, timestep, class_labels, encoder_hidden_states).sample``,
  ``save_pretrained``/``from_pretrained``) of :class:`MoHBlock` s routed on the timestep over
  levels, transformations and depth; ``precompute_routes`` fixes the routes per sampling step.
- :class:`Mamba`, :class:`BiMamba` and :func:`selective_scan` (``ref``, ``mambapy``,
  ``mamba_ssm`` backends), :func:`scan_order` (raster, zigzag, transposed).
- :func:`train` / :func:`sample` (diffusers schedulers, EMA, classifier-free guidance),
  :func:`score` (FID_local, KID_local, precision/recall on a locally trained CNN).

The paper was not found: the method is the reconstruction of ``shared/specs/attention-vision.md``
§2 on DiM, ZigMa and DiT (``seeds/moh.md`` says which parts).
"""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "BACKENDS": "scan",
    "ORDERS": "scan",
    "inverse_order": "scan",
    "scan_order": "scan",
    "selective_scan": "scan",
    "BiMamba": "mamba",
    "Mamba": "mamba",
    "EXPERT_KINDS": "model",
    "MoHBlock": "model",
    "MoHDiffusion": "model",
    "MoHOutput": "model",
    "Router": "model",
    "Routes": "model",
    "MoHPipeline": "pipeline",
    "TrainSpec": "training",
    "sample": "training",
    "train": "training",
    "ImageData": "data",
    "load_images": "data",
    "feature_net": "metrics",
    "score": "metrics",
    "Config": "config",
    "METHOD": "config",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
