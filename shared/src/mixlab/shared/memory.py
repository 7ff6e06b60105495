"""Peak memory of one call: the resident set measured in a fresh Python process (CPU, Linux), or
the CUDA caching allocator's peak (``device`` a CUDA device).

A method's profiling module runs as ``python -m <module> '<json specs>'`` and, for each spec,
calls :func:`added_peak_bytes` around the work it measures: after a warm-up call the peak
resident set (VmHWM) is reset to the current one, and the peak after one more call minus the
resident set before it is what the call added. :func:`measure_in_fresh_process` starts that
process with every allocation above 64 KiB as its own mapping (``MALLOC_MMAP_THRESHOLD_``), so
freed memory returns to the system and one measurement leaves nothing for the next to reuse
unseen; below a few MiB the figure is noise. On CUDA, :func:`reset_peak`, :func:`current_bytes`
and :func:`peak_bytes` read ``torch.cuda``'s allocator statistics (``reset_peak_memory_stats``,
``memory_allocated``, ``max_memory_allocated``) after synchronizing, so the figure is what the
tensors took, whatever process it runs in.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss_bytes() -> int:
    """This process's peak resident set since start or the last :func:`reset_peak_rss`."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _cuda(device: Any) -> bool:
    """True for a CUDA device (a torch.device, "cuda", "cuda:N" or an index)."""
    if device is None:
        return False
    return isinstance(device, int) or str(device).startswith("cuda")


def reset_peak(device: Any = None) -> None:
    """Start a new peak: of the resident set (no ``device``, or a CPU one), else of the CUDA
    allocator on ``device``."""
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    elif not reset_peak_rss():  # else the peak of importing torch (or of the last probe) hides it
        raise RuntimeError("cannot reset the peak resident set (/proc/self/clear_refs)")


def current_bytes(device: Any = None) -> int:
    """What is in use now: the resident set, or the bytes of live CUDA tensors on ``device``."""
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return peak_rss_bytes()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def peak_bytes(device: Any = None) -> int:
    """The peak since the last :func:`reset_peak` (or the start) on ``device``."""
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return peak_rss_bytes()


def added_peak_bytes(call: Callable[[], Any], device: Any = None) -> int:
    """Peak memory that one more ``call()`` adds (resident set, or on a CUDA ``device`` the
    allocator's); warm ``call`` up first (thread pools, kernels, lazily built buffers), and free
    what the warm-up kept (gradients) before this."""
    gc.collect()
    reset_peak(device)
    before = current_bytes(device)
    call()
    return max(0, peak_bytes(device) - before)


def measure_in_fresh_process(module: str, specs: list[Any], *, timeout: float = 1800) -> list[Any]:
    """Run ``python -m module '<specs as JSON>'`` in a fresh process with the allocator set for
    measuring, and return the JSON list its last line of output prints (one entry per spec)."""
    env = {
        **os.environ,
        # Every allocation above 64 KiB is its own mapping, returned to the system when freed, so
        # one measurement leaves no resident heap for the next to reuse unseen.
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "MALLOC_TRIM_THRESHOLD_": "0",
    }
    done = subprocess.run(
        [sys.executable, "-m", module, json.dumps(specs)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory probe {module} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
