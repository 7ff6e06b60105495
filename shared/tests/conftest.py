"""Fixtures that install test methods through real ``mixlab.methods`` entry points."""

import importlib
import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def install_entry_points(root: Path, entry_points: dict[str, str], modules: dict[str, str]) -> Path:
    """Make ``root`` an import path holding ``modules`` (name -> source) and a dist-info whose
    ``mixlab.methods`` entry points are ``entry_points`` (name -> "module:attr")."""
    root.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (root / f"{name}.py").write_text(source)
    dist_info = root / "mixlab_test_methods-0.0.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mixlab-test-methods\nVersion: 0.0.0\n"
    )
    lines = ["[mixlab.methods]", *(f"{name} = {target}" for name, target in entry_points.items())]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def site_with_methods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``site_with_methods(entry_points, modules)``: install them on an import path for this test."""

    def install(entry_points: dict[str, str], modules: dict[str, str]) -> Path:
        root = install_entry_points(tmp_path / "extra-site", entry_points, modules)
        monkeypatch.syspath_prepend(str(root))
        return root

    return install


@pytest.fixture
def toy_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An import path with the toy method registered as ``toy``; also on PYTHONPATH for subprocesses."""
    root = install_entry_points(
        tmp_path / "site",
        {"toy": "mixlab_toy_method:METHOD"},
        {"mixlab_toy_method": (HERE / "toy_method.py").read_text()},
    )
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", str(root))
    importlib.invalidate_caches()
    yield root
    sys.modules.pop("mixlab_toy_method", None)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def toy_method(toy_path: Path):
    from mixlab.shared import get_method

    return get_method("toy")
