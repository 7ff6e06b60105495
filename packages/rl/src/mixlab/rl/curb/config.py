"""The CURB experiment's Config and its registry entry, importable without NumPy, numba or torch.

``mixlab list`` and ``mixlab run curb --help`` read :data:`METHOD` from here; the experiment
(:mod:`mixlab.rl.curb.experiment`: numba, torch) loads only when the method runs. The CLI checks
its options against the names and limits defined here before it simulates anything.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

from mixlab.shared.claims import ClaimSpec
from mixlab.shared.config import ExperimentConfig, is_count, require
from mixlab.shared.registry import Method

MARKET_NAMES = ("bertrand", "cournot")
"""the stage games (:data:`mixlab.rl.curb.markets.MARKETS`)"""
GAMES = MARKET_NAMES
TABULAR_SYSTEMS = ("q-learning", "penalty", "belief", "curb", "no-memory", "myopic")
"""the tabular learners (``mixlab-rl curb simulate --learner``)"""
DQN_SYSTEMS = ("dqn", "curb-dqn")
CALVANO_RANGE = (0.75, 0.95)  # Calvano et al.'s Δ across their baseline replications
UNWOUND = 0.2  # "collusion unwound": Δ below this
COMPETITIVE_BAND = (-0.1, UNWOUND)
"""Δ of a session that is competitive without overshooting far past the one-shot Nash profits"""
IN_BAND = 0.7  # "unwound across sessions": at least this share of sessions in the band
LOCK_IN = 0.1
"""not stuck at the start: fewer than this share of sessions locked at Eq. 8's start profile"""
BELIEF_P = 0.05  # belief injection's own effect: one-sided paired test significant at this level
MAJORITY = 0.5  # "shows punishment": at least this share of sessions punish a deviation
RARE = 0.25  # "punishment removed": at most this share of sessions punish
LEARNED_TV = 0.5
"""DQN learned a reactive policy: mean coop-vs-defect TV dependence TV^cd at least this"""
MAX_TABLE_BYTES = 8 * 2**30
"""the most memory the Q tables of one batch of tabular sessions may take"""


SYSTEMS = (*TABULAR_SYSTEMS, *DQN_SYSTEMS, "frozen-start")
"""every system the experiment runs, as the claims' tests read them (rows ``<game>/<system>``)"""
_MYOPIC = (
    "the myopic learner (δ = 0), the competitive reference: the same Q-learner, sessions and seeds "
    "without valuing the future, so without collusion to unwind and without CURB's penalty or "
    "beliefs"
)


_SESSIONS = (
    "its statistic runs over n_sessions independently seeded sessions (the {what}), one run seed "
    "for them all: the spread over sessions is inside the statistic, so it is judged once, not "
    "per run seed"
)

_DQN_SESSIONS = (
    "its median Δ runs over dqn_seeds independently seeded DQN sessions (2 in quick, 4 in full), "
    "one run seed for them all: the spread over sessions is inside the median, so it is judged "
    "once; with so few sessions issue 75 should judge them session by session"
)


def _unwinds(game: str) -> ClaimSpec:
    low, high = COMPETITIVE_BAND
    return ClaimSpec(
        key=f"unwinds_{game}",
        text=f"curb unwinds collusion in {game} across sessions: median Δ < {UNWOUND}, at least "
        f"{IN_BAND:.0%} of sessions with Δ in [{low}, {high}], fewer than {LOCK_IN:.0%} locked "
        f"at the Eq. 8 start profile (the frozen control's outcome), at most {RARE:.0%} punishing",
        system="curb",
        control="myopic",
        why_control=f"{_MYOPIC}; if it meets the same distribution test, the test does not measure "
        "unwinding (issue 75)",
        not_per_seed=_SESSIONS.format(
            what="median Δ and the shares of sessions in the band, locked in and punishing"
        ),
    )


CLAIMS = (
    *(_unwinds(game) for game in MARKET_NAMES),
    ClaimSpec(
        key="belief_adds",
        text="Belief injection adds to the penalty: in each game CURB's sessions lie closer to the "
        "competitive band than penalty-only sessions with the same seeds (one-sided Wilcoxon "
        f"signed-rank on the paired distances, p < {BELIEF_P})",
        system="curb",
        control="myopic",
        why_control=f"{_MYOPIC}; if it too lies closer to the band than penalty-only, being closer "
        "does not measure belief injection (issue 75 names myopic as every claim's control)",
        not_per_seed=_SESSIONS.format(
            what="one-sided Wilcoxon signed-rank p over the sessions paired by seed with "
            "penalty-only: a test over seeds already"
        ),
        threshold=BELIEF_P,
        floor=0.0,
        ceiling=1.0,  # a p-value
    ),
    ClaimSpec(
        key="grid_unwinds",
        text="The effect holds across the (α, β) grid ({n_alphas} × {n_betas}): in every cell of "
        f"both games CURB's median Δ is below {UNWOUND} and below Q-learning's lowest cell median",
        system="curb",
        control="q-learning",
        why_control="only Q-learning and CURB run on the grid (no extra training here), so the "
        "control is the claim's own reference, plain Q-learning, and fails trivially; issue 75 "
        "should put the myopic learner on the grid",
        not_per_seed="each cell's median Δ runs over grid_sessions independently seeded sessions "
        "(n_sessions at Calvano's cell), one run seed for them all: the spread over sessions is "
        "inside each cell's statistic, so it is judged once, not per run seed",
    ),
    ClaimSpec(
        key="dqn_colludes",
        text=f"The DQN baseline itself colludes on Bertrand (median Δ >= {UNWOUND}; {{dqn_seeds}} "
        "sessions of {dqn_steps} steps; reported before any claim about CURB-DQN; tested only "
        "when DQN learned a reactive policy)",
        system="dqn",
        control="myopic",
        why_control="the tabular myopic learner (δ = 0), the competitive reference: it does not "
        "value the future, so it cannot sustain collusion; no myopic DQN is trained (issue 75 may "
        "add one)",
        not_per_seed=_DQN_SESSIONS,
    ),
    ClaimSpec(
        key="curb_dqn_unwinds",
        text=f"CURB-DQN unwinds DQN collusion: median Δ below {UNWOUND} and below DQN's (tested "
        "only when DQN learned a reactive policy)",
        system="curb-dqn",
        control="myopic",
        why_control=f"{_MYOPIC}; no myopic DQN is trained, so the tabular one stands in (issue 75 "
        "may add one)",
        not_per_seed=_DQN_SESSIONS,
    ),
)
"""the claims (:class:`~mixlab.shared.claims.ClaimSpec`), judged in
:func:`mixlab.rl.curb.experiment.claims`; the grid claim only when the grid runs (full)"""


def q_table_bytes(n_sessions: int, n_firms: int, n_actions: int, memory: int = 1) -> int:
    """Bytes of the float64 Q tables of ``n_sessions`` tabular sessions (m^(n·k) states × m)."""
    return n_sessions * n_firms * n_actions ** (n_firms * memory) * n_actions * 8


def _reals(values: Any, ok) -> bool:
    """A tuple/list of finite real numbers (not bools), each satisfying ``ok``."""
    return isinstance(values, tuple | list) and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and bool(ok(v))
        for v in values
    )


@dataclass
class Config(ExperimentConfig):
    """Defaults are the quick profile (a few minutes on 2 CPU cores)."""

    n_sessions: int = 20
    """seeded sessions per tabular system, game and grid cell"""
    alpha: float = 0.15
    """Q-learning rate α (Calvano's baseline)"""
    beta: float = 4e-6
    """exploration decay β (Calvano's baseline)"""
    penalty: float = 0.2
    """CURB's λ_max (penalty-only and CURB systems)"""
    n_actions: int = 15
    """grid size m"""
    grid_alphas: tuple[float, ...] = ()
    """α values of the Q-learning vs CURB grid (empty: no grid)"""
    grid_betas: tuple[float, ...] = ()
    """β values of the grid"""
    grid_sessions: int = 30
    """seeded sessions per grid cell off Calvano's (α, β)"""
    penalty_sweep: tuple[float, ...] = ()
    """extra λ_max values for CURB (empty: none)"""
    dqn_steps: int = 30_000
    """DQN training steps per session"""
    dqn_seeds: int = 2
    """DQN and CURB-DQN sessions each"""
    dqn_beta: float = 2.5e-4
    """DQN exploration decay (ε reaches its floor of 0.01 at about 0.6 of the steps)"""

    SYSTEMS: ClassVar[tuple[str, ...]] = SYSTEMS
    TIMINGS: ClassVar[tuple[str, ...]] = ("seconds",)
    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = CLAIMS

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {
        "quick": {},
        "full": {
            "n_sessions": 100,
            "grid_alphas": (0.05, 0.1, 0.15, 0.2, 0.25),
            "grid_betas": (1e-6, 2e-6, 4e-6, 8e-6, 1.6e-5),
            "penalty_sweep": (0.05, 0.1, 0.5),
            "dqn_steps": 200_000,
            "dqn_seeds": 4,
            "dqn_beta": 4e-5,
        },
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n_sessions", "grid_sessions", "dqn_steps", "dqn_seeds"):
            require(is_count(getattr(self, name)), name, "an integer >= 1", getattr(self, name))
        require(is_count(self.n_actions, 2), "n_actions", "an integer >= 2", self.n_actions)
        require(0 < self.alpha <= 1, "alpha", "in (0, 1]", self.alpha)
        # β = 0 never stops exploring: a session would run to the billion-period cap.
        require(self.beta > 0, "beta", "> 0 (ε = exp(−βt) must decay)", self.beta)
        require(self.dqn_beta > 0, "dqn_beta", "> 0 (ε = exp(−βt) must decay)", self.dqn_beta)
        require(self.penalty > 0, "penalty", "> 0", self.penalty)
        for name, ok, allowed in (
            ("grid_alphas", lambda a: 0 < a <= 1, "finite numbers in (0, 1]"),
            ("grid_betas", lambda b: b > 0, "finite numbers > 0"),
            ("penalty_sweep", lambda p: p > 0, "finite numbers > 0"),
        ):
            values = getattr(self, name)
            require(_reals(values, ok), name, allowed, values)
            require(len(set(values)) == len(values), name, "without repeated values", values)
        require(
            bool(self.grid_alphas) == bool(self.grid_betas),
            "grid_alphas",
            "empty exactly when grid_betas is",
            (self.grid_alphas, self.grid_betas),
        )
        sessions = max(self.n_sessions, self.grid_sessions if self.grid_alphas else 1)
        table = q_table_bytes(sessions, 2, self.n_actions)
        require(
            table <= MAX_TABLE_BYTES,
            "n_actions",
            f"small enough that a batch's Q tables fit in {MAX_TABLE_BYTES / 2**30:.0f} GiB "
            f"({table / 2**30:.1f} GiB with {sessions} sessions; lower n_actions or the sessions)",
            self.n_actions,
        )


METHOD = Method(
    name="curb",
    domain="rl",
    paper="CURB: unwinding algorithmic collusion among Q-learning and DQN pricing agents by penalising dependence on the rival's history and injecting beliefs (reconstruction)",
    claim="Q-learners collude (Δ ≈ 0.85, sustained by punishment); CURB unwinds it in Bertrand and Cournot across sessions (median Δ below 0.2, at least 70 % of sessions in the competitive band, fewer than 10 % stuck at the start) and removes punishment",
    config=Config,
    run="mixlab.rl.curb.experiment:run",
    headline_plot="collusion.png",
)
