"""MixScentNet data (issue 25): featurization widths, the loaders on a synthetic fixture in the
published files' format, their errors, the splits, and the real folder when it is present."""

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from rdkit import Chem

from mixlab.graphs.mixscentnet.data import (
    GSLF_FILE,
    MIXTURE_FILES,
    load_gslf,
    load_mixture_pairs,
    non_overlapping,
    read_mixtures_csv,
    read_pairs_csv,
    split_pairs,
    write_synthetic_olfaction,
)
from mixlab.graphs.mixscentnet.featurize import (
    ATOM_FEATURES,
    BOND_FEATURES,
    bond_features,
    ecfp4,
    smiles_to_data,
    tanimoto,
)

REAL = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "olfaction"
needs_real = pytest.mark.skipif(
    not (REAL / GSLF_FILE).is_file(), reason=f"the olfaction data is not at {REAL}"
)


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    return write_synthetic_olfaction(tmp_path_factory.mktemp("olfaction"), num_pairs=60)


def _copy(fixture_dir, tmp_path) -> Path:
    return Path(shutil.copytree(fixture_dir, tmp_path / "copy"))


def _edit(path: Path, row: int, column: str, value: str) -> None:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows[row][column] = value
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_graph_features_have_pommix_widths_and_both_bond_directions():
    graph = smiles_to_data("CC(=O)OC1=CC=CC=C1")  # phenyl acetate
    assert graph.x.shape == (10, ATOM_FEATURES) == (10, 85)
    assert graph.edge_attr.shape == (20, BOND_FEATURES) == (20, 14)
    assert (graph.x[:, :-1].sum(1) == 6).all()  # six one-hots, one hot each
    assert graph.x[:, -1].sum() == 6  # six aromatic atoms
    assert bond_features(None)[0] == 1
    assert sum(bond_features(None)) == 1
    aromatic = Chem.MolFromSmiles("c1ccccc1").GetBondWithIdx(0)
    assert bond_features(aromatic)[4] == 1
    assert bond_features(aromatic)[0] == 0
    single = smiles_to_data("C")
    assert single.x.shape == (1, 85)
    assert single.edge_index.shape == (2, 0)


def test_tanimoto_is_symmetric_with_unit_diagonal():
    similarity = tanimoto(ecfp4(["CCO", "CCCO", "c1ccccc1"]))
    assert np.allclose(similarity, similarity.T)
    assert np.allclose(np.diag(similarity), 1)
    assert similarity[0, 1] > similarity[0, 2]


def test_loaders_read_the_published_format(fixture_dir):
    labels = load_gslf(fixture_dir)
    assert labels.labels.shape == (60, 6)
    assert set(np.unique(labels.labels)) <= {0, 1}
    pairs = load_mixture_pairs(fixture_dir)
    assert pairs.pairs.shape == (60, 2)
    assert len(pairs.distance) == 60
    assert ((pairs.distance >= 0) & (pairs.distance <= 1)).all()
    assert all(len(m) >= 1 for m in pairs.mixtures)
    assert set(pairs.study) <= {"Snitz 1", "Bushdid", "Ravia 1"}


@pytest.mark.parametrize(
    ("file", "column", "value", "message"),
    [
        (MIXTURE_FILES[1], "smi_0", "C1CC(", r"unparsable SMILES 'C1CC\(' .*row 2"),
        (MIXTURE_FILES[0], "Mixture 1", "999.0", r"row 2: Mixture 1 = '999.0' .* no definition"),
        (MIXTURE_FILES[0], "Experimental Values", "1.5", r"row 2: distance must lie in \[0, 1\]"),
        (GSLF_FILE, "note0", "2", r"row 2 column 'note0': labels must be 0 or 1"),
    ],
)
def test_bad_rows_are_named(fixture_dir, tmp_path, file, column, value, message):
    folder = _copy(fixture_dir, tmp_path)
    _edit(folder / file, 0, column, value)
    loader = load_gslf if file == GSLF_FILE else load_mixture_pairs
    with pytest.raises(ValueError, match=message):
        loader(folder)


def test_an_empty_mixture_and_a_missing_folder_are_refused(fixture_dir, tmp_path):
    folder = _copy(fixture_dir, tmp_path)
    path = folder / MIXTURE_FILES[1]
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for column in rows[0]:
        if column.startswith("smi_"):
            rows[0][column] = ""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ValueError, match="row 2: mixture .* is empty"):
        load_mixture_pairs(folder)
    with pytest.raises(FileNotFoundError, match="nowhere.*lacks gs-lf"):
        load_gslf(tmp_path / "nowhere")


def test_user_csvs_and_their_errors(tmp_path):
    mixtures = tmp_path / "mixtures.csv"
    mixtures.write_text(
        "mixture,smiles,concentrations\nA,CCO;CCCO,1;0.5\nB,c1ccccc1,\nC,CC(=O)O;CCO;CCCC,\n"
    )
    names, components, concentrations = read_mixtures_csv(mixtures)
    assert names == ["A", "B", "C"]
    assert components[0] == ("CCO", "CCCO")
    assert concentrations == [(1.0, 0.5), None, None]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("mixture_1,mixture_2,distance\nA,B,0.3\nB,C,0.7\n")
    index, distance = read_pairs_csv(pairs, names)
    assert index.tolist() == [[0, 1], [1, 2]]
    assert distance.tolist() == [0.3, 0.7]
    pairs.write_text("mixture_1,mixture_2\nA,Z\n")
    with pytest.raises(ValueError, match="row 2: mixture_2 names an unknown mixture 'Z'"):
        read_pairs_csv(pairs, names, require_distance=False)
    mixtures.write_text("mixture,smiles\nA,;\n")
    with pytest.raises(ValueError, match="row 2: mixture 'A' is empty"):
        read_mixtures_csv(mixtures)
    mixtures.write_text("mixture,smiles\nA,CCO;OCC\n")
    with pytest.raises(ValueError, match="row 2: mixture 'A' repeats a component"):
        read_mixtures_csv(mixtures)
    mixtures.write_text("mixture,smiles,concentrations\nA,CCO;CC,1\n")
    with pytest.raises(ValueError, match="concentrations must be 2 finite numbers"):
        read_mixtures_csv(mixtures)


def test_random_split_is_a_partition_stratified_by_study(fixture_dir):
    data = load_mixture_pairs(fixture_dir)
    tests = [split_pairs(data, "random", k, folds=5)[1] for k in range(5)]
    assert sorted(np.concatenate(tests).tolist()) == list(range(len(data)))
    train, test = split_pairs(data, "random", 0)
    assert not set(train) & set(test)
    for study in set(data.study):
        share = (data.study[test] == study).mean()
        assert abs(share - (data.study == study).mean()) < 0.15


def test_leave_molecules_out_holds_out_molecules_never_seen_in_training(fixture_dir):
    data = load_mixture_pairs(fixture_dir)
    train, test = split_pairs(data, "molecules", 0, folds=5)
    assert abs(len(test) - len(data) / 5) <= 0.02 * len(data) + 1e-9
    seen = {s for a, b in data.pairs[train] for s in (*data.mixtures[a], *data.mixtures[b])}
    for a, b in data.pairs[test]:
        assert (set(data.mixtures[a]) | set(data.mixtures[b])) - seen
    again = split_pairs(data, "molecules", 0, folds=5)
    assert np.array_equal(again[1], test)  # seeded


@needs_real
def test_the_real_folder_matches_the_issue():
    labels = load_gslf(REAL)
    assert labels.labels.shape == (4983, 138)
    data = load_mixture_pairs(REAL)
    assert len(data) == 865
    assert 195 <= len(data.components) <= 205
    assert max(len(m) for m in data.mixtures) == 43
    white = (data.study == "Snitz 1") & non_overlapping(data)
    assert white.sum() == 147
