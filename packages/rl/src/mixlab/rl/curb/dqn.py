"""Independent DQN pricing agents on a discretised 2-firm market, and CURB-DQN.

CleanRL-style: one file, one training loop. Every agent of every session is one member of a
batched ensemble (weights carry a leading member axis and every layer is a ``baddbmm``), so many
seeded sessions and both systems train in one loop; members never share data or gradients
(the loss is a sum over members and Adam is element-wise).

Each agent sees the last prices of both firms, its own first, scaled to [0, 1]; it chooses one
of the m grid prices; MLP 2→h→h→m, Adam, Huber loss, replay buffer, target network synced every
``target_every`` updates, ε_t = max(ε_min, exp(−βt)) (Hettich 2021's setup, in PyTorch). The
state space is the m² price pairs, so at every sync the target network's max_a Q over all states
is tabulated once and targets become lookups.

CURB-DQN (per member, so DQN and CURB-DQN share one loop):
- penalty: r̃ = π − λ_t·(1 − p̄_i(a_t | p_i⁻)) with p̄_i(·|p_i⁻) = Σ_{p'} b_i(p')·softmax(Q(p_i⁻, p')/τ)
  and λ_t = λ_max·(1 − ε_t);
- belief injection: y = r̃ + γ·Σ_{p'} b_i(p')·max_a Q_target((a_t, p'), a),
with b_i the empirical marginal of the rival's prices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from mixlab.rl.curb.markets import Market, action_grid, profit_table
from mixlab.shared import is_count, progress, require


@dataclass(frozen=True)
class DQNConfig:
    """One DQN learner; ``penalty`` and ``belief`` switch on CURB's two parts."""

    steps: int = 300_000
    hidden: int = 64
    lr: float = 1e-3
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1_000
    target_every: int = 500
    gamma: float = 0.95
    beta: float = 2e-5
    """exploration decay: ε_t = max(epsilon_min, exp(−βt))"""
    epsilon_min: float = 0.01
    penalty: float = 0.0
    """CURB's λ_max (0: off)"""
    belief: bool = False
    """CURB's belief injection in the target"""
    temperature: float = 0.05
    """τ of the softmax policy behind the penalty's rival-averaged policy"""

    def __post_init__(self) -> None:
        for name in ("steps", "hidden", "batch_size", "buffer_size", "target_every"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(
            is_count(self.learning_starts, 0),
            "learning_starts",
            "an integer >= 0",
            self.learning_starts,
        )
        require(self.lr > 0, "lr", "> 0", self.lr)
        require(0 <= self.gamma < 1, "gamma", "in [0, 1)", self.gamma)
        require(self.beta >= 0, "beta", ">= 0", self.beta)
        require(0 <= self.epsilon_min <= 1, "epsilon_min", "in [0, 1]", self.epsilon_min)
        require(self.penalty >= 0, "penalty", ">= 0", self.penalty)
        require(self.temperature > 0, "temperature", "> 0", self.temperature)


class EnsembleMLP(torch.nn.Module):
    """``members`` independent MLPs in_dim→hidden→hidden→out_dim evaluated with batched matmuls."""

    def __init__(self, members: int, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for fan_in, fan_out in ((in_dim, hidden), (hidden, hidden), (hidden, out_dim)):
            bound = 1 / math.sqrt(fan_in)  # torch.nn.Linear's default initialisation
            self.weights.append(
                torch.nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound))
            )
            self.biases.append(
                torch.nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound))
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [members, batch, in_dim] → [members, batch, out_dim]."""
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(bias, x, weight)
            if layer < len(self.weights) - 1:
                x = torch.relu(x)
        return x


@dataclass
class DQNSessions:
    """Trained sessions: ``greedy`` [B, 2, m²] policies in the tabular state encoding (firm 0's
    previous action is the high digit), ``last_state`` [B], and per-step mean profit traces."""

    market: Market
    configs: list[DQNConfig]
    grid: np.ndarray
    table: np.ndarray
    greedy: np.ndarray
    last_state: np.ndarray
    profit_trace: np.ndarray


def train_dqn(
    market: Market,
    configs: list[DQNConfig],
    *,
    seed: int = 0,
    n_actions: int = 15,
    xi: float = 0.1,
    trace_every: int = 1000,
    device: str | torch.device = "cpu",
) -> DQNSessions:
    """Train one 2-agent DQN session per entry of ``configs`` (all with the same ``steps``,
    ``hidden``, ``lr``, batch, buffer and target schedule) in one batched loop (CURB's switches, λ, τ, β, ε_min and γ may differ). One generator seeded with ``seed`` drives the whole batch, so a session's draws depend on
    ``seed`` and on the batch (its configs and their order); the same call gives the same result."""
    require(market.n_firms == 2, "market.n_firms", "2 (DQN agents play duopolies)", market.n_firms)
    require(len(configs) >= 1, "configs", "one or more DQNConfig", configs)
    shared = {
        (c.steps, c.hidden, c.lr, c.batch_size, c.buffer_size, c.target_every, c.learning_starts)
        for c in configs
    }
    require(
        len(shared) == 1,
        "configs",
        "the same steps, hidden, lr, batch_size, buffer_size, target_every and learning_starts",
        shared,
    )
    first = configs[0]
    grid = action_grid(market, n_actions, xi)
    table = profit_table(market, grid)
    m = grid.size
    sessions = len(configs)
    members = 2 * sessions
    device = torch.device(device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    torch.manual_seed(seed)

    def per_member(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device).repeat_interleave(2)

    lam_max = per_member([c.penalty for c in configs])
    belief_on = per_member([float(c.belief) for c in configs]).bool()
    gamma = per_member([c.gamma for c in configs])
    beta = per_member([c.beta for c in configs])
    eps_min = per_member([c.epsilon_min for c in configs])
    tau = per_member([c.temperature for c in configs])

    online = EnsembleMLP(members, 2, first.hidden, m).to(device)
    target = EnsembleMLP(members, 2, first.hidden, m).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=first.lr, foreach=True)

    profits = torch.tensor(table, dtype=torch.float32, device=device)  # [m², 2]
    scaled = torch.linspace(0, 1, m, device=device)
    # agent-centric state index own·m + rival → network input (own price, rival price)
    all_states = torch.stack(torch.meshgrid(scaled, scaled, indexing="ij"), dim=-1).reshape(
        1, m * m, 2
    )
    rows = torch.arange(members, device=device)

    capacity = first.buffer_size
    buf_state = torch.zeros(members, capacity, dtype=torch.long, device=device)
    buf_action = torch.zeros(members, capacity, dtype=torch.long, device=device)
    buf_reward = torch.zeros(members, capacity, device=device)
    buf_next = torch.zeros(members, capacity, dtype=torch.long, device=device)
    rival_counts = torch.ones(members, m, device=device)

    prices = torch.randint(0, m, (sessions, 2), generator=generator).to(device)  # last actions
    trace = []
    running = torch.zeros(sessions, device=device)

    def agent_state(last: torch.Tensor) -> torch.Tensor:
        """[sessions, 2] last actions → [members] agent-centric state own·m + rival."""
        own = last.reshape(-1)
        rival = last.flip(1).reshape(-1)
        return own * m + rival

    def target_values() -> torch.Tensor:
        with torch.no_grad():
            return target(all_states.expand(members, -1, -1)).max(dim=-1).values  # [members, m²]

    v_target = target_values()
    updates = 0
    with progress(first.steps, "dqn steps") as bar:
        for t in range(first.steps):
            epsilon = torch.maximum(eps_min, torch.exp(-beta * t))
            state = agent_state(prices)
            own = state // m
            # The current state and its m counterfactual rival prices (for the penalty), in one pass.
            counterfactual = own[:, None] * m + torch.arange(m, device=device)[None, :]
            with torch.no_grad():
                q = online(all_states[0][torch.cat([state[:, None], counterfactual], dim=1)])
            greedy = q[:, 0].argmax(dim=-1)
            explore = torch.rand(members, generator=generator).to(device) < epsilon
            random_action = torch.randint(0, m, (members,), generator=generator).to(device)
            action = torch.where(explore, random_action, greedy)
            joint = action.reshape(sessions, 2)
            reward = profits[joint[:, 0] * m + joint[:, 1]].reshape(-1)  # [members] (firm order)
            belief = rival_counts / rival_counts.sum(dim=1, keepdim=True)
            if bool(torch.any(lam_max > 0)):
                policy = torch.softmax(q[:, 1:] / tau[:, None, None], dim=-1)  # [members, m', m]
                marginal = torch.einsum("er,era->ea", belief, policy)
                shortfall = 1 - marginal[rows, action]
                reward = reward - lam_max * (1 - epsilon) * shortfall
            slot = t % capacity
            buf_state[:, slot] = state
            buf_action[:, slot] = action
            buf_reward[:, slot] = reward
            prices = joint
            buf_next[:, slot] = agent_state(prices)
            rival_counts[rows, joint.flip(1).reshape(-1)] += 1
            running += profits[joint[:, 0] * m + joint[:, 1]].mean(dim=1)
            if (t + 1) % trace_every == 0:
                trace.append((running / trace_every).cpu().numpy())
                running.zero_()

            if t + 1 >= max(first.learning_starts, first.batch_size):
                filled = min(t + 1, capacity)
                index = torch.randint(
                    0, filled, (members, first.batch_size), generator=generator
                ).to(device)
                s = buf_state.gather(1, index)
                a = buf_action.gather(1, index)
                r = buf_reward.gather(1, index)
                s_next = buf_next.gather(1, index)
                plain = v_target.gather(1, s_next)
                believed_states = (a * m)[..., None] + torch.arange(m, device=device)  # [E, B, m']
                believed = (
                    v_target.gather(1, believed_states.reshape(members, -1)).reshape(members, -1, m)
                    * belief[:, None, :]
                ).sum(dim=-1)
                y = r + gamma[:, None] * torch.where(belief_on[:, None], believed, plain)
                q_sa = online(all_states[0][s]).gather(2, a[..., None])[..., 0]
                loss = torch.nn.functional.huber_loss(q_sa, y, reduction="none").mean(dim=1).sum()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                updates += 1
                if updates % first.target_every == 0:
                    target.load_state_dict(online.state_dict())
                    v_target = target_values()
            if (t + 1) % 1000 == 0:
                bar.advance(1000)
    with torch.no_grad():
        agent_greedy = online(all_states.expand(members, -1, -1)).argmax(dim=-1).cpu().numpy()
    # Tabular encoding: state = firm 0's last action · m + firm 1's; firm 1's agent-centric
    # state is its own action first, so transpose its table.
    greedy = agent_greedy.reshape(sessions, 2, m, m)
    greedy[:, 1] = greedy[:, 1].transpose(0, 2, 1)
    last = prices.cpu().numpy()
    return DQNSessions(
        market=market,
        configs=list(configs),
        grid=grid,
        table=table,
        greedy=greedy.reshape(sessions, 2, m * m),
        last_state=last[:, 0] * m + last[:, 1],
        profit_trace=np.array(trace).T if trace else np.zeros((sessions, 0)),
    )
