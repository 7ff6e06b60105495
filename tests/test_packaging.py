"""Every member builds a wheel, and each domain installs and works alone, without the others."""

import subprocess
import zipfile
from pathlib import Path

import pytest
from workspace_members import DOMAINS, MEMBERS, SHARED, Member, uv

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    uv("build", "--all-packages", "--wheel", "--out-dir", str(out), "--quiet")
    return {path.name.split("-")[0]: path for path in out.glob("*.whl")}


@pytest.mark.parametrize("member", MEMBERS, ids=lambda m: m.distribution)
def test_member_builds_a_wheel_with_only_its_subpackage(
    wheels: dict[str, Path], member: Member
) -> None:
    wheel = wheels[member.distribution.replace("-", "_")]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(
            next(n for n in names if n.endswith("entry_points.txt"))
        ).decode()
    code = [name for name in names if not name.split("/")[0].endswith(".dist-info")]
    assert "mixlab/__init__.py" not in code
    assert f"mixlab/{member.module}/__init__.py" in code
    assert f"mixlab/{member.module}/py.typed" in code
    # mixlab-shared also owns `python -m mixlab`, a module of the namespace package itself
    own = ("mixlab/__main__.py",) if member is SHARED else ()
    assert all(name.startswith(f"mixlab/{member.module}/") or name in own for name in code), code
    assert f"{member.script} = mixlab.{member.module}.cli:main" in entry_points


def _check_alone(python: Path, member: Member) -> None:
    """Import the domain and its dependencies; the other domains must be absent; its CLI answers."""
    others = [m.module for m in DOMAINS if m is not member]
    program = "\n".join(
        [
            "import importlib, importlib.util",
            f"import mixlab.shared, mixlab.{member.module}.cli",
            *(f"importlib.import_module({name!r})" for name in member.imports),
            f"present = [m for m in {others!r} if importlib.util.find_spec('mixlab.' + m) is not None]",
            "assert not present, f'other domains installed: {present}'",
        ]
    )
    completed = subprocess.run(
        [str(python), "-c", program], capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stderr
    for script in (member.script, "mixlab"):
        completed = subprocess.run(
            [str(python.with_name(script)), "--help"], capture_output=True, text=True, timeout=120
        )
        assert completed.returncode == 0, completed.stderr


@pytest.mark.parametrize("member", DOMAINS, ids=lambda m: m.distribution)
def test_one_domain_installs_alone_from_the_lock(tmp_path: Path, member: Member) -> None:
    venv = tmp_path / "venv"
    uv(
        "sync",
        "--locked",
        "--package",
        member.distribution,
        "--no-dev",
        "--quiet",
        env={"UV_PROJECT_ENVIRONMENT": str(venv)},
    )
    _check_alone(venv / "bin" / "python", member)


def test_one_domain_installs_alone_from_wheels(tmp_path: Path, wheels: dict[str, Path]) -> None:
    """As a user without the repository would: the two wheels plus the locked third-party pins."""
    member = next(m for m in DOMAINS if m.distribution == "mixlab-online")
    pins = tmp_path / "requirements.txt"
    uv("export", "--locked", "--package", member.distribution, "--no-dev", "--no-emit-workspace", "--no-hashes",
       "--quiet", "--output-file", str(pins))  # fmt: skip
    venv = tmp_path / "venv"
    uv("venv", "--quiet", str(venv))
    picked = [wheels[m.distribution.replace("-", "_")] for m in (SHARED, member)]
    uv(
        "pip",
        "install",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        "-r",
        str(pins),
        *map(str, picked),
    )
    _check_alone(venv / "bin" / "python", member)
