"""The workspace's shape: members, namespace package, dependencies kept per domain, CLIs."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from workspace_members import DOMAINS, MEMBERS, ROOT, SHARED, Member, pyproject


def test_root_is_a_meta_package_of_every_member() -> None:
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(root["project"]["dependencies"]) == sorted(m.distribution for m in MEMBERS)
    assert root["tool"]["uv"]["workspace"]["members"] == ["shared", "packages/*"]
    assert sorted(p.name for p in (ROOT / "packages").iterdir() if p.is_dir()) == sorted(
        Path(m.path).name for m in DOMAINS
    )


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.distribution)
def test_member_layout(member: Member) -> None:
    base = ROOT / member.path
    project = pyproject(member)["project"]
    assert project["name"] == member.distribution
    assert project["requires-python"] == ">=3.11"
    # mixlab is an implicit namespace package: an __init__.py here would shadow the other members
    assert not (base / "src" / "mixlab" / "__init__.py").exists()
    assert (base / "src" / "mixlab" / member.module / "__init__.py").exists()
    assert project["scripts"][member.script].startswith(f"mixlab.{member.module}.cli:")
    readme = (base / "README.md").read_text()
    assert member.distribution in readme
    assert len(readme) > 300


@pytest.mark.parametrize("member", DOMAINS, ids=lambda m: m.distribution)
def test_a_domain_depends_on_shared_and_no_other_domain(member: Member) -> None:
    dependencies = pyproject(member)["project"]["dependencies"]
    assert SHARED.distribution in dependencies
    others = {m.distribution for m in DOMAINS} - {member.distribution}
    named = {
        dep.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip() for dep in dependencies
    }
    assert not named & others


def test_torch_is_not_a_dependency_of_shared_or_online() -> None:
    """mixlab-shared keeps torch to an extra and MoSAIC is NumPy, so mixlab-online installs without
    torch (tests/test_packaging.py installs it; tests/conformance/test_packaging.py checks that
    every member declares exactly what it imports)."""
    for member in (SHARED, next(m for m in DOMAINS if m.distribution == "mixlab-online")):
        names = {re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower()
                 for r in pyproject(member)["project"]["dependencies"]}  # fmt: skip
        assert "torch" not in names, member.distribution


def _run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name(name)
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.script)
def test_cli_answers_help_and_bad_commands(member: Member) -> None:
    shown = _run_script(member.script, "--help")
    assert shown.returncode == 0, shown.stderr
    assert f"Usage: {member.script}" in shown.stdout
    refused = _run_script(member.script, "no-such-command")
    assert refused.returncode == 2
    assert refused.stderr == f"{member.script}: error: No such command 'no-such-command'.\n"
