"""Fixtures the rl tests share."""

import pytest


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (2 shared cores; see the project README), then restored."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
