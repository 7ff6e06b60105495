"""Independent DQN agents on any PettingZoo ``ParallelEnv`` with ``Discrete`` actions, and CURB-DQN
on 2-firm repeated pricing games.

CleanRL-style: one file, one training loop. Every agent of every session is one member of a
batched ensemble (weights carry a leading member axis and every layer is a ``baddbmm``), so many
seeded sessions, of one system or of both, can train in one loop; members never share data or
gradients (the loss is a sum over members and Adam is element-wise).

On a 2-player repeated game (an unwrapped :class:`~mixlab.rl.curb.RepeatedGame`, e.g. a duopoly
:class:`~mixlab.rl.curb.RepeatedMarketEnv`) each agent sees the last prices of both firms, its own
first, scaled to [0, 1]; it chooses one of the m grid prices; MLP 2→h→h→m, Adam, Huber loss,
replay buffer, target network synced every ``target_every`` updates, ε_t = max(ε_min, exp(−βt))
(Hettich 2021's setup, in PyTorch). The state space is the m² price pairs, so the game is played
from its payoff table and at every sync the target network's max_a Q over all states is tabulated
once and targets become lookups.

CURB-DQN (per member, so DQN and CURB-DQN can share one loop):
- penalty: r̃ = π − λ_t·(1 − p̄_i(a_t | p_i⁻)) with p̄_i(·|p_i⁻) = Σ_{p'} b_i(p')·softmax(Q(p_i⁻, p')/τ)
  and λ_t = λ_max·(1 − ε_t);
- belief injection: y = r̃ + γ·Σ_{p'} b_i(p')·max_a Q_target((a_t, p'), a),
with b_i the empirical marginal of the rival's prices.

Any other env is stepped, one copy per session (:func:`_train_stepping`): plain DQN on flattened
observations; CURB's penalty through :class:`~mixlab.rl.curb.CurbShaping`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from mixlab.rl.curb.env import discrete_actions, repeated_game
from mixlab.rl.curb.qlearning import append_action
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
    """Trained sessions on ``env``. ``network`` holds every agent of every session (member b·n + i
    is session b's agent i) and :meth:`act` plays them; ``reward_trace`` [B, steps // trace_every]
    is each session's mean reward per step and agent. On a 2-player repeated game also ``greedy``
    [B, 2, m²], the policies in the tabular state encoding (firm 0's previous action is the high
    digit), and ``last_state`` [B]; None elsewhere."""

    env: ParallelEnv
    configs: list[DQNConfig]
    network: EnsembleMLP
    reward_trace: np.ndarray
    greedy: np.ndarray | None
    last_state: np.ndarray | None
    encode: Callable[[int, Any], np.ndarray] = field(repr=False)
    """agent index, observation → the network's input"""
    invalid: torch.Tensor = field(repr=False)
    """[members, m]: True where an agent has fewer than m actions"""

    def act(self, observations: dict[str, Any], session: int = 0) -> dict[str, int]:
        """Greedy actions of session ``session``'s agents for their ``observations``."""
        agents = list(self.env.possible_agents)
        require(
            0 <= session < len(self.configs), "session", f"in [0, {len(self.configs)})", session
        )
        members = self.network.weights[0].shape[0]
        device = self.network.weights[0].device
        inputs = torch.zeros(members, 1, self.network.weights[0].shape[1], device=device)
        chosen = {}
        for agent, observation in observations.items():
            require(agent in agents, "observations", f"keyed by agents of {agents}", agent)
            i = agents.index(agent)
            chosen[agent] = session * len(agents) + i
            inputs[chosen[agent], 0] = torch.as_tensor(self.encode(i, observation), device=device)
        with torch.no_grad():
            q = self.network(inputs)[:, 0].masked_fill(self.invalid, -torch.inf)
        return {agent: int(q[member].argmax()) for agent, member in chosen.items()}


def train_dqn(
    env: ParallelEnv,
    configs: list[DQNConfig],
    *,
    seed: int = 0,
    trace_every: int = 1000,
    device: str | torch.device = "cpu",
) -> DQNSessions:
    """Train one DQN session per entry of ``configs`` on ``env`` (all with the same ``steps``,
    ``hidden``, ``lr``, batch, buffer and target schedule) in one batched loop (CURB's switches,
    λ, τ, β, ε_min and γ may differ). One generator seeded with ``seed`` drives the whole batch, so
    a session's draws depend on ``seed`` and on the batch (its configs and their order); the same
    call gives the same result.

    ``env`` is any PettingZoo ``ParallelEnv`` whose action spaces are ``Discrete``. A 2-player
    unwrapped :class:`~mixlab.rl.curb.RepeatedGame` (such as a duopoly
    :class:`~mixlab.rl.curb.RepeatedMarketEnv`) is played from its payoff table, with CURB-DQN's
    penalty and belief available; any other env is stepped (:func:`_train_stepping`: plain DQN,
    CURB's penalty through :class:`~mixlab.rl.curb.CurbShaping`).
    """
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
    sizes = discrete_actions(env)
    game = repeated_game(env)
    device = torch.device(device)
    if game is None or len(sizes) != 2:
        return _train_stepping(env, configs, seed=seed, trace_every=trace_every, device=device)
    m = sizes[0]
    table = np.asarray(game.payoff_table, dtype=np.float64)
    require(
        sizes[1] == m and table.shape == (m * m, 2),
        "env.payoff_table",
        f"shape [{m * m}, 2] for two agents with Discrete({m})",
        table.shape,
    )
    first = configs[0]
    sessions = len(configs)
    members = 2 * sessions
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
        return append_action(own, rival, m)

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
            counterfactual = append_action(own[:, None], torch.arange(m, device=device)[None, :], m)
            with torch.no_grad():
                q = online(all_states[0][torch.cat([state[:, None], counterfactual], dim=1)])
            greedy = q[:, 0].argmax(dim=-1)
            explore = torch.rand(members, generator=generator).to(device) < epsilon
            random_action = torch.randint(0, m, (members,), generator=generator).to(device)
            action = torch.where(explore, random_action, greedy)
            joint = action.reshape(sessions, 2)
            # [members], in firm order
            reward = profits[append_action(joint[:, 0], joint[:, 1], m)].reshape(-1)
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
            running += profits[append_action(joint[:, 0], joint[:, 1], m)].mean(dim=1)
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
                believed_states = append_action(a[..., None], torch.arange(m, device=device), m)
                believed = (
                    v_target.gather(1, believed_states.reshape(members, -1)).reshape(members, -1, m)
                    * belief[:, None, :]
                ).sum(dim=-1)
                y = r + gamma[:, None] * torch.where(belief_on[:, None], believed, plain)
                q_sa = online(all_states[0][s]).gather(2, a[..., None])[..., 0]
                loss = torch.nn.functional.huber_loss(q_sa, y, reduction="none").mean(dim=1).sum()
                _gradient_step(optimizer, loss)
                updates += 1
                if updates % first.target_every == 0:
                    target.load_state_dict(online.state_dict())
                    v_target = target_values()
            if (t + 1) % 1000 == 0 or t + 1 == first.steps:
                bar.advance(t + 1 - bar.done, **({"loss": loss.item()} if updates else {}))
    with torch.no_grad():
        agent_greedy = online(all_states.expand(members, -1, -1)).argmax(dim=-1).cpu().numpy()
    # Tabular encoding: state = firm 0's last action · m + firm 1's; firm 1's agent-centric
    # state is its own action first, so transpose its table.
    greedy = agent_greedy.reshape(sessions, 2, m, m)
    greedy[:, 1] = greedy[:, 1].transpose(0, 2, 1)
    last = prices.cpu().numpy()
    scaled_values = scaled.cpu().numpy()

    def encode(agent: int, observation: Any) -> np.ndarray:
        """The repeated game's observation (newest profile last) → (own, rival) scaled prices."""
        profile = np.asarray(observation)[-2:]
        return scaled_values[[profile[agent], profile[1 - agent]]]

    return DQNSessions(
        env=env,
        configs=list(configs),
        network=online,
        reward_trace=np.array(trace).T if trace else np.zeros((sessions, 0)),
        greedy=greedy.reshape(sessions, 2, m * m),
        last_state=append_action(last[:, 0], last[:, 1], m),
        encode=encode,
        invalid=torch.zeros(members, m, dtype=torch.bool, device=device),
    )


# --- any ParallelEnv: the same DQN, stepping one copy of the env per session ----------------------


def _gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    """One optimizer step on ``loss`` (both training paths: compiled market and stepped env)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _train_stepping(
    env: ParallelEnv,
    configs: list[DQNConfig],
    *,
    seed: int,
    trace_every: int,
    device: torch.device,
) -> DQNSessions:
    """Independent DQN agents on any ``ParallelEnv`` with ``Discrete`` actions.

    Session b plays its own copy of ``env`` (session 0 ``env`` itself), reset with seed
    ``seed·2^20 + b`` and again whenever every agent is done. An agent's input is its flattened
    observation (``gymnasium.spaces.flatten``: one-hot for discrete spaces), zero-padded to the
    largest; actions an agent does not have are masked. The target is y = r + γ·max_a Q_target(s', a)
    with no continuation after termination. Everything else is :func:`train_dqn`'s loop.
    """
    require(
        all(c.penalty == 0 and not c.belief for c in configs),
        "configs",
        "DQNConfigs without penalty or belief on an env that is not a 2-player unwrapped "
        "RepeatedGame (CURB-DQN's parts read the stage game's payoffs); wrap the env in "
        "CurbShaping(env, penalty=...) for CURB's penalty instead",
        [(c.penalty, c.belief) for c in configs],
    )
    sizes = discrete_actions(env)
    agents = list(env.possible_agents)
    index = {agent: i for i, agent in enumerate(agents)}
    n, m = len(agents), max(sizes)
    observation_spaces = [env.observation_space(agent) for agent in agents]
    in_dim = max(spaces.flatdim(space) for space in observation_spaces)

    def encode(agent: int, observation: Any) -> np.ndarray:
        flat = spaces.flatten(observation_spaces[agent], observation)
        padded = np.zeros(in_dim, np.float32)
        padded[: flat.size] = flat
        return padded

    first = configs[0]
    sessions = len(configs)
    members = n * sessions
    generator = torch.Generator(device="cpu").manual_seed(seed)
    torch.manual_seed(seed)

    def per_member(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device).repeat_interleave(n)

    gamma = per_member([c.gamma for c in configs])
    beta = per_member([c.beta for c in configs])
    eps_min = per_member([c.epsilon_min for c in configs])
    n_choices = torch.tensor(sizes * sessions, device=device)
    invalid = torch.arange(m, device=device)[None, :] >= n_choices[:, None]  # [members, m]

    online = EnsembleMLP(members, in_dim, first.hidden, m).to(device)
    target = EnsembleMLP(members, in_dim, first.hidden, m).to(device)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=first.lr, foreach=True)

    # Replay per member; agents that leave early fill theirs more slowly.
    capacity = first.buffer_size
    buf_obs = np.zeros((members, capacity, in_dim), np.float32)
    buf_next = np.zeros((members, capacity, in_dim), np.float32)
    buf_action = np.zeros((members, capacity), np.int64)
    buf_reward = np.zeros((members, capacity), np.float32)
    buf_done = np.zeros((members, capacity), np.float32)
    written = np.zeros(members, np.int64)
    rows = np.arange(members)[:, None]

    envs = [env] + [copy.deepcopy(env) for _ in range(sessions - 1)]
    inputs = np.zeros((members, in_dim), np.float32)
    for b, session_env in enumerate(envs):
        observations, _ = session_env.reset(seed=seed * 2**20 + b)
        for agent, observation in observations.items():
            inputs[b * n + index[agent]] = encode(index[agent], observation)
    trace = []
    running = np.zeros(sessions)
    updates = 0
    with progress(first.steps, "dqn steps") as bar:
        for t in range(first.steps):
            epsilon = torch.maximum(eps_min, torch.exp(-beta * t))
            with torch.no_grad():
                q = online(torch.from_numpy(inputs).to(device)[:, None])[:, 0]
            greedy = q.masked_fill(invalid, -torch.inf).argmax(dim=-1)
            explore = torch.rand(members, generator=generator).to(device) < epsilon
            uniform = torch.rand(members, generator=generator).to(device)
            random_action = (uniform * n_choices).long().clamp(max=n_choices - 1)
            action = torch.where(explore, random_action, greedy).cpu().numpy()
            following = inputs.copy()
            for b, session_env in enumerate(envs):
                live = {agent: b * n + index[agent] for agent in session_env.agents}
                step = session_env.step({agent: int(action[k]) for agent, k in live.items()})
                observations, rewards, terminations, _, _ = step
                for agent, k in live.items():
                    slot = written[k] % capacity
                    buf_obs[k, slot] = inputs[k]
                    buf_action[k, slot] = action[k]
                    buf_reward[k, slot] = rewards[agent]
                    if agent in observations:
                        following[k] = encode(index[agent], observations[agent])
                    buf_next[k, slot] = following[k]
                    buf_done[k, slot] = float(terminations[agent])
                    written[k] += 1
                running[b] += np.mean([rewards[agent] for agent in live])
                if not session_env.agents:
                    observations, _ = session_env.reset()
                    for agent, observation in observations.items():
                        following[b * n + index[agent]] = encode(index[agent], observation)
            inputs = following
            if (t + 1) % trace_every == 0:
                trace.append(running / trace_every)
                running = np.zeros(sessions)

            if t + 1 >= max(first.learning_starts, first.batch_size):
                filled = np.minimum(written, capacity)
                draws = torch.rand(members, first.batch_size, generator=generator).numpy()
                sample = (draws * np.maximum(filled, 1)[:, None]).astype(np.int64)

                s, a, r, s_next, done = (
                    torch.from_numpy(buffer[rows, sample]).to(device)
                    for buffer in (buf_obs, buf_action, buf_reward, buf_next, buf_done)
                )
                with torch.no_grad():
                    next_q = target(s_next).masked_fill(invalid[:, None], -torch.inf)
                    y = r + gamma[:, None] * (1 - done) * next_q.max(dim=-1).values
                q_sa = online(s).gather(2, a[..., None])[..., 0]
                per_member_loss = torch.nn.functional.huber_loss(q_sa, y, reduction="none")
                has_data = torch.from_numpy(filled > 0).to(device)
                loss = (per_member_loss.mean(dim=1) * has_data).sum()
                _gradient_step(optimizer, loss)
                updates += 1
                if updates % first.target_every == 0:
                    target.load_state_dict(online.state_dict())
            if (t + 1) % 1000 == 0 or t + 1 == first.steps:
                bar.advance(t + 1 - bar.done, **({"loss": loss.item()} if updates else {}))
    return DQNSessions(
        env=env,
        configs=list(configs),
        network=online,
        reward_trace=np.array(trace).T if trace else np.zeros((sessions, 0)),
        greedy=None,
        last_state=None,
        encode=encode,
        invalid=invalid,
    )
