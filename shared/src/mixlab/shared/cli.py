"""The ``mixlab`` command: list the installed methods, run one, or reproduce them all.

mixlab list
mixlab run flatnsd --profile quick --seed 0 --device auto --out runs/flatnsd --resume
mixlab run flatnsd --set epochs=5 --set hidden_dim=32
mixlab reproduce --profile quick --only flatnsd,curb --out runs/reproduce
mixlab reproduce --resume                      # after Ctrl-C: keep finished methods, resume the rest
mixlab reproduce --compare benchmarks/results  # verdict changes and metric drift vs committed results
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from mixlab.shared.claims import claim_state, control_outcome, tally_text
from mixlab.shared.cli_base import USAGE_ERROR, run_app
from mixlab.shared.compare import (
    DRIFT_TOLERANCE,
    committed_result,
    compare_results,
    expected_time,
)
from mixlab.shared.files import write_json_atomic, write_text_atomic
from mixlab.shared.paths import default_run_dir
from mixlab.shared.progress_report import clock
from mixlab.shared.registry import Method, discover_methods, get_method
from mixlab.shared.result import Result, format_number

app = typer.Typer(
    name="mixlab",
    help="NeurIPS 2026 methods as libraries: list them, run one, or reproduce every installed method's claim.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
console = Console()

ProfileOption = Annotated[
    str, typer.Option(help="quick (minutes on 2 CPU cores) or full (closer to the paper)")
]
SeedOption = Annotated[int, typer.Option(help="random seed")]
DeviceOption = Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps")]


@app.command("list")
def list_methods() -> None:
    """Show the installed methods: name, domain, paper and claim."""
    methods = discover_methods()
    if not methods:
        console.print("No methods are installed yet: each method registers itself when it lands.")
        return
    table = Table("method", "domain", "paper", "claim", show_lines=True)
    for method in methods.values():
        table.add_row(method.name, method.domain, method.paper, method.claim)
    console.print(table)


@app.command("run")
def run_method(
    method: Annotated[str, typer.Argument(help="the method's name (see `mixlab list`)")],
    profile: ProfileOption = "quick",
    seed: SeedOption = 0,
    device: DeviceOption = "auto",
    out: Annotated[
        Path | None, typer.Option(help="output folder [default: runs/METHOD/PROFILE-seedSEED]")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="continue from the last checkpoint in --out")
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="change one config field: --set field=value (repeatable)"),
    ] = None,
) -> None:
    """Run one method's experiment (the method against the paper's baselines) and write result.json."""
    chosen = get_method(method)
    changes = chosen.config.parse_overrides(overrides or [])
    config = chosen.config.from_profile(profile, **{"seed": seed, "device": device, **changes})
    out_dir = out or default_run_dir(chosen.name, profile, config.seed)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out must be a folder, got the file {str(out_dir)!r}")
    console.print(f"{chosen.name} ({profile}, seed {config.seed}): "
                  + expected_time(_default_reference(), chosen.name, profile), highlight=False)  # fmt: skip
    result = chosen.execute(config, out_dir, resume=resume)
    _print_result(result)
    console.print(f"wrote {out_dir / 'result.json'}")


@app.command("reproduce")
def reproduce(
    profile: ProfileOption = "quick",
    only: Annotated[
        str | None, typer.Option(help="comma-separated method names [default: all installed]")
    ] = None,
    seed: SeedOption = 0,
    device: DeviceOption = "auto",
    out: Annotated[Path, typer.Option(help="folder for each method's run and the reports")] = Path(
        "runs/reproduce"
    ),
    resume: Annotated[
        bool,
        typer.Option(
            help="keep methods already finished in --out and continue the others from their checkpoints"
        ),
    ] = False,
    compare: Annotated[
        Path | None,
        typer.Option(
            help="committed results (benchmarks/results): report verdict changes and metric drift against them"
        ),
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option(
            help="with --compare: the relative change a metric may show before it counts as "
            "drifted (1e-6: the run reproduces the committed numbers)"
        ),
    ] = DRIFT_TOLERANCE,
) -> int:
    """Run every installed method's experiment and print one table of claims (holds, fails,
    untested or vacuous); writes reproduce.json and report.md. Exit 1 when a method failed or, with
    --compare, a verdict changed."""
    from mixlab.shared.device import resolve_device

    methods = _select(discover_methods(), only)
    resolve_device(device)  # once, before any method runs: a missing GPU is exit 2, not N failures
    if not (0 <= tolerance < float("inf")):
        raise ValueError(f"--tolerance must be a number >= 0, got {tolerance!r}")
    if compare is not None and not compare.is_dir():
        raise ValueError(f"--compare must be a folder of committed results, got {str(compare)!r}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out must be a folder, got the file {str(out)!r}")
    reference = compare if compare is not None else _default_reference()
    configs = {
        name: method.config.from_profile(profile, seed=seed, device=device)
        for name, method in methods.items()
    }
    report: dict[str, Any] = {
        "profile": profile,
        "seed": seed,
        "device": device,
        "compared_with": str(compare) if compare is not None else None,
        "methods": [],
    }
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("reproduce.json", "report.md"):
        (out / stale).unlink(missing_ok=True)
    started = time.perf_counter()
    for index, (name, method) in enumerate(methods.items(), start=1):
        console.rule(
            f"[{index}/{len(methods)}] {name} ({profile}, seed {seed}); "
            f"{clock(time.perf_counter() - started)} elapsed so far; "
            + expected_time(reference, name, profile)
        )
        row = _reproduce_one(method, configs[name], out / name, resume=resume)
        if compare is not None:
            row["compare"] = _compare_one(
                compare, name, profile, out / name, tolerance, method.config.TIMINGS
            )
        report["methods"].append(row)
        write_json_atomic(out / "reproduce.json", report)  # a killed run keeps what finished
    report["wall_s"] = round(time.perf_counter() - started, 1)
    write_json_atomic(out / "reproduce.json", report)
    write_text_atomic(out / "report.md", _markdown(report, out))
    rows = report["methods"]
    if not rows:
        console.print("No methods are installed yet: nothing to reproduce.")
    else:
        console.print(_claims_table(rows))
        if compare is not None:
            console.print(_compare_table(rows))
    console.print(f"wrote {out / 'reproduce.json'} and {out / 'report.md'}")
    failed = any(row["status"] == "failed" for row in rows)
    changed = any(row.get("compare", {}).get("verdict_changes") for row in rows)
    return 1 if failed or changed else 0


def _default_reference() -> Path | None:
    """``benchmarks/results`` of a mixlab checkout in the current folder, if there is one."""
    path = Path("benchmarks/results")
    return path if path.is_dir() else None


def _select(methods: dict[str, Method], only: str | None) -> dict[str, Method]:
    if only is None:
        return methods
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in methods]
    if unknown or not names:
        known = ", ".join(methods) or "none"
        raise ValueError(f"--only must name installed methods ({known}), got {only!r}")
    return {name: methods[name] for name in names}


def _finished(out_dir: Path, config: Any) -> Result | None:
    """The result an earlier run left in ``out_dir`` for exactly this config, else None."""
    try:
        result = Result.load(out_dir / "result.json")
    except (OSError, ValueError):
        return None
    recorded = json.loads(json.dumps(config.to_dict()))
    return result if result.config == recorded else None


def _reproduce_one(method: Method, config: Any, out_dir: Path, *, resume: bool) -> dict[str, Any]:
    """Run one method; a crash is recorded (traceback in out_dir/error.txt) and the others go on."""
    row: dict[str, Any] = {
        "method": method.name,
        "domain": method.domain,
        "paper": method.paper,
        "headline_plot": method.headline_plot,
    }
    result = _finished(out_dir, config) if resume else None
    if result is not None:
        console.print(f"{method.name}: kept the finished run in {out_dir}")
    else:
        try:
            result = method.execute(config, out_dir, resume=resume)
        except Exception as error:
            write_text_atomic(out_dir / "error.txt", traceback.format_exc())
            console.print(
                f"[red]{method.name} failed:[/red] {error} (traceback in {out_dir / 'error.txt'})"
            )
            return {
                **row,
                "status": "failed",
                "error": f"{type(error).__name__}: {error}",
                "regime": [],
                "claims": [],
                "wall_s": None,
            }
    _print_result(result)
    return {
        **row,
        "status": "ok",
        "regime": [check.to_dict() for check in result.regime],
        "claims": [claim.to_dict() for claim in result.claims],
        "tally": result.tally(),
        "wall_s": result.wall_s,
        "result": str(out_dir / "result.json"),
    }


def _compare_one(
    reference: Path,
    name: str,
    profile: str,
    out_dir: Path,
    tolerance: float,
    timings: tuple[str, ...] = (),
) -> dict[str, Any]:
    committed = committed_result(reference, name, profile)
    if not committed.is_file() or not (out_dir / "result.json").is_file():
        return {"committed": str(committed), "missing": True, "verdict_changes": []}
    comparison = compare_results(
        json.loads(committed.read_text()),
        json.loads((out_dir / "result.json").read_text()),
        tolerance=tolerance,
        timings=timings,
    )
    return {"committed": str(committed), "missing": False, **comparison}


def _claims_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("method", "claim", "result", "evidence", "control", "wall s", show_lines=True)
    for row in rows:
        wall = format_number(row["wall_s"]) if row["wall_s"] is not None else "-"
        if row["status"] == "failed":
            table.add_row(row["method"], "-", "[red]failed[/red]", row["error"], "-", wall)
        for claim in row["claims"]:
            table.add_row(
                row["method"],
                claim["text"],
                claim_state(claim),
                claim["evidence"],
                control_outcome(claim) or "-",
                wall,
            )
    return table


def _compare_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("method", "verdict changes", "drifted metrics", title="against committed results")
    for row in rows:
        comparison = row.get("compare", {})
        if comparison.get("missing", True):
            table.add_row(row["method"], "no committed result", "-")
            continue
        changes = "; ".join(
            f"{c['claim']}: {c['committed']} -> {c['fresh']}" for c in comparison["verdict_changes"]
        )
        drift = ", ".join(
            f"{d['system']}.{d['metric']} {_percent(d['relative'])}"
            for d in comparison["drifted_metrics"][:5]
        )
        more = len(comparison["drifted_metrics"]) - 5
        drift += f" (+{more} more)" if more > 0 else ""
        table.add_row(
            row["method"],
            changes or "none",
            f"{drift or 'none'} of {comparison['compared_metrics']} (>{comparison['tolerance']:.2g}); "
            f"{len(comparison.get('moved_timings', []))} wall-time metrics moved (not compared)",
        )
    return table


def _percent(relative: float | None) -> str:
    return "missing" if relative is None else f"{relative:+.1%}"


def _markdown(report: dict[str, Any], out: Path) -> str:
    """report.md: the claims table (holds, fails, untested, vacuous), the regime checks, the
    comparison with committed results, and each method's headline plot."""
    lines = [
        f"# mixlab reproduce ({report['profile']} profile, seed {report['seed']}, device {report['device']})",
        "",
        "Each claim is in one of four states: *holds*; *fails*; *untested* when a regime check or "
        "one of its premises failed (the setup could not test it); *vacuous* when it holds but its "
        "control, the strongest simple system without the method's idea, passes the same test. "
        "Only holds count.",
        "",
        "| method | claim | result | evidence | control | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["methods"]:
        wall = format_number(row["wall_s"]) if row["wall_s"] is not None else "-"
        if row["status"] == "failed":
            lines.append(f"| {row['method']} | - | failed | {row['error']} | - | {wall} |")
        for claim in row["claims"]:
            lines.append(
                f"| {row['method']} | {claim['text']} | {claim_state(claim)} | "
                f"{claim['evidence']} | {control_outcome(claim) or '-'} | {wall} |"
            )
    if not report["methods"]:
        lines.append("| (no methods installed) | | | | | |")
    for row in report["methods"]:
        lines += ["", f"## {row['method']}", ""]
        if row["status"] == "failed":
            lines.append(f"Failed: {row['error']}")
            continue
        lines.append(f"{tally_text(row['tally'])}; {format_number(row['wall_s'])} s.")
        for check in row["regime"]:
            verdict = "holds" if check["holds"] else "fails"
            lines.append(f"- regime check ({verdict}): {check['text']} ({check['evidence']})")
        comparison = row.get("compare")
        if comparison and not comparison.get("missing", True):
            changes = comparison["verdict_changes"]
            lines.append(
                f"- against {comparison['committed']} (commit {comparison['committed_git']}): "
                f"{len(changes)} verdict change(s), {len(comparison['drifted_metrics'])} of "
                f"{comparison['compared_metrics']} metrics drifted by more than a relative "
                f"{comparison['tolerance']:.2g} (wall-time metrics apart: "
                f"{len(comparison.get('moved_timings', []))} moved)"
            )
            lines += [f"  - {c['claim']}: {c['committed']} → {c['fresh']}" for c in changes]
        plot = out / row["method"] / row["headline_plot"] if row["headline_plot"] else None
        if plot is not None and plot.is_file():
            lines += ["", f"![{row['method']}]({row['method']}/{row['headline_plot']})"]
    return "\n".join(lines) + "\n"


def _print_result(result: Result) -> None:
    systems = list(result.metrics)
    metric_names = list(next(iter(result.metrics.values())))
    if len(metric_names) > len(systems):  # many metrics: one row per metric, one column per system
        rows, columns, header = metric_names, systems, "metric"

        def cell(row: str, column: str) -> str:
            return format_number(result.metrics[column][row])
    else:
        rows, columns, header = systems, metric_names, "system"

        def cell(row: str, column: str) -> str:
            return format_number(result.metrics[row][column])

    for table in _fitting_tables(f"{result.method}: metrics", header, rows, columns, cell):
        console.print(table)
    claims = Table(
        "claim", "result", "evidence", "control", title=f"{result.method}: claims", show_lines=True
    )
    for check in result.regime:
        claims.add_row(
            f"(regime) {check.text}", "holds" if check.holds else "fails", check.evidence, "-"
        )
    for claim in result.claims:
        claims.add_row(
            claim.text, claim.state, claim.evidence, control_outcome(claim.to_dict()) or "-"
        )
    console.print(claims)
    console.print(tally_text(result.tally()))


_RUN_OPTIONS_WITH_VALUES = ("--profile", "--seed", "--device", "--out", "--set")


def _help_of_method(args: list[str]) -> tuple[Method, str] | None:
    """``(method, profile)`` when ``args`` ask ``run METHOD ... --help`` of an installed method
    (``--profile P`` or ``--profile=P`` picks the defaults shown)."""
    if not args or args[0] != "run" or "--help" not in args:
        return None
    rest, positional, profile = args[1:], [], "quick"
    for i, arg in enumerate(rest):
        if arg.startswith("--profile="):
            profile = arg.partition("=")[2]
        elif i > 0 and rest[i - 1] in _RUN_OPTIONS_WITH_VALUES:
            profile = arg if rest[i - 1] == "--profile" else profile
        elif not arg.startswith("-"):
            positional.append(arg)
    methods = discover_methods()
    if not positional or positional[0] not in methods:
        return None
    return methods[positional[0]], profile


def _print_fields(method: Method, profile: str) -> None:
    """Every config field of ``method``: type, default in ``profile``, what other profiles set,
    the range its check allows and its docstring (``--set field=value`` changes one)."""
    console.print(
        f"\nConfig fields of {method.name} ({profile} profile; change one with --set field=value):",
        highlight=False,
    )
    for field in method.config.field_help(profile):
        line = f"  {field['name']}: {field['type']} = {field['default']}"
        if field["profiles"]:
            line += f"  ({field['profiles']})"
        console.print(line, highlight=False, markup=False, soft_wrap=True)
        details = "; ".join(part for part in (field["allowed"], field["doc"]) if part)
        if details:
            wrapped = textwrap.fill(
                details, width=max(40, console.width), initial_indent=" " * 6,
                subsequent_indent=" " * 6,
            )  # fmt: skip
            console.print(wrapped, highlight=False, markup=False, soft_wrap=True)


def _fitting_tables(
    title: str,
    header: str,
    rows: list[str],
    columns: list[str],
    cell: Any,
    *,
    width: int | None = None,
) -> list[Table]:
    """One table of ``rows`` × ``columns`` (``cell(row, column)``), split into several that each
    fit the terminal's ``width`` so no number is cut to "0.0…" (each keeps the row labels)."""
    width = width or console.width
    label_width = max(len(header), *(len(row) for row in rows)) + 3
    chunks: list[list[str]] = [[]]
    used = label_width
    for column in columns:
        needed = max(len(column), 10) + 3  # a four-digit number in scientific notation is 9 wide
        if chunks[-1] and used + needed > width:
            chunks.append([])
            used = label_width
        chunks[-1].append(column)
        used += needed
    tables = []
    for index, chunk in enumerate(chunks, start=1):
        part = f" ({index} of {len(chunks)})" if len(chunks) > 1 else ""
        table = Table(header, *chunk, title=title + part)
        for row in rows:
            table.add_row(row, *(cell(row, column) for column in chunk))
        tables.append(table)
    return tables


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: the command line) and return the exit code.

    ``mixlab run METHOD --help`` adds the method's config fields to the help of ``run``."""
    args = list(sys.argv[1:] if argv is None else argv)
    asked = _help_of_method(args)
    if asked is None:
        return run_app(app, args, prog_name="mixlab")
    method, profile = asked
    if profile not in method.config.PROFILES:
        allowed = sorted(method.config.PROFILES)
        typer.echo(f"mixlab: error: profile must be one of {allowed}, got {profile!r}", err=True)
        return USAGE_ERROR
    code = run_app(app, ["run", "--help"], prog_name="mixlab")
    _print_fields(method, profile)
    return code
