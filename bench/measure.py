"""`hpd bench` measurement of one decoder run: wall and CPU time, forward passes, peak memory; and
the measured matmul speed that the per-product floor is computed from.

Forward passes are counted from what the engine's runner reports of each (``ModelRunner.passed``),
so both decoders are counted by the same code, graph replays included. Peak device memory is reset
before each run; peak host memory is the process RSS sampled during the run (it includes the model
weights).
"""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from bench.decoders import decode
from bench.workload import Workload


@dataclass(frozen=True)
class TimingConfig:
    """How each decoder is timed."""

    warmup_requests: int = 1
    repeats: int = 1
    memory_sample_s: float = 0.01  # host RSS sampling interval
    matmul_size: int = 0  # the floor's matmul speed: square matmul size; 0 = 8192 on CUDA, 1024 on CPU

    def __post_init__(self) -> None:
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.matmul_size < 0:
            raise ValueError(f"matmul_size must be >= 0, got {self.matmul_size}")


class PassCounter:
    """Counts forward passes, prefills, rows and tokens fed, as the engine's runner reports them.

    Every forward says what it is (``ModelRunner.passed``: a shared prefix's prefill, a batch's
    prefill of newly admitted rows, or a decode step, also one replayed from a CUDA graph, which no
    module hook would see): ``calls`` counts prefills and steps, ``prefills`` / ``prefill_rows`` the
    prefill forwards and the rows they started, and ``prefix_prefills`` the shared prefixes computed
    (once per category, then reused). ``listening(runner)`` attaches it for one run.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.calls = self.prefills = self.prefill_rows = self.tokens_fed = self.prefix_prefills = 0

    def heard(self, kind: str, tokens: int, rows: int) -> None:
        if kind == "prefix":
            self.prefix_prefills += 1
            return
        self.calls += 1
        self.tokens_fed += tokens
        if kind == "prefill":
            self.prefills += 1
            self.prefill_rows += rows

    @contextmanager
    def listening(self, runner) -> Iterator["PassCounter"]:
        runner.listeners.append(self.heard)
        try:
            yield self
        finally:
            runner.listeners.remove(self.heard)


@contextmanager
def pass_counters(models: dict) -> Iterator[dict[str, PassCounter]]:
    """{decoder name: counter}; each listens to its decoder's runner only while ``timed`` runs it."""
    yield {name: PassCounter() for name in models}


class PeakRSS:
    """Peak resident memory of this process while the block runs (sampled in a thread)."""

    def __init__(self, interval_s: float):
        import psutil

        self.process = psutil.Process()
        self.interval_s = interval_s
        self.peak = 0

    def _sample(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self):
        self.peak = self.process.memory_info().rss
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def timed(name: str, decoder, workload: Workload, device: str, counter: PassCounter, timing: TimingConfig) -> dict:
    """One full decode: wall seconds, process CPU seconds (all threads; less sensitive than wall
    time to other processes on a shared machine), results, pass counts, peak host/device bytes."""
    import torch

    if getattr(decoder, "prefixes", None) is not None:
        decoder.prefixes.clear()  # every run prefills its categories' shared prefixes itself
    _free(device)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    counter.reset()
    graphs, sessions = dict(decoder.runner.graphs), dict(decoder.runner.sessions)
    with PeakRSS(timing.memory_sample_s) as rss:
        _sync(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        with counter.listening(decoder.runner):
            results = decode(name, decoder, workload)
        _sync(device)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "results": results,
        "counts": dict(calls=counter.calls, prefills=counter.prefills, prefill_rows=counter.prefill_rows,
                       tokens_fed=counter.tokens_fed, prefix_prefills=counter.prefix_prefills,
                       graphs_captured=decoder.runner.graphs["captured"] - graphs["captured"],
                       graphs_failed=decoder.runner.graphs["failed"] - graphs["failed"],
                       fixed_batches=decoder.runner.sessions["fixed"] - sessions["fixed"],
                       packed_batches=decoder.runner.sessions["packed"] - sessions["packed"]),  # fmt: skip
        "host_peak": rss.peak,
        "device_peak": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
    }


def matmul_flops(device: str, dtype: str, size: int, windows: int = 3) -> float:
    """Measured dense matmul throughput (FLOP/s) at the run's dtype and device: the best of
    ``windows`` windows of at least a second. On a shared VM consecutive windows varied 2x (a 2-vCPU
    Xeon, one thread, session 28: 0.55 to 1.04 TFLOP/s); the best is what the hardware can do, so
    the floor built on it is not flattered by a slow moment."""
    import torch

    from hpd_core.models import torch_dtype

    n = size or (8192 if device.startswith("cuda") else 1024)
    a = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
    b = torch.randn(n, n, device=device, dtype=torch_dtype(dtype))
    for _ in range(3):
        a @ b
    _sync(device)
    best = 0.0
    for _ in range(windows):
        iters, start = 0, time.perf_counter()
        while iters < 5 or time.perf_counter() - start < 1.0:
            a @ b
            iters += 1
            if iters % 5 == 0:
                _sync(device)
        _sync(device)
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best
