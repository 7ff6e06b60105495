"""mixlab.online: online learning: matrix completion on drifting subspaces.

Each method is a subpackage (``mixlab.online.<method>``) with its public API in ``__all__``.
"""
