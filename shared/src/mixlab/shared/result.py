"""``result.json``: what an experiment measured, per system, and the claims computed from it.

The schema (``DESIGN.md``)::

    {"method": "curb", "profile": "quick", "seed": 0, "config": {...},
     "metrics": {"curb": {"collusion_index": 0.08}, "q_learning": {"collusion_index": 0.81}},
     "claims": [{"text": "...", "holds": true, "evidence": "0.08 < 0.81"}],
     "env": {"python": "3.11.7", "torch": "2.x", "device": "cpu", "git": "<sha>"},
     "wall_s": 41.2}

An experiment's ``run`` returns ``Result(metrics=..., claims=...)``; :meth:`Method.execute` fills
in the rest (method, profile, seed, config, env, wall time) and writes the file.
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

import numpy as np
import torch

Comparison = Literal["<", "<=", ">", ">="]
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
RESULT_KEYS = ("method", "profile", "seed", "config", "metrics", "claims", "env", "wall_s")


def format_number(value: float | None) -> str:
    """Four significant digits, the way numbers appear in evidence strings and tables."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return str(value)
    return f"{value:.4g}"


@dataclass(frozen=True)
class Claim:
    """One sentence of the paper's claim, whether it held in this run, and the numbers that say so.

    Build claims with :meth:`compare` (or :meth:`all_of`) from measured metrics, never by hand.
    """

    text: str
    holds: bool
    evidence: str

    def __post_init__(self) -> None:
        if not isinstance(self.holds, bool):
            raise ValueError(
                f"Claim.holds must be a bool computed from metrics, got {self.holds!r}"
            )
        if not self.text.strip():
            raise ValueError("Claim.text must be a non-empty sentence")

    @classmethod
    def compare(
        cls,
        text: str,
        value: float,
        op: Comparison,
        reference: float,
        *,
        value_label: str = "",
        reference_label: str = "",
    ) -> Self:
        """``value op reference``, e.g. ``Claim.compare(text, ours_error, "<", baseline_error)``.

        A non-finite number (a diverged run) makes the claim not hold.
        """
        if op not in _OPERATORS:
            raise ValueError(f"op must be one of {list(_OPERATORS)}, got {op!r}")
        value, reference = float(value), float(reference)
        holds = (
            math.isfinite(value) and math.isfinite(reference) and _OPERATORS[op](value, reference)
        )
        left = f"{value_label} {format_number(value)}".strip()
        right = f"{reference_label} {format_number(reference)}".strip()
        return cls(text=text, holds=bool(holds), evidence=f"{left} {op} {right}")

    @classmethod
    def all_of(cls, text: str, parts: list[Claim]) -> Self:
        """A claim that holds when every part holds; the evidence lists the parts'."""
        if not parts:
            raise ValueError("Claim.all_of needs at least one part")
        return cls(
            text=text,
            holds=all(p.holds for p in parts),
            evidence="; ".join(p.evidence for p in parts),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "holds": self.holds, "evidence": self.evidence}


def _metric_value(system: str, name: str, value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(
        value, int | float | np.integer | np.floating | None
    ):
        raise ValueError(f"metrics[{system!r}][{name!r}] must be a number, got {value!r}")
    if value is None or not math.isfinite(value):
        return None  # JSON has no NaN/inf: a diverged or undefined value is recorded as null
    return int(value) if isinstance(value, int | np.integer) else float(value)


@dataclass
class Result:
    """What one run of an experiment measured.

    ``metrics`` has one row per system (the method and each baseline), every row with the same keys.
    """

    metrics: dict[str, dict[str, float | None]]
    claims: list[Claim]
    method: str = ""
    profile: str = ""
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None

    def __post_init__(self) -> None:
        if not self.metrics:
            raise ValueError("metrics must have at least one system (the method and each baseline)")
        keys = None
        cleaned: dict[str, dict[str, float | None]] = {}
        for system, row in self.metrics.items():
            if keys is None:
                keys, first = set(row), system
            elif set(row) != keys:
                raise ValueError(
                    f"metrics rows must share their keys: {system!r} has {sorted(row)}, {first!r} has {sorted(keys)}"
                )
            cleaned[system] = {
                name: _metric_value(system, name, value) for name, value in row.items()
            }
        self.metrics = cleaned
        for claim in self.claims:
            if not isinstance(claim, Claim):
                raise ValueError(
                    f"claims must be Claim objects computed from metrics, got {claim!r}"
                )

    @property
    def all_claims_hold(self) -> bool:
        return all(claim.holds for claim in self.claims)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "profile": self.profile,
            "seed": self.seed,
            "config": self.config,
            "metrics": self.metrics,
            "claims": [claim.to_dict() for claim in self.claims],
            "env": self.env,
            "wall_s": self.wall_s,
        }

    def write(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write ``out_dir/result.json`` and return its path."""
        path = Path(out_dir) / "result.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a ``result.json`` (a path to the file or to its folder)."""
        path = Path(path)
        if path.is_dir():
            path = path / "result.json"
        data = json.loads(path.read_text())
        missing = [key for key in RESULT_KEYS if key not in data]
        if missing:
            raise ValueError(f"{path} is not a mixlab result.json: missing {missing}")
        claims = [Claim(**claim) for claim in data.pop("claims")]
        return cls(claims=claims, **data)


def write_benchmark(
    out_dir: str | os.PathLike[str],
    *,
    method: str,
    metrics: dict[str, dict[str, float | None]],
    claims: list[Claim],
    config: dict[str, Any],
    started: float,
    device: str | torch.device = "cpu",
) -> Result:
    """Write a benchmark's ``out_dir/result.json`` (profile "default", seed 0, the ``env`` of
    ``device``, the wall time since ``started``, a ``time.perf_counter()`` reading) and print each
    claim's verdict and the path."""
    result = Result(
        metrics=metrics,
        claims=claims,
        method=method,
        profile="default",
        seed=0,
        config=config,
        env=environment(device),
        wall_s=round(time.perf_counter() - started, 1),
    )
    path = result.write(out_dir)
    for claim in claims:
        verdict = "holds" if claim.holds else "does not hold"
        print(f"{verdict}: {claim.text} ({claim.evidence})")
    print(f"wrote {path}")
    return result


def environment(device: str | torch.device) -> dict[str, Any]:
    """The ``env`` block: python, torch, numpy, platform, device and mixlab's git commit if known."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(terse=True),
        "device": str(device),
        "git": git_commit(),
    }


def git_commit() -> str | None:
    """The commit of the mixlab checkout this code runs from (``+dirty`` if changed), or None."""
    source = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None  # installed from a wheel, or git missing
    return f"{sha}+dirty" if dirty else sha
