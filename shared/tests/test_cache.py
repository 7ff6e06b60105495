"""One-time work keyed by config and code, timed, and recorded in result.json as cold or warm."""

import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from mixlab.shared import Claim, ClaimSpec, ExperimentConfig, Method, Result
from mixlab.shared.cache import LEDGER_ENV, cache_record, cached, code_digest, read_ledger
from mixlab.shared.compare import expected_time


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(LEDGER_ENV, raising=False)
    return tmp_path / "cache"


def _write(folder: Path) -> None:
    (folder / "weights.txt").write_text("trained")


def test_a_cache_entry_is_built_once_timed_and_logged(tmp_path: Path, monkeypatch) -> None:
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    builds = []

    def build(folder: Path) -> None:
        builds.append(folder)
        _write(folder)

    first = cached("toy", "model", {"width": 4}, build)
    again = cached("toy", "model", {"width": 4}, build)
    other = cached("toy", "model", {"width": 8}, build)
    assert first == again != other
    assert len(builds) == 2
    assert (first / "weights.txt").read_text() == "trained"
    record = json.loads((first / "cache.json").read_text())
    assert record["key"] == {"width": 4}
    assert record["build_s"] >= 0
    uses = read_ledger(ledger)
    assert {(u["entry"].split("/")[1].split("-")[0], u["hit"]) for u in uses} == {
        ("model", False)
    }  # the first use of an entry was a miss: a hit later does not hide it
    assert len(uses) == 2


def test_a_killed_build_leaves_nothing_a_later_run_reads(empty_cache: Path) -> None:
    def crash(folder: Path) -> None:
        _write(folder)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached("toy", "model", {"width": 4}, crash)
    assert list((empty_cache / "toy").iterdir()) == []
    folder = cached("toy", "model", {"width": 4}, _write)
    assert (folder / "cache.json").is_file()


def test_a_change_to_the_code_that_builds_makes_a_new_entry(tmp_path: Path, monkeypatch) -> None:
    module = tmp_path / "trainer_code.py"
    module.write_text("STEPS = 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    before = code_digest(["trainer_code"])
    first = cached("toy", "model", {"width": 4}, _write, code=["trainer_code"])
    module.write_text("STEPS = 20\n")
    assert code_digest(["trainer_code"]) != before
    assert cached("toy", "model", {"width": 4}, _write, code=["trainer_code"]) != first
    sys.modules.pop("trainer_code", None)
    with pytest.raises(ValueError, match="code must name importable modules"):
        code_digest(["no_such_module_here"])


def test_cache_record_gives_state_build_time_and_the_cold_wall_time() -> None:
    built = {"entry": "toy/model-1", "hit": False, "build_s": 30.0}
    found = {"entry": "toy/model-1", "hit": True, "build_s": 30.0}
    assert cache_record([built], 40.0)["state"] == "cold"
    assert cache_record([built], 40.0)["cold_wall_s"] == 40.0
    warm = cache_record([found], 10.0)
    assert (warm["state"], warm["build_s"], warm["cold_wall_s"]) == ("warm", 0.0, 40.0)
    assert cache_record([], 5.0)["state"] == "none"


@dataclass
class Config(ExperimentConfig):
    width: int = 4
    """a width"""
    SYSTEMS: ClassVar = ("cached", "fresh")
    CLAIMS: ClassVar = (
        ClaimSpec(key="found", text="the model is read back", system="cached", control="fresh",
                  why_control="a model that was never saved", not_per_seed="a file's content"),
    )  # fmt: skip


def _run(config: Config, out_dir: Path, *, resume: bool = False) -> Result:
    folder = cached("toy", "model", {"width": config.width}, _write)
    read = {"cached": float((folder / "weights.txt").read_text() == "trained"), "fresh": 0.0}
    claim = config.judge("found", lambda s: Claim.compare(s, read[s], ">", 0.5))
    return Result(metrics={s: {"read": v} for s, v in read.items()}, claims=[claim])


def test_result_json_says_whether_the_run_was_cold_and_what_a_cold_run_takes(
    tmp_path: Path,
) -> None:
    method = Method(name="toy", domain="rl", paper="p", claim="c", config=Config, run=_run)
    cold = method.execute(Config(device="cpu"), tmp_path / "cold")
    warm = method.execute(Config(device="cpu"), tmp_path / "warm")
    assert cold.cache["state"] == "cold"
    assert warm.cache["state"] == "warm"
    assert warm.cache["cold_wall_s"] >= round(warm.wall_s, 1)  # recorded to 0.1 s
    data = json.loads((tmp_path / "warm" / "result.json").read_text())
    assert data["cache"]["entries"][0]["hit"] is True
    assert Result.load(tmp_path / "warm").cache == warm.cache

    reference = tmp_path / "committed"
    (reference / "toy" / "experiment-quick").mkdir(parents=True)
    (reference / "toy" / "experiment-quick" / "result.json").write_text(json.dumps(data))
    assert "its cache is here" in expected_time(reference, "toy", "quick")
    for entry in (tmp_path / "cache" / "toy").glob("model-*"):
        (entry / "cache.json").unlink()  # an empty cache, as on a fresh machine
    assert "with the cache empty, one-time work included" in expected_time(
        reference, "toy", "quick"
    )
    # builds that ran side by side in two workers sum to more than the wall time: no warm
    # estimate of 0:00, just "less"
    parallel = {**data, "wall_s": 100.0,
                "cache": {**data["cache"], "state": "cold", "build_s": 150.0, "cold_wall_s": 100.0}}  # fmt: skip
    (reference / "toy" / "experiment-quick" / "result.json").write_text(json.dumps(parallel))
    said = expected_time(reference, "toy", "quick")
    assert "about 1:40 with the cache empty" in said
    assert "less once cached: its one-time builds ran in parallel workers" in said
    assert "0:00" not in said


def test_a_resumable_build_continues_from_what_a_killed_one_left(empty_cache: Path) -> None:
    def killed(folder: Path) -> None:
        (folder / "checkpoint").write_text("step 3")
        raise KeyboardInterrupt

    def resumed(folder: Path) -> None:
        assert (folder / "checkpoint").read_text() == "step 3"
        (folder / "checkpoint").unlink()
        _write(folder)

    with pytest.raises(KeyboardInterrupt):
        cached("toy", "model", {"width": 4}, killed, resumable=True)
    folder = cached("toy", "model", {"width": 4}, resumed, resumable=True)
    assert sorted(p.name for p in folder.iterdir()) == ["cache.json", "weights.txt"]


def test_an_entry_that_lost_its_record_is_built_again(empty_cache: Path) -> None:
    folder = cached("toy", "model", {"width": 4}, _write)
    (folder / "cache.json").unlink()  # deleted by hand, or a copy cut short
    assert cached("toy", "model", {"width": 4}, _write) == folder
    assert (folder / "cache.json").is_file()
