"""Benchmark: latency and peak memory per image of MoL's image path against LLaVA's single-layer
selection (the peer) and DenseConnector's channel concat, as ratios to the peer.

    uv run python benchmarks/mol.py                      # -> benchmarks/results/mol/
    uv run python benchmarks/mol.py --sizes toy --repeats 3 --out /tmp/bench

What is timed is everything between the pixels and the language model's input: the frozen vision
tower, the layer selection or mixture, and the projector (``get_image_features`` for the peer and
the concat, transformers' own code; :meth:`MoLLlava.mix` for MoL, whose instruction embedding is
one mean over the prompt's embeddings). The language model then sees the same number of visual
tokens in every system, so its cost is the same and is left out (a 7B LM does not fit here).

Sizes, with random weights built from configs (nothing downloaded):

- ``toy``: the experiment's toy (CLIP width 64, depth 6, 32² at patch 8: 16 tokens + CLS; LM
  width 64), S = 1..5;
- ``llava-1.5``: CLIP ViT-L/14-336 (width 1024, 24 layers, 577 tokens) and LLaVA-1.5-7B's
  projector (1024 → 4096 → 4096), S = every fourth layer and the penultimate (4, 8, ..., 20, 23).

MoL is MoL-hybrid (the experiment's method, image and patch routers) with its routers perturbed
off their initialisation (cost does not depend on the weights). Times are medians of
``--repeats`` rounds after a warm-up, every system called once per round, side by side in one
process, one thread; peak memory is what one more call adds to the resident set after its
warm-up (:func:`mixlab.shared.added_peak_bytes`), per image, each system in its own fresh process
with every allocation above 64 KiB its own mapping (so freed memory is not reused unseen).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from mixlab.shared import Claim, added_peak_bytes
from mixlab.shared.result import write_benchmark
from mixlab.shared.stats import median_seconds

SIZES = ("toy", "llava-1.5")
SYSTEMS = ("LLaVA single layer", "DenseConnector concat", "MoL-hybrid")
MOL_MAX = 1.10
"""claim: MoL's image path takes at most this x the single-layer path's time (the mixture runs
on states the tower computes anyway; only |S| LayerNorms, a weighted sum and routers are added)"""


def build(size: str):
    """(LLaVA config, candidate layers) of ``size``."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    if size == "toy":
        from mixlab.attention_arch.mol.toy import ToySpec, toy_config, toy_tokenizer

        return toy_config(ToySpec(), toy_tokenizer()), [1, 2, 3, 4, 5]
    vision = CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                              num_attention_heads=16, image_size=336, patch_size=14,
                              projection_dim=768)  # fmt: skip
    text = LlamaConfig(hidden_size=4096, num_hidden_layers=1, num_attention_heads=32,
                       intermediate_size=64, vocab_size=32064)  # fmt: skip
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=32000,
                         vision_feature_layer=-2, vision_feature_select_strategy="default")  # fmt: skip
    return config, [4, 8, 12, 16, 20, 23]


def image_paths(size: str, batch: int):
    """{system: a no-grad call computing the batch's projected visual tokens}."""
    from transformers import LlavaForConditionalGeneration

    from mixlab.attention_arch.mol import MoLLlava
    from mixlab.attention_arch.mol.data import image_token_count

    config, layers = build(size)
    torch.manual_seed(0)
    llava = LlavaForConditionalGeneration(config)  # the LM has one thin layer: it is not timed
    llava.eval()
    vision = config.vision_config
    pixels = torch.randn(batch, 3, vision.image_size, vision.image_size)
    tokens = image_token_count(config)
    input_ids = torch.cat([torch.full((batch, tokens), config.image_token_id),
                           torch.randint(5, config.text_config.vocab_size, (batch, 12))], 1)  # fmt: skip
    mol = MoLLlava.from_llava(llava, layers, granularity="hybrid")
    with torch.no_grad():
        for p in mol.mol.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    projector = llava.model.multi_modal_projector
    concat_projector = torch.nn.Linear(
        vision.hidden_size * len(layers), projector.linear_1.out_features
    )

    def single():
        return llava.model.get_image_features(pixels, vision_feature_layer=-2,
                                              vision_feature_select_strategy="default")  # fmt: skip

    def concat():  # transformers' list vision_feature_layer path with the widened projector
        projector.linear_1, saved = concat_projector, projector.linear_1
        try:
            return llava.model.get_image_features(pixels, vision_feature_layer=layers,
                                                  vision_feature_select_strategy="default")  # fmt: skip
        finally:
            projector.linear_1 = saved

    def mixture():
        return mol.mix(input_ids, pixel_values=pixels)

    calls = dict(zip(SYSTEMS, (single, concat, mixture), strict=True))
    return {name: _no_grad(call) for name, call in calls.items()}, len(layers), tokens


def _no_grad(call):
    def run():
        with torch.no_grad():
            call()

    return run


def fresh_peak_bytes(size: str, batch: int, system: str) -> int:
    """What one warmed-up call of ``system`` adds to the resident set, in a fresh process."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    spec = json.dumps([size, batch, system])
    done = subprocess.run([sys.executable, __file__, "--peak-of", spec], capture_output=True,
                          text=True, env=env, check=True)  # fmt: skip
    return int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=SIZES)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "mol")
    parser.add_argument("--peak-of", help=argparse.SUPPRESS)  # JSON [size, batch, system]
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    if args.peak_of:  # a fresh process measuring one system's peak
        size, batch, system = json.loads(args.peak_of)
        call = image_paths(size, batch)[0][system]
        call()
        print(added_peak_bytes(call))
        return
    started = time.perf_counter()
    metrics: dict[str, dict[str, float | None]] = {}
    candidates = {}
    for size in args.sizes:
        for batch in args.batches:
            calls, n_layers, tokens = image_paths(size, batch)
            candidates[size] = n_layers
            for call in calls.values():
                call()  # warm-up
            seconds = {name: [] for name in calls}
            for _ in range(args.repeats):  # side by side: every system once per round
                for name, call in calls.items():
                    seconds[name].append(median_seconds(call, 1))
            median = {name: sorted(s)[len(s) // 2] for name, s in seconds.items()}
            peaks = {name: fresh_peak_bytes(size, batch, name) for name in calls}
            peer = median["LLaVA single layer"]
            for name in calls:
                metrics[f"{size}, batch {batch}: {name}"] = {
                    "ms_per_image": median[name] * 1e3 / batch,
                    "time_vs_single_layer": median[name] / peer,
                    "peak_mib_per_image": peaks[name] / 2**20 / batch,
                    "visual_tokens": tokens,
                }
            print(f"{size} batch {batch}: " + ", ".join(
                f"{n} {median[n] * 1e3 / batch:.1f} ms/image" for n in calls), flush=True)  # fmt: skip
    claims = [Claim.all_of(
        f"MoL-hybrid's image path takes at most {MOL_MAX}x LLaVA's single-layer path, at every "
        "size and batch (same visual token count)",
        [Claim.compare(key.split(":")[0], row["time_vs_single_layer"], "<=", MOL_MAX,
                       value_label=f"{key.split(':')[0]}: MoL / single-layer time")
         for key, row in metrics.items() if key.endswith("MoL-hybrid")],
    )]  # fmt: skip
    config = {"sizes": args.sizes, "batches": args.batches, "repeats": args.repeats,
              "candidate_layers": candidates, "threads": torch.get_num_threads(),
              "timed": "pixels -> projected visual tokens (the LM's input)", "trained": False}  # fmt: skip
    write_benchmark(args.out, method="mol", metrics=metrics, claims=claims, config=config,
                    started=started)  # fmt: skip


if __name__ == "__main__":
    main()
