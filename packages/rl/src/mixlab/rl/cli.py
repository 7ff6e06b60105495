"""``mixlab-rl``: the command line of the rl methods; each method adds its command group here."""

from mixlab.rl.curb.cli import app as curb_app
from mixlab.rl.mixroute.cli import app as mixroute_app
from mixlab.rl.rnd_rff.cli import app as rnd_rff_app
from mixlab.shared.cli_base import domain_app, run_app

app = domain_app(
    "mixlab-rl", "Reinforcement learning: multi-agent, exploration and neural routing."
)
app.add_typer(curb_app, name="curb")
app.add_typer(mixroute_app, name="mixroute")
app.add_typer(rnd_rff_app, name="rnd_rff")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-rl`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-rl")
