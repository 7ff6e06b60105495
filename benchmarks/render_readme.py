"""Render the README's results section from the committed result files, so no number is typed.

    uv run python benchmarks/render_readme.py          # rewrite README.md in place
    uv run python benchmarks/render_readme.py --check  # exit 1 when README.md is out of date

Everything between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in README.md comes from
``benchmarks/results/<method>/experiment-*/result.json``: the tally of every method's quick run, then
per method and run, the claims tally (holds, fails, untested, vacuous), the regime checks and each
claim with its evidence and its control's outcome. Only holds count: a claim whose control passes
the same test is vacuous, one whose regime check or premise failed is untested.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mixlab.shared.claims import CLAIM_STATES, claim_state, control_outcome

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _run_label(folder: Path, result: dict[str, Any]) -> str:
    seeds = result.get("config", {}).get("seeds")
    seed_text = f"seeds {seeds}" if isinstance(seeds, list) else f"seed {result['seed']}"
    return f"{folder.name.removeprefix('experiment-')} ({seed_text})"


def render_method(method: str, runs: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    lines = [
        f"### {method}",
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


def _tally(result: dict[str, Any]) -> dict[str, int]:
    states = [claim_state(claim) for claim in result["claims"]]
    return {state: states.count(state) for state in CLAIM_STATES}


def render_summary(quick: dict[str, dict[str, Any]]) -> list[str]:
    """One line over every method's committed quick run: how many claims are in each state."""
    total = dict.fromkeys(CLAIM_STATES, 0)
    for result in quick.values():
        for state, count in _tally(result).items():
            total[state] += count
    no_control = sum(
        1 for result in quick.values() for claim in result["claims"] if "control" not in claim
    )
    line = (
        f"Over the {len(quick)} committed quick runs: "
        + ", ".join(f"{total[state]} {state}" for state in CLAIM_STATES)
        + "."
    )
    if no_control:
        line += (
            f" {no_control} of these claims were judged before controls existed (no control "
            "outcome): their method's rerun will judge them against one."
        )
    return [line, ""]


def render_section(results: Path) -> str:
    lines = [
        BEGIN,
        "<!-- rendered by benchmarks/render_readme.py from benchmarks/results; do not edit by hand -->",
        "",
    ]
    methods = {}
    for method_dir in sorted(p for p in results.iterdir() if p.is_dir()):
        runs = [
            (folder, json.loads((folder / "result.json").read_text()))
            for folder in sorted(method_dir.glob("experiment-*"))
            if (folder / "result.json").is_file()
        ]
        if runs:
            methods[method_dir.name] = runs
    quick = {
        method: result
        for method, runs in methods.items()
        for folder, result in runs
        if folder.name == "experiment-quick"
    }
    lines += render_summary(quick)
    for method, runs in methods.items():
        lines += [*render_method(method, runs), ""]
    lines.append(END)
    return "\n".join(lines)


def render(readme: str, results: Path) -> str:
    """``readme`` with its results section replaced by one rendered from ``results``."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md must hold the markers {BEGIN} and {END}")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + render_section(results) + tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    args = parser.parse_args()
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    rendered = render(readme, ROOT / "benchmarks" / "results")
    if args.check:
        if rendered != readme:
            print("README.md is out of date: run uv run python benchmarks/render_readme.py")
            return 1
        return 0
    readme_path.write_text(rendered)
    print(f"wrote {readme_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
