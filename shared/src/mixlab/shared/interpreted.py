"""Run Triton kernels on a CPU for tests: Triton's interpreter, in a subprocess.

``TRITON_INTERPRET=1`` must be set before triton is imported, so a test process that imported
it already (or must not run interpreted) hands its cases to a fresh interpreter: the inputs and
the outputs pass through files.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import unittest
from pathlib import Path
from typing import Any


def interpreted(script: str, cases: Any, folder: Path, *, timeout: float = 300) -> Any:
    """What ``script`` saves when run under ``TRITON_INTERPRET=1`` on ``cases``.

    ``script`` runs as ``python -c script CASES OUT``: it loads the cases with ``torch.load``
    from ``sys.argv[1]`` and saves its outputs to ``sys.argv[2]``, which this returns. Raises
    :class:`unittest.SkipTest` when triton is not installed (no wheels for the platform: pytest
    skips the tests that need it) and :class:`RuntimeError` with the script's last stderr lines
    when it fails.
    """
    import torch

    if importlib.util.find_spec("triton") is None:
        raise unittest.SkipTest("triton is not installed (no wheels for this platform)")
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(cases, folder / "cases.pt")
    done = subprocess.run(
        [sys.executable, "-c", script, str(folder / "cases.pt"), str(folder / "out.pt")],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the interpreted kernel failed:\n{done.stderr[-4000:]}")
    return torch.load(folder / "out.pt")
