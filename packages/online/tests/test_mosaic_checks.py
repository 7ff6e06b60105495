"""Workspace v2 checks for MoSAIC: the lazy registry entry, config ranges, CLI validation before
work, stream/model files that fail in one line, and the regime checks of result.json."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mixlab.online.cli import main
from mixlab.online.mosaic import MoSAIC
from mixlab.online.mosaic.cli import sidecar_of
from mixlab.online.mosaic.config import EPOCHS, Config
from mixlab.online.mosaic.experiment import (
    REFERENCES,
    regime,
    static_grouse,
    summarise,
    true_subspace_oracle,
)
from mixlab.shared.files import CheckpointError, write_sidecar

CLI = Path(sys.executable).with_name("mixlab-online")


# --- the registry entry loads without NumPy ---------------------------------------------------


def test_registry_entry_imports_nothing_heavy() -> None:
    code = (
        "import sys; from importlib.metadata import entry_points;"
        "m = [e for e in entry_points(group='mixlab.methods') if e.name == 'mosaic'][0].load();"
        "assert m.name == 'mosaic' and m.backend == 'numpy' and m.headline_plot, m;"
        "print(sorted({k.split('.')[0] for k in sys.modules} & "
        "{'numpy', 'scipy', 'sklearn', 'torch', 'matplotlib', 'safetensors'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- Config ranges --------------------------------------------------------------------------------


def test_config_refuses_the_values_issue_16_names() -> None:
    # (nan/inf in every float field and 0/-1 in every int field: tests/test_methods.py)
    # the cases issue 16 names, and tuples element-wise
    for bad in (
        {"n_init": 0},
        {"window": -1},
        {"step_size": math.inf},
        {"observed_fractions": (0.2, math.nan)},
        {"epoch_lengths": (1500, -20, 1500)},
        {"min_step": 1.5},
        {"petrels_forgetting": 0.0},
        {"drift_rate": 0.0},
        {"n_source": 10},
        {"window": 30},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Config(**bad)
    Config(noise=0.0, min_step=0.0)  # documented edge values
    Config.from_profile("full")


# --- CLI validation before work ---------------------------------------------------------------


@pytest.fixture(scope="module")
def stream_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stream")
    path = folder / "stream.npz"
    argv = ["mosaic", "generate", "--out", str(path), "--n-features", "20", "--n-source", "100",
            "--epochs", "stationary:60", "--observed-fraction", "0.5"]  # fmt: skip
    assert main(argv) == 0
    assert sidecar_of(path).is_file()
    return path


@pytest.fixture(scope="module")
def model_base(stream_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with np.load(stream_file) as archive:
        X = archive["X"]
    base = tmp_path_factory.mktemp("model") / "model"
    MoSAIC(2, 2, n_init=1, max_iter=3, random_state=0).fit(X[:100]).save(base)
    return base


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *expected: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for text in expected:
        assert text in err, err
    return err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--out", "x.npy"], "--out must end in .npz"),
        (["--noise", "nan"], "--noise must be a finite number >= 0"),
        (["--noise", "inf"], "--noise must be a finite number >= 0"),
        (["--drift-rate", "inf"], "--drift-rate must be"),
        (["--observed-fraction", "0"], "--observed-fraction must be in (0, 1]"),
        (["--observed-fraction", "nan"], "--observed-fraction must be in (0, 1]"),
        (["--rank", "0"], "--rank must be an integer >= 1"),
        (["--rank", "100"], "--rank must be smaller than --n-features=100"),
        (["--n-features", "1"], "--n-features must be an integer >= 2"),
        (["--n-subspaces", "0"], "--n-subspaces must be an integer >= 1"),
        (["--n-source", "-1"], "--n-source must be an integer >= 0"),
        (["--epochs", "stationary:0"], "--epochs: every epoch needs at least 1 sample"),
        (["--epochs", "sideways:10"], "--epochs must look like"),
        (["--seed", "-1"], "--seed must be an integer in [0, 2**32)"),
    ],
)
def test_generate_checks_every_option_before_work(
    extra: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "g.npz"
    argv = ["mosaic", "generate", "--out", str(out), *extra]
    if extra[0] == "--out":
        argv = ["mosaic", "generate", "--out", str(tmp_path / extra[1])]
    _one_line_error(capsys, argv, expected)
    assert not (tmp_path / "sub").exists()


def test_generate_out_that_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "folder.npz").mkdir()
    _one_line_error(
        capsys, ["mosaic", "generate", "--out", str(tmp_path / "folder.npz")], "is a folder"
    )
    (tmp_path / "file").write_text("x")
    _one_line_error(
        capsys,
        ["mosaic", "generate", "--out", str(tmp_path / "file" / "s.npz")],
        "is not a folder",
    )


def test_complete_checks_everything_before_work(
    stream_file: Path,
    model_base: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_work(*args, **kwargs):
        raise AssertionError("complete started computing before its inputs were checked")

    monkeypatch.setattr(MoSAIC, "fit", no_work)
    monkeypatch.setattr(MoSAIC, "partial_fit", no_work)
    out = tmp_path / "new" / "c.npy"
    data = str(stream_file)
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir.npy").mkdir()
    cases = [
        ([str(tmp_path / "nosuch.npz")], "does not exist"),
        ([str(tmp_path)], "is not a file"),
        ([str(tmp_path / "file")], "data must be .npy, .npz"),
        ([data, "--out", str(tmp_path / "c.txt")], "--out must end in .npy"),
        ([data, "--out", str(tmp_path / "dir.npy")], "is a folder"),
        ([data, "--out", str(tmp_path / "file" / "c.npy")], "is not a folder"),
        ([data, "--pretrain", "-1"], "--pretrain must be an integer >= 0"),
        ([data, "--pretrain", "100000"], "--pretrain must be in [0, 160)"),
        ([data, "--n-experts", "0"], "--n-experts must be an integer >= 1"),
        ([data, "--rank", "0"], "--rank must be an integer >= 1"),
        ([data, "--rank", "20"], "--rank must be smaller than the data's 20 features"),
        ([data, "--step-size", "nan"], "--step-size must be in (0, 1]"),
        ([data, "--step-size", "inf"], "--step-size must be in (0, 1]"),
        ([data, "--step-size", "0"], "--step-size must be in (0, 1]"),
        ([data, "--batch-size", "0"], "--batch-size must be an integer >= 1"),
        ([data, "--seed", "-1"], "--seed must be an integer in [0, 2**32)"),
        ([data, "--truth", str(tmp_path / "nosuch.npy")], "--truth: "),
        ([data, "--load-model", str(tmp_path / "nosuch")], "no saved model there"),
        ([data, "--load-model", str(model_base), "--pretrain", "5"], "cannot be combined"),
        ([data, "--save-model", str(tmp_path / "file" / "m")], "--save-model: cannot create"),
    ]
    for extra, expected in cases:
        argv = ["mosaic", "complete", *extra]
        if "--out" not in extra:
            argv += ["--out", str(out)]
        _one_line_error(capsys, argv, expected)
        assert not out.parent.exists(), extra
    # a truth matrix of another shape is refused before the stream is completed
    np.save(tmp_path / "truth.npy", np.zeros((3, 20)))
    argv = ["mosaic", "complete", data, "--pretrain", "100", "--truth", str(tmp_path / "truth.npy"),
            "--out", str(out)]  # fmt: skip
    _one_line_error(capsys, argv, "--truth must have the shape of the data (160, 20)")
    assert not out.parent.exists()


# --- damaged stream and model files, through the console script ----------------------------------


def _run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=300)


def _assert_one_line(done: subprocess.CompletedProcess[str], *names: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert any(name in lines[0] for name in names), lines[0]


def _copy_stream(stream_file: Path, folder: Path) -> tuple[Path, Path, dict]:
    """A copy of the stream as folder/stream.npz with its sidecar (same name: the sidecar fits)."""
    folder.mkdir()
    copy = folder / stream_file.name
    copy.write_bytes(stream_file.read_bytes())
    sidecar = sidecar_of(copy)
    sidecar.write_text(sidecar_of(stream_file).read_text())
    return copy, sidecar, json.loads(sidecar.read_text())


def _resign(sidecar: Path, data: dict, covers: list[Path]) -> None:
    """Rewrite a sidecar with a valid integrity entry (as a careful forger would)."""
    data = {k: v for k, v in data.items() if k != "integrity"}
    write_sidecar(sidecar, data, covers=covers)


def test_damaged_stream_files_give_one_line(stream_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.npy"
    # truncated .npz (its sidecar's SHA-256 no longer matches)
    npz, sidecar, data = _copy_stream(stream_file, tmp_path / "truncated")
    npz.write_bytes(stream_file.read_bytes()[: npz.stat().st_size // 2])
    _assert_one_line(_run_cli("mosaic", "complete", npz, "--out", out), str(npz))
    # a key removed from the sidecar
    npz, sidecar, data = _copy_stream(stream_file, tmp_path / "key_removed")
    sidecar.write_text(json.dumps({k: v for k, v in data.items() if k != "n_samples"}))
    _assert_one_line(_run_cli("mosaic", "complete", npz, "--out", out), str(sidecar))
    # a key of the wrong type
    npz, sidecar, data = _copy_stream(stream_file, tmp_path / "wrong_type")
    sidecar.write_text(json.dumps({**data, "n_features": "20"}))
    _assert_one_line(_run_cli("mosaic", "complete", npz, "--out", out), str(sidecar))
    # a stored number edited by hand
    npz, sidecar, data = _copy_stream(stream_file, tmp_path / "edited")
    sidecar.write_text(json.dumps({**data, "n_samples": 161}))
    _assert_one_line(_run_cli("mosaic", "complete", npz, "--out", out), str(sidecar))
    # a hand-written .npz without a sidecar, truncated
    bare = tmp_path / "bare.npz"
    bare.write_bytes(stream_file.read_bytes()[:5000])
    _assert_one_line(_run_cli("mosaic", "complete", bare, "--out", out), str(bare))
    assert not out.exists()


def test_resigned_or_foreign_stream_files_are_refused(
    stream_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "c.npy")
    for name, change, expected in [
        ("removed", lambda d: {k: v for k, v in d.items() if k != "n_source"}, "missing key 'n_source'"),
        ("wrong_type", lambda d: {**d, "n_samples": "160"}, "key 'n_samples' has the wrong type"),
        ("edited", lambda d: {**d, "n_samples": 161}, "its sidecar records (161, 20)"),
        ("format", lambda d: {**d, "format": "something/1"}, "not a mixlab stream"),
    ]:  # fmt: skip
        npz, sidecar, data = _copy_stream(stream_file, tmp_path / name)
        _resign(sidecar, change(data), [npz])
        _one_line_error(capsys, ["mosaic", "complete", str(npz), "--out", out], expected)
    # a sidecar copied beside another file
    npz, sidecar, _ = _copy_stream(stream_file, tmp_path / "copied")
    other = npz.with_name("other.npz")  # its sidecar checks out, but it vouches for stream.npz
    other.write_bytes(npz.read_bytes())
    sidecar_of(other).write_text(sidecar.read_text())
    _one_line_error(
        capsys, ["mosaic", "complete", str(other), "--out", out], "a sidecar of another file"
    )
    # foreign .npz: no array X; a pickle in .npy clothing
    np.savez(tmp_path / "foreign.npz", Y=np.zeros((3, 3)))
    _one_line_error(
        capsys, ["mosaic", "complete", str(tmp_path / "foreign.npz"), "--out", out], "no array 'X'"
    )
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    _one_line_error(
        capsys, ["mosaic", "complete", str(tmp_path / "junk.npy"), "--out", out], "junk.npy"
    )
    assert not Path(out).exists()


def _copy_model(model_base: Path, folder: Path) -> tuple[Path, Path, Path, dict]:
    folder.mkdir()
    base = folder / model_base.name
    for suffix in (".json", ".safetensors"):
        base.with_suffix(suffix).write_bytes(model_base.with_suffix(suffix).read_bytes())
    json_file = base.with_suffix(".json")
    return base, json_file, base.with_suffix(".safetensors"), json.loads(json_file.read_text())


def test_damaged_saved_models_give_one_line(
    stream_file: Path, model_base: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c.npy"
    # truncated safetensors
    base, json_file, tensors, data = _copy_model(model_base, tmp_path / "truncated")
    tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
    done = _run_cli("mosaic", "complete", stream_file, "--load-model", base, "--out", out)
    _assert_one_line(done, str(tensors))
    # a key removed from the JSON sidecar
    base, json_file, tensors, data = _copy_model(model_base, tmp_path / "removed")
    json_file.write_text(json.dumps({k: v for k, v in data.items() if k != "format"}))
    done = _run_cli("mosaic", "complete", stream_file, "--load-model", base, "--out", out)
    _assert_one_line(done, str(json_file))
    # a key of the wrong type
    base, json_file, tensors, data = _copy_model(model_base, tmp_path / "wrong_type")
    json_file.write_text(json.dumps({**data, "format": 1}))
    done = _run_cli("mosaic", "complete", stream_file, "--load-model", base, "--out", out)
    _assert_one_line(done, str(json_file))
    # a stored number edited by hand
    base, json_file, tensors, data = _copy_model(model_base, tmp_path / "edited")
    data["state"]["n_samples_seen_"] += 1
    json_file.write_text(json.dumps(data))
    done = _run_cli("mosaic", "complete", stream_file, "--load-model", base, "--out", out)
    _assert_one_line(done, str(json_file))
    assert not out.exists()


def test_resigned_or_foreign_saved_models_are_refused(model_base: Path, tmp_path: Path) -> None:
    from mixlab.shared import save_state

    def resigned(name: str, change) -> Path:
        base, json_file, tensors, data = _copy_model(model_base, tmp_path / name)
        change(data)
        _resign(json_file, data, [tensors])
        return base

    cases = [
        (lambda d: d["state"].update(n_features_in_=7), "shape"),
        (lambda d: d["state"].pop("params"), "params"),
        (lambda d: d["state"]["params"].update(n_experts=0), "n_experts must be"),
        (lambda d: d["state"].update(n_samples_seen_="many"), "sample counts"),
        (lambda d: d["state"].update({"class": "GROUSE"}), "holds a GROUSE"),
    ]
    for index, (change, expected) in enumerate(cases):
        with pytest.raises(CheckpointError, match=expected):
            MoSAIC.load(resigned(f"case{index}", change))
    save_state({"weights": np.zeros(3)}, tmp_path / "foreign")
    with pytest.raises(CheckpointError, match="not a saved mixlab estimator"):
        MoSAIC.load(tmp_path / "foreign")


def test_stream_round_trip_and_hand_written_npz(
    stream_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    with np.load(stream_file) as archive:
        X = archive["X"]
    # a .npz written by hand (no sidecar) is accepted
    np.savez(tmp_path / "mine.npz", X=X)
    out = tmp_path / "c.npy"
    assert main(["mosaic", "complete", str(tmp_path / "mine.npz"), "--pretrain", "100",
                 "--rank", "2", "--n-experts", "2", "--out", str(out)]) == 0  # fmt: skip
    assert np.isfinite(np.load(out)).all()
    assert not list(tmp_path.glob(".*partial"))


# --- what complete tells about its inputs and its result ---------------------------------------


def _completed_nrmse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], generate: list[str], complete: list[str]
) -> tuple[float, str]:
    """Generate a stream of 150 source + 150 stream samples of 30 features, complete it, and return
    the true NRMSE that complete prints and its stderr."""
    stream = tmp_path / "stream.npz"
    assert main(["mosaic", "generate", "--out", str(stream), "--n-features", "30",
                 "--n-source", "150", "--epochs", "stationary:150", *generate]) == 0  # fmt: skip
    capsys.readouterr()
    out = tmp_path / "c.npy"
    argv = ["mosaic", "complete", str(stream), "--pretrain", "150", "--truth", str(stream),
            "--out", str(out), *complete]  # fmt: skip
    assert main(argv) == 0
    assert out.is_file()
    captured = capsys.readouterr()
    return float(captured.out.rsplit(":", 1)[1]), captured.err


def test_complete_warns_when_worse_than_zeros(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the issue's case: its own data at n = 30, p = 0.3 (4 subspaces of rank 5) is too little
    nrmse, err = _completed_nrmse(tmp_path, capsys, ["--observed-fraction", "0.3"], [])
    assert nrmse > 1  # worse than zeros, by the ground truth the warning does without
    assert len(err.strip().splitlines()) == 1, err
    assert "warning: the completion looks worse than filling the missing entries" in err
    for advice in ("--pretrain", "--rank", "more observed entries"):
        assert advice in err


def test_complete_does_not_warn_on_a_well_posed_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    generate = ["--observed-fraction", "0.3", "--n-subspaces", "2", "--rank", "2"]
    nrmse, err = _completed_nrmse(tmp_path, capsys, generate, ["--n-experts", "2", "--rank", "2"])
    assert nrmse < 0.1
    assert err == ""


def test_csv_with_a_header_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = "1,,3\n4,5,\n,2,6\n"
    out = tmp_path / "c.npy"
    options = ["--rank", "1", "--n-experts", "1", "--out", str(out)]
    for header in ("x1,x2,x3", "id,,2.5"):  # a single non-numeric cell makes a header
        data = tmp_path / "header.csv"
        data.write_text(f"{header}\n{rows}")
        argv = ["mosaic", "complete", str(data), *options]
        _one_line_error(capsys, argv, str(data), f"{header!r} is a header", "header is not allowed")
        assert not out.exists()
    # numbers only (empty cells, a comment line, NaN) are data, not a header
    data = tmp_path / "plain.csv"
    data.write_text(f"# exported by hand\n,nan,2\n{rows}")
    assert main(["mosaic", "complete", str(data), *options]) == 0, capsys.readouterr().err
    assert np.load(out).shape == (4, 3)
    # a spreadsheet's byte-order mark is neither a header nor a missing first cell
    from mixlab.online.mosaic.cli import read_matrix

    data.write_bytes(b"\xef\xbb\xbf1,2,3\n4,,6\n")
    np.testing.assert_array_equal(read_matrix(data), [[1, 2, 3], [4, np.nan, 6]])


# --- regime checks --------------------------------------------------------------------------------


def test_true_subspace_oracle_and_static_grouse_measure_solvability() -> None:
    config = Config.from_profile(
        "quick", n_features=30, n_subspaces=2, rank=2, observed_fractions=(0.5,), n_seeds=1,
        n_source=100, epoch_lengths=(100,) * 5, noise=0.0, window=100, refit_every=50,
    )  # fmt: skip
    stream = config.stream(0.5).generate(0)
    bounds = [*stream.epoch_starts.tolist(), len(stream.labels)]
    oracle = true_subspace_oracle(stream, bounds)
    assert set(oracle) == {f"nrmse_{epoch}" for epoch in EPOCHS}
    assert max(oracle.values()) < 1e-6  # noiseless: the true subspace completes exactly
    # a wrong subspace would not: the oracle uses the true one
    assert static_grouse(config, 0.5, 0) < 0.1


def _fake_cells(oracle: float, grouse: float, config: Config) -> tuple[list[dict], list[dict]]:
    """Stream and routing-sweep cells shaped like run_stream's and routing_sweep's."""
    from mixlab.online.mosaic.config import EPOCHS
    from mixlab.online.mosaic.experiment import system_names

    names = system_names(config)
    row = {
        **{f"nrmse_{epoch}": 0.1 for epoch in EPOCHS},
        **{f"routing_{epoch}": 1.0 for epoch in EPOCHS},
        "window_nrmse": [0.1, 0.1],
        "regret": 0.0,
    }
    no_fit = {"recovered": False, "exponent": None, "power_law_fits_better": None}
    detections = {"delays": [3, None], "false_alarms": 0, "n_samples": 500}
    streams = [
        {
            "kind": "stream",
            "observed_fraction": 0.2,
            "seed": seed,
            "systems": {name: row for name in names["all"]},
            "contraction": {name: [no_fit, no_fit] for name in names["tracked"]},
            "detections": {name: detections for name in names["detecting"]},
            "reference": {
                "true_subspaces": {
                    f"nrmse_{epoch}": oracle if epoch == "drift" else oracle / 2 for epoch in EPOCHS
                },
                "grouse_static": {"nrmse": grouse},
            },
        }
        for seed in (0, 1)
    ]
    accuracy = {f"p{round(100 * p):02d}": 0.5 for p in config.routing_fractions}
    sweeps = [
        {"kind": "routing", "seed": seed, "true_subspaces": accuracy, "mosaic": accuracy}
        for seed in (0, 1)
    ]
    return streams, sweeps


@pytest.mark.parametrize(
    ("oracle", "grouse", "holds"),
    [(0.01, 0.05, [True, True]), (0.2, 0.05, [False, True]), (0.01, 0.3, [True, False])],
)
def test_regime_checks_use_fixed_margins(oracle: float, grouse: float, holds: list[bool]) -> None:
    config = Config(observed_fractions=(0.2,), n_seeds=2)
    metrics = summarise(*_fake_cells(oracle, grouse, config), config)
    assert len({tuple(row) for row in metrics.values()}) == 1  # every row has the same keys
    assert metrics["mosaic_decreasing"]["switches_detected_share"] == 0.5
    assert metrics["grouse_r"]["switches_detected_share"] is None
    assert set(REFERENCES) <= set(metrics)
    assert metrics["true_subspaces"]["nrmse_p20_drift"] == pytest.approx(oracle)
    assert metrics["grouse_static"]["nrmse_p20_stationary"] == pytest.approx(grouse)
    assert metrics["grouse_static"]["nrmse_p20_drift"] is None
    checks = regime(metrics, config)
    assert [check.holds for check in checks] == holds
    assert f"{oracle:.4g}" in checks[0].evidence
    assert "p20 drift" in checks[0].evidence
    assert f"{grouse:.4g}" in checks[1].evidence


def test_head_start_and_drift_claims_must_hold_on_every_seed() -> None:
    """Means over seeds would pass (first window 0.0455 against 0.1, drift 0.05 against 0.2); one
    seed that does not must make the claims fail."""
    from mixlab.online.mosaic.experiment import claims

    config = Config(observed_fractions=(0.2,), n_seeds=2)
    streams, sweeps = _fake_cells(0.01, 0.05, config)
    for seed, (first, drift) in enumerate([(0.001, 0.01), (0.09, 0.15)]):
        mosaic = dict(streams[seed]["systems"]["mosaic"], window_nrmse=[first, 0.1])
        mosaic |= {"nrmse_drift": drift, "nrmse_slow_drift": drift}
        streams[seed]["systems"] = streams[seed]["systems"] | {
            "mosaic": mosaic,
            "frozen": dict(mosaic, nrmse_drift=0.2, nrmse_slow_drift=0.2),
        }
    metrics = summarise(streams, sweeps, config)
    assert metrics["mosaic"]["first_window_vs_kgrouse_worst"] == pytest.approx(0.9)
    assert metrics["mosaic"]["drift_vs_frozen_worst"] == pytest.approx(0.75)
    verdicts = {claim.key: claim for claim in claims(metrics, streams, sweeps, config)}
    assert [spec.key for spec in Config.CLAIMS] == list(verdicts)
    assert verdicts["head_start"].state == "fails"
    assert "seed 1" in verdicts["head_start"].evidence
    assert verdicts["tracks_drift"].state == "fails"
    assert all(claim.control is not None and claim.per_seed for claim in verdicts.values())


def _edited_systems(streams: list[dict], **systems: dict) -> None:
    """Replace, on every stream, the named systems' rows by theirs updated with ``systems``."""
    for cell in streams:
        cell["systems"] = cell["systems"] | {
            name: dict(cell["systems"][name], **changes) for name, changes in systems.items()
        }


def test_a_claim_the_control_also_passes_is_vacuous() -> None:
    """MoSAIC starts well ahead of k-GROUSE and tracks drift on every seed; the claims hold while
    PETRELS(K·r), their control, does not, and turn vacuous once its numbers pass too."""
    from mixlab.online.mosaic.experiment import claims

    config = Config(observed_fractions=(0.2,), n_seeds=2)
    streams, sweeps = _fake_cells(0.01, 0.05, config)
    ahead = {"window_nrmse": [0.01, 0.1], "nrmse_drift": 0.02, "nrmse_slow_drift": 0.02}
    _edited_systems(streams, mosaic=ahead, frozen={"nrmse_drift": 0.2, "nrmse_slow_drift": 0.2})
    _edited_systems(streams, petrels_Kr={"window_nrmse": [0.5, 0.1], "nrmse_drift": 0.3})
    verdicts = {
        c.key: c for c in claims(summarise(streams, sweeps, config), streams, sweeps, config)
    }
    assert verdicts["head_start"].state == "holds"
    assert verdicts["tracks_drift"].state == "holds"
    assert verdicts["head_start"].control.system == "petrels_Kr"
    assert not verdicts["head_start"].control.holds
    _edited_systems(streams, petrels_Kr=ahead)
    verdicts = {
        c.key: c for c in claims(summarise(streams, sweeps, config), streams, sweeps, config)
    }
    assert verdicts["head_start"].state == "vacuous"
    assert verdicts["tracks_drift"].state == "vacuous"
    assert verdicts["head_start"].control.holds


def test_detection_claim_is_judged_against_random_alarms() -> None:
    """The residual test finds both switches of every stream with no false alarm: it holds, and
    as few alarms at random times would find almost none; with many false alarms it fails."""
    from mixlab.online.mosaic.experiment import claims

    config = Config(observed_fractions=(0.2,), n_seeds=2)
    streams, sweeps = _fake_cells(0.01, 0.05, config)
    for cell in streams:
        cell["detections"] = cell["detections"] | {
            "mosaic_decreasing": {"delays": [3, 12], "false_alarms": 0, "n_samples": 6000}
        }
    verdict = next(
        c
        for c in claims(summarise(streams, sweeps, config), streams, sweeps, config)
        if c.key == "detects_switches"
    )
    assert verdict.state == "holds"
    assert verdict.control.system == "random_alarms"
    assert not verdict.control.holds
    for cell in streams:
        cell["detections"]["mosaic_decreasing"]["false_alarms"] = 30
    verdict = next(
        c
        for c in claims(summarise(streams, sweeps, config), streams, sweeps, config)
        if c.key == "detects_switches"
    )
    assert verdict.state == "fails"


def test_a_sweep_narrower_than_the_spread_factor_is_refused() -> None:
    """The schedule alone sets a = cτ, which varies over the sweep as max τ / min τ: a sweep
    narrower than exponent_not_schedule's factor could not tell MoSAIC from its schedule."""
    with pytest.raises(ValueError, match="step_decay_sweep must be a sweep whose largest τ"):
        Config(step_decay_sweep=(10.0, 15.0))
    Config(step_decay_sweep=(10.0, 20.0))  # exactly the factor is enough


def test_exponent_claim_is_untested_without_a_control_on_the_sweep() -> None:
    """The exponent varies little over τ on every seed: the claim's own test holds, but its
    control (GROUSE's schedule, one schedule without τ) cannot be judged, so it stays untested
    instead of being judged against a number the config fixes."""
    from mixlab.online.mosaic.experiment import claims, sweep_names

    config = Config(observed_fractions=(0.2,), n_seeds=2)
    streams, sweeps = _fake_cells(0.01, 0.05, config)
    fit = {"recovered": True, "exponent": 0.5, "power_law_fits_better": True}
    for cell in streams:
        for name in sweep_names(config).values():
            cell["contraction"][name] = [fit]
    verdict = next(
        c
        for c in claims(summarise(streams, sweeps, config), streams, sweeps, config)
        if c.key == "exponent_not_schedule"
    )
    assert verdict.holds  # spread 1 on every seed
    assert verdict.state == "untested"
    assert verdict.control.system == "mosaic_grouse_schedule"
    assert not verdict.control.tested
    assert "no spread over τ" in verdict.control.evidence


def test_resume_refuses_checkpoints_of_the_old_cell_list(tmp_path: Path) -> None:
    """Cells are now checkpointed by run_cells, keyed by cell; a checkpoint that lists them (as
    runs before it wrote) is refused in one line instead of failing on its layout."""
    from mixlab.online.mosaic.experiment import run
    from mixlab.shared import Checkpointer

    config = Config(observed_fractions=(0.2,), n_seeds=1)
    Checkpointer(tmp_path, keep_last=1).save_run(1, config, cells=[{"kind": "routing", "seed": 0}])
    with pytest.raises(ValueError, match="older MoSAIC run .*without --resume"):
        run(config, tmp_path, resume=True)
