"""`hpd bench` with HPD's timed run repeated, eager against torch.compile'd layer pieces, in one process.

Usage (the arguments are hpd bench's):
    python scripts/compile_ab.py bench --synthetic --random-arch qwen3-8b ... --repeats 1 --out DIR

The question it answers: how much of HPD's time is element-wise work that a compiler fuses. Each
decoder layer's MLP (gate and up projections, activation, product, down projection; on a CPU its
activation and product alone) and its RMS norms are the pieces compiled (``torch.compile(..., dynamic=True)``: one graph for every token
count); attention stays the engine's own (`hpd_core/attention.py`), whose indexing a compiler
would break into pieces anyway. After the baseline's timed run (unchanged), HPD's timed run is
repeated AB_RUNS times per variant (default 3), alternating eager and compiled, and each run's
seconds, the medians and how many prompts' values are identical to the first eager run's are
printed: compiled kernels round bfloat16 differently (float32 intermediates), so values may move.
The first compiled run includes the compilation; the median leaves it in, the best does not.
The bench itself runs with ``--compile-layers off`` (added unless given), so the baseline and the
warm-up are eager and bench.md and bench.json describe the last eager run.

Measured on the 2-core AMD EPYC sandbox (session 33; the README's 96 titles on the default model
with --spans): with two threads, 3 runs each, eager 14.45-17.66 s against compiled 14.19-14.24 s
after a 24 s first run; with `--threads 1`, 4 runs each, eager median 26.81 s against compiled
26.25 s (the runs after the first). Within the noise either way, and 4 of 16 prompts' values
changed. On an H200 (session 34, `gpu_session.sh compile`: the long workload at 512 products,
Qwen3-8B's shape, packed HPD steps), 3 runs each: eager 20.90, 21.77, 21.75 s against compiled
20.29 (the first), 18.35, 18.61 s, medians 21.75 / 18.61 s (1.17x), all 128 prompts' values
identical; hence ``DecodeConfig.compile_layers="auto"``: compiled on CUDA (for models of at least
``config.COMPILE_MIN_BODY_PARAMETERS``), eager on CPUs. Session 36, the same CPU, one thread, the
README's 96 titles with --spans: eager 22.82-23.97 s against compiled 24.29-25.10 s after the first.
Session 44, with the CPU's own pieces (``CompiledLayers.for_device``: the element-wise work alone, the
GELU through sigmoid, calls of 64 tokens or more), which ``auto`` now compiles on a CPU in bf16:
eager 9.45-9.86 s against compiled 8.94-9.15 s after the first, five runs each
(``benchmarks/cpu-compile-ab-s44/``).
"""

from __future__ import annotations

import os
import statistics
import sys

import bench.compare
from hpd_core.compiled import CompiledLayers
from jobs.cli import main

RUNS = int(os.environ.get("AB_RUNS", "3"))


def install() -> None:
    plain = bench.compare.timed

    def timed(name, decoder, workload, device, counter, timing):
        if name != "hpd":
            return plain(name, decoder, workload, device, counter, timing)
        runner = decoder.runner
        own = runner.compiled  # what the decoder's config chose (compile_layers), put back after
        pieces = own if own is not None else CompiledLayers.for_device(runner.body, runner.device)
        runs: dict[str, list] = {"eager": [], "compiled": []}
        last = None
        for i in range(RUNS):
            for variant in ("eager", "compiled") if i % 2 == 0 else ("compiled", "eager"):
                runner.compiled = pieces if variant == "compiled" else None
                result = plain(name, decoder, workload, device, counter, timing)
                runs[variant].append(result)
                print(f"hpd {variant}: {result['seconds']:.2f} s", flush=True)
                if variant == "eager":
                    last = result
        runner.compiled = own
        first = runs["eager"][0]["results"]
        for variant, results in runs.items():
            seconds = [r["seconds"] for r in results]
            same = sum(a == b for a, b in zip(first, results[0]["results"]))
            print(f"hpd {variant}: median {statistics.median(seconds):.2f} s, best {min(seconds):.2f} s "
                  f"over {len(seconds)} runs; prompts identical to the first eager run's: {same}/{len(first)}",
                  flush=True)  # fmt: skip
        return last

    bench.compare.timed = timed


if __name__ == "__main__":
    install()
    argv = sys.argv[1:]
    sys.exit(main(argv if "--compile-layers" in argv else [*argv, "--compile-layers", "off"]))
