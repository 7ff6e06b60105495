"""Claims that can fail and can hold: controls, premises, bounds and per-seed judgement."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from mixlab.shared import Claim, ClaimSpec, ExperimentConfig, Result, judge
from mixlab.shared.claims import claim_state, control_outcome, student_t_sf, where_run

# one number per system and seed: "ours" beats "theirs" on every seed, "simple" on two of three
ACCURACY = {
    "ours": [0.90, 0.92, 0.91],
    "simple": [0.88, 0.80, 0.89],
    "theirs": [0.85, 0.86, 0.84],
    "chance": [0.50, 0.50, 0.50],
}


def spec(**changes) -> ClaimSpec:
    fields = {
        "key": "beats_theirs",
        "text": "ours beats theirs on every seed",
        "system": "ours",
        "control": "simple",
        "why_control": "the same model without the idea",
    }
    return ClaimSpec(**{**fields, **changes})


def beats(reference: str):
    def test(system: str) -> Claim:
        return Claim.worst_seed(system, ACCURACY[system], ">", ACCURACY[reference])

    return test


def test_a_claim_the_control_also_passes_is_vacuous() -> None:
    claim = judge(spec(control="theirs"), beats("chance"))  # theirs beats chance too
    assert (claim.holds, claim.state) == (True, "vacuous")
    assert claim.control is not None
    assert claim.control.holds
    assert control_outcome(claim.to_dict()).startswith("theirs passes too (worst of 3 seeds")


def test_a_claim_its_control_fails_holds() -> None:
    claim = judge(spec(), beats("theirs"))  # simple loses to theirs on seed 1
    assert claim.state == "holds"
    assert claim.control is not None
    assert claim.control.evidence == ("worst of 3 seeds (seed 1): 0.8 > 0.86; 2 of 3 seeds hold")
    assert claim.text == "ours beats theirs on every seed"  # the spec's sentence, not the test's
    assert claim.key == "beats_theirs"


def test_several_controls_make_a_claim_vacuous_when_any_of_them_passes() -> None:
    # simple misses theirs on seed 1, chance never beats it: both controls fail, the claim holds
    claim = judge(spec(also_controls=("chance",)), beats("theirs"))
    assert claim.state == "holds"
    assert claim.control is not None
    assert claim.control.system == "simple and chance"
    assert claim.control.evidence.startswith("simple: worst of 3 seeds")
    assert "; chance: worst of 3 seeds" in claim.control.evidence
    # theirs beats chance on every seed: one passing control is enough for vacuous
    vacuous = judge(spec(control="chance", also_controls=("theirs",)), beats("chance"))
    assert (vacuous.holds, vacuous.state) == (True, "vacuous")
    with pytest.raises(ValueError, match="control and also_controls must be distinct"):
        spec(also_controls=("simple",))
    with pytest.raises(ValueError, match="control and also_controls must be distinct"):
        spec(also_controls=("ours",))
    with pytest.raises(ValueError, match="also_controls must be a tuple"):
        spec(also_controls="chance")
    # a control that cannot be judged leaves the claim untested, unless another one passes

    def with_unjudged(system: str) -> Claim:
        if system == "chance":
            return Claim.not_run(system, "chance was not run")
        return beats("chance")(system)

    assert judge(spec(also_controls=("chance",)), with_unjudged).state == "vacuous"  # simple passes
    lonely = judge(spec(control="chance", also_controls=("theirs",)), beats("ours"))
    assert lonely.state == "fails"


def test_a_failing_claim_fails_whatever_the_control_does() -> None:
    claim = judge(spec(control="theirs"), beats("ours"))
    assert claim.state == "fails"


def test_a_failed_premise_makes_the_claim_untested() -> None:
    learned = Claim.compare("theirs learned: above chance by 0.5", 0.85, ">=", 0.5 + 0.5)
    claim = judge(spec(premises=("learned",)), beats("theirs"), premises={"learned": learned})
    assert claim.holds is True  # still computed
    assert claim.state == "untested"
    assert "theirs learned: above chance by 0.5 does not hold (0.85 >= 1)" in claim.evidence
    assert claim.premises == (learned,)
    held = Claim.compare("theirs learned", 0.85, ">=", 0.6)
    assert (
        judge(spec(premises=("learned",)), beats("theirs"), premises={"learned": held}).state
        == "holds"
    )


def test_premises_must_match_the_declaration() -> None:
    with pytest.raises(ValueError, match="declares the premises"):
        judge(spec(premises=("learned",)), beats("theirs"))
    with pytest.raises(ValueError, match="declares the premises"):
        judge(spec(), beats("theirs"), premises={"extra": Claim.compare("x", 1, ">", 0)})


def test_a_control_without_metrics_is_an_error() -> None:
    with pytest.raises(ValueError, match="control 'missing' has no metrics"):
        judge(spec(control="missing"), beats("theirs"))


def test_an_untestable_control_leaves_the_claim_untested() -> None:
    def test(system: str) -> Claim:
        return Claim.paired(system, [0.1, 0.12, 0.11] if system == "ours" else [0.3], label="gain")

    claim = judge(spec(), test)
    assert claim.state == "untested"
    assert "the control simple could not be judged" in claim.evidence


def test_a_claim_on_plain_numbers_must_say_why_it_needs_no_seeds() -> None:
    def on_means(system: str) -> Claim:
        mean = sum(ACCURACY[system]) / 3
        return Claim.compare(system, mean, ">", sum(ACCURACY["theirs"]) / 3)

    with pytest.raises(ValueError, match="must be judged seed by seed"):
        judge(spec(), on_means)
    exact = spec(not_per_seed="a byte count: no seed enters it")
    claim = judge(exact, on_means)
    assert claim.state == "vacuous"  # on means, simple (0.857) beats theirs (0.85) as well
    assert judge(spec(), beats("theirs")).state == "holds"  # seed by seed it does not
    assert claim.to_dict()["not_per_seed"] == "a byte count: no seed enters it"


def test_worst_seed_needs_every_seed() -> None:
    claim = Claim.worst_seed("x", [0.9, 0.7, 0.95], ">", 0.8, seeds=[3, 4, 5], value_label="acc")
    assert claim.holds is False
    assert claim.evidence == "worst of 3 seeds (seed 4): acc 0.7 > 0.8; 2 of 3 seeds hold"
    assert Claim.worst_seed("x", [0.9, 0.85], ">", [0.8, 0.84]).holds is True
    assert Claim.worst_seed("x", [0.9, float("nan")], ">", 0.8).holds is False
    assert Claim.worst_seed("x", [0.9], ">", 0.8).evidence == "0.9 > 0.8"  # one seed: plain
    with pytest.raises(ValueError, match="one number per seed"):
        Claim.worst_seed("x", [0.9, 0.8], ">", [0.8])


def test_paired_is_a_one_sided_t_test() -> None:
    clear = Claim.paired("ours beats theirs", [0.05, 0.07, 0.09], 0.0, label="ours − theirs")
    assert clear.holds is True
    assert clear.per_seed
    assert "mean 0.07 ± sd 0.02 over 3 seeds > 0, one-sided paired t = 6.062" in clear.evidence
    assert Claim.paired("x", [0.05, -0.04, 0.09], 0.0, label="d").holds is False  # within noise
    assert Claim.paired("x", [0.05, 0.07, 0.09], 0.06, label="d").holds is False
    assert Claim.paired("x", [0.0, 0.0, 0.0], 0.0, label="d").holds is False  # a system vs itself
    assert Claim.paired("x", [0.1, 0.1, 0.1], 0.0, label="d").holds is True
    one = Claim.paired("x", [0.5], 0.0, label="d")
    assert (one.holds, one.state) == (False, "untested")  # one seed has no spread


def test_student_t_tail_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 8, 29):
        for t in (-3.1, -0.4, 0.0, 0.7, 2.0, 6.5):
            assert student_t_sf(t, df) == pytest.approx(stats.t.sf(t, df), rel=1e-9, abs=1e-12)


def test_a_threshold_outside_the_floor_and_ceiling_raises_before_any_work() -> None:
    @dataclass
    class Config(ExperimentConfig):
        cells_needed: int = 400
        SYSTEMS: ClassVar = ("rff", "rnd")
        CLAIMS: ClassVar = (
            ClaimSpec(
                key="covers",
                text="RFF visits at least {cells_needed} cells",
                system="rff",
                control="rnd",
                why_control="the plain RND bonus",
                threshold="cells_needed",
                floor=0,
                ceiling=453,  # the maze has 453 cells
            ),
        )

    assert Config().claim_spec("covers").threshold_value(Config()) == 400
    with pytest.raises(
        ValueError, match="cells_needed must lie strictly between the floor 0 and the ceiling 453"
    ):
        Config(cells_needed=482)
    with pytest.raises(ValueError, match="cells_needed must lie strictly between"):
        Config(cells_needed=0)


def test_a_threshold_outside_measured_bounds_makes_the_claim_untested() -> None:
    claim = judge(spec(threshold=0.95), beats("theirs"), floor=0.5, ceiling=0.93)
    assert claim.state == "untested"
    assert "floor 0.5 < threshold 0.95 < ceiling 0.93" in claim.evidence
    inside = judge(spec(threshold=0.9), beats("theirs"), floor=0.5, ceiling=0.93)
    assert inside.state == "holds"
    with pytest.raises(ValueError, match="need a threshold"):
        judge(spec(), beats("theirs"), floor=0.5)


def test_configs_check_their_declarations() -> None:
    with pytest.raises(ValueError, match="not among SYSTEMS"):

        @dataclass
        class Unknown(ExperimentConfig):
            SYSTEMS: ClassVar = ("ours",)
            CLAIMS: ClassVar = (spec(),)

    with pytest.raises(ValueError, match="keys must be distinct"):

        @dataclass
        class Twice(ExperimentConfig):
            SYSTEMS: ClassVar = ("ours", "simple")
            CLAIMS: ClassVar = (spec(), spec())

    with pytest.raises(ValueError, match="control and also_controls must be distinct systems"):
        spec(control="ours")
    with pytest.raises(ValueError, match="why_control must be a non-empty"):
        spec(why_control=" ")


def test_the_sentence_is_filled_from_the_config() -> None:
    @dataclass
    class Config(ExperimentConfig):
        margin: float = 0.05
        SYSTEMS: ClassVar = ("ours", "simple")
        CLAIMS: ClassVar = (spec(text="ours beats theirs by {margin:.0%} on {n_seeds} seeds"),)

    claim = Config().judge("beats_theirs", beats("theirs"), text_values={"n_seeds": 3})
    assert claim.text == "ours beats theirs by 5% on 3 seeds"
    with pytest.raises(ValueError, match="claim key must be one of"):
        Config().judge("nope", beats("theirs"))


def test_result_json_records_the_state_control_and_premises(tmp_path: Path) -> None:
    learned = Claim.compare("theirs learned", 0.85, ">=", 0.6)
    claims = [
        judge(spec(control="theirs"), beats("chance")),
        judge(
            spec(key="premised", premises=("learned",)),
            beats("theirs"),
            premises={"learned": learned},
        ),
    ]
    result = Result(metrics={"ours": {"acc": 0.91}, "theirs": {"acc": 0.85}}, claims=claims)
    assert result.tally() == {"holds": 1, "fails": 0, "untested": 0, "vacuous": 1}
    assert not result.all_claims_hold
    data = json.loads(result.write(tmp_path).read_text())
    first, second = data["claims"]
    assert (first["state"], first["control"]["system"], first["control"]["holds"]) == (
        "vacuous",
        "theirs",
        True,
    )
    assert first["per_seed"] is True
    assert second["premises"] == [learned.to_dict()]
    assert Result.load(tmp_path) == result


def test_older_files_load_with_derived_states(tmp_path: Path) -> None:
    old = {
        "method": "m", "profile": "quick", "seed": 0, "config": {}, "env": {}, "wall_s": 1.0,
        "metrics": {"a": {"x": 1.0}},
        "claims": [
            {"text": "c", "holds": True, "tested": True, "evidence": "1 > 0"},
            {"text": "d", "holds": True, "tested": False, "evidence": "1 > 0 (untested: x)"},
            {"text": "e", "holds": False, "evidence": "0 > 1"},
        ],
    }  # fmt: skip
    (tmp_path / "result.json").write_text(json.dumps(old))
    loaded = Result.load(tmp_path)
    assert [claim.state for claim in loaded.claims] == ["holds", "untested", "fails"]
    assert [claim_state(claim) for claim in old["claims"]] == ["holds", "untested", "fails"]
    old["claims"][0]["state"] = "vacuous"  # a state its outcomes do not give: edited by hand
    (tmp_path / "result.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="says its state is 'vacuous'"):
        Result.load(tmp_path)


def test_a_claim_the_run_cannot_compute_is_untested_for_any_system() -> None:
    claim = judge(spec(), lambda system: Claim.not_run(system, "the run has no molecules"))
    assert claim.state == "untested"
    assert claim.evidence == "not run (untested: the run has no molecules)"


def test_where_run_leaves_a_claim_untested_when_the_run_lacks_its_control() -> None:
    claim = judge(spec(), where_run(beats("theirs"), ["ours", "theirs"], "theirs"))
    assert claim.state == "untested"
    assert "the run has no simple" in claim.control.evidence
    assert judge(spec(), where_run(beats("theirs"), ACCURACY, "theirs")).state == "holds"
