"""mixlab.shared without torch (a NumPy-only domain, mixlab-online, installs without it), and
checkpoint files of NumPy arrays and of torch tensors, including ones written before NumPy states
were saved with ``safetensors.numpy``."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mixlab.shared import load_state, save_state

DATA = Path(__file__).parent / "data"
OLD_ARRAYS = DATA / "arrays_saved_before_numpy_safetensors"
"""NumPy arrays and JSON, saved through ``safetensors.torch`` before this module existed"""
OLD_TENSORS = DATA / "state_saved_before_numpy_safetensors"
"""torch tensors (one bfloat16), NumPy arrays and JSON, saved the same way"""

# Imported before any mixlab code: `import torch` then fails as it does where torch is absent.
BLOCK_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""


def _run_without_torch(program: str, tmp_path: Path) -> dict:
    """Run ``program`` in a fresh Python where torch cannot be imported; it sets ``report``."""
    code = (
        BLOCK_TORCH
        + textwrap.dedent(program)
        + (
            "\nassert 'torch' not in sys.modules, 'torch was imported'"
            "\nimport json; print(json.dumps(report))\n"
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "MIXLAB_DATA": str(DATA)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_shared_works_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    report = _run_without_torch(
        """
        import os, random
        import numpy as np
        import mixlab.shared
        from mixlab.shared import (Checkpointer, ExperimentConfig, Result, capture_rng_state,
                                   load_state, resolve_device, restore_rng_state, run_cells,
                                   save_state, seed_everything)
        from mixlab.shared.result import environment

        report = {}
        seed_everything(11)
        report["draws"] = [random.random(), float(np.random.rand())]
        report["devices"] = [resolve_device("auto"), resolve_device("cpu")]
        try:
            resolve_device("cuda")
        except ValueError as error:
            report["cuda"] = str(error)
        report["env_torch"] = environment("cpu")["torch"]

        state = {"weights": np.arange(6.0).reshape(2, 3), "mask": np.array([True, False]),
                 "counts": [np.int64(3), 2], "rng": capture_rng_state(), "name": "x"}
        save_state(state, "state")
        expected = np.random.rand(2).tolist()
        np.random.seed(0)
        loaded = load_state("state")
        restore_rng_state(loaded["rng"])
        report["rng_restored"] = np.random.rand(2).tolist() == expected
        report["kinds"] = [type(loaded["weights"]).__name__, str(loaded["weights"].dtype),
                           str(loaded["mask"].dtype), loaded["counts"], loaded["name"]]
        report["equal"] = bool((loaded["weights"] == state["weights"]).all())
        loaded["weights"][0, 0] = 5.0  # writable, as an array one saved
        old = load_state(os.environ["MIXLAB_DATA"] + "/arrays_saved_before_numpy_safetensors")
        report["old"] = [old["x"].tolist(), str(old["counts"].dtype), old["mask"].tolist(),
                         old["step"]]
        try:
            load_state(os.environ["MIXLAB_DATA"] + "/state_saved_before_numpy_safetensors")
        except ModuleNotFoundError as error:
            report["old_tensors"] = str(error)
        try:
            mixlab.shared.timestep_embedding
        except ModuleNotFoundError as error:
            report["torch_helper"] = str(error)

        Checkpointer("run").save(3, {"done": {"a": 1.5}, "best": np.zeros(2)})
        report["resumed"] = Checkpointer("run", resume=True).load_latest()[0]
        report["cells"] = run_cells("cells", ExperimentConfig(), [{"n": 1}, {"n": 2}],
                                    lambda cell: {"twice": 2 * cell["n"]}, resume=False,
                                    label="cells")
        result = Result(metrics={"ours": {"x": 1.0}}, claims=[])
        report["result"] = result.write("out").name
        """,
        tmp_path,
    )
    import random

    random.seed(11)
    np.random.seed(11)
    assert report["draws"] == [random.random(), float(np.random.rand())]
    assert report["devices"] == ["cpu", "cpu"]
    assert "--device" in report["cuda"]
    assert "torch" in report["cuda"]
    assert report["env_torch"] is None
    assert report["rng_restored"]
    assert report["kinds"] == ["ndarray", "float64", "bool", [3, 2], "x"]
    assert report["equal"]
    assert report["old"] == [[0.0, 0.25, 0.5, 0.75, 1.0], "int32", [True, False], 7]
    assert "holds torch tensors" in report["old_tensors"]
    assert "needs torch" in report["torch_helper"]
    assert report["resumed"] == 3
    assert report["cells"] == [{"twice": 2}, {"twice": 4}]
    assert report["result"] == "result.json"


def test_numpy_states_are_written_without_torch_and_read_by_either_reader(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    save_state({"a": np.arange(4, dtype=np.float32)}, tmp_path / "state")
    # the same file format: safetensors.torch reads what safetensors.numpy wrote
    assert load_file(tmp_path / "state.safetensors")["a"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_arrays_and_tensors_come_back_of_the_kind_saved(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    shared = np.arange(3.0)
    state = {"array": shared, "same": shared, "tensor": torch.from_numpy(shared), "n": 2}
    save_state(state, tmp_path / "mixed")
    loaded = load_state(tmp_path / "mixed")
    assert isinstance(loaded["array"], np.ndarray)
    assert isinstance(loaded["same"], np.ndarray)
    assert isinstance(loaded["tensor"], torch.Tensor)
    np.testing.assert_array_equal(loaded["array"], shared)
    assert torch.equal(loaded["tensor"], torch.arange(3.0, dtype=torch.float64))


def test_checkpoints_written_before_still_load(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    old = load_state(OLD_TENSORS)
    assert torch.equal(old["w"], torch.arange(4.0))
    assert old["half"].dtype == torch.bfloat16
    assert old["half"].tolist() == [1.0, 1.0]
    assert isinstance(old["counts"], np.ndarray)
    assert old["counts"].tolist() == [0, 1, 2]
    np.testing.assert_array_equal(old["x"], np.linspace(0, 1, 5))
    assert (old["step"], old["pair"]) == (3, (1.5, "a"))
    arrays = load_state(OLD_ARRAYS)
    assert arrays["x"].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert arrays["rng"]["bit_generator"] == "PCG64"


def test_an_array_safetensors_cannot_hold_is_named(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"dtype object at 'outer.inner'"):
        save_state({"outer": {"inner": np.array([None])}}, tmp_path / "state")
