"""The product-manifold graph autoencoder of CurvDiff (spec §1a).

Each node gets a tangent vector u_v at the origin, split into one slice per component of the
product H^{d_H} × S^{d_S} × E^{d_E}; its manifold point is z^c = exp₀^{κ_c}(u^c) (geoopt's
κ-stereographic model: the Poincaré ball for κ < 0, the stereographic sphere for κ > 0, flat
space at κ = 0). The decoder is Fermi–Dirac on the weighted product distance (Gu et al., ICLR
2019; HGCN):

    p(A_uv = 1) = σ((r − Σ_c w_c · g_uv^c · d_c(z_u^c, z_v^c)²) / t)

with learnable r, t > 0, w_c > 0 and curvatures (κ_H < 0 < κ_S, by softplus). g_uv^c = 1 unless
the Ricci gating (R1) is on: then g_uv^c = C · a_u^c · a_v^c with a_v = softmax over components of
a head on the node's latent, trained to predict the sign class of the node's Ollivier–Ricci
curvature (κ < −τ → H, κ > τ → S, else E). The spec gates on MLP(κ(v), F(v)); that cannot be
evaluated on a generated graph, so here the gate reads the latent the diffusion generates.

R2, latent-curvature matching, compares each edge's Ollivier–Ricci curvature with the one
computed from latent distances (entropic OT, differentiable; :func:`latent_curvature`).

The encoder is a GINE network over [degree one-hot, κ(v), F(v), random-walk PE, atom one-hot,
random features]. The random features (Sato et al., 2021) break the symmetry between automorphic
nodes: without them two sibling leaves get the same latent, distance 0, and an edge between them.
The map stays permutation equivariant given the features.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GINEConv
from torch_geometric.utils import to_dense_adj, to_dense_batch

from mixlab.shared.config import require

with warnings.catch_warnings():  # geoopt 0.5 calls torch.jit.script, deprecated in torch 2.9+
    warnings.simplefilter("ignore", FutureWarning)
    from geoopt.manifolds.stereographic import math as stereo

COMPONENTS = "HSE"
"""the component letters: hyperbolic, spherical, Euclidean"""
MAX_DEGREE = 10
"""degrees above this share the last one-hot slot"""
WALK_STEPS = 8
"""random-walk positional encoding: return probabilities after 1..8 steps"""
GATE_THRESHOLD = 0.05
"""τ of the R1 gating target: |κ(v)| ≤ τ counts as flat"""


def parse_geometry(geometry: str) -> str:
    """Validate a geometry string: letters from H, S, E, each at most once ("HSE", "E", "HE")."""
    ok = (
        isinstance(geometry, str)
        and len(geometry) > 0
        and all(letter in COMPONENTS for letter in geometry)
        and len(set(geometry)) == len(geometry)
    )
    require(ok, "geometry", "letters from H, S, E, each at most once (e.g. 'HSE', 'E')", geometry)
    return geometry


def _softplus_inverse(value: float) -> float:
    return value + math.log(-math.expm1(-value))


class ProductManifold(nn.Module):
    """H^{d_H} × S^{d_S} × E^{d_E} with learnable curvatures, total dimension ``dim`` split evenly."""

    def __init__(
        self,
        geometry: str = "HSE",
        dim: int = 12,
        curvature_h: float = -1.0,
        curvature_s: float = 1.0,
        learn_curvature: bool = True,
    ) -> None:
        super().__init__()
        self.geometry = parse_geometry(geometry)
        require(
            isinstance(dim, int) and dim >= len(geometry) and dim % len(geometry) == 0,
            "latent_dim",
            f"a positive multiple of the number of components ({len(geometry)})",
            dim,
        )
        require(curvature_h < 0, "curvature_h", "a hyperbolic curvature < 0", curvature_h)
        require(curvature_s > 0, "curvature_s", "a sphere curvature > 0", curvature_s)
        self.dim = dim
        self.component_dim = dim // len(geometry)
        # κ_H = −softplus(ρ_H), κ_S = softplus(ρ_S): the sign of each component is fixed.
        self.raw_h = nn.Parameter(
            torch.tensor(_softplus_inverse(-curvature_h)), requires_grad=learn_curvature
        )
        self.raw_s = nn.Parameter(
            torch.tensor(_softplus_inverse(curvature_s)), requires_grad=learn_curvature
        )

    def curvature(self, letter: str) -> Tensor:
        if letter == "H":
            return -F.softplus(self.raw_h)
        if letter == "S":
            return F.softplus(self.raw_s)
        return torch.zeros((), device=self.raw_h.device)

    def curvatures(self) -> dict[str, float]:
        return {letter: self.curvature(letter).item() for letter in self.geometry}

    def slices(self, x: Tensor) -> list[tuple[str, Tensor]]:
        return list(zip(self.geometry, x.split(self.component_dim, dim=-1), strict=True))

    def expmap0(self, u: Tensor) -> Tensor:
        """Tangent vectors at the origin → manifold points, per component."""
        parts = []
        for letter, part in self.slices(u):
            if letter == "E":
                parts.append(part)
            else:
                k = self.curvature(letter)
                parts.append(stereo.project(stereo.expmap0(part, k=k), k=k))
        return torch.cat(parts, dim=-1)

    def logmap0(self, z: Tensor) -> Tensor:
        """Manifold points → tangent vectors at the origin (the shared tangent space)."""
        parts = []
        for letter, part in self.slices(z):
            parts.append(part if letter == "E" else stereo.logmap0(part, k=self.curvature(letter)))
        return torch.cat(parts, dim=-1)

    def pairwise_squared_distances(self, z: Tensor) -> Tensor:
        """[..., N, dim] points → [..., N, N, C] squared geodesic distances per component."""
        out = []
        for letter, part in self.slices(z):
            a, b = part.unsqueeze(-2), part.unsqueeze(-3)
            if letter == "E":
                out.append((a - b).pow(2).sum(-1))
            else:
                out.append(stereo.dist(a, b, k=self.curvature(letter)).pow(2))
        return torch.stack(out, dim=-1)


def random_walk_encoding(adjacency: Tensor, steps: int = WALK_STEPS) -> Tensor:
    """[B, N, N] dense adjacency → [B, N, steps] return probabilities of the random walk
    (Dwivedi et al., 2022): diag((D⁻¹A)^k), k = 1..steps."""
    degree = adjacency.sum(-1, keepdim=True).clamp_min(1)
    walk = adjacency / degree
    power = walk
    out = []
    for _ in range(steps):
        out.append(power.diagonal(dim1=-2, dim2=-1))
        power = power @ walk
    return torch.stack(out, dim=-1)


def node_features(
    batch, noise: Tensor | None = None, noise_dim: int = 8, atom_types: bool = False
) -> Tensor:
    """The encoder input of every node of a PyG batch (curvature attributes required); with
    ``atom_types``, ``batch.x`` (one-hot atom types) joins it."""
    n = batch.num_nodes
    degree = torch.zeros(n, device=batch.edge_index.device)
    degree.index_add_(
        0, batch.edge_index[0], torch.ones_like(batch.edge_index[0], dtype=torch.float)
    )
    onehot = F.one_hot(degree.long().clamp_max(MAX_DEGREE), MAX_DEGREE + 1).float()
    adjacency = to_dense_adj(batch.edge_index, batch.batch)
    walks, mask = to_dense_batch(torch.zeros(n, 1, device=degree.device), batch.batch)
    walks = random_walk_encoding(adjacency)[mask]
    curvature = torch.stack([batch.node_curvature, batch.node_forman / 10.0], dim=-1).float()
    parts = [onehot, curvature, walks]
    if atom_types:
        parts.append(batch.x.float())
    if noise is None:
        noise = torch.randn(n, noise_dim, device=degree.device)
    parts.append(noise)
    return torch.cat(parts, dim=-1)


class GraphEncoder(nn.Module):
    """GINE layers with jumping knowledge → one tangent vector per node."""

    def __init__(self, in_dim: int, hidden: int, layers: int, latent_dim: int, edge_dim: int):
        super().__init__()
        self.input = nn.Linear(in_dim, hidden)
        self.convs = nn.ModuleList(
            GINEConv(
                nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden)),
                edge_dim=edge_dim,
            )
            for _ in range(layers)
        )
        self.head = nn.Sequential(
            nn.Linear(hidden * (layers + 1), hidden), nn.SiLU(), nn.Linear(hidden, latent_dim)
        )

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        h = self.input(x)
        states = [h]
        for conv in self.convs:
            h = h + F.silu(conv(h, edge_index, edge_attr))
            states.append(h)
        return self.head(torch.cat(states, dim=-1))


class GraphAutoencoder(nn.Module):
    """Encoder, product manifold and Fermi–Dirac decoder, plus atom and bond heads for molecules."""

    def __init__(
        self,
        geometry: str = "HSE",
        latent_dim: int = 12,
        hidden: int = 64,
        layers: int = 3,
        noise_dim: int = 8,
        atom_types: int = 0,
        bond_types: int = 0,
        gating: bool = False,
        curvature_h: float = -1.0,
        curvature_s: float = 1.0,
        learn_curvature: bool = True,
    ) -> None:
        super().__init__()
        self.manifold = ProductManifold(
            geometry, latent_dim, curvature_h, curvature_s, learn_curvature
        )
        require(
            not gating or sorted(geometry) == sorted(COMPONENTS),
            "ricci_gating",
            "False unless the geometry has all of H, S and E (the gate picks one of them)",
            gating,
        )
        self.noise_dim = noise_dim
        self.atom_types = atom_types
        self.bond_types = bond_types
        in_dim = MAX_DEGREE + 1 + 2 + WALK_STEPS + atom_types + noise_dim
        self.encoder = GraphEncoder(in_dim, hidden, layers, latent_dim, max(bond_types, 1))
        components = len(geometry)
        self.radius = nn.Parameter(torch.tensor(1.0))
        self.raw_temperature = nn.Parameter(torch.tensor(_softplus_inverse(0.1)))
        self.raw_weights = nn.Parameter(torch.full((components,), _softplus_inverse(1.0)))
        self.gate = (
            nn.Sequential(nn.Linear(latent_dim, hidden), nn.SiLU(), nn.Linear(hidden, components))
            if gating
            else None
        )
        self.atom_head = (
            nn.Sequential(nn.Linear(latent_dim, hidden), nn.SiLU(), nn.Linear(hidden, atom_types))
            if atom_types
            else None
        )
        self.bond_head = (
            nn.Sequential(
                nn.Linear(2 * latent_dim, hidden), nn.SiLU(), nn.Linear(hidden, bond_types)
            )
            if bond_types
            else None
        )

    @property
    def geometry(self) -> str:
        return self.manifold.geometry

    def encode(self, batch, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A PyG batch → (tangent vectors [B, N, d], node mask [B, N])."""
        x = node_features(batch, noise, self.noise_dim, atom_types=self.atom_types > 0)
        edge_attr = getattr(batch, "edge_attr", None)
        if edge_attr is None or self.bond_types == 0:
            edge_attr = torch.ones(batch.edge_index.shape[1], 1, device=x.device)
        u = self.encoder(x, batch.edge_index, edge_attr.float())
        return to_dense_batch(u, batch.batch)

    def gates(self, u: Tensor) -> Tensor | None:
        return None if self.gate is None else self.gate(u).softmax(-1)

    def squared_distance(self, u: Tensor) -> Tensor:
        """[B, N, d] tangent vectors → [B, N, N] weighted (and gated) squared product distance."""
        per_component = self.manifold.pairwise_squared_distances(self.manifold.expmap0(u))
        weighted = per_component * F.softplus(self.raw_weights)
        gate = self.gates(u)
        if gate is not None:
            components = gate.shape[-1]
            weighted = weighted * components * gate.unsqueeze(-2) * gate.unsqueeze(-3)
        return weighted.sum(-1)

    def edge_logits(self, u: Tensor) -> Tensor:
        """Fermi–Dirac: logit p(A_uv) = (r − d²_uv) / t."""
        return (self.radius - self.squared_distance(u)) / F.softplus(self.raw_temperature)

    def bond_logits(self, u: Tensor) -> Tensor:
        """[B, N, N, bond_types], symmetric in (u, v)."""
        a, b = u.unsqueeze(-2), u.unsqueeze(-3)
        pair = torch.cat([a * b, (a - b).abs()], dim=-1)
        return self.bond_head(pair)

    def decode(self, u: Tensor, mask: Tensor, threshold: float = 0.5) -> list[dict[str, Tensor]]:
        """Tangent vectors → per graph: symmetric 0/1 adjacency with an empty diagonal, and atom
        and bond types for molecules."""
        logits = self.edge_logits(u)
        adjacency = (logits > math.log(threshold / (1 - threshold))).float()
        adjacency = torch.triu(adjacency, diagonal=1)
        adjacency = adjacency + adjacency.transpose(-1, -2)
        atoms = self.atom_head(u).argmax(-1) if self.atom_head is not None else None
        bonds = self.bond_logits(u).argmax(-1) + 1 if self.bond_head is not None else None
        graphs = []
        for i in range(u.shape[0]):
            n = int(mask[i].sum())
            graph = {"adjacency": adjacency[i, :n, :n]}
            if atoms is not None:
                graph["atoms"] = atoms[i, :n]
            if bonds is not None:
                graph["bond_orders"] = bonds[i, :n, :n] * graph["adjacency"].long()
            graphs.append(graph)
        return graphs

    def refine(
        self,
        u: Tensor,
        mask: Tensor,
        adjacency: Tensor,
        atoms: Tensor | None = None,
        bonds: Tensor | None = None,
        steps: int = 100,
        lr: float = 0.03,
    ) -> Tensor:
        """Semi-amortized encoding (Kim et al., ICML 2018): start from the encoder's latents and
        take ``steps`` Adam steps on the reconstruction loss of each graph, decoder frozen.

        A GIN encoder alone reconstructs graphs with AUROC ≈ 0.98 but almost never exactly (one
        wrong pair of 276 fails a graph); refined latents do, and the distortion they reach
        measures what the geometry can embed rather than what the encoder amortizes."""
        pairs = mask.unsqueeze(-1) & mask.unsqueeze(-2)
        pairs = pairs & ~torch.eye(u.shape[1], dtype=torch.bool, device=u.device)
        frozen = [p for p in self.parameters() if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        u = u.detach().clone().requires_grad_(True)
        optimizer = torch.optim.Adam([u], lr=lr)
        try:
            with torch.enable_grad():
                for _ in range(steps):
                    logits = self.edge_logits(u)
                    loss = F.binary_cross_entropy_with_logits(logits[pairs], adjacency[pairs])
                    if atoms is not None and self.atom_head is not None:
                        loss = loss + F.cross_entropy(self.atom_head(u[mask]), atoms[mask])
                    if bonds is not None and self.bond_head is not None:
                        edges = pairs & (adjacency > 0)
                        loss = loss + F.cross_entropy(self.bond_logits(u)[edges], bonds[edges])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return u.detach()

    def loss(self, batch, curvature_matching: float = 0.0) -> tuple[Tensor, dict[str, float]]:
        """Class-balanced BCE over all node pairs (pos_weight = #neg/#pos), atom and bond CE,
        the R1 gate's CE and λ·L_curv (R2)."""
        u, mask = self.encode(batch)
        target = to_dense_adj(batch.edge_index, batch.batch, max_num_nodes=u.shape[1])
        pairs = mask.unsqueeze(-1) & mask.unsqueeze(-2)
        pairs = pairs & ~torch.eye(u.shape[1], dtype=torch.bool, device=u.device)
        logits = self.edge_logits(u)[pairs]
        labels = target[pairs]
        positives = labels.sum().clamp_min(1)
        pos_weight = (labels.numel() - positives) / positives
        loss = F.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight)
        parts = {"edges": loss.item()}
        if self.atom_head is not None:
            atoms = F.cross_entropy(self.atom_head(u[mask]), batch.x.argmax(-1))
            loss, parts["atoms"] = loss + atoms, atoms.item()
        if self.bond_head is not None:
            b, i, j = _edge_coordinates(batch)
            bonds = F.cross_entropy(self.bond_logits(u)[b, i, j], batch.edge_attr.argmax(-1))
            loss, parts["bonds"] = loss + bonds, bonds.item()
        if self.gate is not None:
            gates = self.gate(u[mask])
            gate_loss = F.cross_entropy(gates, gate_targets(batch.node_curvature, self.geometry))
            loss, parts["gate"] = loss + gate_loss, gate_loss.item()
        if curvature_matching > 0:
            b, i, j = _edge_coordinates(batch)
            distance = self.squared_distance(u).clamp_min(1e-9).sqrt()
            predicted = latent_curvature(distance, target, b, i, j)
            matching = (predicted - batch.edge_curvature.float()).pow(2).mean()
            loss, parts["curvature"] = loss + curvature_matching * matching, matching.item()
        return loss, parts


def gate_targets(
    node_curvature: Tensor, geometry: str, threshold: float = GATE_THRESHOLD
) -> Tensor:
    """The R1 class of each node: κ < −τ → H, κ > τ → S, otherwise E (indices into geometry)."""
    target = torch.full_like(node_curvature, geometry.index("E"), dtype=torch.long)
    target[node_curvature < -threshold] = geometry.index("H")
    target[node_curvature > threshold] = geometry.index("S")
    return target


def _edge_coordinates(batch) -> tuple[Tensor, Tensor, Tensor]:
    """(graph, row, column) in the dense layout of each entry of ``batch.edge_index``."""
    graph = batch.batch[batch.edge_index[0]]
    offset = batch.ptr[graph]
    return graph, batch.edge_index[0] - offset, batch.edge_index[1] - offset


def sinkhorn(a: Tensor, b: Tensor, cost: Tensor, reg: float, iterations: int = 200) -> Tensor:
    """Entropic OT cost between rows of ``a`` and ``b`` ([E, N] masses, [E, N, N] costs), log
    domain (Cuturi, 2013), differentiable in the cost."""
    log_a, log_b = a.clamp_min(1e-30).log(), b.clamp_min(1e-30).log()
    f = torch.zeros_like(a)
    g = torch.zeros_like(b)
    kernel = -cost / reg
    for _ in range(iterations):
        f = reg * (log_a - torch.logsumexp(kernel + g.unsqueeze(-2) / reg, dim=-1))
        g = reg * (log_b - torch.logsumexp(kernel + f.unsqueeze(-1) / reg, dim=-2))
    plan = torch.exp(kernel + f.unsqueeze(-1) / reg + g.unsqueeze(-2) / reg)
    return (plan * cost).sum((-1, -2))


def latent_curvature(
    distance: Tensor,
    adjacency: Tensor,
    graph: Tensor,
    row: Tensor,
    column: Tensor,
    alpha: float = 0.5,
    reg: float = 0.05,
) -> Tensor:
    """R2's κ̂(u, v) = 1 − W₁^lat(m_u, m_v) / d_lat(z_u, z_v) for the listed edges, with the lazy
    random-walk measures m_u = α·δ_u + (1−α)/deg(u)·Σ_{w∼u} δ_w of the spec and the latent
    distances as ground cost (scaled per edge by d_lat(u, v), which κ̂ is invariant to)."""
    walk = adjacency / adjacency.sum(-1, keepdim=True).clamp_min(1)
    eye = torch.eye(adjacency.shape[-1], device=adjacency.device)
    measure = alpha * eye + (1 - alpha) * walk  # [B, N, N]: row u is m_u
    scale = distance[graph, row, column].clamp_min(1e-6)
    cost = distance[graph] / scale[:, None, None]
    transport = sinkhorn(measure[graph, row], measure[graph, column], cost, reg)
    return 1 - transport
