"""``mixlab-llm gss``: fit, evaluate and apply a gated memorization steer on any local causal LM.

mixlab-llm gss fit --model DIR --memorized mem.jsonl --general text.txt [--reference DIR] --layer 2 --rank 5 --out steer.safetensors
mixlab-llm gss eval --model DIR [--steer steer.safetensors] --memorized mem.jsonl --general text.txt --prefix 32 --k 16
mixlab-llm gss generate --model DIR --steer steer.safetensors --prompt "API_KEY = '"

A memorized file holds one JSON object per line with ``text``: a sequence the model
regurgitates. ``eval`` prompts with its first ``--prefix`` tokens and counts a hit when greedy
decoding writes the next ``--k`` exactly (TinyMem's extraction test). The general file is plain
text the model should keep (cut into ``--seq-len``-token pieces).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from mixlab.shared.checks import (
    check_choice,
    check_count,
    check_input_file,
    check_input_folder,
    check_number,
    check_output_file,
    read_jsonl,
)

app = typer.Typer(
    help="GSS: a gated low-rank steer at one layer that stops verbatim regurgitation.",
    no_args_is_help=True,
)

Model = Annotated[Path, typer.Option(help="local model folder (config.json, weights, tokenizer)")]
Memorized = Annotated[Path, typer.Option(help="JSON lines, each with 'text': a memorized sequence")]
General = Annotated[Path, typer.Option(help="plain text the model should keep")]
SeqLen = Annotated[int, typer.Option(help="tokens per piece of the general text")]


def _unit(value: float, option: str) -> None:
    check_number(value, option, 0 < value < 1, "a number in (0, 1)")


def _pieces(ids: list[int], seq_len: int, option: str) -> list[list[int]]:
    pieces = [ids[i : i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    if len(pieces) < 2:
        raise ValueError(
            f"{option}: the text has {len(ids)} tokens, at least 2 x --seq-len = {2 * seq_len} needed"
        )
    return pieces


def _read(model: Path, memorized: Path, general: Path, seq_len: int, min_tokens: int = 2):
    """``(encode, memorized ids, general pieces)`` after checking the files."""
    from mixlab.llm_efficiency.lm import text_encoder

    records = read_jsonl(memorized, "--memorized", ("text",))
    check_input_file(general, "--general")
    encode = text_encoder(model)
    ids = []
    for number, record in enumerate(records, start=1):
        row = encode(str(record["text"]))
        if len(row) < min_tokens:
            raise ValueError(
                f"--memorized: record {number} has {len(row)} tokens, at least {min_tokens} "
                "needed (--prefix + --k)"
            )
        ids.append(row)
    try:
        text = general.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--general: {general} is not UTF-8 text ({error.reason})") from None
    return encode, ids, _pieces(encode(text), seq_len, "--general")


def _load(model: Path) -> Any:
    from mixlab.llm_efficiency.lm import load_lm

    check_input_folder(model, "--model", containing=("config.json",))
    return load_lm(model)


@app.command()
def fit(
    model: Model,
    memorized: Memorized,
    general: General,
    layer: Annotated[int, typer.Option(help="decoder block whose output is steered (0-based)")],
    out: Annotated[Path, typer.Option(help="where to write the steer (.safetensors)")],
    reference: Annotated[
        Path | None,
        typer.Option(help="a model of the same vocabulary that did not see the memorized data"),
    ] = None,
    rank: Annotated[int, typer.Option(help="probe/steer pairs K")] = 1,
    delta: Annotated[float, typer.Option(help="probe budget delta in (0, 1)")] = 0.05,
    quantile: Annotated[float, typer.Option(help="gate threshold: this quantile of |u'h|")] = 0.95,
    top_fraction: Annotated[float, typer.Option(help="share of memorized tokens by omega")] = 0.1,
    alpha_mode: Annotated[str, typer.Option(help="printed | adaptive")] = "adaptive",
    strength: Annotated[float, typer.Option(help="multiplier of alpha")] = 1.0,
    seq_len: SeqLen = 128,
) -> None:
    """Fit a gated steer in closed form and save it."""
    check_count(layer, "--layer", minimum=0)
    check_count(rank, "--rank")
    _unit(delta, "--delta")
    _unit(quantile, "--quantile")
    check_number(top_fraction, "--top-fraction", 0 < top_fraction <= 1, "a number in (0, 1]")
    check_choice(alpha_mode, "--alpha-mode", ("printed", "adaptive"))
    check_number(strength, "--strength", strength >= 0, "a finite number >= 0")
    check_count(seq_len, "--seq-len")
    check_output_file(out, "--out", suffixes=(".safetensors",))
    check_input_folder(model, "--model", containing=("config.json",))
    if reference is not None:
        check_input_folder(reference, "--reference", containing=("config.json",))
    _, mem_ids, pieces = _read(model, memorized, general, seq_len)

    from mixlab.llm_efficiency.gss.steer import fit_gss

    lm = _load(model)
    ref = _load(reference) if reference is not None else None
    steer = fit_gss(
        lm,
        mem_ids,
        pieces,
        reference=ref,
        layer=layer,
        rank=rank,
        delta=delta,
        quantile=quantile,
        top_fraction=top_fraction,
        alpha_mode=alpha_mode,
        strength=strength,
    )
    steer.save(out)
    typer.echo(f"saved {out} (layer {layer}, rank {rank}, eps {steer.eps.tolist()})")


@app.command("eval")
def evaluate(
    model: Model,
    memorized: Memorized,
    general: General,
    steer: Annotated[Path | None, typer.Option(help="a steer from `gss fit`")] = None,
    prefix: Annotated[int, typer.Option(help="prompt tokens of each memorized sequence")] = 32,
    k: Annotated[int, typer.Option(help="tokens after the prompt that must match")] = 16,
    seq_len: SeqLen = 128,
) -> None:
    """Extraction rate, perplexity on the general text and gate rates (with a steer)."""
    check_count(prefix, "--prefix")
    check_count(k, "--k")
    check_count(seq_len, "--seq-len")
    check_input_folder(model, "--model", containing=("config.json",))
    if steer is not None:
        check_input_file(steer, "--steer", suffixes=(".safetensors",))
    _, mem_ids, pieces = _read(model, memorized, general, seq_len, min_tokens=prefix + k)

    import contextlib

    import torch

    from mixlab.llm_efficiency.gss.steer import load_steer
    from mixlab.llm_efficiency.lm import perplexity_of, token_nll

    lm = _load(model)
    hook = load_steer(steer, lm) if steer is not None else None
    hits = 0
    with hook if hook is not None else contextlib.nullcontext():
        for row in mem_ids:
            prompt = torch.tensor([row[:prefix]])
            out = lm.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=k,
                min_new_tokens=k,
                do_sample=False,
                pad_token_id=0,
            )
            hits += out[0, prefix:].tolist() == row[prefix : prefix + k]
        if hook is not None:
            hook.reset_stats()
        tokens = torch.tensor([i for piece in pieces for i in piece])
        ppl = perplexity_of(token_nll(lm, tokens, seq_len))
    line = f"extraction {hits / len(mem_ids):.4f} ({hits}/{len(mem_ids)})  perplexity {ppl:.3f}"
    if hook is not None:
        line += f"  gate rate on general text {hook.any_gate_rate:.4f}"
    typer.echo(line)


@app.command()
def generate(
    model: Model,
    steer: Annotated[Path, typer.Option(help="a steer from `gss fit`")],
    prompt: Annotated[str, typer.Option(help="text to continue")],
    max_new_tokens: int = 32,
) -> None:
    """Continue a prompt greedily under the steer; print the text and the gate rate."""
    check_count(max_new_tokens, "--max-new-tokens")
    check_input_folder(model, "--model", containing=("config.json",))
    check_input_file(steer, "--steer", suffixes=(".safetensors",))
    if not prompt:
        raise ValueError("--prompt must be non-empty text")

    import torch

    from mixlab.llm_efficiency.gss.steer import load_steer
    from mixlab.llm_efficiency.lm import text_encoder

    ids = torch.tensor([text_encoder(model)(prompt)])
    lm = _load(model)
    with load_steer(steer, lm) as hook:
        out = lm.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    new = out[0, ids.shape[1] :].tolist()
    if any((model / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer

        text = AutoTokenizer.from_pretrained(model, local_files_only=True).decode(new)
    else:
        text = bytes(new).decode("utf-8", "replace")
    typer.echo(text)
    typer.echo(f"gate rate {hook.any_gate_rate:.4f}", err=True)
