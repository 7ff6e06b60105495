"""MoSAIC: online matrix completion on a drifting union of subspaces with routed low-rank experts.

Estimators (scikit-learn transformers that complete a matrix: samples as rows, NaN where missing,
an optional ``mask`` True where observed): :class:`MoSAIC` (ours), and the baselines :class:`GROUSE`,
:class:`PETRELS`, :class:`WindowedKSubspaces`. Streams: :class:`DriftingSubspaceStream`.
Diagnostics: :func:`routing_accuracy`, :func:`match_experts`, :func:`subspace_distance`,
:func:`contraction_exponent`.

    >>> from mixlab.online.mosaic import MoSAIC
    >>> model = MoSAIC(n_experts=4, rank=5, random_state=0).fit(X_source)   # NaN = missing
    >>> for start in range(0, len(X_stream), 20):
    ...     batch = X_stream[start : start + 20]
    ...     completed = model.transform(batch)   # complete first (prequential) ...
    ...     model.partial_fit(batch)             # ... then learn
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "contraction_exponent": "diagnostics",
    "match_experts": "diagnostics",
    "power_law_fits_better": "diagnostics",
    "routing_accuracy": "diagnostics",
    "subspace_distance": "diagnostics",
    "GROUSE": "estimators",
    "PETRELS": "estimators",
    "MoSAIC": "estimators",
    "WindowedKSubspaces": "estimators",
    "check_stream": "estimators",
    "DriftingSubspaceStream": "stream",
    "Epoch": "stream",
    "Stream": "stream",
    "grouse_step": "subspace",
    "k_subspaces": "subspace",
    "observed_fit": "subspace",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

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
    "power_law_fits_better",
    "routing_accuracy",
    "subspace_distance",
]

if TYPE_CHECKING:
    from mixlab.online.mosaic.diagnostics import (
        contraction_exponent,
        match_experts,
        power_law_fits_better,
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
