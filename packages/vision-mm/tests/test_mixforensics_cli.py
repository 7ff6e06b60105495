"""MixForensics' command line end to end (make-data, train, score, eval, --resume) and its
one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest
import torch

from mixlab.vision_mm.cli import main


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    out = tmp_path_factory.mktemp("mf") / "clips"
    assert main(["mixforensics", "make-data", "--out", str(out), "--train", "12", "--test", "2", "--frames", "4",
                 "--size", "16"]) == 0  # fmt: skip
    return out


def _train(clips, out, *extra):
    return main(["mixforensics", "train", "--data", str(clips / "train"), "--out", str(out), "--frames", "4",
                 "--size", "16", "--steps", "4", "--batch-size", "4", "--blends", "2", *extra])  # fmt: skip


def test_make_data_writes_videos_and_labels(clips):
    from mixlab.vision_mm.mixforensics.video import read_video

    rows = [json.loads(line) for line in (clips / "test" / "labels.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 9
    assert {r["family"] for r in rows} == {
        "real",
        "A",
        "B",
        "C",
        "D",
        "E",
        "splice",
        "continuation",
        "splice-control",
    }
    assert {r["label"] for r in rows if r["family"] in ("real", "splice-control")} == {0}
    assert read_video(clips / "test" / rows[0]["video"]).shape == (4, 3, 16, 16)


def test_train_score_eval(clips, tmp_path, capsys):
    assert _train(clips, tmp_path / "run") == 0
    capsys.readouterr()
    video = clips / "test" / "videos" / "00000-real.mp4"
    assert (
        main(["mixforensics", "score", "--model", str(tmp_path / "run" / "model"), str(video)]) == 0
    )
    scored = json.loads(capsys.readouterr().out.strip())
    assert 0 <= scored["p_fake"] <= 1
    assert scored["passes"] == 2  # R = 2 blends of a 4-frame clip
    assert main(["mixforensics", "eval", "--model", str(tmp_path / "run" / "model"), "--data",
                 str(clips / "test")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert {"all", "A", "E", "splice"} <= set(report)
    assert 0 <= report["A"]["auc"] <= 1


def test_killed_training_resumes_to_the_same_model(clips, tmp_path, monkeypatch):
    from mixlab.vision_mm.mixforensics import training
    from mixlab.vision_mm.mixforensics.model import load_detector

    assert _train(clips, tmp_path / "whole") == 0
    real = training.batch_rows

    def dies_at_step_three(count, batch_size, seed, step):
        if step == 3:
            raise KeyboardInterrupt
        return real(count, batch_size, seed, step)

    monkeypatch.setattr(training, "batch_rows", dies_at_step_three)
    assert _train(clips, tmp_path / "killed") == 130  # "interrupted; rerun with --resume"
    assert (tmp_path / "killed" / "training" / "step.txt").read_text() == "2"
    monkeypatch.setattr(training, "batch_rows", real)
    assert _train(clips, tmp_path / "killed") == 2  # checkpoints present: --resume is required
    assert _train(clips, tmp_path / "killed", "--resume", "--lr", "0.01") == 2  # another training
    assert _train(clips, tmp_path / "killed", "--resume") == 0
    whole, _ = load_detector(tmp_path / "whole" / "model")
    resumed, _ = load_detector(tmp_path / "killed" / "model")
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--data", "{tmp}/nowhere", "--out", "{tmp}/o"], "--data"),
        (["train", "--data", "toy", "--out", "{tmp}/o", "--alpha", "0"], "--alpha must be"),
        (["train", "--data", "toy", "--out", "{tmp}/o", "--blends", "0"], "--blends must be"),
        (
            [
                "train",
                "--data",
                "{tmp}/nowhere",
                "--out",
                "{tmp}/o",
                "--frames",
                "6",
                "--blends",
                "4",
            ],
            "--blends must be at most --frames // 2 = 3",
        ),
        (["train", "--data", "toy", "--out", "{tmp}/o", "--frames", "1"], "--frames must be"),
        (["train", "--data", "toy", "--out", "{tmp}/o", "--system", "x3d"], "--system must be"),
        (["train", "--data", "toy", "--out", "{tmp}/o", "--device", "tpu"], "--device"),
        (["score", "--model", "{tmp}", "{tmp}/a.mp4"], "--model must be"),
        (["make-data", "--out", "{tmp}/d", "--size", "4"], "--size must be"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["mixforensics", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1


def test_unreadable_video_is_one_line(clips, tmp_path, capsys):
    assert _train(clips, tmp_path / "run") == 0
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    capsys.readouterr()
    assert (
        main(
            [
                "mixforensics",
                "score",
                "--model",
                str(tmp_path / "run" / "model"),
                str(tmp_path / "bad.mp4"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert "cannot be read" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("video", ["../outside.mp4", "/etc/passwd"])
def test_labels_cannot_point_outside_the_data_folder(tmp_path, capsys, video):
    """Issue 80: labels.jsonl accepted absolute and ../ video paths outside --data."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "labels.jsonl").write_text(json.dumps({"video": video, "label": 1}) + "\n")
    assert main(["mixforensics", "train", "--data", str(data), "--out", str(tmp_path / "o"),
                 "--steps", "1"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert "labels.jsonl videos must be paths inside the folder" in err
    assert len(err.splitlines()) == 1
