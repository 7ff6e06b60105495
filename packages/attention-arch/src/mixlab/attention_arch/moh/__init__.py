"""MoH (Mixture-of-Hierarchical Experts), a timestep-routed Mamba diffusion backbone: in
progress (issue 22). So far the selective scan with its backends and the grid scan orders
(:mod:`.scan`); the method is not registered until its block, model, experiment and CLI land."""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "BACKENDS": "scan",
    "ORDERS": "scan",
    "inverse_order": "scan",
    "scan_order": "scan",
    "selective_scan": "scan",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = sorted(_MODULE_OF)
