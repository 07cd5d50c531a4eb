"""`hpd bench` with each decoder's timed runs under torch.profiler: where a GPU step's time goes.

Usage (the arguments are hpd bench's, plus --profile-out DIR):
    python scripts/gpu_profile.py --profile-out OUT bench --synthetic --random-arch qwen3-8b ...

Only HPD's timed runs are profiled unless PROFILE_DECODERS=hpd,ar: on an H200 (Qwen3-8B, long
products) the profiled baseline run, which comes first, wrote nothing within 120 s at 64 products
nor within 170 s at 16. For each profiled decoder it writes DIR/profile-NAME.txt: the wall seconds
of the profiled run, the GPU's busy seconds (the kernels' own time summed), and the operators by
their own GPU time and by their own CPU time. Wall time well above GPU busy time means the host (Python, kernel launches,
synchronisation) is what the GPU waits for. The profiler slows the host a little, so take the
timings from a plain `hpd bench` run and only the shares from this one.

With SYNCS=1 the profiled run also runs under ``torch.cuda.set_sync_debug_mode("warn")``, which
warns at every operation that makes the host wait for the GPU, and DIR/syncs-NAME.txt counts them
by the engine's (or transformers') line that called the operation: the session 34 profile of HPD at
512 long products counted 17,906 stream synchronisations in 62 forward passes, far more than the
step loop's few reads a step, from places not yet known.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile

import bench.compare
from jobs.cli import main

ROWS = 30


def profiled(out: Path):
    plain = bench.compare.timed

    names = set(os.environ.get("PROFILE_DECODERS", "hpd").split(","))

    def timed(name, decoder, workload, device, counter, timing):
        if name not in names:
            return plain(name, decoder, workload, device, counter, timing)
        print(f"profiling {name}", flush=True)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
        start = time.perf_counter()
        with profile(activities=activities) as prof, sync_sites(out / f"syncs-{name}.txt", device):
            result = plain(name, decoder, workload, device, counter, timing)
        wall = time.perf_counter() - start
        events = prof.key_averages()
        gpu_us = sum(e.self_device_time_total for e in events)
        lines = [
            f"{name}: wall {wall:.3f} s under the profiler ({result['seconds']:.3f} s timed), "
            f"GPU busy {gpu_us / 1e6:.3f} s (kernels' own time summed), forward passes {result['counts']['calls']}",
            "",
            "by own GPU time:",
            events.table(sort_by="self_device_time_total", row_limit=ROWS, max_name_column_width=60),
            "by own CPU time:",
            events.table(sort_by="self_cpu_time_total", row_limit=ROWS, max_name_column_width=60),
        ]
        (out / f"profile-{name}.txt").write_text("\n".join(lines))
        print(lines[0], flush=True)
        return result

    bench.compare.timed = timed


@contextmanager
def sync_sites(path: Path, device: str) -> Iterator[None]:
    """With SYNCS=1 on CUDA: count the host-device synchronisations inside the block by the
    innermost line of the engine (hpd_core/), else of transformers or torch.nn, that led to them,
    and write the counts to ``path``."""
    if os.environ.get("SYNCS") != "1" or not device.startswith("cuda"):
        yield
        return
    sites: Counter = Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack() if not f.filename.endswith(("warnings.py", "gpu_profile.py"))]
        mine = [f for f in frames if "hpd_core" in f.filename] or [
            f for f in frames if "transformers" in f.filename or "torch/nn" in f.filename
        ] or frames
        f = mine[-1]
        sites[f"{Path(f.filename).name}:{f.lineno} {f.line}".strip()] += 1

    warnings.showwarning = record
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            yield
    finally:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = shown
        lines = [f"{n:8d}  {site}" for site, n in sites.most_common()]
        path.write_text(f"host-device synchronisations: {sum(sites.values())}, by calling line\n" + "\n".join(lines) + "\n")
        print(f"{sum(sites.values())} synchronisations, {len(sites)} sites: {path}", flush=True)


if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--profile-out":
        sys.exit(__doc__)
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    profiled(out)
    sys.exit(main(argv[2:]))
