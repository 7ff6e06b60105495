"""Video detectors that share one interface: ``forward(video)`` on (B, T, C, H, W) floats in
[0, 1] (or uint8) returns p(fake) per video and sets ``passes``, the image-encoder passes it spent
per video; ``training_logits(video, rng)`` returns (V, B) logits of the V views a training step
sees, with their (V, B, d) embeddings, for :class:`~.blend.BlendInvarianceLoss`.

- :class:`MixForensicsDetector`: blend-then-encode, p averaged over R fixed blends (R passes);
- :class:`FrameVoting`: encode-then-fuse, per-frame training as CNNSpot's (end to end, without
  its blur and JPEG augmentation) or a UnivFD-style linear head on a frozen encoder (UnivFD's is
  CLIP's ViT-L/14; here any backbone), with mean or majority voting (T passes);
- :class:`MeanFrame` (the deterministic mean composite, 1 pass), :class:`FrameDifference`
  (a CNN on consecutive differences, T − 1 passes), :class:`DeCoF` (DeCoF-style frame
  consistency of a frozen encoder's features through an MLP, T passes; DeCoF's is a transformer
  on CLIP features) and :class:`TimeSformerDetector` (HF ``TimesformerModel``, divided
  space-time attention, one pass over the whole clip).

Backbones (:func:`build_backbone`) normalise their input as their weights expect (``input_mean``,
``input_std``); a module without them gets timm's ``pretrained_cfg`` statistics when it has
one, else ImageNet's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mixlab.shared.checks import check_choice, check_count
from mixlab.vision_mm.mixforensics.blend import (
    BlendInvarianceLoss,
    StochasticFrameBlend,
    check_video,
    high_pass,
)

VOTES = ("mean", "majority")


def as_float_video(video: torch.Tensor) -> torch.Tensor:
    """uint8 videos to floats in [0, 1]; float videos unchanged (checked for shape)."""
    check_video(video)
    return unit_range(video)


def unit_range(video: torch.Tensor) -> torch.Tensor:
    """uint8 frames as floats in [0, 1]; float frames unchanged."""
    return video.float() / 255.0 if video.dtype == torch.uint8 else video


def evenly_spaced(frames: int, count: int) -> torch.Tensor:
    """``count`` frame indices spread over ``frames`` (the frame budget of an evaluation)."""
    return torch.linspace(0, frames - 1, count).round().long()


# ---------------------------------------------------------------------------------- backbones
class SmallCNN(nn.Module):
    """A forensic CNN of about 0.3 M parameters: four stages of two 3×3 conv–BN–ReLU layers
    (16, 32, 64, 128 channels), full resolution in the first stage so that pixel-level traces
    survive, 2× average pooling between stages and global average pooling at the end (13 M
    multiply-adds per 32² image); trained from scratch on inputs centred at 0.5, std 0.25."""

    input_mean, input_std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

    def __init__(self, in_channels: int = 3, widths: tuple[int, ...] = (16, 32, 64, 128)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        previous = in_channels
        for i, width in enumerate(widths):
            if i > 0:
                layers.append(nn.AvgPool2d(2))
            for _ in range(2):
                layers += [nn.Conv2d(previous, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                           nn.ReLU(inplace=True)]  # fmt: skip
                previous = width
        self.features = nn.Sequential(*layers)
        self.feature_dim = previous
        self.to(memory_format=torch.channels_last)  # about 1.4× faster convolutions on a CPU

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.features(images.contiguous(memory_format=torch.channels_last)).mean((-2, -1))


def build_backbone(name: str = "small-cnn", checkpoint: str | Path | None = None) -> nn.Module:
    """An image backbone mapping (N, 3, H, W) to (N, d) with ``feature_dim = d``: ``small-cnn``,
    a torchvision classifier (``torchvision/resnet18``, ``torchvision/efficientnet_b0``, …) or a
    timm model (``timm/resnet18``, ``timm/vit_tiny_patch16_224``, …); a bare name is allowed where
    only one of the two libraries has it (``mobilenet_v3_small``, ``resnet10t``) and refused where
    both do (``resnet18``: say which). Always built from its config (random weights) and then
    loaded from the local ``checkpoint`` file (.safetensors, .pt or .pth state dict, with or
    without its classifier) when given; nothing is downloaded. ``input_mean``/``input_std`` are
    the normalisation its weights expect: ImageNet's for torchvision, the model's
    ``pretrained_cfg`` for timm, 0.5/0.25 for ``small-cnn``."""
    if name == "small-cnn":
        model: nn.Module = SmallCNN()
        if checkpoint is not None:
            _load_backbone(model, Path(checkpoint))
        return model
    import timm
    import torchvision

    library, _, bare = name.rpartition("/")
    in_torchvision = bare in torchvision.models.list_models(module=torchvision.models)
    in_timm = timm.is_model(bare)
    if library not in ("", "timm", "torchvision"):
        in_torchvision = in_timm = False
    elif library == "" and in_torchvision and in_timm:
        raise ValueError(
            f"backbone {name!r} names both a torchvision and a timm model: say "
            f"'torchvision/{bare}' or 'timm/{bare}'"
        )
    if library in ("", "torchvision") and in_torchvision:
        model = torchvision.models.get_model(bare, weights=None)
        if checkpoint is not None:  # before the head goes: a classifier's checkpoint fits whole
            _load_backbone(model, Path(checkpoint))
        _drop_last_linear(model, name)
        model.input_mean, model.input_std = IMAGENET_MEAN, IMAGENET_STD
    elif library in ("", "timm") and in_timm:
        model = timm.create_model(bare, pretrained=False, num_classes=0)
        if checkpoint is not None:
            _load_backbone(model, Path(checkpoint))
        model.input_mean, model.input_std = _timm_statistics(model)
    else:
        raise ValueError(
            "backbone must be 'small-cnn', a torchvision classifier or a timm model name "
            f"(optionally 'torchvision/…' or 'timm/…'), got {name!r}"
        )
    model.feature_dim = _feature_width(model, name)
    return model


def _timm_statistics(model: nn.Module) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean and std a timm model's weights expect (ImageNet's when it does not say)."""
    config = getattr(model, "pretrained_cfg", None) or {}
    return tuple(config.get("mean", IMAGENET_MEAN)), tuple(config.get("std", IMAGENET_STD))


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _drop_last_linear(model: nn.Module, name: str) -> None:
    """Replace the classifier's last ``nn.Linear`` (``fc``, ``classifier[-1]``, ``head``,
    ``heads.head``) with the identity, keeping what comes before it (VGG's hidden layers,
    ConvNeXt's norm and flatten)."""
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"backbone {name!r} has no linear classifier to remove")
    *parents, last = linears[-1].split(".")
    parent = model.get_submodule(".".join(parents)) if parents else model
    setattr(parent, last, nn.Identity())


def _feature_width(model: nn.Module, name: str) -> int:
    """The width of the backbone's (N, d) output, measured on one 224² image."""
    was_training = model.training
    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros(1, 3, 224, 224))
    except Exception as error:
        raise ValueError(
            f"backbone {name!r} cannot be used as an image encoder here: {error}"
        ) from None
    finally:
        model.train(was_training)
    if out.ndim != 2:
        raise ValueError(
            f"backbone {name!r} must give (N, d) features without its classifier, got {tuple(out.shape)}"
        )
    return int(out.shape[1])


CLASSIFIER_KEYS = ("fc.", "classifier.", "head.", "heads.", "head_dist.")
"""state-dict prefixes of the classification heads a backbone drops (a classifier's checkpoint
carries them, a backbone's own does not)"""


def _load_backbone(model: nn.Module, path: Path) -> None:
    """Load a state dict into ``model``, allowing only a classifier's weights to be left over or
    absent: a checkpoint of another architecture is refused, not half-loaded."""
    state = {k.removeprefix("module."): v for k, v in _read_state(path).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith(CLASSIFIER_KEYS)]
    unexpected = [k for k in unexpected if not k.startswith(CLASSIFIER_KEYS)]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {str(path)!r} does not fit the backbone: {len(missing)} of its weights missing "
            f"(e.g. {missing[:2]}), {len(unexpected)} unknown (e.g. {unexpected[:2]})"
        )


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ValueError(
            f"checkpoint must be an existing .safetensors, .pt or .pth file, got {str(path)!r}"
        )
    from mixlab.shared.files import checkpoint_errors

    with checkpoint_errors(path, "weights file"):  # garbage was a loader traceback (issue 80)
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not (isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())):
        raise ValueError(f"checkpoint {str(path)!r} holds no state dict of tensors")
    return state


def normalise(images: torch.Tensor, backbone: nn.Module) -> torch.Tensor:
    """Images in [0, 1] (or residuals) to the input range the backbone's weights expect: its
    ``input_mean``/``input_std``; for a module built elsewhere (a raw timm or torchvision model)
    timm's ``pretrained_cfg`` statistics, else ImageNet's (not a guess of 0.5)."""
    if hasattr(backbone, "input_mean") and hasattr(backbone, "input_std"):
        mean, std = backbone.input_mean, backbone.input_std
    else:
        mean, std = _timm_statistics(backbone)
    mean = torch.tensor(mean, dtype=images.dtype, device=images.device).view(-1, 1, 1)
    return (images - mean) / torch.tensor(std, dtype=images.dtype, device=images.device).view(
        -1, 1, 1
    )


# ---------------------------------------------------------------------------------- detectors
class VideoDetector(nn.Module):
    """Base of every detector: an image backbone, a linear head and the pass count."""

    passes: int = 0

    def __init__(self, backbone: nn.Module, feature_dim: int | None = None) -> None:
        super().__init__()
        self.backbone = backbone
        dim = feature_dim if feature_dim is not None else getattr(backbone, "feature_dim", None)
        if dim is None:
            raise ValueError(
                "feature_dim must be given for a backbone without a feature_dim attribute"
            )
        self.head = nn.Linear(dim, 1)

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, embeddings) of (N, C, H, W) images in [0, 1] (or residuals)."""
        z = self.backbone(normalise(images, self.backbone))
        return self.head(z).squeeze(-1), z

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        return self.scores(as_float_video(video))

    def scores(self, video: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def training_logits(self, video: torch.Tensor, rng: np.random.Generator):  # pragma: no cover
        raise NotImplementedError


class MixForensicsDetector(VideoDetector):
    """Blend-then-encode: p(video) = mean over R = ``blends`` fixed blends of σ(h(φ(x̃ᵣ)))
    (R passes), or of one uniform blend (``uniform=True``: 1 pass). Training sees ``views``
    random SFB blends per clip."""

    def __init__(
        self, backbone: nn.Module, feature_dim: int | None = None, *, blend: StochasticFrameBlend | None = None,
        blends: int = 4, uniform: bool = False, views: int = 2,
    ) -> None:  # fmt: skip
        super().__init__(backbone, feature_dim)
        check_count(blends, "blends")
        check_count(views, "views")
        self.blend = blend if blend is not None else StochasticFrameBlend()
        self.blends, self.uniform, self.views = blends, uniform, views

    def scores(self, video: torch.Tensor) -> torch.Tensor:
        if self.uniform:
            composite = self.blend.prepare(video).mean(1, keepdim=True)
        else:  # a one-frame budget is that frame (one blend of weight 1)
            composite = self.blend.fixed(video, self.blends)
        batch, count = composite.shape[:2]
        logits, _ = self.encode(composite.flatten(0, 1))
        self.passes = count
        return torch.sigmoid(logits.view(batch, count)).mean(1)

    def training_logits(self, video, rng):
        prepared = self.blend.prepare(video)  # the residuals once, blended ``views`` times
        blended = torch.stack([self.blend.combine(prepared, rng) for _ in range(self.views)])
        logits, z = self.encode(blended.flatten(0, 1))
        return logits.view(self.views, -1), z.view(self.views, video.shape[0], -1)


class FrameVoting(VideoDetector):
    """Encode-then-fuse: p(video) = mean of per-frame p (``vote="mean"``) or the share of frames
    with p > 0.5 (``"majority"``), T passes. ``frozen=True`` freezes the backbone and trains only
    the linear head (UnivFD's recipe on a frozen encoder); ``residual=True`` encodes high-pass
    residuals (x − blur(x)) instead of pixels. Training sees ``views`` random frames per clip
    (CNNSpot's per-image training, with the clip's label)."""

    def __init__(
        self, backbone: nn.Module, feature_dim: int | None = None, *, vote: str = "mean", frozen: bool = False,
        residual: bool = False, views: int = 2,
    ) -> None:  # fmt: skip
        super().__init__(backbone, feature_dim)
        check_choice(vote, "vote", VOTES)
        self.vote, self.frozen, self.residual, self.views = vote, frozen, residual, views
        if frozen:
            self.backbone.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.frozen:
            self.backbone.eval()  # a frozen encoder keeps its batch-norm statistics
        return self

    def _frames(self, images: torch.Tensor) -> torch.Tensor:
        return high_pass(images) if self.residual else images

    def frame_probabilities(self, video: torch.Tensor) -> torch.Tensor:
        """(B, T) per-frame p(fake)."""
        logits, _ = self.encode(self._frames(video.flatten(0, 1)))
        return torch.sigmoid(logits.view(video.shape[:2]))

    def scores(self, video: torch.Tensor) -> torch.Tensor:
        probabilities = self.frame_probabilities(video)
        self.passes = video.shape[1]
        return vote(probabilities, self.vote)

    def training_logits(self, video, rng):
        rows = torch.arange(video.shape[0])
        frames = torch.from_numpy(rng.integers(video.shape[1], size=(self.views, video.shape[0])))
        images = torch.stack([video[rows, f] for f in frames])
        logits, z = self.encode(self._frames(images.flatten(0, 1)))
        return logits.view(self.views, -1), z.view(self.views, video.shape[0], -1)


def vote(probabilities: torch.Tensor, how: str = "mean") -> torch.Tensor:
    """Video scores from (B, T) frame probabilities: their mean, or the share above 0.5."""
    check_choice(how, "vote", VOTES)
    return probabilities.mean(1) if how == "mean" else (probabilities > 0.5).float().mean(1)


class MeanFrame(VideoDetector):
    """The deterministic mean-frame composite, trained and tested on it (1 pass); ``residual``:
    the mean of the high-pass residuals, SFB's input without its randomness."""

    def __init__(
        self, backbone: nn.Module, feature_dim: int | None = None, *, residual: bool = False
    ) -> None:
        super().__init__(backbone, feature_dim)
        self.residual = residual

    def _composite(self, video):
        return (high_pass(video) if self.residual else video).mean(1)

    def scores(self, video):
        self.passes = 1
        return torch.sigmoid(self.encode(self._composite(video))[0])

    def training_logits(self, video, rng):
        logits, z = self.encode(self._composite(video))
        return logits[None], z[None]


class FrameDifference(VideoDetector):
    """A CNN on consecutive frame differences fₜ₊₁ − fₜ (re-centred to [0, 1]), mean-voted over the
    T − 1 differences (T − 1 passes); training sees ``views`` random differences per clip."""

    def __init__(
        self, backbone: nn.Module, feature_dim: int | None = None, *, views: int = 2
    ) -> None:
        super().__init__(backbone, feature_dim)
        self.views = views

    @staticmethod
    def differences(video: torch.Tensor) -> torch.Tensor:
        return (video[:, 1:] - video[:, :-1]) / 2 + 0.5

    def scores(self, video):
        if video.shape[1] < 2:
            raise ValueError(
                f"video must have at least 2 frames for frame differences, got {video.shape[1]}"
            )
        diffs = self.differences(video)
        logits, _ = self.encode(diffs.flatten(0, 1))
        self.passes = diffs.shape[1]
        return torch.sigmoid(logits.view(diffs.shape[:2])).mean(1)

    def training_logits(self, video, rng):
        diffs = self.differences(video)
        rows = torch.arange(video.shape[0])
        picks = torch.from_numpy(rng.integers(diffs.shape[1], size=(self.views, video.shape[0])))
        images = torch.stack([diffs[rows, p] for p in picks])
        logits, z = self.encode(images.flatten(0, 1))
        return logits.view(self.views, -1), z.view(self.views, video.shape[0], -1)


class DeCoF(VideoDetector):
    """DeCoF (Ma et al. 2024), frame consistency in a frozen encoder's space: per-frame features
    zₜ (normalised), their steps Δₜ = zₜ₊₁ − zₜ, an MLP per step, mean over steps, a linear
    head (T passes of the frozen encoder)."""

    def __init__(
        self, backbone: nn.Module, feature_dim: int | None = None, *, hidden: int = 128
    ) -> None:
        super().__init__(backbone, feature_dim)
        self.backbone.requires_grad_(False)
        dim = self.head.in_features
        self.step = nn.Sequential(
            nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.GELU()
        )

    def train(self, mode: bool = True):
        super().train(mode)
        self.backbone.eval()
        return self

    def _logits(self, video):
        with torch.no_grad():
            z = F.normalize(
                self.backbone(normalise(video.flatten(0, 1), self.backbone)), dim=-1
            ).view(*video.shape[:2], -1)
        steps = (
            self.step(z[:, 1:] - z[:, :-1]).mean(1)
            if video.shape[1] > 1
            else torch.zeros_like(z[:, 0])
        )
        return self.head(steps).squeeze(-1), steps

    def scores(self, video):
        self.passes = video.shape[1]
        return torch.sigmoid(self._logits(video)[0])

    def training_logits(self, video, rng):
        logits, z = self._logits(video)
        return logits[None], z[None]


class TimeSformerDetector(nn.Module):
    """HF ``TimesformerModel`` (divided space-time attention) built from a config, with a linear
    head on the [CLS] token; one pass over the whole clip (its cost grows with T)."""

    passes: int = 0
    input_mean, input_std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)  # from scratch, as the small CNN

    def __init__(self, *, image_size: int = 32, frames: int = 8, patch_size: int = 4, hidden_size: int = 80,
                 layers: int = 3, heads: int = 4) -> None:  # fmt: skip
        super().__init__()
        from transformers import TimesformerConfig, TimesformerModel

        config = TimesformerConfig(image_size=image_size, patch_size=patch_size, num_channels=3,
                                   num_frames=frames, hidden_size=hidden_size, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=4 * hidden_size,
                                   attention_type="divided_space_time")  # fmt: skip
        self.model = TimesformerModel(config)
        self.head = nn.Linear(hidden_size, 1)
        self.frames = frames

    def _logits(self, video):
        z = self.model(pixel_values=normalise(video, self)).last_hidden_state[:, 0]
        return self.head(z).squeeze(-1), z

    def forward(self, video):
        return self.scores(as_float_video(video))

    def scores(self, video):
        self.passes = 1
        return torch.sigmoid(self._logits(video)[0])

    def training_logits(self, video, rng):
        logits, z = self._logits(video)
        return logits[None], z[None]


# ------------------------------------------------------------------------------ build and save
SYSTEMS = ("sfb-bir", "sfb", "voting", "voting-residual", "univfd-style", "decof-style", "frame-difference",
           "mean-frame", "timesformer")  # fmt: skip
"""detectors :func:`build_detector` makes (``sfb`` and ``sfb-bir`` differ only in their loss)"""


def build_detector(
    system: str = "sfb-bir", *, backbone: str = "small-cnn", frames: int = 8, size: int = 32, blends: int = 4,
    n_max: int = 4, alpha: float = 1.0, domain: str = "residual", encoder: nn.Module | None = None,
    timesformer_width: int = 80, timesformer_patch: int = 8, checkpoint: str | Path | None = None,
) -> nn.Module:  # fmt: skip
    """A fresh detector of ``system`` on a ``backbone`` (see :func:`build_backbone`, loaded from
    ``checkpoint`` when given); ``univfd-style`` and ``decof-style`` freeze ``encoder`` (default:
    the backbone). Their ``-style`` says what they are: UnivFD's recipe (a linear head on a frozen
    encoder) and DeCoF's idea (a classifier on the steps between frozen frame features) on
    whatever encoder is given, not CLIP ViT-L/14 and DeCoF's transformer."""
    check_choice(system, "system", SYSTEMS)
    if system == "timesformer":
        return TimeSformerDetector(image_size=size, frames=frames, patch_size=timesformer_patch,
                                   hidden_size=timesformer_width)  # fmt: skip
    if system in ("univfd-style", "decof-style"):
        frozen = encoder if encoder is not None else build_backbone(backbone, checkpoint)
        return FrameVoting(frozen, frozen=True) if system == "univfd-style" else DeCoF(frozen)
    if system in ("sfb", "sfb-bir"):
        StochasticFrameBlend.fixed_weights(frames, blends)  # more blends than frames give: refused
    image = build_backbone(backbone, checkpoint)
    if system in ("voting", "voting-residual"):
        return FrameVoting(image, residual=system == "voting-residual")
    if system == "frame-difference":
        return FrameDifference(image)
    if system == "mean-frame":
        return MeanFrame(image, residual=domain == "residual")
    return MixForensicsDetector(
        image, blend=StochasticFrameBlend(n_max, alpha, domain=domain), blends=blends
    )


def build_loss(
    system: str, consistency: float = 4.0, embedding: float = 0.0
) -> BlendInvarianceLoss:
    """The training loss of ``system``: BIR's for ``sfb-bir``, plain BCE on the views for every
    other (``sfb`` is SFB without BIR)."""
    if system == "sfb-bir":
        return BlendInvarianceLoss(consistency, embedding)
    return BlendInvarianceLoss(0.0, 0.0)


def save_detector(detector: nn.Module, folder: str | Path, spec: dict) -> Path:
    """``folder/detector.json`` (``spec``: the :func:`build_detector` arguments, with frames and
    size of the training clips) and ``folder/model.safetensors``."""
    import json

    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_model(detector, str(folder / "model.safetensors"))
    (folder / "detector.json").write_text(json.dumps(spec, indent=1))
    return folder


def load_detector(folder: str | Path) -> tuple[nn.Module, dict]:
    """(detector in eval mode, spec) saved by :func:`save_detector`."""
    import json

    from safetensors.torch import load_model

    folder = Path(folder)
    if not (folder / "detector.json").is_file() or not (folder / "model.safetensors").is_file():
        raise ValueError(
            f"--model must be a folder saved by `train` (detector.json, model.safetensors), got {str(folder)!r}"
        )
    spec = json.loads((folder / "detector.json").read_text())
    detector = build_detector(**spec)
    load_model(detector, str(folder / "model.safetensors"))
    return detector.eval(), spec
