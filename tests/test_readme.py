"""README.md's examples run as shown (see tests/readme_examples.py for what counts as an example):
every Python block, every shell line not marked long, the one-domain install in a fresh
environment; every `--set` names a real Config field; every method has its Python example."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from readme_examples import (
    ROOT,
    Block,
    bash_lines,
    blocks,
    is_long,
    python_examples,
)

from mixlab.shared.registry import discover_methods

PYTHON = python_examples()
BASH = [block for block in blocks() if block.language == "bash"]
SHORT_LINES = [
    line
    for block in BASH
    if not block.fresh_environment
    for line in bash_lines(block)
    if not is_long(line)
]
RUN_LINES = [
    line for block in BASH for line in bash_lines(block) if line.startswith("uv run mixlab run ")
]


def _environment(**extra: str) -> dict[str, str]:
    """This environment with the uv that runs the tests first on PATH (``uv run`` sets $UV: CI
    may run uv as ``python -m uv``, with no ``uv`` on PATH)."""
    env = dict(os.environ)
    if env.get("UV"):
        env["PATH"] = f"{Path(env['UV']).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


@pytest.fixture(scope="module")
def python_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Every Python example, run once in one process (each in a fresh namespace and folder)."""
    out = tmp_path_factory.mktemp("readme") / "outcomes.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "readme_examples.py"), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,  # within pytest's 600 s a test (and each example stops at 60 s)
        # one thread: the examples' tensors are tiny, and on a busy 2-core machine a second
        # OpenMP thread mostly spins (measured: 4x the CPU time for all of them together)
        env=_environment(OMP_NUM_THREADS="1"),
    )
    outcomes = json.loads(out.read_text()) if out.is_file() else {}
    for name in PYTHON:  # a crash of the process itself fails the examples it did not reach
        outcomes.setdefault(name, {"ok": False, "error": completed.stderr[-4000:]})
    return outcomes


@pytest.mark.parametrize("name", list(PYTHON))
def test_python_example_runs(name: str, python_outcomes: dict[str, dict[str, object]]) -> None:
    outcome = python_outcomes[name]
    block = PYTHON[name]
    assert outcome["ok"], f"README.md line {block.line} ({name}):\n{outcome['error']}"


def test_every_method_has_a_python_example_of_its_own_package() -> None:
    for name, method in discover_methods().items():
        assert name in PYTHON, f"README.md: add a Python example under a heading `{name}`"
        module = f"mixlab.{method.domain.replace('-', '_')}.{name}"
        assert f"from {module} import" in PYTHON[name].code, (name, module)


def _command(line: str) -> str:
    return line.split(" #", 1)[0].strip()


@pytest.mark.parametrize("line", SHORT_LINES, ids=_command)
def test_shell_example_exits_0(line: str) -> None:
    completed = subprocess.run(
        ["bash", "-c", line],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,  # a line that may take longer is marked long
        env=_environment(),
    )
    assert completed.returncode == 0, (
        f"{line}\n{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"
    )


@pytest.mark.parametrize("line", RUN_LINES, ids=_command)
def test_run_example_names_a_method_and_real_config_fields(line: str) -> None:
    """Also for the long lines, which no test runs: the method, the profile and every `--set`."""
    methods = discover_methods()
    words = shlex.split(_command(line))
    method = words[4]  # uv run mixlab run METHOD ...
    assert method in methods, f"{line}: no method {method!r}"
    config = methods[method].config
    settings = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    profile = words[words.index("--profile") + 1] if "--profile" in words else "quick"
    config.from_profile(profile, **config.parse_overrides(settings))


def _fresh_environment_block() -> Block:
    fresh = [block for block in BASH if block.fresh_environment]
    assert len(fresh) == 1, "README.md: one block installs one domain in a fresh environment"
    return fresh[0]


def _installed(venv: Path) -> list[str]:
    site = next((venv / "lib").glob("python*/site-packages"))
    return sorted(p.name for p in site.iterdir() if p.name.endswith(".dist-info"))


def test_one_domain_stays_installed_across_uv_run(tmp_path: Path) -> None:
    """The one-domain block, in a new environment: the sync installs that domain and mixlab-shared
    without the other domains, and each `uv run` after it installs and removes nothing."""
    block = _fresh_environment_block()
    venv = tmp_path / "venv"
    env = {
        k: v
        for k, v in _environment(UV_PROJECT_ENVIRONMENT=str(venv)).items()
        if k != "VIRTUAL_ENV"
    }
    lines = bash_lines(block)
    assert lines[0].startswith("uv sync --package "), lines[0]
    domain = lines[0].split()[3]
    installed = None
    for line in lines:
        completed = subprocess.run(
            ["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
        )
        assert completed.returncode == 0, f"{line}\n{completed.stdout}\n{completed.stderr}"
        now = _installed(venv)
        assert installed is None or now == installed, (
            f"`{line}` changed the environment: "
            f"+{sorted(set(now) - set(installed))} -{sorted(set(installed) - set(now))}"
        )
        installed = now
    members = {p.parent.name for p in ROOT.glob("packages/*/pyproject.toml")}
    present = {
        name.split("-")[0].removeprefix("mixlab_").replace("_", "-")
        for name in installed
        if name.startswith("mixlab_")
    }
    assert present == {"shared", domain.removeprefix("mixlab-")}, present
    assert domain.removeprefix("mixlab-") in members
