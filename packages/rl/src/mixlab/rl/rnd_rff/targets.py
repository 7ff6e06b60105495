"""Frozen random targets and the predictors that distil them.

RND (Burda et al. 2018) trains a predictor to match a fixed random network f_T; its error is the
novelty bonus. Here f_T is either

- :class:`RFFTarget`, the reconstruction: f_T(x) = Pᵀφ_ℓ(x) with random Fourier features
  φ_ℓ(x) = √(2/D)·cos(Ωx/ℓ + b) (Rahimi & Recht 2007), so each output is approximately a draw from
  GP(0, k_ℓ) with an explicit bandwidth ℓ and a spectrum that picks the kernel;
- :class:`MLPTarget` / :class:`ConvTarget`, the original random networks (CleanRL's conv stack for
  pixels), whose kernel and smoothness are fixed by the architecture;
- :class:`ConvRFFTarget`, RFF on a frozen random conv embedding (pixels, the hybrid of spec §2a).

Every target is frozen at construction (``requires_grad`` off) and stores its draws as buffers,
so ``state_dict`` round-trips it exactly.
"""

from __future__ import annotations

import math
import numbers
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from mixlab.shared.config import is_count, require

SPECTRA = ("gaussian", "laplace", "multiscale")
MULTISCALE = (0.25, 0.5, 1.0, 2.0)
"""bandwidth multipliers of the multiscale spectrum; its D features are split evenly among them"""

__all__ = [
    "MULTISCALE",
    "SPECTRA",
    "ConvPredictor",
    "ConvRFFTarget",
    "ConvTarget",
    "MLPPredictor",
    "MLPTarget",
    "RFFTarget",
    "median_bandwidth",
]


def _check_count(value: object, name: str) -> None:
    require(is_count(value), name, "an integer >= 1", value)


def is_image(shape: tuple[int, ...]) -> bool:
    """(channels, height, width) with sides the conv stack takes (>= 36): pixels, not vectors."""
    return len(shape) == 3 and min(shape[1:]) >= 36


def check_bandwidth(bandwidth: object) -> None:
    """ℓ is ``"median"`` or a finite number > 0 (a clear error naming ``bandwidth`` otherwise)."""
    if bandwidth == "median":
        return
    ok = isinstance(bandwidth, numbers.Real) and not isinstance(bandwidth, bool)
    if not ok or not math.isfinite(bandwidth) or bandwidth <= 0:
        raise ValueError(f"bandwidth must be 'median' or a number > 0, got {bandwidth!r}")


def median_bandwidth(x: np.ndarray | torch.Tensor, max_points: int = 2000, seed: int = 0) -> float:
    """The median heuristic: the median pairwise Euclidean distance between rows of ``x`` (after
    flattening each row), on at most ``max_points`` rows drawn without replacement."""
    x = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).float()
    x = x.reshape(len(x), -1)
    if len(x) < 2:
        raise ValueError(f"the median heuristic needs at least 2 points, got {len(x)}")
    if len(x) > max_points:
        pick = torch.from_numpy(np.random.default_rng(seed).choice(len(x), max_points, False))
        x = x[pick]
    distances = torch.cdist(x, x)
    upper = distances[torch.triu_indices(len(x), len(x), offset=1).unbind()]
    value = float(upper.median())
    if value <= 0:
        raise ValueError("the median heuristic found a zero median distance (repeated points)")
    return value


@contextmanager
def _seeded(seed: int | None):
    """Draw a network's initial weights from ``seed`` without touching the global generator."""
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        yield


def _freeze(module: nn.Module) -> nn.Module:
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module.eval()


def orthogonal_init(module: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    """CleanRL's layer init on every linear and conv layer of ``module``: orthogonal weights
    with ``gain``, zero bias."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear | nn.Conv2d):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return module


class RFFTarget(nn.Module):
    """f_T(x) = Pᵀφ_ℓ(x), φ_ℓ(x) = √(2/D)·cos(Ωx/ℓ + b), frozen (spec §2a).

    Spectra (the rows of Ω, before the 1/ℓ scaling):

    - ``gaussian``: ω ~ N(0, I), kernel exp(−‖x − x′‖²/(2ℓ²));
    - ``laplace``: ω_i ~ Cauchy(0, 1) independently, kernel exp(−‖x − x′‖₁/ℓ) (the 1-D Laplace
      kernel's spectral density is Cauchy, and the product over dimensions gives the L1 form);
    - ``multiscale``: Gaussian features split evenly over ℓ·``MULTISCALE``, kernel the mean of the
      RBF kernels at those bandwidths.

    P ∈ R^{D×k} has N(0, 1) entries, so every output coordinate has prior variance
    φ(x)ᵀφ(x) ≈ k_ℓ(x, x) = 1 and pairs of outputs are independent GP(0, k_ℓ) draws (``k=None``
    returns φ itself). ``bandwidth="median"`` leaves ℓ unset until :meth:`fit_bandwidth` sees data.
    """

    def __init__(
        self,
        in_dim: int,
        D: int = 1024,
        k: int | None = 64,
        bandwidth: float | str = "median",
        spectrum: str = "gaussian",
        seed: int | None = None,
    ) -> None:
        super().__init__()
        _check_count(in_dim, "in_dim")
        _check_count(D, "D")
        if k is not None:
            _check_count(k, "k")
        check_bandwidth(bandwidth)
        if spectrum not in SPECTRA:
            raise ValueError(f"spectrum must be one of {list(SPECTRA)}, got {spectrum!r}")
        if spectrum == "multiscale" and len(MULTISCALE) > D:
            raise ValueError(f"D must be >= {len(MULTISCALE)} for the multiscale spectrum, got {D}")
        generator = torch.Generator().manual_seed(
            int(torch.randint(2**62, ()).item()) if seed is None else seed
        )
        if spectrum == "laplace":
            uniform = torch.rand(in_dim, D, generator=generator, dtype=torch.float64)
            omega = torch.tan(math.pi * (uniform - 0.5))  # standard Cauchy by inversion
        else:
            omega = torch.randn(in_dim, D, generator=generator, dtype=torch.float64)
        multiplier = torch.ones(D, dtype=torch.float64)
        if spectrum == "multiscale":
            groups = torch.arange(D) * len(MULTISCALE) // D
            multiplier = torch.tensor(MULTISCALE, dtype=torch.float64)[groups]
        self.in_dim, self.D, self.spectrum = in_dim, D, spectrum
        self.register_buffer("omega", omega.float())
        self.register_buffer("phase", (2 * math.pi * torch.rand(D, generator=generator)).float())
        self.register_buffer("multiplier", multiplier.float())
        self.register_buffer("bandwidth", torch.tensor(float("nan")))
        projection = torch.randn(D, k, generator=generator) if k is not None else None
        self.register_buffer("projection", projection)
        self.out_dim = D if k is None else k
        if bandwidth != "median":
            self.bandwidth.fill_(float(bandwidth))
        _freeze(self)

    @property
    def needs_bandwidth(self) -> bool:
        return bool(torch.isnan(self.bandwidth))

    def fit_bandwidth(self, x: np.ndarray | torch.Tensor) -> float:
        """Set ℓ to the median pairwise distance of ``x`` (rows of ``in_dim`` standardised inputs)."""
        value = median_bandwidth(x)
        self.bandwidth.fill_(value)
        return value

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """φ_ℓ(x), shape [B, D]."""
        if x.ndim != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"x must have shape [batch, {self.in_dim}], got {list(x.shape)}")
        if self.needs_bandwidth:
            raise RuntimeError("bandwidth is 'median' and unset: call fit_bandwidth(x) first")
        scale = 1.0 / (self.bandwidth * self.multiplier)
        return math.sqrt(2.0 / self.D) * torch.cos((x @ self.omega) * scale + self.phase)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        phi = self.features(x)
        return phi if self.projection is None else phi @ self.projection

    def kernel(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The exact kernel k_ℓ(x, y) that φ_ℓ(x)ᵀφ_ℓ(y) approximates, shape [len(x), len(y)]."""
        if self.needs_bandwidth:
            raise RuntimeError("bandwidth is 'median' and unset: call fit_bandwidth(x) first")
        ell = float(self.bandwidth)
        if self.spectrum == "laplace":
            return torch.exp(-torch.cdist(x, y, p=1) / ell)
        squared = torch.cdist(x, y).square()
        if self.spectrum == "gaussian":
            return torch.exp(-squared / (2 * ell**2))
        shares = torch.bincount(torch.arange(self.D) * len(MULTISCALE) // self.D).double() / self.D
        return sum(
            share * torch.exp(-squared / (2 * (ell * m) ** 2))
            for share, m in zip(shares.tolist(), MULTISCALE, strict=True)
        )

    def extra_repr(self) -> str:
        ell = "unset (median)" if self.needs_bandwidth else f"{float(self.bandwidth):.4g}"
        return f"in_dim={self.in_dim}, D={self.D}, k={self.out_dim}, spectrum={self.spectrum}, bandwidth={ell}"


def _mlp(
    in_dim: int, widths: tuple[int, ...], out_dim: int, activation=nn.LeakyReLU
) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(in_dim, width), activation()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class MLPTarget(nn.Module):
    """The original RND target for vector inputs: a random LeakyReLU MLP, orthogonal init √2."""

    def __init__(
        self, in_dim: int, k: int = 64, hidden: int = 256, seed: int | None = None
    ) -> None:
        super().__init__()
        _check_count(in_dim, "in_dim")
        _check_count(k, "k")
        self.in_dim, self.out_dim = in_dim, k
        with _seeded(seed):
            self.net = orthogonal_init(_mlp(in_dim, (hidden, hidden), k))
        _freeze(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"x must have shape [batch, {self.in_dim}], got {list(x.shape)}")
        return self.net(x)


class MLPPredictor(nn.Module):
    """The trained predictor for vector inputs: one layer deeper than the target (as RND's)."""

    def __init__(self, in_dim: int, k: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.net = orthogonal_init(_mlp(in_dim, (hidden, hidden, hidden), k))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def conv_stack(channels: int, activation: type[nn.Module] = nn.LeakyReLU) -> nn.Sequential:
    """The Nature-DQN convolutions, flattened: LeakyReLU in CleanRL's RND networks, ReLU in its
    PPO agent."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 8, stride=4), activation(),
        nn.Conv2d(32, 64, 4, stride=2), activation(),
        nn.Conv2d(64, 64, 3, stride=1), activation(),
        nn.Flatten(),
    )  # fmt: skip


def conv_width(stack: nn.Module, shape: tuple[int, int, int]) -> int:
    """The flattened output width of ``stack`` on one input of ``shape``."""
    with torch.no_grad():
        return int(stack(torch.zeros(1, *shape)).shape[1])


def _check_image_shape(shape: tuple[int, ...]) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in shape)
    if not is_image(shape):
        raise ValueError(
            f"obs_shape must be (channels, height, width) with sides >= 36, got {shape}"
        )
    return shape  # type: ignore[return-value]


class ConvTarget(nn.Module):
    """CleanRL's RND pixel target: the conv stack then Linear(·→k), orthogonal init √2, frozen."""

    def __init__(
        self, obs_shape: tuple[int, int, int], k: int = 512, seed: int | None = None
    ) -> None:
        super().__init__()
        self.obs_shape = _check_image_shape(obs_shape)
        with _seeded(seed):
            stack = conv_stack(self.obs_shape[0])
            width = conv_width(stack, self.obs_shape)
            self.net = orthogonal_init(nn.Sequential(stack, nn.Linear(width, k)))
        self.in_dim, self.out_dim = math.prod(self.obs_shape), k
        _freeze(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(len(x), *self.obs_shape))


class ConvPredictor(nn.Module):
    """CleanRL's RND pixel predictor: the conv stack, then 512 → 512 → k with ReLU."""

    def __init__(self, obs_shape: tuple[int, int, int], k: int = 512) -> None:
        super().__init__()
        self.obs_shape = _check_image_shape(obs_shape)
        stack = conv_stack(self.obs_shape[0])
        width = conv_width(stack, self.obs_shape)
        head = nn.Sequential(
            nn.Linear(width, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, k)
        )
        self.net = orthogonal_init(nn.Sequential(stack, head))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(len(x), *self.obs_shape))


class ConvRFFTarget(nn.Module):
    """RFF on a frozen random conv embedding (pixels): f_T(x) = Pᵀφ_ℓ(conv(x)). The embedding
    replaces pixel-Euclidean distance, a poor novelty metric on frames (spec §2a); ℓ is the
    median distance between embeddings when ``bandwidth="median"``."""

    def __init__(
        self,
        obs_shape: tuple[int, int, int],
        D: int = 1024,
        k: int = 512,
        bandwidth: float | str = "median",
        spectrum: str = "gaussian",
        seed: int | None = None,
    ) -> None:
        super().__init__()
        self.obs_shape = _check_image_shape(obs_shape)
        with _seeded(seed):
            self.embed = orthogonal_init(conv_stack(self.obs_shape[0]))
        width = conv_width(self.embed, self.obs_shape)
        self.rff = RFFTarget(width, D, k, bandwidth, spectrum, seed=seed)
        self.in_dim, self.out_dim = math.prod(self.obs_shape), self.rff.out_dim
        _freeze(self)

    @property
    def needs_bandwidth(self) -> bool:
        return self.rff.needs_bandwidth

    def fit_bandwidth(self, x: np.ndarray | torch.Tensor) -> float:
        device = self.rff.omega.device  # the embedding's, wherever the bonus moved it
        with torch.no_grad():
            x = torch.as_tensor(x, dtype=torch.float32, device=device).reshape(
                len(x), *self.obs_shape
            )
            return self.rff.fit_bandwidth(self.embed(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rff(self.embed(x.reshape(len(x), *self.obs_shape)))
