"""mixlab.shared.interpreted: scripts run under Triton's interpreter in a subprocess."""

from __future__ import annotations

import importlib.util

import pytest

from mixlab.shared.interpreted import interpreted

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)

ECHO = """
import os, sys, torch
cases = torch.load(sys.argv[1])
torch.save({"interpret": os.environ["TRITON_INTERPRET"], **cases}, sys.argv[2])
"""


def test_the_script_sees_the_interpreter_and_the_cases(tmp_path):
    assert interpreted(ECHO, {"n": 3}, tmp_path / "run") == {"interpret": "1", "n": 3}


def test_a_failing_script_raises_with_its_stderr(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)the interpreted kernel failed.*ZeroDivisionError"):
        interpreted("1 / 0", {}, tmp_path / "run")


def test_without_triton_the_tests_are_skipped(tmp_path, monkeypatch):
    import unittest

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(unittest.SkipTest, match="triton is not installed"):
        interpreted(ECHO, {}, tmp_path / "run")
