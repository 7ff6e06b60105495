"""``mixlab-vision``: the command line of the vision-mm methods; each method adds its command group here."""

from mixlab.shared.cli_base import domain_app, run_app

app = domain_app("mixlab-vision", "Vision and multimodal training.")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-vision`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-vision")
