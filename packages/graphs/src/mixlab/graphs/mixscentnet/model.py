"""MixScentNet's networks: a molecule encoder, three mixture aggregators (the GATv2 mixture graph,
CheMix self-attention and mean pooling), the scaled-cosine distance head, and the end-to-end model.

Shapes: a *component table* is a PyG ``Batch`` of the C distinct component molecules; a *mixture
batch* is a ``Batch`` of mixture graphs (:class:`MixtureGraph`), whose nodes index the table
(``component``) and carry a concentration (``concentration``). The encoder maps the table to
(C, d); an aggregator maps the mixture batch and those embeddings to (M, d'); the head maps
pairs of mixture embeddings to distances in [0, 1].

Everything downstream of the encoder is invariant to the order of a mixture's components
(message passing is equivariant, every readout is a symmetric function) and the head is
symmetric in the pair (the cosine is), both tested.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GATv2Conv, GINEConv, MultiAggregation
from torch_geometric.utils import to_dense_batch

from mixlab.graphs.mixscentnet.featurize import ATOM_FEATURES, BOND_FEATURES

__all__ = [
    "AGGREGATORS",
    "ENCODERS",
    "MeanPooling",
    "MixScentNet",
    "MixtureGATv2",
    "MixtureGraph",
    "MoleculeEncoder",
    "ScaledCosineDistance",
    "SelfAttentionAggregation",
]

ENCODERS = ("gatv2", "gine")
AGGREGATORS = ("graph", "attention", "mean")
MIXTURE_EDGE_FEATURES = 2  # Tanimoto(ECFP4_i, ECFP4_j), |c_i − c_j|
PNA = ("mean", "std", "max", "min")
MOLECULE_READOUT = (*PNA, "sum")
"""the molecule readout adds the sum to POMMix's four: a mean cannot count, and most Mordred
descriptors are counts or sums over atoms (with the four alone the median held-out R² of the
pretraining targets was 0.19)"""


class _PNAReadout(nn.Module):
    """Mean, std, max and min over each group (POMMix ``GlobalPNA``), optionally the sum, then
    a linear map."""

    def __init__(self, width: int, out: int, aggregators: Sequence[str] = PNA) -> None:
        super().__init__()
        self.aggregate = MultiAggregation(list(aggregators))
        self.project = nn.Linear(len(aggregators) * width, out)

    def forward(self, x: Tensor, index: Tensor, groups: int) -> Tensor:
        return self.project(self.aggregate(x, index, dim_size=groups))


class MoleculeEncoder(nn.Module):
    """Atoms (85) and bonds (14) → one embedding per molecule.

    ``conv="gatv2"``: POMMix-style node attention (``GATv2Conv`` with bond features, ``heads``
    heads, residual and LayerNorm); ``conv="gine"``: ``GINEConv`` with a 2-layer MLP. Both end in
    the PNA readout (with the sum, :data:`MOLECULE_READOUT`) and are ``layers`` deep, ``hidden``
    wide."""

    def __init__(
        self,
        hidden: int = 64,
        out_dim: int = 96,
        layers: int = 3,
        conv: str = "gatv2",
        heads: int = 4,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if conv not in ENCODERS:
            raise ValueError(f"conv must be one of {list(ENCODERS)}, got {conv!r}")
        if hidden % heads:
            raise ValueError(f"hidden must be a multiple of heads={heads}, got {hidden}")
        self.conv, self.out_dim = conv, out_dim
        self.embed = nn.Linear(ATOM_FEATURES, hidden)
        self.convs = nn.ModuleList()
        for _ in range(layers):
            if conv == "gatv2":
                layer = GATv2Conv(hidden, hidden // heads, heads=heads, edge_dim=BOND_FEATURES)
            else:
                mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
                layer = GINEConv(mlp, edge_dim=BOND_FEATURES)
            self.convs.append(layer)
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.readout = _PNAReadout(hidden, out_dim, MOLECULE_READOUT)

    def forward(self, molecules: Batch) -> Tensor:
        x = self.embed(molecules.x)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = norm(x + self.dropout(F.relu(conv(x, molecules.edge_index, molecules.edge_attr))))
        return self.readout(x, molecules.batch, molecules.num_graphs)


class MixtureGraph:
    """A mixture as a graph: one node per component, a complete graph with self-loops, edge
    features [Tanimoto(ECFP4_i, ECFP4_j), |c_i − c_j|].

    ``similarity`` is the (C, C) Tanimoto matrix of the component table; calling the transform on
    component indices (and concentrations, 1 each when unknown) returns the mixture's ``Data``.
    The published mixture sets are intensity-matched (no concentrations), so a model trained on
    them has only seen |Δc| = 0: give concentrations at prediction time only to a model trained
    with them."""

    def __init__(self, similarity: np.ndarray | Tensor) -> None:
        self.similarity = torch.as_tensor(similarity, dtype=torch.float)

    def __call__(
        self, components: Sequence[int], concentrations: Sequence[float] | None = None
    ) -> Data:
        index = torch.as_tensor(list(components), dtype=torch.long)
        if index.numel() == 0:
            raise ValueError("a mixture needs at least one component")
        n = index.numel()
        c = (
            torch.ones(n)
            if concentrations is None
            else torch.as_tensor(concentrations, dtype=torch.float)
        )
        row, column = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        row, column = row.reshape(-1), column.reshape(-1)
        edge_attr = torch.stack(
            [self.similarity[index[row], index[column]], (c[row] - c[column]).abs()], dim=-1
        )
        return Data(
            component=index,
            concentration=c,
            edge_index=torch.stack([row, column]),
            edge_attr=edge_attr,
            num_nodes=n,
        )


class MixtureGATv2(nn.Module):
    """The mixture graph network: ``layers`` ``GATv2Conv`` layers with ``edge_dim`` over the complete
    component graph, residual, LayerNorm, then a PNA or attention readout."""

    def __init__(
        self, in_dim: int, width: int = 96, heads: int = 4, layers: int = 2,
        readout: str = "pna", dropout: float = 0.1,
    ) -> None:  # fmt: skip
        super().__init__()
        if width % heads:
            raise ValueError(f"width must be a multiple of heads={heads}, got {width}")
        self.project = nn.Linear(in_dim + 1, width)  # + the concentration
        self.convs = nn.ModuleList(
            GATv2Conv(
                width, width // heads, heads=heads, edge_dim=MIXTURE_EDGE_FEATURES,
                add_self_loops=False,  # the mixture graph has them, with features
            )
            for _ in range(layers)
        )  # fmt: skip
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        if readout == "pna":
            self.readout = _PNAReadout(width, width)
        elif readout == "attention":
            self.readout = _AttentionReadout(width)
        else:
            raise ValueError(f"readout must be 'pna' or 'attention', got {readout!r}")

    def forward(self, h: Tensor, mixtures: Batch) -> Tensor:
        x = self.project(torch.cat([h[mixtures.component], mixtures.concentration[:, None]], -1))
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = norm(x + self.dropout(F.elu(conv(x, mixtures.edge_index, mixtures.edge_attr))))
        return self.readout(x, mixtures.batch, mixtures.num_graphs)


class _AttentionReadout(nn.Module):
    """Attention pooling with the mixture mean as the query (POMMix ``AttentionAggregation``)."""

    def __init__(self, width: int, heads: int = 4) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x: Tensor, index: Tensor, groups: int) -> Tensor:
        dense, mask = to_dense_batch(x, index, batch_size=groups)
        query = (dense * mask[..., None]).sum(1, keepdim=True) / mask.sum(1)[:, None, None]
        out, _ = self.attention(query, dense, dense, key_padding_mask=~mask, need_weights=False)
        return out[:, 0]


class SelfAttentionAggregation(nn.Module):
    """CheMix: multi-head self-attention over a mixture's components (residual, LayerNorm),
    then attention pooling with the mean query. No component-pair features."""

    def __init__(self, in_dim: int, width: int = 96, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.project = nn.Linear(in_dim + 1, width)
        self.attention = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.readout = _AttentionReadout(width, heads)

    def forward(self, h: Tensor, mixtures: Batch) -> Tensor:
        x = self.project(torch.cat([h[mixtures.component], mixtures.concentration[:, None]], -1))
        dense, mask = to_dense_batch(x, mixtures.batch, batch_size=mixtures.num_graphs)
        mixed, _ = self.attention(dense, dense, dense, key_padding_mask=~mask, need_weights=False)
        x = self.norm(dense + mixed)[mask]
        return self.readout(x, mixtures.batch, mixtures.num_graphs)


class MeanPooling(nn.Module):
    """DeepSets with mean pooling: an MLP per component, the mean, a linear map."""

    def __init__(self, in_dim: int, width: int = 96) -> None:
        super().__init__()
        self.phi = nn.Sequential(nn.Linear(in_dim + 1, width), nn.ReLU(), nn.Linear(width, width))
        self.rho = nn.Linear(width, width)

    def forward(self, h: Tensor, mixtures: Batch) -> Tensor:
        x = self.phi(torch.cat([h[mixtures.component], mixtures.concentration[:, None]], -1))
        sums = torch.zeros(mixtures.num_graphs, x.shape[1], device=x.device)
        sums.index_add_(0, mixtures.batch, x)
        counts = torch.bincount(mixtures.batch, minlength=mixtures.num_graphs).clamp(min=1)
        return self.rho(sums / counts[:, None])


class ScaledCosineDistance(nn.Module):
    """POMMix's ``ScaledCosineRegressor``: d̂ = hardtanh₀¹(a · (1 − cos(z, z′)) + b), a and b
    start at 0.5 and a is clamped ≥ 0 so that more similar embeddings never read as further."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.5))
        self.b = nn.Parameter(torch.tensor(0.5))

    def forward(self, z1: Tensor, z2: Tensor) -> Tensor:
        cosine = F.cosine_similarity(z1, z2, dim=-1)
        return F.hardtanh(self.a.clamp(min=0) * (1 - cosine) + self.b, 0.0, 1.0)


class MixScentNet(nn.Module):
    """Molecule encoder → mixture aggregator → scaled-cosine distance, trained end to end.

    ``aggregator`` is ``graph`` (:class:`MixtureGATv2`, the method, ``graph_layers`` deep),
    ``attention`` (:class:`SelfAttentionAggregation`, CheMix/POMMix) or ``mean``
    (:class:`MeanPooling`)."""

    def __init__(
        self,
        encoder: MoleculeEncoder,
        aggregator: str = "graph",
        width: int = 96,
        heads: int = 4,
        readout: str = "pna",
        dropout: float = 0.1,
        graph_layers: int = 2,
    ) -> None:
        super().__init__()
        if aggregator not in AGGREGATORS:
            raise ValueError(f"aggregator must be one of {list(AGGREGATORS)}, got {aggregator!r}")
        self.encoder = encoder
        d = encoder.out_dim
        if aggregator == "graph":
            self.aggregator = MixtureGATv2(
                d, width, heads, layers=graph_layers, readout=readout, dropout=dropout
            )
        elif aggregator == "attention":
            self.aggregator = SelfAttentionAggregation(d, width, heads, dropout)
        else:
            self.aggregator = MeanPooling(d, width)
        self.head = ScaledCosineDistance()

    def embed(self, molecules: Batch, mixtures: Batch) -> Tensor:
        """Mixture embeddings (M, width) of the mixture batch over the component table."""
        return self.aggregator(self.encoder(molecules), mixtures)

    def forward(self, molecules: Batch, mixtures: Batch, pairs: Tensor) -> Tensor:
        """Distances (P,) of ``pairs`` (P, 2) of mixture-batch indices."""
        z = self.embed(molecules, mixtures)
        return self.head(z[pairs[:, 0]], z[pairs[:, 1]])
