"""Peak resident memory of one call, measured in a fresh Python process (CPU, Linux).

A method's profiling module runs as ``python -m <module> '<json specs>'`` and, for each spec,
calls :func:`added_peak_bytes` around the work it measures: after a warm-up call the peak
resident set (VmHWM) is reset to the current one, and the peak after one more call minus the
resident set before it is what the call added. :func:`measure_in_fresh_process` starts that
process with every allocation above 64 KiB as its own mapping (``MALLOC_MMAP_THRESHOLD_``), so
freed memory returns to the system and one measurement leaves nothing for the next to reuse
unseen; below a few MiB the figure is noise.
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


def added_peak_bytes(call: Callable[[], Any]) -> int:
    """Peak resident memory that one more ``call()`` adds; warm ``call`` up first (thread pools,
    kernels, lazily built buffers), and free what the warm-up kept (gradients) before this."""
    gc.collect()
    if not reset_peak_rss():  # else the peak of importing torch (or of the last probe) hides it
        raise RuntimeError("cannot reset the peak resident set (/proc/self/clear_refs)")
    before = peak_rss_bytes()
    call()
    return max(0, peak_rss_bytes() - before)


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
