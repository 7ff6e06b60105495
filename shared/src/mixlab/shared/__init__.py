"""mixlab.shared: what every mixlab method stands on.

- :class:`Method` and :func:`discover_methods`: the registry behind ``mixlab list/run/reproduce``.
- :class:`ExperimentConfig`: the base of each experiment's Config (quick and full profiles).
- :class:`Result` and :class:`Claim`: ``result.json``, with claims computed from measured metrics;
  :class:`ClaimSpec` and :func:`judge`: claims declared on the Config with a control, premises and
  bounds, and judged seed by seed into four states (holds, fails, untested, vacuous).
- :func:`seed_everything`, :func:`resolve_device`, :class:`Checkpointer`, :func:`progress`,
  :func:`line_plot` / :func:`bar_plot`: the pieces every experiment loop needs.

Names load on first use (PEP 562), so that a CLI answers ``--help`` without importing torch.
"""

from typing import TYPE_CHECKING

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "Checkpointer": "checkpoint",
    "checkpoint_spacing": "checkpoint",
    "load_state": "checkpoint",
    "run_cells": "checkpoint",
    "save_state": "checkpoint",
    "ExperimentConfig": "config",
    "require": "config",
    "is_count": "config",
    "is_number": "config",
    "resolve_device": "device",
    "ema_update": "diffusion",
    "timestep_embedding": "diffusion",
    "parameter_count": "budget",
    "width_for_budget": "budget",
    "added_peak_bytes": "memory",
    "measure_in_fresh_process": "memory",
    "cache_dir": "paths",
    "cached": "cache",
    "key_digest": "paths",
    "interleaved_median_seconds": "stats",
    "cells_by_system": "stats",
    "mean_std": "stats",
    "median_seconds": "stats",
    "warmup_cosine": "optim",
    "bar_plot": "plotting",
    "line_plot": "plotting",
    "save_figure": "plotting",
    "progress": "progress_report",
    "track": "progress_report",
    "DOMAINS": "registry",
    "Method": "registry",
    "discover_methods": "registry",
    "get_method": "registry",
    "Claim": "claims",
    "ClaimSpec": "claims",
    "judge": "claims",
    "Result": "result",
    "capture_rng_state": "seeding",
    "restore_rng_state": "seeding",
    "seed_everything": "seeding",
}
__all__ = [
    "DOMAINS",
    "Checkpointer",
    "Claim",
    "ClaimSpec",
    "ExperimentConfig",
    "Method",
    "Result",
    "added_peak_bytes",
    "bar_plot",
    "cache_dir",
    "cached",
    "capture_rng_state",
    "cells_by_system",
    "checkpoint_spacing",
    "discover_methods",
    "ema_update",
    "get_method",
    "interleaved_median_seconds",
    "is_count",
    "is_number",
    "judge",
    "key_digest",
    "line_plot",
    "load_state",
    "mean_std",
    "measure_in_fresh_process",
    "median_seconds",
    "parameter_count",
    "progress",
    "require",
    "resolve_device",
    "restore_rng_state",
    "run_cells",
    "save_figure",
    "save_state",
    "seed_everything",
    "timestep_embedding",
    "track",
    "warmup_cosine",
    "width_for_budget",
]


__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)

if TYPE_CHECKING:
    from mixlab.shared.budget import parameter_count, width_for_budget
    from mixlab.shared.cache import cached
    from mixlab.shared.checkpoint import Checkpointer, load_state, run_cells, save_state
    from mixlab.shared.claims import Claim, ClaimSpec, judge
    from mixlab.shared.config import ExperimentConfig, is_count, is_number, require
    from mixlab.shared.device import resolve_device
    from mixlab.shared.diffusion import ema_update, timestep_embedding
    from mixlab.shared.memory import added_peak_bytes, measure_in_fresh_process
    from mixlab.shared.optim import warmup_cosine
    from mixlab.shared.paths import cache_dir
    from mixlab.shared.plotting import bar_plot, line_plot, save_figure
    from mixlab.shared.progress_report import progress, track
    from mixlab.shared.registry import DOMAINS, Method, discover_methods, get_method
    from mixlab.shared.result import Result
    from mixlab.shared.seeding import capture_rng_state, restore_rng_state, seed_everything
    from mixlab.shared.stats import interleaved_median_seconds, mean_std, median_seconds
