"""MixForensics: blend-then-encode detection of AI-generated video (issue 30; the paper was not
found: Stochastic Frame Blending and Blend Invariance Regularisation are reconstructed from the
abstract on per-frame detectors, DeCoF, TimeSformer and AugMix, see seeds/mixforensics.md).

Several frames are blended into one composite before a single image encoder, so cues spread over
frames meet in one forward pass; BIR keeps two blends of a clip in agreement::

    detector = MixForensicsDetector(build_backbone("torchvision/resnet50", "r50.pth"), blends=4)
    train_detector(detector, clips, labels, steps=3000, loss=BlendInvarianceLoss(consistency=4.0))
    p_fake = detector(read_video("clip.mp4", frames=8, size=224)[None])   # detector.passes == 4
"""

from mixlab.shared.lazy import lazy_exports

_MODULE_OF = {
    "BlendInvarianceLoss": "blend",
    "DeCoF": "model",
    "FrameDifference": "model",
    "FrameVoting": "model",
    "MeanFrame": "model",
    "MixForensicsDetector": "model",
    "SmallCNN": "model",
    "StochasticFrameBlend": "blend",
    "TimeSformerDetector": "model",
    "build_backbone": "model",
    "build_detector": "model",
    "high_pass": "blend",
    "js_divergence": "blend",
    "load_detector": "model",
    "make_clip": "clips",
    "make_set": "clips",
    "predict": "training",
    "read_video": "video",
    "save_detector": "model",
    "train_detector": "training",
    "vote": "model",
    "write_video": "video",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF)
