"""MixForensics in its ecosystem (issue 30), on models built from configs and local files (never
from a hub):

- PyAV: a lossy H.264 mp4 in yuv420p (what phones and generators write), written by PyAV itself,
  reads back with its frame count, size and order; our reader gives PyAV's own decoded frames;
- torchvision and timm backbones load from a local state-dict file (.pth and .safetensors) and
  give the same scores as the model they were saved from; the feature width is the classifier's
  input width;
- HF ``TimesformerModel``: the detector feeds it (B, T, C, H, W) ``pixel_values`` (its
  convention) and its [CLS] state is the model's own ``last_hidden_state[:, 0]``;
- scikit-learn: the experiment's AUC and AP are ``roc_auc_score`` and ``average_precision_score``.
"""

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


def test_a_lossy_pyav_mp4_reads_back_in_order(tmp_path):
    import av

    from mixlab.vision_mm.mixforensics.video import read_video

    path = tmp_path / "phone.mp4"
    frames = [
        np.full((32, 48, 3), 20 * i, dtype=np.uint8) for i in range(10)
    ]  # brightness ramps up
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 48, 32, "yuv420p"
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    video = read_video(path)
    assert video.shape == (10, 3, 32, 48)
    assert (video.float().mean((1, 2, 3)).diff() > 0).all()
    with av.open(str(path)) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert torch.equal(video, torch.from_numpy(decoded).permute(0, 3, 1, 2))
    assert read_video(path, frames=4, size=16).shape == (4, 3, 16, 16)


@pytest.mark.parametrize(
    ("name", "suffix"), [("torchvision/resnet18", ".pth"), ("resnet10t", ".safetensors")]
)
def test_backbones_load_from_local_files(name, suffix, tmp_path):
    from safetensors.torch import save_file

    from mixlab.vision_mm.mixforensics.model import MixForensicsDetector, build_backbone

    torch.manual_seed(0)
    source = build_backbone(name)
    path = tmp_path / f"weights{suffix}"
    if suffix == ".pth":  # a classifier's checkpoint: its fc weights are dropped with the head
        classifier = {**source.state_dict(), "fc.weight": torch.zeros(1000, source.feature_dim),
                      "fc.bias": torch.zeros(1000)}  # fmt: skip
        torch.save(classifier, path)
    else:
        save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    torch.manual_seed(1)  # other random weights, replaced by the file's
    loaded = build_backbone(name, path)
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(images), source.eval()(images))
        assert loaded(images).shape == (2, loaded.feature_dim)
    with pytest.raises(ValueError, match="does not fit the backbone"):
        build_backbone("small-cnn", path)  # another architecture's weights are refused
    detector = MixForensicsDetector(loaded, blends=2).eval()
    with torch.no_grad():
        assert detector(torch.rand(1, 4, 3, 32, 32)).shape == (1,)


def test_timesformer_reads_b_t_c_h_w_pixel_values():
    from mixlab.vision_mm.mixforensics.model import TimeSformerDetector

    torch.manual_seed(0)
    detector = TimeSformerDetector(
        image_size=16, frames=4, patch_size=4, hidden_size=16, layers=1
    ).eval()
    video = torch.rand(2, 4, 3, 16, 16)
    with torch.no_grad():
        cls = detector.model(pixel_values=(video - 0.5) / 0.25).last_hidden_state[:, 0]
        torch.testing.assert_close(detector(video), torch.sigmoid(detector.head(cls).squeeze(-1)))
    assert detector.model.config.num_frames == 4


def test_metrics_are_scikit_learns():
    from sklearn.metrics import average_precision_score, roc_auc_score

    from mixlab.vision_mm.mixforensics.experiment import scores_metrics

    rng = np.random.default_rng(0)
    real, fake = rng.uniform(size=40), rng.uniform(0.3, 1, size=30)
    truth, scores = np.r_[np.zeros(40), np.ones(30)], np.r_[real, fake]
    found = scores_metrics(real, fake)
    assert found["auc"] == pytest.approx(roc_auc_score(truth, scores))
    assert found["ap"] == pytest.approx(average_precision_score(truth, scores))
    assert found["acc"] == pytest.approx(0.5 * (np.mean(real < 0.5) + np.mean(fake >= 0.5)))
