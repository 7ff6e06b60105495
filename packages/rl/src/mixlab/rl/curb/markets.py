"""Oligopoly stage games and their benchmarks: Calvano et al.'s logit Bertrand and linear Cournot.

A market maps an action profile (prices or quantities, last axis = firms) to per-firm profits.
:func:`equilibria` finds the one-shot Nash equilibrium (a root of the first-order conditions) and
the joint-monopoly profile (maximum of summed profit) numerically, so every parameter can change;
:func:`action_grid` is Calvano's discretisation and :func:`profit_table` tabulates the stage game
on it, which is all the learners see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from mixlab.shared import is_count, require


def _per_firm(value: float | tuple[float, ...], n_firms: int, name: str) -> np.ndarray:
    values = np.asarray(value, dtype=np.float64)
    if values.ndim == 0:
        return np.full(n_firms, float(values))
    require(
        values.shape == (n_firms,), name, f"a number or {n_firms} numbers (one per firm)", value
    )
    return values


class _Oligopoly:
    """What every stage game shares: ``n_firms`` firms with marginal ``costs``."""

    n_firms: int
    costs: float | tuple[float, ...]

    def _check_firms(self) -> None:
        require(is_count(self.n_firms, 2), "n_firms", "an integer >= 2", self.n_firms)
        require(bool(np.all(self.cost_vector >= 0)), "costs", "non-negative", self.costs)

    @property
    def cost_vector(self) -> np.ndarray:
        return _per_firm(self.costs, self.n_firms, "costs")


@dataclass(frozen=True)
class LogitBertrand(_Oligopoly):
    """Repeated-game stage: price competition with logit demand (Calvano et al. 2020, §I.B).

    q_i = exp((a_i − p_i)/μ) / (Σ_j exp((a_j − p_j)/μ) + exp(a_0/μ)),  π_i = (p_i − c_i)·q_i.
    The defaults are Calvano's baseline: p_N = 1.47293, π_N = 0.22293, p_M = 1.92498, π_M = 0.33749.
    """

    n_firms: int = 2
    costs: float | tuple[float, ...] = 1.0
    """marginal costs c_i (>= 0)"""
    qualities: float | tuple[float, ...] = 2.0
    """product qualities a_i"""
    outside_quality: float = 0.0
    """quality a_0 of the outside good"""
    mu: float = 0.25
    """horizontal differentiation μ (> 0; μ → 0 is perfect substitutes)"""

    name: str = field(default="bertrand", init=False)
    action_name: str = field(default="price", init=False)
    action_plural: str = field(default="prices", init=False)
    competitive_direction: int = field(default=-1, init=False)
    """the sign of a move towards competition: Bertrand punishes by cutting prices"""

    def __post_init__(self) -> None:
        self._check_firms()
        _per_firm(self.qualities, self.n_firms, "qualities")
        require(self.mu > 0, "mu", "> 0", self.mu)

    def demand(self, prices: np.ndarray) -> np.ndarray:
        prices = np.asarray(prices, dtype=np.float64)
        a = _per_firm(self.qualities, self.n_firms, "qualities")
        # Shift the exponents by their maximum (the outside good included) so that exp never overflows.
        utilities = (a - prices) / self.mu
        outside = np.full((*prices.shape[:-1], 1), self.outside_quality / self.mu)
        top = np.maximum(utilities.max(axis=-1, keepdims=True), outside)
        weights = np.exp(utilities - top)
        return weights / (weights.sum(axis=-1, keepdims=True) + np.exp(outside - top))

    def profits(self, prices: np.ndarray) -> np.ndarray:
        prices = np.asarray(prices, dtype=np.float64)
        return (prices - self.cost_vector) * self.demand(prices)

    def start(self) -> np.ndarray:
        return self.cost_vector + self.mu


@dataclass(frozen=True)
class LinearCournot(_Oligopoly):
    """Repeated-game stage: quantity competition with linear inverse demand P = A − B·Σ_j q_j.

    π_i = (P − c_i)·q_i. With A = B = 1, c = 0 and two firms: q_N = 1/3, π_N = 1/9, and the
    symmetric joint monopoly q_M = 1/4, π_M = 1/8. Collusion here means *lower* quantities.
    """

    n_firms: int = 2
    costs: float | tuple[float, ...] = 0.0
    """marginal costs c_i (>= 0, below the demand intercept)"""
    intercept: float = 1.0
    """demand intercept A (> 0)"""
    slope: float = 1.0
    """demand slope B (> 0)"""

    name: str = field(default="cournot", init=False)
    action_name: str = field(default="quantity", init=False)
    action_plural: str = field(default="quantities", init=False)
    competitive_direction: int = field(default=1, init=False)
    """the sign of a move towards competition: Cournot punishes by raising quantities"""

    def __post_init__(self) -> None:
        self._check_firms()
        require(self.intercept > 0, "intercept", "> 0", self.intercept)
        require(self.slope > 0, "slope", "> 0", self.slope)
        below = bool(np.all(self.cost_vector < self.intercept))
        require(below, "costs", "below the intercept A", self.costs)

    def profits(self, quantities: np.ndarray) -> np.ndarray:
        quantities = np.asarray(quantities, dtype=np.float64)
        price = np.maximum(self.intercept - self.slope * quantities.sum(axis=-1, keepdims=True), 0)
        return (price - self.cost_vector) * quantities

    def start(self) -> np.ndarray:
        return np.full(
            self.n_firms,
            (self.intercept - self.cost_vector.mean()) / ((self.n_firms + 1) * self.slope),
        )


Market = LogitBertrand | LinearCournot
MARKETS = {"bertrand": LogitBertrand, "cournot": LinearCournot}


@dataclass(frozen=True)
class Equilibria:
    """One-shot Nash and joint-monopoly profiles of a market (per firm)."""

    nash_actions: np.ndarray
    nash_profits: np.ndarray
    monopoly_actions: np.ndarray
    monopoly_profits: np.ndarray


FOC_TOLERANCE = 1e-9
"""largest |∂π_i/∂x_i| accepted at a Nash equilibrium"""


def _marginal_profits(market: Market, actions: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """∂π_i/∂x_i for every firm i by central differences."""
    n = market.n_firms
    up = actions + step * np.eye(n)
    down = actions - step * np.eye(n)
    return (np.diag(market.profits(up)) - np.diag(market.profits(down))) / (2 * step)


def equilibria(market: Market) -> Equilibria:
    """Nash: the root of every firm's first-order condition; monopoly: argmax of summed profit."""
    start = market.start()
    root = optimize.root(lambda x: _marginal_profits(market, x), start, tol=1e-13)
    # The finite differences are noisy near 1e-11, so hybr may stop "not making good progress"
    # right at the root (scipy 1.11 does for asymmetric firms): judge by the residual instead.
    if not (root.success or np.abs(root.fun).max() < FOC_TOLERANCE):
        raise RuntimeError(f"no Nash equilibrium found for {market}: {root.message}")
    nash = root.x
    best = optimize.minimize(
        lambda x: -market.profits(x).sum(),
        nash,
        method="L-BFGS-B",
        bounds=[(0.0, None)] * market.n_firms,
        options={"ftol": 1e-15, "gtol": 1e-12},
    )
    monopoly = best.x
    return Equilibria(nash, market.profits(nash), monopoly, market.profits(monopoly))


def action_grid(market: Market, n_actions: int = 15, xi: float = 0.1) -> np.ndarray:
    """Calvano's grid: ``n_actions`` equally spaced actions from ξ below to ξ beyond the
    Nash–monopoly interval, [x_N − ξ(x_M − x_N), x_M + ξ(x_M − x_N)] (ordered, all firms)."""
    require(is_count(n_actions, 2), "n_actions", "an integer >= 2 (a grid of actions)", n_actions)
    require(xi >= 0, "xi", ">= 0", xi)
    eq = equilibria(market)
    ends = np.concatenate([eq.nash_actions, eq.monopoly_actions])
    width = np.abs(eq.monopoly_actions - eq.nash_actions).max()
    return np.linspace(ends.min() - xi * width, ends.max() + xi * width, n_actions)


def profit_table(market: Market, grid: np.ndarray) -> np.ndarray:
    """Profits of every action profile on the grid, shape [m^n, n]; profile (a_1, …, a_n) is row
    Σ_j a_j·m^(n−1−j) (firm 0 is the most significant digit)."""
    grid = np.asarray(grid, dtype=np.float64)
    require(grid.ndim == 1 and grid.size >= 2, "grid", "a 1-D array of >= 2 actions", grid.shape)
    n = market.n_firms
    mesh = np.stack(np.meshgrid(*([grid] * n), indexing="ij"), axis=-1).reshape(-1, n)
    return market.profits(mesh)


def best_response_table(table: np.ndarray, n_actions: int, n_firms: int) -> np.ndarray:
    """Static best responses on the grid, shape [n, m^n]: entry (i, profile) is i's most profitable
    action against the rivals' actions in that profile (i's own digit is ignored)."""
    m, n = n_actions, n_firms
    profits = table.reshape([m] * n + [n])
    responses = np.empty((n, m**n), dtype=np.int64)
    profiles = np.array(np.unravel_index(np.arange(m**n), [m] * n)).T
    for i in range(n):
        own = np.moveaxis(profits[..., i], i, -1)  # [rivals..., own]
        best = own.argmax(axis=-1)
        rivals = np.delete(profiles, i, axis=1)
        responses[i] = best[tuple(rivals.T)]
    return responses


def collusion_index(profits: np.ndarray, eq: Equilibria) -> np.ndarray:
    """Δ = (π̄ − π_N)/(π_M − π_N), averaged over firms; ``profits`` has firms on its last axis.
    Profits that are not finite are refused (a NaN used to come back as the index)."""
    profits = np.asarray(profits, dtype=float)
    firms = len(eq.nash_profits)
    require(profits.ndim >= 1 and profits.shape[-1] == firms, "profits",
            f"an array with the {firms} firms on its last axis", profits.shape)  # fmt: skip
    require(bool(np.isfinite(profits).all()), "profits", "finite numbers", "NaN or infinity")
    gain = (profits - eq.nash_profits) / (eq.monopoly_profits - eq.nash_profits)
    return gain.mean(axis=-1)
