"""Molecules → features for MixScentNet: POMMix's graph featurization, ECFP4 fingerprints, RDKit
descriptors (the Snitz and gradient-boosting baselines) and Mordred 2D targets (pretraining).

Graph (POMMix ``graph_utils``, deepchem-style one-hot with an "other" slot per field):

- ``x`` ``(n, 85)``: atomic number 1–53 (+other, 54), total degree 0–5 (+other, 7), formal
  charge −1, −2, 1, 2, 0 (+other, 6), chiral tag 0–3 (+other, 5), total H 0–4 (+other, 6),
  hybridisation SP…SP3D2 (+other, 6), aromatic flag (1);
- ``edge_attr`` ``(E, 14)``: none-flag (POMMix's slot for a non-bond; 0 on every bond here, as
  no self-loops are stored: GATv2 adds them with the mean bond feature), bond type
  single/double/triple/aromatic (+other, 5), conjugated, in ring, stereo one-hot over RDKit's six
  ``BondStereo`` values.

Mordred targets (:func:`mordred_targets`): the 1,613 2D descriptors of ``mordred.Calculator(
descriptors, ignore_3D=True)``, computed once per molecule and cached in one ``.npz`` that grows
with new SMILES (about 0.16 s per molecule per core). The targets keep the descriptors finite on
every molecule asked for and with non-zero variance, robust-z scaled (median, 1.4826·MAD; the
standard deviation where the MAD is zero) and clipped to ±5 so a heavy tail cannot dominate the
loss.
"""

from __future__ import annotations

import hashlib
import logging
import numbers
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from rdkit import Chem, DataStructs, rdBase
from rdkit.Chem import Descriptors, rdFingerprintGenerator
from torch_geometric.data import Data
from torch_geometric.utils import sort_edge_index

from mixlab.shared.progress_report import progress

__all__ = [
    "ATOM_FEATURES",
    "BOND_FEATURES",
    "atom_features",
    "bond_features",
    "canonical_smiles",
    "ecfp4",
    "mordred_targets",
    "rdkit_descriptors",
    "smiles_to_data",
    "tanimoto",
]

_ATOMIC_NUMBERS = list(range(1, 54))
_DEGREES = list(range(6))
_CHARGES = [-1, -2, 1, 2, 0]
_CHIRAL_TAGS = list(range(4))
_HYDROGENS = list(range(5))
_HYBRIDISATIONS = [
    Chem.HybridizationType.SP,
    Chem.HybridizationType.SP2,
    Chem.HybridizationType.SP3,
    Chem.HybridizationType.SP3D,
    Chem.HybridizationType.SP3D2,
]
_BOND_TYPES = [
    Chem.BondType.SINGLE,
    Chem.BondType.DOUBLE,
    Chem.BondType.TRIPLE,
    Chem.BondType.AROMATIC,
]
_STEREO = [
    Chem.BondStereo.STEREONONE,
    Chem.BondStereo.STEREOANY,
    Chem.BondStereo.STEREOZ,
    Chem.BondStereo.STEREOE,
    Chem.BondStereo.STEREOCIS,
    Chem.BondStereo.STEREOTRANS,
]
ATOM_FEATURES = 85
BOND_FEATURES = 14
MORDRED_CLIP = 5.0


def _one_hot(value, choices: list, other: bool = True) -> list[float]:
    """One-hot of ``value`` over ``choices``; values outside go to the trailing "other" slot."""
    hot = [0.0] * (len(choices) + int(other))
    if value in choices:
        hot[choices.index(value)] = 1.0
    elif other:
        hot[-1] = 1.0
    return hot


def atom_features(atom: Chem.Atom) -> list[float]:
    """The 85 POMMix atom features of one RDKit atom (see the module docstring)."""
    return [
        *_one_hot(atom.GetAtomicNum(), _ATOMIC_NUMBERS),
        *_one_hot(atom.GetTotalDegree(), _DEGREES),
        *_one_hot(atom.GetFormalCharge(), _CHARGES),
        *_one_hot(int(atom.GetChiralTag()), _CHIRAL_TAGS),
        *_one_hot(atom.GetTotalNumHs(), _HYDROGENS),
        *_one_hot(atom.GetHybridization(), _HYBRIDISATIONS),
        float(atom.GetIsAromatic()),
    ]


def bond_features(bond: Chem.Bond | None) -> list[float]:
    """The 14 POMMix bond features; ``None`` (no bond) sets only the none-flag."""
    if bond is None:
        return [1.0] + [0.0] * (BOND_FEATURES - 1)
    return [
        0.0,
        *_one_hot(bond.GetBondType(), _BOND_TYPES),
        float(bond.GetIsConjugated()),
        float(bond.IsInRing()),
        *_one_hot(bond.GetStereo(), _STEREO, other=False),
    ]


def _parse(smiles: str, where: str = "") -> Chem.Mol:
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) and smiles.strip() else None
    if mol is None:
        raise ValueError(f"unparsable SMILES {smiles!r}{where}")
    return mol


def canonical_smiles(smiles: str, where: str = "") -> str:
    """RDKit's canonical form of ``smiles`` (stereo kept); ``where`` names the row in errors."""
    return Chem.MolToSmiles(_parse(smiles, where))


def smiles_to_data(smiles: str) -> Data:
    """One molecule as a PyG graph: ``x`` (n, 85), ``edge_index`` (2, E) both directions,
    ``edge_attr`` (E, 14) and ``smiles``. Hydrogens are implicit; edges are sorted by source then
    target, as PyG's ``from_smiles`` sorts them."""
    mol = _parse(smiles)
    x = torch.tensor([atom_features(a) for a in mol.GetAtoms()], dtype=torch.float)
    rows, columns, attrs = [], [], []
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        features = bond_features(bond)
        rows += [i, j]
        columns += [j, i]
        attrs += [features, features]
    edge_index = torch.tensor([rows, columns], dtype=torch.long).reshape(2, -1)
    edge_attr = torch.tensor(attrs, dtype=torch.float).reshape(-1, BOND_FEATURES)
    edge_index, edge_attr = sort_edge_index(edge_index, edge_attr, num_nodes=len(x))
    return Data(x=x, edge_index=edge_index, edge_attr=edge_attr, smiles=smiles)


def ecfp4(smiles: Sequence[str], bits: int = 2048) -> list:
    """Morgan radius-2 (ECFP4) bit vectors, as RDKit ``ExplicitBitVect`` for :func:`tanimoto`."""
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=bits)
    return [generator.GetFingerprint(_parse(s)) for s in smiles]


def tanimoto(fingerprints: Sequence) -> np.ndarray:
    """The (n, n) Tanimoto similarity matrix of ECFP bit vectors."""
    return np.array(
        [DataStructs.BulkTanimotoSimilarity(fp, list(fingerprints)) for fp in fingerprints],
        dtype=np.float32,
    ).reshape(len(fingerprints), len(fingerprints))


def rdkit_descriptors(smiles: Sequence[str]) -> np.ndarray:
    """RDKit's 2D descriptors (``Descriptors.descList``, about 210) per molecule; non-finite
    values become 0 (a few descriptors fail on single atoms)."""
    values = []
    for s in smiles:
        mol = _parse(s)
        with rdBase.BlockLogs():
            values.append([function(mol) for _, function in Descriptors.descList])
    table = np.asarray(values, dtype=np.float64).reshape(len(smiles), len(Descriptors.descList))
    return np.nan_to_num(table, nan=0.0, posinf=0.0, neginf=0.0)


def _mordred_raw(smiles: list[str], workers: int) -> tuple[np.ndarray, list[str]]:
    from mordred import Calculator, descriptors

    calculator = Calculator(descriptors, ignore_3D=True)
    names = [str(d) for d in calculator.descriptors]
    mols = [_parse(s) for s in smiles]
    logging.getLogger("mordred").setLevel(logging.ERROR)
    rows = []
    if mols:
        with progress(len(mols), "Mordred descriptors") as bar:
            for row in calculator.map(mols, nproc=workers, quiet=True):
                rows.append(row)
                bar.advance()
    # mordred returns error objects for descriptors it cannot compute; they become NaN
    table = np.array(
        [[v if isinstance(v, numbers.Real) else np.nan for v in row] for row in rows],
        dtype=np.float64,
    ).reshape(len(mols), len(names))
    return table, names


def mordred_targets(
    smiles: Sequence[str],
    cache_dir: str | os.PathLike[str],
    workers: int = 1,
    reference: Sequence[str] | None = None,
) -> tuple[np.ndarray, list[str]]:
    """Robust-z Mordred 2D targets (n, k) of ``smiles`` and the k descriptor names (see the
    module docstring). The median and MAD (and the non-zero-variance filter) come from
    ``reference`` (default: ``smiles``), so held-out molecules can be scaled by training
    statistics. Raw values are cached in ``cache_dir/mordred.npz``; only SMILES not yet there
    are computed, with ``workers`` processes."""
    smiles = list(smiles)
    path = Path(cache_dir) / "mordred.npz"
    known: dict[str, np.ndarray] = {}
    names: list[str] = []
    if path.is_file():
        stored = np.load(path, allow_pickle=False)
        names = [str(n) for n in stored["names"]]
        known = dict(zip((str(s) for s in stored["smiles"]), stored["values"], strict=True))
    missing = sorted({s for s in [*smiles, *(reference or [])] if s not in known})
    if missing:
        table, names = _mordred_raw(missing, workers)
        known |= dict(zip(missing, table, strict=True))
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = sorted(known)
        temporary = path.with_suffix(f".{os.getpid()}.npz")
        np.savez(
            temporary,
            smiles=np.array(keys),
            values=np.stack([known[k] for k in keys]),
            names=np.array(names),
        )
        os.replace(temporary, path)
    raw = np.stack([known[s] for s in smiles]) if smiles else np.zeros((0, len(names)))
    fit = raw if reference is None else np.stack([known[s] for s in reference])
    keep = np.isfinite(raw).all(axis=0) & np.isfinite(fit).all(axis=0)
    keep[keep] = fit[:, keep].std(axis=0) > 0
    raw, fit = raw[:, keep], fit[:, keep]
    median = np.median(fit, axis=0)
    scale = 1.4826 * np.median(np.abs(fit - median), axis=0)
    scale = np.where(scale > 0, scale, fit.std(axis=0))
    targets = np.clip((raw - median) / scale, -MORDRED_CLIP, MORDRED_CLIP)
    return targets.astype(np.float32), [n for n, k in zip(names, keep, strict=True) if k]


def smiles_digest(smiles: Sequence[str]) -> str:
    """A short hash of a SMILES list: cache keys of what was computed from it."""
    return hashlib.sha256("\n".join(smiles).encode()).hexdigest()[:16]
