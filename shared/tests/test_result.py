import json
import math
from pathlib import Path

import numpy as np
import pytest

from mixlab.shared import Claim, Result


def test_compare_computes_holds_and_evidence() -> None:
    claim = Claim.compare(
        "ours is lower", 0.08, "<", 0.81, value_label="ours", reference_label="Q-learning"
    )
    assert claim.holds is True
    assert claim.evidence == "ours 0.08 < Q-learning 0.81"
    assert Claim.compare("ours is lower", 0.9, "<", 0.81).holds is False
    assert Claim.compare("at least", 2, ">=", 2).holds is True


def test_a_diverged_number_never_makes_a_claim_hold() -> None:
    assert Claim.compare("lower", math.nan, "<", 1.0).holds is False
    assert Claim.compare("higher", math.inf, ">", 1.0).holds is False


def test_all_of_needs_every_part() -> None:
    parts = [Claim.compare("a", 1, "<", 2), Claim.compare("b", 3, "<", 2)]
    combined = Claim.all_of("both", parts)
    assert combined.holds is False
    assert combined.evidence == "1 < 2; 3 < 2"


def test_claims_must_be_computed() -> None:
    with pytest.raises(ValueError, match="holds must be a bool"):
        Claim(text="x", holds="yes", evidence="")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="op must be one of"):
        Claim.compare("x", 1, "==", 1)  # type: ignore[arg-type]


def test_metric_rows_share_keys() -> None:
    with pytest.raises(ValueError, match="rows must share their keys"):
        Result(metrics={"ours": {"acc": 1.0}, "base": {"loss": 2.0}}, claims=[])
    with pytest.raises(ValueError, match="must be a number"):
        Result(metrics={"ours": {"acc": "high"}}, claims=[])


def test_non_finite_metrics_are_written_as_null(tmp_path: Path) -> None:
    result = Result(
        metrics={"ours": {"loss": np.float32(0.5)}, "base": {"loss": float("nan")}}, claims=[]
    )
    path = result.write(tmp_path)
    data = json.loads(path.read_text())
    assert data["metrics"] == {"ours": {"loss": 0.5}, "base": {"loss": None}}


def test_round_trip(tmp_path: Path) -> None:
    claim = Claim.compare("lower", 1.0, "<", 2.0)
    result = Result(
        metrics={"a": {"x": 1.0}, "b": {"x": 2.0}},
        claims=[claim],
        method="m",
        profile="quick",
        seed=0,
    )
    loaded = Result.load(result.write(tmp_path))
    assert loaded == result


def test_load_rejects_other_json(tmp_path: Path) -> None:
    (tmp_path / "result.json").write_text('{"metrics": {}}')
    with pytest.raises(ValueError, match="missing"):
        Result.load(tmp_path)


def test_write_benchmark_writes_the_schema_and_prints_verdicts(tmp_path, capsys):
    import time

    from mixlab.shared.result import write_benchmark

    claims = [Claim.compare("fast", 2.0, ">", 1.0), Claim.compare("small", 3.0, "<", 1.0)]
    result = write_benchmark(
        tmp_path,
        method="toy-benchmark",
        metrics={"a": {"speed": 2.0}, "b": {"speed": 1.0}},
        claims=claims,
        config={"n": 3},
        started=time.perf_counter(),
    )
    saved = Result.load(tmp_path)
    assert saved.method == "toy-benchmark"
    assert saved.profile == "default"
    assert saved.config == {"n": 3}
    assert saved.env["device"] == "cpu"
    assert result.wall_s is not None
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "holds: fast (2 > 1)"
    assert printed[1].startswith("fails: small")
    assert printed[2] == f"wrote {tmp_path / 'result.json'}"


def test_a_failed_regime_check_marks_every_claim_untested(tmp_path: Path) -> None:
    claims = [Claim.compare("ours wins", 0.9, ">", 0.8), Claim.compare("ours is cheap", 3, "<", 1)]
    learned = Claim.compare("the reference beats chance by 0.2", 0.35, ">=", 0.33 + 0.2)
    result = Result(metrics={"ours": {"acc": 0.9}}, claims=claims, regime=[learned])
    assert [claim.state for claim in result.claims] == ["untested", "untested"]
    assert [claim.holds for claim in result.claims] == [True, False]  # still computed
    assert "regime check failed: the reference beats chance" in result.claims[0].evidence
    assert result.tally() == {"holds": 0, "fails": 0, "untested": 2, "vacuous": 0}
    data = json.loads(result.write(tmp_path).read_text())
    assert data["regime"] == [learned.to_dict()]
    assert [claim["tested"] for claim in data["claims"]] == [False, False]
    assert Result.load(tmp_path).claims == result.claims  # loading does not mark them twice


def test_a_passing_regime_keeps_claims_tested() -> None:
    learned = Claim.compare("learned", 0.9, ">=", 0.8)
    result = Result(
        metrics={"ours": {"acc": 0.9}},
        claims=[Claim.compare("wins", 2, ">", 1), Claim.compare("loses", 0, ">", 1)],
        regime=[learned],
    )
    assert [claim.state for claim in result.claims] == ["holds", "fails"]
    assert result.regime_holds


def test_requires_gates_one_claim_only() -> None:
    dqn_learned = Claim.compare("DQN learned", 0.1, ">=", 0.5)
    gated = Claim.compare("DQN colludes", 0.9, ">", 0.5, requires=[dqn_learned])
    free = Claim.compare("Q-learning colludes", 0.9, ">", 0.5)
    assert (gated.state, free.state) == ("untested", "holds")
    assert "DQN learned does not hold (0.1 >= 0.5)" in gated.evidence
    combined = Claim.all_of("both", [gated, free])
    assert combined.state == "untested"


def test_results_written_before_regime_existed_still_load(tmp_path: Path) -> None:
    old = {
        "method": "m", "profile": "quick", "seed": 0, "config": {}, "env": {}, "wall_s": 1.0,
        "metrics": {"a": {"x": 1.0}},
        "claims": [{"text": "c", "holds": True, "evidence": "1 > 0"}],
    }  # fmt: skip
    (tmp_path / "result.json").write_text(json.dumps(old))
    loaded = Result.load(tmp_path)
    assert (loaded.regime, loaded.claims[0].state) == ([], "holds")


def test_a_scoped_regime_check_gates_only_its_claims(tmp_path: Path) -> None:
    theory = Claim.compare("exact theory holds", 1e-12, "<", 1e-8)
    trained = Claim.compare("ours beats GCN at the largest ring", 0.9, ">", 0.5)
    budget = Claim.compare("GCN fits the smallest ring", 0.4, ">=", 0.9).gating(trained)
    result = Result(metrics={"a": {"x": 1.0}}, claims=[theory, trained], regime=[budget])
    assert [claim.state for claim in result.claims] == ["holds", "untested"]
    data = json.loads(result.write(tmp_path).read_text())
    assert data["regime"][0]["gates"] == ["ours beats GCN at the largest ring"]
    assert Result.load(tmp_path).regime == [budget]
    with pytest.raises(ValueError, match="gates claims that are not here"):
        Result(metrics={"a": {"x": 1.0}}, claims=[theory], regime=[budget])


def test_compare_reports_wall_times_apart_from_drift() -> None:
    from mixlab.shared.compare import compare_results

    committed = {"metrics": {"a": {"acc": 0.5, "seconds": 2.0, "train_s": 1.0}}, "claims": []}
    fresh = {"metrics": {"a": {"acc": 0.5, "seconds": 6.0, "train_s": 1.0}}, "claims": []}
    comparison = compare_results(committed, fresh, tolerance=1e-6, timings=("seconds", "train_s"))
    assert comparison["drifted_metrics"] == []  # the run reproduces: only a wall time moved
    assert [m["metric"] for m in comparison["moved_timings"]] == ["seconds"]
    fresh["metrics"]["a"]["acc"] = 0.5 + 1e-5
    drifted = compare_results(committed, fresh, tolerance=1e-6, timings=("seconds",))
    assert [m["metric"] for m in drifted["drifted_metrics"]] == ["acc"]
    undeclared = compare_results(committed, fresh, tolerance=1e-6)  # no timings declared
    assert [m["metric"] for m in undeclared["drifted_metrics"]] == ["seconds", "acc"]
