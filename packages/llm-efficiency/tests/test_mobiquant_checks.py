"""MoBiQuant v2 workspace checks: the config's ranges, the regime checks, ``mixlab-llm`` refusing
bad options before any work, and damaged checkpoints / model folders giving one line and exit 2.

The CLI cases run the console script in a subprocess, as a user would.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mixlab.llm_efficiency.mobiquant.config import Config

SCRIPT = Path(sys.executable).with_name("mixlab-llm")
TEXT = "def f(x):\n    return x + 1\n" * 40


def cli(*args: str | Path) -> tuple[int, list[str], str]:
    """``mixlab-llm ARGS`` in a subprocess: (exit code, stderr lines, stdout)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MIXLAB_DEBUG": ""}
    completed = subprocess.run(
        [str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=300
    )
    return completed.returncode, completed.stderr.strip().splitlines(), completed.stdout


def one_line(err: list[str], *fragments: str) -> str:
    """The only line of ``err``, which contains every fragment."""
    assert len(err) == 1, err
    for fragment in fragments:
        assert fragment in err[0], err[0]
    return err[0]


def assert_one_line_error(result: tuple[int, list[str], str], *fragments: str) -> str:
    code, err, _ = result
    assert code == 2, err
    return one_line(err, *fragments)


# --- config -----------------------------------------------------------------------------------


def test_config_refuses_bad_tuples_and_layouts():
    # (nan/inf in every float field and 0/-1 in every int field: tests/test_methods.py)
    for budgets in ((2.0, 3.0, 4.0, math.nan), (2.0, 3.0, 4.0, math.inf), (2.0, 3.0, 4.0, 9.0)):
        with pytest.raises(ValueError, match="budgets"):
            Config(budgets=budgets)
    with pytest.raises(ValueError, match="per_bit"):
        Config(per_bit=(2, 3, 4, 0))
    with pytest.raises(ValueError, match="slice_bits"):
        Config(slice_bits=3)
    with pytest.raises(ValueError, match="group_size"):
        Config(group_size=48)
    with pytest.raises(ValueError, match="eval_tokens"):
        Config(eval_tokens=64)
    Config.from_profile("full")


def test_registry_entry_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from mixlab.llm_efficiency.mobiquant.config import METHOD\n"
        "import mixlab.llm_efficiency.cli\n"
        "heavy = ('torch', 'numpy', 'transformers', 'safetensors', 'accelerate', 'matplotlib')\n"
        "print([m for m in sys.modules if m.split('.')[0] in heavy])\n"
        "print(METHOD.run, METHOD.headline_plot)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out == [
        "[]",
        "mixlab.llm_efficiency.mobiquant.experiment:run perplexity_vs_bits.png",
    ]


# --- regime -----------------------------------------------------------------------------------


def _metrics(fp: float, rtn2: float, gptq3: float) -> dict[str, dict[str, float]]:
    return {
        "fp": {"full_precision_ppl": fp},
        "rtn": {"ppl@2": rtn2},
        "gptq": {"ppl@3": gptq3},
    }


def test_regime_needs_low_bits_to_hurt_by_the_fixed_margins():
    from mixlab.llm_efficiency.mobiquant.experiment import regime
    from mixlab.shared import Claim, Result

    # the landed quick testbed: 2-bit RTN +2.1 %, 3-bit GPTQ below full precision
    landed = regime(_metrics(10.079, 10.289, 10.076))
    assert [check.holds for check in landed] == [False, False]
    assert landed[0].evidence == "RTN ppl@2 10.29 >= 1.3 x full-precision ppl 10.08 = 13.1"
    assert "GPTQ ppl@3" in landed[1].evidence
    sensitive = regime(_metrics(10.0, 13.0, 10.2))
    assert [check.holds for check in sensitive] == [True, True]
    assert [check.holds for check in regime(_metrics(10.0, 12.99, 10.3))] == [False, True]
    claim = Claim.compare("a claim", 1.0, "<", 2.0)
    result = Result(metrics={"x": {"y": 1.0}}, claims=[claim], regime=landed)
    assert [c.state for c in result.claims] == ["untested"]


# --- CLI: options checked before any work --------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny Hugging Face Llama folder, a MoBiQuant folder saved from it, and a text file."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mixlab.llm_efficiency.mobiquant import MoBiQuantConfig, quantize_, save_quantized

    root = tmp_path_factory.mktemp("mobiquant_cli")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(root / "hf")
    quantize_(model, MoBiQuantConfig(group_size=32, router=False))
    save_quantized(model, root / "q")
    (root / "text.txt").write_text(TEXT)
    return root


def _validation_cases(root: Path) -> list[tuple[list[str], str]]:
    """Bad options refused before torch is even imported."""
    hf, q, text = root / "hf", root / "q", root / "text.txt"
    new = root / "new"
    quantize = ["mobiquant", "quantize", "--model", hf, "--calib", text, "--out", new]
    evaluate = ["mobiquant", "eval", "--model", q, "--text", text]
    cases = [
        ([*quantize, "--bits", "3"], "--bits must be one of [1, 2, 4, 8], got 3"),
        ([*quantize, "--slices", "1"], "--slices must be an integer >= 2, got 1"),
        ([*quantize, "--bits", "8", "--slices", "4"], "--bits x --slices <= 16"),
        ([*quantize, "--group-size", "0"], "--group-size must be an integer >= 1, got 0"),
        ([*quantize, "--calib-sequences", "-1"], "--calib-sequences must be an integer >= 1"),
        ([*quantize, "--seq-len", "0"], "--seq-len must be an integer >= 1, got 0"),
        ([*quantize, "--calib-steps", "0"], "--calib-steps must be an integer >= 1, got 0"),
        (
            ["mobiquant", "quantize", "--model", hf, "--calib", root / "none.txt", "--out", new],
            "--calib: ",
        ),
        (
            ["mobiquant", "quantize", "--model", root / "none", "--calib", text, "--out", new],
            "--model: ",
        ),
        (
            ["mobiquant", "quantize", "--model", hf, "--calib", text, "--out", text],
            "--out must be a folder",
        ),
        (
            ["mobiquant", "quantize", "--model", hf, "--calib", text, "--out", hf],
            "--out must differ from --model",
        ),
        ([*evaluate, "--avg-bits", "nan"], "--avg-bits must be a finite number > 0, got nan"),
        ([*evaluate, "--bits", "0"], "--bits must be an integer >= 1, got 0"),
        ([*evaluate, "--bits", "4", "--avg-bits", "3"], "give one of them, not both"),
        ([*evaluate, "--max-tokens", "0"], "--max-tokens must be an integer >= 1, got 0"),
        (
            ["mobiquant", "eval", "--model", hf, "--text", text],
            "has no mobiquant_config.json",
        ),
        (["mobiquant", "eval", "--model", q, "--text", root / "none.txt"], "--text: "),
        (["lm", "train", "--out", new, "--steps", "0"], "--steps must be an integer >= 1, got 0"),
        (["lm", "train", "--out", new, "--batch-size", "-1"], "--batch-size must be an integer"),
        (["lm", "train", "--out", new, "--lr", "inf"], "--lr must be a finite number > 0"),
        (["lm", "train", "--out", new, "--heads", "3"], "--heads must divide --hidden-size"),
        (["lm", "train", "--out", text], "--out must be a folder"),
        (["lm", "eval", "--model", hf, "--text", text, "--seq-len", "0"], "--seq-len must be"),
        (["lm", "eval", "--model", root / "none", "--text", text], "--model: "),
        (["lm", "eval", "--model", text, "--text", text], "is not a folder"),
    ]
    return [([str(a) for a in args], fragment) for args, fragment in cases]


def test_bad_options_are_refused_in_one_line_before_any_work(folders):
    """All cases in one fresh process: each exits 2 with one line, and torch never loads (so no
    model was loaded, trained or written)."""
    cases = _validation_cases(folders)
    code = (
        "import contextlib, io, json, sys\n"
        "from mixlab.llm_efficiency.cli import main\n"
        "out = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        out.append([main(args), err.getvalue().strip().splitlines()])\n"
        "heavy = [m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules]\n"
        "print(json.dumps({'results': out, 'heavy': heavy}))\n"
    )
    argv = json.dumps([args for args, _ in cases])
    completed = subprocess.run(
        [sys.executable, "-c", code, argv], capture_output=True, text=True, timeout=120
    )
    report = json.loads(completed.stdout)
    for (args, fragment), (exit_code, err) in zip(cases, report["results"], strict=True):
        assert exit_code == 2, (args, err)
        one_line(err, fragment)
    assert report["heavy"] == []
    assert not (folders / "new").exists()
    # and once through the console script itself
    assert_one_line_error(cli(*cases[0][0]), cases[0][1])


def test_precision_options_are_checked_against_the_saved_model(folders, capsys):
    from mixlab.llm_efficiency.cli import main

    evaluate = ["mobiquant", "eval", "--model", str(folders / "q"), "--text"]
    evaluate.append(str(folders / "text.txt"))
    for extra, fragment in (
        (["--avg-bits", "9"], "--avg-bits must be in [2, 8], got 9.0"),
        (["--bits", "3"], "--bits must be a multiple of the slice bits 2 in [2, 8], got 3"),
    ):
        assert main([*evaluate, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        one_line(err, fragment)


# --- CLI: damaged checkpoints and model folders --------------------------------------------------


def _damaged_copy(root: Path, source: str, name: str) -> Path:
    folder = root / "damaged" / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(root / source, folder)
    return folder


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _edit_json(file: Path, edit) -> None:
    data = json.loads(file.read_text())
    edit(data)
    file.write_text(json.dumps(data, indent=2))


QUANTIZED_DAMAGE = {
    "truncated_weights": ("model.safetensors", lambda f: _truncate(f)),
    "key_removed": ("mobiquant_config.json", lambda f: _edit_json(f, lambda d: d.pop("bits"))),
    "key_wrong_type": (
        "mobiquant_config.json",
        lambda f: _edit_json(f, lambda d: d.update(slices="4")),
    ),
    "number_edited": (
        "mobiquant_config.json",
        lambda f: _edit_json(f, lambda d: d.update(group_size=64)),
    ),
}
MORE_QUANTIZED_DAMAGE = {
    "hf_config_edited": (
        "config.json",
        lambda f: _edit_json(f, lambda d: d.update(num_hidden_layers=1)),
    ),
    "not_ours": (
        "mobiquant_config.json",
        lambda f: _edit_json(f, lambda d: d.pop("integrity")),
    ),
    "weights_replaced": ("model.safetensors", lambda f: f.write_bytes(b"\0" * 64)),
}


@pytest.mark.parametrize("case", sorted(QUANTIZED_DAMAGE))
def test_damaged_quantized_folder_gives_one_line(folders, case):
    name, damage = QUANTIZED_DAMAGE[case]
    folder = _damaged_copy(folders, "q", case)
    damage(folder / name)
    assert_one_line_error(
        cli("mobiquant", "eval", "--model", folder, "--text", folders / "text.txt"),
        str(folder / name),
    )


def test_more_damaged_quantized_folders_give_one_line(folders, capsys):
    from mixlab.llm_efficiency.cli import main

    for case, (name, damage) in MORE_QUANTIZED_DAMAGE.items():
        folder = _damaged_copy(folders, "q", case)
        damage(folder / name)
        text = str(folders / "text.txt")
        assert main(["mobiquant", "eval", "--model", str(folder), "--text", text]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        one_line(err, str(folder / name))


HF_DAMAGE = {
    "truncated_weights": ("model.safetensors", _truncate, "SafetensorError"),
    "key_removed": (
        "config.json",
        lambda f: _edit_json(f, lambda d: d.pop("vocab_size")),
        "do not match config.json",
    ),
    "key_wrong_type": (
        "config.json",
        lambda f: _edit_json(f, lambda d: d.update(hidden_size="64")),
        "hidden_size",
    ),
    "number_edited": (
        "config.json",
        lambda f: _edit_json(f, lambda d: d.update(num_hidden_layers=3)),
        "missing from its weights",
    ),
    "model_type_removed": (
        "config.json",
        lambda f: _edit_json(f, lambda d: d.pop("model_type")),
        "model_type",
    ),
}


def test_damaged_hugging_face_folder_gives_one_line(folders, capsys):
    """Every case in process (the same run_app path), the truncated file through the script."""
    from mixlab.llm_efficiency.cli import main

    text = str(folders / "text.txt")
    for case, (name, damage, fragment) in HF_DAMAGE.items():
        folder = _damaged_copy(folders, "hf", case)
        damage(folder / name)
        args = ["lm", "eval", "--model", str(folder), "--text", text, "--seq-len", "16"]
        assert main(args) == 2, case
        err = capsys.readouterr().err.strip().splitlines()
        one_line(err, str(folder), fragment)
    truncated = folders / "damaged" / "truncated_weights"
    assert_one_line_error(
        cli("lm", "eval", "--model", truncated, "--text", text, "--seq-len", "16"),
        str(truncated),
        "SafetensorError",
    )
    assert main(["lm", "eval", "--model", str(folders / "hf"), "--text", text]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_cached_tiny_lm_is_found_again_and_checked_against_its_marker(
    folders, tmp_path, monkeypatch
):
    """The tiny LM is trained once into its cache entry (keyed by config, corpus and the code
    that trains it) and found there next time; an edited file is refused, and the cached tiny
    LM names the folder to delete."""
    from mixlab.llm_efficiency import lm
    from mixlab.shared.files import CheckpointError

    config = lm.LMConfig(hidden_size=32, layers=1, heads=1, intermediate_size=64, seq_len=32,
                         steps=2, batch_size=2)  # fmt: skip
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    cached = lm.tiny_lm_folder(config)
    assert cached.parent == tmp_path / "cache" / "llm_efficiency"
    assert cached.name.startswith("tiny-llama-")
    record = json.loads((cached / "cache.json").read_text())
    assert record["code"] == list(lm.LM_CODE)
    assert record["key"]["steps"] == 2
    assert len(record["key"]["corpus_sha256"]) == 64

    def trains_again(*args, **kwargs):
        raise AssertionError("the cached tiny LM was trained again")

    monkeypatch.setattr(lm, "train_lm", trains_again)
    assert lm.tiny_lm_folder(config) == cached
    assert lm.pretrained_lm(config) is not None
    _edit_json(cached / "config.json", lambda d: d.update(rms_norm_eps=1e-5))
    with pytest.raises(CheckpointError, match="delete .* to train it again"):
        lm.pretrained_lm(config)
    line = assert_one_line_error(
        cli("lm", "eval", "--model", cached, "--text", folders / "text.txt", "--seq-len", "16"),
        "config.json",
    )
    assert "SHA-256" in line
