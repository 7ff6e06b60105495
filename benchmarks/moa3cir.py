"""Benchmark: query encoding, gallery indexing and search latency of MoA3CIR against CLIP4Cir's
combiner (the peer) on the same towers, as ratios measured in one run.

    uv run python benchmarks/moa3cir.py                 # -> benchmarks/results/moa3cir/
    uv run python benchmarks/moa3cir.py --repeats 3 --out /tmp/bench

Towers (random weights, built from config): the quick experiment's tiny CLIP (width 128, 32²,
64 patches) and open_clip's ViT-B-32 at 224². Query encoding (batch 1 and 64): MoA3CIR runs three
towers (reference image, its description, the modification) and one MoA³ block over their
tokens; the combiner runs two towers and its MLP. Indexing: MoA3CIR embeds each item's image and
description, the combiner its image; the tiny towers index 10^5 items in full, ViT-B-32 a
512-item sample (reported per item). Search: one query's top 10 over 10^5 gallery embeddings
(both systems hold E-dimensional embeddings: the same matrix product, one figure, ms per query). Times: the median of
``--repeats`` calls, the two systems interleaved, one thread.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark
from mixlab.shared.stats import interleaved_median_seconds
from mixlab.vision_mm.moa3cir.model import CIRModel, Combiner, MoA3CIR, RetrievalIndex
from mixlab.vision_mm.moa3cir.towers import ClipTowers, tiny_clip

GALLERY = 100_000
QUERY_LIMIT = 2.5
"""MoA3CIR encodes one tower more than the combiner and attends over all three towers' tokens:
its query must stay within 2.5× the combiner's time"""
INDEX_LIMIT = 2.5
"""... and each gallery item adds its description to the image"""


def _towers(name: str) -> ClipTowers:
    torch.manual_seed(0)
    if name == "tiny":
        return ClipTowers(tiny_clip())
    import open_clip

    return ClipTowers(open_clip.create_model("ViT-B-32", pretrained=None))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/moa3cir"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    started = time.perf_counter()
    rows: dict[str, dict[str, float | None]] = {}
    for towers_name in ("tiny", "vit-b-32"):
        towers = _towers(towers_name).eval()
        embed = towers.embed_dim
        models = {
            "moa3cir": MoA3CIR(
                towers, dim=min(256, towers.text_width), heads=16, groups=4, shared_heads=4
            ).eval(),
            "combiner": CIRModel(towers, Combiner(embed, 4 * embed, 8 * embed)).eval(),
        }
        size = towers.image_size
        for batch in (1, 64):
            images = torch.rand(batch, 3, size, size)
            texts = ["make it blue with dots"] * batch
            descriptions = ["a short red striped cotton tee"] * batch

            def encode(model, images=images, texts=texts, descriptions=descriptions):
                with torch.no_grad():
                    model.encode_query(images, texts, descriptions)

            times = interleaved_median_seconds(
                {k: (lambda m=m: encode(m)) for k, m in models.items()}, args.repeats
            )
            for kind, seconds in times.items():
                rows[f"{towers_name}/query-b{batch}/{kind}"] = {"ms_per_item": 1e3 * seconds / batch,
                                                                "vs_combiner": seconds / times["combiner"]}  # fmt: skip
        count = GALLERY if towers_name == "tiny" else 512
        gallery = torch.rand(256, 3, size, size)  # reused: the cost does not depend on the pixels
        descriptions = [f"a {k} item with its description" for k in range(256)]

        def index(model, count=count, gallery=gallery, descriptions=descriptions):
            for start in range(0, count, 256):
                n = min(256, count - start)
                model.build_index(gallery[:n], None, descriptions[:n])

        # the query timings above warmed both models; a whole index is timed once
        times = interleaved_median_seconds(
            {k: (lambda m=m: index(m)) for k, m in models.items()}, 1, warmup=False
        )
        for kind, seconds in times.items():
            rows[f"{towers_name}/index-{count}/{kind}"] = {"ms_per_item": 1e3 * seconds / count,
                                                           "vs_combiner": seconds / times["combiner"]}  # fmt: skip
    # search: both systems hold E-dimensional normalised embeddings, so one figure serves both
    searched = RetrievalIndex(torch.nn.functional.normalize(torch.randn(GALLERY, 128), dim=-1),
                              [str(i) for i in range(GALLERY)])  # fmt: skip
    query = torch.nn.functional.normalize(torch.randn(1, 128), dim=-1)
    seconds = interleaved_median_seconds(
        {"search": lambda: searched.search(query, 10)}, args.repeats
    )["search"]
    rows[f"tiny/search-{GALLERY}/both"] = {"ms_per_item": 1e3 * seconds, "vs_combiner": None}
    for name, row in rows.items():
        print(f"{name}: {row}")
    claims = [
        Claim.compare(f"MoA3CIR's query encoding with ViT-B-32 towers, batch {b}, takes <= {QUERY_LIMIT:g}× the "
                      "combiner's", rows[f"vit-b-32/query-b{b}/moa3cir"]["vs_combiner"], "<=", QUERY_LIMIT,
                      value_label="MoA3CIR / combiner seconds")
        for b in (1, 64)
    ]  # fmt: skip
    claims.append(Claim.compare(
        f"Indexing with descriptions (ViT-B-32 towers) takes <= {INDEX_LIMIT:g}× the image-only index",
        rows["vit-b-32/index-512/moa3cir"]["vs_combiner"], "<=", INDEX_LIMIT, value_label="MoA3CIR / combiner seconds",
    ))  # fmt: skip
    write_benchmark(args.out, method="moa3cir", metrics=rows, claims=claims,
                    config={"repeats": args.repeats, "gallery": GALLERY, "threads": 1,
                            "towers": ["tiny (width 128, 32²)", "ViT-B-32 (224²)"], "moa3_heads": 16,
                            "groups": 4, "shared_heads": 4},
                    started=started)  # fmt: skip


if __name__ == "__main__":
    main()
