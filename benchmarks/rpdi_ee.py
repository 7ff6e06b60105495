"""Benchmark: what RPDI's exit costs per token, and wall time per problem against the probing
exits, side by side in one process.

    uv run python benchmarks/rpdi_ee.py                      # -> benchmarks/results/rpdi_ee/
    uv run python benchmarks/rpdi_ee.py --out /tmp/bench --tokens 32

Two models, batch 1 and 8, sampled with the same seed, the same prompts for every system:

1. ``toy``: the reasoning toy of ``mixlab run rpdi_ee`` (cached; trained on first use). Per
   problem wall time and forward tokens (generated + probes) of plain ``generate`` (vanilla),
   RPDI (W 4, lambda 2, step boundaries: what the experiment's validation picks), DEER-style
   (theta 0.95 at "wait "/"hmm ") and EAT-style (a probe every 8 tokens, delta 0.01), at the
   experiment's temperature 0.7: each method exits where it decides, so this is the end-to-end
   cost a user sees.
2. ``llama150k``: a random-init Llama (hidden 256, 2 layers, a 151,936-token vocabulary as
   Qwen's) generating ``--tokens`` tokens from random prompts with exits that never fire, so
   every system decodes the same tokens (sampled at temperature 1): the cost of the decision
   alone. RPDI (lambda = inf)
   against plain ``generate``: the overhead per token; DEER-style probes whenever a row writes
   one of 1 in 64 of the ids (about one probe per 64 tokens; theta = 1 never exits) and
   EAT-style every 32 tokens (delta tiny).

Times are medians over ``--repeats`` runs after one warm-up; ratios are to plain ``generate``
in the same run.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from mixlab.llm_efficiency.rpdi_ee import (
    DEERExitProcessor,
    EATExitProcessor,
    RPDIExitProcessor,
    generate_all,
    make_processor,
)
from mixlab.shared import Claim, median_seconds
from mixlab.shared.result import write_benchmark

BATCHES = (1, 8)
OVERHEAD_MAX = 0.10
"""claim: RPDI adds at most 10 % per token to plain generate"""


def toy_timings(repeats: int, n_problems: int) -> dict[str, dict[str, float]]:
    from mixlab.llm_efficiency.reasoning import pretrained_reasoning_lm, problems
    from mixlab.llm_efficiency.rpdi_ee.config import Config
    from mixlab.llm_efficiency.rpdi_ee.experiment import ANSWER_PROMPT, TRANSITIONS

    model, tokenizer = pretrained_reasoning_lm(Config().lm_config())
    prompts = [p.model_input for p in problems(n_problems, 7)]
    systems = {
        "vanilla": ("vanilla", {}),
        "rpdi": ("rpdi", {"window": 4, "threshold": 2.0, "check_at": ["."]}),
        "deer": ("deer", {"threshold": 0.95}),
        "eat": ("eat", {"interval": 8, "threshold": 0.01}),
    }
    metrics = {f"toy_{name}": {} for name in systems}
    for batch in BATCHES:
        for name, (method, params) in systems.items():
            rows: list = []

            def run(method=method, params=params, batch=batch, rows=rows):
                rows[:] = generate_all(
                    model,
                    tokenizer,
                    prompts,
                    lambda: make_processor(
                        method,
                        params,
                        model,
                        tokenizer,
                        answer_prompt=ANSWER_PROMPT,
                        transitions=TRANSITIONS,
                    ),
                    batch_size=batch,
                    max_new_tokens=256,
                    temperature=0.7,
                )

            seconds = median_seconds(run, repeats)
            row = metrics[f"toy_{name}"]
            row[f"s_per_problem@b{batch}"] = seconds / len(prompts)
            row[f"forward_tokens@b{batch}"] = sum(r["forward_tokens"] for r in rows) / len(rows)
            row[f"probe_tokens@b{batch}"] = sum(r["probe_tokens"] for r in rows) / len(rows)
    return metrics


def large_vocab_timings(repeats: int, tokens: int) -> dict[str, dict[str, float]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = 151_936
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    end = [vocab - 1]
    transitions = [[i] for i in range(0, vocab, 64)]
    factories = {
        "vanilla": lambda: None,
        "rpdi": lambda: RPDIExitProcessor(end, window=512, threshold=math.inf),
        "deer": lambda: DEERExitProcessor(model, end, transition_ids=transitions, threshold=1.0),
        "eat": lambda: EATExitProcessor(model, end, interval=32, threshold=1e-30),
    }
    metrics = {f"llama150k_{name}": {} for name in factories}
    for batch in BATCHES:
        prompt = torch.randint(
            0, vocab - 1, (batch, 32), generator=torch.Generator().manual_seed(1)
        )
        for name, factory in factories.items():
            procs: list = []

            def run(factory=factory, prompt=prompt, procs=procs):
                proc = factory()
                torch.manual_seed(0)
                with torch.no_grad():
                    model.generate(
                        prompt,
                        max_new_tokens=tokens,
                        min_new_tokens=tokens,
                        do_sample=True,
                        top_k=0,
                        logits_processor=[] if proc is None else [proc],
                        pad_token_id=0,
                    )
                if hasattr(proc, "close"):
                    proc.close()
                procs[:] = [proc]

            seconds = median_seconds(run, repeats)
            row = metrics[f"llama150k_{name}"]
            row[f"ms_per_token@b{batch}"] = 1e3 * seconds / tokens
            probes = procs[0].probe_tokens if procs[0] is not None else [0] * batch
            row[f"probe_tokens@b{batch}"] = sum(probes) / batch
    return metrics


def _ratios(metrics: dict[str, dict[str, float]], prefix: str, key: str) -> None:
    base = metrics[f"{prefix}_vanilla"]
    for system, row in metrics.items():
        if system.startswith(prefix):
            for batch in BATCHES:
                row[f"time_ratio_to_generate@b{batch}"] = (
                    row[f"{key}@b{batch}"] / base[f"{key}@b{batch}"]
                )


def claims(metrics: dict[str, dict[str, float]]) -> list[Claim]:
    out = []
    for batch in BATCHES:
        out.append(
            Claim.compare(
                f"RPDI adds at most {OVERHEAD_MAX:.0%} per token to plain generate on a "
                f"150k-vocabulary Llama at batch {batch} (no exit fires)",
                metrics["llama150k_rpdi"][f"time_ratio_to_generate@b{batch}"],
                "<=",
                1 + OVERHEAD_MAX,
                value_label="RPDI / generate time",
            )
        )
        out.append(
            Claim.all_of(
                f"On the reasoning toy at batch {batch}, RPDI's wall time per problem is below "
                "DEER-style's and EAT-style's",
                [
                    Claim.compare(
                        f"vs {rival}",
                        metrics["toy_rpdi"][f"s_per_problem@b{batch}"],
                        "<",
                        metrics[f"toy_{rival}"][f"s_per_problem@b{batch}"],
                        value_label="RPDI s/problem",
                        reference_label=f"{rival}",
                    )
                    for rival in ("deer", "eat")
                ],
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/rpdi_ee"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per 150k-vocab run")
    parser.add_argument("--problems", type=int, default=32, help="toy problems per run")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(2)
    metrics = toy_timings(args.repeats, args.problems)
    _ratios(metrics, "toy", "s_per_problem")
    large = large_vocab_timings(args.repeats, args.tokens)
    _ratios(large, "llama150k", "ms_per_token")
    metrics.update(large)
    columns = sorted({k for row in metrics.values() for k in row})
    metrics = {s: {c: row.get(c) for c in columns} for s, row in metrics.items()}
    write_benchmark(
        args.out,
        method="rpdi_ee",
        metrics=metrics,
        claims=claims(metrics),
        config=vars(args) | {"out": str(args.out), "threads": 2},
        started=started,
    )


if __name__ == "__main__":
    main()
