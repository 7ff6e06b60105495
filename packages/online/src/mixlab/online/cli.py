"""``mixlab-online``: the command line of the online-learning methods; each method adds its command group here."""

from mixlab.online.mosaic.cli import app as mosaic_app
from mixlab.shared.cli_base import domain_app, run_app

app = domain_app("mixlab-online", "Online learning: matrix completion on drifting subspaces.")
app.add_typer(mosaic_app, name="mosaic")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-online`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-online")
