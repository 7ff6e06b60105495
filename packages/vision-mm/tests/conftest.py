"""One torch thread per test process: the test machines have 2 cores shared with other jobs, where
two OpenMP threads wait on each other (a UNet forward 30× slower under load)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # also for the subprocesses the tests start

import torch

torch.set_num_threads(1)
