"""What every decoder shares: the constructor and the plan / run / fail / split-on-OOM loop.

``BatchedDecoder.decode_in_batches`` groups prepared requests into batches of similar size, each
decoded as one session (hpd_core/session.py: continuous batching over a number of cache rows that
the token budget sets: rows x (longest prompt + K_max x most slots) is what the KV cache holds).
When a batch runs out of device memory it is split in halves and retried; a request that does not
fit even alone becomes an error result instead of an exception.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

import torch

from hpd_core import masks
from hpd_core.types import Request, Result, Value

log = logging.getLogger(__name__)
T = TypeVar("T")

MIN_TOKEN_BUDGET = 65536  # a CPU's batch token budget, and the least a GPU's gets
PREFILL_TOKENS_CPU = 1024  # a CPU prefill forward's most new tokens (DecodeConfig.prefill_tokens)
GPU_MEMORY_SHARE = 0.5  # of the device memory free when a decoder is built, for its batches' keys and values
CACHE_METADATA_BYTES = 17  # per cache entry and row: position and generation (int64) and presence (bool)


def kv_bytes_per_token(model, dtype: torch.dtype) -> int:
    """Bytes one cache entry of one row takes: keys and values of every layer (kvcache.RowCache
    keeps every layer at the session's full capacity) plus the entry's metadata."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * element + CACHE_METADATA_BYTES


def token_budget(configured: int, model, device: torch.device, dtype: torch.dtype, free_bytes: int | None = None) -> int:
    """The batch token budget a decoder uses: ``configured`` if it is set (> 0); else 65536 on a
    CPU, and on CUDA as many tokens as ``GPU_MEMORY_SHARE`` of the device's free memory holds as
    cache entries (``kv_bytes_per_token``), at least 65536. The other half is for the forward
    passes' activations; a batch that still runs out of memory is split (``run_split_on_oom``)."""
    if configured > 0:
        return configured
    if device.type != "cuda":
        return MIN_TOKEN_BUDGET
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return max(MIN_TOKEN_BUDGET, int(GPU_MEMORY_SHARE * free_bytes) // kv_bytes_per_token(model, dtype))


def prefill_tokens(configured: int, device: torch.device) -> int:
    """The most new tokens per prefill forward: ``configured`` if set (> 0); else
    ``PREFILL_TOKENS_CPU`` on a CPU and no limit (0) on CUDA."""
    if configured > 0:
        return configured
    return 0 if device.type == "cuda" else PREFILL_TOKENS_CPU


class BatchedDecoder:
    """Base of the decoders (engine.HPDDecoder, autoregressive.AutoregressiveDecoder, the oracles).

    A subclass sets ``name`` and gives ``prepare(requests) -> items`` (tokenization: one item per
    request) and ``cost(item) -> (prompt tokens, slots)``; its ``decode(requests, ...,
    prepared=None)`` calls ``decode_in_batches``.
    """

    name = ""
    runner = None  # the engine's decoders' ModelRunner (the oracles run the model without one)

    def __init__(self, model, tokenizer, config, model_name: str = ""):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config  # DecodeConfig
        self.model_name = model_name
        self.device = model.get_output_embeddings().weight.device
        self.dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        self.token_budget = token_budget(config.batch_token_budget, model, self.device, self.dtype)
        self.special = set(tokenizer.all_special_ids)
        self.parser = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-parse")  # results, beside the model
        self.on_prompt_done: Callable[[Request], None] | None = None  # progress: each request as it finishes
        self.max_positions = masks.max_positions(model.config)  # a prompt whose positions pass it is not decoded
        self.window = masks.smallest_window(model.config)  # the narrowest sliding window (None: no sliding layer)

    def layers_compiled(self) -> bool:
        """Whether this decoder's forwards run the layers' compiled pieces (hpd_core/compiled.py):
        chosen by ``DecodeConfig.compiles`` and not fallen back to eager after a failure."""
        compiled = self.runner.compiled if self.runner is not None else None
        return compiled is not None and not compiled.failed

    def session_done(self, requests: list[Request]) -> Callable[[int], None] | None:
        """A session's ``on_done`` that tells ``on_prompt_done`` which request finished."""
        hook = self.on_prompt_done
        return None if hook is None else (lambda item: hook(requests[item]))

    def prepare(self, requests: list[Request]) -> list:
        """The requests tokenized, one item per request (host work only)."""
        raise NotImplementedError

    def cost(self, item) -> tuple[int, int]:
        """(prompt tokens, slots) of a prepared request, for batch planning."""
        raise NotImplementedError

    def past_positions(self, item) -> str | None:
        """Why a prepared request cannot be decoded within the model's positions, or None (it can).
        HPD's layouts leave K_max positions after every key, so many attributes, products or a large
        K_max can pass ``max_positions``, beyond which the model's rotary positions were never
        trained (Gemma 3 270M: 32,768); the baseline's prompts are ordinary sequences."""
        last = getattr(item, "last_position", None)
        if last is None or self.max_positions is None or last < self.max_positions:
            return None
        return (f"the prompt's positions reach {last}, past the model's {self.max_positions} "
                f"(max_position_embeddings): {item.num_slots} values x {item.max_value_tokens} positions each "
                "(max_value_tokens) after their keys; fewer products per prompt, fewer attributes or a smaller "
                "max_value_tokens")

    def decode(self, requests: list[Request], prepared: list | None = None) -> list[Result]:
        raise NotImplementedError

    def decode_stream(self, batches: Iterable[list[Request]]) -> Iterator[list[Result]]:
        """``decode`` each batch of requests in turn; the next batch is tokenized on a background
        thread while the model computes the current one (whose results are parsed on another)."""
        batches = iter(batches)
        with ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-prepare") as pool:

            def submit() -> Future | None:
                requests = next(batches, None)
                return None if requests is None else pool.submit(lambda: (requests, self.prepare(requests)))

            upcoming = submit()
            while upcoming is not None:
                requests, items = upcoming.result()
                upcoming = submit()
                yield self.decode(requests, prepared=items)

    def decode_in_batches(
        self, requests: list[Request], items: list, decode_batch: Callable[[list[int]], list[Result]]
    ) -> list[Result]:
        """Results of ``requests`` (same order): ``decode_batch(indices)`` per planned batch of
        ``items`` (the prepared requests), split on out-of-memory, failures as error results."""
        costs = [self.cost(item) for item in items]
        results: list[Result | None] = [None] * len(requests)

        def run(indices: list[int]) -> list[tuple[int, Result]]:
            return list(zip(indices, decode_batch(indices)))

        def fail(i: int, reason: str) -> tuple[int, Result]:
            return i, error_result(requests[i], self.name, reason, costs[i][0])

        fits = []
        for i, item in enumerate(items):
            if (why := self.past_positions(item)) is not None:
                results[i] = fail(i, why)[1]
            else:
                fits.append(i)
        plan = plan_sessions([costs[i][0] for i in fits], [costs[i][1] for i in fits], self.config.max_value_tokens,
                             self.token_budget, self.config.max_batch_size)  # fmt: skip
        for batch in plan:
            for i, result in run_split_on_oom([fits[j] for j in batch], run, fail):
                results[i] = result
        return results  # type: ignore[return-value]


def error_result(request: Request, decoder: str, reason: str, prompt_tokens: int = 0) -> Result:
    """The result of a request that could not be decoded: all values None, ``error`` set."""
    none = tuple(tuple(Value(None) for _ in request.attributes) for _ in request.products)
    return Result(request, none, prompt_tokens, 0, 0, decoder, error=reason)


def row_cost(prompt_len: int, slots: int, max_value_tokens: int) -> int:
    """Cache entries one row needs for a prompt: its tokens plus K_max per slot."""
    return prompt_len + max_value_tokens * slots


def session_rows(prompt_lens: Sequence[int], slots: Sequence[int], max_value_tokens: int, token_budget: int, max_rows: int) -> int:
    """Rows of a session over these prompts: rows x (longest prompt + K_max x most slots) within the
    token budget (at least one row), at most ``max_rows`` and the number of prompts."""
    cost = row_cost(max(prompt_lens), max(slots), max_value_tokens)
    return max(1, min(len(prompt_lens), max_rows, token_budget // cost))


def plan_sessions(
    prompt_lens: Sequence[int], slots: Sequence[int], max_value_tokens: int, token_budget: int, max_rows: int
) -> list[list[int]]:
    """Indices grouped into sessions, most costly prompts first. A prompt joins the session before
    it when its row cost is at least half the session's first (rows sized for the first then
    waste at most half), or when it fits the session's rows as they are (no longer prompt, no
    more slots) and adds no wave: the session's rows (``session_rows``' rule) times the waves its
    prompts took already hold it. It then takes a row that would stand empty in the session's
    last wave, instead of a session of its own whose prefill and every step are forwards of their
    own (a category's short last prompt: GPU session 60's titles), and the session's step shape
    stays as it was."""
    costs = [row_cost(n, s, max_value_tokens) for n, s in zip(prompt_lens, slots)]
    sessions: list[list[int]] = []
    longest = most = 0  # the last session's longest prompt and most slots
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        if sessions:
            size = len(sessions[-1])
            rows = max(1, min(max_rows, token_budget // row_cost(longest, most, max_value_tokens)))
            fits = prompt_lens[i] <= longest and slots[i] <= most and size + 1 <= -(-size // rows) * rows
            if 2 * costs[i] >= costs[sessions[-1][0]] or fits:
                sessions[-1].append(i)
                longest, most = max(longest, prompt_lens[i]), max(most, slots[i])
                continue
        sessions.append([i])
        longest, most = prompt_lens[i], slots[i]
    return sessions


def run_split_on_oom(
    items: list[T],
    run: Callable[[list[T]], list],
    fail: Callable[[T, str], object],
) -> list:
    """``run(items)``; on a device out-of-memory error, free the cache, split in halves and retry.
    A single item that still does not fit becomes ``fail(item, reason)`` instead of an exception."""
    import gc

    import torch

    try:
        return run(items)
    except torch.OutOfMemoryError as err:
        error = str(err)
    # out of the except block, the error's traceback, whose frames hold the failed batch's session
    # and its cache, is gone: only now can the memory be freed (its cycles by the collector)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if len(items) == 1:
        log.warning("one prompt does not fit in device memory even alone: %s", error)
        return [fail(items[0], f"out of device memory even alone: {error.splitlines()[0] if error else 'out of memory'}")]
    half = len(items) // 2
    log.warning("out of device memory with %d prompts; retrying as %d + %d", len(items), half, len(items) - half)
    return run_split_on_oom(items[:half], run, fail) + run_split_on_oom(items[half:], run, fail)
