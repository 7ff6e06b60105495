"""``mixlab-rl``: the command line of the rl methods; each method adds its command group here."""

from mixlab.shared.cli_base import domain_app, run_app

app = domain_app(
    "mixlab-rl", "Reinforcement learning: multi-agent, exploration and neural routing."
)


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-rl`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-rl")
