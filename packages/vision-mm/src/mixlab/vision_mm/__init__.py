"""mixlab.vision_mm: vision and multimodal training.

Each method is a subpackage (``mixlab.vision_mm.<method>``) with its public API in ``__all__``.
"""
