"""The KV cache of one batch: preallocated per row, written in place, read through the one rule.

``RowCache`` holds, per layer, keys and values of shape (rows, kv_heads, capacity, head_dim),
allocated once (at the first write of each layer, from the model's own key shape) and never grown
or concatenated. Every forward pass writes its tokens at explicit (row, index) places (``Write``)
and reads each taking part row's entries ``[0, end)``. Beside the tensors, each entry has a
position, a generation index and a presence flag (``pos``, ``gen``, ``present``: (rows,
capacity)); the attention mask of a forward is ``masks.allowed`` over them, so where an entry sits
in memory never matters, only its position. The last index of every row is ``scratch``: queries
that are padding write there, absent.

The model calls ``update(key, value, layer)`` from inside each attention layer (the duck-typed
part of transformers' ``Cache`` interface that decoder-only models use).

``PrefixStore`` keeps the KV of shared prompt prefixes (the instructions and attribute list of a
category) for reuse by later prompts, least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from hpd_core.words import word


@dataclass
class Write:
    """Where one forward pass writes and what it reads.

    rows: (N,) cache row of each query token, in the order the model sees the tokens (packed or
        padded row-major); index: (N,) the entry it writes; read_rows: the rows attention reads,
        (b,) in query-row order, or None for all rows; end: entries [0, end) are read; kind:
        "prefix", "prefill" or "step" and taking_part: rows with queries (read by counters);
        gather: attention reads ``read_rows`` only, gathered (else every row, and attention picks
        its rows itself: the CPU's row-by-row steps).
    """

    rows: torch.Tensor
    index: torch.Tensor
    read_rows: torch.Tensor | None
    end: int
    kind: str = "step"
    taking_part: int = 0
    gather: bool = True


class RowCache:
    """Keys and values are allocated uninitialised and zeroed lazily, up to the furthest entry any
    forward has read or written so far (``ready``): an entry read through the mask must hold a
    finite number even where it is masked out (0 x NaN is NaN), and a packed CPU session reads far
    less than the capacity it is sized for (every slot's K_max tokens). On CUDA the whole cache is
    zeroed at allocation (cheap there, and nothing is then zeroed inside a captured step)."""

    def __init__(self, rows: int, capacity: int, device):
        self.rows, self.capacity, self.scratch = rows, capacity, capacity - 1
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.lazy = torch.device(device).type != "cuda"
        self.ready: dict[int, int] = {}  # per layer: entries [0, ready) of every row hold numbers
        self.pos = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.gen = torch.zeros(rows, capacity, dtype=torch.long, device=device)
        self.present = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.write: Write | None = None

    # -- metadata (the mask is built from it before the forward) -----------------------------
    def mark(self, rows: torch.Tensor, index: torch.Tensor, pos, gen, present) -> None:
        """Entries (rows[i], index[i]) get these positions / generation indices / presence."""
        self.pos[rows, index] = pos
        self.gen[rows, index] = gen
        self.present[rows, index] = present

    def clear_rows(self, rows: torch.Tensor) -> None:
        """Rows handed to new prompts: nothing in them is present any more."""
        self.present[rows] = False

    def keys_of(self, read_rows: torch.Tensor | None, end: int):
        """(pos, gen, present) of the entries a forward reads: (b, end) each."""
        if read_rows is None:
            return self.pos[:, :end], self.gen[:, :end], self.present[:, :end]
        return self.pos[read_rows, :end], self.gen[read_rows, :end], self.present[read_rows, :end]

    # -- the transformers side ---------------------------------------------------------------
    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Write this forward's keys/values ((b, H_kv, Q, D): padded rows, or one packed row) at
        ``self.write``'s places; return the entries attention reads, (b, H_kv, end, D)."""
        w = self.write
        keys, values = self.layer(layer_idx, key.shape[1], key.shape[3], value.shape[3], key)
        self.zero_to(layer_idx, w.end)  # before the writes: entries beyond the old mark hold nothing yet
        # the index copies move whole words (hpd_core/words.py): the same bits, fewer elements
        for store, new in ((keys, key), (values, value)):
            new = new.transpose(1, 2).reshape(-1, new.shape[1], new.shape[3])
            at = word(store, new)
            store.view(at)[w.rows, :, w.index] = new.view(at)
        if w.read_rows is None or not w.gather:
            return keys[:, :, : w.end], values[:, :, : w.end]
        return tuple(t.view(word(t))[w.read_rows, :, : w.end].view(t.dtype) for t in (keys, values))

    def layer(self, layer: int, kv_heads: int, key_dim: int, value_dim: int, like: torch.Tensor):
        """The layer's (keys, values), allocated at its first use."""
        if layer not in self.keys:
            new = self.uninitialised if self.lazy else torch.zeros
            shape = (self.rows, kv_heads, self.capacity)
            self.keys[layer] = new(*shape, key_dim, dtype=like.dtype, device=like.device)
            self.values[layer] = new(*shape, value_dim, dtype=like.dtype, device=like.device)
            self.ready[layer] = 0 if self.lazy else self.capacity
        return self.keys[layer], self.values[layer]

    @staticmethod
    def uninitialised(*shape: int, dtype, device) -> torch.Tensor:
        """Memory for keys or values that ``zero_to`` covers before anything reads it (a test fills
        it with NaN)."""
        return torch.empty(*shape, dtype=dtype, device=device)

    def zero_to(self, layer: int, end: int) -> None:
        """Entries [0, end) of every row of the layer hold numbers (zeros where never written).
        Entries at or beyond the mark are written only by the forward that moves it (its writes
        follow this call) or at ``scratch``, which is never present."""
        ready = self.ready[layer]
        if end > ready:
            self.keys[layer][:, :, ready:end].zero_()
            self.values[layer][:, :, ready:end].zero_()
            self.ready[layer] = end

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The most entries present in a row."""
        return int(self.present.sum(1).max())

    # -- shared prefixes ---------------------------------------------------------------------
    def copy_prefix(self, row: int, prefix: "Prefix") -> None:
        """Put a stored prefix's keys/values and metadata in entries [0, P) of ``row``."""
        n = prefix.length
        for layer, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
            self.layer(layer, k.shape[0], k.shape[2], v.shape[2], k)
            self.zero_to(layer, n)
            self.keys[layer][row, :, :n] = k
            self.values[layer][row, :, :n] = v
        self.pos[row, :n] = torch.arange(n, device=self.pos.device)
        self.gen[row, :n] = 0
        self.present[row, :n] = True

    def take_prefix(self, row: int, length: int) -> "Prefix":
        """Entries [0, length) of ``row`` as a stored prefix (copies)."""
        keys = [self.keys[layer][row, :, :length].clone() for layer in sorted(self.keys)]
        values = [self.values[layer][row, :, :length].clone() for layer in sorted(self.values)]
        return Prefix(length, keys, values)


@dataclass
class Prefix:
    """A prompt prefix's keys and values per layer, (H_kv, P, D) each, at positions 0..P-1."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class PrefixStore:
    """Shared prefixes by token ids, the ``capacity`` most recently used kept."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, ids: tuple[int, ...]) -> Prefix | None:
        prefix = self.entries.get(ids)
        if prefix is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(ids)
        return prefix

    def clear(self) -> None:
        self.entries.clear()

    def put(self, ids: tuple[int, ...], prefix: Prefix) -> None:
        if self.capacity < 1:
            return
        self.entries[ids] = prefix
        self.entries.move_to_end(ids)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)
