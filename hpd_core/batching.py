"""Group prompts into batches by a token budget, and split a batch that runs out of device memory.

A batch's cost is what its KV cache can grow to: rows x (longest prompt + K_max x most slots).
Prompts are sorted by length first so that rows of one batch pad little.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


def batch_cost(prompt_lens: Sequence[int], slots: Sequence[int], max_value_tokens: int) -> int:
    return len(prompt_lens) * (max(prompt_lens) + max_value_tokens * max(slots))


def plan_batches(
    prompt_lens: Sequence[int],
    slots: Sequence[int],
    max_value_tokens: int,
    token_budget: int,
    max_batch_size: int,
) -> list[list[int]]:
    """Indices grouped into batches, shortest prompts first. A prompt over budget alone is a batch."""
    order = sorted(range(len(prompt_lens)), key=lambda i: (prompt_lens[i], slots[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        candidate = current + [i]
        cost = batch_cost([prompt_lens[j] for j in candidate], [slots[j] for j in candidate], max_value_tokens)
        if current and (cost > token_budget or len(candidate) > max_batch_size):
            batches.append(current)
            candidate = [i]
        current = candidate
    if current:
        batches.append(current)
    return batches


def is_out_of_memory(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.OutOfMemoryError)


def run_split_on_oom(
    items: list[T],
    run: Callable[[list[T]], list],
    fail: Callable[[T, str], object],
) -> list:
    """``run(items)``; on a device out-of-memory error, free the cache, split in halves and retry.
    A single item that still does not fit becomes ``fail(item, reason)`` instead of an exception."""
    import torch

    try:
        return run(items)
    except torch.OutOfMemoryError as err:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(items) == 1:
            log.warning("one prompt does not fit in device memory even alone: %s", err)
            return [fail(items[0], f"out of device memory even alone: {str(err).splitlines()[0]}")]
        half = len(items) // 2
        log.warning("out of device memory with %d prompts; retrying as %d + %d", len(items), half, len(items) - half)
        return run_split_on_oom(items[:half], run, fail) + run_split_on_oom(items[half:], run, fail)
