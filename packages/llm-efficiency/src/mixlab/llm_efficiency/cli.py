"""``mixlab-llm``: the command line of the llm-efficiency methods; each method adds its command group here."""

from mixlab.shared.cli_base import domain_app, run_app

app = domain_app(
    "mixlab-llm",
    "LLM efficiency: any-precision quantization, early exit, sparsity, prompt compression and routing.",
)


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-llm`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-llm")
