"""``mixlab-vision mop``: scenes → train → eval → probes on tiny local HF models, and one-line
errors (exit 2) for bad input."""

from __future__ import annotations

import json

import pytest

from mixlab.vision_mm.cli import main


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny CLIPVisionModel folder, a tiny Llama folder with the scenes' word tokenizer, and
    train/test data folders."""
    from transformers import CLIPVisionConfig, CLIPVisionModel, LlamaConfig, LlamaForCausalLM

    from mixlab.vision_mm.mop.scenes import vocabulary
    from mixlab.vision_mm.mop.text import word_tokenizer

    root = tmp_path_factory.mktemp("mop-cli")
    CLIPVisionModel(CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                     num_attention_heads=4, image_size=32, patch_size=8)).save_pretrained(root / "clip")  # fmt: skip
    tokenizer = word_tokenizer(vocabulary())
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                 pad_token_id=tokenizer.pad_token_id)).save_pretrained(root / "llama")  # fmt: skip
    tokenizer.save_pretrained(root / "llama")
    assert main(["mop", "scenes", "--out", str(root / "train"), "--count", "24"]) == 0
    assert main(["mop", "scenes", "--out", str(root / "test"), "--count", "8", "--seed", "1"]) == 0
    return root


def _read(verb, model, data, modality):
    return main(["mop", verb, "--model", str(model), "--data", str(data), "--modality", modality])


def test_train_eval_and_probes_on_local_hf_models(folders, capsys):
    run = folders / "run"
    args = ["mop", "train", "--data", str(folders / "train"), "--encoder", str(folders / "clip"),
            "--lm", str(folders / "llama"), "--out", str(run), "--steps", "3", "--batch-size", "4",
            "--probes", "2", "--queries", "2", "--layers", "1,3", "--aligned", "1"]  # fmt: skip
    assert main(args) == 0
    assert len(json.loads((run / "history.json").read_text())) == 3
    assert main(args) == 2  # a second run into the same folder must say --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    capsys.readouterr()
    assert _read("eval", str(run / "model"), str(folders / "test"), "depth") == 0
    scores = json.loads(capsys.readouterr().out)
    assert set(scores) == {"colour", "shape", "count", "depth", "all"}
    assert _read("probes", str(run / "model"), str(folders / "test"), "rgb") == 0
    assert set(json.loads(capsys.readouterr().out)) == {
        "probe_cosine",
        "effective_rank",
        "router_entropy",
    }


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--probes", "0"], "--probes must be an integer >= 1"),
        (["--layers", "1,9", "--probes", "2"], "layers must be in"),
        (["--modalities", "rgb,sonar"], "unknown modality"),
        (["--system", "clip"], "--system must be one of"),
        (["--patch", "5"], "patch must divide the input size 32"),
    ],
)
def test_bad_training_input_is_one_line_and_exit_2(folders, capsys, extra, message):
    args = ["mop", "train", "--data", str(folders / "train"), "--encoder", str(folders / "clip"),
            "--lm", str(folders / "llama"), "--out", str(folders / "bad"), "--steps", "1", *extra]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert "\n" not in err


def test_samples_without_a_modality_or_that_do_not_fit_are_refused(folders, tmp_path, capsys):
    import numpy as np

    bad = tmp_path / "data"
    bad.mkdir()
    np.save(bad / "two.npy", np.zeros((2, 32, 32), np.float32))
    np.save(bad / "small.npy", np.zeros((1, 16, 16), np.float32))
    common = [
        "--encoder",
        str(folders / "clip"),
        "--lm",
        str(folders / "llama"),
        "--out",
        str(tmp_path / "o"),
    ]

    def write(*modalities):
        lines = [json.dumps({"modalities": m, "question": "how many shapes are there?", "answer": "2"})
                 for m in modalities]  # fmt: skip
        (bad / "data.jsonl").write_text("\n".join(lines) + "\n")

    write({})
    assert main(["mop", "train", "--data", str(bad), *common]) == 2
    assert "at least one modality" in capsys.readouterr().err
    write({"rgb": "two.npy", "depth": "two.npy"}, {"rgb": "two.npy", "depth": "small.npy"})
    assert main(["mop", "train", "--data", str(bad), *common]) == 2
    assert "depth images must all have one shape" in capsys.readouterr().err
    # a model trained on 1-channel depth refuses 2-channel depth at evaluation
    run = tmp_path / "run"
    assert main(["mop", "train", "--data", str(folders / "train"), *common[:4], "--out", str(run), "--steps", "1",
                 "--batch-size", "2", "--probes", "1", "--queries", "2"]) == 0  # fmt: skip
    write({"depth": "two.npy"})
    capsys.readouterr()
    assert _read("eval", str(run / "model"), str(bad), "depth") == 2
    err = capsys.readouterr().err.strip()
    assert "input must be [batch, 1, 32, 32] for this tokenizer" in err
    assert "\n" not in err
