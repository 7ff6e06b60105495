"""The CurvDiff experiment (tiny config, resume after a kill) and the ``mixlab-graphs curvdiff`` CLI."""

import json

import pytest

from mixlab.graphs.cli import main
from mixlab.graphs.curvdiff.config import METHOD, Config
from mixlab.graphs.curvdiff.datasets import hetero_within, read_graph6, tree, write_graph6
from mixlab.graphs.curvdiff.experiment import run as run_experiment

TINY = {
    "num_graphs": 8,
    "n_seeds": 2,
    "num_samples": 4,
    "systems": ("E", "HSE", "curvdiff", "er", "sbm"),
    "hidden": 8,
    "denoiser_width": 8,
    "denoiser_layers": 1,
    "ae_epochs": 2,
    "diffusion_steps": 5,
    "diffusion_iterations": 3,
    "molecules": "none",
    "workers": 1,
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))


def test_experiment_reports_every_system_regime_and_claim(tmp_path):
    result = METHOD.execute(Config(**TINY), tmp_path / "run")  # refuses a claim without control
    assert result.cache["state"] == "cold"  # an empty cache: the graph set was made
    entries = [e["entry"].split("/")[1].rsplit("-", 1)[0] for e in result.cache["entries"]]
    assert entries == ["set-hetero-within"]
    rows = set(result.metrics)
    assert rows == {f"hetero-within/{s}" for s in (*TINY["systems"], "floor")}
    assert [c.key for c in result.claims] == [spec.key for spec in Config.CLAIMS]
    assert all(c.control is not None and c.control.system for c in result.claims)
    assert result.claims[1].control.system == "sbm and er"  # both controls, judged alike
    assert "sbm: " in result.claims[1].control.evidence
    assert "descriptors where er < E-only" in result.claims[1].control.evidence
    assert len(result.regime) == 1
    check = result.regime[0]
    floor = result.metrics["hetero-within/floor"]
    assert floor["degree_sep_std"] is not None  # the floor's spread over resplits
    assert any(floor["sigma_clustering"] == pytest.approx(0.1 * f) for f in (0.1, 0.3, 1, 3, 10))
    er = result.metrics["hetero-within/er"]
    assert f"ER degree {er['degree_sep']:.4g}" in check.evidence  # ER against floor + 2 sd
    assert result.metrics["hetero-within/E"]["self_mean_sep"] is not None  # E against itself
    assert result.metrics["hetero-within/E"]["exact_recovery_refined"] is not None
    gated = [c for c in result.claims if c.text in check.gates]
    assert gated
    assert check.holds or all(c.state == "untested" for c in gated)
    untested = [c for c in result.claims if "full profile" in c.evidence]
    assert len(untested) == 2  # controls and QM9 need the full profile's sets
    assert (tmp_path / "run" / "mmd.png").exists()
    samples = read_graph6(tmp_path / "run" / "samples" / "hetero-within-curvdiff-seed0.g6")
    assert len(samples) == 4


def test_killed_experiment_resumes_to_the_same_result(tmp_path, monkeypatch):
    from mixlab.graphs.curvdiff import experiment

    config = Config(**TINY)
    whole = run_experiment(config, tmp_path / "whole")
    calls = []
    real = experiment.run_cell

    def dies_after_three(*args):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(experiment, "run_cell", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, tmp_path / "killed")
    monkeypatch.setattr(experiment, "run_cell", lambda *a: calls.append(a[3]) or real(*a))
    resumed = METHOD.execute(config, tmp_path / "killed", resume=True)
    assert resumed.cache["state"] == "warm"  # the graph set the first run made
    assert len(calls) == 10  # 3 before the kill, the other 7 of 10 cells after it
    for name, row in whole.metrics.items():
        for key, value in row.items():
            if "seconds" not in key:
                assert resumed.metrics[name][key] == value, (name, key)
    assert [c.to_dict() for c in resumed.claims] == [c.to_dict() for c in whole.claims]


def _cells(mean_mmd: dict[str, list[float]]) -> list[dict]:
    """hetero-within cells of three seeds with the given mean MMD (claim protocol) per system."""
    return [
        {"set": "hetero-within", "seed": seed, "system": system, "mean_sep": values[seed]}
        for system, values in mean_mmd.items()
        for seed in range(3)
    ]


def test_a_claim_the_sbm_control_also_passes_is_vacuous():
    from mixlab.graphs.curvdiff.experiment import claims

    config = Config(**{**TINY, "systems": ("E", "HSE", "curvdiff", "digress", "er", "sbm")})
    digress = [0.10, 0.11, 0.12]

    def matches_digress(sbm: list[float]):
        cells = {"curvdiff": [0.09, 0.10, 0.115], "digress": digress, "sbm": sbm, "er": er}
        return {c.key: c for c in claims(_cells(cells), config)}["matches_digress"]

    er = [0.3, 0.3, 0.3]
    assert matches_digress(sbm=[0.2, 0.2, 0.3]).state == "holds"  # both controls are worse
    claim = matches_digress(sbm=[0.05, 0.05, 0.05])  # a Louvain-SBM passes the same test
    assert claim.state == "vacuous"
    assert claim.control.system == "sbm and er"
    assert "sbm: worst of 3 seeds" in claim.control.evidence
    assert "sbm mean MMD 0.05 <= DiGress-style + 2 sd" in claim.control.evidence
    er = [0.05, 0.05, 0.05]  # ER passing alone is enough
    assert matches_digress(sbm=[0.2, 0.2, 0.3]).state == "vacuous"
    # equal means, but on seed 0 CurvDiff is worse than DiGress-style by more than 2 sd
    one_bad_seed = _cells(
        {"curvdiff": [0.25, 0.1, 0.1], "digress": [0.05, 0.2, 0.2], "sbm": [1] * 3, "er": [1] * 3}
    )
    claim = {c.key: c for c in claims(one_bad_seed, config)}["matches_digress"]
    assert claim.state == "fails"  # judged on the worst seed, not the mean
    assert "worst of 3 seeds (seed 0)" in claim.evidence


def test_a_win_against_an_e_only_at_the_floor_is_untested():
    """Claim 2's premise: E-only above the real-vs-real floor + 2 sd on every seed, else a
    win against it would be a win against the data."""
    from mixlab.graphs.curvdiff.experiment import claims

    config = Config(**TINY)
    done = [
        {"set": "hetero-within", "seed": seed, "system": system,
         **{f"{d}_sep": value + 0.01 * seed for d in ("degree", "clustering", "orbit", "spectral")},
         "mean_sep": value + 0.01 * seed}
        for system, value in (("E", 0.30), ("curvdiff", 0.10), ("sbm", 0.50), ("er", 0.50))
        for seed in range(3)
    ]  # fmt: skip
    floors = {"hetero-within": {"mean_sep": 0.05, "mean_sep_std": 0.01}}
    assert {c.key: c for c in claims(done, config, floors)}["beats_euclidean_mmd"].state == "holds"
    at_floor = {"hetero-within": {"mean_sep": 0.31, "mean_sep_std": 0.01}}
    claim = {c.key: c for c in claims(done, config, at_floor)}["beats_euclidean_mmd"]
    assert claim.state == "untested"
    assert "above the real-vs-real floor" in claim.evidence


def test_the_e_only_control_of_claim_1_is_judged_against_the_other_geometries():
    """Claim 1's control E-only is one of the claim's references: judged in HSE's place it is
    compared with H and S only, never with itself, so it can pass (the claim is then vacuous)."""
    from mixlab.graphs.curvdiff.experiment import claims

    config = Config(**{**TINY, "systems": ("E", "H", "S", "HSE", "curvdiff", "er", "sbm")})
    distortion = {"HSE": [0.10, 0.12, 0.11], "E": [0.20, 0.22, 0.25], "H": [0.50, 0.55, 0.60],
                  "S": [0.60, 0.62, 0.70]}  # fmt: skip
    recovery = {"HSE": [0.95, 0.96, 0.97], "E": [0.90, 0.88, 0.91], "H": [0.50, 0.40, 0.45],
                "S": [0.30, 0.35, 0.20]}  # fmt: skip
    done = [
        {"set": "hetero-within", "seed": seed, "system": system,
         "distortion": distortion[system][seed], "exact_recovery": recovery[system][seed]}
        for system in distortion
        for seed in range(3)
    ]  # fmt: skip
    claim = {c.key: c for c in claims(done, config)}["product_lower_distortion"]
    assert claim.control.system == "E and H and S"  # each single geometry at equal dimension
    assert claim.control.tested  # E-only beats H and S on every seed
    assert claim.control.holds
    assert claim.state == "vacuous"
    assert "E − E" not in claim.control.evidence
    assert "H − E distortion" in claim.control.evidence
    assert "S − E distortion" in claim.control.evidence
    only_e = Config(**{**TINY, "systems": ("E", "HSE", "curvdiff", "er", "sbm")})
    claim = {c.key: c for c in claims(done, only_e)}["product_lower_distortion"]
    assert claim.state == "untested"  # no single geometry besides E-only to judge it against
    assert "no single geometry other than E" in claim.control.evidence


def test_the_qm9_claim_is_untested_since_its_control_is_its_reference(monkeypatch):
    """Claim 5's control E-only is the claim's reference: not judged against itself (a not-worse
    test its reference passes trivially), so the claim is untested, not vacuous."""
    import importlib.util

    from mixlab.graphs.curvdiff.experiment import claims

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: real("json") if name == "qm9pack" else real(name, *a),
    )
    config = Config(**{**TINY, "molecules": "qm9"})
    done = [
        {"set": "qm9", "seed": seed, "system": system, "vun": vun}
        for system, vun in (("curvdiff", 0.8), ("E", 0.7))
        for seed in range(3)
    ]
    claim = {c.key: c for c in claims(done, config)}["qm9_vun"]
    assert claim.control.system == "E"
    assert not claim.control.tested
    assert "own reference" in claim.control.evidence
    assert claim.state == "untested"


def test_qm9_without_its_extra_is_refused_by_name(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "qm9pack" else real(name, *a)
    )
    with pytest.raises(ValueError, match="molecules.*--extra qm9"):
        Config(**{**TINY, "molecules": "qm9"})


def test_the_cached_sets_are_made_by_code_their_entries_are_keyed_by(monkeypatch):
    """A change to how a cached set is made makes it again: the recipes live in modules of the
    entry's ``code``, not in the experiment."""
    from mixlab.graphs.curvdiff import datasets, experiment, molecules

    assert experiment.write_graph_set.__module__ in experiment.SET_CODE
    assert datasets.with_curvature.__module__ in experiment.SET_CODE  # the Ricci attributes
    assert molecules.write_molecule_set.__module__ in experiment.MOLECULE_CODE
    assert molecules.with_curvature.__module__ in experiment.MOLECULE_CODE
    made = []

    def recipe(folder, *args):  # stands in for RDKit's NCI sample
        made.append(args)
        datasets.save_sets(folder / datasets.SETS_FILE, [], [], atom_types=["C"])

    monkeypatch.setattr(molecules, "write_molecule_set", recipe)
    train, test, atom_types = experiment.molecule_set(Config(**{**TINY, "molecules": "nci"}))
    assert made == [("nci", 2000, 0.25)]  # the experiment's build only calls the recipe
    assert (train, test, atom_types) == ([], [], ("C",))


@pytest.mark.parametrize(
    ("override", "parameter"),
    [
        ({"systems": ("HSE", "er")}, "systems"),
        ({"graph_sets": ("ego-big",)}, "graph_sets"),
        ({"latent_dim": 8}, "latent_dim"),
        ({"molecules": "zinc"}, "molecules"),
        ({"min_nodes": 30}, "min_nodes"),
    ],
)
def test_config_names_the_bad_field(override, parameter):
    with pytest.raises(ValueError, match=parameter):
        Config(**{**TINY, **override})


def test_cli_curvature_train_sample_evaluate(tmp_path, capsys):
    graphs = tmp_path / "graphs.g6"
    write_graph6(hetero_within(6, seed=0), graphs)
    edges = tmp_path / "edges.csv"
    assert main(["curvdiff", "curvature", str(graphs), "--out", str(edges)]) == 0
    lines = edges.read_text().splitlines()
    assert lines[0] == "graph,u,v,ollivier_ricci,forman"
    total = sum(g.edge_index.shape[1] // 2 for g in read_graph6(graphs))
    assert len(lines) == 1 + total
    model = tmp_path / "model"
    argv = ["curvdiff", "train", "--data", str(graphs), "--out", str(model), "--ae-epochs", "2"]
    assert main([*argv, "--iterations", "2", "--steps", "4"]) == 0
    assert (model / "model.safetensors").exists()
    config = json.loads((model / "config.json").read_text())["config"]
    assert config["ricci_gating"]
    assert config["ricci_conditioning"]
    generated = tmp_path / "generated.g6"
    assert (
        main(["curvdiff", "sample", "--model", str(model), "--num", "3", "--out", str(generated)])
        == 0
    )
    assert len(read_graph6(generated)) == 3
    table = tmp_path / "table.json"
    argv = ["curvdiff", "evaluate", "--generated", str(generated), "--reference", str(graphs)]
    assert main([*argv, "--out", str(table)]) == 0
    rows = json.loads(table.read_text())
    assert set(rows) == {
        "generated (tv)",
        "generated (emd)",
        "floor (reference halves) (tv)",
        "floor (reference halves) (emd)",
    }
    trees = tmp_path / "trees.g6"
    write_graph6(tree(4, seed=0), trees)
    argv = ["curvdiff", "evaluate", "--generated", str(trees), "--reference", str(trees)]
    assert main([*argv, "--train", str(trees), "--validity", "tree", "--out", str(table)]) == 0
    assert json.loads(table.read_text())["vun"]["valid"] == 1.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--data", "MISSING.g6", "--out", "OUT"], "--data"),
        (["train", "--data", "GRAPHS", "--out", "OUT", "--geometry", "HXE"], "geometry"),
        (["train", "--data", "GRAPHS", "--out", "OUT", "--iterations", "0"], "--iterations"),
        (["train", "--data", "BAD_SMILES", "--out", "OUT"], "line 2"),
        (["train", "--data", "EMPTY", "--out", "OUT"], "no graphs"),
        (["curvature", "GRAPHS", "--alpha", "1.5"], "--alpha"),
        (["sample", "--model", "OUT", "--num", "3", "--out", "x.g6"], "--model"),
        (["evaluate", "--generated", "GRAPHS", "--reference", "BAD_SMILES"], "--reference"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    graphs = tmp_path / "graphs.g6"
    write_graph6(hetero_within(2, seed=0), graphs)
    (tmp_path / "bad.smi").write_text("CCO ethanol\nC1CC broken\n")
    (tmp_path / "empty.g6").write_text("\n")
    paths = {
        "GRAPHS": str(graphs),
        "BAD_SMILES": str(tmp_path / "bad.smi"),
        "EMPTY": str(tmp_path / "empty.g6"),
        "OUT": str(tmp_path / "out"),
        "MISSING.g6": str(tmp_path / "missing.g6"),
    }
    code = main(["curvdiff", *[paths.get(a, a) for a in argv]])
    error = capsys.readouterr().err.strip()
    assert code == 2
    assert len(error.splitlines()) == 1
    assert message in error
