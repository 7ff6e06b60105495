import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from mixlab.shared import Checkpointer, capture_rng_state, load_state, restore_rng_state, save_state
from mixlab.shared.checkpoint import flatten_state


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss = model(torch.randn(16, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    return model, optimizer


def test_nested_state_round_trips(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),  # int keys, nested dicts, floats, tuples (betas)
        "array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "history": [1.0, math.nan, -math.inf],
        "step": 12,
        "name": "run",
        "nothing": None,
        "pair": (1, "a"),
    }
    save_state(state, tmp_path / "state")
    loaded = load_state(tmp_path / "state")

    fresh, fresh_optimizer = _model_and_optimizer()
    fresh.load_state_dict(loaded["model"])
    fresh_optimizer.load_state_dict(loaded["optimizer"])
    assert fresh_optimizer.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]
    for key, value in optimizer.state_dict()["state"][0].items():
        assert torch.equal(
            torch.as_tensor(fresh_optimizer.state_dict()["state"][0][key]), torch.as_tensor(value)
        )
    np.testing.assert_array_equal(loaded["array"], state["array"])
    assert loaded["history"][0] == 1.0
    assert math.isnan(loaded["history"][1])
    assert loaded["history"][2] == -math.inf
    assert (loaded["step"], loaded["name"], loaded["nothing"], loaded["pair"]) == (
        12,
        "run",
        None,
        (1, "a"),
    )


def test_no_pickle_only_safetensors_and_json(tmp_path: Path) -> None:
    save_state({"w": torch.ones(2)}, tmp_path / "state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.safetensors"]


def test_tied_tensors_are_saved(tmp_path: Path) -> None:
    weight = torch.randn(3, 3)
    save_state({"encoder": weight, "decoder": weight, "view": weight[0]}, tmp_path / "tied")
    loaded = load_state(tmp_path / "tied")
    assert torch.equal(loaded["encoder"], loaded["decoder"])
    assert torch.equal(loaded["view"], weight[0])


def test_unsupported_values_are_named() -> None:
    with pytest.raises(TypeError, match=r"type object at 'outer\.inner'"):
        flatten_state({"outer": {"inner": object()}})


def test_checkpointer_keeps_the_last_and_resumes_from_the_newest(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path, keep_last=2)
    for step in (10, 20, 30):
        checkpoints.save(step, {"step": step, "w": torch.full((2,), float(step))})
    assert checkpoints.steps() == [20, 30]
    step, state = Checkpointer(tmp_path, resume=True).load_latest()
    assert (step, state["step"]) == (30, 30)
    assert torch.equal(state["w"], torch.full((2,), 30.0))
    assert Checkpointer(tmp_path, resume=False).steps() == []  # a fresh run clears stale ones


def test_resume_ignores_a_half_written_checkpoint(tmp_path: Path) -> None:
    checkpoints = Checkpointer(tmp_path)
    checkpoints.save(10, {"w": torch.ones(1)})
    (checkpoints.directory / "step_00000020.safetensors").write_bytes(b"killed mid-write")
    step, state = Checkpointer(tmp_path, resume=True).load_latest()
    assert step == 10
    assert torch.equal(state["w"], torch.ones(1))


def test_without_resume_nothing_is_loaded(tmp_path: Path) -> None:
    Checkpointer(tmp_path).save(5, {"w": torch.ones(1)})
    assert Checkpointer(tmp_path, resume=True).load_latest() is not None
    assert Checkpointer(tmp_path, resume=False).load_latest() is None


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last must be an integer >= 1"):
        Checkpointer(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="step must be an integer"):
        Checkpointer(tmp_path).save(-1, {})


def test_rng_state_survives_a_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    save_state({"rng": capture_rng_state()}, tmp_path / "rng")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    restore_rng_state(load_state(tmp_path / "rng")["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    np.testing.assert_array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_colliding_paths_keep_both_tensors(tmp_path: Path) -> None:
    state = {
        1: torch.zeros(2),
        "1": torch.ones(2),
        "a.b": torch.full((1,), 3.0),
        "a": {"b": torch.full((1,), 4.0)},
    }
    save_state(state, tmp_path / "collide")
    loaded = load_state(tmp_path / "collide")
    assert torch.equal(loaded[1], torch.zeros(2))
    assert torch.equal(loaded["1"], torch.ones(2))
    assert loaded["a.b"].item() == 3.0
    assert loaded["a"]["b"].item() == 4.0


def test_load_run_refuses_a_checkpoint_of_another_config(tmp_path: Path) -> None:
    from dataclasses import dataclass

    from mixlab.shared import ExperimentConfig

    @dataclass
    class Config(ExperimentConfig):
        sizes: tuple[int, ...] = (1, 2)
        workers: int = 2

    Checkpointer(tmp_path).save_run(3, Config(), cells=[1, 2])
    resumed = Checkpointer(tmp_path, resume=True)
    assert resumed.load_run(Config(device="cpu"))["cells"] == [1, 2]  # the device may change
    assert resumed.load_run(Config(workers=1))["cells"] == [1, 2]  # and the worker count
    with pytest.raises(ValueError, match=r"other values of \['sizes'\]"):
        resumed.load_run(Config(sizes=(3,)))
    Checkpointer(tmp_path).save(1, {"cells": []})
    with pytest.raises(ValueError, match="another experiment"):
        Checkpointer(tmp_path, resume=True).load_run(Config())
    assert Checkpointer(tmp_path, resume=False).load_run(Config()) is None


@pytest.mark.parametrize(
    "damage",
    [
        "truncate_tensors",
        "edit_number",
        "remove_key",
        "wrong_type",
        "foreign_json",
        "swap_tensors",
        "sidecar_of_another_file",
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path: Path, damage: str) -> None:
    import json

    from mixlab.shared.files import CheckpointError

    save_state({"w": torch.arange(64.0), "step": 40, "loss": 0.25}, tmp_path / "state")
    tensors, sidecar = tmp_path / "state.safetensors", tmp_path / "state.json"
    if damage == "truncate_tensors":
        tensors.write_bytes(tensors.read_bytes()[: tensors.stat().st_size // 2])
    elif damage == "sidecar_of_another_file":
        save_state({"w": torch.zeros(64)}, tmp_path / "other")
        sidecar.write_bytes((tmp_path / "other.json").read_bytes())
    elif damage == "swap_tensors":
        save_state({"w": torch.zeros(64)}, tmp_path / "other")
        tensors.write_bytes((tmp_path / "other.safetensors").read_bytes())
    else:
        data = json.loads(sidecar.read_text())
        if damage == "edit_number":
            data["state"]["loss"] = 0.01
        elif damage == "remove_key":
            del data["format"]
        elif damage == "wrong_type":
            data["format"] = 3
        else:
            data = {"w": {"__tensor__": "w"}, "step": 40}  # a sidecar of the old, unchecked kind
        sidecar.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as caught:
        load_state(tmp_path / "state")
    assert "state." in str(caught.value)
    assert "\n" not in str(caught.value)


def test_run_cells_in_worker_processes_gives_the_sequential_outcomes_and_resumes(
    tmp_path: Path,
) -> None:
    import json
    from dataclasses import dataclass

    from mixlab.shared import ExperimentConfig, run_cells

    @dataclass
    class Config(ExperimentConfig):
        pass

    planned = [{"cell": i} for i in range(4)]
    sequential = run_cells(tmp_path / "a", Config(), planned, json.dumps, resume=False, label="t")
    parallel = run_cells(tmp_path / "b", Config(), planned, json.dumps, resume=False, label="t",
                         workers=2)  # fmt: skip
    assert parallel == sequential == [json.dumps(cell) for cell in planned]

    def refuse(cell):  # every cell is on record: a resumed run calls nothing
        raise AssertionError(cell)

    again = run_cells(tmp_path / "b", Config(), planned, refuse, resume=True, label="t", workers=2)
    assert again == sequential
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        run_cells(tmp_path / "c", Config(), planned, json.dumps, resume=False, label="t", workers=0)


def test_run_cells_refuses_a_checkpoint_of_an_older_layout_in_one_line(tmp_path: Path) -> None:
    """A run whose experiment saved its cells itself (a list, before run_cells) is not resumed
    into a KeyError: run_cells refuses it by name."""
    import json
    from dataclasses import dataclass

    from mixlab.shared import Checkpointer, ExperimentConfig, run_cells

    @dataclass
    class Config(ExperimentConfig):
        pass

    Checkpointer(tmp_path, keep_last=1).save_run(1, Config(), cells=[{"cell": 0}])
    with pytest.raises(ValueError, match="older layout") as caught:
        run_cells(tmp_path, Config(), [{"cell": 0}], json.dumps, resume=True, label="t")
    assert "\n" not in str(caught.value)


_SLOW_CELLS = """
import signal, sys, time
from dataclasses import dataclass
from mixlab.shared import ExperimentConfig, run_cells

# a terminal's Ctrl-C raises KeyboardInterrupt; a job started in the background by a
# non-interactive shell (as CI starts the tests) inherits SIGINT ignored: undo that here
signal.signal(signal.SIGINT, signal.default_int_handler)

@dataclass
class Config(ExperimentConfig):
    pass

def cell(c):
    if c["cell"] > 0:
        time.sleep(120)  # a long cell: Ctrl-C must not wait for it
    return c["cell"]

if __name__ == "__main__":
    print("started", flush=True)
    run_cells(sys.argv[1], Config(), [{"cell": i} for i in range(6)], cell, resume=False,
              label="t", workers=2)
"""


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_kill_stops_a_run_with_worker_processes_and_keeps_the_finished_cells(
    tmp_path: Path, stop: str
) -> None:
    """Issue 80: leaving a process pool waited for every submitted cell, so SIGINT to a run with
    workers did not end it (240 s and counting); now it ends within seconds and the cell that
    finished is on record for --resume. SIGTERM to the run alone (``kill PID``, ``timeout``)
    ended it and left its workers running; now it stops them too."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "slow.py"
    script.write_text(_SLOW_CELLS)
    process = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    done = tmp_path / "run" / "checkpoints"
    deadline = time.monotonic() + 60
    while not any(done.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)  # cell 0 finished: the workers are busy with the slow ones
    os_group = process.pid
    if stop == "SIGINT":
        os.killpg(os_group, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
    else:
        os.kill(process.pid, signal.SIGTERM)  # kill PID reaches the run alone
    started = time.monotonic()
    try:
        code = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(os_group, signal.SIGKILL)
    assert time.monotonic() - started < 30
    assert code != 0
    assert any(done.glob("*.json"))  # the finished cell stays saved for --resume
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # no worker of the run is left behind
        try:
            os.killpg(os_group, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(os_group, signal.SIGKILL)
        raise AssertionError(f"{stop}: worker processes of the run outlived it")
