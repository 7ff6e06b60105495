"""Novelty bonuses usable alone on any array, or inside a learner (:mod:`.ppo`, :mod:`.sb3`).

Every bonus that :func:`make_bonus` builds has the same methods (:data:`BONUS_METHODS`):

- ``init_normalization(obs)``: observation statistics (and a ``"median"`` bandwidth) from a
  rollout before training (CleanRL's ``num_iterations_obs_norm_init``);
- ``fit(data)``: offline use, statistics from ``data`` then ``distill(data)``: learn ``data``
  (predictor steps; the count bonus counts each row once); both return the bonus;
- ``bonus(obs)``: the raw per-observation novelty, a NumPy vector;
- ``update(obs)``: learn from visited observations (statistics, then predictor steps);
- ``normalize_rewards(raw)``: a [T, N] block of raw bonuses divided by the running standard
  deviation of the discounted intrinsic return (RND's ``RewardForwardFilter``);
- ``bandwidth`` and ``scale_bandwidth(factor)``: the RFF target's ℓ (None, and a ValueError
  naming the bonus, where there is no ℓ);
- ``state_dict()`` / ``load_state_dict(state)``: everything a resumed run needs.

:class:`NoveltyBonus` is RND with any frozen target (:mod:`.targets`); :class:`DRNDBonus` is DRND
(Yang et al. 2024); :class:`CountBonus` is the 1/√n oracle on discretised observations.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from mixlab.rl.rnd_rff.targets import (
    ConvPredictor,
    ConvRFFTarget,
    ConvTarget,
    MLPPredictor,
    MLPTarget,
    RFFTarget,
    check_bandwidth,
    is_image,
)
from mixlab.shared import progress

BONUS_KINDS = ("rnd", "rff", "rff-multiscale", "rff-laplace", "drnd", "count")
"""what :func:`make_bonus` builds; ``none`` (no bonus) is the learners' business"""
BONUS_METHODS = (
    "init_normalization", "fit", "distill", "bonus", "update", "normalize_rewards",
    "scale_bandwidth", "state_dict", "load_state_dict",
)  # fmt: skip
"""the methods every bonus of :data:`BONUS_KINDS` has (with the ``bandwidth`` property)"""

__all__ = [
    "BONUS_KINDS",
    "BONUS_METHODS",
    "CountBonus",
    "DRNDBonus",
    "IntrinsicReward",
    "NoveltyBonus",
    "RewardForwardFilter",
    "RunningMeanStd",
    "make_bonus",
    "observation_shape",
]


class RunningMeanStd:
    """Running mean and variance of arrays of ``shape`` (Chan et al.'s parallel update)."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64)
        self.update_from_moments(x.mean(0), x.var(0), len(x))

    def update_from_moments(self, mean: np.ndarray, var: np.ndarray, count: int) -> None:
        delta, total = mean - self.mean, self.count + count
        self.mean = self.mean + delta * count / total
        m2 = self.var * self.count + var * count + delta**2 * self.count * count / total
        self.var, self.count = m2 / total, total

    def state_dict(self) -> dict[str, object]:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.mean, self.var = np.asarray(state["mean"]), np.asarray(state["var"])
        self.count = float(state["count"])  # type: ignore[arg-type]


class RewardForwardFilter:
    """The discounted intrinsic return per env, r̄_t = γ·r̄_{t−1} + r_t (non-episodic)."""

    def __init__(self, gamma: float) -> None:
        self.gamma, self.returns = gamma, None

    def update(self, rewards: np.ndarray) -> np.ndarray:
        self.returns = rewards if self.returns is None else self.returns * self.gamma + rewards
        return self.returns


def _check_proportion(value: object) -> None:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value <= 1
    if not ok:
        raise ValueError(f"update_proportion must be a number in (0, 1], got {value!r}")


def observation_shape(obs_shape: Sequence[int] | object) -> tuple[int, ...]:
    """The observation shape from a tuple or a gymnasium ``Box`` space."""
    import gymnasium as gym

    if isinstance(obs_shape, gym.spaces.Dict | gym.spaces.Tuple):
        raise ValueError(
            "observation space must be a Box, got a "
            f"{type(obs_shape).__name__} space: flatten it first (e.g. minigrid's ImgObsWrapper)"
        )
    if isinstance(obs_shape, gym.spaces.Discrete):
        raise ValueError(
            "observation space must be a Box, got Discrete: one-hot encode the observations "
            "first (gymnasium's FlattenObservation wrapper)"
        )
    if isinstance(obs_shape, gym.spaces.Space):
        if obs_shape.shape is None:
            raise ValueError(f"observation space must have a shape, got {obs_shape}")
        return tuple(obs_shape.shape)
    shape = tuple(int(s) for s in obs_shape)  # type: ignore[union-attr]
    if not shape or min(shape) < 1:
        raise ValueError(f"obs_shape must be a non-empty tuple of sizes >= 1, got {shape}")
    return shape


class IntrinsicReward:
    """Shared by every bonus: the obs shape check and the intrinsic-return normalisation."""

    def __init__(self, obs_shape: Sequence[int] | object, int_gamma: float = 0.99) -> None:
        self.obs_shape = observation_shape(obs_shape)
        if not (isinstance(int_gamma, int | float) and 0 <= int_gamma < 1):
            raise ValueError(f"int_gamma must be a number in [0, 1), got {int_gamma!r}")
        self.forward_filter = RewardForwardFilter(int_gamma)
        self.return_rms = RunningMeanStd()

    def _check(self, obs: np.ndarray | torch.Tensor) -> np.ndarray:
        obs = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
        if obs.shape[1:] != self.obs_shape:
            raise ValueError(
                f"obs must have shape [batch, {', '.join(map(str, self.obs_shape))}] "
                f"(the bonus's obs_shape), got {list(obs.shape)}"
            )
        return obs.astype(np.float32, copy=False)

    def normalize_rewards(self, raw: np.ndarray) -> np.ndarray:
        """Divide a [T, N] block of raw bonuses (time, env) by the running std of the discounted
        intrinsic return, stepped through time for each env (RND's normalisation)."""
        raw = np.asarray(raw, np.float64)
        if raw.ndim != 2:
            raise ValueError(f"raw must be a [steps, envs] array, got shape {raw.shape}")
        returns = np.stack([self.forward_filter.update(row) for row in raw])
        self.return_rms.update(returns.reshape(-1))
        return (raw / math.sqrt(self.return_rms.var + 1e-8)).astype(np.float32)

    @property
    def bandwidth(self) -> float | None:
        """The RFF target's ℓ; None for other bonuses and while the median rule awaits data."""
        return None

    def init_normalization(self, obs: np.ndarray) -> None:
        """Fit observation statistics before training; the count bonus needs none."""

    def scale_bandwidth(self, factor: float) -> float:
        """Multiply the RFF target's ℓ by ``factor``; returns ℓ (only RFF targets have one)."""
        raise ValueError(
            f"scale_bandwidth needs an RFF target with its bandwidth set; {type(self).__name__} "
            "has no bandwidth"
        )

    def bonus(self, obs: np.ndarray | torch.Tensor, batch_size: int = 4096) -> np.ndarray:
        """The raw novelty of each observation, shape [batch]."""
        raise NotImplementedError

    def update(self, obs: np.ndarray | torch.Tensor, *, update_stats: bool = True) -> float:
        """Learn from visited observations; returns the last training loss (0 without one)."""
        raise NotImplementedError

    def distill(
        self, data: np.ndarray, steps: int = 2000, batch_size: int | None = None
    ) -> IntrinsicReward:
        """Learn ``data`` under the current statistics; returns the bonus."""
        raise NotImplementedError

    def fit(
        self, data: np.ndarray, steps: int = 2000, batch_size: int | None = None
    ) -> IntrinsicReward:
        """Offline use: statistics (and a median-rule ℓ) from ``data``, then :meth:`distill`."""
        data = self._check(data)
        self.init_normalization(data)
        return self.distill(data, steps, batch_size)

    def state_dict(self) -> dict[str, object]:
        return {"returns": self.forward_filter.returns, "return_rms": self.return_rms.state_dict()}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.forward_filter.returns = state["returns"]
        self.return_rms.load_state_dict(state["return_rms"])  # type: ignore[arg-type]


class NoveltyBonus(IntrinsicReward):
    """RND with any frozen target: b(x) = mean_c (f_P(x̂) − f_T(x̂))_c², x̂ = clip((x − μ)/σ, ±5).

    ``target`` is a module from :mod:`.targets` (its ``in_dim`` must equal the flattened
    observation); ``predictor`` defaults to :class:`MLPPredictor` (vectors) or
    :class:`ConvPredictor` (targets with an ``obs_shape``). Each ``update`` trains on a random
    ``update_proportion`` of the observations (CleanRL's default 0.25). The bonus is a mean over
    output coordinates, so for an RFF target its prior value far from the data is ≈ k_ℓ(x, x) = 1
    and it reads as a posterior variance.
    """

    def __init__(
        self,
        obs_shape: Sequence[int] | object,
        target: nn.Module,
        predictor: nn.Module | None = None,
        *,
        lr: float = 1e-4,
        update_proportion: float = 0.25,
        obs_clip: float = 5.0,
        int_gamma: float = 0.99,
        epochs: int = 4,
        batch_size: int = 256,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        super().__init__(obs_shape, int_gamma)
        _check_proportion(update_proportion)
        in_dim = math.prod(self.obs_shape)
        if getattr(target, "in_dim", in_dim) != in_dim:
            raise ValueError(
                f"the target takes {target.in_dim} inputs but the observations have shape "
                f"{self.obs_shape} ({in_dim} values)"
            )
        self.device = torch.device(device)
        self.target = target.to(self.device)
        if predictor is None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                if hasattr(target, "obs_shape"):
                    predictor = ConvPredictor(target.obs_shape, target.out_dim)
                else:
                    predictor = MLPPredictor(in_dim, target.out_dim)
        self.predictor = predictor.to(self.device)
        self.optimizer = torch.optim.Adam(self.predictor.parameters(), lr=lr)
        self.update_proportion, self.obs_clip = update_proportion, obs_clip
        self.epochs, self.batch_size = epochs, batch_size
        self.obs_rms = RunningMeanStd(self.obs_shape)
        self.generator = np.random.default_rng(seed)

    @property
    def bandwidth(self) -> float | None:
        rff = getattr(self.target, "rff", self.target)  # ConvRFFTarget wraps an RFFTarget
        if not isinstance(rff, RFFTarget) or rff.needs_bandwidth:
            return None
        return float(rff.bandwidth)

    def scale_bandwidth(self, factor: float) -> float:
        """Multiply the RFF target's ℓ by ``factor`` (after the median rule set it); returns ℓ."""
        if self.bandwidth is None:
            raise ValueError("scale_bandwidth needs an RFF target with its bandwidth set")
        check_bandwidth(factor)
        getattr(self.target, "rff", self.target).bandwidth.mul_(float(factor))
        return self.bandwidth  # type: ignore[return-value]

    # -- observations ------------------------------------------------------------------------
    def normalize(self, obs: np.ndarray) -> torch.Tensor:
        """clip((obs − μ)/σ, ±obs_clip), flattened to [batch, in_dim], on the bonus's device."""
        x = (obs - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        x = np.clip(x, -self.obs_clip, self.obs_clip).reshape(len(obs), -1)
        return torch.as_tensor(x, dtype=torch.float32, device=self.device)

    def init_normalization(self, obs: np.ndarray) -> None:
        """Observation statistics from ``obs``, then ℓ by the median rule if the target asks."""
        obs = self._check(obs)
        self.obs_rms.update(obs)
        if getattr(self.target, "needs_bandwidth", False):
            self.target.fit_bandwidth(self.normalize(obs).cpu())

    # -- the bonus ---------------------------------------------------------------------------
    def _error(self, x: torch.Tensor) -> torch.Tensor:
        return (self.predictor(x) - self.target(x)).square().mean(1)

    def _loss(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sample predictor loss (the error, for RND)."""
        return self._error(x)

    @torch.no_grad()
    def bonus(self, obs: np.ndarray | torch.Tensor, batch_size: int = 4096) -> np.ndarray:
        """The raw novelty of each observation, shape [batch]."""
        obs = self._check(obs)
        out = [
            self._error(self.normalize(obs[i : i + batch_size]))
            for i in range(0, len(obs), batch_size)
        ]
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, np.float32)

    def train_step(self, x: torch.Tensor) -> float:
        """One Adam step on a normalised batch, masked to ``update_proportion`` of its rows."""
        loss = self._loss(x)
        if self.update_proportion < 1:
            keep = torch.as_tensor(
                self.generator.random(len(x)) < self.update_proportion, device=self.device
            )
            loss = (loss * keep).sum() / keep.sum().clamp(min=1)
        else:
            loss = loss.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def update(self, obs: np.ndarray | torch.Tensor, *, update_stats: bool = True) -> float:
        """Update the observation statistics (CleanRL order), then ``epochs`` passes of
        minibatches of ``batch_size`` over ``obs``; returns the last minibatch loss."""
        obs = self._check(obs)
        if update_stats:
            self.obs_rms.update(obs)
        x, loss = self.normalize(obs), float("nan")
        for _ in range(self.epochs):
            order = torch.as_tensor(self.generator.permutation(len(x)), device=self.device)
            for start in range(0, len(x), self.batch_size):
                loss = self.train_step(x[order[start : start + self.batch_size]])
        return loss

    def distill(
        self, data: np.ndarray, steps: int = 2000, batch_size: int | None = None
    ) -> NoveltyBonus:
        """``steps`` predictor steps on random minibatches of ``data`` under the current
        statistics (every row counts: no update proportion)."""
        data = self._check(data)
        x, size = self.normalize(data), batch_size or self.batch_size
        proportion, self.update_proportion = self.update_proportion, 1.0
        try:
            with progress(steps, "distill predictor") as bar:
                for _ in range(steps):
                    pick = torch.as_tensor(self.generator.integers(len(x), size=min(size, len(x))))
                    bar.advance(loss=self.train_step(x[pick.to(self.device)]))
        finally:
            self.update_proportion = proportion
        return self

    def state_dict(self) -> dict[str, object]:
        return {
            **super().state_dict(),
            "target": self.target.state_dict(),
            "predictor": self.predictor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_rms": self.obs_rms.state_dict(),
            "generator": self.generator.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.target.load_state_dict(state["target"])  # type: ignore[arg-type]
        self.predictor.load_state_dict(state["predictor"])  # type: ignore[arg-type]
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        self.obs_rms.load_state_dict(state["obs_rms"])  # type: ignore[arg-type]
        self.generator.bit_generator.state = state["generator"]


class _Targets(nn.Module):
    """N frozen targets stacked: output [N, B, k]."""

    def __init__(self, targets: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(targets)
        self.in_dim, self.out_dim = targets[0].in_dim, targets[0].out_dim
        if hasattr(targets[0], "obs_shape"):
            self.obs_shape = targets[0].obs_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([member(x) for member in self.members])


class DRNDBonus(NoveltyBonus):
    """DRND (Yang et al. ICML 2024): N random targets; the predictor regresses a uniformly drawn
    one per sample, so it learns their mean μ(x) and its second moment carries a pseudo-count:

        b(x) = α·‖f_P(x) − μ(x)‖² + (1 − α)·mean_c √clip(|f_P² − μ²| / (B₂ − μ²), 1e-3, 1),

    with B₂ the targets' mean square (the authors' online code, α = 0.9, N = 5; as there, the
    first term sums over coordinates and the second averages)."""

    def __init__(
        self, obs_shape, targets: list[nn.Module], *, alpha: float = 0.9, **options
    ) -> None:
        if len(targets) < 2:
            raise ValueError(f"targets must hold at least 2 networks, got {len(targets)}")
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
        super().__init__(obs_shape, _Targets(targets), **options)
        self.alpha = alpha

    def _loss(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.target(x)  # [N, B, k]
        pick = torch.as_tensor(
            self.generator.integers(len(outputs), size=len(x)), device=self.device
        )
        chosen = outputs[pick, torch.arange(len(x), device=self.device)]
        return (self.predictor(x) - chosen).square().mean(1)

    def _error(self, x: torch.Tensor) -> torch.Tensor:
        outputs, prediction = self.target(x), self.predictor(x)
        mu, second = outputs.mean(0), outputs.square().mean(0)
        ratio = (prediction.square() - mu.square()).abs() / (second - mu.square()).clamp(min=1e-12)
        count_term = ratio.clamp(1e-3, 1).sqrt().mean(1)
        # the authors' weighting: a sum over coordinates, then a mean for the count term
        return self.alpha * (prediction - mu).square().sum(1) + (1 - self.alpha) * count_term


class CountBonus(IntrinsicReward):
    """The oracle: b(x) = 1/√n(cell(x)), cell(x) = ⌊x / cell_size⌋ per coordinate, n counting
    every observation passed to :meth:`update` (spec §2c's count comparison)."""

    def __init__(self, obs_shape, cell_size: float = 1.0, int_gamma: float = 0.99) -> None:
        super().__init__(obs_shape, int_gamma)
        if not (isinstance(cell_size, int | float) and cell_size > 0):
            raise ValueError(f"cell_size must be a number > 0, got {cell_size!r}")
        self.cell_size, self.counts = float(cell_size), {}

    def _keys(self, obs: np.ndarray) -> list[bytes]:
        cells = np.floor(obs.reshape(len(obs), -1) / self.cell_size).astype(np.int64)
        return [row.tobytes() for row in cells]

    def bonus(self, obs: np.ndarray | torch.Tensor, batch_size: int = 4096) -> np.ndarray:
        """1/√n of each observation's cell (1 for an unseen cell); ``batch_size`` is unused."""
        keys = self._keys(self._check(obs))
        return np.array([1 / math.sqrt(max(self.counts.get(k, 0), 1)) for k in keys], np.float32)

    def update(self, obs: np.ndarray | torch.Tensor, *, update_stats: bool = True) -> float:
        """Count every observation's cell; there are no statistics or loss (returns 0)."""
        for key in self._keys(self._check(obs)):
            self.counts[key] = self.counts.get(key, 0) + 1
        return 0.0

    def distill(
        self, data: np.ndarray, steps: int = 2000, batch_size: int | None = None
    ) -> CountBonus:
        """Count every row of ``data`` once (there is no predictor: ``steps`` and
        ``batch_size`` are unused)."""
        self.update(data)
        return self

    def state_dict(self) -> dict[str, object]:
        return {**super().state_dict(), "counts": {k.hex(): n for k, n in self.counts.items()}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        super().load_state_dict(state)
        self.counts = {bytes.fromhex(k): n for k, n in state["counts"].items()}  # type: ignore[union-attr]


def make_bonus(
    kind: str,
    obs_shape: Sequence[int] | object,
    *,
    bandwidth: float | str = "median",
    D: int = 1024,
    k: int = 64,
    n_targets: int = 5,
    cell_size: float = 1.0,
    pixels: bool | None = None,
    seed: int = 0,
    **options,
) -> IntrinsicReward:
    """A bonus of ``kind`` (:data:`BONUS_KINDS`) for observations of ``obs_shape`` (a tuple or a
    gymnasium space). Images (3-D shapes, sides >= 36) get the conv target / predictor, with RFF
    on the frozen conv embedding; everything else is flattened into the MLP ones. ``options`` go
    to :class:`NoveltyBonus` (``lr``, ``update_proportion``, ``device``, ...); the count bonus,
    which has no network, takes only ``cell_size`` and ``int_gamma``."""
    if kind not in BONUS_KINDS:
        raise ValueError(f"bonus must be one of {list(BONUS_KINDS)}, got {kind!r}")
    shape = observation_shape(obs_shape)
    if kind == "count":
        return CountBonus(shape, cell_size, options.get("int_gamma", 0.99))
    check_bandwidth(bandwidth)
    if pixels is None:
        pixels = is_image(shape)
    in_dim = math.prod(shape)

    def target(index: int) -> nn.Module:
        draw = seed * 1000 + index + 1  # targets never share the predictor's draw
        if kind.startswith("rff"):
            spectrum = {
                "rff": "gaussian",
                "rff-multiscale": "multiscale",
                "rff-laplace": "laplace",
            }[kind]
            if pixels:
                return ConvRFFTarget(shape, D, k, bandwidth, spectrum, seed=draw)  # type: ignore[arg-type]
            return RFFTarget(in_dim, D, k, bandwidth, spectrum, seed=draw)
        return ConvTarget(shape, k, seed=draw) if pixels else MLPTarget(in_dim, k, seed=draw)  # type: ignore[arg-type]

    if kind == "drnd":
        return DRNDBonus(shape, [target(i) for i in range(n_targets)], seed=seed, **options)
    return NoveltyBonus(shape, target(0), seed=seed, **options)
