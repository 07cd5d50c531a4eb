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
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

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
        with profile(activities=activities) as prof:
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


if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--profile-out":
        sys.exit(__doc__)
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    profiled(out)
    sys.exit(main(argv[2:]))
