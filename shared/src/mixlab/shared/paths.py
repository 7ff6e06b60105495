"""Where runs and caches go."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_root() -> Path:
    """``$MIXLAB_CACHE`` when set, else the platform's user cache folder (``~/.cache/mixlab`` on
    Linux); not created."""
    return Path(os.environ.get("MIXLAB_CACHE") or user_cache_dir("mixlab"))


def cache_dir(*parts: str) -> Path:
    """A folder for one-time work that later runs reuse (pre-trained models, generated data sets),
    below :func:`cache_root`; created. :func:`mixlab.shared.cache.cached` keys and times entries."""
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def key_digest(key: object, length: int = 10) -> str:
    """A short stable name for a cache entry: the SHA-256 of ``key`` as sorted JSON (tuples as
    lists), first ``length`` hex digits."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=list).encode()).hexdigest()[
        :length
    ]


def default_run_dir(method: str, profile: str, seed: int) -> Path:
    """``runs/<method>/<profile>-seed<seed>`` below the current folder."""
    return Path("runs") / method / f"{profile}-seed{seed}"
