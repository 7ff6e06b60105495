"""RND-RFF: random network distillation with a random-Fourier-feature target (reconstructed;
paper not found).

RND's bonus is the error of a predictor distilling a frozen random network. With a random-MLP
target the predictor generalises at the architecture's scale, so novelty collapses on states near
or between visited ones. RND-RFF makes the target f_T(x) = Pᵀ√(2/D)·cos(Ωx/ℓ + b): each output is
approximately a GP(0, k_ℓ) draw, the bonus tracks the GP posterior variance, and ℓ (median rule by
default) and the spectrum (Gaussian, Laplace, multiscale) are explicit knobs.

    from mixlab.rl.rnd_rff import make_bonus, PPOLearner, make_vector_env
    envs = make_vector_env("CoordMaze", num_envs=8, obs="xy")
    bonus = make_bonus("rff", envs.single_observation_space)   # or "rnd", "drnd", "count"
    PPOLearner(envs, bonus, seed=0).learn(50_000)

    bonus = make_bonus("rff", (d,)).fit(visited)                # alone, on any array (any kind)
    bonus.bonus(new_points)

See ``seeds/rnd_rff.md`` for what is reconstructed and the measured results.
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "Agent": "ppo",
    "BONUS_KINDS": "bonus",
    "BONUS_METHODS": "bonus",
    "CellInfo": "envs",
    "ClusterProbe": "probe",
    "ConvPredictor": "targets",
    "ConvRFFTarget": "targets",
    "ConvTarget": "targets",
    "CoordMaze": "envs",
    "CoordMazeVector": "envs",
    "CountBonus": "bonus",
    "DRNDBonus": "bonus",
    "DownsampleFrame": "envs",
    "ENV_ID": "envs",
    "MLPPredictor": "targets",
    "MLPTarget": "targets",
    "MazeLayout": "envs",
    "NoveltyBonus": "bonus",
    "NoveltyCallback": "sb3",
    "NoveltyVecEnvWrapper": "sb3",
    "PPOConfig": "ppo",
    "PPOLearner": "ppo",
    "RFFTarget": "targets",
    "RoomInfo": "envs",
    "auroc": "kernels",
    "cluster_probe": "probe",
    "count_correlation": "kernels",
    "fpr_at_95": "kernels",
    "gp_posterior_variance": "kernels",
    "make_bonus": "bonus",
    "make_vector_env": "envs",
    "median_bandwidth": "targets",
    "rbf_kernel": "kernels",
    "score_bonus": "probe",
}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

__all__ = [
    "BONUS_KINDS",
    "BONUS_METHODS",
    "ENV_ID",
    "Agent",
    "CellInfo",
    "ClusterProbe",
    "ConvPredictor",
    "ConvRFFTarget",
    "ConvTarget",
    "CoordMaze",
    "CoordMazeVector",
    "CountBonus",
    "DRNDBonus",
    "DownsampleFrame",
    "MLPPredictor",
    "MLPTarget",
    "MazeLayout",
    "NoveltyBonus",
    "NoveltyCallback",
    "NoveltyVecEnvWrapper",
    "PPOConfig",
    "PPOLearner",
    "RFFTarget",
    "RoomInfo",
    "auroc",
    "cluster_probe",
    "count_correlation",
    "fpr_at_95",
    "gp_posterior_variance",
    "make_bonus",
    "make_vector_env",
    "median_bandwidth",
    "rbf_kernel",
    "score_bonus",
]

if TYPE_CHECKING:
    from mixlab.rl.rnd_rff.bonus import (
        BONUS_KINDS,
        BONUS_METHODS,
        CountBonus,
        DRNDBonus,
        NoveltyBonus,
        make_bonus,
    )
    from mixlab.rl.rnd_rff.envs import (
        ENV_ID,
        CellInfo,
        CoordMaze,
        CoordMazeVector,
        DownsampleFrame,
        MazeLayout,
        RoomInfo,
        make_vector_env,
    )
    from mixlab.rl.rnd_rff.kernels import (
        auroc,
        count_correlation,
        fpr_at_95,
        gp_posterior_variance,
        rbf_kernel,
    )
    from mixlab.rl.rnd_rff.ppo import Agent, PPOConfig, PPOLearner
    from mixlab.rl.rnd_rff.probe import ClusterProbe, cluster_probe, score_bonus
    from mixlab.rl.rnd_rff.sb3 import NoveltyCallback, NoveltyVecEnvWrapper
    from mixlab.rl.rnd_rff.targets import (
        ConvPredictor,
        ConvRFFTarget,
        ConvTarget,
        MLPPredictor,
        MLPTarget,
        RFFTarget,
        median_bandwidth,
    )
