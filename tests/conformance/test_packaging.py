"""Packaging conformance: what pip, mypy and ``python -m`` expect of every member.

- each member declares exactly the third-party distributions its code imports (lazy imports
  included), each with a lower bound, so a one-domain install neither misses a module nor drags in
  a heavy package nothing uses;
- each subpackage carries a PEP 561 ``py.typed`` marker (``mixlab`` is a namespace package, so the
  marker lives in ``mixlab/<module>/``);
- ``python -m mixlab`` is the ``mixlab`` CLI.
"""

import ast
import functools
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
from workspace_members import MEMBERS, ROOT, Member, pyproject


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _declared(member: Member, *, extras: bool = False) -> dict[str, str]:
    """Declared third-party requirements of a member (with ``extras``, its optional ones too:
    mixlab-shared's tensor helpers need torch, an extra): normalized name -> requirement."""
    project = pyproject(member)["project"]
    optional = [r for group in project.get("optional-dependencies", {}).values() for r in group]
    declared = {}
    for requirement in [*project["dependencies"], *(optional if extras else [])]:
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
        if not name.startswith("mixlab"):
            declared[_normalized(name)] = requirement
    return declared


def _imported_modules(member: Member) -> dict[str, Path]:
    """Top-level third-party modules imported anywhere in a member's source (first file seen)."""
    modules: dict[str, Path] = {}
    for path in sorted((ROOT / member.path / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "mixlab" and top not in sys.stdlib_module_names:
                    modules.setdefault(top, path.relative_to(ROOT))
    return modules


@functools.cache
def _module_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distribution_of(module: str) -> str:
    distributions = _module_distributions().get(module)
    if not distributions:
        pytest.fail(f"no installed distribution provides the imported module {module!r}")
    return _normalized(distributions[0])


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.distribution)
def test_declared_dependencies_are_exactly_the_imported_ones(member: Member) -> None:
    declared = _declared(member)
    imported = {
        _distribution_of(module): path for module, path in _imported_modules(member).items()
    }
    optional = _declared(member, extras=True)
    undeclared = {name: str(path) for name, path in imported.items() if name not in optional}
    unused = sorted(set(declared) - set(imported))
    assert not undeclared, f"{member.distribution} imports undeclared distributions: {undeclared}"
    assert not unused, f"{member.distribution} declares distributions nothing imports: {unused}"


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.distribution)
def test_every_dependency_has_a_lower_bound(member: Member) -> None:
    requirements = _declared(member, extras=True).values()
    unbounded = [req for req in requirements if ">=" not in req and "==" not in req]
    assert not unbounded, f"{member.distribution}: requirements without a lower bound: {unbounded}"


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.distribution)
def test_every_subpackage_is_marked_typed(member: Member) -> None:
    marker = ROOT / member.path / "src" / "mixlab" / member.module / "py.typed"
    assert marker.is_file(), f"{marker.relative_to(ROOT)} is missing (PEP 561)"


def test_python_dash_m_mixlab_is_the_cli() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "mixlab", "list"], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert "mosaic" in listed.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "mixlab", "run", "no-such-method"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert unknown.returncode == 2
    assert "unknown method 'no-such-method'" in unknown.stderr
