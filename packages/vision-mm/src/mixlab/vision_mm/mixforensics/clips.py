"""Procedural real and fake clips for the MixForensics experiment (nothing downloaded).

Real clips are camera moves (pan, zoom, small rotation) over scikit-image's pictures, with an
optional moving sprite, mild motion blur (two sub-frame renders averaged) and *independent*
per-frame sensor noise. A fake clip is the same kind of scene with one generator trace that is
weak in any single frame (spec §6(e)):

- ``A`` flickering high-frequency texture (band-pass noise re-drawn every frame, amplitude
  flickering from frame to frame);
- ``B`` up-sampling checkerboard (a period-2 grid locked to the pixel grid) whose phase drifts;
- ``C`` one noise field reused by every frame ("too consistent"), slightly smoother than sensor
  noise;
- ``D`` per-frame colour and exposure drift (unseen in training);
- ``E`` a background that warps non-rigidly over time (unseen in training).

Partial forgeries (the abstract's MixForensics-Bench scenarios) are built from the seen traces:
``splice`` (a fake segment of another scene cut into a real clip) against ``splice-control`` (the
same cut from the real version of that scene: the edit without the trace, which must score
real), and ``continuation`` (a real opening, the same scene continued with a trace: no edit),
scored against real clips.

Every clip comes out of one renderer at one size, so real and fake frames are resized identically.
Sources are split by picture: ``split="train"`` and ``split="test"`` never share one.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mixlab.shared import progress
from mixlab.vision_mm.mixforensics.blend import gaussian_blur, high_pass

SEEN = ("A", "B", "C")
UNSEEN = ("D", "E")
FAMILIES = (*SEEN, *UNSEEN)
PARTIAL = ("splice", "splice-control", "continuation")
TRAIN_PICTURES = ("astronaut", "coffee", "hubble_deep_field", "camera", "coins", "brick", "grass",
                  "page", "immunohistochemistry")  # fmt: skip
TEST_PICTURES = ("chelsea", "rocket", "retina", "moon", "gravel", "cell", "clock", "text")


@dataclass(frozen=True)
class Traces:
    """Strength of each generator trace (in [0, 1] pixel units unless said otherwise)."""

    flicker: float = 0.06
    """A: standard deviation of the band-pass texture (times a per-frame |N(0, 1)| flicker)"""
    checker: float = 0.065
    """B: amplitude of the period-2 grid"""
    checker_drift: float = 0.35
    """B: phase drift per frame (radians)"""
    smooth: float = 0.0
    """C: Gaussian blur (pixels) of the reused noise field before it is rescaled (0: the very
    distribution of sensor noise, so a single frame of C is indistinguishable from a real one)"""
    drift: float = 0.04
    """D: per-frame exposure and colour random-walk step"""
    warp: float = 0.8
    """E: displacement (pixels) of the non-rigid background warp"""
    sensor: tuple[float, float] = (0.015, 0.025)
    """every clip: range of the per-clip sensor noise standard deviation"""


@functools.cache
def picture(name: str, canvas: int) -> torch.Tensor:
    """scikit-image's picture ``name`` as (3, H, W) floats in [0, 1], short side ``canvas``."""
    import skimage.data

    array = getattr(skimage.data, name)()
    image = torch.from_numpy(np.asarray(array, dtype=np.float32) / 255.0)
    image = image[..., None].expand(-1, -1, 3) if image.ndim == 2 else image[..., :3]
    image = image.permute(2, 0, 1)[None]
    scale = canvas / min(image.shape[-2:])
    return F.interpolate(image, scale_factor=scale, mode="area" if scale < 1 else "bilinear",
                         recompute_scale_factor=False)[0].contiguous()  # fmt: skip


def _camera(rng: np.random.Generator, frames: int, size: int, canvas_hw: tuple[int, int]):
    """Affine grids (frames, 2 sub-frames, size, size, 2) of one smooth camera move."""
    hc, wc = canvas_hw
    half = size / 2 * rng.uniform(1.0, 1.6)
    zoom = rng.uniform(-0.1, 0.1)
    angle0, spin = rng.uniform(-0.2, 0.2), math.radians(rng.uniform(-1.5, 1.5))
    velocity = rng.uniform(-1.5, 1.5, size=2)
    reach = np.minimum(half * 1.45 + 1.5 * frames, np.array([wc, hc]) / 2)  # corners stay inside
    centre = rng.uniform(reach, np.array([wc, hc]) - reach)
    times = np.arange(frames)[:, None] + np.array([0.0, 0.5])[None]  # motion blur: two sub-frames
    theta = np.zeros((frames, 2, 2, 3), dtype=np.float32)
    h = half * (1 + zoom * times / frames)
    a = angle0 + spin * times
    cx, cy = centre[0] + velocity[0] * times, centre[1] + velocity[1] * times
    theta[..., 0, 0], theta[..., 0, 1] = h * np.cos(a) / (wc / 2), -h * np.sin(a) / (wc / 2)
    theta[..., 1, 0], theta[..., 1, 1] = h * np.sin(a) / (hc / 2), h * np.cos(a) / (hc / 2)
    theta[..., 0, 2], theta[..., 1, 2] = 2 * cx / wc - 1, 2 * cy / hc - 1
    theta = torch.from_numpy(theta).view(frames * 2, 2, 3)
    grid = F.affine_grid(theta, [frames * 2, 3, size, size], align_corners=False)
    return grid.view(frames, 2, size, size, 2)


def _warp_field(rng: np.random.Generator, frames: int, size: int, pixels: float) -> torch.Tensor:
    """E: a smooth displacement field (frames, size, size, 2) that changes over time (in
    normalised grid units), the non-rigid wobble a generator leaves in a background."""
    coarse = torch.from_numpy(rng.standard_normal((2, 2, 4, 4)).astype(np.float32))
    phase = torch.from_numpy(rng.uniform(0, 2 * math.pi, size=(2, 1, 1, 1)).astype(np.float32))
    t = torch.arange(frames, dtype=torch.float32).view(-1, 1, 1, 1, 1)
    field = coarse[0] * torch.sin(0.9 * t + phase[0]) + coarse[1] * torch.cos(0.7 * t + phase[1])
    field = F.interpolate(field.view(frames, 2, 4, 4), size=(size, size), mode="bicubic",
                          align_corners=False)  # fmt: skip
    return field.permute(0, 2, 3, 1) * (2 * pixels / size)


def _sprite(rng: np.random.Generator, frames: int, size: int):
    """(alpha, colour) of one anti-aliased disk crossing the frame, (frames, 1, size, size)."""
    radius = rng.uniform(2, 5)
    start, velocity = rng.uniform(0, size, size=2), rng.uniform(-2, 2, size=2)
    yy, xx = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    alpha = []
    for t in range(frames):
        cx, cy = start + velocity * t
        distance = torch.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        alpha.append((radius - distance + 0.5).clamp(0, 1))
    colour = torch.from_numpy(rng.uniform(0, 1, size=(3, 1, 1)).astype(np.float32))
    return torch.stack(alpha)[:, None], colour


def camera_move(
    canvas: torch.Tensor, rng: np.random.Generator, frames: int, size: int, *, warp: float = 0.0
):
    """(frames, 3, size, size) views of a (3, H, W) canvas along one smooth camera move (pan,
    zoom, small rotation), each the mean of two sub-frame renders (motion blur); ``warp`` > 0
    adds family E's non-rigid wobble to the sampling grid."""
    grid = _camera(rng, frames, size, tuple(canvas.shape[-2:]))
    if warp > 0:
        grid = grid + _warp_field(rng, frames, size, warp)[:, None]
    rendered = F.grid_sample(canvas[None].expand(frames * 2, -1, -1, -1), grid.view(frames * 2, size, size, 2),
                             mode="bilinear", padding_mode="reflection", align_corners=False)  # fmt: skip
    return rendered.view(frames, 2, 3, size, size).mean(1)


def _scene(
    rng: np.random.Generator,
    frames: int,
    size: int,
    split: str,
    warp: float = 0.0,
    source: str | None = None,
):
    """A clean scene (frames, 3, size, size): a camera move over one picture of ``split`` (or
    ``source``), an optional sprite, motion blur; ``warp`` > 0 adds family E's background wobble."""
    names = TRAIN_PICTURES if split == "train" else TEST_PICTURES
    name = names[rng.integers(len(names))]
    canvas = picture(name if source is None else source, 4 * size)
    clip = camera_move(canvas, rng, frames, size, warp=warp)
    gain = rng.uniform(0.8, 1.15)
    clip = clip * gain
    if rng.random() < 0.5:
        alpha, colour = _sprite(rng, frames, size)
        clip = clip * (1 - alpha) + colour * alpha
    return clip


def sensor_noise(
    rng: np.random.Generator, shape, sigma: float, *, reused: bool = False, smooth: float = 0.0
):
    """Sensor noise: independent per frame (real), or one field reused by every frame (C)."""
    frames = shape[0]
    if not reused:
        return sigma * torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    field = torch.from_numpy(rng.standard_normal((1, *shape[1:])).astype(np.float32))
    field = gaussian_blur(field, smooth)
    field = field / field.std()
    return (sigma * field).expand(frames, -1, -1, -1)


def _trace(
    family: str, clip: torch.Tensor, rng: np.random.Generator, traces: Traces
) -> torch.Tensor:
    """``clip`` with the additive trace of family A, B or D (C and E act on noise and geometry)."""
    frames, _, size, _ = clip.shape
    if family == "A":
        noise = torch.from_numpy(rng.standard_normal((frames, 1, size, size)).astype(np.float32))
        band = high_pass(noise)  # band-pass: fine structure, no flat component
        band = band / band.std()
        flicker = torch.from_numpy(np.abs(rng.standard_normal(frames)).astype(np.float32)).view(
            -1, 1, 1, 1
        )
        return clip + traces.flicker * flicker * band
    if family == "B":
        phase = rng.uniform(0, 2 * math.pi) + traces.checker_drift * np.arange(frames)
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        phases = torch.from_numpy(phase.astype(np.float32)).view(-1, 1, 1, 1)
        grid = torch.cos(math.pi * xx + phases) * torch.cos(math.pi * yy + phases / 2)
        return clip + traces.checker * (0.5 + clip) * grid
    if family == "D":
        steps = rng.standard_normal((frames, 4)).astype(np.float32) * traces.drift
        walk = torch.from_numpy(np.cumsum(steps, 0))
        exposure, colour = 1 + walk[:, :1], walk[:, 1:]
        return clip * exposure.view(-1, 1, 1, 1) + colour.view(-1, 3, 1, 1)
    raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")


def to_uint8(clip: torch.Tensor) -> torch.Tensor:
    """[0, 1] floats to uint8, as a video file would store them."""
    return (clip.clamp(0, 1) * 255).round().to(torch.uint8)


def make_clip(
    kind: str, rng: np.random.Generator, *, frames: int = 8, size: int = 32, split: str = "train",
    traces: Traces = Traces(), source: str | None = None,
) -> torch.Tensor:  # fmt: skip
    """One uint8 clip (frames, 3, size, size) of ``kind``: ``real``, a family in
    :data:`FAMILIES`, or a partial forgery in :data:`PARTIAL`; ``source`` names the picture of a
    real clip (default: one of ``split``'s, drawn)."""
    sigma = rng.uniform(*traces.sensor)
    if kind in PARTIAL:
        return _partial(kind, rng, frames=frames, size=size, split=split, traces=traces)
    if kind == "real":
        clip = _scene(rng, frames, size, split, source=source)
        return to_uint8(clip + sensor_noise(rng, clip.shape, sigma))
    if kind == "C":
        clip = _scene(rng, frames, size, split)
        return to_uint8(
            clip + sensor_noise(rng, clip.shape, sigma, reused=True, smooth=traces.smooth)
        )
    if kind == "E":
        clip = _scene(rng, frames, size, split, warp=traces.warp)
        return to_uint8(clip + sensor_noise(rng, clip.shape, sigma))
    clip = _scene(rng, frames, size, split)
    return to_uint8(_trace(kind, clip, rng, traces) + sensor_noise(rng, clip.shape, sigma))


def _partial(
    kind: str, rng: np.random.Generator, *, frames: int, size: int, split: str, traces: Traces
):
    """``continuation``: a real clip whose frames from ``cut`` on carry a seen trace (the
    generator continues the same scene: no cut). ``splice``: a real clip with frames
    [cut, cut + length) replaced by a fake segment of another scene (an edit and a trace);
    ``splice-control``: the same edit from the *real* version of that scene (an edit alone)."""
    if kind == "continuation":
        cut, end = int(rng.integers(frames // 4, frames // 2 + 1)), frames
    else:
        length = max(1, frames // 2 - 1 + int(rng.integers(0, 2)))
        cut = int(rng.integers(1, frames - length + 1))
        end = cut + length
    family = SEEN[rng.integers(len(SEEN))]
    host, inserted = rng.integers(2**63, size=2)
    common = {"frames": frames, "size": size, "split": split, "traces": traces}
    out = make_clip("real", np.random.default_rng(host), **common)
    source = host if kind == "continuation" else inserted  # the same scene, or another one
    segment = make_clip(
        "real" if kind == "splice-control" else family, np.random.default_rng(source), **common
    )
    out[cut:end] = segment[cut:end]
    return out


def jpeg(clip: torch.Tensor, quality: int = 75) -> torch.Tensor:
    """Every frame of a uint8 clip re-compressed as a JPEG of ``quality`` (PIL)."""
    from PIL import Image

    out = []
    for frame in clip.permute(0, 2, 3, 1).numpy():
        buffer = io.BytesIO()
        Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)
        out.append(np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()


def make_set(
    kinds: list[str], seed: int, *, frames: int = 8, size: int = 32, split: str = "train",
    traces: Traces = Traces(), sources: list[str] | None = None,
) -> torch.Tensor:  # fmt: skip
    """Clips of ``kinds`` (one each, in order) as one uint8 tensor (N, frames, 3, size, size);
    clip i is drawn from (seed, i), so a set is the same whatever else is generated.
    ``sources``: the picture of each (real) clip."""
    torch.set_flush_denormal(True)
    out = torch.empty((len(kinds), frames, 3, size, size), dtype=torch.uint8)
    with progress(len(kinds), f"{split} clips") as bar:
        for i, kind in enumerate(kinds):
            rng = np.random.default_rng([seed, i])
            source = None if sources is None else sources[i]
            out[i] = make_clip(
                kind, rng, frames=frames, size=size, split=split, traces=traces, source=source
            )
            bar.advance()
    return out
