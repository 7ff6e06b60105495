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
beats a trivial one by a margin fixed in advance). When one fails, every claim is still computed but
marked ``tested: false``: each claim is in one of three states, holds, fails or untested
(:attr:`Claim.state`). A claim that needs a precondition of its own (``DQN learned`` before ``DQN
colludes``) passes it as ``requires=[check]`` to :meth:`Claim.compare` / :meth:`Claim.all_of`.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from mixlab.shared.files import write_json_atomic

if TYPE_CHECKING:
    import torch

Comparison = Literal["<", "<=", ">", ">="]
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
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
)
"""the keys of result.json, in order; files written before ``regime`` existed load with none"""
CLAIM_STATES = ("holds", "fails", "untested")


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
    tested: bool = True
    """False when the setup could not test the claim (a regime check failed): the verdict is moot"""
    gates: tuple[str, ...] = ()
    """for a regime check: the texts of the claims it gates (empty: every claim); see :meth:`gating`"""

    def __post_init__(self) -> None:
        for name in ("holds", "tested"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"Claim.{name} must be a bool computed from metrics, got {getattr(self, name)!r}"
                )
        if not self.text.strip():
            raise ValueError("Claim.text must be a non-empty sentence")
        object.__setattr__(self, "gates", tuple(self.gates))

    def gating(self, *claims: Claim) -> Self:
        """This regime check, gating only ``claims`` (a check of the training budget gates the
        claims about trained systems, not a claim about exact theory)."""
        if not claims:
            raise ValueError("gating needs at least one claim")
        return replace(self, gates=tuple(claim.text for claim in claims))

    @property
    def state(self) -> str:
        """``"holds"``, ``"fails"`` or ``"untested"``."""
        if not self.tested:
            return "untested"
        return "holds" if self.holds else "fails"

    def untested(self, reason: str) -> Self:
        """This claim marked untested, with ``reason`` appended to its evidence."""
        return replace(self, tested=False, evidence=f"{self.evidence} (untested: {reason})")

    def _gated(self, requires: list[Claim] | tuple[Claim, ...]) -> Self:
        failed = [check for check in requires if not check.holds]
        if not failed:
            return self
        reason = "; ".join(f"{check.text} does not hold ({check.evidence})" for check in failed)
        return self.untested(reason)

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
        requires: list[Claim] | tuple[Claim, ...] = (),
    ) -> Self:
        """``value op reference``, e.g. ``Claim.compare(text, ours_error, "<", baseline_error)``.

        A non-finite number (a diverged run) makes the claim not hold. ``requires``: checks this
        claim alone depends on; when one does not hold the claim is untested.
        """
        if op not in _OPERATORS:
            raise ValueError(f"op must be one of {list(_OPERATORS)}, got {op!r}")
        value, reference = float(value), float(reference)
        holds = (
            math.isfinite(value) and math.isfinite(reference) and _OPERATORS[op](value, reference)
        )
        left = f"{value_label} {format_number(value)}".strip()
        right = f"{reference_label} {format_number(reference)}".strip()
        claim = cls(text=text, holds=bool(holds), evidence=f"{left} {op} {right}")
        return claim._gated(requires)

    @classmethod
    def paired(
        cls, text: str, differences: Any, threshold: float, *, label: str,
        requires: list[Claim] | tuple[Claim, ...] = (),
    ) -> Self:  # fmt: skip
        """Differences paired by seed clear ``threshold`` with their spread: mean − sd (ddof 1)
        >= threshold; one seed gives NaN, so the claim does not hold."""
        values = [float(v) for v in differences]
        low = float("nan")
        if len(values) > 1:
            mean = sum(values) / len(values)
            low = mean - math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        return cls.compare(text, low, ">=", threshold, value_label=f"mean − sd over seeds of {label}",
                           requires=requires)  # fmt: skip

    @classmethod
    def all_of(
        cls, text: str, parts: list[Claim], *, requires: list[Claim] | tuple[Claim, ...] = ()
    ) -> Self:
        """A claim that holds when every part holds; the evidence lists the parts'. It is tested
        only when every part is and every check in ``requires`` holds."""
        if not parts:
            raise ValueError("Claim.all_of needs at least one part")
        claim = cls(
            text=text,
            holds=all(p.holds for p in parts),
            evidence="; ".join(p.evidence for p in parts),
            tested=all(p.tested for p in parts),
        )
        return claim._gated(requires)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "text": self.text,
            "holds": self.holds,
            "tested": self.tested,
            "evidence": self.evidence,
        }
        if self.gates:
            data["gates"] = list(self.gates)
        return data


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
        return all(claim.holds for claim in self.claims)

    def tally(self) -> dict[str, int]:
        """How many claims hold, fail and are untested."""
        states = [claim.state for claim in self.claims]
        return {state: states.count(state) for state in CLAIM_STATES}

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
        missing = [key for key in RESULT_KEYS if key not in data and key != "regime"]
        if missing:
            raise ValueError(f"{path} is not a mixlab result.json: missing {missing}")
        try:
            claims = [Claim(**claim) for claim in data.pop("claims")]
            regime = [Claim(**check) for check in data.pop("regime", [])]
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
    """The ``env`` block: python, torch, numpy, platform, device and mixlab's git commit if known."""
    import numpy as np
    import torch

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
