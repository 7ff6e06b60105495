"""One-time work that later runs reuse (a pre-trained model, a generated data set), keyed by its
config AND by the code that makes it, and timed, so that a run can say whether it started cold.

    folder = cached("llm_efficiency", "tiny-llama", asdict(lm_config), train_into,
                    code=["mixlab.llm_efficiency.lm"])

``cached`` returns ``cache_dir(namespace)/<name>-<digest>``; the digest covers ``key`` and the
source of every module in ``code``, so a change to the code that trains a model trains it again
instead of reusing a model the current code would not make (a result made with it could not be
reproduced on a fresh machine). On a miss ``build(folder)`` fills a temporary folder that is
renamed into place when complete, beside a ``cache.json`` recording the key, the code digest and
the seconds the build took; a killed build leaves nothing a later run would read (a long build
resumes with ``resumable=True``: it keeps its own checkpoints in the folder it builds in, which a
kill then leaves for the next run, and removes them when done). One process at a time builds an
entry; another waits for it. A result memoised in the
process instead of read through ``cached`` again is not in the run's ledger: call ``cached``
on every run.

Each use is appended to the run's ledger (``$MIXLAB_CACHE_LEDGER``, set by ``Method.execute``,
shared with worker processes), from which ``result.json`` records ``cache``: ``cold`` when
anything was built, ``warm`` when everything was found, the seconds the builds took, and the
wall time a cold run would take (the warm wall time plus the recorded build times of the hits).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mixlab.shared.files import write_json_atomic
from mixlab.shared.paths import cache_dir, cache_root, key_digest

LEDGER_ENV = "MIXLAB_CACHE_LEDGER"
"""the file (JSON lines) where this run's cache uses are appended"""
CACHE_FORMAT = "mixlab.cache/1"


def code_digest(modules: Iterable[str]) -> str:
    """SHA-256 (16 hex digits) of the source of ``modules`` (dotted names; a package counts with
    every ``.py`` file below it), in a stable order."""
    digest = hashlib.sha256()
    for name in sorted(set(modules)):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ValueError(f"code must name importable modules, got {name!r}")
        origin = Path(spec.origin)
        files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
        for path in files:
            digest.update(path.relative_to(origin.parent).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cached(
    namespace: str,
    name: str,
    key: Mapping[str, Any],
    build: Callable[[Path], None],
    *,
    code: Iterable[str] = (),
    resumable: bool = False,
) -> Path:
    """The folder of the cache entry ``name`` for ``key`` and the source of ``code``, built by
    ``build(folder)`` when absent (see the module docstring). One process builds an entry at a
    time (a lock beside it); another waits and then finds it. ``resumable``: ``build`` resumes
    from what a killed build left in its folder (its own checkpoints), so that folder is kept
    across kills instead of emptied."""
    code = list(code)
    source = code_digest(code) if code else None
    digest = key_digest({"key": dict(key), "code": source})
    root = cache_dir(namespace)
    folder = root / f"{name}-{digest}"
    record = folder / "cache.json"
    if not record.is_file():
        locks = cache_dir(".locks")  # apart from the entries: a lock file stays after its build
        with _locked(locks / f"{namespace}-{folder.name}.lock"):
            if not record.is_file():  # not built by another process while this one waited
                seconds = _build(folder, build, key, code, source, resumable)
                _log(namespace, folder.name, hit=False, build_s=seconds)
                return folder
    try:
        seconds = float(json.loads(record.read_text())["build_s"])
    except (ValueError, KeyError, TypeError):
        seconds = None
    _log(namespace, folder.name, hit=True, build_s=seconds)
    return folder


def _build(
    folder: Path,
    build: Callable[[Path], None],
    key: Mapping[str, Any],
    code: list[str],
    source: str | None,
    resumable: bool,
) -> float:
    partial = folder.parent / f".{folder.name}.partial"
    if not resumable:
        shutil.rmtree(partial, ignore_errors=True)  # what a killed build left: start clean
    partial.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        build(partial)
    except BaseException:
        if not resumable:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    seconds = round(time.perf_counter() - started, 1)
    shutil.rmtree(folder, ignore_errors=True)  # an entry whose cache.json was lost: replace it
    write_json_atomic(
        partial / "cache.json",
        {"format": CACHE_FORMAT, "key": dict(key), "code": code, "code_digest": source,
         "build_s": seconds},
    )  # fmt: skip
    partial.rename(folder)
    return seconds


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (POSIX ``flock``; none where that does not exist)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _log(namespace: str, entry: str, *, hit: bool, build_s: float | None) -> None:
    ledger = os.environ.get(LEDGER_ENV)
    if not ledger:
        return
    line = json.dumps({"entry": f"{namespace}/{entry}", "hit": hit, "build_s": build_s})
    with open(ledger, "a") as handle:  # one short line per write: appends do not interleave
        handle.write(line + "\n")


def read_ledger(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The cache uses a run appended to its ledger, each entry once (a miss beats a later hit)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    uses: dict[str, dict[str, Any]] = {}
    for line in lines:
        try:
            use = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if use["entry"] not in uses or not use["hit"]:
            uses[use["entry"]] = use
    return list(uses.values())


def cache_record(uses: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """What result.json records of a run's caches: ``state`` (cold, warm or none), ``build_s``
    (the one-time work this run did), ``cold_wall_s`` (this run's wall time, or for a warm run
    that time plus what its cache entries took to build) and the ``entries``."""
    built = [u for u in uses if not u["hit"]]
    found = [u for u in uses if u["hit"]]
    state = "cold" if built else "warm" if found else "none"
    known = all(u["build_s"] is not None for u in found)
    cold = wall_s + sum(u["build_s"] or 0.0 for u in found) if known else None
    return {
        "state": state,
        "build_s": round(sum(u["build_s"] or 0.0 for u in built), 1),
        "cold_wall_s": None if cold is None else round(cold, 1),
        "entries": sorted(uses, key=lambda u: u["entry"]),
    }


def entry_exists(entry: str) -> bool:
    """Whether a cache entry a result recorded (``namespace/name-digest``) is in this cache."""
    return (cache_root() / entry / "cache.json").is_file()
