"""Molecules as graphs for CurvDiff: SMILES ↔ PyG ``Data``, the offline data sets and the
validity / uniqueness / novelty metrics.

Representation (hydrogens implicit, one graph per molecule):

- ``x`` ``(n, A)`` float32: one-hot heavy-atom type over an atom vocabulary (a tuple of element
  symbols such as :data:`ATOM_TYPES_QM9`);
- ``edge_index`` ``(2, E)`` int64: both directions, coalesced (sorted by row then column), no
  self loops; ``edge_attr`` ``(E, 3)`` float32: one-hot bond order (single, double, triple) after
  kekulization (``Chem.Kekulize(mol, clearAromaticFlags=True)``), so there is no aromatic type;
- ``num_nodes`` and ``smiles``: RDKit's canonical SMILES without stereo or isotopes (the graph
  cannot hold them), which is also what :func:`data_to_smiles` returns for the same graph.

Only neutral molecules without radicals are supported. A molecule whose hydrogens differ from the
ones RDKit infers from the heavy-atom graph (``[SH4]``-like hypervalent atoms, explicit ``[CH]``)
cannot be rebuilt from the graph, so :func:`mol_to_data` refuses it rather than store a graph that
decodes to another molecule. Loaders skip unsupported molecules and count them per reason
(:attr:`MoleculeList.skipped`).

Decoding (:func:`build_molecule`) adds the bonds as given and calls ``Chem.SanitizeMol``: there is
no valence correction, so a carbon with five bonds is invalid (``None``), as in the validity
metric of GraphAF/GDSS *without* their correction step.

Data sets (offline):

- :func:`load_nci`: RDKit's own ``Data/NCI/first_5K.smi`` (4,999 lines, 4,991 parse); with
  ≤ 9 heavy atoms, one fragment and elements in :data:`ATOM_TYPES_ORGANIC`, 666 molecules over
  C, N, O, F, P, S, Cl, Br, I.
- :func:`load_qm9`: QM9 (130,831 molecules, C/N/O/F, ≤ 9 heavy atoms) from the optional PyPI
  package ``qm9pack``, read by path (its ``__init__`` imports ``pkg_resources``):
  ``qm9pack/data/qm9_part{1,2,3}.csv``, column ``SMILES``.

The experiment's cached molecule set is made here (:func:`write_molecule_set`), so its cache entry
is keyed by this module's source.
"""

from __future__ import annotations

import csv
import importlib.metadata
import importlib.util
import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from rdkit import Chem, RDConfig, rdBase
from torch_geometric.data import Data

from mixlab.graphs.curvdiff.curvature import with_curvature
from mixlab.graphs.curvdiff.datasets import SETS_FILE, save_sets, split
from mixlab.shared.config import is_count, require

__all__ = [
    "ATOM_TYPES_ALL",
    "ATOM_TYPES_ORGANIC",
    "ATOM_TYPES_QM9",
    "BOND_ORDERS",
    "QM9_HINT",
    "AtomVocabulary",
    "MoleculeList",
    "SmilesRecord",
    "UnsupportedMolecule",
    "atom_types_of",
    "build_molecule",
    "check_atom_types",
    "data_to_smiles",
    "load_nci",
    "load_qm9",
    "mol_to_data",
    "molecule_metrics",
    "parse_smiles_lines",
    "read_smiles",
]

log = logging.getLogger(__name__)

AtomVocabulary = tuple[str, ...]
"""heavy-atom element symbols; position i is one-hot column i of ``Data.x``"""

ATOM_TYPES_QM9: AtomVocabulary = ("C", "N", "O", "F")
ATOM_TYPES_ORGANIC: AtomVocabulary = ("C", "N", "O", "F", "P", "S", "Cl", "Br", "I")
"""RDKit's SMILES organic subset without B: the elements :func:`load_nci` may keep by default"""

BOND_ORDERS = (1, 2, 3)
"""bond order of ``edge_attr`` column 0, 1, 2 (single, double, triple; kekulized)"""

QM9_HINT = "QM9 needs the optional extra: uv sync --all-packages --extra qm9 (or pip install 'mixlab-graphs[qm9]')"

_PT = Chem.GetPeriodicTable()
_ELEMENTS = {_PT.GetElementSymbol(z): z for z in range(1, 119)}
_BOND_TYPES = {
    1: Chem.BondType.SINGLE,
    2: Chem.BondType.DOUBLE,
    3: Chem.BondType.TRIPLE,
}
_ORDER_OF = {v: k for k, v in _BOND_TYPES.items()}
_NCI_PATH = Path(RDConfig.RDDataDir) / "NCI" / "first_5K.smi"

ATOM_TYPES_ALL: AtomVocabulary = tuple(s for s in _ELEMENTS if s != "H")
"""every heavy element: the vocabulary ceiling for a user's file"""


class UnsupportedMolecule(ValueError):
    """A molecule the graph representation cannot hold; ``reason`` is a short key for counting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SmilesRecord(NamedTuple):
    """One SMILES line: 1-based ``line`` number, ``smiles`` and ``name`` as written, parsed
    ``mol`` (None only when parsing with ``skip_unparsable=True``)."""

    line: int
    smiles: str
    name: str
    mol: Chem.Mol | None


class MoleculeList(list):
    """A ``list[Data]`` from a loader that also says what it is: ``atom_types`` (the vocabulary of
    ``Data.x``, needed to decode generated graphs), ``source`` and ``skipped`` (reason → count)."""

    def __init__(
        self, graphs: Iterable[Data], atom_types: AtomVocabulary, source: str, skipped: Counter
    ) -> None:
        super().__init__(graphs)
        self.atom_types = atom_types
        self.source = source
        self.skipped = dict(skipped)

    def summary(self) -> str:
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        return (
            f"{self.source}: {len(self)} molecules over {','.join(self.atom_types)}; "
            f"skipped: {skipped}"
        )


# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------


def check_atom_types(atom_types: Sequence[str]) -> AtomVocabulary:
    """Validate a vocabulary (non-empty, unique element symbols, no H) and return it as a tuple."""
    require(
        not isinstance(atom_types, str) and len(atom_types) > 0,
        "atom_types",
        "a non-empty sequence of element symbols such as ('C', 'N', 'O', 'F')",
        atom_types,
    )
    vocab = tuple(atom_types)
    unknown = [s for s in vocab if s not in _ELEMENTS or s == "H"]
    require(not unknown, "atom_types", "heavy-atom element symbols (hydrogens are implicit)", vocab)
    require(len(set(vocab)) == len(vocab), "atom_types", "free of duplicates", vocab)
    return vocab


def atom_types_of(smiles: Iterable[str | Chem.Mol]) -> AtomVocabulary:
    """The heavy elements present in ``smiles`` (strings or Mols), ordered by atomic number."""
    found: set[str] = set()
    for i, item in enumerate(smiles):
        mol = item if isinstance(item, Chem.Mol) else _parse(item)
        require(mol is not None, f"smiles[{i}]", "a parsable SMILES", item)
        found.update(a.GetSymbol() for a in mol.GetAtoms() if a.GetAtomicNum() > 1)
    require(bool(found), "smiles", "at least one molecule with a heavy atom", found)
    return tuple(sorted(found, key=_ELEMENTS.__getitem__))


# ---------------------------------------------------------------------------------------------
# Graph ↔ molecule
# ---------------------------------------------------------------------------------------------


def build_molecule(atom_ids: Any, bond_orders: Any, atom_types: Sequence[str]) -> Chem.Mol | None:
    """Sanitised RDKit molecule from atom types and a bond-order matrix, or None if RDKit rejects
    it. No valence correction: bonds are added exactly as given.

    Args:
        atom_ids: ``(n,)`` ints in ``[0, len(atom_types))``.
        bond_orders: ``(n, n)`` symmetric ints in {0, 1, 2, 3} (0 = no bond), zero diagonal.
        atom_types: the vocabulary ``atom_ids`` index.

    Returns None for an empty graph or when ``Chem.SanitizeMol`` fails (valence, kekulization).
    Raises ValueError for malformed input (shapes, ranges, asymmetry).
    """
    vocab = check_atom_types(atom_types)
    atoms = np.asarray(atom_ids)
    bonds = np.asarray(bond_orders)
    require(atoms.ndim == 1, "atom_ids", "a 1-D array (n,)", atoms.shape)
    n = atoms.shape[0]
    require(bonds.shape == (n, n), "bond_orders", f"an (n, n) = ({n}, {n}) matrix", bonds.shape)
    if n == 0:
        return None
    require(
        np.issubdtype(atoms.dtype, np.integer) and atoms.min() >= 0 and atoms.max() < len(vocab),
        "atom_ids",
        f"integers in [0, {len(vocab)}) indexing atom_types {vocab}",
        atoms.tolist(),
    )
    require(
        bool(np.all(np.isin(bonds, (0, 1, 2, 3)))),
        "bond_orders",
        "integers in {0, 1, 2, 3}",
        np.unique(bonds).tolist(),
    )
    require(bool(np.all(bonds == bonds.T)), "bond_orders", "a symmetric matrix", "asymmetric")
    require(
        bool(np.all(np.diag(bonds) == 0)), "bond_orders", "zero on the diagonal", np.diag(bonds)
    )
    return _assemble(atoms, bonds, vocab)


def _assemble(atoms: np.ndarray, bonds: np.ndarray, vocab: AtomVocabulary) -> Chem.Mol | None:
    """:func:`build_molecule` without the input checks (for graphs made here)."""
    mol = Chem.RWMol()
    for a in atoms.tolist():
        mol.AddAtom(Chem.Atom(vocab[a]))
    rows, cols = np.nonzero(np.triu(bonds, k=1))
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        mol.AddBond(i, j, _BOND_TYPES[int(bonds[i, j])])
    try:
        with rdBase.BlockLogs():
            Chem.SanitizeMol(mol)
    except Exception:  # AtomValenceException, KekulizeException, ...
        return None
    return mol.GetMol()


def data_to_smiles(graph: Data | tuple[Any, Any], atom_types: Sequence[str]) -> str | None:
    """Canonical SMILES of a graph (see :func:`build_molecule`), None if it is not a molecule.

    ``graph`` is a ``Data`` (atom type = argmax of ``x``; bond order = argmax of ``edge_attr`` + 1,
    or single bonds when ``edge_attr`` is None; each edge may appear in one or both directions)
    or a tuple ``(atom_ids (n,), bond_orders (n, n))``.
    """
    if isinstance(graph, Data):
        atom_ids, bond_orders = _data_to_arrays(graph)
    else:
        require(
            isinstance(graph, tuple) and len(graph) == 2,
            "graph",
            "a Data or a tuple (atom_ids, bond_orders)",
            type(graph).__name__,
        )
        atom_ids, bond_orders = (_as_numpy(v) for v in graph)
    mol = build_molecule(atom_ids, bond_orders, atom_types)
    return None if mol is None else _canonical(mol)


def mol_to_data(mol_or_smiles: Chem.Mol | str, atom_types: Sequence[str]) -> Data:
    """Graph of a neutral molecule (hydrogens implicit, bonds kekulized; see the module docstring).

    Raises :class:`UnsupportedMolecule` (a ValueError; ``reason`` is one of ``unparsable``,
    ``empty``, ``charged``, ``radical``, ``element``, ``bond``, ``explicit_h``) when the graph
    cannot hold the molecule.
    """
    vocab = check_atom_types(atom_types)
    mol = _parse(mol_or_smiles) if isinstance(mol_or_smiles, str) else mol_or_smiles
    if mol is None:
        raise UnsupportedMolecule("unparsable", f"cannot parse SMILES {mol_or_smiles!r}")
    mol = (
        Chem.RemoveHs(mol, sanitize=False)
        if any(a.GetAtomicNum() == 1 for a in mol.GetAtoms())
        else mol
    )
    smiles = _canonical(mol)
    if mol.GetNumAtoms() == 0:
        raise UnsupportedMolecule("empty", "a molecule needs at least one heavy atom")
    for atom in mol.GetAtoms():
        if atom.GetFormalCharge() != 0:
            raise UnsupportedMolecule("charged", f"{smiles}: formal charges are not supported")
        if atom.GetNumRadicalElectrons() != 0:
            raise UnsupportedMolecule("radical", f"{smiles}: radicals are not supported")
        if atom.GetSymbol() not in vocab:
            raise UnsupportedMolecule(
                "element", f"{smiles}: element {atom.GetSymbol()} is not in atom_types {vocab}"
            )
    kekule = Chem.RWMol(mol)
    try:
        Chem.Kekulize(kekule, clearAromaticFlags=True)
    except Exception as err:  # KekulizeException
        raise UnsupportedMolecule("bond", f"{smiles}: cannot kekulize ({err})") from err
    n = kekule.GetNumAtoms()
    atom_ids = np.array([vocab.index(a.GetSymbol()) for a in kekule.GetAtoms()], dtype=np.int64)
    bond_orders = np.zeros((n, n), dtype=np.int64)
    for bond in kekule.GetBonds():
        order = _ORDER_OF.get(bond.GetBondType())
        if order is None:
            raise UnsupportedMolecule("bond", f"{smiles}: bond type {bond.GetBondType()}")
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        bond_orders[i, j] = bond_orders[j, i] = order
    # The graph must decode to the same molecule, else its hydrogens were not the implicit ones.
    rebuilt = _assemble(atom_ids, bond_orders, vocab)
    if rebuilt is None or _canonical(rebuilt) != smiles:
        raise UnsupportedMolecule(
            "explicit_h", f"{smiles}: its hydrogens are not the ones implied by its bonds"
        )
    return _arrays_to_data(atom_ids, bond_orders, len(vocab), smiles)


def _arrays_to_data(
    atom_ids: np.ndarray, bond_orders: np.ndarray, num_types: int, smiles: str
) -> Data:
    rows, cols = np.nonzero(bond_orders)  # row-major: already coalesced, both directions
    edge_index = torch.from_numpy(np.stack([rows, cols]).astype(np.int64))
    edge_type = torch.from_numpy(bond_orders[rows, cols] - 1)
    return Data(
        x=torch.nn.functional.one_hot(torch.from_numpy(atom_ids), num_types).float(),
        edge_index=edge_index,
        edge_attr=torch.nn.functional.one_hot(edge_type, len(BOND_ORDERS)).float(),
        num_nodes=int(atom_ids.shape[0]),
        smiles=smiles,
    )


def _data_to_arrays(graph: Data) -> tuple[np.ndarray, np.ndarray]:
    require(
        graph.x is not None and graph.x.dim() == 2,
        "graph.x",
        "an (n, A) one-hot tensor",
        None if graph.x is None else tuple(graph.x.shape),
    )
    atom_ids = graph.x.argmax(dim=1).cpu().numpy()
    n = atom_ids.shape[0]
    ei = (
        graph.edge_index.cpu().numpy()
        if graph.edge_index is not None
        else np.zeros((2, 0), np.int64)
    )
    require(ei.ndim == 2 and ei.shape[0] == 2, "graph.edge_index", "a (2, E) tensor", ei.shape)
    if graph.edge_attr is None:
        orders = np.ones(ei.shape[1], dtype=np.int64)
    else:
        require(
            graph.edge_attr.dim() == 2 and graph.edge_attr.shape == (ei.shape[1], len(BOND_ORDERS)),
            "graph.edge_attr",
            f"an (E, 3) = ({ei.shape[1]}, 3) bond-type tensor",
            tuple(graph.edge_attr.shape),
        )
        orders = graph.edge_attr.argmax(dim=1).cpu().numpy() + 1
    require(
        ei.size == 0 or (ei.min() >= 0 and ei.max() < n),
        "graph.edge_index",
        f"node ids in [0, {n})",
        ei.tolist(),
    )
    require(bool(np.all(ei[0] != ei[1])), "graph.edge_index", "free of self loops", ei.tolist())
    bonds = np.zeros((n, n), dtype=np.int64)
    for i, j, o in zip(ei[0].tolist(), ei[1].tolist(), orders.tolist(), strict=True):
        for a, b in ((i, j), (j, i)):
            require(
                bonds[a, b] in (0, o),
                "graph.edge_attr",
                "the same bond type in both directions of an edge",
                f"{bonds[a, b]} and {o} on ({i}, {j})",
            )
            bonds[a, b] = o
    return atom_ids, bonds


# ---------------------------------------------------------------------------------------------
# SMILES files and data sets
# ---------------------------------------------------------------------------------------------


def parse_smiles_lines(
    lines: Iterable[str], source: str, *, skip_unparsable: bool = False
) -> list[SmilesRecord]:
    """Parse ``SMILES [name ...]`` lines (whitespace separated, e.g. RDKit's ``first_5K.smi``,
    ``SMILES<TAB>id``). Blank lines and ``#`` comments are skipped, and so is a first line whose
    first token is ``smiles`` (any case). An unparsable SMILES raises ValueError naming ``source``
    and the 1-based line (``molecules.smi line 3: cannot parse SMILES 'C1CC'``), or gives a
    record with ``mol=None`` when ``skip_unparsable``.
    """
    records = []
    first = True
    for number, raw in enumerate(lines, start=1):
        tokens = raw.split()
        if not tokens or tokens[0].startswith("#"):
            continue
        if first and tokens[0].lower() == "smiles":
            first = False
            continue
        first = False
        mol = _parse(tokens[0])
        if mol is None and not skip_unparsable:
            raise ValueError(f"{source} line {number}: cannot parse SMILES {tokens[0]!r}")
        records.append(SmilesRecord(number, tokens[0], " ".join(tokens[1:]), mol))
    return records


def read_smiles(
    path: str | os.PathLike,
    max_heavy_atoms: int | None = None,
    atom_types: Sequence[str] | None = None,
) -> MoleculeList:
    """Molecules of a ``.smi`` file (see :func:`parse_smiles_lines`; an unparsable line raises).

    Keeps molecules with at most ``max_heavy_atoms`` heavy atoms (None: any) whose elements are in
    ``atom_types`` (None: every element of the kept molecules); skips unsupported ones (charged,
    radical, ...) with a count in ``skipped``. Multi-fragment molecules are kept.
    """
    path = Path(path)
    with path.open() as fh:
        records = parse_smiles_lines(fh, path.name)
    return _to_dataset(
        (r.mol for r in records), path.name, max_heavy_atoms, atom_types, ATOM_TYPES_ALL, False
    )


def load_nci(max_heavy_atoms: int = 9, atom_types: Sequence[str] | None = None) -> MoleculeList:
    """RDKit's NCI sample (``RDConfig.RDDataDir/NCI/first_5K.smi``) as graphs, in file order.

    Keeps single-fragment, neutral molecules with at most ``max_heavy_atoms`` heavy atoms whose
    elements are in ``atom_types`` (None: the elements of :data:`ATOM_TYPES_ORGANIC` present among
    the kept molecules). At 9 heavy atoms: 666 molecules over all nine elements, with 17 charged,
    25 with other elements and 3 multi-fragment ones skipped. Duplicates after dropping stereo are
    kept (652 distinct SMILES).
    """
    with _NCI_PATH.open() as fh:
        records = parse_smiles_lines(fh, _NCI_PATH.name, skip_unparsable=True)
    skipped = Counter(unparsable=sum(r.mol is None for r in records))
    return _to_dataset(
        (r.mol for r in records if r.mol is not None),
        "RDKit NCI first_5K.smi",
        max_heavy_atoms,
        atom_types,
        ATOM_TYPES_ORGANIC,
        True,
        skipped,
    )


def load_qm9(
    max_heavy_atoms: int = 9, limit: int | None = None, path: str | os.PathLike | None = None
) -> MoleculeList:
    """QM9 (Ramakrishnan et al. 2014, 130,831 molecules) as graphs over :data:`ATOM_TYPES_QM9`.

    Reads the ``SMILES`` column of ``qm9_part1.csv``, ``qm9_part2.csv``, ``qm9_part3.csv`` in the
    installed ``qm9pack`` data folder (or ``path``: one such CSV or a folder of them), in file
    order, keeping the first ``limit`` supported molecules (None: all) with at most
    ``max_heavy_atoms`` heavy atoms. Charged (zwitterionic) molecules are skipped with a count:
    130,251 kept, 580 charged. The whole set takes 1-3 min on one CPU core; ``limit`` for less.
    Raises ImportError with :data:`QM9_HINT` when ``qm9pack`` is missing and ``path`` is None.
    """
    require(is_count(max_heavy_atoms), "max_heavy_atoms", "an integer >= 1", max_heavy_atoms)
    require(limit is None or is_count(limit), "limit", "None or an integer >= 1", limit)
    files = _qm9_files(Path(path) if path is not None else _qm9_data_dir())
    skipped: Counter = Counter()
    graphs: list[Data] = []
    for file in files:
        with file.open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            require("SMILES" in header, str(file), "a CSV with a SMILES column", header[:5])
            column = header.index("SMILES")
            for number, row in enumerate(reader, start=2):
                mol = _parse(row[column])
                if mol is None:
                    raise ValueError(
                        f"{file.name} line {number}: cannot parse SMILES {row[column]!r}"
                    )
                if mol.GetNumAtoms() > max_heavy_atoms:
                    skipped["too_large"] += 1
                    continue
                try:
                    graphs.append(mol_to_data(mol, ATOM_TYPES_QM9))
                except UnsupportedMolecule as err:
                    skipped[err.reason] += 1
                    continue
                if limit is not None and len(graphs) == limit:
                    break
        if limit is not None and len(graphs) == limit:
            break
    out = MoleculeList(graphs, ATOM_TYPES_QM9, "QM9 (qm9pack)", skipped)
    log.info(out.summary())
    return out


def write_molecule_set(
    folder: Path, molecules: str, max_molecules: int, test_fraction: float
) -> None:
    """The experiment's molecule set into ``folder/SETS_FILE``
    (:func:`~mixlab.graphs.curvdiff.datasets.save_sets`, with ``atom_types``): QM9 (``"qm9"``,
    the first molecules that leave ``max_molecules`` for training) or the NCI sample (anything
    else), at most 9 heavy atoms, with Ricci attributes, split train/test (seed 0) and the
    training part cut to ``max_molecules``."""
    if molecules == "qm9":
        limit = int(max_molecules / (1 - test_fraction))
        loaded = load_qm9(max_heavy_atoms=9, limit=limit)
    else:
        loaded = load_nci(max_heavy_atoms=9)
    graphs = with_curvature(list(loaded))
    train, test = split(graphs, test_fraction, seed=0)
    save_sets(folder / SETS_FILE, train[:max_molecules], test, atom_types=list(loaded.atom_types))


def _to_dataset(
    mols: Iterable[Chem.Mol],
    source: str,
    max_heavy_atoms: int | None,
    atom_types: Sequence[str] | None,
    allowed: AtomVocabulary,
    single_fragment: bool,
    skipped: Counter | None = None,
) -> MoleculeList:
    """Filter, pick the vocabulary (given, or the ``allowed`` elements present), build graphs."""
    require(
        max_heavy_atoms is None or is_count(max_heavy_atoms),
        "max_heavy_atoms",
        "None or an integer >= 1",
        max_heavy_atoms,
    )
    skipped = Counter() if skipped is None else skipped
    ceiling = check_atom_types(atom_types) if atom_types is not None else allowed
    kept = []
    for mol in mols:
        if max_heavy_atoms is not None and mol.GetNumAtoms() > max_heavy_atoms:
            skipped["too_large"] += 1
        elif single_fragment and len(Chem.GetMolFrags(mol)) > 1:
            skipped["fragments"] += 1
        elif any(a.GetSymbol() not in ceiling for a in mol.GetAtoms() if a.GetAtomicNum() > 1):
            skipped["element"] += 1
        else:
            kept.append(mol)
    graphs = []
    if atom_types is None:
        vocab: AtomVocabulary = atom_types_of(kept) if kept else ()
    else:
        vocab = ceiling
    for mol in kept:
        try:
            graphs.append(mol_to_data(mol, vocab))
        except UnsupportedMolecule as err:
            skipped[err.reason] += 1
    if atom_types is None and graphs:
        # Molecules skipped above (charged, ...) may have been the only carriers of an element.
        present = torch.stack([g.x.any(dim=0) for g in graphs]).any(dim=0)
        if not present.all():
            for g in graphs:
                g.x = g.x[:, present]
            vocab = tuple(s for s, p in zip(vocab, present.tolist(), strict=True) if p)
    out = MoleculeList(graphs, vocab, source, skipped)
    log.info(out.summary())
    return out


def _qm9_data_dir() -> Path:
    spec = importlib.util.find_spec("qm9pack")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(QM9_HINT)
    for location in spec.submodule_search_locations:
        folder = Path(location) / "data"
        if folder.is_dir():
            return folder
    try:  # a namespace or zipped install: ask the distribution
        return Path(str(importlib.metadata.distribution("qm9pack").locate_file("qm9pack/data")))
    except importlib.metadata.PackageNotFoundError as err:
        raise ImportError(QM9_HINT) from err


def _qm9_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("qm9_part*.csv"))
    require(
        bool(files), "path", "a QM9 CSV or a folder with qm9_part*.csv (qm9pack/data)", str(path)
    )
    return files


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def molecule_metrics(
    generated_smiles: Sequence[str | None],
    train_smiles: Iterable[str],
    *,
    canonicalize_train: bool = True,
) -> dict[str, float]:
    """Validity, uniqueness, novelty, V.U.N. and connectivity of generated molecules.

    ``generated_smiles`` holds :func:`data_to_smiles` outputs (None = invalid). A molecule is
    **valid** when RDKit parses (sanitizes) it *and* it is one connected fragment (no "." in its
    SMILES): a set of disconnected fragments is not one molecule (issue 68; GDSS, DiGress and
    MoFlow report validity without correction on sanitization alone, which this refuses). Every
    SMILES is compared in canonical form without stereo. Pass ``canonicalize_train=False`` when
    ``train_smiles`` are ``Data.smiles`` (already canonical) to skip re-parsing a large training
    set.

    - validity: valid (sanitizes, one fragment) / total;
    - sanitized: sanitizes, any number of fragments / total;
    - fragment_rate: sanitized with more than one fragment / sanitized;
    - largest_fragment_validity: the largest fragment of a sanitized molecule is a valid molecule,
      over total (what a "largest fragment" post-processing would report);
    - uniqueness: distinct valid / valid;
    - novelty: distinct valid not in the training set / distinct valid;
    - vun: distinct valid novel / total (valid ∧ unique ∧ novel);
    - connected: valid with one fragment / sanitized (kept for older reports: 1 − fragment_rate).

    Every ratio with a zero denominator is 0.0.
    """
    total = len(generated_smiles)
    sanitized = []
    for s in generated_smiles:
        mol = _parse(s) if isinstance(s, str) and s else None
        if mol is not None:
            sanitized.append(_canonical(mol))
    valid = [s for s in sanitized if "." not in s]
    largest = [max(s.split("."), key=len) for s in sanitized]
    largest_valid = sum(_parse(s) is not None for s in largest)
    if canonicalize_train:
        train = set()
        for s in train_smiles:
            mol = _parse(s)
            train.add(_canonical(mol) if mol is not None else s)
    else:
        train = set(train_smiles)
    unique = set(valid)
    novel = unique - train

    def ratio(a: int, b: int) -> float:
        return a / b if b else 0.0

    return {
        "validity": ratio(len(valid), total),
        "sanitized": ratio(len(sanitized), total),
        "fragment_rate": ratio(len(sanitized) - len(valid), len(sanitized)),
        "largest_fragment_validity": ratio(largest_valid, total),
        "uniqueness": ratio(len(unique), len(valid)),
        "novelty": ratio(len(novel), len(unique)),
        "vun": ratio(len(novel), total),
        "connected": ratio(len(valid), len(sanitized)),
    }


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _parse(smiles: str) -> Chem.Mol | None:
    with rdBase.BlockLogs():
        return Chem.MolFromSmiles(smiles)


def _canonical(mol: Chem.Mol) -> str:
    return Chem.MolToSmiles(mol, isomericSmiles=False)


def _as_numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
