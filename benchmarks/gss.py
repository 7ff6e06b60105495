"""Benchmark: how long GSS takes to fit against hard-concrete masks and NPO, and what its gated
hook costs per generated token against no hook and an ungated vector hook, side by side.

    uv run python benchmarks/gss.py                      # -> benchmarks/results/gss/
    uv run python benchmarks/gss.py --out /tmp/bench --repeats 3

Two models:

1. ``tiny``: the Math-Noise base model of ``mixlab run gss`` (cached; trained on first use) and
   its reference. GSS (layer 2, K 5, as the experiment's grid) is fitted on 100 memorized
   sequences; hard-concrete masks and NPO train until their extraction rate on 100 other
   memorized sequences is at most GSS's (checks not timed) or 300 steps. The same
   ``mitigate(model, data)`` call is timed for all three.
2. ``llama2048``: a random-init Llama of width 2048 (2 blocks, 5,632 MLP units, bytes). GSS's
   fit (activations, gradients, a 2048 x 2048 Cholesky and SVD) against 20 steps of each
   optimisation baseline (their per-step cost times 20; on a real model they need hundreds).

Generation: greedy, ``--tokens`` new tokens from 16-token prompts at batch 1 and 8, with no
hook, an ungated vector hook (mean-difference steering: h - v at every position) and the gated
GSS hook (K 5, thresholds at the 95th percentile). Times are medians over ``--repeats`` runs after
a warm-up; ratios are to no hook in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from mixlab.llm_efficiency.gss import NPO, GSS, HardConcreteMask, MeanDifference, MitigationData
from mixlab.llm_efficiency.gss.config import Config
from mixlab.llm_efficiency.lm import LMConfig, llama_config
from mixlab.llm_efficiency.memorization import SEPARATOR, extraction_rate, pretrained_memorization_lms
from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark

BATCHES = (1, 8)
HOOK_OVERHEAD_MAX = 0.10
"""claim: the gated hook adds at most 10 % per generated token on the width-2048 model"""
FIT_SPEEDUP = 10.0
"""claim: GSS fits at least 10x faster than hard-concrete masks and NPO on the tiny model"""


def _median(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ids(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.long)


def _generation(model, steers: dict, tokens: int, repeats: int) -> dict[str, float]:
    """Seconds per generated token with each hook, and the ratios to no hook."""
    g = torch.Generator().manual_seed(0)
    row: dict[str, float] = {}
    for batch in BATCHES:
        prompt = torch.randint(32, 127, (batch, 16), generator=g)

        def run(prompt=prompt):
            model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
            )

        for name, steer in steers.items():
            with steer if steer is not None else contextlib.nullcontext():
                row[f"{name}_s_per_token_b{batch}"] = _median(run, repeats) / (tokens * batch)
        none = row[f"none_s_per_token_b{batch}"]
        for name in steers:
            if name != "none":
                row[f"{name}_ratio_b{batch}"] = row[f"{name}_s_per_token_b{batch}"] / none
    return row


def tiny(repeats: int, tokens: int) -> dict[str, float]:
    config = Config()
    base, reference, data = pretrained_memorization_lms(config.lm_config("math-noise"))
    records = data.memorized[len(data.memorized) // 3 :]
    fit, check = records[: len(records) // 2], records[len(records) // 2 :]
    general = [_ids(SEPARATOR + t) for t in data.held_out[:1500]]
    mdata = MitigationData(
        memorized=[_ids(SEPARATOR + r.text) for r in fit],
        general=general[:1000],
        held_out=general[1000:],
        reference=reference,
    )
    gss = GSS(layer=2, rank=5, top_fraction=config.top_fraction, strength=4.0)
    fitted = gss.mitigate(base, mdata)
    fit_s = _median(lambda: gss.mitigate(base, mdata), repeats)
    with fitted:
        target = extraction_rate(base, check)
    row: dict[str, float] = {"gss_fit_s": fit_s, "gss_memorization": target}
    stopping = MitigationData(**{**mdata.__dict__, "stop": lambda m: extraction_rate(m, check) <= target})
    for name, method in (("hard_concrete", HardConcreteMask(max_steps=300)), ("npo", NPO(lr=1e-4, max_steps=300))):
        done = method.mitigate(base, stopping)
        row[f"{name}_fit_s"] = done.seconds
        row[f"{name}_steps"] = done.steps
        row[f"{name}_reached"] = float(bool(done.reached))
        row[f"{name}_fit_ratio"] = done.seconds / fit_s
    vector = MeanDifference(2, 1.0).mitigate(base, mdata).steer
    steers = {"none": None, "vector": vector, "gated": fitted.steer}
    row.update(_generation(base, steers, tokens, repeats))
    return row


def wide(repeats: int, tokens: int) -> dict[str, float]:
    torch.manual_seed(0)
    lm = LMConfig(hidden_size=2048, layers=2, heads=16, intermediate_size=5632, seq_len=256)
    model = LlamaForCausalLM(llama_config(lm)).eval()
    g = torch.Generator().manual_seed(1)
    mdata = MitigationData(
        memorized=list(torch.randint(256, (32, 64), generator=g)),
        general=list(torch.randint(256, (64, 64), generator=g)),
        held_out=list(torch.randint(256, (32, 64), generator=g)),
    )
    gss = GSS(layer=1, rank=5, top_fraction=0.1)
    fitted = gss.mitigate(model, mdata)
    row: dict[str, float] = {"gss_fit_s": _median(lambda: gss.mitigate(model, mdata), repeats)}
    for name, method in (("hard_concrete", HardConcreteMask(max_steps=20)), ("npo", NPO(max_steps=20))):
        done = method.mitigate(model, mdata)
        row[f"{name}_fit_s"] = done.seconds
        row[f"{name}_steps"] = done.steps
        row[f"{name}_fit_ratio"] = done.seconds / row["gss_fit_s"]
    vector = MeanDifference(1, 1.0).mitigate(model, mdata).steer
    row.update(_generation(model, {"none": None, "vector": vector, "gated": fitted.steer}, tokens, repeats))
    return row


def claims(metrics: dict[str, dict[str, float]]) -> list[Claim]:
    small, big = metrics["tiny"], metrics["llama2048"]
    return [
        Claim.all_of(
            f"GSS fits at least {FIT_SPEEDUP:.0f}x faster than hard-concrete masks and NPO "
            "stopped at its memorization (tiny model)",
            [
                Claim.compare(
                    f"vs {name}", small[f"{name}_fit_ratio"], ">=", FIT_SPEEDUP, value_label="fit-time ratio"
                )
                for name in ("hard_concrete", "npo")
            ],
        ),
        Claim.all_of(
            f"The gated hook adds at most {HOOK_OVERHEAD_MAX:.0%} per generated token to no hook "
            "(width 2048)",
            [
                Claim.compare(
                    f"batch {b}",
                    big[f"gated_ratio_b{b}"],
                    "<=",
                    1 + HOOK_OVERHEAD_MAX,
                    value_label="time per token / no hook",
                )
                for b in BATCHES
            ],
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gss")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    metrics = {"tiny": tiny(args.repeats, args.tokens), "llama2048": wide(args.repeats, args.tokens)}
    write_benchmark(
        args.out,
        method="gss",
        metrics=metrics,
        claims=claims(metrics),
        config={"repeats": args.repeats, "tokens": args.tokens, "batches": list(BATCHES)},
        started=started,
    )


if __name__ == "__main__":
    main()
