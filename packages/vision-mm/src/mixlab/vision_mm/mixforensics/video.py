"""Video files in and out through PyAV (its wheels bundle FFmpeg): mp4, avi, mkv, mov, webm, gif,
or a folder of frames (png/jpg/bmp). Every video is resized by the same function, so real and
fake videos never differ by their resizing (a known shortcut in forensics data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

VIDEO_SUFFIXES = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".gif")
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def read_video(
    path: str | Path, *, frames: int | None = None, size: int | None = None
) -> torch.Tensor:
    """A video file or frame folder as uint8 (T, 3, H, W). ``frames``: keep that many frames
    spread evenly over the video; ``size``: resize every frame to size × size (antialiased
    bilinear). Raises ``ValueError`` naming the file when it cannot be read or its frames differ
    in size."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
        if not files:
            raise ValueError(f"video folder {str(path)!r} holds no {list(FRAME_SUFFIXES)} frames")
        arrays = [_read_image(p) for p in files]
    else:
        arrays = _decode(path)
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"video {str(path)!r} has frames of different sizes: {sorted(shapes)}")
    video = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    if frames is not None:
        video = video[torch.linspace(0, len(video) - 1, frames).round().long()]
    if size is not None:
        video = resize(video, size)
    return video


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
            return np.asarray(image.convert("RGB"))
    except (OSError, UnidentifiedImageError) as error:
        raise ValueError(f"frame {str(path)!r} cannot be read: {error}") from None


def _decode(path: Path) -> list[np.ndarray]:
    import av

    if not path.is_file():
        raise ValueError(f"video {str(path)!r} does not exist")
    try:
        with av.open(str(path)) as container:
            arrays = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    except (av.error.FFmpegError, IndexError, ValueError) as error:
        raise ValueError(f"video {str(path)!r} cannot be read as a video: {error}") from None
    if not arrays:
        raise ValueError(f"video {str(path)!r} holds no video frames")
    return arrays


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
