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
"""

from __future__ import annotations

from typing import Callable

import torch


def graphs_apply(config, device, host_step: bool = False) -> bool:
    """Whether a session's fixed steps run as a CUDA graph: asked for, on CUDA, greedy, and the step
    needs no host work (``host_step``: span decoding, the baseline's teacher forcing, recorded logits)."""
    return bool(config.cuda_graphs and str(device).startswith("cuda") and config.greedy and not host_step)


class StepGraph:
    """``step()`` eagerly ``warmup`` times, then captured once and replayed."""

    def __init__(self, step: Callable[[], None], runner, warmup: int = 1):
        self.step, self.runner, self.warmup = step, runner, warmup
        self.runs = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captured_pass: tuple[str, int, int] | None = None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
            if self.captured_pass is not None:
                self.runner.passed(*self.captured_pass)
            return
        if self.runs < self.warmup:
            self.step()
            self.runs += 1
            return
        torch.cuda.synchronize()
        before = self.runner.last_pass
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step()  # recorded, not run; its pass is counted once here, as the replay below
        self.captured_pass = self.runner.last_pass if self.runner.last_pass is not before else None
        self.graph = graph
        graph.replay()
