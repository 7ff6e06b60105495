"""``mixlab-vision``: the command line of the vision-mm methods; each method adds its command group here."""

from mixlab.shared.cli_base import domain_app, run_app
from mixlab.vision_mm.mix_opt.cli import app as mix_opt_app
from mixlab.vision_mm.mixforensics.cli import app as mixforensics_app
from mixlab.vision_mm.moa3cir.cli import app as moa3cir_app
from mixlab.vision_mm.mop.cli import app as mop_app

app = domain_app("mixlab-vision", "Vision and multimodal training.")
app.add_typer(mix_opt_app, name="mix-opt")
app.add_typer(mop_app, name="mop")
app.add_typer(moa3cir_app, name="moa3cir")
app.add_typer(mixforensics_app, name="mixforensics")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-vision`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-vision")
