"""POMO (Kwon et al. NeurIPS 2020) for TSP, CVRP and VRPTW in plain PyTorch, with a pluggable
normalisation.

Encoder: nodes embedded to d (TSP: x, y; VRP customers: x, y, demand / capacity, and for VRPTW
the window and service time; the depot its own embedding), then L layers of multi-head attention
and a feed-forward block, each followed by Add & Norm where Norm is any of :mod:`.norms` (POMO's
instance norm, the Attention Model's batch norm, RL4CO's "layer", MixNorm).

Decoder: the query is a context (TSP: the first and the last city's embeddings; CVRP: the last
node's embedding and the remaining load, POMO's CVRP decoder; VRPTW: also the current time), one
multi-head glimpse over the nodes, then a single-head pointer with 10·tanh clipping. Masks forbid
visited customers, demands above the load, the depot twice in a row and, for VRPTW, customers
whose window closes before arrival or after which the depot's horizon cannot be met. Rollout i
visits node i first (POMO's N starts; VRP routes start at the depot); REINFORCE uses the mean over
starts as the baseline. Inference: greedy multi-start with ×8 symmetric augmentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mixlab.rl.mixroute.instances import PROBLEMS, RoutingInstances
from mixlab.rl.mixroute.norms import make_norm
from mixlab.shared.checks import check_count

__all__ = ["POMOModel", "RoutingBatch", "augment_8", "rollout"]

NODE_FEATURES = {"tsp": 2, "cvrp": 3, "vrptw": 6}
CONTEXT_EXTRA = {"cvrp": 1, "vrptw": 2}
"""scalars beside the last node's embedding in the query: the load (and the time)"""


@dataclass
class RoutingBatch:
    """Tensors of :class:`~.instances.RoutingInstances`: ``locs`` [B, N, 2]; for VRPs ``depot``
    [B, 2] and ``demand`` [B, N] as a share of the capacity; for VRPTW ``windows`` [B, 1 + N, 2]
    and ``service`` [B, 1 + N], the depot first."""

    locs: torch.Tensor
    depot: torch.Tensor | None = None
    demand: torch.Tensor | None = None
    windows: torch.Tensor | None = None
    service: torch.Tensor | None = None

    @property
    def problem(self) -> str:
        if self.depot is None:
            return "tsp"
        return "cvrp" if self.windows is None else "vrptw"

    @classmethod
    def from_instances(
        cls, instances: RoutingInstances, device: str | torch.device = "cpu"
    ) -> RoutingBatch:
        def as_tensor(x):
            return None if x is None else torch.as_tensor(x, dtype=torch.float32, device=device)

        demand = None
        if instances.demand is not None:
            demand = as_tensor(instances.demand / instances.capacity[:, None])
        return cls(as_tensor(instances.locs), as_tensor(instances.depot), demand,
                   as_tensor(instances.windows), as_tensor(instances.service))  # fmt: skip


def augment_8(batch: RoutingBatch) -> RoutingBatch:
    """POMO's ×8 symmetric augmentation: (x, y), (y, x) and their reflections 1 − x, 1 − y; the
    result stacks the 8 copies along the batch (copy-major). Distances, hence times, are kept."""

    def views(points: torch.Tensor | None) -> torch.Tensor | None:
        if points is None:
            return None
        x, y = points[..., :1], points[..., 1:]
        pairs = [(x, y), (y, x), (1 - x, y), (y, 1 - x),
                 (x, 1 - y), (1 - y, x), (1 - x, 1 - y), (1 - y, 1 - x)]  # fmt: skip
        return torch.cat([torch.cat(p, -1) for p in pairs], 0)

    def repeat(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else x.repeat(8, *([1] * (x.dim() - 1)))

    return RoutingBatch(views(batch.locs), views(batch.depot), repeat(batch.demand),
                        repeat(batch.windows), repeat(batch.service))  # fmt: skip


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, norm: str) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm1, self.norm2 = make_norm(norm, dim), make_norm(norm, dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.norm1(h + self.attention(h, h, h, need_weights=False)[0])
        return self.norm2(h + self.feed_forward(h))


class POMOModel(nn.Module):
    """POMO's model for ``problem``; ``norm`` picks every Add & Norm's normalisation
    (:data:`~.norms.NORMS`). POMO's size is the default; any N runs through the same weights."""

    def __init__(
        self, problem: str = "cvrp", dim: int = 128, layers: int = 6, heads: int = 8,
        hidden: int = 512, norm: str = "instance", clip: float = 10.0,
    ) -> None:  # fmt: skip
        super().__init__()
        if problem not in PROBLEMS:
            raise ValueError(f"problem must be one of {list(PROBLEMS)}, got {problem!r}")
        for name, value in (("dim", dim), ("layers", layers), ("heads", heads), ("hidden", hidden)):
            check_count(value, name)
        if dim % heads:
            raise ValueError(f"dim must be a multiple of heads={heads}, got {dim}")
        self.problem, self.dim, self.heads, self.clip, self.norm = problem, dim, heads, clip, norm
        self.embed_node = nn.Linear(NODE_FEATURES[problem], dim)
        self.embed_depot = (
            nn.Linear(2 if problem == "cvrp" else 4, dim) if problem != "tsp" else None
        )
        self.encoder = nn.ModuleList(EncoderLayer(dim, heads, hidden, norm) for _ in range(layers))
        context = 2 * dim if problem == "tsp" else dim + CONTEXT_EXTRA[problem]
        self.query = nn.Linear(context, dim, bias=False)
        self.keys_values = nn.Linear(dim, 3 * dim, bias=False)  # glimpse keys, values, pointer keys
        self.combine = nn.Linear(dim, dim)

    def encode(self, batch: RoutingBatch) -> torch.Tensor:
        """Node embeddings [B, N, d] (TSP) or [B, 1 + N, d] with the depot first."""
        if batch.problem != self.problem:
            raise ValueError(f"this model solves {self.problem}, got a {batch.problem} batch")
        if self.problem == "tsp":
            h = self.embed_node(batch.locs)
        else:
            customer = [batch.locs, batch.demand[..., None]]
            depot = [batch.depot]
            if self.problem == "vrptw":
                customer += [batch.windows[:, 1:], batch.service[:, 1:, None]]
                depot += [batch.windows[:, 0]]
            h = torch.cat([self.embed_depot(torch.cat(depot, -1))[:, None],
                           self.embed_node(torch.cat(customer, -1))], 1)  # fmt: skip
        for layer in self.encoder:
            h = layer(h)
        return h

    def logits(self, keys, values, pointer, context: torch.Tensor, mask: torch.Tensor):
        """Pointer logits [B, P, nodes] for P rollouts per instance with query ``context``."""
        b, p = context.shape[:2]
        q = self.query(context)  # [B, P, d]
        heads, width = self.heads, self.dim // self.heads
        split = lambda x: x.reshape(b, -1, heads, width).transpose(1, 2)  # noqa: E731
        glimpse = F.scaled_dot_product_attention(split(q), split(keys), split(values),
                                                 attn_mask=~mask[:, None])  # fmt: skip
        glimpse = self.combine(glimpse.transpose(1, 2).reshape(b, p, self.dim))
        scores = glimpse @ pointer.transpose(1, 2) / math.sqrt(self.dim)
        return (self.clip * torch.tanh(scores)).masked_fill(~mask, float("-inf"))


def _pick(log_p: torch.Tensor, greedy: bool, generator: torch.Generator | None) -> torch.Tensor:
    if greedy:
        return log_p.argmax(-1)
    flat = log_p.exp().reshape(-1, log_p.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(log_p.shape[:-1])


def rollout(
    model: POMOModel, batch: RoutingBatch, *, greedy: bool, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """POMO rollouts from every start: (tour lengths [B, N], summed log-probabilities [B, N],
    tours [B, N, steps] of node indices; for VRPs 0 is the depot and customers are 1..N)."""
    nodes = model.encode(batch)
    keys, values, pointer = model.keys_values(nodes).chunk(3, -1)
    if batch.problem == "tsp":
        return _tsp_rollout(model, batch, nodes, (keys, values, pointer), greedy, generator)
    return _vrp_rollout(model, batch, nodes, (keys, values, pointer), greedy, generator)


def _gather_nodes(nodes: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return nodes.gather(1, index[..., None].expand(*index.shape, nodes.shape[-1]))


def _tsp_rollout(model, batch, nodes, projections, greedy, generator):
    b, n = batch.locs.shape[:2]
    device = nodes.device
    rows = torch.arange(b, device=device)[:, None]
    first = torch.arange(n, device=device).expand(b, n)
    visited = torch.zeros(b, n, n, dtype=torch.bool, device=device).scatter(
        -1, first[..., None], True
    )
    last, length = first, torch.zeros(b, n, device=device)
    log_prob, tours = torch.zeros(b, n, device=device), [first]
    first_embedding = _gather_nodes(nodes, first)
    for _ in range(n - 1):
        context = torch.cat([first_embedding, _gather_nodes(nodes, last)], -1)
        log_p = model.logits(*projections, context, ~visited).log_softmax(-1)
        chosen = _pick(log_p, greedy, generator)
        log_prob = log_prob + log_p.gather(-1, chosen[..., None])[..., 0]
        length = length + (batch.locs[rows, chosen] - batch.locs[rows, last]).norm(dim=-1)
        visited = visited.scatter(-1, chosen[..., None], True)
        last = chosen
        tours.append(chosen)
    length = length + (batch.locs[rows, last] - batch.locs[rows, first]).norm(dim=-1)
    return length, log_prob, torch.stack(tours, -1)


def _vrp_rollout(model, batch, nodes, projections, greedy, generator):
    b, n = batch.demand.shape
    device = nodes.device
    coords = torch.cat([batch.depot[:, None], batch.locs], 1)  # [B, 1 + N, 2]
    distance = torch.cdist(coords, coords)  # [B, 1 + N, 1 + N]
    demand = torch.cat([torch.zeros(b, 1, device=device), batch.demand], 1)
    windowed = batch.windows is not None
    rows = torch.arange(b, device=device)[:, None]
    visited = torch.zeros(b, n, 1 + n, dtype=torch.bool, device=device)
    load, time = torch.ones(b, n, device=device), torch.zeros(b, n, device=device)
    last = torch.zeros(b, n, dtype=torch.long, device=device)
    length, log_prob, tours = (
        torch.zeros(b, n, device=device),
        torch.zeros(b, n, device=device),
        [last],
    )
    first = torch.arange(1, n + 1, device=device).expand(b, n)  # start i visits customer i first
    step = 0
    while not visited[..., 1:].all():
        travel = distance[rows, last]  # [B, P, 1 + N] from each rollout's node
        mask = ~visited & (demand[:, None, :] <= load[..., None] + 1e-6)
        if windowed:  # arrive within the window and still reach the depot by its horizon
            arrive = torch.maximum(time[..., None] + travel, batch.windows[:, None, :, 0])
            back = arrive + batch.service[:, None] + distance[:, None, 0]
            mask &= arrive <= batch.windows[:, None, :, 1] + 1e-6
            mask &= back <= batch.windows[:, None, :1, 1] + 1e-6
        mask[..., 0] = last != 0  # the depot, but not twice in a row
        finished = visited[..., 1:].all(-1)
        mask[finished] = False
        mask[..., 0] |= finished  # a finished rollout waits at the depot
        if step == 0:
            chosen, log_step = first, torch.zeros(b, n, device=device)
        else:
            extra = [load[..., None], time[..., None]] if windowed else [load[..., None]]
            context = torch.cat([_gather_nodes(nodes, last), *extra], -1)
            log_p = model.logits(*projections, context, mask).log_softmax(-1)
            chosen = _pick(log_p, greedy, generator)
            log_step = log_p.gather(-1, chosen[..., None])[..., 0].masked_fill(finished, 0.0)
        log_prob = log_prob + log_step
        length = length + travel.gather(-1, chosen[..., None])[..., 0]
        at_depot = chosen == 0
        load = torch.where(at_depot, torch.ones_like(load), load - demand[rows, chosen])
        if windowed:
            start = batch.windows[rows, chosen, 0]
            served = torch.maximum(time + travel.gather(-1, chosen[..., None])[..., 0], start)
            time = torch.where(
                at_depot, torch.zeros_like(time), served + batch.service[rows, chosen]
            )
        visited = visited.scatter(-1, chosen[..., None], True)
        visited[..., 0] = False
        last = chosen
        tours.append(chosen)
        step += 1
    length = length + distance[rows, last, 0]  # back to the depot
    return length, log_prob, torch.stack(tours, -1)
