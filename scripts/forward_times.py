"""`hpd bench` with every forward pass of the timed runs timed: where each decoder's time goes by
kind of forward (shared prefixes, prefills, decode steps) and what is left outside them.

Usage (the arguments are hpd bench's, plus --times-out DIR):
    python scripts/forward_times.py --times-out OUT bench --records ... --repeats 1 --out DIR

For each decoder it writes OUT/forwards-NAME.txt: one line per forward of its last timed run (kind,
tokens fed, cache rows read, milliseconds, milliseconds per token), then per kind the forwards,
tokens and seconds, and the run's seconds outside them all (the host's work between them: span
lookups, stop checks, parsing, batch planning). Two kinds that are not forwards are timed too:
"head", each call of the LM head and the token choice after a forward (tokens: its hidden states;
rows: 0), and "prepare", the decoder's tokenization of the run's requests before any forward
(tokens: the requests). Steps replayed from a CUDA graph are timed as the kind "step-graph", with
the tokens and rows of the pass they repeat (a replayed step's LM head is in it). On CUDA each
of these is synchronised before and after, so its time is the device's and the host's work no
longer overlaps the device's: the run is slower than a plain one, and the split is what to read.

Measured on the 2-core AMD EPYC sandbox (session 43, the README's 96 titles, the default model,
J = 6, one thread): HPD's 11.45 s were 2 shared prefixes (408 tokens) 0.31 s, 12 prefills (9,318
tokens) 7.51 s at 0.75-0.92 ms a token, 14 steps (2,013 tokens) 3.08 s at 1.2-1.3 ms a token for
the first three (424-490 tokens) and 31-114 ms a step for the last eight (1-40 tokens), and 0.55 s
outside the forwards; the floor's tokens take 0.405 ms each at that run's matmul speed.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

import bench.compare
import hpd_core.autoregressive
import hpd_core.engine
import hpd_core.graphs
import hpd_core.runner
from jobs.cli import main


@contextmanager
def installed(out: Path) -> Iterator[None]:
    """Within the block every forward pass is timed and each timed run writes its report to ``out``."""
    forward = hpd_core.runner.ModelRunner.forward
    log: list[tuple[str, int, int, float]] = []

    replay = hpd_core.graphs.StepGraph.__call__

    def timed_forward(self, cache, rows, index, tokens, *args, **kwargs):
        if capturing():  # recorded into a CUDA graph, not run: its replays are timed instead
            return forward(self, cache, rows, index, tokens, *args, **kwargs)
        start = synchronized(tokens.device)
        result = forward(self, cache, rows, index, tokens, *args, **kwargs)
        log.append((kwargs.get("kind", "step"), tokens.numel(), int(torch.unique(rows).numel()),
                    synchronized(tokens.device) - start))  # fmt: skip
        return result

    def timed_replay(graph):
        device = graph.runner.device
        start = synchronized(device)
        replay(graph)
        if graph.graph is not None and graph.captured_pass is not None:  # replayed: the pass it repeats
            kind, tokens, rows = graph.captured_pass
            log.append((f"{kind}-graph", tokens, rows, synchronized(device) - start))

    # the LM head (its methods share one depth: ``logits`` runs inside ``next_tokens``) and each
    # decoder's own ``prepare`` (the bench's HPD decoder subclasses HPDDecoder)
    head_depth = [0]
    patched = [(hpd_core.runner.ModelRunner, name, head_depth, "head")
               for name in ("next_tokens", "allowed_tokens", "logits")]  # fmt: skip
    patched += [(cls, "prepare", [0], "prepare")
                for cls in (hpd_core.engine.HPDDecoder, hpd_core.autoregressive.AutoregressiveDecoder)]  # fmt: skip
    originals = [(cls, name, cls.__dict__[name]) for cls, name, _, _ in patched]
    for (cls, name, depth, kind), (_, _, method) in zip(patched, originals):
        setattr(cls, name, outermost_timed(kind, method, depth, log))

    plain = bench.compare.timed

    def timed(name, decoder, workload, device, counter, timing):
        log.clear()
        result = plain(name, decoder, workload, device, counter, timing)
        (out / f"forwards-{name}.txt").write_text(report(name, list(log), result["seconds"]))
        return result

    hpd_core.runner.ModelRunner.forward, hpd_core.graphs.StepGraph.__call__, bench.compare.timed = timed_forward, timed_replay, timed
    try:
        yield
    finally:
        hpd_core.runner.ModelRunner.forward, hpd_core.graphs.StepGraph.__call__, bench.compare.timed = forward, replay, plain
        for cls, name, method in originals:
            setattr(cls, name, method)


def outermost_timed(kind: str, method, depth: list[int], log: list):
    """``method`` with each call logged as ``kind`` (tokens: the length of its first argument,
    hidden states or requests; rows: 0), unless it runs inside another call sharing ``depth`` or
    while a CUDA graph is being recorded."""

    def wrapper(self, first, *args, **kwargs):
        if depth[0] or capturing():
            return method(self, first, *args, **kwargs)
        device = self.device
        depth[0] += 1
        try:
            start = synchronized(device)
            result = method(self, first, *args, **kwargs)
            log.append((kind, len(first), 0, synchronized(device) - start))
            return result
        finally:
            depth[0] -= 1

    return wrapper


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def synchronized(device) -> float:
    """The time once the device's work so far is done (on CUDA; a CPU's is done already)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def report(name: str, log: list[tuple[str, int, int, float]], seconds: float) -> str:
    """One timed run's forwards, their sums by kind, and the run's time outside them."""
    lines = [f"{name}: one timed run, {seconds:.3f} s; its forwards:",
             f"{'kind':8s} {'tokens':>7s} {'rows':>5s} {'ms':>9s} {'ms/token':>9s}"]  # fmt: skip
    sums: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
    for kind, tokens, rows, s in log:
        lines.append(f"{kind:8s} {tokens:7d} {rows:5d} {s * 1e3:9.1f} {s / max(tokens, 1) * 1e3:9.3f}")
        sums[kind][0] += 1
        sums[kind][1] += tokens
        sums[kind][2] += s
    lines.append("")
    for kind, (n, tokens, s) in sums.items():
        lines.append(f"{kind}: {n} forwards, {tokens} tokens, {s:.3f} s ({s / max(tokens, 1) * 1e3:.3f} ms a token)")
    lines.append(f"outside these: {seconds - sum(s for *_, s in log):.3f} s")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--times-out":
        sys.exit(__doc__)
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with installed(out):
        code = main(argv[2:])
    sys.exit(code)
