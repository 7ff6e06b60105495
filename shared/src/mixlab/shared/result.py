"""``result.json``: what an experiment measured, per system, and the claims computed from it.

The schema (``DESIGN.md``)::

    {"method": "curb", "profile": "quick", "seed": 0, "config": {...},
     "metrics": {"curb": {"collusion_index": 0.08}, "q_learning": {"collusion_index": 0.81}},
     "regime": [{"text": "Q-learning colludes", "holds": true, "tested": true, "evidence": "..."}],
     "claims": [{"text": "...", "holds": true, "tested": true, "evidence": "0.08 < 0.81"}],
     "env": {"python": "3.11.7", "torch": "2.x", "device": "cpu", "git": "<sha>"},
     "wall_s": 41.2}

An experiment's ``run`` returns ``Result(metrics=..., claims=..., regime=...)``;
:meth:`Method.execute` fills in the rest (method, profile, seed, config, env, wall time) and writes
the file.

``regime`` holds the checks that the setup can test the claims at all (the reference system clearly
beats a trivial one by a margin fixed in advance). When one fails, every claim it gates is still
computed but marked ``tested: false``. Each claim is in one of four states, holds, fails, untested
or vacuous (:attr:`Claim.state`; :mod:`mixlab.shared.claims` has the rules: controls, premises,
floors and per-seed judgement).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from mixlab.shared.claims import CLAIM_STATES, Claim, format_number, tally
from mixlab.shared.files import write_json_atomic

if TYPE_CHECKING:
    import torch

__all__ = [
    "CLAIM_STATES",
    "RESULT_KEYS",
    "Claim",
    "Result",
    "environment",
    "format_number",
    "git_commit",
    "write_benchmark",
]

RESULT_KEYS = (
    "method",
    "profile",
    "seed",
    "config",
    "metrics",
    "regime",
    "claims",
    "env",
    "wall_s",
    "cache",
)
"""the keys of result.json, in order"""
OPTIONAL_KEYS = ("regime", "cache")
"""keys that files written before they existed lack (they load with none)"""


def _metric_value(system: str, name: str, value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real | None):
        raise ValueError(f"metrics[{system!r}][{name!r}] must be a number, got {value!r}")
    if value is None or not math.isfinite(value):
        return None  # JSON has no NaN/inf: a diverged or undefined value is recorded as null
    return int(value) if isinstance(value, numbers.Integral) else float(value)


@dataclass
class Result:
    """What one run of an experiment measured.

    ``metrics`` has one row per system (the method and each baseline), every row with the same keys.
    ``regime``: the checks that the setup can test the claims; when one fails, every claim it
    gates (all of them, unless it names some with :meth:`Claim.gating`) is marked untested.
    """

    metrics: dict[str, dict[str, float | None]]
    claims: list[Claim]
    regime: list[Claim] = field(default_factory=list)
    method: str = ""
    profile: str = ""
    seed: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    cache: dict[str, Any] | None = None
    """the run's one-time work (:func:`mixlab.shared.cache.cache_record`): ``state`` cold, warm or
    none, the seconds it built, the wall time a cold run takes, the entries it used"""

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
        for claim in [*self.claims, *self.regime]:
            if not isinstance(claim, Claim):
                raise ValueError(
                    f"claims and regime checks must be Claim objects computed from metrics, got {claim!r}"
                )
        texts = {claim.text for claim in self.claims}
        for check in self.regime:
            unknown = [text for text in check.gates if text not in texts]
            if unknown:
                raise ValueError(
                    f"regime check {check.text!r} gates claims that are not here: {unknown}"
                )
        self.claims = [self._gate(claim) for claim in self.claims]

    def _gate(self, claim: Claim) -> Claim:
        """``claim``, untested when a regime check that gates it failed."""
        failed = [
            check
            for check in self.regime
            if not check.holds and (not check.gates or claim.text in check.gates)
        ]
        if not failed or not claim.tested:
            return claim
        return claim.untested("regime check failed: " + "; ".join(check.text for check in failed))

    @property
    def regime_holds(self) -> bool:
        """True when every regime check holds (the setup can tell the systems apart)."""
        return all(check.holds for check in self.regime)

    @property
    def all_claims_hold(self) -> bool:
        """True when every claim holds: tested, and not met by its control as well."""
        return all(claim.state == "holds" for claim in self.claims)

    def tally(self) -> dict[str, int]:
        """How many claims hold, fail, are untested and are vacuous (the control passes too)."""
        return tally(claim.state for claim in self.claims)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "profile": self.profile,
            "seed": self.seed,
            "config": self.config,
            "metrics": self.metrics,
            "regime": [check.to_dict() for check in self.regime],
            "claims": [claim.to_dict() for claim in self.claims],
            "env": self.env,
            "wall_s": self.wall_s,
            "cache": self.cache,
        }

    def write(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write ``out_dir/result.json`` (atomically) and return its path."""
        return write_json_atomic(Path(out_dir) / "result.json", self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Self:
        """Read a ``result.json`` (a path to the file or to its folder)."""
        path = Path(path)
        if path.is_dir():
            path = path / "result.json"
        data = json.loads(path.read_text())
        missing = [key for key in RESULT_KEYS if key not in data and key not in OPTIONAL_KEYS]
        if missing:
            raise ValueError(f"{path} is not a mixlab result.json: missing {missing}")
        try:
            claims = [Claim.from_dict(claim) for claim in data.pop("claims")]
            regime = [Claim.from_dict(check) for check in data.pop("regime", [])]
            known = {key: data[key] for key in RESULT_KEYS if key in data}
            # gating is idempotent: stored claims come back in the states they were saved in
            result = cls(claims=claims, regime=regime, **known)
        except TypeError as error:
            raise ValueError(f"{path} is not a mixlab result.json: {error}") from None
        return result


def write_benchmark(
    out_dir: str | os.PathLike[str],
    *,
    method: str,
    metrics: dict[str, dict[str, float | None]],
    claims: list[Claim],
    config: dict[str, Any],
    started: float,
    regime: list[Claim] | tuple[Claim, ...] = (),
    device: str | torch.device = "cpu",
) -> Result:
    """Write a benchmark's ``out_dir/result.json`` (profile "default", seed 0, the ``env`` of
    ``device``, the wall time since ``started``, a ``time.perf_counter()`` reading) and print each
    claim's verdict and the path."""
    result = Result(
        metrics=metrics,
        claims=claims,
        regime=list(regime),
        method=method,
        profile="default",
        seed=0,
        config=config,
        env=environment(device),
        wall_s=round(time.perf_counter() - started, 1),
    )
    path = result.write(out_dir)
    for claim in result.claims:
        print(f"{claim.state}: {claim.text} ({claim.evidence})")
    print(f"wrote {path}")
    return result


def environment(device: str | torch.device) -> dict[str, Any]:
    """The ``env`` block: python, torch (None when it is not installed), numpy, platform, device and
    mixlab's git commit if known."""
    import numpy as np

    try:
        import torch
    except ImportError:  # a NumPy-only domain installs without torch
        torch_version = None
    else:
        torch_version = torch.__version__

    return {
        "python": platform.python_version(),
        "torch": torch_version,
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
