"""mixlab.attention_arch: efficient attention and mixture architectures.

Each method is a subpackage (``mixlab.attention_arch.<method>``) with its public API in ``__all__``.
"""
