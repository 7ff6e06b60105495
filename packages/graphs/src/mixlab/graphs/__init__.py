"""mixlab.graphs: graph methods: graph generation, sheaf networks, odor-mixture models.

Each method is a subpackage (``mixlab.graphs.<method>``) with its public API in ``__all__``.
"""

import warnings

# torch_geometric 2.8 calls torch.jit.script at import time, which torch 2.15 deprecates with a
# FutureWarning on stderr. Every graphs method imports PyG, and the warning is PyG's, not the
# user's: keep it off the CLIs' one-line errors (`mixlab run does-not-exist`).
warnings.filterwarnings(
    "ignore", message=r"`torch.jit.script` is deprecated", category=FutureWarning
)
