"""Compare a fresh ``result.json`` with a committed one: verdicts that changed and metrics that drifted.

``mixlab reproduce --compare benchmarks/results`` uses it to show whether the committed results still
come out of the code at HEAD.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mixlab.shared.cache import entry_exists
from mixlab.shared.claims import claim_state
from mixlab.shared.progress_report import clock

DRIFT_TOLERANCE = 0.05
"""a metric whose relative change exceeds this is listed as drifted"""


def committed_result(reference: Path, method: str, profile: str) -> Path:
    """Where a method's committed result of ``profile`` lives: ``<reference>/<method>/experiment-<profile>/result.json``."""
    return reference / method / f"experiment-{profile}" / "result.json"


def committed_wall_s(reference: Path | None, method: str, profile: str) -> float | None:
    """The wall time of the committed run, or None when there is none to read."""
    return _wall_s(_committed(reference, method, profile) or {})


def _wall_s(data: dict[str, Any]) -> float | None:
    wall = data.get("wall_s")
    return float(wall) if isinstance(wall, int | float) and not isinstance(wall, bool) else None


def expected_time(reference: Path | None, method: str, profile: str) -> str:
    """What to expect of a run of ``method``, from its committed result: the wall time of a cold
    run (one-time work included) when the cache entries that run used are not here, else the
    warm time."""
    data = _committed(reference, method, profile) or {}
    wall = _wall_s(data)
    if wall is None:
        return "no committed time to expect"
    cache = data.get("cache")
    where = f"its last committed {profile} run"
    if not isinstance(cache, dict):
        return f"expected about {clock(wall)} ({where}; whether its cache was warm is not recorded)"
    if cache["state"] == "none":
        return f"expected about {clock(wall)} ({where}; it caches nothing)"
    # the builds' seconds are summed over the workers that ran them side by side: when they
    # reach the wall time, wall − builds says nothing about a warm run
    parallel = cache["state"] != "warm" and cache["build_s"] >= wall
    warm = wall if cache["state"] == "warm" else max(0.0, wall - cache["build_s"])
    if all(entry_exists(entry["entry"]) for entry in cache["entries"]):
        if parallel:
            return f"expected less than {clock(wall)} ({where}, cold; its cache is here)"
        return f"expected about {clock(warm)} ({where}; its cache is here)"
    cold = cache.get("cold_wall_s")
    if cold is None:
        return f"expected more than {clock(warm)}: the cache is empty and {where} did not record its cold time"
    once_cached = (
        "less once cached: its one-time builds ran in parallel workers"
        if parallel
        else f"about {clock(warm)} once cached"
    )
    return (
        f"expected about {clock(cold)} with the cache empty, one-time work included "
        f"({once_cached}; {where})"
    )


def _committed(reference: Path | None, method: str, profile: str) -> dict[str, Any] | None:
    if reference is None:
        return None
    try:
        data = json.loads(committed_result(reference, method, profile).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def compare_results(
    committed: dict[str, Any],
    fresh: dict[str, Any],
    *,
    tolerance: float = DRIFT_TOLERANCE,
    timings: Iterable[str] = (),
) -> dict[str, Any]:
    """Verdict changes (claims matched by text) and the metrics whose relative change exceeds
    ``tolerance`` between two result.json dicts (1e-6 checks that a run reproduces); the metrics
    named in ``timings`` (the method's ``Config.TIMINGS``, wall times) are listed apart."""
    timings = set(timings)
    before = {claim["text"]: claim_state(claim) for claim in committed.get("claims", [])}
    after = {claim["text"]: claim_state(claim) for claim in fresh.get("claims", [])}
    verdicts = [
        {"claim": text, "committed": before.get(text, "absent"), "fresh": after.get(text, "absent")}
        for text in [*before, *(t for t in after if t not in before)]
        if before.get(text, "absent") != after.get(text, "absent")
    ]
    drift, moved = [], []
    for system, row in fresh.get("metrics", {}).items():
        old_row = committed.get("metrics", {}).get(system, {})
        for name, value in row.items():
            if name not in old_row:
                continue
            change = _relative_change(old_row[name], value)
            if change is None or abs(change) > tolerance:
                (moved if name in timings else drift).append(
                    {
                        "system": system,
                        "metric": name,
                        "committed": old_row[name],
                        "fresh": value,
                        "relative": change,
                    }
                )
    for changes in (drift, moved):
        changes.sort(key=lambda d: -math.inf if d["relative"] is None else -abs(d["relative"]))
    return {
        "committed_git": committed.get("env", {}).get("git"),
        "tolerance": tolerance,
        "verdict_changes": verdicts,
        "drifted_metrics": drift,
        "moved_timings": moved,
        "compared_metrics": sum(
            name in committed.get("metrics", {}).get(system, {})
            for system, row in fresh.get("metrics", {}).items()
            for name in row
        ),
    }


def _relative_change(old: float | None, new: float | None) -> float | None:
    """(new - old) / |old|; 0 when both are equal or both missing, None when only one is missing."""
    if old is None or new is None:
        return 0.0 if old is None and new is None else None
    if old == new:
        return 0.0
    return (new - old) / max(abs(old), 1e-12)
