import json
import os
from pathlib import Path

import pytest
import torch

from mixlab.shared.files import (
    CheckpointError,
    checkpoint_errors,
    read_sidecar,
    write_csv_atomic,
    write_json_atomic,
    write_sidecar,
    write_text_atomic,
)


def test_atomic_write_leaves_the_old_file_when_it_fails(tmp_path: Path, monkeypatch) -> None:
    path = write_text_atomic(tmp_path / "result.json", "old")

    def killed(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temporary left behind


def test_atomic_files_get_the_usual_mode(tmp_path: Path) -> None:
    mask = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "result.json", "{}")
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644


def test_write_json_atomic_refuses_nan(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json_atomic(tmp_path / "x.json", {"x": float("nan")})
    assert not (tmp_path / "x.json").exists()


def test_sidecar_round_trip_and_type_checks(tmp_path: Path) -> None:
    data_file = tmp_path / "weights.bin"
    data_file.write_bytes(b"\x00\x01" * 100)
    write_sidecar(tmp_path / "meta.json", {"bits": 4, "names": ["a"]}, covers=[data_file])
    assert read_sidecar(tmp_path / "meta.json", expect={"bits": int, "names": list}) == {
        "bits": 4,
        "names": ["a"],
    }
    with pytest.raises(CheckpointError, match="missing key 'rank'"):
        read_sidecar(tmp_path / "meta.json", expect={"rank": int})
    with pytest.raises(CheckpointError, match="key 'bits' has the wrong type"):
        read_sidecar(tmp_path / "meta.json", expect={"bits": str})


@pytest.mark.parametrize("damage", ["edit", "data_changed", "data_missing", "no_integrity"])
def test_sidecar_detects_damage(tmp_path: Path, damage: str) -> None:
    data_file = tmp_path / "weights.bin"
    data_file.write_bytes(b"abc" * 50)
    sidecar = write_sidecar(tmp_path / "meta.json", {"bits": 4}, covers=[data_file])
    if damage == "edit":
        sidecar.write_text(sidecar.read_text().replace('"bits": 4', '"bits": 5'))
    elif damage == "data_changed":
        data_file.write_bytes(b"abd" * 50)
    elif damage == "data_missing":
        data_file.unlink()
    else:
        sidecar.write_text(json.dumps({"bits": 4}))
    with pytest.raises(CheckpointError, match=r"(meta|weights)\."):
        read_sidecar(sidecar)


def test_checkpoint_errors_map_loader_errors(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    for error in (KeyError("w"), TypeError("bad"), json.JSONDecodeError("x", "doc", 0)):
        with (
            pytest.raises(CheckpointError, match="model.json: damaged or not a model folder"),
            checkpoint_errors(path, "model folder"),
        ):
            raise error
    with pytest.raises(FileNotFoundError), checkpoint_errors(path):
        raise FileNotFoundError(path)
    with pytest.raises(RuntimeError), checkpoint_errors(path):
        raise RuntimeError("a bug is not a damaged file")
    # what torch.load says about a cut file is a damaged file (issue 80)
    cut = tmp_path / "optimizer.pt"
    torch.save({"step": torch.ones(100)}, cut)
    cut.write_bytes(cut.read_bytes()[:50])
    with (
        pytest.raises(CheckpointError, match="optimizer.pt: damaged or not a"),
        checkpoint_errors(cut, "optimizer state"),
    ):
        torch.load(cut, weights_only=True)


def test_write_csv_atomic_writes_a_header_and_quoted_rows(tmp_path):
    path = write_csv_atomic(tmp_path / "sub" / "t.csv", ["a", "b"], [[1, "x,y"], [2.5, "z"]])
    assert path.read_text() == 'a,b\n1,"x,y"\n2.5,z\n'
    assert not list((tmp_path / "sub").glob(".*.tmp"))


def test_atomic_folder_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    from mixlab.shared.files import atomic_folder

    target = tmp_path / "model"
    with atomic_folder(target) as folder:
        (folder / "weights").write_text("v1")
        assert not target.exists()  # nothing is in place until the block ends
    assert (target / "weights").read_text() == "v1"

    def killed_while_saving() -> None:
        with atomic_folder(target) as folder:
            (folder / "weights").write_text("half")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        killed_while_saving()  # the earlier model stays
    assert (target / "weights").read_text() == "v1"
    with atomic_folder(target) as folder:
        (folder / "weights").write_text("v2")
    assert (target / "weights").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing left beside it
