"""``mixlab-online``: the command line of the online methods; each method adds its command group here."""

from mixlab.shared.cli_base import domain_app, run_app

app = domain_app("mixlab-online", "Online learning: matrix completion on drifting subspaces.")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-online`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-online")
