import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pytest

from mixlab.shared import ExperimentConfig


@dataclass
class Config(ExperimentConfig):
    epochs: int = 2
    lr: float = 0.1
    norm: Literal["layer", "batch"] = "layer"
    use_bias: bool = True
    widths: tuple[int, ...] = (8, 8)
    limit: int | None = None

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {"quick": {}, "full": {"epochs": 50}}


def test_profiles_override_the_quick_defaults() -> None:
    assert Config.from_profile("quick").epochs == 2
    full = Config.from_profile("full", seed=4)
    assert (full.epochs, full.seed, full.profile) == (50, 4, "full")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"profile": "huge"}, "profile must be one of"),
        ({"seed": -1}, "seed must be an integer"),
        ({"seed": True}, "seed must be an integer"),
        ({"device": "tpu"}, "device must be one of"),
    ],
)
def test_bad_values_name_the_parameter(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config(**kwargs)


def test_unknown_field_is_named() -> None:
    with pytest.raises(ValueError, match="config field must be one of .*'epochs'.* got 'epoch'"):
        Config.from_profile("quick", epoch=3)


def test_overrides_parse_by_field_type() -> None:
    parsed = Config.parse_overrides(
        ["epochs=7", "lr=1e-3", "norm=batch", "use_bias=false", "widths=[4,4,4]", "limit=none"]
    )
    assert parsed == {
        "epochs": 7,
        "lr": 1e-3,
        "norm": "batch",
        "use_bias": False,
        "widths": (4, 4, 4),
        "limit": None,
    }
    assert Config.parse_overrides(["limit=5"]) == {"limit": 5}


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("epochs", "of the form field=value"),
        ("epochs=two", "--set epochs must be int"),
        ("norm=group", r"--set norm must be one of \['layer', 'batch'\]"),
        ("use_bias=maybe", "true or false"),
        ("nope=1", "--set field must be one of"),
        ("profile=full", "use --profile"),
        ("widths=4", "takes a JSON list"),
        ('widths=[4, "a"]', "takes a list of int"),
    ],
)
def test_bad_overrides_are_named(assignment: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Config.parse_overrides([assignment])


def test_to_dict_is_json_ready() -> None:
    restored = json.loads(json.dumps(Config(limit=3).to_dict()))
    assert restored["widths"] == [8, 8]
    assert (restored["profile"], restored["limit"]) == ("quick", 3)
