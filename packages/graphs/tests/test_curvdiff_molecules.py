"""CurvDiff molecules: SMILES ↔ graph round trips, no valence correction, SMILES files, the NCI
and QM9 loaders, and the validity / uniqueness / novelty metrics."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from mixlab.graphs.curvdiff import molecules as mm
from mixlab.graphs.curvdiff.molecules import (
    ATOM_TYPES_QM9,
    QM9_HINT,
    UnsupportedMolecule,
    atom_types_of,
    build_molecule,
    data_to_smiles,
    load_nci,
    load_qm9,
    mol_to_data,
    molecule_metrics,
    parse_smiles_lines,
    read_smiles,
)

QM9_DATA = Path("/tmp/qm9venv/lib/python3.11/site-packages/qm9pack/data")


def _check_graph(g: Data, num_types: int) -> None:
    n, e = g.num_nodes, g.edge_index.shape[1]
    assert g.x.shape == (n, num_types)
    assert g.x.dtype == torch.float32
    assert torch.equal(g.x.sum(1), torch.ones(n))
    assert g.edge_index.dtype == torch.int64
    assert g.edge_attr.shape == (e, 3)
    assert torch.equal(g.edge_attr.sum(1), torch.ones(e))
    assert bool((g.edge_index[0] != g.edge_index[1]).all())
    keys = (g.edge_index[0] * n + g.edge_index[1]).tolist()
    assert keys == sorted(set(keys))  # coalesced
    flipped = {(j, i) for i, j in g.edge_index.T.tolist()}
    assert flipped == {(i, j) for i, j in g.edge_index.T.tolist()}  # both directions


@pytest.mark.parametrize(
    "smiles",
    ["c1ccccc1", "c1ccncc1", "CC#N", "OC(=O)c1ccccc1F", "C1=CC=CN1", "O=C1CCC(=O)N1", "C"],
)
def test_round_trip(smiles: str) -> None:
    g = mol_to_data(smiles, ATOM_TYPES_QM9)
    _check_graph(g, 4)
    assert data_to_smiles(g, ATOM_TYPES_QM9) == g.smiles
    # the tuple form gives the same molecule
    bonds = np.zeros((g.num_nodes, g.num_nodes), dtype=np.int64)
    bonds[g.edge_index[0], g.edge_index[1]] = g.edge_attr.argmax(1) + 1
    assert data_to_smiles((g.x.argmax(1), bonds), ATOM_TYPES_QM9) == g.smiles


def test_kekulized_bonds() -> None:
    benzene = mol_to_data("c1ccccc1", ATOM_TYPES_QM9)
    assert benzene.smiles == "c1ccccc1"
    counts = benzene.edge_attr.sum(0).tolist()  # both directions: 3 single + 3 double bonds
    assert counts == [6.0, 6.0, 0.0]
    nitrile = mol_to_data("N#CC", ATOM_TYPES_QM9)
    assert nitrile.smiles == "CC#N"
    assert nitrile.edge_attr.sum(0).tolist() == [2.0, 0.0, 2.0]
    assert nitrile.x.argmax(1).tolist() == [1, 0, 0]  # atoms in input order: N, C, C


def test_no_valence_correction() -> None:
    star = np.zeros((6, 6), dtype=np.int64)
    star[0, 1:] = star[1:, 0] = 1  # carbon with five single bonds
    assert build_molecule(np.zeros(6, dtype=np.int64), star, ATOM_TYPES_QM9) is None
    assert data_to_smiles((np.zeros(6, dtype=np.int64), star), ATOM_TYPES_QM9) is None
    neopentane = star[:5, :5]  # four bonds
    assert data_to_smiles((np.zeros(5, dtype=np.int64), neopentane), ATOM_TYPES_QM9) == "CC(C)(C)C"
    fluorine = np.array([[0, 2], [2, 0]])  # F=C: fluorine with two bonds
    assert data_to_smiles((np.array([3, 0]), fluorine), ATOM_TYPES_QM9) is None


def test_malformed_graph_raises() -> None:
    with pytest.raises(ValueError, match="bond_orders must be a symmetric"):
        build_molecule(np.array([0, 0]), np.array([[0, 1], [0, 0]]), ATOM_TYPES_QM9)
    with pytest.raises(ValueError, match="atom_ids must be integers in"):
        build_molecule(np.array([0, 7]), np.zeros((2, 2), dtype=int), ATOM_TYPES_QM9)
    with pytest.raises(ValueError, match="atom_types must be heavy-atom"):
        build_molecule(np.array([0]), np.zeros((1, 1), dtype=int), ("C", "H"))


def test_data_to_smiles_from_one_direction_and_without_edge_attr() -> None:
    atom_ids = torch.tensor([0, 0, 2])
    x = torch.nn.functional.one_hot(atom_ids, 4).float()
    edge_index = torch.tensor([[0, 1], [1, 2]])
    assert data_to_smiles(Data(x=x, edge_index=edge_index), ATOM_TYPES_QM9) == "CCO"
    edge_attr = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
    g = Data(x=x, edge_index=edge_index, edge_attr=edge_attr)
    assert data_to_smiles(g, ATOM_TYPES_QM9) == "CC=O"


@pytest.mark.parametrize(
    ("smiles", "atom_types", "reason"),
    [
        ("C[N+](C)(C)C", ATOM_TYPES_QM9, "charged"),
        ("[CH3]", ATOM_TYPES_QM9, "radical"),
        ("CCS", ATOM_TYPES_QM9, "element"),
        ("C=[SH2]", ("C", "S"), "explicit_h"),  # RDKit would give the S of a C=S no hydrogen
    ],
)
def test_unsupported_molecules(smiles: str, atom_types: tuple[str, ...], reason: str) -> None:
    with pytest.raises(UnsupportedMolecule) as err:
        mol_to_data(smiles, atom_types)
    assert err.value.reason == reason
    assert isinstance(err.value, ValueError)


def test_parse_smiles_lines() -> None:
    lines = ["SMILES name\n", "\n", "CCO ethanol\n", "c1ccccc1\tbenzene ring\n"]
    records = parse_smiles_lines(lines, "molecules.smi")
    assert [(r.line, r.smiles, r.name) for r in records] == [
        (3, "CCO", "ethanol"),
        (4, "c1ccccc1", "benzene ring"),
    ]
    bad = ["smiles\n", "CCO\n", "C1CC\n"]
    with pytest.raises(ValueError, match=r"molecules\.smi line 3: cannot parse SMILES 'C1CC'"):
        parse_smiles_lines(bad, "molecules.smi")
    lenient = parse_smiles_lines(bad, "molecules.smi", skip_unparsable=True)
    assert [r.mol is None for r in lenient] == [False, True]


def test_read_smiles(tmp_path: Path) -> None:
    path = tmp_path / "mols.smi"
    path.write_text("smiles\nCCO a\nc1ccncc1 b\nC[N+](C)(C)C c\nCCCCCCCCCCCC d\nCl e\n")
    data = read_smiles(path, max_heavy_atoms=9)
    assert [g.smiles for g in data] == ["CCO", "c1ccncc1", "Cl"]
    assert data.atom_types == ("C", "N", "O", "Cl")
    assert data.skipped == {"charged": 1, "too_large": 1}
    assert all(g.x.shape[1] == 4 for g in data)
    qm9 = read_smiles(path, max_heavy_atoms=9, atom_types=ATOM_TYPES_QM9)
    assert [g.smiles for g in qm9] == ["CCO", "c1ccncc1"]
    assert qm9.skipped["element"] == 1
    path.write_text("CCO\nC1CC\n")
    with pytest.raises(ValueError, match="mols.smi line 2"):
        read_smiles(path)


def test_atom_types_of() -> None:
    assert atom_types_of(["ClCCBr", "OC", "c1ccncc1"]) == ("C", "N", "O", "Cl", "Br")
    with pytest.raises(ValueError, match=r"smiles\[1\]"):
        atom_types_of(["C", "C1CC"])


def test_load_nci() -> None:
    data = load_nci()
    assert len(data) > 500
    vocab = data.atom_types
    assert set(vocab) <= set(mm.ATOM_TYPES_ORGANIC)
    assert vocab[:3] == ("C", "N", "O")
    assert data.skipped["unparsable"] == 8
    assert data.skipped["too_large"] > 4000
    # file order: the first lines with <= 9 heavy atoms
    assert [g.smiles for g in data[:2]] == ["CC1=CC(=O)C=CC1=O", "CC(=NO)C(C)=NO"]
    for g in data:
        assert 1 <= g.num_nodes <= 9
        _check_graph(g, len(vocab))
        assert "." not in g.smiles
    for g in data[:50]:
        assert data_to_smiles(g, vocab) == g.smiles
    small = load_nci(max_heavy_atoms=4, atom_types=ATOM_TYPES_QM9)
    assert len(small) > 0
    assert all(g.num_nodes <= 4 and g.x.shape[1] == 4 for g in small)


def test_molecule_metrics() -> None:
    train = ["CCO", "c1ccccc1"]
    generated = ["OCC", "C1=CC=CC=C1", "CC#N", "CC#N", None, "C.C", "not a smiles"]
    m = molecule_metrics(generated, train)
    # sanitized: CCO, c1ccccc1, CC#N, CC#N, C.C; valid (one fragment): all but C.C
    assert m["sanitized"] == pytest.approx(5 / 7)
    assert m["validity"] == pytest.approx(4 / 7)
    assert m["fragment_rate"] == pytest.approx(1 / 5)
    assert m["largest_fragment_validity"] == pytest.approx(5 / 7)  # C.C's largest piece is C
    assert m["uniqueness"] == pytest.approx(3 / 4)  # CCO, c1ccccc1, CC#N
    assert m["novelty"] == pytest.approx(1 / 3)  # CC#N (C.C is no longer a valid molecule)
    assert m["vun"] == pytest.approx(1 / 7)
    assert m["connected"] == pytest.approx(4 / 5)
    empty = molecule_metrics([], train)
    assert empty == dict.fromkeys(
        ["validity", "sanitized", "fragment_rate", "largest_fragment_validity", "uniqueness",
         "novelty", "vun", "connected"], 0.0,
    )  # fmt: skip
    assert molecule_metrics([None, None], [])["validity"] == 0.0
    fast = molecule_metrics(generated, ["CCO", "c1ccccc1"], canonicalize_train=False)
    assert fast == m


def test_load_qm9_without_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "qm9pack" else real(name, *a)
    )
    with pytest.raises(ImportError) as err:
        load_qm9()
    assert str(err.value) == QM9_HINT
    assert "--extra qm9" in QM9_HINT


def test_load_qm9_csv(tmp_path: Path) -> None:
    path = tmp_path / "qm9_part1.csv"
    path.write_text(
        "XYZ_file,Index,SMILES,InChi\n"
        '"a.xyz",1,"C","x"\n"b.xyz",2,"N#CC=O","x"\n"c.xyz",3,"[NH3+]CC([O-])=O","x"\n'
        '"d.xyz",4,"c1ccoc1","x"\n'
    )
    data = load_qm9(path=path)
    assert [g.smiles for g in data] == ["C", "N#CC=O", "c1ccoc1"]
    assert data.atom_types == ATOM_TYPES_QM9
    assert data.skipped == {"charged": 1}
    assert [g.smiles for g in load_qm9(path=tmp_path, limit=2)] == ["C", "N#CC=O"]
    with pytest.raises(ValueError, match="limit must be"):
        load_qm9(path=path, limit=0)


def test_load_qm9_from_qm9pack() -> None:
    if not QM9_DATA.is_dir():
        pytest.skip("qm9pack not installed in /tmp/qm9venv")
    data = load_qm9(limit=300, path=QM9_DATA)
    assert len(data) == 300
    assert data[0].smiles == "C"
    for g in data:
        _check_graph(g, 4)
        assert g.num_nodes <= 9
