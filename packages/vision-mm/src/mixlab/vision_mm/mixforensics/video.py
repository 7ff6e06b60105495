"""Video files in and out through PyAV (its wheels bundle FFmpeg): mp4, avi, mkv, mov, webm, gif,
or a folder of frames (png/jpg/bmp). Every video is resized by the same function, so real and
fake videos never differ by their resizing (a known shortcut in forensics data)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".gif")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def read_video(
    path: str | Path, *, frames: int | None = None, size: int | None = None
) -> torch.Tensor:
    """A video file or frame folder (frames in natural order: 2 before 10) as uint8 (T, 3, H, W).
    ``frames``: keep that many frames spread evenly over the video (repeated when it is
    shorter); ``size``: resize every frame to size × size (antialiased bilinear). Only the kept
    frames are converted and each is resized as it is read, so a long high-resolution video
    costs the memory of its kept frames. Raises ``ValueError`` naming the file when it cannot be
    read or its frames differ in size."""
    from mixlab.shared.checks import check_count

    if frames is not None:
        check_count(frames, "frames")
    if size is not None:
        check_count(size, "size")
    path = Path(path)
    if path.is_dir():
        files = sorted(
            (p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES), key=_natural
        )
        if not files:
            raise ValueError(f"video folder {str(path)!r} holds no {list(FRAME_SUFFIXES)} frames")
        keep = _spread(len(files), frames)
        arrays = {i: _read_image(files[i]) for i in sorted(set(keep))}
    else:
        arrays, count = _decode(path, frames)
        keep = _spread(count, frames)
    shapes = {a.shape for a in arrays.values()}
    if len(shapes) > 1:
        raise ValueError(f"video {str(path)!r} has frames of different sizes: {sorted(shapes)}")
    kept = {i: torch.from_numpy(a).permute(2, 0, 1) for i, a in arrays.items()}
    if size is not None:
        kept = {i: resize(frame[None], size)[0] for i, frame in kept.items()}
    return torch.stack([kept[i] for i in keep]).contiguous()


def _natural(path: Path) -> list:
    """Sort key that orders frame_2 before frame_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _spread(count: int, frames: int | None) -> list[int]:
    if frames is None:
        return list(range(count))
    return torch.linspace(0, count - 1, frames).round().long().tolist()


def resize(video: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 (T, C, H, W) frames resized to size × size (antialiased bilinear)."""
    if video.shape[-2:] == (size, size):
        return video
    out = F.interpolate(
        video.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False
    )
    return out.round().clamp(0, 255).to(torch.uint8)


def _read_image(path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return np.array(image.convert("RGB"))  # a writable copy for torch
    except (OSError, UnidentifiedImageError) as error:
        raise ValueError(f"frame {str(path)!r} cannot be read: {error}") from None


def _decode(path: Path, frames: int | None, count: int = 0) -> tuple[dict[int, np.ndarray], int]:
    """({index: RGB array} of the frames :func:`_spread` keeps, frame count). Only the kept frames
    are converted: with the count known (``count``, else the container's own) in one pass, else
    after a first pass that counts (also when the container's count was wrong)."""
    import av

    if not path.is_file():
        raise ValueError(f"video {str(path)!r} does not exist")
    try:
        with av.open(str(path)) as container:
            known = count or container.streams.video[0].frames
            if known > 0:
                wanted: set[int] | None = set(_spread(known, frames))
            else:  # count first (converting nothing) when only some frames are kept
                wanted = None if frames is None else set()
            arrays, found = {}, 0
            for index, frame in enumerate(container.decode(video=0)):
                if wanted is None or index in wanted:
                    arrays[index] = frame.to_ndarray(format="rgb24")
                found = index + 1
    except (av.error.FFmpegError, IndexError, ValueError) as error:
        raise ValueError(f"video {str(path)!r} cannot be read as a video: {error}") from None
    if found == 0:
        raise ValueError(f"video {str(path)!r} holds no video frames")
    keep = set(_spread(found, frames))
    if not keep <= arrays.keys():  # the count was unknown or wrong: read the kept frames again
        return _decode(path, frames, found)
    return {i: a for i, a in arrays.items() if i in keep}, found


def write_video(
    path: str | Path, video: torch.Tensor, *, fps: int = 8, lossless: bool = True
) -> Path:
    """Write uint8 (T, 3, H, W) frames as mp4 (H.264; ``lossless``: qp 0 in RGB, so that the
    traces of a procedural clip survive), avi (FFV1 in YUV 4:4:4: within a few levels) or gif (a 256-colour palette)."""
    import av

    path = Path(path)
    suffix = path.suffix.lower()
    frames = video.permute(0, 2, 3, 1).contiguous().numpy()
    codec, pixel, options = {
        ".mp4": ("libx264rgb", "rgb24", {"qp": "0"} if lossless else {"crf": "23"}),
        ".avi": ("ffv1", "yuv444p", {}),
        ".gif": ("gif", "rgb8", {}),
    }.get(suffix, (None, None, None))
    if codec is None:
        raise ValueError(f"path must end in .mp4, .avi or .gif, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = pixel
        stream.options = options
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
