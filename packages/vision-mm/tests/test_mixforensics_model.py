"""MixForensics' pieces: Stochastic Frame Blending, the BIR loss, the detectors' votes and pass
counts, the clips, video files through PyAV, seeded training, and the input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mixlab.vision_mm.mixforensics.blend import (
    BlendInvarianceLoss,
    StochasticFrameBlend,
    high_pass,
    js_divergence,
)
from mixlab.vision_mm.mixforensics.model import (
    DeCoF,
    FrameDifference,
    FrameVoting,
    MeanFrame,
    MixForensicsDetector,
    SmallCNN,
    TimeSformerDetector,
    build_detector,
    load_detector,
    save_detector,
)


def _video(batch=2, frames=8, size=16, seed=0):
    return torch.rand(batch, frames, 3, size, size, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------- blend
@pytest.mark.parametrize("domain", ["pixel", "residual"])
def test_blending_identical_frames_returns_the_frame(domain):
    frame = torch.rand(3, 16, 16)
    clip = frame.expand(6, -1, -1, -1)
    blend = StochasticFrameBlend(n_max=5, domain=domain, seed=0)
    expected = high_pass(frame[None])[0] if domain == "residual" else frame
    torch.testing.assert_close(blend(clip), expected)
    torch.testing.assert_close(blend.uniform(clip), expected)


def test_one_hot_weights_give_one_frame():
    clip = _video(1, 5)
    weights = torch.zeros(1, 5)
    weights[0, 3] = 1
    out = torch.einsum("bt,btchw->bchw", weights, clip)
    torch.testing.assert_close(out, clip[:, 3])
    # a fixed blend of a one-frame budget is that frame itself
    torch.testing.assert_close(StochasticFrameBlend.fixed_weights(1, 1), torch.ones(1, 1))


def test_dirichlet_weights_sum_to_one_with_mean_one_over_n():
    blend = StochasticFrameBlend(n_max=2, alpha=1.0, seed=1)  # n = 2 always
    weights = blend.sample_weights(4000, 6)
    torch.testing.assert_close(weights.sum(1), torch.ones(4000))
    assert ((weights > 0).sum(1) == 2).all()
    nonzero = weights[weights > 0]
    assert abs(float(nonzero.mean()) - 0.5) < 0.02
    many = StochasticFrameBlend(n_max=4, seed=2).sample_weights(2000, 8)
    counts = (many > 0).sum(1)
    assert set(counts.tolist()) == {2, 3, 4}


def test_strided_sampling_keeps_equal_gaps():
    weights = StochasticFrameBlend(n_max=4, sampling="strided", seed=3).sample_weights(200, 8)
    for row in weights:
        chosen = torch.nonzero(row).flatten()
        gaps = chosen.diff()
        assert (gaps == gaps[0]).all()


def test_uniform_blend_ignores_frame_order():
    clip = _video(2, 7)
    blend = StochasticFrameBlend()
    torch.testing.assert_close(blend.uniform(clip), blend.uniform(clip[:, torch.randperm(7)]))


def test_fixed_blends_use_every_frame_once():
    weights = StochasticFrameBlend.fixed_weights(8, 4)
    assert weights.shape == (4, 8)
    torch.testing.assert_close(weights.sum(0), torch.full((8,), 0.5))
    assert ((weights > 0).sum(0) == 1).all()


def test_seeded_blends_are_deterministic():
    clip = _video()
    a = StochasticFrameBlend(seed=5)(clip)
    b = StochasticFrameBlend(seed=5)(clip)
    torch.testing.assert_close(a, b)
    assert not torch.equal(a, StochasticFrameBlend(seed=6)(clip))


# --------------------------------------------------------------------------------------- BIR
def test_js_is_symmetric_and_zero_for_equal_predictions():
    a, b = torch.randn(50), torch.randn(50)
    torch.testing.assert_close(js_divergence(a, b), js_divergence(b, a))
    assert float(js_divergence(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(js_divergence(a, b)) > 0
    assert float(js_divergence(torch.tensor([20.0]), torch.tensor([-20.0]))) <= np.log(2) + 1e-5


def test_consistency_gradient_is_zero_when_both_blends_coincide():
    logits = torch.randn(8, requires_grad=True)
    z = torch.randn(8, 5, requires_grad=True)
    loss = BlendInvarianceLoss(consistency=10.0, embedding=3.0)
    both, _ = loss(torch.stack([logits, logits]), torch.ones(8), torch.stack([z, z]))
    plain, _ = BlendInvarianceLoss(0.0, 0.0)(torch.stack([logits, logits]), torch.ones(8))
    g_both = torch.autograd.grad(both, (logits, z), allow_unused=True)
    g_plain = torch.autograd.grad(plain, logits)[0]
    torch.testing.assert_close(g_both[0], g_plain)
    torch.testing.assert_close(g_both[1], torch.zeros_like(z))


# ---------------------------------------------------------------------------------- detectors
def test_mean_voting_equals_the_mean_of_frame_probabilities():
    torch.manual_seed(0)
    detector = FrameVoting(SmallCNN(widths=(4, 8))).eval()
    video = _video(3, 5)
    with torch.no_grad():
        frames = detector.frame_probabilities(video)
        torch.testing.assert_close(detector(video), frames.mean(1))
        detector.vote = "majority"
        torch.testing.assert_close(detector(video), (frames > 0.5).float().mean(1))


def test_pass_counts_are_r_blends_and_t_frames():
    torch.manual_seed(0)
    video = _video(2, 8)
    cnn = lambda: SmallCNN(widths=(4, 8))  # noqa: E731
    cases = [(MixForensicsDetector(cnn(), blends=4), 4), (MixForensicsDetector(cnn(), uniform=True), 1),
             (FrameVoting(cnn()), 8), (MeanFrame(cnn()), 1), (FrameDifference(cnn()), 7), (DeCoF(cnn()), 8),
             (TimeSformerDetector(image_size=16, frames=8, patch_size=4, hidden_size=16, layers=1), 1)]  # fmt: skip
    for detector, passes in cases:
        with torch.no_grad():
            p = detector.eval()(video)
        assert p.shape == (2,)
        assert ((p >= 0) & (p <= 1)).all()
        assert detector.passes == passes, type(detector).__name__


def test_mixforensics_averages_probabilities_over_fixed_blends():
    torch.manual_seed(0)
    detector = MixForensicsDetector(SmallCNN(widths=(4, 8)), blends=2).eval()
    video = _video(2, 4)
    with torch.no_grad():
        composites = detector.blend.fixed(video, 2)
        by_hand = torch.stack(
            [torch.sigmoid(detector.encode(composites[:, r])[0]) for r in range(2)], 1
        ).mean(1)
        torch.testing.assert_close(detector(video), by_hand)


def test_frozen_encoder_is_not_trained():
    from mixlab.vision_mm.mixforensics.training import train_detector

    torch.manual_seed(0)
    detector = FrameVoting(SmallCNN(widths=(4, 8)), frozen=True)
    before = {k: v.clone() for k, v in detector.backbone.state_dict().items()}
    train_detector(detector, (_video(8, 4) * 255).byte(), torch.tensor([0, 1] * 4), 2, batch_size=4)
    for key, value in detector.backbone.state_dict().items():
        torch.testing.assert_close(value, before[key])


def test_seeded_training_is_deterministic(tmp_path):
    from mixlab.vision_mm.mixforensics.training import train_detector

    clips = (_video(16, 4, seed=1) * 255).byte()
    labels = torch.tensor([0, 1] * 8)
    outputs = []
    for _ in range(2):
        torch.manual_seed(0)
        detector = build_detector("sfb-bir", frames=4, size=16, blends=2)
        history = train_detector(detector, clips, labels, 3, batch_size=4, seed=7,
                                 loss=BlendInvarianceLoss(4.0))  # fmt: skip
        outputs.append((history, detector(clips[:4])))
    assert outputs[0][0] == outputs[1][0]
    torch.testing.assert_close(outputs[0][1], outputs[1][1])


def test_saved_detector_loads_to_the_same_scores(tmp_path):
    torch.manual_seed(0)
    spec = {"system": "sfb-bir", "backbone": "small-cnn", "frames": 4, "size": 16, "blends": 2}
    detector = build_detector(**spec).eval()
    save_detector(detector, tmp_path / "model", spec)
    loaded, saved = load_detector(tmp_path / "model")
    video = _video(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(loaded(video), detector(video))
    assert saved == spec


def test_torchvision_and_timm_backbones_plug_in():
    from mixlab.vision_mm.mixforensics.model import build_backbone

    # torchvision (an fc head; a classifier whose hidden layers stay; a norm and flatten that stay), timm
    for name in ("torchvision/resnet18", "mobilenet_v3_small", "torchvision/convnext_tiny", "resnet10t",
                 "timm/resnet18"):  # fmt: skip
        backbone = build_backbone(name)
        with torch.no_grad():
            assert backbone.eval()(torch.rand(2, 3, 32, 32)).shape == (2, backbone.feature_dim)
        detector = MixForensicsDetector(backbone, blends=2).eval()
        with torch.no_grad():
            assert detector(_video(1, 4, 32)).shape == (1,)
        assert detector.passes == 2


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_garbage_backbone_checkpoint_is_refused_by_name(tmp_path, suffix):
    """Issue 80: a --checkpoint file of garbage was a torch.load / safetensors traceback."""
    from mixlab.shared.files import CheckpointError
    from mixlab.vision_mm.mixforensics.model import build_backbone

    garbage = tmp_path / f"weights{suffix}"
    garbage.write_bytes(b"not weights at all" * 10)
    with pytest.raises(CheckpointError, match="damaged or not a weights file"):
        build_backbone("small-cnn", garbage)
    listing = tmp_path / "list.pt"
    torch.save([1, 2, 3], listing)
    with pytest.raises(ValueError, match="holds no state dict of tensors"):
        build_backbone("small-cnn", listing)


def test_bad_inputs_are_refused_by_name():
    detector = MixForensicsDetector(SmallCNN(widths=(4, 8)))
    with pytest.raises(ValueError, match="at least 2 frames"):
        detector(_video(2, 1))
    with pytest.raises(ValueError, match=r"\(B, C, T, H, W\)"):
        detector(_video(2, 8).transpose(1, 2))
    with pytest.raises(ValueError, match="alpha must be"):
        StochasticFrameBlend(alpha=0.0)
    with pytest.raises(ValueError, match="n_max must be"):
        StochasticFrameBlend(n_max=1)
    with pytest.raises(ValueError, match="blends must be"):
        StochasticFrameBlend().fixed(_video(), 0)
    with pytest.raises(ValueError, match="blends must be"):
        MixForensicsDetector(SmallCNN(widths=(4, 8)), blends=0)
    with pytest.raises(ValueError, match="backbone must be"):
        build_detector("sfb", backbone="no-such-net")
    with pytest.raises(ValueError, match="backbone must be"):
        build_detector("sfb", backbone="keras/resnet18")
    # more blends than a clip's frames can give is refused, not capped (6 frames: at most 3)
    with pytest.raises(ValueError, match="blends must be at most 3 for 6 frames"):
        MixForensicsDetector(SmallCNN(widths=(4, 8)), blends=4)(_video(1, 6))
    with pytest.raises(ValueError, match="blends must be at most 1 for 1 frames"):
        StochasticFrameBlend.fixed_weights(1, 4)
    with pytest.raises(ValueError, match="blends must be at most 2 for 4 frames"):
        build_detector("sfb", frames=4, size=16)  # refused when built, not when first scored


def test_a_name_both_libraries_know_must_say_which():
    from mixlab.vision_mm.mixforensics.model import build_backbone

    with pytest.raises(
        ValueError, match="names both a torchvision and a timm model: say 'torchvision/resnet18'"
    ):
        build_backbone("resnet18")
    assert type(build_backbone("timm/resnet18")).__module__.startswith("timm")
    assert type(build_backbone("torchvision/resnet18")).__module__.startswith("torchvision")


def test_each_backbone_gets_its_own_normalisation():
    import timm

    from mixlab.vision_mm.mixforensics.model import IMAGENET_MEAN, IMAGENET_STD, normalise

    images = torch.full((1, 3, 8, 8), 0.5)
    clip = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0)  # raw timm
    mean, std = clip.pretrained_cfg["mean"], clip.pretrained_cfg["std"]
    assert mean != IMAGENET_MEAN  # timm's ViTs expect 0.5 / 0.5
    want = (0.5 - torch.tensor(mean)) / torch.tensor(std)
    torch.testing.assert_close(normalise(images, clip)[0, :, 0, 0], want.float())
    plain = torch.nn.Conv2d(3, 4, 3)  # no statistics of its own: ImageNet's
    want = (0.5 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(normalise(images, plain)[0, :, 0, 0], want.float())
    small = SmallCNN(widths=(4, 8))  # from scratch: 0.5 / 0.25, built directly or by name
    torch.testing.assert_close(normalise(images, small), torch.zeros_like(images))


# ------------------------------------------------------------------------------- clips, video
def test_clips_are_uint8_and_seeded():
    from mixlab.vision_mm.mixforensics.clips import FAMILIES, PARTIAL, make_set

    kinds = ["real", *FAMILIES, *PARTIAL]
    a = make_set(kinds, 3, frames=4, size=16)
    assert a.shape == (len(kinds), 4, 3, 16, 16)
    assert a.dtype == torch.uint8
    assert torch.equal(a, make_set(kinds, 3, frames=4, size=16))
    # family C reuses one noise field: its frame-to-frame change is smaller than a real clip's
    reused = make_set(["C"] * 6, 4, frames=4, size=16).float()
    real = make_set(["real"] * 6, 4, frames=4, size=16).float()
    assert (reused.diff(dim=1).abs().mean()) < (real.diff(dim=1).abs().mean())


def test_an_mp4_written_with_pyav_reads_back(tmp_path):
    from mixlab.vision_mm.mixforensics.video import read_video, write_video

    clip = (torch.rand(6, 3, 16, 16) * 255).byte()
    assert torch.equal(read_video(write_video(tmp_path / "a.mp4", clip)), clip)  # lossless mp4
    back = read_video(write_video(tmp_path / "b.avi", clip))
    assert back.shape == clip.shape
    assert read_video(tmp_path / "a.mp4", frames=3, size=8).shape == (3, 3, 8, 8)


def test_frame_folders_and_bad_files(tmp_path):
    from PIL import Image

    from mixlab.vision_mm.mixforensics.video import read_video

    (tmp_path / "frames").mkdir()
    for i, size in enumerate((16, 16, 12)):
        Image.new("RGB", (size, size)).save(tmp_path / "frames" / f"{i}.png")
    with pytest.raises(ValueError, match="frames of different sizes"):
        read_video(tmp_path / "frames")
    (tmp_path / "frames" / "2.png").unlink()
    assert read_video(tmp_path / "frames").shape == (2, 3, 16, 16)
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(ValueError, match="cannot be read"):
        read_video(tmp_path / "bad.mp4")


def test_frame_folders_sort_naturally(tmp_path):
    from PIL import Image

    from mixlab.vision_mm.mixforensics.video import read_video

    for i in (1, 2, 10):
        Image.new("RGB", (8, 8), (20 * i, 0, 0)).save(tmp_path / f"frame_{i}.png")
    assert read_video(tmp_path)[:, 0, 0, 0].tolist() == [20, 40, 200]
    with pytest.raises(ValueError, match="frames must be"):
        read_video(tmp_path, frames=0)
