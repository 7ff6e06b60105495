"""``mixlab-llm mobiquant``: quantize a local Hugging Face causal LM once, evaluate it at any precision.

mixlab-llm mobiquant quantize --model DIR --calib calib.txt --out QDIR
mixlab-llm mobiquant eval --model QDIR --text test.txt --avg-bits 3
mixlab-llm mobiquant eval --model QDIR --text test.txt --bits 4
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from mixlab.llm_efficiency.mobiquant.config import SLICE_BITS
from mixlab.shared.checks import (
    check_count,
    check_input_file,
    check_input_folder,
    check_number,
    check_output_folder,
    check_seed,
)

CONFIG_FILE = "mobiquant_config.json"  # as model.CONFIG_FILE (model.py imports torch)

app = typer.Typer(
    help="MoBiQuant: one nested checkpoint, precision chosen per token at run time.",
    no_args_is_help=True,
)

SeqLen = Annotated[int, typer.Option(help="tokens per window")]


def _windows(tokens, seq_len: int, count: int):
    """Up to ``count`` non-overlapping windows [count, seq_len] from the start of ``tokens``."""
    available = len(tokens) // seq_len
    if available < 1:
        raise ValueError(
            f"--calib: the file has {len(tokens)} tokens, fewer than --seq-len {seq_len}"
        )
    n = min(count, available)
    return tokens[: n * seq_len].view(n, seq_len)


@app.command()
def quantize(
    model: Annotated[Path, typer.Option(help="local model folder (config.json + weights)")],
    calib: Annotated[Path, typer.Option(help="text file of calibration text")],
    out: Annotated[Path, typer.Option(help="folder for the quantized model")],
    bits: Annotated[int, typer.Option(help="bits per slice (1, 2, 4 or 8)")] = 2,
    slices: Annotated[int, typer.Option(help="slices; depth d reads d * bits bits")] = 4,
    group_size: int = 128,
    router: Annotated[bool, typer.Option(help="learn a token router per block")] = True,
    calib_sequences: int = 32,
    seq_len: SeqLen = 512,
    calib_steps: int = 200,
    seed: int = 0,
) -> None:
    """Quantize every linear layer of the decoder blocks, calibrated block-wise on --calib."""
    check_input_folder(model, "--model", containing=("config.json",))
    check_input_file(calib, "--calib")
    check_output_folder(out, "--out")
    if out.resolve() == model.resolve():
        raise ValueError(f"--out must differ from --model (it would overwrite {model})")
    if bits not in SLICE_BITS:  # check_choice takes names; these are numbers
        raise ValueError(f"--bits must be one of {list(SLICE_BITS)}, got {bits}")
    check_count(slices, "--slices", minimum=2 if router else 1)
    if bits * slices > 16:
        raise ValueError(f"--slices must keep --bits x --slices <= 16, got {bits} x {slices}")
    for option, value in {
        "--group-size": group_size,
        "--calib-sequences": calib_sequences,
        "--seq-len": seq_len,
        "--calib-steps": calib_steps,
    }.items():
        check_count(value, option)
    check_seed(seed)

    from mixlab.llm_efficiency.lm import encode_file, load_lm
    from mixlab.llm_efficiency.mobiquant.model import (
        MoBiQuantConfig,
        quantize_,
        save_quantized,
        storage_bits,
    )

    config = MoBiQuantConfig(
        bits=bits,
        slices=slices,
        group_size=group_size,
        router=router,
        calib_steps=calib_steps,
        seed=seed,
    )
    tokens = _windows(encode_file(model, calib), seq_len, calib_sequences)
    lm = load_lm(model)
    quantize_(lm, config, calib=tokens)
    save_quantized(lm, out)
    for extra in [
        *model.glob("tokenizer*"),
        *model.glob("special_tokens_map.json"),
        *model.glob("*.model"),
    ]:
        shutil.copy(extra, out / extra.name)
    sizes = storage_bits(lm)
    per_weight = (sizes["codes"] + sizes["scales"] + sizes["routers"]) / sizes["weights"]
    typer.echo(
        f"quantized {sizes['weights']:,} weights to {bits}x{slices} bits "
        f"({per_weight:.2f} bits/weight stored, all precisions) -> {out}"
    )


@app.command("eval")
def evaluate(
    model: Annotated[Path, typer.Option(help="folder written by `mobiquant quantize`")],
    text: Annotated[Path, typer.Option(help="text file to score")],
    bits: Annotated[
        int | None, typer.Option(help="uniform precision (a multiple of the slice bits)")
    ] = None,
    avg_bits: Annotated[
        float | None, typer.Option(help="average code bits, routed per token")
    ] = None,
    seq_len: SeqLen = 512,
    max_tokens: Annotated[int | None, typer.Option(help="score only the first tokens")] = None,
) -> None:
    """Print the perplexity of --text and the average code bits per weight actually read."""
    if bits is not None and avg_bits is not None:
        raise ValueError("--bits and --avg-bits: give one of them, not both")
    check_input_folder(model, "--model", containing=(CONFIG_FILE,))
    check_input_file(text, "--text")
    check_count(seq_len, "--seq-len")
    if max_tokens is not None:
        check_count(max_tokens, "--max-tokens")
    if bits is not None:
        check_count(bits, "--bits")
    if avg_bits is not None:
        check_number(avg_bits, "--avg-bits", avg_bits > 0, "a finite number > 0")

    from mixlab.llm_efficiency.lm import encode_file, perplexity
    from mixlab.llm_efficiency.mobiquant.layer import BUDGETS_PER_SLICE, budget_index
    from mixlab.llm_efficiency.mobiquant.model import (
        average_bits,
        load_quantized,
        read_quantized_config,
        set_budget,
        set_precision,
    )

    config = read_quantized_config(model)  # checks the folder's integrity
    slice_bits, top = config.bits, config.bits * config.slices
    if bits is not None and (bits % slice_bits or not slice_bits <= bits <= top):
        raise ValueError(
            f"--bits must be a multiple of the slice bits {slice_bits} in "
            f"[{slice_bits}, {top}], got {bits}"
        )
    if avg_bits is not None and not slice_bits <= avg_bits <= top:
        raise ValueError(f"--avg-bits must be in [{slice_bits}, {top}], got {avg_bits}")
    if avg_bits is not None and config.router:
        try:  # the routers' own grid check, before the model is loaded
            budget_index(avg_bits, slice_bits, config.slices)
        except ValueError:
            raise ValueError(
                f"--avg-bits must be a multiple of {slice_bits / BUDGETS_PER_SLICE:g} for a routed "
                f"model (the budgets its routers store thresholds for), got {avg_bits}"
            ) from None
    tokens = encode_file(model, text)
    lm = load_quantized(model, config=config)
    if bits is not None:
        set_precision(lm, bits // slice_bits)
    elif avg_bits is not None:
        set_budget(lm, avg_bits)
    ppl = perplexity(lm, tokens, seq_len, max_tokens=max_tokens)
    typer.echo(f"perplexity {ppl:.3f}  average bits {average_bits(lm):.2f}")
