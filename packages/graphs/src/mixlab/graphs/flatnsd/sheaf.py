"""Cellular sheaves on graphs: the sheaf Laplacian, sheaf effective resistance and the Jacobian
sensitivity of sheaf diffusion.

Conventions (PyG): ``edge_index`` [2, E] lists every undirected edge in both directions, without
self-loops; directed edge k = (j → i) has source ``j = edge_index[0, k]`` and target
``i = edge_index[1, k]``. A sheaf gives each directed edge k the restriction map of its *target*
onto the edge, ``edge_maps[k] = F_{i⊴e}`` (d×d, or its diagonal as d numbers); the source's map
is the one stored on the reverse edge. A flat bundle gives one map per node, ``node_maps[v] = A_v``,
used on every edge at v (F_{v⊴e} = A_v), so transport A_u⁻¹A_v is path-independent.

With the coboundary (δx)_e = F_{i⊴e} x_i − F_{j⊴e} x_j and edge weights w_e, the Laplacian is
L_F = δᵀWδ (NSD, Hansen & Ghrist 2019): blocks L[i,i] = Σ_e w_e F_{i⊴e}ᵀF_{i⊴e} and
L[i,j] = −w_e F_{i⊴e}ᵀF_{j⊴e}.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch import Tensor

DENSE_LIMIT = 6000
"""largest n·d for which resistances are computed with a dense pseudo-inverse"""

EDGE_INDEX_CACHE_SIZE = 8
"""validated ``edge_index`` tensors whose reverse permutation :func:`check_edge_index` keeps"""

_validated_edge_indices: OrderedDict[tuple, tuple[weakref.ref, Tensor]] = OrderedDict()
"""cache key → (a weak reference to the validated tensor, its reverse permutation)"""


def check_edge_index(
    edge_index: Tensor, num_nodes: int, *, name: str = "edge_index", self_loops: bool = False
) -> Tensor:
    """Validate an undirected ``edge_index`` (any integer dtype) and return the reverse-edge
    permutation ``rev`` (``edge_index[:, rev[k]]`` is edge k reversed).

    ``self_loops=True`` lets self-loops through (a self-loop is its own reverse). Under
    ``torch.compile`` only the shape and dtype are checked: the value checks branch on the data,
    which would break the graph, so validate a graph once in eager mode.

    Validation sorts all E edges, which costs more than a sheaf layer on a large graph, so the
    permutation of the last :data:`EDGE_INDEX_CACHE_SIZE` validated tensors is cached (see
    :func:`_cache_key`): a model that sees the same ``edge_index`` every forward validates it
    once, and an in-place edit of the tensor validates it again. The same permutation tensor is
    returned on every hit; do not modify it.
    """
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else type(edge_index)
        raise ValueError(f"{name} must be a [2, num_edges] integer tensor, got {shape}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer node indices, got dtype {edge_index.dtype}")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    key = _cache_key(edge_index, num_nodes, self_loops)
    if key is not None and (cached := _validated_edge_indices.get(key)) is not None:
        reference, reverse = cached
        if reference() is edge_index:  # not a new tensor that reuses a freed tensor's id
            _validated_edge_indices.move_to_end(key)
            return reverse
    reverse = _validate_edge_index(edge_index, num_nodes, name, self_loops)
    if key is not None:
        _remember(key, edge_index, reverse)
    return reverse


def _cache_key(edge_index: Tensor, num_nodes: int, self_loops: bool) -> tuple | None:
    """What must match for a cached validation to hold: the tensor object (``id``, confirmed
    through a weak reference on lookup), its version counter (every in-place edit bumps it), its
    memory, layout, dtype and device, and the arguments that change the verdict. None where no
    cache applies: under ``torch.compile`` (``id`` and weak references do not trace), for
    inference-mode tensors (they have no version counter, so an edit would go unnoticed) and for
    tensors without strided memory. Writes that bypass the version counter (through ``.data``,
    or a NumPy array sharing the memory) go unnoticed too: validate such a tensor again with a
    fresh copy.
    """
    if (
        torch.compiler.is_compiling()
        or edge_index.layout != torch.strided
        or edge_index.is_inference()
    ):
        return None
    return (
        id(edge_index),
        edge_index._version,
        edge_index.data_ptr(),
        tuple(edge_index.shape),
        edge_index.stride(),
        edge_index.dtype,
        edge_index.device,
        num_nodes,
        self_loops,
    )


def _remember(key: tuple, edge_index: Tensor, reverse: Tensor) -> None:
    """Cache ``reverse`` under ``key``; the entry goes when ``edge_index`` is freed, and the
    least recently used one when the cache is full."""
    reference = weakref.ref(edge_index, lambda _: _validated_edge_indices.pop(key, None))
    _validated_edge_indices[key] = (reference, reverse)
    while len(_validated_edge_indices) > EDGE_INDEX_CACHE_SIZE:
        _validated_edge_indices.popitem(last=False)


def _validate_edge_index(edge_index: Tensor, num_nodes: int, name: str, self_loops: bool) -> Tensor:
    """The checks and the reverse permutation of :func:`check_edge_index`, uncached."""
    if edge_index.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device=edge_index.device)
    source, target = edge_index.long()
    key = target * num_nodes + source
    order = torch.argsort(key)
    sorted_key = key[order]
    reverse_key = source * num_nodes + target
    position = torch.searchsorted(sorted_key, reverse_key).clamp_max(key.numel() - 1)
    if torch.compiler.is_compiling():  # the value checks below branch on data: eager only
        return order[position]
    low, high = int(edge_index.min()), int(edge_index.max())
    if low < 0 or high >= num_nodes:
        bad = low if low < 0 else high
        raise ValueError(
            f"{name} has node index {bad} outside [0, num_nodes={num_nodes}); "
            "pass num_nodes or fix the indices"
        )
    if not self_loops and bool((source == target).any()):
        raise ValueError(
            f"{name} has self-loops, which carry no sheaf information; "
            "remove them (torch_geometric.utils.remove_self_loops)"
        )
    if bool((sorted_key[1:] == sorted_key[:-1]).any()):
        raise ValueError(
            f"{name} has duplicate edges; coalesce it (torch_geometric.utils.coalesce)"
        )
    if not bool((sorted_key[position] == reverse_key).all()):
        raise ValueError(
            f"{name} must list every edge in both directions (sheaf diffusion is undirected); "
            "use torch_geometric.utils.to_undirected"
        )
    return order[position]


def check_edge_weight(
    edge_weight: Tensor | None, edge_index: Tensor, reverse: Tensor, like: Tensor
) -> Tensor:
    """``edge_weight`` [E] in ``like``'s dtype (ones where None), checked to be non-negative and
    equal on both directions of every edge (L_F = δᵀWδ has one weight per undirected edge).
    Under ``torch.compile`` only the shape is checked."""
    num_edges = edge_index.size(1)
    if edge_weight is None:
        return like.new_ones(num_edges)
    if not isinstance(edge_weight, Tensor) or edge_weight.shape != (num_edges,):
        shape = tuple(edge_weight.shape) if isinstance(edge_weight, Tensor) else type(edge_weight)
        raise ValueError(f"edge_weight must have shape ({num_edges},), got {shape}")
    if not torch.compiler.is_compiling() and (
        bool((edge_weight < 0).any()) or not torch.allclose(edge_weight, edge_weight[reverse])
    ):
        raise ValueError("edge_weight must be non-negative and equal on both directions of an edge")
    return edge_weight.to(like.dtype)


def as_matrices(edge_maps: Tensor) -> Tensor:
    """Per-edge restriction maps as [E, d, d] matrices; an [E, d] input holds diagonal maps."""
    if edge_maps.dim() == 3 and edge_maps.size(1) == edge_maps.size(2) >= 1:
        return edge_maps
    if edge_maps.dim() == 2 and edge_maps.size(1) >= 1:
        return torch.diag_embed(edge_maps)
    raise ValueError(
        f"edge_maps must be [E, d, d] or [E, d] (diagonal) with d >= 1, "
        f"got {tuple(edge_maps.shape)}"
    )


def _restriction_maps(
    edge_index: Tensor,
    edge_maps: Tensor | None,
    node_maps: Tensor | None,
    num_nodes: int | None,
) -> tuple[Tensor, Tensor, Tensor, int]:
    """(target maps [E,d,d], source maps [E,d,d], rev, num_nodes) from either kind of sheaf."""
    if (edge_maps is None) == (node_maps is None):
        raise ValueError(
            "pass exactly one of edge_maps (per-edge sheaf) or node_maps (flat bundle)"
        )
    if node_maps is not None:
        if node_maps.dim() != 3 or node_maps.size(1) != node_maps.size(2) or node_maps.size(1) < 1:
            raise ValueError(
                f"node_maps must be [num_nodes, d, d] with d >= 1, got {tuple(node_maps.shape)}"
            )
        num_nodes = node_maps.size(0) if num_nodes is None else num_nodes
        if node_maps.size(0) != num_nodes:
            raise ValueError(
                f"node_maps has {node_maps.size(0)} maps but the graph has {num_nodes} nodes"
            )
        rev = check_edge_index(edge_index, num_nodes)
        return node_maps[edge_index[1]], node_maps[edge_index[0]], rev, num_nodes
    assert edge_maps is not None
    if num_nodes is None:
        num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 1
    rev = check_edge_index(edge_index, num_nodes)
    if edge_maps.size(0) != edge_index.size(1):
        raise ValueError(
            f"edge_maps has {edge_maps.size(0)} maps but edge_index has {edge_index.size(1)} edges"
        )
    target_maps = as_matrices(edge_maps)
    return target_maps, target_maps[rev], rev, num_nodes


def laplacian_blocks(
    edge_index: Tensor,
    *,
    edge_maps: Tensor | None = None,
    node_maps: Tensor | None = None,
    num_nodes: int | None = None,
    edge_weight: Tensor | None = None,
    normalization: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Diagonal blocks [N,d,d] and off-diagonal blocks [E,d,d] (at (target, source)) of L_F.

    ``normalization="augmented"`` returns NSD's (D+I)^{-1/2} L_F (D+I)^{-1/2}, D the diagonal blocks.
    """
    if normalization not in (None, "augmented"):
        raise ValueError(f"normalization must be None or 'augmented', got {normalization!r}")
    target_maps, source_maps, rev, num_nodes = _restriction_maps(
        edge_index, edge_maps, node_maps, num_nodes
    )
    d = target_maps.size(-1)
    weight = check_edge_weight(edge_weight, edge_index, rev, target_maps)
    gram = weight[:, None, None] * target_maps.transpose(-1, -2) @ target_maps
    diagonal = target_maps.new_zeros(num_nodes, d, d).index_add_(0, edge_index[1], gram)
    off = -weight[:, None, None] * target_maps.transpose(-1, -2) @ source_maps
    if normalization == "augmented":
        scale = inverse_sqrt_spd(
            diagonal + torch.eye(d, dtype=diagonal.dtype, device=diagonal.device)
        )
        off = scale[edge_index[1]] @ off @ scale[edge_index[0]]
        diagonal = scale @ diagonal @ scale
    return diagonal, off


def sheaf_laplacian(
    edge_index: Tensor,
    *,
    edge_maps: Tensor | None = None,
    node_maps: Tensor | None = None,
    num_nodes: int | None = None,
    edge_weight: Tensor | None = None,
    normalization: str | None = None,
) -> Tensor:
    """The sheaf Laplacian L_F (or NSD's augmented normalisation) as a sparse [N·d, N·d] tensor.

    >>> L = sheaf_laplacian(edge_index, node_maps=O)        # flat bundle, O: [N, d, d]
    >>> L = sheaf_laplacian(edge_index, edge_maps=F)        # per-edge maps [E, d, d] or [E, d]
    """
    diagonal, off = laplacian_blocks(
        edge_index,
        edge_maps=edge_maps,
        node_maps=node_maps,
        num_nodes=num_nodes,
        edge_weight=edge_weight,
        normalization=normalization,
    )
    num_nodes, d = diagonal.size(0), diagonal.size(-1)
    indices = torch.stack(laplacian_index(edge_index, num_nodes, d))
    size = (num_nodes * d, num_nodes * d)
    values = torch.cat([diagonal, off]).reshape(-1)
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=False).coalesce()


def laplacian_index(edge_index: Tensor, num_nodes: int, stalk_dim: int) -> tuple[Tensor, Tensor]:
    """Row and column, in the (N·d)² matrix, of every entry of :func:`laplacian_blocks`' blocks
    in their order: the N diagonal blocks, then one block per edge at (target, source), each
    row-major. It depends on the graph only, so it can be built once per graph."""
    d = stalk_dim
    nodes = torch.arange(num_nodes, device=edge_index.device)
    block_rows = torch.cat([nodes, edge_index[1]])
    block_cols = torch.cat([nodes, edge_index[0]])
    inner = torch.arange(d, device=edge_index.device)
    rows = (block_rows[:, None, None] * d + inner[None, :, None]).expand(-1, d, d)
    cols = (block_cols[:, None, None] * d + inner[None, None, :]).expand(-1, d, d)
    return rows.reshape(-1), cols.reshape(-1)


def inverse_sqrt_spd(matrices: Tensor) -> Tensor:
    """M^{-1/2} for a batch [B, d, d] of symmetric positive definite matrices.

    Diagonal matrices (the d·I blocks of orthogonal maps, isolated nodes) take an exact
    elementwise path: eigh's backward divides by eigenvalue gaps, which vanish for them.
    """
    diagonal = torch.diagonal(matrices, dim1=-2, dim2=-1)
    result = torch.diag_embed(diagonal.rsqrt())
    off_diagonal = matrices - torch.diag_embed(diagonal)
    full = off_diagonal.abs().amax(dim=(-2, -1)) > 0
    if bool(full.any()):
        values, vectors = torch.linalg.eigh(matrices[full])
        inverse_root = vectors @ torch.diag_embed(values.clamp_min(1e-12).rsqrt())
        result = result.index_put((full.nonzero().squeeze(-1),), inverse_root @ vectors.mT)
    return result


def connected_components(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Component label of every node."""
    import numpy as np
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components as components

    # int32 indices: scipy 1.11's csgraph rejects int64 ones (and returns labels of -9999)
    source, target = edge_index.cpu().numpy().astype(np.int32)
    adjacency = coo_array((np.ones(len(source)), (source, target)), shape=(num_nodes, num_nodes))
    labels = components(adjacency.tocsr(), directed=False)[1]
    return torch.as_tensor(labels, dtype=torch.long, device=edge_index.device)


def pseudo_inverse(laplacian: Tensor, tol: float = 1e-9) -> Tensor:
    """Moore–Penrose inverse of a symmetric PSD matrix in float64 (eigenvalues below ``tol``·λ_max
    are the kernel)."""
    dense = laplacian.to_dense() if laplacian.is_sparse else laplacian
    if dense.size(0) > DENSE_LIMIT:
        raise ValueError(
            f"sheaf resistance uses a dense pseudo-inverse and supports n·d <= {DENSE_LIMIT}, "
            f"got {dense.size(0)}; pass a subgraph"
        )
    dense = dense.double()
    values, vectors = torch.linalg.eigh((dense + dense.T) / 2)
    keep = values > tol * values.abs().max().clamp_min(1.0)
    inverse_values = torch.where(keep, 1.0 / values, torch.zeros_like(values))
    return (vectors * inverse_values) @ vectors.T


def _graph_as_line_bundle(edge_index: Tensor, num_nodes: int | None) -> Tensor:
    """The plain graph as a flat bundle of 1×1 identity maps (its resistance is the graph's)."""
    if num_nodes is None:
        num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 1
    return torch.ones(num_nodes, 1, 1, dtype=torch.float64, device=edge_index.device)


def sheaf_effective_resistance(
    edge_index: Tensor,
    *,
    edge_maps: Tensor | None = None,
    node_maps: Tensor | None = None,
    num_nodes: int | None = None,
    edge_weight: Tensor | None = None,
    pairs: Tensor | None = None,
    transport: bool = True,
) -> Tensor:
    """Sheaf effective resistance R^F as [P, d, d] matrices (float64).

    For every edge of ``edge_index`` (default) this is the Hansen–Ghrist edge form
    R_e = δ_e L_F⁺ δ_eᵀ. For a flat bundle, ``pairs`` [2, P] may name any node pairs:
    R^F_{uv} = B_uvᵀ L_F⁺ B_uv with B_uv = e_u ⊗ A_uᵀ − e_v ⊗ A_vᵀ = Âᵀ((e_u − e_v) ⊗ I_d),
    Â = diag(A_v). For a flat bundle this equals R_uv·I_d, the graph's resistance, whatever the
    (invertible) maps: L_F = Âᵀ(L ⊗ I)Â, so Â L_F⁺ Âᵀ acts as L⁺ ⊗ I on the range of B_uv, and
    only edge weights move it. Without maps (``node_maps=None, edge_maps=None``) it is the graph's
    resistance, d = 1. Pairs in different connected components have infinite resistance.

    ``transport=False`` drops the maps from B_uv: the un-transported form
    R̃_uv = ((e_u − e_v) ⊗ I)ᵀ L_F⁺ ((e_u − e_v) ⊗ I) = L⁺_F[u,u] − L⁺_F[u,v] − L⁺_F[v,u] + L⁺_F[v,v]
    (d×d blocks of L_F⁺), for edges and for any ``pairs``, of a flat bundle or a per-edge sheaf.
    It measures how far apart the raw stalk vectors x_u and x_v are allowed to be, not the
    transported difference A_u x_u − A_v x_v the sheaf compares, so it depends on the maps (and on
    each stalk's basis): for an orthogonal flat bundle L_F⁺[u,v] = L⁺_uv A_uᵀA_v, hence
    R̃_uv = (L⁺_uu + L⁺_vv)·I − L⁺_uv (A_uᵀA_v + A_vᵀA_u) and
    tr R̃_uv = d (L⁺_uu + L⁺_vv) − 2 L⁺_uv tr(A_uᵀA_v),
    which is R_uv·I for identity maps. (e_u − e_v) ⊗ I is in general not orthogonal to ker L_F
    (the global sections x_v = A_v⁻¹c), so R̃ is the pseudo-inverse's quadratic form, not the
    energy of a unit flow.
    """
    if edge_maps is None and node_maps is None:
        node_maps = _graph_as_line_bundle(edge_index, num_nodes)
    target_maps, source_maps, _, num_nodes = _restriction_maps(
        edge_index, edge_maps, node_maps, num_nodes
    )
    laplacian = sheaf_laplacian(
        edge_index,
        edge_maps=edge_maps,
        node_maps=node_maps,
        num_nodes=num_nodes,
        edge_weight=edge_weight,
    )
    d = target_maps.size(-1)
    inverse = pseudo_inverse(laplacian).view(num_nodes, d, num_nodes, d).permute(0, 2, 1, 3)
    if pairs is None:
        u, v, map_u, map_v = edge_index[1], edge_index[0], target_maps, source_maps
    else:
        if node_maps is None and transport:
            raise ValueError(
                "pairs other than edges need a flat bundle (node_maps) or transport=False: a "
                "general sheaf has no path-independent transport between non-adjacent stalks"
            )
        if pairs.dim() != 2 or pairs.size(0) != 2:
            raise ValueError(f"pairs must be a [2, P] tensor, got {tuple(pairs.shape)}")
        if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= num_nodes):
            raise ValueError(f"pairs has node indices outside [0, num_nodes={num_nodes})")
        u, v = pairs
        if transport:
            map_u, map_v = node_maps[u], node_maps[v]
    if transport:
        map_u, map_v = map_u.double(), map_v.double()
        transpose = lambda m: m.transpose(-1, -2)  # noqa: E731
        resistance = (
            map_u @ inverse[u, u] @ transpose(map_u)
            - map_u @ inverse[u, v] @ transpose(map_v)
            - map_v @ inverse[v, u] @ transpose(map_u)
            + map_v @ inverse[v, v] @ transpose(map_v)
        )
    else:
        resistance = inverse[u, u] - inverse[u, v] - inverse[v, u] + inverse[v, v]
    if pairs is not None:
        labels = connected_components(edge_index, num_nodes)
        apart = labels[u] != labels[v]
        resistance[apart] = torch.inf
    return resistance


def total_sheaf_resistance(
    edge_index: Tensor,
    *,
    node_maps: Tensor | None = None,
    num_nodes: int | None = None,
    edge_weight: Tensor | None = None,
) -> Tensor:
    """Σ_{u<v} tr R^F_uv over all node pairs of a flat bundle (Black et al. 2023's total
    resistance, times d for the stalks); without maps, the graph's total resistance. On a
    disconnected graph the sum runs over pairs within a component (the others are infinite).

    Over edges only the sum would be uninformative: Σ_e tr R_e = rank L_F (Foster's theorem).
    """
    if node_maps is None:
        node_maps = _graph_as_line_bundle(edge_index, num_nodes)
    num_nodes = node_maps.size(0)
    d = node_maps.size(-1)
    laplacian = sheaf_laplacian(
        edge_index, node_maps=node_maps, num_nodes=num_nodes, edge_weight=edge_weight
    )
    maps = torch.block_diag(*node_maps.double())
    # Within one component C, Σ_{u<v} B_uv B_uvᵀ = Âᵀ((|C|·I − 11ᵀ) ⊗ I_d)Â, so its total is
    # tr(((|C|·I − 11ᵀ) ⊗ I) Â L⁺ Âᵀ); sum over components.
    transported = (maps @ pseudo_inverse(laplacian) @ maps.T).view(num_nodes, d, num_nodes, d)
    labels = connected_components(edge_index, num_nodes)
    sizes = torch.bincount(labels)[labels].double()
    same = (labels[:, None] == labels[None, :]).double()
    trace = torch.einsum("u,upup->", sizes, transported)
    ones_term = torch.einsum("uv,upvp->", same, transported)
    return trace - ones_term


def diffusion_sensitivity(
    laplacian: Tensor, num_nodes: int, steps: int, alpha: float | None = None
) -> Tensor:
    """S[v, u] = ‖Σ_{ℓ<steps} [(I − αL_F)^ℓ]_{vu}‖_F: how much the input at u reaches v through
    ``steps`` linear diffusion steps (α defaults to 1/(2·max block degree))."""
    dense = (laplacian.to_dense() if laplacian.is_sparse else laplacian).double()
    d = dense.size(0) // num_nodes
    if alpha is None:
        blocks = dense.view(num_nodes, d, num_nodes, d).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        alpha = 1.0 / (2.0 * float(torch.linalg.eigvalsh(blocks).max()))
    eye = torch.eye(dense.size(0), dtype=dense.dtype, device=dense.device)
    step = eye - alpha * dense
    power = eye
    total = torch.zeros_like(dense)
    for _ in range(steps):
        total += power
        power = step @ power
    return total.view(num_nodes, d, num_nodes, d).norm(dim=(1, 3))


def jacobian_sensitivity(
    function: Callable[[Tensor], Tensor], x: Tensor, *, vectorize: bool = False
) -> Tensor:
    """S[v, u] = ‖∂ function(x)_v / ∂x_u‖_F for a node-wise map [N, F_in] → [N, F_out].

    ``vectorize=True`` runs the N·F_out backward passes as one batched pass (``torch.vmap``),
    several times faster, for functions whose backward vmap supports (no data-dependent Python
    control flow on the batched gradients)."""
    jacobian = torch.autograd.functional.jacobian(function, x, vectorize=vectorize)
    return jacobian.norm(dim=(1, 3))
