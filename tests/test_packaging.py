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


def _installed(python: Path) -> set[str]:
    """The distributions installed in the environment of ``python``, by normalised name."""
    program = (
        "import importlib.metadata as m, re;"
        "print('\\n'.join(sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()"
        " for d in m.distributions()})))"
    )
    completed = subprocess.run(
        [str(python), "-c", program], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    return set(completed.stdout.split())


def _check_without_torch(python: Path, member: Member) -> None:
    """mixlab-online computes with NumPy: its install holds no torch, CUDA wheels or Triton."""
    if member.distribution != "mixlab-online":
        return
    installed = _installed(python)
    assert {"mixlab-online", "mixlab-shared", "numpy", "scipy", "scikit-learn"} <= installed
    heavy = sorted(
        name
        for name in installed
        if name in ("torch", "triton") or name.startswith(("nvidia-", "cuda-"))
    )
    assert not heavy, f"mixlab-online installs {heavy}"
    # what a NumPy method stands on works there: seeding, the device, env, saving an estimator
    program = "\n".join(
        [
            "import tempfile, numpy as np",
            "from mixlab.shared import Checkpointer, resolve_device, seed_everything",
            "from mixlab.shared.result import environment",
            "from mixlab.online.mosaic import MoSAIC",
            "seed_everything(0)",
            "assert resolve_device('auto') == 'cpu' and environment('cpu')['torch'] is None",
            "out = tempfile.mkdtemp()",
            "X = np.random.default_rng(0).standard_normal((60, 8))",
            "model = MoSAIC(2, 2, n_init=1, max_iter=2, random_state=0).fit(X)",
            "loaded = MoSAIC.load(model.save(out + '/model'))",
            "np.testing.assert_array_equal(loaded.transform(X), model.transform(X))",
            "Checkpointer(out).save(1, {'done': {'cell': [1.5]}, 'w': np.ones(2)})",
            "assert Checkpointer(out, resume=True).load_latest()[1]['done'] == {'cell': [1.5]}",
        ]
    )
    completed = subprocess.run(
        [str(python), "-c", program], capture_output=True, text=True, timeout=300
    )
    assert completed.returncode == 0, completed.stderr
    listed = subprocess.run(
        [str(python.with_name("mixlab")), "list"], capture_output=True, text=True, timeout=120
    )
    assert listed.returncode == 0, listed.stderr
    assert "mosaic" in listed.stdout


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
    _check_without_torch(venv / "bin" / "python", member)


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
    _check_without_torch(venv / "bin" / "python", member)
