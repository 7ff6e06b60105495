"""mixlab.graphs: graph methods: graph generation, sheaf networks, odor-mixture models.

Each method is a subpackage (``mixlab.graphs.<method>``) with its public API in ``__all__``.
"""
