"""``mixlab-graphs``: the command line of the graphs methods; each method adds its command group here."""

from mixlab.graphs.curvdiff.cli import app as curvdiff_app
from mixlab.graphs.flatnsd.cli import app as flatnsd_app
from mixlab.graphs.mixscentnet.cli import app as mixscentnet_app
from mixlab.shared.cli_base import domain_app, run_app

app = domain_app(
    "mixlab-graphs", "Graph methods: graph generation, sheaf networks, odor-mixture models."
)
app.add_typer(curvdiff_app, name="curvdiff")
app.add_typer(flatnsd_app, name="flatnsd")
app.add_typer(mixscentnet_app, name="mixscentnet")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-graphs`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-graphs")
