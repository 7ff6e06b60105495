"""A folder of multimodal question–answer samples: ``data.jsonl`` plus the files it names.

Each line: ``{"modalities": {"rgb": "rgb/00001.png", "depth": "depth/00001.npy"}, "question":
"...", "answer": "...", "type": "..."}`` (``type`` optional). A sample names the modalities it
has (at least one); images are ``.npy`` arrays [C, H, W] in [0, 1] or image files (PNG/JPEG, read
with Pillow as RGB, or as one channel when grayscale).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mixlab.vision_mm.mop.scenes import Scenes

__all__ = ["Samples", "read_samples", "write_samples"]


@dataclass
class Samples:
    """Parallel lists; ``images[i]`` maps each modality sample i has to its array [C, H, W]."""

    images: list[dict[str, np.ndarray]] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.questions)

    def modality_rows(self, modality: str) -> list[int]:
        """The samples that have ``modality``."""
        return [i for i, images in enumerate(self.images) if modality in images]


def _read_image(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        array = np.load(path).astype(np.float32)
        return array[None] if array.ndim == 2 else array
    from PIL import Image

    with Image.open(path) as image:
        grey = image.mode in ("L", "I", "I;16", "F")
        array = np.asarray(image.convert("L" if grey else "RGB"), dtype=np.float32) / 255.0
    return array[None] if grey else array.transpose(2, 0, 1)


def read_samples(folder: str | Path, modalities: tuple[str, ...] | None = None) -> Samples:
    """The samples of ``folder/data.jsonl``; ``modalities``: the names a sample may use (others
    are refused)."""
    folder = Path(folder)
    index = folder / "data.jsonl"
    if not index.is_file():
        raise FileNotFoundError(f"{folder} has no data.jsonl")
    samples = Samples()
    for number, line in enumerate(index.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{index}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error.msg})") from None
        files = record.get("modalities")
        if not isinstance(files, dict) or not files:
            raise ValueError(f"{where}: a sample needs at least one modality in 'modalities'")
        unknown = [m for m in files if modalities is not None and m not in modalities]
        if unknown:
            raise ValueError(
                f"{where}: unknown modality {unknown[0]!r}; allowed: {list(modalities)}"
            )
        for key in ("question", "answer"):
            if not isinstance(record.get(key), str):
                raise ValueError(f"{where}: {key!r} must be text")
        samples.images.append({m: _read_image(folder / path) for m, path in files.items()})
        samples.questions.append(record["question"])
        samples.answers.append(record["answer"])
        samples.types.append(str(record.get("type", "")))
    if not len(samples):
        raise ValueError(f"{index} holds no samples")
    return samples


def write_samples(
    folder: str | Path, scenes: Scenes, modalities: tuple[str, ...] | None = None
) -> Path:
    """Rendered ``scenes`` as a folder :func:`read_samples` reads (``.npy`` per modality; only
    ``modalities`` when given)."""
    folder = Path(folder)
    unknown = [m for m in modalities or () if m not in scenes.images]
    if unknown:
        raise ValueError(f"modalities must be names from {list(scenes.images)}, got {unknown}")
    lines = []
    for i in range(len(scenes)):
        files = {}
        for modality in modalities or tuple(scenes.images):
            images = scenes.images[modality]
            (folder / modality).mkdir(parents=True, exist_ok=True)
            files[modality] = f"{modality}/{scenes.scene[i]:05d}.npy"
            np.save(folder / files[modality], images[scenes.scene[i]])
        lines.append(json.dumps({"modalities": files, "question": scenes.questions[i],
                                 "answer": scenes.answers[i], "type": scenes.types[i]}))  # fmt: skip
    (folder / "data.jsonl").write_text("\n".join(lines) + "\n")
    return folder
