"""One torch thread per test process: the test machines have 2 cores shared with other jobs, where
two OpenMP threads wait on each other (a UNet forward 30× slower under load). ``cache``: an
empty ``MIXLAB_CACHE`` per test, so an experiment test trains its tiny bases from scratch."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # also for the subprocesses the tests start

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path
