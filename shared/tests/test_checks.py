import math
from pathlib import Path

import pytest

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_input_file,
    check_input_folder,
    check_number,
    check_output_file,
    check_output_folder,
    check_seed,
)


def test_numbers() -> None:
    check_count(3, "--heads")
    check_count(5, "--size", minimum=2, maximum=5)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="--heads must be an integer >= 1, got"):
            check_count(bad, "--heads")
    with pytest.raises(ValueError, match=r"--size must be an integer in \[2, 5\], got 6"):
        check_count(6, "--size", minimum=2, maximum=5)
    check_seed(0)
    with pytest.raises(ValueError, match=r"--seed must be an integer in \[0, 2\*\*32\)"):
        check_seed(2**32)
    check_number(0.5, "--lr", 0.5 > 0, "a number > 0")
    for bad in (math.nan, math.inf, True):
        with pytest.raises(ValueError, match="--lr must be a number > 0"):
            check_number(bad, "--lr", True, "a number > 0")
    with pytest.raises(ValueError, match=r"--market must be one of \['bertrand', 'cournot'\]"):
        check_choice("hotelling", "--market", ("bertrand", "cournot"))


def test_paths(tmp_path: Path) -> None:
    text = tmp_path / "calib.txt"
    text.write_text("x")
    check_input_file(text, "--calib", suffixes=(".txt",))
    with pytest.raises(ValueError, match="does not exist"):
        check_input_file(tmp_path / "nope.txt", "--calib")
    with pytest.raises(ValueError, match="is not a file"):
        check_input_file(tmp_path, "--calib")
    with pytest.raises(ValueError, match="must be a .csv file"):
        check_input_file(text, "--edges", suffixes=(".csv",))
    check_input_folder(tmp_path, "--model", containing=["calib.txt"])
    with pytest.raises(ValueError, match="has no config.json"):
        check_input_folder(tmp_path, "--model", containing=["config.json"])
    check_output_file(tmp_path / "new" / "deeper" / "out.npy", "--out", suffixes=(".npy",))
    with pytest.raises(ValueError, match="is a folder, not a file name"):
        check_output_file(tmp_path, "--out")
    with pytest.raises(ValueError, match="must end in .npy"):
        check_output_file(tmp_path / "out.csv", "--out", suffixes=(".npy",))
    with pytest.raises(ValueError, match="is not a folder"):
        check_output_file(text / "out.npy", "--out")  # below a file
    check_output_folder(tmp_path / "run", "--out")
    with pytest.raises(ValueError, match="--out must be a folder, got the file"):
        check_output_folder(text, "--out")
    assert not (tmp_path / "run").exists()  # checking creates nothing


def test_a_fresh_run_does_not_overwrite_an_earlier_one(tmp_path: Path) -> None:
    """Issue 80: mol, prompt_kl, margo and mix-opt ``train`` overwrote a trained --out."""
    from mixlab.shared.checks import check_fresh_output

    out = tmp_path / "run"
    check_fresh_output(out, "--out", resume=False)  # nothing there yet
    (out / "checkpoint-20").mkdir(parents=True)
    made = ("checkpoint-*", "model.safetensors")
    with pytest.raises(ValueError, match=r"holds an earlier run \(checkpoint-20\): pass --resume"):
        check_fresh_output(out, "--out", resume=False, made=made)
    check_fresh_output(out, "--out", resume=True, made=made)  # continuing it is allowed
    check_fresh_output(out, "--out", resume=False, made=("lora",))  # other files do not count


def test_read_jsonl_can_require_text(tmp_path: Path) -> None:
    """Issue 80: a prompt of another type (a number) was accepted silently."""
    import json

    from mixlab.shared.checks import read_jsonl

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": 7, "answer": 3}) + "\n")
    assert read_jsonl(path, "--tasks", ("prompt", "answer"))[0]["answer"] == 3  # numbers pass
    with pytest.raises(ValueError, match="--tasks: line 1 of .*'prompt' must be non-empty text"):
        read_jsonl(path, "--tasks", ("prompt", "answer"), text=("prompt",))
