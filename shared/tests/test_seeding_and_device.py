import random

import numpy as np
import pytest
import torch

from mixlab.shared import resolve_device, seed_everything


def _draw() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_same_seed_same_numbers() -> None:
    seed_everything(7)
    first = _draw()
    seed_everything(7)
    assert _draw() == first
    seed_everything(8)
    assert _draw() != first


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(ValueError, match="seed must be an integer"):
        seed_everything(seed)  # type: ignore[arg-type]


def test_auto_device_follows_cuda() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("device", ["tpu", "gpu", "cuda:x", ""])
def test_unknown_device_lists_the_allowed(device: str) -> None:
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, cuda:N or mps"):
        resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_cuda_is_an_error_not_a_fallback() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")


def test_a_bad_device_names_the_option_asked_for():
    from mixlab.shared.device import check_device_name

    with pytest.raises(ValueError, match=r"^--device must be one of"):
        check_device_name("gpu", "--device")
    with pytest.raises(ValueError, match=r"^device must be one of"):
        check_device_name("gpu")
