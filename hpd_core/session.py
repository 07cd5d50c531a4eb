"""Continuous batching over a fixed set of cache rows, with shared prompt prefixes.

A ``Session`` decodes a queue of prompts with ``rows`` cache rows (``RowCache``, sized once for
the session's longest prompt and largest answer). Its loop:

    retire  rows whose prompt is finished give their result and become free
    admit   free rows take the next waiting prompts: each row gets its shared prefix's keys and
            values (computed once, kept in the ``PrefixStore`` across batches and calls), then
            one prefill forward over all admitted rows' remaining prompt tokens
    step    one forward over every busy row's next queries (the decoder's ``step``)

so rows stay full while prompts wait (continuous batching), and a category's instructions and
attribute list are prefilled once, not once per prompt. A prompt decoded this way gives the same
tokens as decoded alone (tests/hpd_core/test_session.py). The decoders (engine.HPDSession,
autoregressive.ARSession) say what a row does after its prefill, per step, and when it is done;
turning a finished row's tokens into text and values runs on a background thread meanwhile.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Callable

import torch

from hpd_core.graphs import StepGraph, graphs_apply
from hpd_core.kvcache import Prefix, PrefixStore, RowCache
from hpd_core.runner import ModelRunner


@dataclass(frozen=True)
class Prompt:
    """What a session prefills for one request.

    ids, positions: the prompt's tokens and their positions; prefix: how many leading tokens are
    the shared prefix (0: none); outputs: indices whose hidden states the decoder needs.
    """

    ids: tuple[int, ...]
    positions: tuple[int, ...]
    prefix: int
    outputs: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.prefix <= min(self.outputs):
            raise ValueError(f"shared prefix of {self.prefix} tokens covers an output at {min(self.outputs)}")


class Session:
    """The loop; subclasses implement ``start``, ``packed_step`` / ``fixed_step``, ``done``,
    ``outputs`` and ``parse``."""

    def __init__(self, runner: ModelRunner, prefixes: PrefixStore, prompts: list[Prompt], rows: int, capacity: int):
        self.runner = runner
        runner.sessions["fixed" if self.fixed else "packed"] += 1
        self.prefixes = prefixes
        self.prompts = prompts
        self.rows = rows
        self.cache: RowCache = runner.new_cache(rows, capacity)
        self.queue = deque(range(len(prompts)))
        self.item: list[int | None] = [None] * rows  # the prompt each row decodes
        self.results: dict[int, object] = {}
        self.on_done: Callable[[int], None] | None = None  # called with a prompt's index when it finishes

    def run(self, parser: Executor | None = None) -> list:
        """Decode every prompt; results in prompt order. A finished row's outputs are copied to the
        host at once and parsed on ``parser`` (a background thread) while the model computes on."""
        pending: dict[int, Future] = {}
        while True:
            done = self.done()
            items = [self.item[row] for row in done]
            for row, item, outputs in zip(done, items, self.outputs(done, items) if done else []):
                pending[item] = parser.submit(self.parse, item, outputs) if parser else _done(self.parse(item, outputs))
                self.item[row] = None
                if self.on_done is not None:
                    self.on_done(item)
            self.admit()
            if all(item is None for item in self.item):
                break
            self.step()
        return [pending[i].result() for i in range(len(self.prompts))]

    def admit(self) -> None:
        free = [row for row in range(self.rows) if self.item[row] is None]
        taken = [(row, self.queue.popleft()) for row in free[: len(self.queue)]]
        if not taken:
            return
        rows = [row for row, _ in taken]
        self.cache.clear_rows(torch.tensor(rows, device=self.runner.device))
        for row, item in taken:
            self.item[row] = item
            prompt = self.prompts[item]
            if prompt.prefix:
                self.cache.copy_prefix(row, self.prefix(prompt.ids[: prompt.prefix]))
        hidden = self.prefill([self.prompts[item] for _, item in taken], rows)
        self.start(rows, [item for _, item in taken], hidden)

    def prefill(self, prompts: list[Prompt], rows: list[int]) -> list[torch.Tensor]:
        """The prompts' tokens after their prefixes, into ``rows``, in forwards of at most the
        runner's ``prefill_tokens`` new tokens (whole prompts; 0: one forward); per prompt the
        hidden states at its ``outputs`` (n_outputs, hidden)."""
        limit, out, start, total = self.runner.prefill_tokens, [], 0, 0
        for i, p in enumerate(prompts):
            n = len(p.ids) - p.prefix
            if limit and i > start and total + n > limit:
                out += self.prefill_forward(prompts[start:i], rows[start:i])
                start, total = i, 0
            total += n
        return out + self.prefill_forward(prompts[start:], rows[start:])

    def prefill_forward(self, prompts: list[Prompt], rows: list[int]) -> list[torch.Tensor]:
        """One forward over the prompts' tokens after their prefixes, into ``rows``; per prompt the
        hidden states at its ``outputs`` (n_outputs, hidden). The per-token inputs go to the device
        in one copy and the outputs come out of one gather: each copy from the host can make it
        wait for the device (GPU session 42's profile)."""
        dev = self.runner.device
        spans = [range(p.prefix, len(p.ids)) for p in prompts]
        inputs = torch.tensor([
            [row for row, span in zip(rows, spans) for _ in span],
            [i for span in spans for i in span],
            [t for p, span in zip(prompts, spans) for t in p.ids[span.start :]],
            [q for p, span in zip(prompts, spans) for q in p.positions[span.start :]],
        ], device=dev)  # fmt: skip
        token_rows, columns, ids, positions = inputs.unbind(0)
        hidden = self.runner.forward(
            self.cache,
            token_rows,
            columns,
            ids,
            positions,
            torch.zeros_like(columns),
            end=max(len(p.ids) for p in prompts),
            kind="prefill",
            # each row: its prefix, then its own tokens, all present; in position order, each token
            # sees exactly the entries before it (a prompt whose positions go back uses the mask)
            causal=all(in_order(p.positions) for p in prompts),
        )
        picked, start = [], 0
        for p, span in zip(prompts, spans):
            picked += [start + i - span.start for i in p.outputs]
            start += len(span)
        return list(hidden[torch.tensor(picked, device=dev)].split([len(p.outputs) for p in prompts]))

    def prefix(self, ids: tuple[int, ...]) -> Prefix:
        """The keys and values of a shared prefix: from the store, or one forward over it alone."""
        prefix = self.prefixes.get(ids)
        if prefix is None:
            dev, n = self.runner.device, len(ids)
            cache = self.runner.new_cache(1, n + 1)
            arange = torch.arange(n, device=dev)
            self.runner.forward(cache, torch.zeros_like(arange), arange, torch.tensor(ids, device=dev), arange,
                                torch.zeros_like(arange), end=n, kind="prefix", causal=True)  # fmt: skip
            prefix = cache.take_prefix(0, n)
            self.prefixes.put(ids, prefix)
        return prefix

    # -- the decoder's part ------------------------------------------------------------------
    def start(self, rows: list[int], items: list[int], hidden: list[torch.Tensor]) -> None:
        """Rows just prefilled: ``hidden[i]`` are the hidden states at prompt ``items[i]``'s outputs."""
        raise NotImplementedError

    fixed = False  # the decoder's step shape: fixed (CUDA graphs) or packed (CPU); see DecodeConfig.step_shape
    graph = None  # fixed steps only: a graphs.StepGraph over ``fixed_step``, or None (eager)

    def step(self) -> None:
        """One forward over every busy row's next queries."""
        if not self.fixed:
            self.packed_step()
            return
        if self.graph is not None:
            self.graph()
        else:
            self.fixed_step()
        self.after_fixed_step()

    def packed_step(self) -> None:
        raise NotImplementedError

    def fixed_step(self) -> None:
        """Tensor work only (it may be replayed from a CUDA graph): fixed shapes, in-place writes to
        the session's own tensors, nothing read back to the host."""
        raise NotImplementedError

    def after_fixed_step(self) -> None:
        """The host's part after each fixed step (never recorded in a graph)."""

    def replay_fixed_steps(self, config, host_step: bool) -> None:
        """Run ``fixed_step`` from a CUDA graph where ``graphs.graphs_apply`` says it may."""
        if self.fixed and graphs_apply(config, self.runner.device, host_step):
            self.graph = StepGraph(self.fixed_step, self.runner)

    def done(self) -> list[int]:
        """Busy rows whose prompt is finished."""
        raise NotImplementedError

    def outputs(self, rows: list[int], items: list[int]) -> list:
        """What the results of the prompts ``items`` in ``rows`` are made from, one per row, copied
        off the rows (host data; the rows are refilled next)."""
        raise NotImplementedError

    def parse(self, item: int, outputs):
        """The result of prompt ``item`` from its outputs (host work only: text, parsing)."""
        raise NotImplementedError


def in_order(positions: tuple[int, ...]) -> bool:
    """Strictly increasing positions."""
    return all(a < b for a, b in zip(positions, positions[1:]))


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
