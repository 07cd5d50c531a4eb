"""`hpd bench` with HPD's timed run repeated, eager against torch.compile'd layer pieces, in one process.

Usage (the arguments are hpd bench's):
    python scripts/compile_ab.py bench --synthetic --random-arch qwen3-8b ... --repeats 1 --out DIR

The question it answers: how much of HPD's time is element-wise work that a compiler fuses. Each
decoder layer's MLP (gate and up projections, activation, product, down projection) and its RMS
norms are the pieces compiled (``torch.compile(..., dynamic=True)``: one graph for every token
count); attention stays the engine's own (`hpd_core/attention.py`), whose indexing a compiler
would break into pieces anyway. After the baseline's timed run (unchanged), HPD's timed run is
repeated AB_RUNS times per variant (default 3), alternating eager and compiled, and each run's
seconds, the medians and how many prompts' values are identical to the first eager run's are
printed: compiled kernels round bfloat16 differently (float32 intermediates), so values may move.
The first compiled run includes the compilation; the median leaves it in, the best does not.
bench.md and bench.json describe the last eager run (the model is left eager).

Measured on the 2-core AMD EPYC sandbox (session 33; the README's 96 titles on the default model
with --spans): with two threads, 3 runs each, eager 14.45-17.66 s against compiled 14.19-14.24 s
after a 24 s first run; with `--threads 1`, 4 runs each, eager median 26.81 s against compiled
26.25 s (the runs after the first). Within the noise either way, and 4 of 16 prompts' values
changed. Not kept on the CPU; on a GPU it is still to measure (`gpu_session.sh compile`).
"""

from __future__ import annotations

import os
import statistics
import sys
import types

import torch

import bench.compare
from jobs.cli import main

RUNS = int(os.environ.get("AB_RUNS", "3"))


def layers(model):
    inner = model.model if hasattr(model, "model") else model
    return inner.layers


class Pieces:
    """Each layer's MLP and RMS norms, with their eager forwards kept to switch back."""

    def __init__(self, model):
        self.modules = []
        for layer in layers(model):
            for name, module in layer.named_children():
                if name == "mlp" or name.endswith("norm"):
                    self.modules.append(module)
            attn = getattr(layer, "self_attn", None)
            for name in ("q_norm", "k_norm"):  # Qwen3, Gemma 3
                if attn is not None and getattr(attn, name, None) is not None:
                    self.modules.append(getattr(attn, name))
        self.eager = [m.forward for m in self.modules]
        self.compiled = [torch.compile(f, dynamic=True) for f in self.eager]

    def use(self, compiled: bool) -> None:
        for module, eager, fast in zip(self.modules, self.eager, self.compiled):
            module.forward = fast if compiled else eager


def install() -> None:
    plain = bench.compare.timed
    pieces: dict[int, Pieces] = {}

    def timed(name, decoder, workload, device, counter, timing):
        if name != "hpd":
            return plain(name, decoder, workload, device, counter, timing)
        model = decoder.runner.model
        p = pieces.setdefault(id(model), Pieces(model))
        runs: dict[str, list] = {"eager": [], "compiled": []}
        last = None
        for i in range(RUNS):
            for variant in ("eager", "compiled") if i % 2 == 0 else ("compiled", "eager"):
                p.use(variant == "compiled")
                result = plain(name, decoder, workload, device, counter, timing)
                runs[variant].append(result)
                print(f"hpd {variant}: {result['seconds']:.2f} s", flush=True)
                if variant == "eager":
                    last = result
        p.use(False)
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
    sys.exit(main(sys.argv[1:]))
