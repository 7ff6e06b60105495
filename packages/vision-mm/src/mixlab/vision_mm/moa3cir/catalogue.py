"""A procedural product catalogue for composed image retrieval (issue 29, spec §5e).

An item is category (6 silhouettes) × colour (8) × pattern (4) × length (3) × material (4),
rendered at S² with jitter (shift, brightness, background, pattern phase, pixel noise). Material
shows only in the item's description: the part of an item that pixels do not carry.

Descriptions come from templates; with probability ``noise`` one attribute is dropped or replaced
by a wrong value (like real product titles). A triplet is (reference item, modification text,
target item): the target differs in the 1–2 attributes the text states and, with probability
``confound``, in one it does not (real CIR data's multi-attribute confounding). Controlled edits
(``confound=0``) are the exact counterfactual triplets of the augmentation.

Every draw comes from a seeded ``numpy.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mixlab.shared.checks import check_count, check_number

CATEGORIES = ("tee", "dress", "trousers", "shoe", "bag", "hat")
COLOURS = {
    "red": (0.85, 0.12, 0.12),
    "orange": (0.95, 0.55, 0.10),
    "yellow": (0.93, 0.86, 0.15),
    "green": (0.15, 0.62, 0.22),
    "blue": (0.15, 0.30, 0.88),
    "purple": (0.52, 0.20, 0.68),
    "pink": (0.96, 0.52, 0.72),
    "black": (0.10, 0.10, 0.10),
}
PATTERNS = ("solid", "striped", "dotted", "checked")
LENGTHS = ("short", "medium", "long")
MATERIALS = ("cotton", "denim", "leather", "silk")
ATTRIBUTES = {
    "category": CATEGORIES,
    "colour": tuple(COLOURS),
    "pattern": PATTERNS,
    "length": LENGTHS,
    "material": MATERIALS,
}
EDITABLE = ("colour", "pattern", "length", "material")
"""attributes a modification text changes (the category stays, as in FashionIQ)"""
VISIBLE = ("category", "colour", "pattern", "length")

_PATTERN_NOUN = {"solid": "no pattern", "striped": "stripes", "dotted": "dots", "checked": "checks"}
_EDIT_TEMPLATES = {
    "colour": ("make it {v}", "in {v}", "change the colour to {v}", "{v} instead"),
    "pattern": ("with {n}", "make it {v}", "change the pattern to {n}", "{n} please"),
    "length": ("make it {v}", "a {v} one", "change the length to {v}", "{v} instead"),
    "material": ("made of {v}", "in {v}", "switch the material to {v}", "{v} instead"),
}
_DESCRIPTION_TEMPLATES = (
    "a {length} {colour} {pattern} {category} in {material}",
    "{material} {category}, {colour}, {pattern}, {length}",
    "{colour} {category} made of {material}, {pattern}, {length} cut",
    "{pattern} {material} {category} in {colour}, {length}",
)

__all__ = [
    "ATTRIBUTES",
    "CATEGORIES",
    "COLOURS",
    "EDITABLE",
    "LENGTHS",
    "MATERIALS",
    "PATTERNS",
    "VISIBLE",
    "Triplets",
    "all_items",
    "describe",
    "held_out_pairs",
    "is_held_out",
    "item_index",
    "make_triplets",
    "modification_text",
    "render",
]


# ---------------------------------------------------------------------------------- items
def all_items() -> np.ndarray:
    """Every attribute combination once, ``[6·8·4·3·4, 5]`` value indices in :data:`ATTRIBUTES`
    order."""
    grids = np.meshgrid(*[np.arange(len(v)) for v in ATTRIBUTES.values()], indexing="ij")
    return np.stack([g.ravel() for g in grids], 1)


def held_out_pairs() -> set[tuple[int, int]]:
    """(category, colour) pairs no training item has: one colour per category."""
    return {(c, (3 * c + 1) % len(COLOURS)) for c in range(len(CATEGORIES))}


def is_held_out(items: np.ndarray) -> np.ndarray:
    pairs = held_out_pairs()
    return np.array([(int(c), int(k)) in pairs for c, k in items[:, :2]], dtype=bool)


def _silhouette(category: int, length: int, size: int, dx: int, dy: int) -> np.ndarray:
    """The category's mask, its vertical (horizontal for shoes) extent set by ``length``."""
    y, x = np.mgrid[0:size, 0:size] / size
    x, y = x - dx / size, y - dy / size
    extent = (0.55, 0.7, 0.85)[length]
    top = 0.5 - extent / 2
    bottom = top + extent
    name = CATEGORIES[category]
    if name == "tee":
        body = (abs(x - 0.5) < 0.2) & (y > top) & (y < bottom)
        sleeves = (abs(x - 0.5) < 0.36) & (y > top) & (y < top + 0.18)
        return body | sleeves
    if name == "dress":
        half = 0.1 + 0.25 * (y - top) / extent
        return (abs(x - 0.5) < half) & (y > top) & (y < bottom)
    if name == "trousers":
        waist = (abs(x - 0.5) < 0.22) & (y > top) & (y < top + 0.15)
        legs = (abs(abs(x - 0.5) - 0.12) < 0.09) & (y > top) & (y < bottom)
        return waist | legs
    if name == "shoe":
        left, right = 0.5 - extent / 2, 0.5 + extent / 2
        sole = (x > left) & (x < right) & (y > 0.55) & (y < 0.72)
        ankle = (x > left) & (x < left + 0.25) & (y > 0.3) & (y < 0.72)
        return sole | ankle
    if name == "bag":
        half = 0.12 + 0.22 * extent
        body = (abs(x - 0.5) < half) & (y > 0.42) & (y < 0.42 + 0.45 * extent + 0.1)
        r = np.hypot(x - 0.5, (y - 0.42) * 1.3)
        handle = (r > 0.1) & (r < 0.15) & (y < 0.42)
        return body | handle
    # hat: a dome on a brim
    dome = (np.hypot((x - 0.5) / (0.1 + 0.2 * extent), (y - 0.6) / 0.3) < 1) & (y < 0.6)
    brim = (abs(x - 0.5) < 0.15 + 0.3 * extent) & (y > 0.58) & (y < 0.66)
    return dome | brim


def _pattern(pattern: int, size: int, phase: int) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size] + phase
    name = PATTERNS[pattern]
    if name == "striped":
        return (y // 2) % 2 == 0
    if name == "dotted":
        return ((x % 5) - 2) ** 2 + ((y % 5) - 2) ** 2 <= 1
    if name == "checked":
        return (x // 3 + y // 3) % 2 == 0
    return np.zeros((size, size), dtype=bool)


def render(items: np.ndarray, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """``[n, 3, size, size]`` float32 images in [0, 1] of ``items`` (rows from
    :func:`all_items`), each with its own jitter from ``rng``."""
    check_count(size, "size", 16)
    palette = np.array(list(COLOURS.values()), dtype=np.float32)
    out = np.empty((len(items), 3, size, size), dtype=np.float32)
    for i, (category, colour, pattern, length, _material) in enumerate(items):
        dx, dy = (int(v) for v in rng.integers(-2, 3, size=2))
        mask = _silhouette(int(category), int(length), size, dx, dy)
        accent = _pattern(int(pattern), size, int(rng.integers(0, 6))) & mask
        base = palette[colour] * rng.uniform(0.85, 1.1)
        image = np.ones((size, size, 3), dtype=np.float32) * rng.uniform(0.8, 1.0)
        image[mask] = base
        image[accent] = 0.45 * base + 0.55  # the pattern: the colour mixed with white
        image += rng.normal(0, 0.03, image.shape).astype(np.float32)
        out[i] = np.clip(image, 0, 1).transpose(2, 0, 1)
    return out


def describe(items: np.ndarray, rng: np.random.Generator, noise: float = 0.25) -> list[str]:
    """A templated description of each item; with probability ``noise`` one attribute is dropped
    (half the time) or replaced by a wrong value."""
    check_number(noise, "noise", 0 <= noise <= 1, "a number in [0, 1]")
    names = list(ATTRIBUTES)
    texts = []
    for row in items:
        words = {name: ATTRIBUTES[name][int(v)] for name, v in zip(names, row, strict=True)}
        if rng.random() < noise:
            name = names[int(rng.integers(1, len(names)))]  # the category is always named
            if rng.random() < 0.5:
                words[name] = ""
            else:
                wrong = [v for v in ATTRIBUTES[name] if v != words[name]]
                words[name] = wrong[int(rng.integers(len(wrong)))]
        template = _DESCRIPTION_TEMPLATES[int(rng.integers(len(_DESCRIPTION_TEMPLATES)))]
        texts.append(" ".join(template.format(**words).replace(" ,", ",").split()).strip(", "))
    return texts


def modification_text(edits: dict[str, int], rng: np.random.Generator) -> str:
    """The text that asks for ``edits`` ({attribute: new value index}), in random templates."""
    parts = []
    for name, value in edits.items():
        word = ATTRIBUTES[name][value]
        noun = _PATTERN_NOUN.get(word, word)
        template = _EDIT_TEMPLATES[name][int(rng.integers(len(_EDIT_TEMPLATES[name])))]
        parts.append(template.format(v=word, n=noun))
    return " and ".join(parts)


# -------------------------------------------------------------------------------- triplets
@dataclass
class Triplets:
    """Reference and target items (rows of :func:`all_items` values), the modification texts,
    the attributes each text states (its first one is ``edited``) and whether the target also
    changed an unstated one."""

    reference: np.ndarray
    target: np.ndarray
    texts: list[str]
    stated: list[tuple[str, ...]]
    confounded: np.ndarray

    @property
    def edited(self) -> list[str]:
        return [s[0] for s in self.stated]

    def __len__(self) -> int:
        return len(self.texts)


def _with(row: np.ndarray, name: str, rng: np.random.Generator) -> int:
    """A random value of attribute ``name`` other than ``row``'s."""
    column = list(ATTRIBUTES).index(name)
    choices = [v for v in range(len(ATTRIBUTES[name])) if v != row[column]]
    return int(choices[int(rng.integers(len(choices)))])


def make_triplets(
    references: np.ndarray,
    rng: np.random.Generator,
    *,
    confound: float = 0.0,
    two_edits: float = 0.4,
    allowed: np.ndarray | None = None,
) -> Triplets:
    """One triplet per reference item: 1 (or, with probability ``two_edits``, 2) stated edits
    and, with probability ``confound``, an unstated one. Targets stay in ``allowed`` (a boolean
    mask over :func:`all_items` rows, e.g. without held-out pairs): a draw that leaves it is
    redrawn."""
    check_number(confound, "confound", 0 <= confound <= 1, "a number in [0, 1]")
    names = list(ATTRIBUTES)
    targets, texts, stated, confounded = [], [], [], []
    for row in references:
        while True:
            count = 2 if rng.random() < two_edits else 1
            chosen = [EDITABLE[i] for i in rng.permutation(len(EDITABLE))[:count]]
            edits = {name: _with(row, name, rng) for name in chosen}
            target = row.copy()
            for name, value in edits.items():
                target[names.index(name)] = value
            extra = rng.random() < confound
            if extra:
                others = [n for n in EDITABLE if n not in edits]
                name = others[int(rng.integers(len(others)))]
                target[names.index(name)] = _with(row, name, rng)
            if allowed is None or allowed[int(item_index(target[None])[0])]:
                break
        targets.append(target)
        texts.append(modification_text(edits, rng))
        stated.append(tuple(chosen))
        confounded.append(extra)
    return Triplets(references.copy(), np.array(targets), texts, stated, np.array(confounded))


def item_index(items: np.ndarray) -> np.ndarray:
    """Each row's position in :func:`all_items`."""
    radix = np.array([len(v) for v in ATTRIBUTES.values()])
    strides = np.concatenate([np.cumprod(radix[::-1])[::-1][1:], [1]])
    return items @ strides
