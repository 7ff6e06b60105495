"""``CurvDiff``: fit a mixed-curvature latent diffusion model on a user's graphs, then sample.

    model = CurvDiff(geometry="HSE").fit(graphs)      # any PyG dataset or list of Data
    samples = model.sample(64, seed=0)                 # list of Data (molecules carry .smiles)
    model.save("runs/model"); CurvDiff.load("runs/model")

Two stages (spec §1a): the product-manifold autoencoder (:mod:`.latent`), then a DDPM on its
standardized tangent-space node latents (:mod:`.diffusion`). Sampling draws (n, c(G)) from a
training graph, generates n node latents, maps them to the manifold and decodes the adjacency
(threshold 0.5, symmetric, empty diagonal) and, for molecules, atom and bond types.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch_geometric.data import Batch, Data
from torch_geometric.utils import dense_to_sparse, to_dense_adj, to_dense_batch

from mixlab.graphs.curvdiff.curvature import DESCRIPTOR_DIM, with_curvature
from mixlab.graphs.curvdiff.datasets import validate_graphs
from mixlab.graphs.curvdiff.diffusion import GaussianDiffusion, NodeDenoiser
from mixlab.graphs.curvdiff.latent import GraphAutoencoder, parse_geometry
from mixlab.shared.config import is_count, require
from mixlab.shared.diffusion import ema_update
from mixlab.shared.progress_report import progress


@dataclass
class CurvDiffConfig:
    """Every choice of a CurvDiff model; defaults follow the spec's CPU suggestions."""

    geometry: str = "HSE"
    """components of the latent product: letters from H (hyperbolic), S (spherical), E"""
    latent_dim: int = 12
    """total latent dimension, split evenly over the components"""
    hidden: int = 64
    """GIN encoder width"""
    encoder_layers: int = 3
    noise_dim: int = 8
    """random node features that break automorphisms in the encoder"""
    ricci_gating: bool = False
    """R1: gate each node's product distance by a head trained on its curvature sign (HSE only)"""
    ricci_matching: float = 0.0
    """R2: weight of the latent-vs-graph Ollivier–Ricci matching loss (0 = off)"""
    ricci_conditioning: bool = False
    """FiLM the denoiser on the graph's curvature descriptor c(G), with classifier-free guidance"""
    guidance: float = 1.0
    """classifier-free guidance weight w at sampling (with ricci_conditioning)"""
    curvature_h: float = -1.0
    """initial curvature of H (< 0)"""
    curvature_s: float = 1.0
    """initial curvature of S (> 0)"""
    learn_curvature: bool = True
    ae_epochs: int = 200
    ae_lr: float = 3e-3
    batch_size: int = 16
    refine_steps: int = 100
    """Adam steps on each graph's own latents after the encoder (0: the encoder alone)"""
    refine_lr: float = 0.03
    denoiser_width: int = 64
    denoiser_layers: int = 3
    diffusion_steps: int = 500
    """T of the DDPM"""
    diffusion_iterations: int = 3000
    diffusion_lr: float = 5e-4
    diffusion_batch_size: int = 64
    ema: float = 0.999
    encodings_per_graph: int = 4
    """encodings of each training graph (fresh random features each) that the DDPM learns"""
    max_nodes: int = 64

    def __post_init__(self) -> None:
        parse_geometry(self.geometry)
        require(self.curvature_s > 0, "curvature_s", "a sphere curvature > 0", self.curvature_s)
        require(self.curvature_h < 0, "curvature_h", "a hyperbolic curvature < 0", self.curvature_h)
        for name in (
            "latent_dim",
            "hidden",
            "encoder_layers",
            "ae_epochs",
            "batch_size",
            "denoiser_width",
            "denoiser_layers",
            "diffusion_steps",
            "diffusion_iterations",
            "diffusion_batch_size",
            "encodings_per_graph",
            "max_nodes",
        ):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            self.latent_dim % len(self.geometry) == 0,
            "latent_dim",
            f"a multiple of the number of components of {self.geometry!r}",
            self.latent_dim,
        )
        require(
            not self.ricci_gating or sorted(self.geometry) == sorted("HSE"),
            "ricci_gating",
            "False unless the geometry has all of H, S and E",
            self.ricci_gating,
        )
        require(
            isinstance(self.refine_steps, int) and self.refine_steps >= 0,
            "refine_steps",
            "an integer >= 0",
            self.refine_steps,
        )
        require(self.ricci_matching >= 0, "ricci_matching", "a weight >= 0", self.ricci_matching)
        require(0 <= self.ema < 1, "ema", "a decay in [0, 1)", self.ema)


def is_molecule(graph: Data) -> bool:
    """A molecule graph carries one-hot atom types ``x`` and one-hot bond types ``edge_attr``
    (other node features are the user's own and are not generated)."""

    def one_hot(t) -> bool:
        return (
            t is not None
            and t.dim() == 2
            and bool(((t == 0) | (t == 1)).all())
            and bool((t.sum(-1) == 1).all())
        )

    return one_hot(getattr(graph, "x", None)) and one_hot(getattr(graph, "edge_attr", None))


def dense_adjacency(graphs: Sequence[Data]) -> tuple[torch.Tensor, torch.Tensor]:
    """Graphs → ([B, N, N] 0/1 adjacency, [B, N] node mask), N the largest graph's size."""
    batch = Batch.from_data_list(
        [Data(edge_index=g.edge_index, num_nodes=g.num_nodes) for g in graphs]
    )
    sizes = torch.tensor([g.num_nodes for g in graphs])
    n = int(sizes.max())
    adjacency = to_dense_adj(batch.edge_index, batch.batch, max_num_nodes=n)
    mask = torch.arange(n).unsqueeze(0) < sizes.unsqueeze(1)
    return adjacency, mask


class CurvDiff:
    """Mixed-curvature latent diffusion for graphs; see the module docstring."""

    def __init__(self, geometry: str = "HSE", **options: Any) -> None:
        self.config = CurvDiffConfig(geometry=geometry, **options)
        self.autoencoder: GraphAutoencoder | None = None
        self.diffusion: GaussianDiffusion | None = None
        self.atom_types: tuple[str, ...] | None = None
        self.history: dict[str, list[float]] = {"autoencoder": [], "diffusion": []}

    # ------------------------------------------------------------------ training
    def fit(
        self,
        graphs: Sequence[Data],
        *,
        atom_types: Sequence[str] | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        log: Callable[[str, int, float], None] | None = None,
    ) -> CurvDiff:
        """Train the autoencoder, then the DDPM on its latents. ``graphs``: a PyG dataset or list
        of undirected ``Data`` (one-hot atom types ``x`` with one-hot bond types ``edge_attr``
        make it a molecule model, see :func:`is_molecule`; ``atom_types`` names the ``x``
        columns for SMILES output). Other node features are ignored: the model generates
        structure."""
        graphs = self._prepare(graphs)
        molecules = all(is_molecule(g) for g in graphs)
        self.atom_types = tuple(atom_types) if atom_types is not None else None
        torch.manual_seed(seed)
        self.build(
            atom_classes=graphs[0].x.shape[1] if molecules else 0,
            bond_classes=graphs[0].edge_attr.shape[1] if molecules else 0,
        )
        self.autoencoder.to(device)
        self._fit_autoencoder(graphs, seed, device, log)
        self._fit_diffusion(graphs, seed, device, log)
        return self

    def build(self, atom_classes: int = 0, bond_classes: int = 0) -> CurvDiff:
        """Create the (untrained) autoencoder and DDPM; ``fit`` trains them from scratch."""
        c = self.config
        self.autoencoder = GraphAutoencoder(
            c.geometry,
            c.latent_dim,
            c.hidden,
            c.encoder_layers,
            c.noise_dim,
            atom_types=atom_classes,
            bond_types=bond_classes,
            gating=c.ricci_gating,
            curvature_h=c.curvature_h,
            curvature_s=c.curvature_s,
            learn_curvature=c.learn_curvature,
        )
        denoiser = NodeDenoiser(
            c.latent_dim,
            c.denoiser_width,
            c.denoiser_layers,
            cond_dim=DESCRIPTOR_DIM if c.ricci_conditioning else 0,
        )
        self.diffusion = GaussianDiffusion(denoiser, c.diffusion_steps)
        self.ema_diffusion = copy.deepcopy(self.diffusion)
        return self

    def _batches(self, graphs: list[Data], size: int, generator: torch.Generator):
        order = torch.randperm(len(graphs), generator=generator)
        for start in range(0, len(graphs), size):
            yield Batch.from_data_list([graphs[i] for i in order[start : start + size]])

    def _fit_autoencoder(self, graphs, seed, device, log) -> None:
        model = self.autoencoder
        optimizer = torch.optim.Adam(model.parameters(), lr=self.config.ae_lr)
        generator = torch.Generator().manual_seed(seed)
        model.train()
        with progress(self.config.ae_epochs, "autoencoder epochs") as bar:
            for epoch in range(self.config.ae_epochs):
                total = 0.0
                for batch in self._batches(graphs, self.config.batch_size, generator):
                    loss, _ = model.loss(batch.to(device), self.config.ricci_matching)
                    optimizer.zero_grad()
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    total += loss.item()
                self.history["autoencoder"].append(total)
                if log is not None:
                    log("autoencoder", epoch, total)
                bar.advance(loss=total)
        model.eval()

    def encode(
        self, graphs: Sequence[Data], seed: int = 0, refine: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tangent-space node latents [B, N, d] and node mask [B, N] (random features seeded),
        refined on each graph's reconstruction loss unless ``refine`` is False."""
        return self._encode(self._prepare(graphs), seed, refine)

    def _prepare(self, graphs: Sequence[Data]) -> list[Data]:
        """Validated graphs with their Ricci attributes: what every stage reads."""
        return with_curvature(validate_graphs(list(graphs), max_nodes=self.config.max_nodes))

    @torch.no_grad()  # latents are data for the diffusion stage; refine re-enables grad
    def _encode(
        self, graphs: list[Data], seed: int, refine: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        device = self._device()
        batch = Batch.from_data_list(graphs).to(device)
        generator = torch.Generator().manual_seed(seed)
        noise = torch.randn(batch.num_nodes, self.config.noise_dim, generator=generator)
        u, mask = self.autoencoder.encode(batch, noise.to(device))
        if not refine or self.config.refine_steps == 0:
            return u, mask
        adjacency = to_dense_adj(batch.edge_index, batch.batch, max_num_nodes=u.shape[1])
        atoms = bonds = None
        if self.autoencoder.atom_types:
            atoms = to_dense_batch(batch.x.argmax(-1), batch.batch)[0]
            bonds = to_dense_adj(
                batch.edge_index, batch.batch, batch.edge_attr.argmax(-1), u.shape[1]
            ).long()
        u = self.autoencoder.refine(
            u,
            mask,
            adjacency,
            atoms,
            bonds,
            self.config.refine_steps,
            self.config.refine_lr,
        )
        return u, mask

    def _fit_diffusion(self, graphs, seed, device, log) -> None:
        c = self.config
        latents, masks = [], []
        with progress(c.encodings_per_graph, "encode latents") as bar:
            for k in range(c.encodings_per_graph):
                u, mask = self._encode(graphs, seed=seed * 1000 + k)
                latents.append(u)
                masks.append(mask)
                bar.advance()
        x0, mask = torch.cat(latents), torch.cat(masks)
        nodes = x0[mask]
        mean, std = nodes.mean(0), nodes.std(0).clamp_min(1e-6)
        x0 = (x0 - mean) / std * mask.unsqueeze(-1)
        descriptors = torch.cat([g.curvature_descriptor.float() for g in graphs]).to(device)
        d_mean, d_std = descriptors.mean(0), descriptors.std(0).clamp_min(1e-6)
        cond_dim = DESCRIPTOR_DIM if c.ricci_conditioning else 0
        self.diffusion.to(device)
        self.ema_diffusion = copy.deepcopy(self.diffusion)
        self.normalisation = {
            "latent_mean": mean,
            "latent_std": std,
            "descriptor_mean": d_mean,
            "descriptor_std": d_std,
            "train_sizes": torch.tensor([g.num_nodes for g in graphs], device=device),
            "train_descriptors": descriptors,
        }
        conditions = ((descriptors - d_mean) / d_std).repeat(c.encodings_per_graph, 1)
        optimizer = torch.optim.Adam(self.diffusion.parameters(), lr=c.diffusion_lr)
        generator = torch.Generator().manual_seed(seed + 1)
        self.diffusion.train()
        with progress(c.diffusion_iterations, "diffusion steps") as bar:
            for step in range(c.diffusion_iterations):
                index = torch.randint(len(x0), (c.diffusion_batch_size,), generator=generator)
                rows = mask[index]
                width = int(rows.sum(-1).max())
                loss = self.diffusion.loss(
                    x0[index, :width], rows[:, :width], conditions[index] if cond_dim else None
                )
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.diffusion.parameters(), 1.0)
                optimizer.step()
                ema_update(self.ema_diffusion, self.diffusion, c.ema, step)
                value = loss.item()
                self.history["diffusion"].append(value)
                if log is not None and step % 100 == 0:
                    log("diffusion", step, value)
                bar.advance(loss=value)
        self.diffusion.eval()
        self.ema_diffusion.eval()

    # ------------------------------------------------------------------ sampling
    def _device(self) -> torch.device:
        require(self.autoencoder is not None, "model", "a fitted CurvDiff (call fit or load)", None)
        return next(self.autoencoder.parameters()).device

    @torch.no_grad()
    def sample(self, num: int, *, seed: int = 0, guidance: float | None = None) -> list[Data]:
        """``num`` generated graphs (deterministic given ``seed``)."""
        require(is_count(num), "num", "an integer >= 1", num)
        device = self._device()
        c, stats = self.config, self.normalisation
        generator = torch.Generator().manual_seed(seed)
        pick = torch.randint(len(stats["train_sizes"]), (num,), generator=generator)
        sizes = stats["train_sizes"].cpu()[pick]
        n = int(sizes.max())
        mask = (torch.arange(n).unsqueeze(0) < sizes.unsqueeze(1)).to(device)
        cond = None
        if c.ricci_conditioning:
            descriptors = stats["train_descriptors"][pick.to(device)]
            cond = (descriptors - stats["descriptor_mean"]) / stats["descriptor_std"]
        weight = c.guidance if guidance is None else guidance
        noise = torch.Generator(device=device).manual_seed(seed)
        x = self.ema_diffusion.sample(mask, c.latent_dim, cond, weight, noise)
        u = x * stats["latent_std"] + stats["latent_mean"]
        decoded = self.autoencoder.decode(u, mask)
        return [self._to_data(graph) for graph in decoded]

    def _to_data(self, graph: dict[str, torch.Tensor]) -> Data:
        adjacency = graph["adjacency"].cpu()
        edge_index, _ = dense_to_sparse(adjacency)
        data = Data(edge_index=edge_index, num_nodes=adjacency.shape[0])
        if "atoms" in graph:
            from mixlab.graphs.curvdiff.molecules import data_to_smiles

            atoms, bonds = graph["atoms"].cpu(), graph["bond_orders"].cpu()
            data.x = torch.nn.functional.one_hot(atoms, self.autoencoder.atom_types).float()
            data.edge_attr = torch.nn.functional.one_hot(
                bonds[edge_index[0], edge_index[1]] - 1, self.autoencoder.bond_types
            ).float()
            if self.atom_types is not None:
                data.smiles = data_to_smiles((atoms.numpy(), bonds.numpy()), self.atom_types)
        return data

    # ------------------------------------------------------------------ autoencoder quality
    @torch.no_grad()
    def reconstruct(
        self, graphs: Sequence[Data], seed: int = 0, *, refine: bool = True
    ) -> dict[str, torch.Tensor]:
        """Edge probabilities, true adjacency, mask and latent product distances of ``graphs``;
        with ``refine``, after the latents are refined on each graph's own adjacency (what
        the decoder can hold), else from the encoder alone (what it infers)."""
        graphs = self._prepare(graphs)
        u, mask = self._encode(graphs, seed, refine=refine)
        adjacency, _ = dense_adjacency(graphs)
        return {
            "probabilities": self.autoencoder.edge_logits(u).sigmoid().cpu(),
            "adjacency": adjacency,
            "mask": mask.cpu(),
            "latent_distances": self.autoencoder.squared_distance(u).clamp_min(0).sqrt().cpu(),
        }

    def curvatures(self) -> dict[str, float]:
        """The learned component curvatures (E is 0)."""
        return self.autoencoder.manifold.curvatures()

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path) -> Path:
        """``model.safetensors`` (both networks, EMA denoiser, statistics) and ``config.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"autoencoder.{k}": v for k, v in self.autoencoder.state_dict().items()}
        tensors |= {f"diffusion.{k}": v for k, v in self.ema_diffusion.state_dict().items()}
        tensors |= {f"normalisation.{k}": v for k, v in self.normalisation.items()}
        save_file(
            {k: v.contiguous().cpu() for k, v in tensors.items()}, directory / "model.safetensors"
        )
        meta = {
            "method": "curvdiff",
            "config": asdict(self.config),
            "atom_types": list(self.atom_types) if self.atom_types else None,
            "atom_classes": self.autoencoder.atom_types,
            "bond_classes": self.autoencoder.bond_types,
        }
        (directory / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> CurvDiff:
        directory = Path(directory)
        files = (directory / "config.json", directory / "model.safetensors")
        require(
            all(f.is_file() for f in files),
            "model",
            "a folder written by CurvDiff.save (config.json and model.safetensors)",
            str(directory),
        )
        meta = json.loads(files[0].read_text())
        known = {f.name for f in fields(CurvDiffConfig)}
        model = cls(**{k: v for k, v in meta["config"].items() if k in known})
        model.atom_types = tuple(meta["atom_types"]) if meta.get("atom_types") else None
        tensors = load_file(files[1])
        part = {
            prefix: {
                k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + ".")
            }
            for prefix in ("autoencoder", "diffusion", "normalisation")
        }
        model.build(meta["atom_classes"], meta["bond_classes"])
        model.autoencoder.load_state_dict(part["autoencoder"])
        model.ema_diffusion.load_state_dict(part["diffusion"])
        model.diffusion = model.ema_diffusion
        model.normalisation = {k: v.to(device) for k, v in part["normalisation"].items()}
        model.autoencoder.to(device).eval()
        model.ema_diffusion.to(device).eval()
        return model


def parameter_total(model: CurvDiff) -> int:
    """Trainable parameters of both stages."""
    return sum(
        p.numel()
        for module in (model.autoencoder, model.diffusion)
        for p in module.parameters()
        if p.requires_grad
    )
