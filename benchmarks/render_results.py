"""Render RESULTS.md and the README's generated tables from the committed files, so no number is typed.

    uv run python benchmarks/render_results.py          # rewrite RESULTS.md and README.md in place
    uv run python benchmarks/render_results.py --check  # exit 1 when either is out of date

What is generated, each between its own markers:

- RESULTS.md, ``<!-- results:begin -->`` … ``<!-- results:end -->``: from
  ``benchmarks/results/<method>/experiment-*/result.json``, the tally of every method's quick run,
  then per method and run the claims tally (holds, fails, untested, vacuous), the regime checks and
  each claim with its evidence and its control's outcome. Only holds count: a claim whose control
  passes the same test is vacuous, one whose regime check or premise failed is untested.
- README.md, ``<!-- methods:begin -->`` … ``<!-- methods:end -->``: the last cell ("measured") of
  each method's row in the methods table: the committed quick (and full) run's wall time and claims
  tally, with links to RESULTS.md and the seed card. The other cells are written by hand.
- README.md, ``<!-- dependencies:begin -->`` … ``<!-- dependencies:end -->``: the per-domain
  dependency table, from ``shared/pyproject.toml`` and ``packages/*/pyproject.toml``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from mixlab.shared.claims import CLAIM_STATES, claim_state, control_outcome, tally, tally_text

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "benchmarks/render_results.py"
RESULTS_MARKERS = ("<!-- results:begin -->", "<!-- results:end -->")
METHODS_MARKERS = ("<!-- methods:begin -->", "<!-- methods:end -->")
DEPENDENCIES_MARKERS = ("<!-- dependencies:begin -->", "<!-- dependencies:end -->")
TABLE_RUNS = ("quick", "full")
"""the runs whose tally the README's methods table shows (RESULTS.md shows every run)"""
PLATFORMS = {"linux": "Linux", "darwin": "macOS", "win32": "Windows"}

Runs = dict[str, list[tuple[Path, dict[str, Any]]]]


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _run_label(folder: Path, result: dict[str, Any]) -> str:
    seeds = result.get("config", {}).get("seeds")
    seed_text = f"seeds {seeds}" if isinstance(seeds, list) else f"seed {result['seed']}"
    return f"{folder.name.removeprefix('experiment-')} ({seed_text})"


def _tally(result: dict[str, Any]) -> dict[str, int]:
    return tally(claim_state(claim) for claim in result["claims"])


def load_runs(results: Path) -> Runs:
    """Per method (sorted), its committed runs: (folder, result.json), sorted by folder name."""
    methods: Runs = {}
    for method_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        runs = [
            (folder, json.loads((folder / "result.json").read_text()))
            for folder in sorted(method_dir.glob("experiment-*"))
            if (folder / "result.json").is_file()
        ]
        if runs:
            methods[method_dir.name] = runs
    return methods


# -- RESULTS.md ------------------------------------------------------------------------------


def render_method(method: str, runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    lines = [
        f"## {method}",
        "",
        "| run | commit | wall s | " + " | ".join(CLAIM_STATES) + " |",
        "|---|---|---|" + "---|" * len(CLAIM_STATES),
    ]
    for folder, result in runs:
        commit = (result.get("env", {}).get("git") or "unknown")[:12]
        commit += "+dirty" if str(result.get("env", {}).get("git", "")).endswith("+dirty") else ""
        counts = _tally(result)
        lines.append(
            f"| {_run_label(folder, result)} | {commit} | {result['wall_s']:.0f} | "
            + " | ".join(str(counts[state]) for state in CLAIM_STATES)
            + " |"
        )
    for folder, result in runs:
        lines += ["", f"**{_run_label(folder, result)}**", ""]
        if "regime" not in result:
            lines.append("- regime: not checked (this result predates regime checks)")
        for check in result.get("regime", []):
            verdict = "holds" if check["holds"] else "**fails**"
            lines.append(
                f"- regime check {verdict}: {_cell(check['text'])} ({_cell(check['evidence'])})"
            )
        for claim in result["claims"]:
            control = control_outcome(claim)
            lines.append(
                f"- {claim_state(claim)}: {_cell(claim['text'])} ({_cell(claim['evidence'])})"
                + (f"; control {_cell(control)}" if control else "")
            )
    return lines


def render_summary(quick: dict[str, dict[str, Any]]) -> list[str]:
    """One line over every method's committed quick run: how many claims are in each state."""
    total = dict.fromkeys(CLAIM_STATES, 0)
    for result in quick.values():
        for state, count in _tally(result).items():
            total[state] += count
    no_control = sum(
        1 for result in quick.values() for claim in result["claims"] if "control" not in claim
    )
    line = f"Over the {len(quick)} committed quick runs: " + tally_text(total) + "."
    if no_control:
        line += (
            f" {no_control} of these claims were judged before controls existed (no control "
            "outcome): their method's rerun will judge them against one."
        )
    return [line, ""]


def render_results_section(methods: Runs) -> str:
    begin, end = RESULTS_MARKERS
    lines = [
        begin,
        f"<!-- rendered by {SCRIPT} from benchmarks/results; do not edit by hand -->",
        "",
    ]
    quick = {
        method: result
        for method, runs in methods.items()
        for folder, result in runs
        if folder.name == "experiment-quick"
    }
    lines += render_summary(quick)
    for method, runs in methods.items():
        lines += [*render_method(method, runs), ""]
    lines.append(end)
    return "\n".join(lines)


# -- README.md: the methods table's "measured" column ------------------------------------------


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def measured_cell(method: str, runs: list[tuple[Path, dict[str, Any]]]) -> str:
    """``quick (2 min): 1 hold, 4 fail; full (27 min): 2 hold, 4 fail · results · card``."""
    parts = []
    for name in TABLE_RUNS:
        for folder, result in runs:
            if folder.name != f"experiment-{name}":
                continue
            counts = _tally(result)
            told = tally_text(counts, skip_zero=True)
            parts.append(f"{name} ({_duration(result['wall_s'])}): {told or 'no claims'}")
    measured = "; ".join(parts) if parts else "no committed run"
    return f"{measured} · [results](RESULTS.md#{method}) · [card](seeds/{method}.md)"


_ROW = re.compile(
    r"^\|(?P<head>[^|]*\|\s*\[?`(?P<method>[a-z0-9_]+)`(?:\]\(#[a-z0-9_-]+\))?\s*\|.*\|)[^|]*\|\s*$"
)
"""a methods-table row, ``| domain | `method` | ... |`` or ``| domain | [`method`](#anchor) | ... |``,
up to its last cell, which is rendered"""


def render_methods_table(table: str, methods: Runs) -> str:
    """``table`` (the lines between the methods markers) with each method row's last cell
    rendered; a row whose method has no committed run says so."""
    out = []
    for line in table.split("\n"):
        match = _ROW.match(line)
        if match is None:
            out.append(line)
            continue
        method = match["method"]
        cell = measured_cell(method, methods.get(method, []))
        out.append(f"|{match['head']} {cell} |")
    return "\n".join(out)


# -- README.md: the dependency table ---------------------------------------------------------


def _requirement(text: str) -> tuple[str, str]:
    """(distribution name, how the table shows it): ``triton (Linux)`` for a platform marker."""
    spec, _, marker = text.partition(";")
    name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    if name is None:
        raise ValueError(f"cannot read the requirement {text!r}")
    shown = name[1]
    platform = re.search(r"sys_platform\s*==\s*['\"](\w+)['\"]", marker)
    if platform:
        shown += f" ({PLATFORMS.get(platform[1], platform[1])})"
    return name[1].lower().replace("_", "-"), shown


def _member(path: Path) -> dict[str, Any]:
    project = tomllib.loads((path / "pyproject.toml").read_text())["project"]
    modules = sorted(
        p.name
        for p in (path / "src" / "mixlab").iterdir()
        if p.is_dir() and not p.name.startswith("_")
    )
    return {
        "name": project["name"],
        "import": f"mixlab.{modules[0]}"
        if len(modules) == 1
        else ", ".join(f"mixlab.{m}" for m in modules),
        "scripts": sorted(project.get("scripts", {})),
        "dependencies": [_requirement(d) for d in project.get("dependencies", [])],
        "extras": {
            extra: [_requirement(d)[1] for d in deps]
            for extra, deps in project.get("optional-dependencies", {}).items()
        },
    }


def render_dependency_table(root: Path) -> str:
    """One row per workspace member: its import, CLI and the dependencies it adds to
    mixlab-shared's (mixlab-shared's row lists its own)."""
    shared = _member(root / "shared")
    domains = [_member(p.parent) for p in sorted((root / "packages").glob("*/pyproject.toml"))]
    base = {name for name, _ in shared["dependencies"]}
    begin, end = DEPENDENCIES_MARKERS
    lines = [
        begin,
        f"<!-- rendered by {SCRIPT} from the members' pyproject.toml; do not edit by hand -->",
        "",
        "| package | import | CLI | dependencies |",
        "|---|---|---|---|",
    ]
    for member in (shared, *domains):
        own = [
            shown
            for name, shown in member["dependencies"]
            if member is shared or (name not in base and name != shared["name"])
        ]
        extras = [f"extra `{e}`: {', '.join(deps)}" for e, deps in member["extras"].items()]
        cli = ", ".join(f"`{s}`" for s in member["scripts"])
        lines.append(
            f"| `{member['name']}` | `{member['import']}` | {cli} | "
            + "; ".join([", ".join(own) or "none", *extras])
            + " |"
        )
    lines += ["", end]
    return "\n".join(lines)


# -- the files -------------------------------------------------------------------------------


def _replace(text: str, markers: tuple[str, str], new: str, where: str) -> str:
    """``text`` with everything from the first marker to the second (both included) replaced."""
    begin, end = markers
    if begin not in text or end not in text:
        raise ValueError(f"{where} must hold the markers {begin} and {end}")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + new + tail


def render_readme(readme: str, root: Path, methods: Runs) -> str:
    """``readme`` with its methods table's measured column and its dependency table rendered."""
    begin, end = METHODS_MARKERS
    if begin not in readme or end not in readme:
        raise ValueError(f"README.md must hold the markers {begin} and {end}")
    head, rest = readme.split(begin, 1)
    table, tail = rest.split(end, 1)
    readme = head + begin + render_methods_table(table, methods) + end + tail
    return _replace(readme, DEPENDENCIES_MARKERS, render_dependency_table(root), "README.md")


def render_results(results_md: str, methods: Runs) -> str:
    """``results_md`` with its results section rendered."""
    return _replace(results_md, RESULTS_MARKERS, render_results_section(methods), "RESULTS.md")


def rendered(root: Path = ROOT) -> dict[Path, str]:
    """What README.md and RESULTS.md under ``root`` should hold, rendered from their current text."""
    methods = load_runs(root / "benchmarks" / "results")
    readme, results = root / "README.md", root / "RESULTS.md"
    return {
        readme: render_readme(readme.read_text(), root, methods),
        results: render_results(results.read_text(), methods),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if README.md or RESULTS.md is out of date"
    )
    args = parser.parse_args()
    stale = {path: text for path, text in rendered().items() if path.read_text() != text}
    for path, text in stale.items():
        if args.check:
            print(f"{path.name} is out of date: run uv run python {SCRIPT}")
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
