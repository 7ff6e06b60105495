"""The ``mixlab`` command: list the installed methods, run one, or reproduce them all.

mixlab list
mixlab run flatnsd --profile quick --seed 0 --device auto --out runs/flatnsd --resume
mixlab run flatnsd --set epochs=5 --set hidden_dim=32
mixlab reproduce --profile quick --only flatnsd,curb --out runs/reproduce
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from mixlab.shared.cli_base import run_app
from mixlab.shared.paths import default_run_dir
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
) -> int:
    """Run every installed method's experiment and print one table of claims; writes reproduce.json/.md."""
    methods = _select(discover_methods(), only)
    configs = {
        name: method.config.from_profile(profile, seed=seed, device=device)
        for name, method in methods.items()
    }
    rows = [_reproduce_one(method, configs[name], out / name) for name, method in methods.items()]
    report = {"profile": profile, "seed": seed, "device": device, "methods": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "reproduce.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "reproduce.md").write_text(_markdown(report))
    if not rows:
        console.print("No methods are installed yet: nothing to reproduce.")
    else:
        console.print(_claims_table(rows))
    console.print(f"wrote {out / 'reproduce.json'} and {out / 'reproduce.md'}")
    return 1 if any(row["status"] == "failed" for row in rows) else 0


def _select(methods: dict[str, Method], only: str | None) -> dict[str, Method]:
    if only is None:
        return methods
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in methods]
    if unknown or not names:
        known = ", ".join(methods) or "none"
        raise ValueError(f"--only must name installed methods ({known}), got {only!r}")
    return {name: methods[name] for name in names}


def _reproduce_one(method: Method, config: Any, out_dir: Path) -> dict[str, Any]:
    """Run one method; a crash is recorded (traceback in out_dir/error.txt) and the others go on."""
    console.rule(f"{method.name} ({config.profile}, seed {config.seed})")
    row: dict[str, Any] = {"method": method.name, "domain": method.domain, "paper": method.paper}
    try:
        result = method.execute(config, out_dir)
    except Exception as error:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "error.txt").write_text(traceback.format_exc())
        console.print(
            f"[red]{method.name} failed:[/red] {error} (traceback in {out_dir / 'error.txt'})"
        )
        return {
            **row,
            "status": "failed",
            "error": f"{type(error).__name__}: {error}",
            "claims": [],
            "wall_s": None,
        }
    _print_result(result)
    claims = [claim.to_dict() for claim in result.claims]
    return {
        **row,
        "status": "ok",
        "claims": claims,
        "wall_s": result.wall_s,
        "result": str(out_dir / "result.json"),
    }


def _holds(claim: dict[str, Any]) -> str:
    return "holds" if claim["holds"] else "does not hold"


def _claims_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("method", "claim", "result", "evidence", "wall s", show_lines=True)
    for row in rows:
        wall = format_number(row["wall_s"]) if row["wall_s"] is not None else "-"
        if row["status"] == "failed":
            table.add_row(row["method"], "-", "[red]failed[/red]", row["error"], wall)
        for claim in row["claims"]:
            table.add_row(row["method"], claim["text"], _holds(claim), claim["evidence"], wall)
    return table


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# mixlab reproduce ({report['profile']} profile, seed {report['seed']}, device {report['device']})",
        "",
        "| method | claim | result | evidence | wall s |",
        "|---|---|---|---|---|",
    ]
    for row in report["methods"]:
        wall = format_number(row["wall_s"]) if row["wall_s"] is not None else "-"
        if row["status"] == "failed":
            lines.append(f"| {row['method']} | - | failed | {row['error']} | {wall} |")
        for claim in row["claims"]:
            lines.append(
                f"| {row['method']} | {claim['text']} | {_holds(claim)} | {claim['evidence']} | {wall} |"
            )
    if not report["methods"]:
        lines.append("| (no methods installed) | | | | |")
    return "\n".join(lines) + "\n"


def _print_result(result: Result) -> None:
    systems = list(result.metrics)
    metric_names = list(next(iter(result.metrics.values())))
    if len(metric_names) > len(systems):  # many metrics: one row per metric, one column per system
        metrics = Table("metric", *systems, title=f"{result.method}: metrics")
        for name in metric_names:
            metrics.add_row(
                name, *(format_number(result.metrics[system][name]) for system in systems)
            )
    else:
        metrics = Table("system", *metric_names, title=f"{result.method}: metrics")
        for system, row in result.metrics.items():
            metrics.add_row(system, *(format_number(row[name]) for name in metric_names))
    console.print(metrics)
    claims = Table("claim", "result", "evidence", title=f"{result.method}: claims", show_lines=True)
    for claim in result.claims:
        claims.add_row(claim.text, _holds(claim.to_dict()), claim.evidence)
    console.print(claims)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab")
