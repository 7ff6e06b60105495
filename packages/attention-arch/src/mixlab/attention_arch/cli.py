"""``mixlab-attn``: the command line of the attention-arch methods; each method adds its command group here."""

from mixlab.attention_arch.mita.cli import app as mita_app
from mixlab.attention_arch.moh.cli import app as moh_app
from mixlab.attention_arch.mol.cli import app as mol_app
from mixlab.shared.cli_base import domain_app, run_app

app = domain_app("mixlab-attn", "Efficient attention and mixture architectures.")
app.add_typer(mita_app, name="mita")
app.add_typer(moh_app, name="moh")
app.add_typer(mol_app, name="mol")


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-attn`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-attn")
