"""Olfaction data for MixScentNet: loaders (the published files and a plain user format), the
:class:`MixturePairs` container, splits, and a synthetic fixture in the published files' format.

Published files (``chemcognition-lab/pom-mix``'s ``datasets/``, never committed here; pass the
folder):

- ``gs-lf/curated_GS_LF_merged_4983.csv``: ``nonStereoSMILES``, ``descriptors`` and one 0/1
  column per odour label (138);
- ``mixtures/mixtures_combined.csv``: ``Dataset``, ``Mixture 1``, ``Mixture 2``,
  ``Experimental Values`` (the perceptual distance in [0, 1]);
- ``mixtures/mixture_smi_definitions_clean.csv``: ``Dataset``, ``Mixture Label`` and the
  component SMILES in ``smi_0`` … ``smi_N``.

User format (:func:`read_mixtures_csv`, :func:`read_pairs_csv`): a mixtures CSV with columns
``mixture`` (a name), ``smiles`` (``;``-separated) and optionally ``concentrations``
(``;``-separated, same order); a pairs CSV with ``mixture_1``, ``mixture_2`` and, for training,
``distance``.

Splits follow POMMix: ``random`` is a stratified-by-study K-fold over pairs; ``molecules`` is
POMMix's leave-some-molecules-out: molecules are drawn (weighted by how often they occur) and
every pair that contains one goes to test, until about 1/K of the pairs is held out, so test
pairs hold molecules the model never saw in training.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mixlab.graphs.mixscentnet.featurize import canonical_smiles
from mixlab.shared.files import sha256_of_file

__all__ = [
    "GSLF_FILE",
    "MIXTURE_FILES",
    "MixturePairs",
    "OdourLabels",
    "files_read",
    "load_gslf",
    "load_mixture_pairs",
    "non_overlapping",
    "read_mixtures_csv",
    "read_pairs_csv",
    "split_pairs",
    "unseen_molecules",
    "write_synthetic_olfaction",
]

GSLF_FILE = "gs-lf/curated_GS_LF_merged_4983.csv"
MIXTURE_FILES = ("mixtures/mixtures_combined.csv", "mixtures/mixture_smi_definitions_clean.csv")


@dataclass
class OdourLabels:
    """Molecules with binary odour labels: ``smiles`` (canonical), ``labels`` (n, L) uint8."""

    smiles: list[str]
    labels: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return len(self.smiles)


@dataclass
class MixturePairs:
    """Mixtures and the measured perceptual distances between pairs of them.

    ``mixtures[i]`` is a tuple of canonical component SMILES (the published sets are
    intensity-matched: no concentrations); ``pairs`` (P, 2) indexes ``mixtures``; ``distance`` (P,) float, NaN when unmeasured;
    ``study`` (P,) the source of each pair (``Snitz 1``, ``Bushdid``, …)."""

    mixtures: list[tuple[str, ...]]
    names: list[str]
    pairs: np.ndarray
    distance: np.ndarray
    study: np.ndarray

    @property
    def components(self) -> list[str]:
        """Every distinct component SMILES, sorted."""
        return sorted({s for mixture in self.mixtures for s in mixture})

    def __len__(self) -> int:
        return len(self.pairs)


def files_read(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The published files under ``folder`` with their SHA-256, for result.json."""
    files = [(name, Path(folder) / name) for name in (GSLF_FILE, *MIXTURE_FILES)]
    return {name: sha256_of_file(path) for name, path in files if path.is_file()}


def _require_folder(folder: str | os.PathLike[str], names: Sequence[str]) -> Path:
    root = Path(folder)
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"olfaction data folder {str(root)!r} lacks {', '.join(missing)} (the published "
            "files of chemcognition-lab/pom-mix's datasets/; pass data_dir=FOLDER)"
        )
    return root


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle, restval=""))  # short rows read as blanks


def _require_columns(path: Path, rows: list[dict[str, str]], columns: Sequence[str]) -> None:
    missing = [c for c in columns if not rows or c not in rows[0]]
    if missing:
        raise ValueError(f"{path.name}: no rows with the columns {missing}")


def _label(value: str, where: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where}: mixture label {value!r} is not a number") from None


def _binary(value: str, where: str) -> int:
    if value.strip() not in ("0", "1"):
        raise ValueError(f"{where}: labels must be 0 or 1, got {value!r}")
    return int(value)


def load_gslf(folder: str | os.PathLike[str]) -> OdourLabels:
    """GS-LF: 4,983 molecules with 138 binary odour labels (``folder/gs-lf/...``)."""
    path = _require_folder(folder, [GSLF_FILE]) / GSLF_FILE
    rows = _rows(path)
    _require_columns(path, rows, ["nonStereoSMILES"])
    names = [c for c in rows[0] if c not in ("nonStereoSMILES", "descriptors")]
    smiles, labels = [], []
    for k, row in enumerate(rows, start=2):
        where = f"{path.name} row {k}"
        smiles.append(canonical_smiles(row["nonStereoSMILES"], f" ({where})"))
        labels.append([_binary(row[n], f"{where} column {n!r}") for n in names])
    return OdourLabels(smiles, np.asarray(labels, dtype=np.uint8).reshape(-1, len(names)), names)


def _distance(value: str, where: str) -> float:
    try:
        d = float(value)
    except ValueError:
        raise ValueError(f"{where}: distance {value!r} is not a number") from None
    if not 0.0 <= d <= 1.0:
        raise ValueError(f"{where}: distance must lie in [0, 1], got {d}")
    return d


def load_mixture_pairs(folder: str | os.PathLike[str]) -> MixturePairs:
    """The 865 measured pairs of Snitz 2013, Bushdid 2014 and Ravia 2020 over their mixtures
    (``folder/mixtures/...``). Mixtures are keyed by (study, label); a pair whose label has no
    definition is an error naming the row."""
    root = _require_folder(folder, MIXTURE_FILES)
    definitions: dict[tuple[str, float], tuple[str, ...]] = {}
    path = root / MIXTURE_FILES[1]
    rows = _rows(path)
    _require_columns(path, rows, ["Dataset", "Mixture Label", "smi_0"])
    for k, row in enumerate(rows, start=2):
        where = f" ({path.name} row {k})"
        columns = sorted((c for c in row if c.startswith("smi_")), key=lambda c: int(c[4:]))
        smiles = tuple(canonical_smiles(row[c], where) for c in columns if row[c].strip())
        if not smiles:
            raise ValueError(f"{path.name} row {k}: mixture {row['Mixture Label']!r} is empty")
        definitions[(row["Dataset"], _label(row["Mixture Label"], where[2:-1]))] = smiles
    path = root / MIXTURE_FILES[0]
    keys: dict[tuple[str, float], int] = {}
    pairs, distance, study = [], [], []
    rows = _rows(path)
    _require_columns(path, rows, ["Dataset", "Mixture 1", "Mixture 2", "Experimental Values"])
    for k, row in enumerate(rows, start=2):
        ends = []
        for column in ("Mixture 1", "Mixture 2"):
            key = (row["Dataset"], _label(row[column], f"{path.name} row {k}"))
            if key not in definitions:
                raise ValueError(
                    f"{path.name} row {k}: {column} = {row[column]!r} of {row['Dataset']!r} "
                    f"has no definition in {MIXTURE_FILES[1]}"
                )
            ends.append(keys.setdefault(key, len(keys)))
        pairs.append(ends)
        distance.append(_distance(row["Experimental Values"], f"{path.name} row {k}"))
        study.append(row["Dataset"])
    order = sorted(keys, key=keys.get)
    return MixturePairs(
        mixtures=[definitions[key] for key in order],
        names=[f"{s}/{label:g}" for s, label in order],
        pairs=np.asarray(pairs, dtype=np.int64).reshape(-1, 2),
        distance=np.asarray(distance, dtype=np.float64),
        study=np.asarray(study),
    )


def read_mixtures_csv(
    path: str | os.PathLike[str],
) -> tuple[list[str], list[tuple[str, ...]], list[tuple[float, ...] | None]]:
    """Names, component SMILES and concentrations (None where the column is absent or blank)
    of a user mixtures CSV (columns ``mixture``, ``smiles``, optional ``concentrations``)."""
    path = Path(path)
    rows = _rows(path)
    if not rows or not {"mixture", "smiles"} <= set(rows[0]):
        raise ValueError(f"{path.name}: needs columns 'mixture' and 'smiles' (';'-separated)")
    names, mixtures, concentrations = [], [], []
    for k, row in enumerate(rows, start=2):
        where = f"{path.name} row {k}"
        parts = [s for s in row["smiles"].split(";") if s.strip()]
        if not parts:
            raise ValueError(f"{where}: mixture {row['mixture']!r} is empty")
        if row["mixture"] in names:
            raise ValueError(f"{where}: mixture name {row['mixture']!r} repeats")
        names.append(row["mixture"])
        components = tuple(canonical_smiles(s.strip(), f" ({where})") for s in parts)
        if len(set(components)) < len(components):
            raise ValueError(f"{where}: mixture {row['mixture']!r} repeats a component")
        mixtures.append(components)
        text = (row.get("concentrations") or "").strip()
        if not text:
            concentrations.append(None)
            continue
        try:
            values = tuple(float(v) for v in text.split(";") if v.strip())
        except ValueError:
            raise ValueError(f"{where}: concentrations must be numbers, got {text!r}") from None
        if len(values) != len(parts) or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(
                f"{where}: concentrations must be {len(parts)} finite numbers >= 0, got {text!r}"
            )
        concentrations.append(values)
    return names, mixtures, concentrations


def read_pairs_csv(
    path: str | os.PathLike[str], names: Sequence[str], require_distance: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (P, 2) as indices into ``names`` and distances (P,) (NaN when the column is absent
    and ``require_distance`` is False) from a user pairs CSV."""
    path = Path(path)
    rows = _rows(path)
    needed = {"mixture_1", "mixture_2"} | ({"distance"} if require_distance else set())
    if not rows or not needed <= set(rows[0]):
        raise ValueError(f"{path.name}: needs columns {sorted(needed)}")
    index = {n: i for i, n in enumerate(names)}
    pairs, distance = [], []
    for k, row in enumerate(rows, start=2):
        where = f"{path.name} row {k}"
        for column in ("mixture_1", "mixture_2"):
            if row[column] not in index:
                raise ValueError(f"{where}: {column} names an unknown mixture {row[column]!r}")
        pairs.append([index[row["mixture_1"]], index[row["mixture_2"]]])
        text = (row.get("distance") or "").strip()
        distance.append(_distance(text, where) if text or require_distance else math.nan)
    return np.asarray(pairs, dtype=np.int64).reshape(-1, 2), np.asarray(distance)


def non_overlapping(data: MixturePairs) -> np.ndarray:
    """Boolean mask of the pairs whose mixtures share no component."""
    return np.array(
        [not set(data.mixtures[a]) & set(data.mixtures[b]) for a, b in data.pairs], dtype=bool
    )


def split_pairs(
    data: MixturePairs, kind: str, fold: int, folds: int = 5, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) pair indices of fold ``fold`` of ``folds``.

    ``random``: stratified by study (``StratifiedKFold``, shuffled with ``seed``). ``molecules``:
    leave-some-molecules-out; the draw for fold k uses seed ``seed * 1000 + k`` and stops once
    the test pairs reach 1/``folds`` of the data (± 2 %, redrawn otherwise)."""
    if kind == "random":
        from sklearn.model_selection import StratifiedKFold

        splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
        train, test = list(splitter.split(np.zeros(len(data)), data.study))[fold]
        return np.sort(train), np.sort(test)
    if kind != "molecules":
        raise ValueError(f"kind must be 'random' or 'molecules', got {kind!r}")
    components = [set(data.mixtures[a]) | set(data.mixtures[b]) for a, b in data.pairs]
    occurrences = [s for c in components for s in sorted(c)]
    target, tolerance = len(data) / folds, 0.02 * len(data)
    rng = np.random.default_rng(seed * 1000 + fold)
    for _ in range(1000):
        held: set[str] = set()
        test = np.zeros(len(data), dtype=bool)
        pool = list(occurrences)
        while test.sum() < target - tolerance and pool:
            molecule = pool[rng.integers(len(pool))]
            held.add(molecule)
            pool = [s for s in pool if s != molecule]
            test |= np.array([molecule in c for c in components])
        if abs(test.sum() - target) <= tolerance:
            return np.flatnonzero(~test), np.flatnonzero(test)
    raise ValueError(f"no leave-molecules-out split within 2 % of 1/{folds} of {len(data)} pairs")


def unseen_molecules(data: MixturePairs, train: np.ndarray, test: np.ndarray) -> list[str]:
    """The components (sorted) of the ``test`` pairs that no ``train`` pair contains: the
    molecules a leave-molecules-out split holds out, which an inductive encoder never sees."""
    seen = {s for pair in data.pairs[train] for m in pair for s in data.mixtures[m]}
    return sorted({s for pair in data.pairs[test] for m in pair for s in data.mixtures[m]} - seen)


def write_synthetic_olfaction(
    folder: str | os.PathLike[str],
    num_molecules: int = 60,
    num_mixtures: int = 40,
    num_pairs: int = 80,
    num_labels: int = 6,
    seed: int = 0,
) -> Path:
    """Write a small data set in the published files' format from RDKit's NCI molecules: the
    fixture the tests and a dry run use when the real folder is absent. Labels and distances
    follow simple substructure rules (ester, aldehyde, ring, …) so that a model can learn them."""
    from rdkit import Chem, RDConfig

    rng = np.random.default_rng(seed)
    smiles = []
    with open(os.path.join(RDConfig.RDDataDir, "NCI", "first_5K.smi"), encoding="utf-8") as f:
        for line in f:
            text = line.split()[0] if line.split() else ""
            mol = Chem.MolFromSmiles(text)
            if mol is not None and 3 <= mol.GetNumHeavyAtoms() <= 14 and "." not in text:
                smiles.append(Chem.MolToSmiles(mol, isomericSmiles=False))
            if len(smiles) >= num_molecules:
                break
    patterns = ["C(=O)O[#6]", "[CX3H1](=O)", "[R]", "[#7]", "[#8]", "[#16]", "c", "C=C"]
    patterns = [Chem.MolFromSmarts(p) for p in patterns[:num_labels]]
    hits = np.array(
        [[Chem.MolFromSmiles(s).HasSubstructMatch(p) for p in patterns] for s in smiles],
        dtype=np.uint8,
    )
    root = Path(folder)
    (root / "gs-lf").mkdir(parents=True, exist_ok=True)
    (root / "mixtures").mkdir(parents=True, exist_ok=True)
    label_names = [f"note{j}" for j in range(num_labels)]
    with (root / GSLF_FILE).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["nonStereoSMILES", "descriptors", *label_names])
        for s, row in zip(smiles, hits, strict=True):
            described = ";".join(n for n, h in zip(label_names, row, strict=True) if h)
            writer.writerow([s, described, *row.tolist()])
    sizes = rng.integers(1, 11, size=num_mixtures)
    mixtures = [rng.choice(len(smiles), size=n, replace=False) for n in sizes]
    studies = ["Snitz 1", "Bushdid", "Ravia 1"]
    with (root / MIXTURE_FILES[1]).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        width = int(sizes.max())
        writer.writerow(
            ["Dataset", "Mixture Label", "length", "Duplicate", "Duplicate Of"]
            + [f"smi_{j}" for j in range(width)]
        )
        for i, members in enumerate(mixtures):
            cells = [smiles[m] for m in members] + [""] * (width - len(members))
            writer.writerow([studies[i % 3], i + 1, len(members), False, "", *cells])
    profile = [hits[m].mean(axis=0) for m in mixtures]
    with (root / MIXTURE_FILES[0]).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Dataset", "Mixture 1", "Mixture 2", "Experimental Values"])
        made = 0
        while made < num_pairs:
            a, b = rng.integers(num_mixtures, size=2)
            if a == b or a % 3 != b % 3:
                continue
            u, v = profile[a] + 0.1, profile[b] + 0.1
            angle = np.arccos(np.clip(u @ v / np.linalg.norm(u) / np.linalg.norm(v), -1, 1))
            d = float(np.clip(angle / (np.pi / 2) + rng.normal(0, 0.03), 0, 1))
            writer.writerow([studies[a % 3], float(a + 1), float(b + 1), d])
            made += 1
    return root
