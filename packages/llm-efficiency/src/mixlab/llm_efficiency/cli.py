"""``mixlab-llm``: the command line of the llm-efficiency methods; each method adds its command group here."""

from pathlib import Path
from typing import Annotated

import typer

from mixlab.llm_efficiency.gss.cli import app as gss_app
from mixlab.llm_efficiency.margo.cli import app as margo_app
from mixlab.llm_efficiency.mobiquant.cli import app as mobiquant_app
from mixlab.llm_efficiency.prompt_kl.cli import app as prompt_kl_app
from mixlab.llm_efficiency.rpdi_ee.cli import app as rpdi_ee_app
from mixlab.shared.checks import (
    check_count,
    check_input_file,
    check_input_folder,
    check_number,
    check_output_folder,
    check_seed,
)
from mixlab.shared.cli_base import domain_app, run_app

app = domain_app(
    "mixlab-llm",
    "LLM efficiency: any-precision quantization, early exit, sparsity, prompt compression and routing.",
)
lm_app = typer.Typer(
    help="The tiny-LM lab: train a byte-level Llama on stdlib sources, score text.",
    no_args_is_help=True,
)
app.add_typer(lm_app, name="lm")
app.add_typer(mobiquant_app, name="mobiquant")
app.add_typer(rpdi_ee_app, name="rpdi_ee")
app.add_typer(gss_app, name="gss")
app.add_typer(prompt_kl_app, name="prompt_kl")
app.add_typer(margo_app, name="margo")


@lm_app.command("train")
def lm_train(
    out: Annotated[Path, typer.Option(help="folder for the trained model")],
    hidden_size: int = 128,
    layers: int = 4,
    heads: int = 4,
    intermediate_size: int = 384,
    seq_len: int = 128,
    steps: int = 300,
    batch_size: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
    resume: Annotated[bool, typer.Option(help="continue from out/checkpoints")] = True,
) -> None:
    """Train a byte-level Llama on the standard library's train files (accelerate)."""
    counts = {
        "--hidden-size": hidden_size,
        "--layers": layers,
        "--heads": heads,
        "--intermediate-size": intermediate_size,
        "--seq-len": seq_len,
        "--steps": steps,
        "--batch-size": batch_size,
    }
    for option, value in counts.items():
        check_count(value, option)
    if hidden_size % heads:
        raise ValueError(f"--heads must divide --hidden-size {hidden_size}, got {heads}")
    check_number(lr, "--lr", lr > 0, "a finite number > 0")
    check_seed(seed)
    check_output_folder(out, "--out")

    from mixlab.llm_efficiency.lm import LMConfig, train_lm

    config = LMConfig(
        hidden_size, layers, heads, intermediate_size, seq_len, steps, batch_size, lr, seed=seed
    )
    typer.echo(f"saved {train_lm(config, out, resume=resume)}")


@lm_app.command("eval")
def lm_eval(
    model: Annotated[Path, typer.Option(help="local model folder")],
    text: Annotated[Path, typer.Option(help="text file to score")],
    seq_len: int = 128,
    max_tokens: int | None = None,
) -> None:
    """Print the perplexity of a local causal LM on a text file."""
    check_input_folder(model, "--model", containing=("config.json",))
    if (model / "mobiquant_config.json").exists():
        raise ValueError(
            f"--model: {model} holds a MoBiQuant model: use `mixlab-llm mobiquant eval`"
        )
    check_input_file(text, "--text")
    check_count(seq_len, "--seq-len")
    if max_tokens is not None:
        check_count(max_tokens, "--max-tokens")

    from mixlab.llm_efficiency.lm import encode_file, load_lm, perplexity

    tokens = encode_file(model, text)
    typer.echo(
        f"perplexity {perplexity(load_lm(model), tokens, seq_len, max_tokens=max_tokens):.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``mixlab-llm`` on ``argv`` (default: the command line) and return the exit code."""
    return run_app(app, argv, prog_name="mixlab-llm")
