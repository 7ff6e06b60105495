"""What every conformance test shares."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One torch thread per test module, its module-scoped fixtures included (2 shared cores; see
    the project README); restored after the module."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
