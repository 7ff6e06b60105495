"""Claims that can fail and can hold (DESIGN.md, "Claims that can fail and can hold").

A verdict is worth publishing only if it could have come out the other way. So a claim is declared
on the experiment's Config before any run, as a :class:`ClaimSpec`: the sentence, the system it is
about, its **control** (the strongest simple system without the method's idea), the **premises**
the paper's argument assumes, and optionally the threshold with the **floor and ceiling** of its
metric. The experiment then judges it with :meth:`ExperimentConfig.judge` (or :func:`judge`) and a
test written once for any system::

    # config.py
    SYSTEMS = ("rtn", "gptq", "mobiquant")
    CLAIMS = (
        ClaimSpec(
            key="within_gptq",
            text="MoBiQuant at 4 bits is within {within:.0%} of GPTQ's perplexity",
            system="mobiquant",
            control="rtn",
            why_control="round-to-nearest at the same bits: no calibration, no slices, no router",
        ),
    )

    # experiment.py: the test reads any system's per-seed numbers
    def within_gptq(system: str) -> Claim:
        return Claim.worst_seed(system, ppl4[system], "<=", [1.05 * p for p in ppl4["gptq"]])

    claim = config.judge("within_gptq", within_gptq)

:func:`judge` runs the test on the method's system and again with the control in its place, and
the claim ends in one of four states (:attr:`Claim.state`):

- **holds**: tested, the numbers say yes, and the control does not pass the same test;
- **fails**: tested, and the numbers say no;
- **untested**: a premise or a regime check failed, or the control could not be judged: the setup
  is what needs fixing, not the verdict;
- **vacuous**: it holds, but so does the control: the hold does not measure the method's idea.

Seeds: a claim whose spec does not say why it needs no seeds (``not_per_seed``) must be judged seed
by seed, with :meth:`Claim.worst_seed` (every seed must pass) or :meth:`Claim.paired` (a one-sided
paired t-test over seeds), never on a mean alone; :func:`judge` refuses a test that compares plain
numbers for such a claim.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Self

Comparison = Literal["<", "<=", ">", ">="]
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
CLAIM_STATES = ("holds", "fails", "untested", "vacuous")
"""the four states of a claim, in the order tables count them"""
PAIRED_ALPHA = 0.05
"""the level of :meth:`Claim.paired`'s one-sided test"""


def format_number(value: float | None) -> str:
    """Four significant digits, the way numbers appear in evidence strings and tables."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return str(value)
    return f"{value:.4g}"


@dataclass(frozen=True)
class Control:
    """The claim's test run again with the control system in the method's place."""

    system: str
    holds: bool
    tested: bool
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "holds": self.holds,
            "tested": self.tested,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Claim:
    """One sentence of the paper's claim, whether it held in this run, and the numbers that say so.

    Build claims from measured metrics, never by hand: :meth:`compare`, :meth:`worst_seed`,
    :meth:`paired` and :meth:`all_of` for the test, :func:`judge` for the verdict with its control
    and premises. Regime checks are claims too (built with :meth:`compare`), without a control.
    """

    text: str
    holds: bool
    evidence: str
    tested: bool = True
    """False when the setup could not test the claim (a regime check or a premise failed)"""
    gates: tuple[str, ...] = ()
    """for a regime check: the texts of the claims it gates (empty: every claim); see :meth:`gating`"""
    key: str = ""
    """the :class:`ClaimSpec` this claim was judged from (empty for regime checks and parts)"""
    control: Control | None = None
    """the same test with the control system in the method's place (set by :func:`judge`)"""
    premises: tuple[Claim, ...] = ()
    """the checks this claim assumes, with their outcomes; one that fails makes it untested"""
    per_seed: bool = False
    """True when judged seed by seed (:meth:`worst_seed`, :meth:`paired`)"""
    not_per_seed: str = ""
    """why the claim needs no per-seed judgement (from its :class:`ClaimSpec`)"""

    def __post_init__(self) -> None:
        for name in ("holds", "tested", "per_seed"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"Claim.{name} must be a bool computed from metrics, got {getattr(self, name)!r}"
                )
        if not self.text.strip():
            raise ValueError("Claim.text must be a non-empty sentence")
        object.__setattr__(self, "gates", tuple(self.gates))
        object.__setattr__(self, "premises", tuple(self.premises))

    @property
    def state(self) -> str:
        """``"holds"``, ``"fails"``, ``"untested"`` or ``"vacuous"`` (holds, and so does the
        control)."""
        if not self.tested:
            return "untested"
        if not self.holds:
            return "fails"
        if self.control is not None and self.control.holds:
            return "vacuous"
        return "holds"

    def gating(self, *claims: Claim) -> Self:
        """This regime check, gating only ``claims`` (a check of the training budget gates the
        claims about trained systems, not a claim about exact theory)."""
        if not claims:
            raise ValueError("gating needs at least one claim")
        return replace(self, gates=tuple(claim.text for claim in claims))

    def untested(self, reason: str) -> Self:
        """This claim marked untested, with ``reason`` appended to its evidence."""
        return replace(self, tested=False, evidence=f"{self.evidence} (untested: {reason})")

    def _gated(self, requires: Sequence[Claim]) -> Self:
        """This claim with ``requires`` recorded as premises; untested when one does not hold."""
        if not requires:
            return self
        claim = replace(self, premises=(*self.premises, *requires))
        failed = [check for check in requires if not check.holds]
        if not failed:
            return claim
        reason = "; ".join(f"{check.text} does not hold ({check.evidence})" for check in failed)
        return claim.untested(reason)

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
        requires: Sequence[Claim] = (),
    ) -> Self:
        """``value op reference``, e.g. ``Claim.compare(text, ours_error, "<", baseline_error)``.

        A non-finite number (a diverged run) makes the claim not hold. ``requires``: checks this
        claim alone depends on (recorded as its premises); when one does not hold the claim is
        untested. One number against another says nothing about seeds: for a claim that depends
        on the seed, use :meth:`worst_seed` or :meth:`paired`.
        """
        _check_op(op)
        value, reference = float(value), float(reference)
        left = f"{value_label} {format_number(value)}".strip()
        right = f"{reference_label} {format_number(reference)}".strip()
        claim = cls(text=text, holds=_passes(value, op, reference), evidence=f"{left} {op} {right}")
        return claim._gated(requires)

    @classmethod
    def worst_seed(
        cls,
        text: str,
        values: Sequence[float],
        op: Comparison,
        references: Sequence[float] | float,
        *,
        seeds: Sequence[int] | None = None,
        value_label: str = "",
        reference_label: str = "",
        requires: Sequence[Claim] = (),
    ) -> Self:
        """``values[i] op references[i]`` on every seed (DESIGN.md rule 4: judged on the worst
        seed, never on the mean). ``references``: one number per seed, paired by seed, or one
        number for all. The evidence shows the seed with the smallest margin and how many held."""
        _check_op(op)
        values = [float(v) for v in values]
        if not values:
            raise ValueError("worst_seed needs at least one seed's value")
        if isinstance(references, numbers.Real):
            references = [float(references)] * len(values)
        else:  # one per seed: a list, a NumPy array or a tensor
            references = [float(r) for r in references]
            if len(references) != len(values):
                raise ValueError(
                    f"references must hold one number per seed ({len(values)}), got {len(references)}"
                )
        seeds = list(seeds) if seeds is not None else list(range(len(values)))
        if len(seeds) != len(values):
            raise ValueError(f"seeds must name {len(values)} seeds, got {seeds!r}")
        margins = [_margin(v, op, r) for v, r in zip(values, references, strict=True)]
        worst = min(range(len(values)), key=lambda i: margins[i])
        held = sum(_passes(v, op, r) for v, r in zip(values, references, strict=True))
        left = f"{value_label} {format_number(values[worst])}".strip()
        right = f"{reference_label} {format_number(references[worst])}".strip()
        evidence = f"{left} {op} {right}"
        if len(values) > 1:
            evidence = (
                f"worst of {len(values)} seeds (seed {seeds[worst]}): {evidence}; "
                f"{held} of {len(values)} seeds hold"
            )
        claim = cls(text=text, holds=held == len(values), evidence=evidence, per_seed=True)
        return claim._gated(requires)

    @classmethod
    def paired(
        cls,
        text: str,
        differences: Sequence[float],
        threshold: float = 0.0,
        *,
        label: str,
        alpha: float = PAIRED_ALPHA,
        requires: Sequence[Claim] = (),
    ) -> Self:
        """A one-sided paired t-test over seeds: the mean of ``differences`` (the method minus the
        reference on the same seed, signed so that larger is better) exceeds ``threshold`` at level
        ``alpha``. One seed has no spread to test against: the claim is untested."""
        values = [float(v) for v in differences]
        if not values:
            raise ValueError("paired needs at least one seed's difference")
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
        n = len(values)
        if not all(math.isfinite(v) for v in values):
            claim = cls(text, False, f"{label}: a diverged seed ({values})", per_seed=True)
            return claim._gated(requires)
        mean = sum(values) / n
        if n < 2:
            claim = cls(
                text, False, f"{label} {format_number(mean)} on one seed", per_seed=True
            ).untested("one seed: no spread over seeds to test against")
            return claim._gated(requires)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        if sd > 0:
            t = (mean - threshold) / (sd / math.sqrt(n))
        else:  # every seed gives the same difference: it clears the threshold or it does not
            t = math.inf if mean > threshold else -math.inf
        p = student_t_sf(t, n - 1) if math.isfinite(t) else (0.0 if t > 0 else 1.0)
        evidence = (
            f"{label}: mean {format_number(mean)} ± sd {format_number(sd)} over {n} seeds "
            f"> {format_number(threshold)}, one-sided paired t = {format_number(t)}, "
            f"p = {format_number(p)} < {alpha:g}"
        )
        return cls(text, bool(p < alpha), evidence, per_seed=True)._gated(requires)

    @classmethod
    def not_run(cls, text: str, reason: str) -> Self:
        """The test of a claim this run cannot compute (a system or data set it does not run):
        untested with ``reason``. It counts as judged per seed, so :func:`judge` accepts it for
        any claim; once the run has the numbers, the claim is judged seed by seed."""
        return cls(text=text, holds=False, evidence="not run", per_seed=True).untested(reason)

    @classmethod
    def all_of(cls, text: str, parts: Sequence[Claim], *, requires: Sequence[Claim] = ()) -> Self:
        """A claim that holds when every part holds; the evidence lists the parts'. It is tested
        only when every part is and every check in ``requires`` holds; judged per seed when every
        part is."""
        if not parts:
            raise ValueError("Claim.all_of needs at least one part")
        claim = cls(
            text=text,
            holds=all(p.holds for p in parts),
            evidence="; ".join(p.evidence for p in parts),
            tested=all(p.tested for p in parts),
            premises=tuple(premise for p in parts for premise in p.premises),
            per_seed=all(p.per_seed for p in parts),
        )
        return claim._gated(requires)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"text": self.text}
        if self.key:
            data["key"] = self.key
        data |= {
            "state": self.state,
            "holds": self.holds,
            "tested": self.tested,
            "evidence": self.evidence,
        }
        if self.control is not None:
            data["control"] = self.control.to_dict()
        if self.premises:
            data["premises"] = [premise.to_dict() for premise in self.premises]
        if self.key:
            data["per_seed"] = self.per_seed
            if self.not_per_seed:
                data["not_per_seed"] = self.not_per_seed
        if self.gates:
            data["gates"] = list(self.gates)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """A claim as :meth:`to_dict` wrote it. Files written before ``tested``, ``control`` or
        ``state`` existed load with the state derived from ``holds`` and ``tested``; a stored
        state that disagrees with the stored outcomes is an error."""
        fields = dict(data)
        stored_state = fields.pop("state", None)
        control = fields.pop("control", None)
        if control is not None:
            fields["control"] = Control(**control)
        fields["premises"] = tuple(cls.from_dict(p) for p in fields.pop("premises", ()))
        claim = cls(**fields)
        if stored_state is not None and stored_state != claim.state:
            raise ValueError(
                f"claim {claim.text!r} says its state is {stored_state!r}, but its outcomes give "
                f"{claim.state!r}"
            )
        return claim


def where_run(
    test: Callable[[str], Claim], systems: Iterable[str], *needed: str
) -> Callable[[str], Claim]:
    """``test``, not run (untested, with the reason) for a system, or a reference in ``needed``,
    that is not among the ``systems`` this run trains: a profile without the control leaves the
    claim untested instead of failing with a missing key."""
    run_here = set(systems)

    def checked(system: str) -> Claim:
        missing = [s for s in (system, *needed) if s not in run_here]
        if missing:
            return Claim.not_run(system, f"the run has no {', '.join(missing)}")
        return test(system)

    return checked


def tally(states: Iterable[str]) -> dict[str, int]:
    """How many claims are in each of the four states, in :data:`CLAIM_STATES` order."""
    states = list(states)
    return {state: states.count(state) for state in CLAIM_STATES}


def tally_text(counts: Mapping[str, int], *, skip_zero: bool = False) -> str:
    """``2 hold, 1 fail, 0 untested, 1 vacuous`` (a count missing from an older report is 0)."""
    words = {"holds": "hold", "fails": "fail", "untested": "untested", "vacuous": "vacuous"}
    return ", ".join(
        f"{counts.get(state, 0)} {words[state]}"
        for state in CLAIM_STATES
        if counts.get(state, 0) or not skip_zero
    )


def claim_state(claim: Mapping[str, Any]) -> str:
    """The state of a claim as result.json stores it: its ``state``, or for files written before
    states were stored, untested / holds / fails from ``tested`` and ``holds``."""
    if "state" in claim:
        return str(claim["state"])
    if not claim.get("tested", True):
        return "untested"
    return "holds" if claim.get("holds") else "fails"


def control_outcome(claim: Mapping[str, Any]) -> str:
    """The control's outcome in a few words (``"rtn passes too"``), "" when the claim has none."""
    control = claim.get("control")
    if not control:
        return ""
    if not control.get("tested", True):
        verdict = "could not be judged"
    else:
        verdict = "passes too" if control["holds"] else "fails"
    return f"{control['system']} {verdict} ({control['evidence']})"


@dataclass(frozen=True)
class ClaimSpec:
    """A claim as the experiment's Config declares it, before any run (``Config.CLAIMS``).

    ``text`` may name config fields in braces (``"within {within:.0%} of GPTQ"``), filled in when
    the claim is judged. ``system`` is the method's system the claim is about and ``control`` the
    strongest simple system that lacks the method's idea; both are among ``Config.SYSTEMS``.
    """

    key: str
    """a short identifier, unique in the Config (``"within_gptq"``)"""
    text: str
    """the sentence; ``{field}`` placeholders are filled from the config"""
    system: str
    """the method's system whose metrics the claim's test reads"""
    control: str
    """the system the test runs again in the method's place; if it passes too, the claim is vacuous"""
    why_control: str
    """why the control is the strongest simple system without the method's idea"""
    also_controls: tuple[str, ...] = ()
    """further controls the test runs on in the method's place (a Louvain-SBM *and* ER): the
    claim is vacuous when any of them passes too, untested when any cannot be judged"""
    premises: tuple[str, ...] = ()
    """keys of the checks the paper's argument assumes, computed in the run and passed to
    :func:`judge`; one that fails makes the claim untested"""
    not_per_seed: str = ""
    """why the claim need not be judged seed by seed (its verdict has no seed in it: a byte count,
    an exact identity); empty: the test must use :meth:`Claim.worst_seed` or :meth:`Claim.paired`"""
    threshold: str | float | None = None
    """the claim's fixed threshold: a config field's name or a number (None: relative claims)"""
    floor: float | None = None
    """the lowest value the metric can take (known before the run); the threshold must lie above"""
    ceiling: float | None = None
    """the highest value the metric can take (accuracy 1); the threshold must lie below"""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.key):
            raise ValueError(f"ClaimSpec.key must be a snake_case identifier, got {self.key!r}")
        for name in ("text", "system", "control", "why_control"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise ValueError(f"ClaimSpec {self.key!r}: {name} must be a non-empty string")
        if isinstance(self.also_controls, str):
            raise ValueError(
                f"ClaimSpec {self.key!r}: also_controls must be a tuple of system names, got "
                f"the string {self.also_controls!r}"
            )
        object.__setattr__(self, "also_controls", tuple(self.also_controls))
        if self.system in self.controls or len(set(self.controls)) != len(self.controls):
            raise ValueError(
                f"ClaimSpec {self.key!r}: control and also_controls must be distinct systems "
                f"other than {self.system!r}, got {list(self.controls)}"
            )
        object.__setattr__(self, "premises", tuple(self.premises))
        if len(set(self.premises)) != len(self.premises):
            raise ValueError(
                f"ClaimSpec {self.key!r}: premises must be distinct, got {self.premises}"
            )
        if self.floor is not None and self.ceiling is not None and not self.floor < self.ceiling:
            raise ValueError(
                f"ClaimSpec {self.key!r}: floor must lie below ceiling, got {self.floor} and {self.ceiling}"
            )

    @property
    def controls(self) -> tuple[str, ...]:
        """``control`` and ``also_controls``."""
        return (self.control, *self.also_controls)

    def threshold_value(self, config: Any = None) -> float | None:
        """The threshold as a number: the named config field's value, or the number itself."""
        if self.threshold is None or not isinstance(self.threshold, str):
            return self.threshold
        if config is None or not hasattr(config, self.threshold):
            raise ValueError(
                f"ClaimSpec {self.key!r}: threshold names the config field {self.threshold!r}, "
                "which this config does not have"
            )
        return float(getattr(config, self.threshold))

    def check_bounds(self, config: Any = None) -> None:
        """Raise a ValueError naming the threshold when it does not lie strictly between the
        metric's floor and ceiling: such a claim could only ever fail (or only hold). Configs
        call it on construction, before the run spends any time."""
        value = self.threshold_value(config)
        if value is None:
            return
        outside = (self.floor is not None and not value > self.floor) or (
            self.ceiling is not None and not value < self.ceiling
        )
        if outside:
            name = (
                self.threshold
                if isinstance(self.threshold, str)
                else f"claim {self.key!r}'s threshold"
            )
            raise ValueError(
                f"{name} must lie strictly between the floor {format_number(self.floor)} and the "
                f"ceiling {format_number(self.ceiling)} of claim {self.key!r}'s metric, got {value!r}"
            )

    def sentence(self, config: Any = None, **values: Any) -> str:
        """``text`` with its ``{field}`` placeholders filled from ``config`` and ``values``."""
        if "{" not in self.text:
            return self.text
        fields = {**(vars(config) if config is not None else {}), **values}
        try:
            return self.text.format_map(fields)
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"ClaimSpec {self.key!r}: cannot fill {self.text!r}: {error}"
            ) from None


def judge(
    spec: ClaimSpec,
    test: Callable[[str], Claim],
    *,
    config: Any = None,
    premises: Mapping[str, Claim] | None = None,
    threshold: float | None = None,
    floor: float | None = None,
    ceiling: float | None = None,
    text_values: Mapping[str, Any] | None = None,
) -> Claim:
    """The verdict of ``spec``: ``test(spec.system)``, with ``test(spec.control)`` as its control.

    ``test(system)`` returns the claim's comparison computed from ``system``'s metrics (any text:
    the spec's sentence replaces it). ``premises``: one computed check per key of
    ``spec.premises``. ``floor`` / ``ceiling``: the metric's bounds measured in this run (real
    against real, all cells of the maze); with ``threshold`` (default: the spec's), a threshold
    that does not lie strictly between them makes the claim untested, since no system could have
    passed it (or none failed it). The claim is untested when a premise fails or the control
    cannot be judged, and vacuous (:attr:`Claim.state`) when it holds and so does the control.
    """
    supplied = dict(premises or {})
    if set(supplied) != set(spec.premises):
        raise ValueError(
            f"claim {spec.key!r} declares the premises {list(spec.premises)}; judge got {sorted(supplied)}"
        )
    claim = test(spec.system)
    outcomes = []
    for control in spec.controls:
        try:
            outcomes.append(test(control))
        except KeyError as error:
            raise ValueError(
                f"claim {spec.key!r}: the control {control!r} has no metrics in this run ({error})"
            ) from error
    for name, outcome in (("system", claim), *(("control", o) for o in outcomes)):
        if not isinstance(outcome, Claim):
            raise ValueError(f"claim {spec.key!r}: the test must return a Claim for the {name}")
        if not spec.not_per_seed and not outcome.per_seed:
            raise ValueError(
                f"claim {spec.key!r} must be judged seed by seed (Claim.worst_seed or "
                "Claim.paired), or its ClaimSpec must say why not (not_per_seed)"
            )
    control_claim = outcomes[0] if len(outcomes) == 1 else _any_control(spec.controls, outcomes)
    checks = [supplied[key] for key in spec.premises]
    threshold = spec.threshold_value(config) if threshold is None else threshold
    if floor is not None or ceiling is not None:
        if threshold is None:
            raise ValueError(f"claim {spec.key!r}: measured bounds need a threshold to check")
        checks.append(_bounded(threshold, floor, ceiling))
    text = spec.sentence(config, **(text_values or {}))
    verdict = replace(
        claim,
        text=text,
        key=spec.key,
        control=Control(
            system=" and ".join(spec.controls),
            holds=control_claim.holds,
            tested=control_claim.tested,
            evidence=control_claim.evidence,
        ),
        not_per_seed=spec.not_per_seed,
    )._gated(checks)
    if not control_claim.tested and verdict.tested:
        names = " and ".join(spec.controls)
        verdict = verdict.untested(f"the control {names} could not be judged")
    return verdict


def _any_control(names: Sequence[str], outcomes: Sequence[Claim]) -> Claim:
    """Several controls as one: it passes when any of them passes (so the claim is vacuous);
    it is judged when every control is, or when one that is passes already."""
    passed = any(o.holds and o.tested for o in outcomes)
    return Claim(
        text=" and ".join(names),
        holds=passed,
        evidence="; ".join(f"{n}: {o.evidence}" for n, o in zip(names, outcomes, strict=True)),
        tested=passed or all(o.tested for o in outcomes),
        per_seed=all(o.per_seed for o in outcomes),
    )


def _bounded(threshold: float, floor: float | None, ceiling: float | None) -> Claim:
    """The premise that ``threshold`` lies strictly between the measured floor and ceiling."""
    low = floor is None or (math.isfinite(floor) and threshold > floor)
    high = ceiling is None or (math.isfinite(ceiling) and threshold < ceiling)
    return Claim(
        text="the threshold lies strictly between the metric's floor and ceiling measured in this run",
        holds=bool(low and high),
        evidence=f"floor {format_number(floor)} < threshold {format_number(threshold)} < "
        f"ceiling {format_number(ceiling)}",
    )


def student_t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` (a positive integer) degrees of freedom, exact
    (Abramowitz & Stegun 26.7.3–4: finite sums in θ = atan(t / √df))."""
    if not (isinstance(df, int) and df >= 1):
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2 == 1:  # A(t | df) = 2/π (θ + sin θ (cos θ + 2/3 cos³ θ + …)) for odd df
        series, term = 0.0, cos
        for k in range(1, df - 1, 2):
            series += term
            term *= cos * cos * (k + 1) / (k + 2)
        inside = 2 / math.pi * (theta + sin * series)
    else:  # A(t | df) = sin θ (1 + 1/2 cos² θ + 1·3/(2·4) cos⁴ θ + …) for even df
        series, term = 0.0, 1.0
        for k in range(0, df - 1, 2):
            series += term
            term *= cos * cos * (k + 1) / (k + 2)
        inside = sin * series
    tail = (1 - inside) / 2  # P(T > |t|)
    return tail if t >= 0 else 1 - tail


def _check_op(op: str) -> None:
    if op not in _OPERATORS:
        raise ValueError(f"op must be one of {list(_OPERATORS)}, got {op!r}")


def _passes(value: float, op: str, reference: float) -> bool:
    return bool(
        math.isfinite(value) and math.isfinite(reference) and _OPERATORS[op](value, reference)
    )


def _margin(value: float, op: str, reference: float) -> float:
    """How far ``value`` clears ``reference`` in the direction of ``op`` (−inf when diverged)."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return -math.inf
    return value - reference if op in (">", ">=") else reference - value


__all__ = [
    "CLAIM_STATES",
    "Claim",
    "ClaimSpec",
    "Control",
    "claim_state",
    "control_outcome",
    "format_number",
    "judge",
    "student_t_sf",
    "tally",
    "tally_text",
    "where_run",
]
