"""Benchmark: MoBiQuant's read path on one large linear layer, against dense bf16 and torchao.

    uv run --group bench python benchmarks/mobiquant.py                 # CPU -> benchmarks/results/mobiquant/
    uv run --group bench python benchmarks/mobiquant.py --device cuda   # a GPU (the Triton read)
    uv run python benchmarks/mobiquant.py --experiment full             # also the experiment

One linear layer, ``--in-features`` x ``--out-features`` (default 2048 x 5504, a 1B-class LLM's
MLP), a random bf16 weight sliced by :class:`MoBiLinear` (2 bits x 4 slices, group 128). Side by
side in one process, at batch 1 and 8, bf16 activations, medians of repeats after warm-up:

- ``dense_bf16``: ``nn.Linear`` in bf16, the layer it replaces (the reference of every ratio);
- ``torchao_int8``: torchao's ``Int8WeightOnlyConfig`` on the same layer (what a user would pick
  for an 8-bit weight-only CPU layer; skipped when torchao is not installed: ``--group bench``);
- ``depth_1..4``: MoBiQuant at a fixed depth (2, 4, 6, 8 bits): the 4-bit read goes to PyTorch's
  packed int4 matmul on the CPU (``kernel.pack_int4``), the others unpack and dequantize;
- ``budget_B``: routed-like mixed depths at ``B`` average bits (each token one slice deeper than
  the base with the budget's share, drawn per token), timed over a stream of calls.

Bytes read per token are MEASURED: a dispatch mode records every aten op's inputs that live in
the layer's stored tensors (bit planes, scales, zeros, the packed int4 copy) and counts the union
of the byte ranges touched in each call (so a plane read twice counts once), over 64 calls at
batch 1, divided by the tokens.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mixlab.llm_efficiency.mobiquant import MoBiLinear, SliceSpec
from mixlab.llm_efficiency.mobiquant.layer import depth_plan
from mixlab.shared import Claim
from mixlab.shared.result import write_benchmark

BATCHES = (1, 8)
BUDGETS = (2.5, 3.0, 3.5, 5.0)
SPEC = SliceSpec(bits=2, slices=4, group_size=128)
WITHIN_DENSE = 1.5
"""the 4-bit read must take at most this many times the dense bf16 layer's time (issue 31)"""


class StoredBytes(TorchDispatchMode):
    """Counts the bytes of ``stored`` tensors' storages that aten ops read, per call of the
    layer: the union of the byte ranges of every input view into them."""

    def __init__(self, stored: list[torch.Tensor]) -> None:
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in stored}
        self.ranges: dict[int, list[tuple[int, int]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # an op whose output aliases its input (a slice, a no-op .to) reads nothing itself
        aliased = {t.untyped_storage().data_ptr() for t in tree_leaves(out) if _is_tensor(t)}
        for t in tree_leaves((args, kwargs or {})):
            storage = t.untyped_storage().data_ptr() if _is_tensor(t) else None
            if storage in self.storages and storage not in aliased:
                self.ranges.setdefault(storage, []).extend(_byte_runs(t))
        return out

    def total(self) -> int:
        """The bytes touched since the last :meth:`total` (each byte once)."""
        count = 0
        for intervals in self.ranges.values():
            end_so_far = 0
            for start, end in sorted(intervals):
                count += max(0, end - max(start, end_so_far))
                end_so_far = max(end_so_far, end)
        self.ranges.clear()
        return count


def _byte_runs(t: torch.Tensor) -> list[tuple[int, int]]:
    """The contiguous byte ranges ``[start, end)`` of a (possibly strided) view in its storage:
    dims are merged from the innermost while they are contiguous, then each outer index is one
    run (a slice of rows of several bit planes is one run per plane)."""
    sizes, strides = list(t.shape) or [1], list(t.stride()) or [1]
    while len(sizes) > 1 and strides[-2] == sizes[-1] * strides[-1] and strides[-1] == 1:
        sizes[-2:], strides[-2:] = [sizes[-2] * sizes[-1]], [1]
    run = (sizes.pop() if strides[-1] == 1 else 1) * t.element_size()
    if strides and strides[-1] != 1:
        sizes.append(sizes.pop() if sizes else 1)
    outer = strides[: len(sizes)]
    starts = [t.storage_offset() * t.element_size()]
    for size, stride in zip(sizes, outer, strict=True):
        starts = [s + i * stride * t.element_size() for s in starts for i in range(size)]
    return [(s, s + run) for s in starts]


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)


def _stored(layer: MoBiLinear) -> list[torch.Tensor]:
    return [
        layer.planes,
        layer.scale,
        layer.zero,
        *(t for pair in layer._int4.values() for t in pair),
    ]


def _median_ms(fn, repeats: int, device: torch.device) -> float:
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _depth_stream(budget: float, tokens: int, seed: int) -> torch.Tensor:
    base, share = depth_plan(budget, SPEC.bits, SPEC.slices)
    draws = torch.rand(tokens, generator=torch.Generator().manual_seed(seed))
    return base + (draws < share).long()


def _torchao_int8(dense: torch.nn.Module) -> torch.nn.Module | None:
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    model = torch.nn.Sequential(copy.deepcopy(dense))
    quantize_(model, Int8WeightOnlyConfig())
    return model


def run(in_features: int, out_features: int, repeats: int, device: torch.device) -> dict:
    torch.manual_seed(0)
    dense = torch.nn.Linear(in_features, out_features, bias=False, dtype=torch.bfloat16)
    dense = dense.to(device)
    layer = MoBiLinear.from_linear(dense, SPEC)
    int8 = _torchao_int8(dense)
    systems = {"dense_bf16": dense, **({"torchao_int8": int8} if int8 is not None else {})}
    metrics: dict[str, dict[str, float | None]] = {}
    calls = 64
    with torch.inference_mode():
        for batch in BATCHES:
            x = torch.randn(batch, in_features, dtype=torch.bfloat16, device=device)
            runs = {name: (lambda x=x, m=m: m(x)) for name, m in systems.items()}
            for d in range(1, SPEC.slices + 1):
                runs[f"depth_{d}"] = lambda x=x, d=d: layer(x, precision=d)
            for budget in BUDGETS:
                stream = _depth_stream(budget, calls * batch, seed=batch).view(calls, batch)

                def routed(x=x, stream=stream) -> None:
                    for depths in stream:
                        layer.token_depth = depths.to(device)
                        layer(x)
                    layer.token_depth = None

                runs[f"budget_{budget:g}"] = routed
            for name, fn in runs.items():
                ms = _median_ms(fn, repeats if not name.startswith("budget") else 3, device)
                if name.startswith("budget"):
                    ms /= calls  # per call
                metrics.setdefault(name, {})[f"ms_batch{batch}"] = ms
        for row in metrics.values():
            for batch in BATCHES:
                row[f"time_vs_dense_batch{batch}"] = (
                    row[f"ms_batch{batch}"] / metrics["dense_bf16"][f"ms_batch{batch}"]
                )
        # bytes of stored weight read per token, measured at batch 1
        x = torch.randn(1, in_features, dtype=torch.bfloat16, device=device)
        weights = in_features * out_features
        for d in range(1, SPEC.slices + 1):
            layer(x, precision=d)  # the packed int4 copy exists before counting
            with StoredBytes(_stored(layer)) as counter:
                layer(x, precision=d)
            metrics[f"depth_{d}"].update(_bytes_row(counter.total(), d * SPEC.bits, weights))
        for budget in BUDGETS:
            stream = _depth_stream(budget, calls, seed=0)
            counted = 0
            for depths in stream.view(calls, 1):
                layer.token_depth = depths.to(device)
                with StoredBytes(_stored(layer)) as counter:
                    layer(x)
                counted += counter.total()
            layer.token_depth = None
            bits = float(stream.float().mean()) * SPEC.bits
            metrics[f"budget_{budget:g}"].update(_bytes_row(counted / calls, bits, weights))
        with StoredBytes([dense.weight]) as counter:
            dense(x)
        metrics["dense_bf16"].update(_bytes_row(counter.total(), 16, weights))
        if "torchao_int8" in metrics:  # its weight is a tensor subclass: not counted
            metrics["torchao_int8"].update(dict.fromkeys(_bytes_row(0, 16, 1)))
    return metrics


def _bytes_row(measured: float, code_bits: float, weights: int) -> dict[str, float]:
    """Measured bytes per token, the code bits the tokens read, and the measured bytes less the
    group metadata (fp16 scale + zero per group) over ``weights * code_bits / 8``: 1 when the
    bytes read are exactly the codes' bits."""
    metadata = 4 * weights / SPEC.group_size if code_bits < 16 else 0.0
    return {
        "bytes_per_token": measured,
        "code_bits": code_bits,
        "code_bytes_per_bit": (measured - metadata) / weights / code_bits * 8,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-features", type=int, default=2048)
    parser.add_argument("--out-features", type=int, default=5504)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--experiment", choices=("quick", "full"), default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mobiquant"))
    args = parser.parse_args()
    if args.in_features % SPEC.group_size or args.out_features % 16:
        raise SystemExit(
            f"--in-features must be a multiple of {SPEC.group_size} and --out-features of 16, "
            f"got {args.in_features} and {args.out_features}"
        )
    started = time.perf_counter()
    if args.experiment:
        from mixlab.shared import get_method

        method = get_method("mobiquant")
        config = method.config.from_profile(args.experiment)
        result = method.execute(config, args.out / f"experiment-{args.experiment}", resume=True)
        print(f"experiment: {sum(c.holds for c in result.claims)}/{len(result.claims)} claims hold")
    device = torch.device(args.device)
    metrics = run(args.in_features, args.out_features, args.repeats, device)
    four_bit = metrics["depth_2"]
    claims = [
        Claim.compare(
            f"The 4-bit read at batch 1 takes at most {WITHIN_DENSE}x the dense bf16 layer",
            four_bit["time_vs_dense_batch1"],
            "<=",
            WITHIN_DENSE,
            value_label="depth-2 time / dense bf16 time",
        ),
        Claim.compare(
            "The 4-bit read at batch 1 is faster than torchao's int8 weight-only layer",
            four_bit["ms_batch1"],
            "<",
            metrics["torchao_int8"]["ms_batch1"] if "torchao_int8" in metrics else None,
            value_label="depth-2 ms",
            reference_label="torchao int8 ms",
        ),
    ]
    per_bit = [
        row["code_bytes_per_bit"]
        for name, row in metrics.items()
        if name.startswith(("depth", "budget"))
    ]
    claims.append(
        Claim.compare(
            "Bytes read per token are proportional to the average code bits: measured code "
            "bytes, less the fp16 scale and zero per group, are weights x bits / 8 within 2 % at "
            "every depth and budget",
            max(abs(b - 1) for b in per_bit),
            "<=",
            0.02,
            value_label="largest relative deviation",
        )
    )
    if device.type != "cpu":  # a Triton kernel's loads are not aten ops: the count misses them
        claims[-1] = claims[-1].untested("bytes are counted from aten ops, CPU only")
    config = {
        "in_features": args.in_features,
        "out_features": args.out_features,
        "spec": "2 bits x 4 slices, group 128",
        "dtype": "bfloat16",
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "device": str(device),
        "torchao": _torchao_version(),
    }
    write_benchmark(
        args.out, method="mobiquant", metrics=metrics, claims=claims, config=config,
        started=started, device=device,
    )  # fmt: skip
    for system, row in metrics.items():
        ratios = "  ".join(f"b{b}: {row[f'time_vs_dense_batch{b}']:.2f}x" for b in BATCHES)
        print(f"{system:13s} {row['ms_batch1']:8.2f} ms  {ratios}  "
              f"bytes/token {(row['bytes_per_token'] or 0) / 2**20:.2f} MiB")  # fmt: skip


def _torchao_version() -> str | None:
    try:
        import torchao
    except ImportError:
        return None
    return torchao.__version__


if __name__ == "__main__":
    main()
