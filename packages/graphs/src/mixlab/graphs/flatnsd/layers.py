"""Sheaf diffusion layers as PyG ``MessagePassing`` modules, and models that stack them.

Node features are flattened stalks: x ∈ R^{N × d·f} is read as X ∈ R^{N × d × f} (stalk dimension
d, f channels). Every layer first mixes X ← W_left X W_right (W_left d×d initialised to I, W_right
f×f orthogonal, as in NSD's ``disc_models.py``), then diffuses with the normalised sheaf Laplacian
Δ_F = (D+I)^{-1/2} L_F (D+I)^{-1/2}:

- ``update="discrete"`` (NSD): X ← (1 + tanh ε) ⊙ X − ELU(Δ_F W_left X W_right);
- ``update="heat"`` (BuNN-style): X ← ELU(FFN([X ‖ H(t) W_left X W_right])) with the heat
  kernel H(t) = exp(−tΔ_F) as a K-term Taylor series (K = 12: within 0.011 of exp(−tλ) on the
  whole spectrum), a learnable time t ∈ (0, 2) per channel (BuNN uses K = 8 with t = 1, where
  8 terms suffice; at tλ = 4 they would give 0.53 for exp(−4) = 0.018), and BuNN's concatenation
  of the input with the diffused signal, mixed by a two-layer FFN over the channels (the same
  for every stalk coordinate; it mixes channels, not stalk dimensions). There is no plain
  residual: H(t) keeps constant sections, so X + ELU(H(t)X) would double them at every layer
  (measured: training stalls at chance on RingTransfer with 4 layers); the FFN learns how much
  of X to keep.

:class:`FlatNSDConv` learns one map per node (a flat bundle): Δ_F = Âᵀ(Δ_w ⊗ I)Â needs one graph
propagation of d·f numbers per edge. :class:`NSDConv` learns per-edge maps (NSD's diagonal,
bundle and general sheaves) and propagates d×d transports per edge.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCNConv, GINConv, MessagePassing
from torch_geometric.nn.pool import global_add_pool, global_max_pool, global_mean_pool
from torch_geometric.utils import is_sparse

from mixlab.graphs.flatnsd.maps import (
    EDGE_MAP_KINDS,
    NODE_MAP_KINDS,
    EdgeMapLearner,
    EdgeWeightLearner,
    NodeMapLearner,
)
from mixlab.graphs.flatnsd.sheaf import (
    as_matrices,
    check_edge_index,
    check_edge_weight,
    inverse_sqrt_spd,
)
from mixlab.shared.checks import check_choice, check_count

UPDATES = ("discrete", "heat")
MAX_DIFFUSION_TIME = 2.0  # λ(Δ_F) < 2, so tλ < 4: 12 Taylor terms are within 0.011 of e^{-tλ}
POOLS = {"mean": global_mean_pool, "add": global_add_pool, "max": global_max_pool}

Operator = Callable[[Tensor], Tensor]


class SheafDiffusionConv(MessagePassing):
    """The update shared by every sheaf layer; subclasses build the operator y ↦ Δ_F y.

    ``forward(x, edge_index, edge_weight=None)`` follows PyG's convs: ``edge_index`` [2, E] of
    any integer dtype, listing every edge in both directions; ``edge_weight`` [E] scales each
    edge's term of L_F = δᵀWδ (messages and degrees alike), so a weight of 0 removes the edge.
    It must be non-negative and equal on both directions. A self-loop's coboundary
    F_{v⊴e}x_v − F_{v⊴e}x_v is zero, so it adds nothing to L_F and would only inflate the degree
    in the normalisation (D+I)^{-1/2}: ``remove_self_loops=True`` gives self-loops weight 0,
    the same as dropping them (so ``AddSelfLoops`` pipelines work); ``False`` refuses them.
    """

    def __init__(
        self,
        channels: int,
        stalk_dim: int,
        *,
        update: str = "discrete",
        taylor_terms: int = 12,
        remove_self_loops: bool = True,
    ) -> None:
        super().__init__(aggr="add")
        check_count(channels, "channels")
        check_count(stalk_dim, "stalk_dim")
        check_count(taylor_terms, "taylor_terms")
        check_choice(update, "update", UPDATES)
        if not isinstance(remove_self_loops, bool):
            raise ValueError(f"remove_self_loops must be True or False, got {remove_self_loops!r}")
        self.channels, self.stalk_dim = channels, stalk_dim
        self.in_channels = self.out_channels = stalk_dim * channels  # PyG's names for the width
        self.update_rule, self.taylor_terms = update, taylor_terms
        self.remove_self_loops = remove_self_loops
        self.left = nn.Parameter(torch.empty(stalk_dim, stalk_dim))
        self.right = nn.Parameter(torch.empty(channels, channels))
        discrete = update == "discrete"
        self.epsilon = nn.Parameter(torch.empty(stalk_dim)) if discrete else None
        self.time_logit = nn.Parameter(torch.empty(channels)) if update == "heat" else None
        self.ffn = (
            None
            if discrete
            else nn.Sequential(
                nn.Linear(2 * channels, channels), nn.ELU(), nn.Linear(channels, channels)
            )
        )

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.left.copy_(torch.eye(self.stalk_dim))
            nn.init.orthogonal_(self.right)
            if self.epsilon is not None:
                self.epsilon.zero_()
            if self.time_logit is not None:
                self.time_logit.zero_()  # t = 1, BuNN's default
        for module in self.children():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        for layer in self.ffn or ():
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()

    @property
    def diffusion_time(self) -> Tensor | None:
        """The heat variant's time t per channel (None for the discrete update)."""
        if self.time_logit is None:
            return None
        return MAX_DIFFUSION_TIME * torch.sigmoid(self.time_logit)

    def operator(self, x: Tensor, edge_index: Tensor, reverse: Tensor, weight: Tensor) -> Operator:
        """y [N, d, f] ↦ Δ_F y, with ``weight`` [E] the input edge weights (0 on self-loops)."""
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_weight: Tensor | None = None,
        *,
        reverse: Tensor | None = None,
    ) -> Tensor:
        """x [N, d·f], edge_index [2, E], edge_weight [E] or None → [N, d·f].

        ``reverse`` (from :func:`check_edge_index`) may be passed to skip re-validating the
        same ``edge_index`` in every layer."""
        self._check_x(x)
        if reverse is None:
            reverse = self.check_edges(edge_index, x.size(0))
        edge_index = edge_index.long()
        weight = self._input_weight(edge_weight, edge_index, reverse, x)
        laplacian = self.operator(x, edge_index, reverse, weight)
        stalks = x.view(x.size(0), self.stalk_dim, self.channels)
        mixed = self.left @ stalks @ self.right
        if self.epsilon is not None:
            out = (1 + torch.tanh(self.epsilon))[:, None] * stalks - F.elu(laplacian(mixed))
        else:
            # exp(−tΔ)y = Σ_k (−tΔ)^k y / k!, accumulated term by term (BuNN's Taylor recursion).
            time = self.diffusion_time
            term, heat = mixed, mixed
            for k in range(1, self.taylor_terms + 1):
                term = -(time / k) * laplacian(term)
                heat = heat + term
            out = F.elu(self.ffn(torch.cat([stalks, heat], dim=-1)))
        return out.reshape(x.size(0), -1)

    def _check_x(self, x: Tensor) -> None:
        # a tuple of types, not `tuple | list`: dynamo in torch 2.4 cannot trace a types.UnionType
        if isinstance(x, (tuple, list)):
            raise ValueError(
                "x must be one [num_nodes, features] tensor: bipartite graphs (x_src, x_dst) are "
                "not supported, since a sheaf needs one node set with a stalk at both ends of "
                "every edge"
            )
        width = self.stalk_dim * self.channels
        if not isinstance(x, Tensor) or x.dim() != 2 or x.size(1) != width:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x)
            raise ValueError(f"x must be [num_nodes, stalk_dim·channels = {width}], got {shape}")

    def check_edges(self, edge_index: Tensor, num_nodes: int) -> Tensor:
        """Validate ``edge_index`` for this layer and return its reverse-edge permutation."""
        if is_sparse(edge_index):
            raise ValueError(
                "edge_index must be a [2, num_edges] tensor: a SparseTensor or sparse adjacency "
                "(adj_t, T.ToSparseTensor) is not supported; pass data.edge_index, or convert "
                "with torch_geometric.utils.to_edge_index"
            )
        return check_edge_index(edge_index, num_nodes, self_loops=self.remove_self_loops)

    def _input_weight(
        self, edge_weight: Tensor | None, edge_index: Tensor, reverse: Tensor, x: Tensor
    ) -> Tensor:
        """``edge_weight`` as [E] in x's dtype (ones where None), 0 on self-loops."""
        weight = check_edge_weight(edge_weight, edge_index, reverse, x)
        if self.remove_self_loops:
            weight = weight * (edge_index[0] != edge_index[1])
        return weight

    def _neighbour_sum(self, edge_index: Tensor, values: Tensor, **edge_data: Tensor) -> Tensor:
        num_nodes = values.size(0)
        summed = self.propagate(edge_index, value=values.reshape(num_nodes, -1), **edge_data)
        return summed.view_as(values)

    def __repr__(self) -> str:  # PyG's style, as GATConv(16, 32, heads=2)
        return (
            f"{type(self).__name__}({self.in_channels}, {self.out_channels}, "
            f"channels={self.channels}, stalk_dim={self.stalk_dim}, maps={self.maps!r}, "
            f"update={self.update_rule!r})"
        )


class FlatNSDConv(SheafDiffusionConv):
    """Neural sheaf diffusion on a learned flat bundle: one map A_v per node, from x_v.

    Δ_F y = Mᵀ Âᵀ (L_w ⊗ I) Â M y with M_v = (w_v A_vᵀA_v + I)^{-1/2} (w_v the weighted degree),
    so one layer costs one graph propagation of d·f numbers per edge plus N small d×d products.
    ``maps="orthogonal"`` (O(d), the paper's flat bundle) or ``"general"`` (invertible, exp of a
    matrix), learned from x_v (``map_gnn_layers=0``) or by BuNN's small GNN over the graph
    (``map_gnn_layers`` GraphSAGE layers); ``bundles`` splits the f channels into that many groups,
    each diffused on its own learned bundle (BuNN's several bundles, with one edge weight per edge
    shared by all); ``edge_weights=True`` learns w_e = σ(W[x_i ‖ x_j]), the only part of a flat sheaf
    that can move its effective resistance (see :func:`sheaf_effective_resistance`); a given
    ``edge_weight`` multiplies it. ``torch.compile(conv, fullgraph=True)`` works with the
    orthogonal maps learned from x_v (the general maps' inverse square root branches on the data,
    and the GNN φ drops the edges of weight 0, a data-dependent shape).

        >>> conv = FlatNSDConv(channels=16, stalk_dim=2)
        >>> out = conv(x, edge_index)       # x: [N, 32], edge_index undirected
        >>> out = conv(x, edge_index, edge_weight)
    """

    def __init__(
        self,
        channels: int,
        stalk_dim: int = 2,
        *,
        maps: str = "orthogonal",
        map_gnn_layers: int = 0,
        bundles: int = 1,
        edge_weights: bool = True,
        update: str = "discrete",
        taylor_terms: int = 12,
        remove_self_loops: bool = True,
    ) -> None:
        super().__init__(
            channels,
            stalk_dim,
            update=update,
            taylor_terms=taylor_terms,
            remove_self_loops=remove_self_loops,
        )
        check_choice(maps, "maps", NODE_MAP_KINDS)
        check_count(map_gnn_layers, "map_gnn_layers", 0)
        check_count(bundles, "bundles", 1)
        if channels % bundles:
            raise ValueError(f"bundles must divide channels = {channels}, got {bundles}")
        self.maps, self.bundles = maps, bundles
        width = stalk_dim * channels
        self.map_learner = NodeMapLearner(
            width, stalk_dim, maps, gnn_layers=map_gnn_layers, bundles=bundles
        )
        self.weight_learner = EdgeWeightLearner(width) if edge_weights else None
        self.reset_parameters()

    def sheaf(
        self, x: Tensor, edge_index: Tensor, edge_weight: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """The flat sheaf this layer builds from ``x``: node maps [N, d, d] (or
        [N, bundles, d, d]) and the edge weights [E] it diffuses with (learned × ``edge_weight``,
        0 on self-loops)."""
        self._check_x(x)
        reverse = self.check_edges(edge_index, x.size(0))
        edge_index = edge_index.long()
        weight = self._input_weight(edge_weight, edge_index, reverse, x)
        return self._sheaf(x, edge_index, reverse, weight)

    def _sheaf(
        self, x: Tensor, edge_index: Tensor, reverse: Tensor, weight: Tensor
    ) -> tuple[Tensor, Tensor]:
        # φ reads the graph without the edges of weight 0 (removed ones, and self-loops, which
        # SAGE's mean would count twice beside the node's own term)
        kept = edge_index if not self.map_learner.gnn else edge_index[:, weight > 0]
        node_maps = self.map_learner(x, kept)
        if self.weight_learner is not None:
            weight = self.weight_learner(x, edge_index, reverse) * weight
        return node_maps, weight

    def operator(self, x: Tensor, edge_index: Tensor, reverse: Tensor, weight: Tensor) -> Operator:
        node_maps, weight = self._sheaf(x, edge_index, reverse, weight)
        num_nodes, b, d = x.size(0), self.bundles, self.stalk_dim
        node_maps = node_maps.view(num_nodes, b, d, d)
        degree = x.new_zeros(num_nodes).index_add_(0, edge_index[1], weight)
        if self.maps == "orthogonal":  # A_vᵀA_v = I: the normaliser is a scalar per node
            lift = node_maps * (degree + 1).rsqrt()[:, None, None, None]
        else:
            eye = torch.eye(d, dtype=x.dtype, device=x.device)
            gram = degree[:, None, None, None] * node_maps.transpose(-1, -2) @ node_maps
            lift = node_maps @ inverse_sqrt_spd((gram + eye).view(-1, d, d)).view_as(node_maps)

        def apply(y: Tensor) -> Tensor:
            # [N, d, f] → [N, bundles, d, f / bundles]: each channel group on its own bundle
            z = lift @ y.view(num_nodes, d, b, -1).transpose(1, 2)
            neighbours = self._neighbour_sum(edge_index, z, weight=weight)
            out = lift.transpose(-1, -2) @ (degree[:, None, None, None] * z - neighbours)
            return out.transpose(1, 2).reshape_as(y)

        return apply

    def message(self, value_j: Tensor, weight: Tensor) -> Tensor:
        return weight[:, None] * value_j


class NSDConv(SheafDiffusionConv):
    """Neural Sheaf Diffusion (Bodnar et al., NeurIPS 2022) with per-edge maps F = tanh(W[x_i‖x_j]):
    ``maps="diag"`` (Diag-NSD), ``"orthogonal"`` (Bundle-NSD, O(d) maps per edge, not flat) or
    ``"general"`` (General-NSD). Same contract as :class:`FlatNSDConv`."""

    def __init__(
        self,
        channels: int,
        stalk_dim: int = 2,
        *,
        maps: str = "diag",
        update: str = "discrete",
        taylor_terms: int = 12,
        remove_self_loops: bool = True,
    ) -> None:
        super().__init__(
            channels,
            stalk_dim,
            update=update,
            taylor_terms=taylor_terms,
            remove_self_loops=remove_self_loops,
        )
        check_choice(maps, "maps", EDGE_MAP_KINDS)
        self.maps = maps
        self.map_learner = EdgeMapLearner(stalk_dim * channels, stalk_dim, maps)
        self.reset_parameters()

    def sheaf(self, x: Tensor, edge_index: Tensor) -> Tensor:
        """Per-edge maps [E, d, d] (or [E, d] for ``"diag"``) this layer builds from ``x``."""
        return self.map_learner(x, edge_index)

    def operator(self, x: Tensor, edge_index: Tensor, reverse: Tensor, weight: Tensor) -> Operator:
        target_maps = as_matrices(self.sheaf(x, edge_index))
        # w_e F_{i⊴e}ᵀ F_{j⊴e}
        transport = weight[:, None, None] * (target_maps.transpose(-1, -2) @ target_maps[reverse])
        d = self.stalk_dim
        eye = torch.eye(d, dtype=x.dtype, device=x.device)
        if self.maps == "orthogonal":  # FᵀF = I on every edge: D = deg·I exactly
            degree = x.new_zeros(x.size(0)).index_add_(0, edge_index[1], weight)
            diagonal = degree[:, None, None] * eye
        else:
            gram = weight[:, None, None] * (target_maps.transpose(-1, -2) @ target_maps)
            diagonal = x.new_zeros(x.size(0), d, d).index_add_(0, edge_index[1], gram)
        scale = inverse_sqrt_spd(diagonal + eye)

        def apply(y: Tensor) -> Tensor:
            z = scale @ y
            neighbours = self._neighbour_sum(edge_index, z, transport=transport)
            return scale @ (diagonal @ z - neighbours)

        return apply

    def message(self, value_j: Tensor, transport: Tensor) -> Tensor:
        stalks = value_j.view(value_j.size(0), self.stalk_dim, self.channels)
        return (transport @ stalks).reshape(value_j.size(0), -1)


SHEAVES = ("flat", "flat_general", "diag", "bundle", "general")
MESSAGE_PASSING = ("gcn", "gin", "gat")


def make_sheaf_conv(sheaf: str, channels: int, stalk_dim: int, **kwargs) -> SheafDiffusionConv:
    """A sheaf layer by name: ``flat`` (FlatNSD, orthogonal), ``flat_general``, ``diag``,
    ``bundle`` (per-edge orthogonal) or ``general``."""
    check_choice(sheaf, "sheaf", SHEAVES)
    if sheaf.startswith("flat"):
        maps = "general" if sheaf == "flat_general" else "orthogonal"
        return FlatNSDConv(channels, stalk_dim, maps=maps, **kwargs)
    maps = {"diag": "diag", "bundle": "orthogonal", "general": "general"}[sheaf]
    return NSDConv(channels, stalk_dim, maps=maps, **kwargs)


class _NodeOrGraphModel(nn.Module):
    """lin_in → ELU → layers → lin_out, read per node or pooled per graph (``pool``)."""

    def __init__(self, pool: str | None, dropout: float) -> None:
        super().__init__()
        if pool is not None:
            check_choice(pool, "pool", tuple(POOLS))
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.pool, self.dropout = pool, dropout

    def readout(self, h: Tensor, batch: Tensor | None) -> Tensor:
        if self.pool is not None:
            if batch is None:
                batch = h.new_zeros(h.size(0), dtype=torch.long)
            h = POOLS[self.pool](h, batch)
        return self.lin_out(h)


class SheafDiffusionNet(_NodeOrGraphModel):
    """A stack of sheaf diffusion layers for node tasks (``pool=None``) or graph tasks
    (``pool="mean" | "add" | "max"``).

        >>> model = SheafDiffusionNet(dataset.num_features, dataset.num_classes, sheaf="flat",
        ...                           stalk_dim=2, channels=16, num_layers=4)
        >>> logits = model(data.x, data.edge_index)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        sheaf: str = "flat",
        stalk_dim: int = 2,
        channels: int = 16,
        num_layers: int = 2,
        dropout: float = 0.0,
        pool: str | None = None,
        **conv_kwargs,
    ) -> None:
        super().__init__(pool, dropout)
        for value, name in ((in_channels, "in_channels"), (out_channels, "out_channels")):
            check_count(value, name)
        check_count(num_layers, "num_layers")
        self.sheaf = sheaf
        width = stalk_dim * channels
        self.lin_in = nn.Linear(in_channels, width)
        self.convs = nn.ModuleList(
            make_sheaf_conv(sheaf, channels, stalk_dim, **conv_kwargs) for _ in range(num_layers)
        )
        self.lin_out = nn.Linear(width, out_channels)

    def layer_inputs(self, x: Tensor, edge_index: Tensor) -> list[Tensor]:
        """The input of every layer (what each layer's map learner reads)."""
        reverse = self.convs[0].check_edges(edge_index, x.size(0))  # once for every layer
        h = F.elu(self.lin_in(x))
        inputs = []
        for conv in self.convs:
            inputs.append(h)
            h = conv(F.dropout(h, self.dropout, self.training), edge_index, reverse=reverse)
        return inputs

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None) -> Tensor:
        reverse = self.convs[0].check_edges(edge_index, x.size(0))  # once for every layer
        h = F.elu(self.lin_in(x))
        for conv in self.convs:
            h = conv(F.dropout(h, self.dropout, self.training), edge_index, reverse=reverse)
        return self.readout(h, batch)


class MessagePassingNet(_NodeOrGraphModel):
    """The message-passing baselines in the same contract: lin_in, residual GCN / GIN / GAT layers
    (h ← h + ReLU(conv(h))), lin_out."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        conv: str = "gcn",
        hidden: int = 32,
        num_layers: int = 2,
        dropout: float = 0.0,
        pool: str | None = None,
    ) -> None:
        super().__init__(pool, dropout)
        check_choice(conv, "conv", MESSAGE_PASSING)
        for value, name in ((in_channels, "in_channels"), (out_channels, "out_channels")):
            check_count(value, name)
        check_count(hidden, "hidden")
        check_count(num_layers, "num_layers")
        self.lin_in = nn.Linear(in_channels, hidden)
        self.convs = nn.ModuleList(_mp_conv(conv, hidden) for _ in range(num_layers))
        self.lin_out = nn.Linear(hidden, out_channels)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None) -> Tensor:
        h = self.lin_in(x)
        for conv in self.convs:
            h = h + F.relu(conv(F.dropout(h, self.dropout, self.training), edge_index))
        return self.readout(h, batch)


def _mp_conv(conv: str, hidden: int) -> MessagePassing:
    if conv == "gcn":
        return GCNConv(hidden, hidden)
    if conv == "gat":
        return GATConv(hidden, hidden, heads=1)
    mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
    return GINConv(mlp)
