"""README.md's examples, as tests/test_readme.py reads and runs them.

- Every ```python block runs as shown. Each is named by the heading above it (a method's name) and
  runs in a fresh namespace and an empty working folder, all in one process so that torch and the
  domain libraries are imported once:

      uv run python tests/readme_examples.py OUT.json [NAME ...]   # the blocks named, else all

  OUT.json gets ``{name: {"ok", "seconds", "cpu_seconds", "error"}}``, rewritten after each
  block (the first block to import a library pays for the import).
- Every line of a ```bash block runs and must exit with 0, except a line whose comment starts with
  ``long`` (``uv run pytest   # long: the whole suite``): it takes over a minute. Its
  ``--set`` fields are still checked against the method's Config.
- A ```bash block right after the line :data:`FRESH_ENVIRONMENT` runs in a new, empty environment
  (``UV_PROJECT_ENVIRONMENT``), not in the workspace's.
"""

from __future__ import annotations

import json
import re
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FRESH_ENVIRONMENT = "<!-- tests/test_readme.py runs the next block in a fresh environment -->"
LONG = re.compile(r"\s#\s*long\b")
"""a bash line that takes over a minute: its comment starts with ``long``"""
TIMEOUT_S = 60
"""the most one Python example may take (each is meant to run in seconds)"""


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int
    """the README line of the block's first code line (1-based)"""
    heading: str
    """the text of the nearest heading above the block, without its ``#`` and backticks"""
    fresh_environment: bool


def blocks(text: str | None = None) -> list[Block]:
    """The fenced code blocks of README.md (or of ``text``)."""
    lines = (README.read_text() if text is None else text).split("\n")
    out, heading, index = [], "", 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = line.lstrip("#").strip().replace("`", "")
        if line.startswith("```") and line[3:].strip():
            language, start = line[3:].strip(), index + 1
            end = next(j for j in range(start, len(lines)) if lines[j].startswith("```"))
            fresh = index > 0 and lines[index - 1].strip() == FRESH_ENVIRONMENT
            out.append(Block(language, "\n".join(lines[start:end]), start + 1, heading, fresh))
            index = end
        elif line.startswith("```"):  # a block without a language (a tree, a listing)
            index = next(j for j in range(index + 1, len(lines)) if lines[j].startswith("```"))
        index += 1
    return out


def python_examples() -> dict[str, Block]:
    """The ```python blocks by name: their heading, with ``-2``, ``-3`` … for repeats."""
    named: dict[str, Block] = {}
    for block in blocks():
        if block.language == "python":
            name, count = block.heading or "top", 1
            while name in named:
                count += 1
                name = f"{block.heading}-{count}"
            named[name] = block
    return named


def bash_lines(block: Block) -> list[str]:
    """The commands of a ```bash block: its non-empty lines that are not comments."""
    return [
        line.strip()
        for line in block.code.split("\n")
        if line.strip() and not line.strip().startswith("#")
    ]


def is_long(line: str) -> bool:
    return LONG.search(line) is not None


def _timeout(signum: int, frame: object) -> None:
    raise TimeoutError(f"took more than {TIMEOUT_S} s")


def run(names: list[str], out: Path) -> dict[str, dict[str, object]]:
    """Run the named Python examples (all when ``names`` is empty), each in a fresh namespace and
    folder, and record each one's outcome in ``out`` as soon as it is known."""
    import os

    examples = python_examples()
    unknown = sorted(set(names) - set(examples))
    if unknown:
        raise SystemExit(f"no Python example named {unknown}; there are {sorted(examples)}")
    results: dict[str, dict[str, object]] = {}
    signal.signal(signal.SIGALRM, _timeout)
    for name in names or list(examples):
        block = examples[name]
        code = compile(block.code, f"README.md:{block.line} ({name})", "exec")
        start, cpu, error = time.perf_counter(), time.process_time(), ""
        with tempfile.TemporaryDirectory(prefix=f"readme-{name}-") as folder:
            os.chdir(folder)
            signal.alarm(TIMEOUT_S)
            try:
                exec(code, {"__name__": "__main__"})
            except Exception:  # the outcome is the test's to judge
                error = traceback.format_exc(limit=-8)
            finally:
                signal.alarm(0)
                os.chdir(ROOT)
        results[name] = {
            "ok": not error,
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu,
            "error": error,
        }
        print(
            f"{name}: {'ok' if not error else 'FAILED'} in {results[name]['seconds']:.1f} s "
            f"({results[name]['cpu_seconds']:.1f} s of CPU)",
            flush=True,
        )
        out.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    run(sys.argv[2:], Path(sys.argv[1]).resolve())
