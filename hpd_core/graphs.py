"""Fixed-shape decode steps replayed from a CUDA graph (``DecodeConfig.cuda_graphs``).

A fixed-shape step (``step_shape="fixed"``, engine.HPDSession.fixed_step and
autoregressive.ARSession.fixed_step) reads and writes only tensors its session allocated once (the
``RowCache``, the slot tables), has the same shapes every step and reads nothing back to the host.
Its kernels can then be recorded once per session and replayed: one launch per step instead of
one per operator, so the host stops being the bound. (On an H200, session 21: a baseline step of
64 rows took 37 ms where reading the weights takes about 4 ms, and process CPU time equalled wall
time.)

``StepGraph`` runs the step eagerly ``warmup`` times (lazy allocations, library handles), records
the next call as a graph and replays it, then replays for every later step. The session refills
rows between steps (prefills, new slot tables) by writing into the same tensors in place, which the
graph reads at replay. Python side effects of the step happen once, at the capture: the counters
of the forward pass are replayed through ``ModelRunner.passed``, and what the host does after a step
stays outside the graph (``Session.after_fixed_step``). Greedy decoding only (sampling would need
the generator registered with the graph), and no step that needs the host: span decoding (a round
trip per step), the baseline's teacher forcing and recorded logits (test tools). HPD's teacher
forcing (``hpd bench --synthetic``) reads a tensor and is recorded like free decoding. The eager
step is the reference: tests/hpd_core/test_graphs.py checks, on CUDA, that both give the same
tokens and pass counts.

The capture runs with CUDA's thread-local error mode and Python's garbage collector paused, so that
another thread (the parser, the tokenizer of the next batch) or a collection freeing CUDA memory
cannot invalidate it. If it fails anyway (on an H200, session 28, one capture of about fifteen in
the GPU tests failed with "operation failed due to a previous error during capture", before both
guards), the failure is logged and counted (``ModelRunner.graphs``) and the session goes on with
eager steps: the kernels of a failed capture never ran, so the step runs eagerly from the same
state and gives the same tokens.
"""

from __future__ import annotations

import gc
import logging
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

log = logging.getLogger(__name__)


def graphs_apply(config, device, host_step: bool = False) -> bool:
    """Whether a session's fixed steps run as a CUDA graph: asked for, on CUDA, greedy, and the step
    needs no host work (``host_step``: span decoding, the baseline's teacher forcing, recorded logits)."""
    return bool(config.cuda_graphs and str(device).startswith("cuda") and config.greedy and not host_step)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Python's garbage collector off (a collection could free CUDA memory mid-capture)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def cuda_capture(step: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``step`` recorded as a CUDA graph (its kernels recorded, not run); raises on failure."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with _gc_paused(), torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()
    return graph


class StepGraph:
    """``step()`` eagerly ``warmup`` times, then captured once and replayed; eagerly for good if the
    capture fails. ``capture(step) -> graph`` records a graph (``cuda_capture``; tests pass others)."""

    def __init__(self, step: Callable[[], None], runner, warmup: int = 1, capture: Callable = cuda_capture):
        self.step, self.runner, self.warmup, self.capture = step, runner, warmup, capture
        self.runs = 0
        self.graph = None
        self.failed = False
        self.captured_pass: tuple[str, int, int] | None = None

    def __call__(self) -> None:
        if self.graph is None and not self.failed and self.runs >= self.warmup:
            self.graph = self._capture()
        if self.graph is not None:
            self.graph.replay()
            if self.captured_pass is not None:
                self.runner.passed(*self.captured_pass)  # the pass the replay repeats
            return
        self.step()
        self.runs += 1

    def _capture(self):
        """The step's graph, or None (logged, counted) when the capture fails. The forward passes
        the step makes while recorded are not counted: each replay counts the last of them."""
        with self.runner.recording() as passes:
            try:
                graph = self.capture(self.step)
            except RuntimeError as error:  # torch.AcceleratorError is one
                self.failed = True
                self.runner.graphs["failed"] += 1
                log.warning("CUDA graph capture failed, this batch's steps run eagerly (same tokens, slower): %s",
                            str(error).splitlines()[0] if str(error) else type(error).__name__)  # fmt: skip
                return None
        self.captured_pass = passes[-1] if passes else None
        self.runner.graphs["captured"] += 1
        return graph
