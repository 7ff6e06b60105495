"""Reference samplers and the DiGress-style baseline, with CurvDiff's ``fit``/``sample`` API.

- :class:`ErdosRenyi`: the size and density of a training graph drawn uniformly.
- :class:`LouvainSBM`: each training graph's Louvain partition gives block sizes and the
  within/between block densities; a sample draws one training graph's fitted SBM.
- :class:`DiGressStyle`: discrete marginal-transition diffusion on edges (:mod:`.digress`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import networkx as nx
import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import dense_to_sparse

from mixlab.graphs.curvdiff.datasets import from_networkx_graph, validate_graphs
from mixlab.graphs.curvdiff.digress import DiscreteEdgeDiffusion, EdgeDenoiser
from mixlab.graphs.curvdiff.metrics import to_networkx
from mixlab.graphs.curvdiff.model import dense_adjacency
from mixlab.shared.config import is_count, require
from mixlab.shared.diffusion import ema_update
from mixlab.shared.progress_report import progress


def density(graph: Data) -> float:
    n = graph.num_nodes
    return graph.edge_index.shape[1] / (n * (n - 1)) if n > 1 else 0.0


class ErdosRenyi:
    """G(n, p) at matched density: (n, p) of a training graph drawn uniformly, so that both the
    size distribution and the edge count per size match the data."""

    def fit(self, graphs: Sequence[Data], **_) -> ErdosRenyi:
        graphs = validate_graphs(list(graphs))
        self.graphs = [(g.num_nodes, density(g)) for g in graphs]
        return self

    def sample(self, num: int, *, seed: int = 0) -> list[Data]:
        require(is_count(num), "num", "an integer >= 1", num)
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(num):
            n, p = self.graphs[int(rng.integers(len(self.graphs)))]
            out.append(
                from_networkx_graph(nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31))))
            )
        return out


class LouvainSBM:
    """A stochastic block model fitted per training graph by Louvain communities."""

    def fit(self, graphs: Sequence[Data], *, seed: int = 0, **_) -> LouvainSBM:
        self.models = []
        for graph in validate_graphs(list(graphs)):
            g = to_networkx(graph)
            blocks = [sorted(b) for b in nx.community.louvain_communities(g, seed=seed)]
            sizes = [len(b) for b in blocks]
            probabilities = np.zeros((len(blocks), len(blocks)))
            for i, a in enumerate(blocks):
                for j, b in enumerate(blocks):
                    edges = nx.cut_size(g, a, b) if i != j else g.subgraph(a).number_of_edges()
                    pairs = len(a) * len(b) if i != j else len(a) * (len(a) - 1) / 2
                    probabilities[i, j] = edges / pairs if pairs else 0.0
            self.models.append((sizes, probabilities.tolist()))
        return self

    def sample(self, num: int, *, seed: int = 0) -> list[Data]:
        require(is_count(num), "num", "an integer >= 1", num)
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(num):
            sizes, probabilities = self.models[int(rng.integers(len(self.models)))]
            g = nx.stochastic_block_model(sizes, probabilities, seed=int(rng.integers(2**31)))
            out.append(from_networkx_graph(nx.convert_node_labels_to_integers(g)))
        return out


class DiGressStyle:
    """Discrete edge diffusion with marginal transitions; same training budget as CurvDiff."""

    def __init__(
        self,
        width: int = 32,
        layers: int = 3,
        heads: int = 4,
        steps: int = 500,
        iterations: int = 3000,
        lr: float = 5e-4,
        batch_size: int = 64,
        ema: float = 0.999,
    ) -> None:
        require(
            is_count(width) and width % heads == 0, "width", f"a multiple of heads={heads}", width
        )
        for name, value in (("layers", layers), ("steps", steps), ("iterations", iterations)):
            require(is_count(value), name, "an integer >= 1", value)
        self.width, self.layers, self.heads = width, layers, heads
        self.steps, self.iterations, self.lr = steps, iterations, lr
        self.batch_size, self.ema = batch_size, ema

    def build(self, density: float = 0.1) -> DiscreteEdgeDiffusion:
        return DiscreteEdgeDiffusion(
            EdgeDenoiser(self.width, self.layers, self.heads), density, self.steps
        )

    def fit(self, graphs: Sequence[Data], *, seed: int = 0, device="cpu", **_) -> DiGressStyle:
        graphs = validate_graphs(list(graphs))
        adjacency, mask = dense_adjacency(graphs)
        adjacency, mask = adjacency.to(device), mask.to(device)
        torch.manual_seed(seed)
        pairs = mask.sum(-1) * (mask.sum(-1) - 1)
        self.model = self.build(float(adjacency.sum() / pairs.sum())).to(device)
        self.ema_model = copy.deepcopy(self.model)
        self.sizes = mask.sum(-1).cpu()
        optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        generator = torch.Generator().manual_seed(seed + 1)
        self.history = []
        self.model.train()
        with progress(self.iterations, "DiGress-style steps") as bar:
            for step in range(self.iterations):
                draw = torch.randint(len(graphs), (self.batch_size,), generator=generator)
                index = draw.to(device)
                rows = mask[index]
                width = int(rows.sum(-1).max())
                loss = self.model.loss(adjacency[index, :width, :width], rows[:, :width])
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                optimizer.step()
                ema_update(self.ema_model, self.model, self.ema, step)
                self.history.append(loss.item())
                bar.advance(loss=self.history[-1])
        self.ema_model.eval()
        return self

    @torch.no_grad()
    def sample(self, num: int, *, seed: int = 0) -> list[Data]:
        require(is_count(num), "num", "an integer >= 1", num)
        generator = torch.Generator().manual_seed(seed)
        sizes = self.sizes[torch.randint(len(self.sizes), (num,), generator=generator)]
        n = int(sizes.max())
        device = self.ema_model.density.device
        mask = (torch.arange(n).unsqueeze(0) < sizes.unsqueeze(1)).to(device)
        noise = torch.Generator(device=device).manual_seed(seed)
        adjacency = self.ema_model.sample(mask, noise).cpu()
        out = []
        for i, size in enumerate(sizes.tolist()):
            edge_index, _ = dense_to_sparse(adjacency[i, :size, :size])
            out.append(Data(edge_index=edge_index, num_nodes=size))
        return out
