"""Experiment configs: one dataclass per method whose defaults are the `quick` profile.

A method's `Config` subclasses :class:`ExperimentConfig`, gives every field a paper default and a
docstring, and lists in ``PROFILES`` what the other profiles change::

    @dataclass
    class Config(ExperimentConfig):
        hidden_dim: int = 64
        \"\"\"width of every layer\"\"\"
        epochs: int = 20

        PROFILES: ClassVar[dict[str, dict[str, Any]]] = {"quick": {}, "full": {"epochs": 200}}

        def __post_init__(self) -> None:
            super().__post_init__()
            require(self.hidden_dim >= 1, "hidden_dim", "an integer >= 1", self.hidden_dim)

    config = Config.from_profile("full", seed=3)
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import json
import math
import numbers
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

from mixlab.shared.claims import ClaimSpec, judge
from mixlab.shared.device import check_device_name

if TYPE_CHECKING:
    from mixlab.shared.claims import Claim

PROFILE_NAMES = ("quick", "full")


def is_count(value: object, minimum: int = 1) -> bool:
    """True for an integer (Python or NumPy, not bool) that is at least ``minimum``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum


def is_number(value: object) -> bool:
    """True for a finite real number (Python or NumPy, not bool)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def require(ok: bool, parameter: str, allowed: str, got: object) -> None:
    """Raise ``ValueError("<parameter> must be <allowed>, got <got>")`` unless ``ok``."""
    if not ok:
        raise ValueError(f"{parameter} must be {allowed}, got {got!r}")


@dataclass
class ExperimentConfig:
    """Fields every experiment has. Subclass it; the dataclass defaults are the quick profile."""

    seed: int = 0
    """random seed for data, initialisation and training (the same seed gives the same metrics on CPU)"""
    device: str = "auto"
    """where to run: auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps"""
    profile: str = "quick"
    """the profile these values came from (quick: minutes on 2 CPU cores; full: closer to the paper)"""

    PROFILES: ClassVar[dict[str, dict[str, Any]]] = {"quick": {}, "full": {}}
    """per profile, the fields that differ from the dataclass defaults"""

    ALLOWED_EDGE_VALUES: ClassVar[dict[str, tuple[Any, ...]]] = {"seed": (0,)}
    """fields that document 0, -1, NaN or infinity as meaningful values (``{"weight_decay": (0.0,)}``).
    Every other float field must be finite (checked here) and every count field is range-checked by
    the subclass; a workspace test feeds each field these values and expects a ValueError."""

    SYSTEMS: ClassVar[tuple[str, ...]] = ()
    """the names of the systems the experiment runs (the method, its baselines and controls), as
    its claims' tests read them"""

    TIMINGS: ClassVar[tuple[str, ...]] = ()
    """metric names that measure wall time (``seconds``, ``train_s``): they move with the
    machine's load, so ``reproduce --compare`` reports them apart, never as drift"""

    CLAIMS: ClassVar[tuple[ClaimSpec, ...]] = ()
    """the claims, declared before any run: each names its system, its control among ``SYSTEMS``,
    its premises and its threshold's bounds (:class:`~mixlab.shared.claims.ClaimSpec`); the
    experiment judges each with :meth:`judge`"""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        keys = [spec.key for spec in cls.CLAIMS]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{cls.__qualname__}.CLAIMS: keys must be distinct, got {keys}")
        for spec in cls.CLAIMS:
            if not isinstance(spec, ClaimSpec):
                raise ValueError(f"{cls.__qualname__}.CLAIMS must hold ClaimSpecs, got {spec!r}")
            unknown = [s for s in (spec.system, *spec.controls) if s not in cls.SYSTEMS]
            if unknown:
                raise ValueError(
                    f"{cls.__qualname__}.CLAIMS[{spec.key!r}] names {unknown}, which are not "
                    f"among SYSTEMS {list(cls.SYSTEMS)}"
                )

    def __post_init__(self) -> None:
        self._check_finite_floats()
        require(
            isinstance(self.seed, int)
            and not isinstance(self.seed, bool)
            and 0 <= self.seed < 2**32,
            "seed",
            "an integer in [0, 2**32)",
            self.seed,
        )
        check_device_name(self.device)
        require(
            self.profile in self.PROFILES,
            "profile",
            f"one of {sorted(self.PROFILES)}",
            self.profile,
        )
        for spec in self.CLAIMS:  # a threshold no system could pass is an error before any work
            spec.check_bounds(self)

    def claim_spec(self, key: str) -> ClaimSpec:
        """The :class:`ClaimSpec` of ``CLAIMS`` called ``key``."""
        for spec in self.CLAIMS:
            if spec.key == key:
                return spec
        raise ValueError(f"claim key must be one of {[s.key for s in self.CLAIMS]}, got {key!r}")

    def judge(self, key: str, test: Callable[[str], Claim], **options: Any) -> Claim:
        """The verdict of the claim ``key``: ``test`` on its system and on its control, with its
        premises and bounds (:func:`mixlab.shared.claims.judge`; ``options`` go there) and its
        sentence filled from this config."""
        return judge(self.claim_spec(key), test, config=self, **options)

    def _check_finite_floats(self) -> None:
        """NaN and infinity make no sense in a float field unless the field says so."""
        allowed = self.allowed_edge_values()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, float) and not math.isfinite(value):
                if any(
                    isinstance(a, float) and _same_float(a, value)
                    for a in allowed.get(field.name, ())
                ):
                    continue
                raise ValueError(f"{field.name} must be a finite number, got {value!r}")

    @classmethod
    def allowed_edge_values(cls) -> dict[str, tuple[Any, ...]]:
        """``ALLOWED_EDGE_VALUES`` merged over the class and its bases."""
        merged: dict[str, tuple[Any, ...]] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("ALLOWED_EDGE_VALUES", {}))
        return merged

    @classmethod
    def from_profile(cls, profile: str = "quick", **overrides: Any) -> Self:
        """The config of ``profile`` with ``overrides`` applied on top (``seed=3``, ``device="cpu"``)."""
        require(profile in cls.PROFILES, "profile", f"one of {sorted(cls.PROFILES)}", profile)
        values = {**cls.PROFILES[profile], **overrides, "profile": profile}
        known = {f.name for f in dataclasses.fields(cls)}
        for name in values:
            require(name in known, "config field", f"one of {sorted(known)}", name)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON-ready values (this is what result.json records)."""
        return dataclasses.asdict(self)

    @classmethod
    def field_help(cls, profile: str = "quick") -> list[dict[str, str]]:
        """What ``mixlab run METHOD --help`` shows of each field: ``name``, ``type``,
        ``default`` (in ``profile``), ``profiles`` (where another profile differs), ``allowed``
        (the range the field's own check states, found by feeding it a value it must refuse) and
        ``doc`` (the field's docstring)."""
        require(profile in cls.PROFILES, "profile", f"one of {sorted(cls.PROFILES)}", profile)
        docs = _field_docs(cls)
        hints = typing.get_type_hints(cls)
        base = cls.from_profile(profile)
        # the other profiles' values as they declare them, unbuilt: building one may need an
        # optional extra this machine lacks (curvdiff's full profile reads QM9)
        declared = {
            f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            for f in dataclasses.fields(cls)
        }
        out = []
        for field in dataclasses.fields(cls):
            mine = _jsonish(getattr(base, field.name))
            others = {
                name: values.get(field.name, declared[field.name])
                for name, values in cls.PROFILES.items()
                if name != profile
                and field.name != "profile"
                and _jsonish(values.get(field.name, declared[field.name])) != mine
            }
            out.append(
                {
                    "name": field.name,
                    "type": _type_name(hints[field.name]),
                    "default": _shown(getattr(base, field.name)),
                    "profiles": ", ".join(f"{k}: {_shown(v)}" for k, v in others.items()),
                    "allowed": _allowed(base, field.name, hints[field.name]),
                    "doc": docs.get(field.name, ""),
                }
            )
        return out

    @classmethod
    def parse_overrides(cls, assignments: list[str]) -> dict[str, Any]:
        """Turn CLI ``--set field=value`` strings into typed values, checked against the fields.

        ``int``, ``float``, ``bool``, ``str`` and ``Literal`` fields parse as such; any other field
        type (lists, tuples, dicts) takes JSON, e.g. ``--set hidden_dims=[64,64]``.
        """
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        parsed: dict[str, Any] = {}
        for assignment in assignments:
            name, sep, text = assignment.partition("=")
            require(bool(sep) and bool(name), "--set", "of the form field=value", assignment)
            require(name in known, "--set field", f"one of {sorted(known)}", name)
            require(name != "profile", "--set field", "not 'profile' (use --profile)", name)
            parsed[name] = _parse_value(name, hints[name], text)
        return parsed


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field (PEP 257 attribute docstrings) of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (a frozen app): no docs
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _jsonish(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _shown(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | tuple | list | dict) else str(value)


_PROBES: dict[type, tuple[Any, ...]] = {
    int: (-1, 0, 10**12),
    float: (-1.0, 0.0, 1e12, math.nan),
    str: ("?",),
    tuple: ((), ("?",), (-1,)),
    list: ([], ["?"], [-1]),
}


def _allowed(config: ExperimentConfig, name: str, annotation: Any) -> str:
    """The range a field accepts, in the words of its own check: the ``<name> must be <allowed>``
    of the ValueError a value it must refuse raises ("" when no probe is refused)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return f"one of {list(typing.get_args(annotation))}"
    if annotation is bool:
        return "true or false"
    kinds = [annotation] if origin is None else [origin, *typing.get_args(annotation)]
    probes = [p for kind in kinds for p in _PROBES.get(kind, ())]
    prefix = f"{name} must be "
    for probe in probes:
        try:
            dataclasses.replace(config, **{name: probe})
        except (ValueError, TypeError) as error:
            message = str(error)
            if message.startswith(prefix):
                return message[len(prefix) :].rsplit(", got ", 1)[0]
    return ""


def _same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _parse_value(name: str, annotation: Any, text: str) -> Any:
    """Parse ``text`` as a value of type ``annotation``, or raise a ValueError naming the field."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if text.lower() in ("none", "null") and len(options) < len(typing.get_args(annotation)):
            return None
        if len(options) == 1:
            return _parse_value(name, options[0], text)
    if origin is typing.Literal:
        allowed = typing.get_args(annotation)
        for option in allowed:
            if str(option) == text:
                return option
        raise ValueError(f"--set {name} must be one of {list(allowed)}, got {text!r}")
    if annotation is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ValueError(f"--set {name} must be true or false, got {text!r}")
    if annotation in (int, float):
        try:
            return annotation(text)
        except ValueError:
            raise ValueError(f"--set {name} must be {annotation.__name__}, got {text!r}") from None
    if annotation is str:
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"--set {name} takes JSON for type {annotation}, got {text!r}") from None
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise ValueError(f"--set {name} takes a JSON list like [1, 2], got {text!r}")
        item_types = [t for t in typing.get_args(annotation) if t is not Ellipsis]
        if len(set(item_types)) == 1 and item_types[0] in (int, float):
            allowed = (int,) if item_types[0] is int else (int, float)
            if not all(isinstance(item, allowed) and not isinstance(item, bool) for item in value):
                raise ValueError(
                    f"--set {name} takes a list of {item_types[0].__name__}, got {text!r}"
                )
        return tuple(value) if origin is tuple else value
    return value


__all__ = ["PROFILE_NAMES", "ExperimentConfig", "is_count", "require"]
