"""Workspace facts the tests share: the members, their modules, CLIs and own dependencies."""

import os
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Member:
    path: str
    distribution: str
    module: str
    script: str
    imports: tuple[str, ...]
    """third-party modules the domain depends on, imported in the one-domain install test"""


DOMAINS = (
    Member("packages/llm-efficiency", "mixlab-llm-efficiency", "llm_efficiency", "mixlab-llm",
           ("transformers", "accelerate", "triton")),
    Member("packages/attention-arch", "mixlab-attention-arch", "attention_arch", "mixlab-attn",
           ("timm", "sklearn", "mambapy", "diffusers", "skimage", "scipy", "PIL", "matplotlib")),
    Member("packages/graphs", "mixlab-graphs", "graphs", "mixlab-graphs",
           ("torch_geometric", "networkx", "scipy")),
    Member("packages/rl", "mixlab-rl", "rl", "mixlab-rl",
           ("gymnasium", "pettingzoo", "numba", "scipy")),
    Member("packages/vision-mm", "mixlab-vision-mm", "vision_mm", "mixlab-vision",
           ("diffusers", "peft", "PIL", "skimage", "scipy")),
    Member("packages/online", "mixlab-online", "online", "mixlab-online", ("numpy", "scipy", "sklearn")),
)  # fmt: skip
SHARED = Member(
    "shared",
    "mixlab-shared",
    "shared",
    "mixlab",
    ("numpy", "typer", "rich", "matplotlib", "safetensors", "platformdirs", "PIL"),
)
MEMBERS = (SHARED, *DOMAINS)


def pyproject(member: Member) -> dict:
    return tomllib.loads((ROOT / member.path / "pyproject.toml").read_text())


def uv_binary() -> str:
    """The uv that runs these tests (``uv run`` sets $UV), else uv on PATH; skip without one."""
    uv = os.environ.get("UV") or shutil.which("uv")
    if not uv:
        pytest.skip("uv is not installed: the packaging tests build with uv")
    return uv


def uv(
    *args: str, env: dict[str, str] | None = None, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """Run uv in the workspace root; fail the test with uv's output if it fails."""
    clean_env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    }
    completed = subprocess.run(
        [uv_binary(), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean_env, **(env or {})},
    )
    if completed.returncode != 0:
        pytest.fail(
            f"uv {' '.join(args)} failed ({completed.returncode}):\n{completed.stdout}\n{completed.stderr}"
        )
    return completed
