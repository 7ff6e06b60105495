"""The method registry: a :class:`Method` per paper, found through the ``mixlab.methods`` entry points.

Each method's ``config.py`` defines its ``Config`` and ``METHOD = Method(...)``, with the run
function named by its import path, and its package lists it::

    METHOD = Method(name="flatnsd", domain="graphs", paper="...", claim="...", config=Config,
                    run="mixlab.graphs.flatnsd.experiment:run")

    [project.entry-points."mixlab.methods"]
    flatnsd = "mixlab.graphs.flatnsd.config:METHOD"

``config.py`` imports nothing heavy (no torch), so ``mixlab list``, ``--help`` and an unknown name
answer at once; the experiment module (torch and the domain's libraries) loads on ``run``.

Nothing is registered before it works: the registry is what ``mixlab list``, ``mixlab run`` and
``mixlab reproduce`` see.
"""

from __future__ import annotations

import importlib
import json
import os
import time
import warnings
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal, Protocol

from mixlab.shared.cache import LEDGER_ENV, cache_record, read_ledger
from mixlab.shared.config import PROFILE_NAMES, ExperimentConfig
from mixlab.shared.device import resolve_device
from mixlab.shared.files import write_json_atomic
from mixlab.shared.progress_report import quiet_library_bars
from mixlab.shared.result import Result, environment

ENTRY_POINT_GROUP = "mixlab.methods"
STALE_OUTPUTS = ("result.json", "error.txt")
RUN_MARKER = "run.json"
"""written into a run's folder when it starts and removed when result.json is written: the
method a killed run's checkpoints belong to, so that another method's --resume refuses them"""
"""what a run removes from its folder before it starts"""
DOMAINS = ("llm-efficiency", "attention-arch", "graphs", "rl", "vision-mm", "online")


class RunFunction(Protocol):
    def __call__(
        self, config: ExperimentConfig, out_dir: Path, *, resume: bool = False
    ) -> Result: ...


@dataclass(frozen=True)
class Method:
    """One paper's method as the workspace sees it.

    ``run(config, out_dir, resume=...)`` runs the experiment (the method against the paper's
    baselines), may write plots and checkpoints into ``out_dir``, and returns a :class:`Result` with
    the metrics and the claims computed from them.
    """

    name: str
    """short lower-case name used on the command line, e.g. ``flatnsd``"""
    domain: str
    """the package it lives in, one of DOMAINS"""
    paper: str
    """the paper's title"""
    claim: str
    """the paper's central claim in one line, in our words"""
    config: type[ExperimentConfig]
    """the experiment's Config dataclass (defaults = quick profile; PROFILES has quick and full)"""
    run: RunFunction | str
    """the experiment, or its import path ``"package.module:function"``, loaded on first use"""
    backend: Literal["torch", "numpy"] = "torch"
    """"numpy" for methods that compute with NumPy on the CPU: --device must then be auto or cpu"""
    headline_plot: str = ""
    """the PNG in the run folder that shows the claim best (``mixlab reproduce`` embeds it)"""

    def __post_init__(self) -> None:
        if (
            not self.name
            or not self.name.replace("_", "").replace("-", "").isalnum()
            or self.name != self.name.lower()
        ):
            raise ValueError(
                f"Method.name must be lower-case letters, digits, '-' or '_', got {self.name!r}"
            )
        if self.domain not in DOMAINS:
            raise ValueError(f"Method.domain must be one of {list(DOMAINS)}, got {self.domain!r}")
        if not (isinstance(self.config, type) and issubclass(self.config, ExperimentConfig)):
            raise ValueError(
                f"Method.config must be an ExperimentConfig subclass, got {self.config!r}"
            )
        if self.backend not in ("torch", "numpy"):
            raise ValueError(f"Method.backend must be 'torch' or 'numpy', got {self.backend!r}")
        if isinstance(self.run, str):
            module, sep, attribute = self.run.partition(":")
            if not (module and sep and attribute):
                raise ValueError(
                    f"Method.run must be a function or 'package.module:function', got {self.run!r}"
                )
        elif not callable(self.run):
            raise ValueError(f"Method.run must be callable, got {self.run!r}")
        missing = [name for name in PROFILE_NAMES if name not in self.config.PROFILES]
        if missing:
            raise ValueError(
                f"{self.name}: Config.PROFILES must define {list(PROFILE_NAMES)}, missing {missing}"
            )

    def load_run(self) -> RunFunction:
        """The run function, importing the experiment module when ``run`` is an import path."""
        if not isinstance(self.run, str):
            return self.run
        module, _, attribute = self.run.partition(":")
        function = getattr(importlib.import_module(module), attribute)
        if not callable(function):
            raise TypeError(f"{self.name}: {self.run} is not a function")
        return function

    def _refuse_foreign_folder(self, out_dir: Path) -> None:
        """A folder another method's run wrote (its result.json, or the :data:`RUN_MARKER` of a
        run killed before it finished) is not this method's to resume: refuse it by name, before
        anything in it is removed (``--resume`` on the wrong ``--out`` deleted a finished run's
        result.json, then failed; or started a fresh run over another method's checkpoints)."""
        recorded = next(
            (out_dir / name for name in ("result.json", RUN_MARKER) if (out_dir / name).is_file()),
            None,
        )
        if recorded is None:
            return
        try:
            method = json.loads(recorded.read_text()).get("method")
        except (ValueError, OSError, AttributeError):
            method = None
        if method != self.name:
            raise ValueError(
                f"--resume: {out_dir} holds a run of {method or 'an unknown method'}, not of "
                f"{self.name}; pass this method's own --out folder (nothing was changed)"
            )

    def execute(
        self, config: ExperimentConfig, out_dir: str | os.PathLike[str], *, resume: bool = False
    ) -> Result:
        """Seed, run, time and record one experiment; writes ``out_dir/result.json``.

        A ``result.json`` or ``error.txt`` that an earlier run left in ``out_dir`` is removed first,
        so what is there at the end is this run's or nothing.
        """
        from mixlab.shared.seeding import seed_everything

        if not isinstance(config, self.config):
            raise ValueError(
                f"config must be a {self.config.__qualname__} for method {self.name!r}, got {config!r}"
            )
        if self.backend == "numpy":
            if config.device not in ("auto", "cpu"):
                raise ValueError(
                    f"{self.name} computes with NumPy on the CPU: device must be auto or cpu, got {config.device!r}"
                )
            device = "cpu"
        else:
            device = resolve_device(config.device)  # a missing GPU is refused before any folder
        out_dir = Path(out_dir)
        if resume:
            self._refuse_foreign_folder(out_dir)  # before anything in it is removed (issue 80)
        out_dir.mkdir(parents=True, exist_ok=True)
        ledger = out_dir / "cache_ledger.jsonl"  # what the run built or found (workers append too)
        if not resume:
            ledger.unlink(missing_ok=True)
        elif not ledger.exists() and (out_dir / "result.json").exists():
            # a finished run's ledger lives in its result.json: a resumed run counts what it built
            entries = (json.loads((out_dir / "result.json").read_text()).get("cache") or {}).get(
                "entries", []
            )
            ledger.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        for stale in STALE_OUTPUTS:
            (out_dir / stale).unlink(missing_ok=True)
        write_json_atomic(out_dir / RUN_MARKER, {"method": self.name, "profile": config.profile})
        run = self.load_run()
        seed_everything(config.seed)
        previous = os.environ.get(LEDGER_ENV)
        os.environ[LEDGER_ENV] = str(ledger.resolve())
        start = time.perf_counter()
        try:
            with quiet_library_bars():  # the run's own loops report (progress_report)
                result = run(config, out_dir, resume=resume)
        finally:
            if previous is None:
                os.environ.pop(LEDGER_ENV, None)
            else:
                os.environ[LEDGER_ENV] = previous
        wall_s = time.perf_counter() - start
        if not isinstance(result, Result):
            raise TypeError(
                f"{self.name}: run() must return a mixlab.shared.Result, got {type(result).__name__}"
            )
        declared = {spec.key for spec in config.CLAIMS}
        for claim in result.claims:
            if claim.key not in declared or claim.control is None:
                raise ValueError(
                    f"{self.name}: the claim {claim.text!r} was not judged from its Config's "
                    f"CLAIMS (declare it as a ClaimSpec with a control; judge it with config.judge)"
                )
        result = replace(
            result,
            method=self.name,
            profile=config.profile,
            seed=config.seed,
            config=config.to_dict(),
            env={**environment(device), **result.env},  # a run may add what it read
            wall_s=round(wall_s, 3),
            cache=cache_record(read_ledger(ledger), wall_s),
        )
        ledger.unlink(missing_ok=True)  # in result.json now; kept only for a --resume of a failure
        result.write(out_dir)
        (out_dir / RUN_MARKER).unlink(missing_ok=True)  # result.json names the method now
        return result


def discover_methods() -> dict[str, Method]:
    """Every installed method, by name, sorted. A broken entry point warns and is left out."""
    found: dict[str, Method] = {}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            method = entry_point.load()
        except Exception as error:  # one broken package must not hide the others
            warnings.warn(
                f"mixlab: method {entry_point.name!r} ({entry_point.value}) failed to load: {error}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        if not isinstance(method, Method) or method.name != entry_point.name:
            warnings.warn(
                f"mixlab: entry point {entry_point.name!r} ({entry_point.value}) is not a Method named {entry_point.name!r}",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        found[method.name] = method
    return dict(sorted(found.items()))


def get_method(name: str) -> Method:
    """The installed method called ``name``; a ValueError names the installed ones otherwise."""
    methods = discover_methods()
    if name not in methods:
        known = ", ".join(methods) if methods else "none (no method package has registered one yet)"
        raise ValueError(f"unknown method {name!r}; installed methods: {known}")
    return methods[name]
