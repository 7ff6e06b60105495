"""MoSAIC: online matrix completion on a drifting union of subspaces with routed low-rank experts.

Estimators (scikit-learn conventions, samples as rows, ``mask`` True where observed or NaN for missing):
:class:`MoSAIC` (ours), and the baselines :class:`GROUSE`, :class:`PETRELS`,
:class:`WindowedKSubspaces`. Streams: :class:`DriftingSubspaceStream`. Diagnostics:
:func:`routing_accuracy`, :func:`match_experts`, :func:`subspace_distance`,
:func:`contraction_exponent`.

    >>> from mixlab.online.mosaic import MoSAIC
    >>> model = MoSAIC(n_experts=4, rank=5, random_state=0).fit(X_source)   # NaN = missing
    >>> for x in stream:
    ...     completed = model.transform(x)
    ...     model.partial_fit(x)
"""

from mixlab.online.mosaic.diagnostics import (
    contraction_exponent,
    match_experts,
    routing_accuracy,
    subspace_distance,
)
from mixlab.online.mosaic.estimators import (
    GROUSE,
    PETRELS,
    MoSAIC,
    WindowedKSubspaces,
    check_stream,
)
from mixlab.online.mosaic.stream import DriftingSubspaceStream, Epoch, Stream
from mixlab.online.mosaic.subspace import grouse_step, k_subspaces, observed_fit

__all__ = [
    "GROUSE",
    "PETRELS",
    "DriftingSubspaceStream",
    "Epoch",
    "MoSAIC",
    "Stream",
    "WindowedKSubspaces",
    "check_stream",
    "contraction_exponent",
    "grouse_step",
    "k_subspaces",
    "match_experts",
    "observed_fit",
    "routing_accuracy",
    "subspace_distance",
]
