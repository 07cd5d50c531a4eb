"""The attention rule (DESIGN.md section 2): one definition for the engine, the oracle and the trainer.

Every token carries a position p, a *generation index* g (0 for prompt and skeleton tokens, k for
value token k, which is fed at step k + 1) and a presence flag. A query may attend to a key iff

    the key is present  and  p(key) <= p(query)  and  g(key) <= g(query)
    [and, in a sliding-window layer, p(query) - p(key) < window]

Inference steps and the training view are two calls of the same function (``allowed``):
- inference: the keys are the KV cache plus the current input. Every present key has g <= the
  current step's g, so the g condition never removes one there; memory order is irrelevant.
- training view (trainer, oracle): the logically ordered sequence with values inserted. The g
  condition is what makes it equal to inference: value token k sees token k' of an earlier slot only
  if k' <= k, and prompt and skeleton tokens see no value token.
Every query may also attend to itself, so a padding query is never fully masked (no NaN).

Sliding-window layers count the window in *positions* (what the model's rotary distances saw in
pretraining), like the model's own masks; docs/sliding-window.md has the measurement behind the
choice. ``layer_windows`` reads each layer's rule from the model config and ``for_layers`` builds
one mask per distinct rule in the form the model takes (one tensor, or a mapping by layer type).
"""

from __future__ import annotations

from typing import Callable

import torch

FULL = "full_attention"
SLIDING = "sliding_attention"


def allowed(
    key_pos: torch.Tensor,  # (B, K) positions of all keys (cache + current input)
    key_gen: torch.Tensor,  # (B, K) generation index of every key
    key_valid: torch.Tensor,  # (B, K) bool: key present (not padding)
    query_pos: torch.Tensor,  # (B, Q) positions of the queries
    query_gen: torch.Tensor,  # (B, Q) generation index of the queries
    query_offset: int | torch.Tensor,  # index of query 0 among the keys (0 in the training view),
    # or (B, Q) the index of every query among the keys (a cache written at scattered places)
    window: int | None = None,  # sliding window in positions, None for a full-attention layer
) -> torch.Tensor:
    """Boolean (B, Q, K): may query q attend to key k. The one rule (module doc)."""
    mask = (
        key_valid[:, None, :]
        & (key_pos[:, None, :] <= query_pos[:, :, None])
        & (key_gen[:, None, :] <= query_gen[:, :, None])
    )
    if window is not None:
        mask &= (query_pos[:, :, None] - key_pos[:, None, :]) < window
    if isinstance(query_offset, int):
        q = torch.arange(query_pos.shape[1], device=query_pos.device)
        mask[:, q, q + query_offset] = True  # each query sees itself
    else:
        mask.scatter_(2, query_offset[:, :, None], True)
    return mask


def training_allowed(
    pos: torch.Tensor,  # (B, T) positions
    gen: torch.Tensor,  # (B, T) generation index: 0 prompt/skeleton, k for value token k
    valid: torch.Tensor,  # (B, T) bool, False for padding
    window: int | None = None,
) -> torch.Tensor:
    """Boolean (B, T, T): the rule over a logically ordered sequence (queries = keys)."""
    return allowed(pos, gen, valid, pos, gen, 0, window)


def layer_windows(config) -> dict[str, int | None]:
    """The distinct attention rules of a model's layers: mask name -> window (None: full).

    Models whose layers mix full and sliding attention (Gemma 2/3, Qwen2/3 with sliding layers)
    take a mapping keyed by layer type; the others take one mask, named ``FULL`` here, with the
    model's window if every layer slides (Mistral, Phi-3 with ``sliding_window``).
    """
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if types and types != {FULL} and types <= {FULL, SLIDING}:
        return {t: (window if t == SLIDING else None) for t in sorted(types)}
    if types - {FULL, SLIDING}:
        raise ValueError(f"unsupported attention layer types {sorted(types)}: only {FULL} and {SLIDING}")
    if types == {FULL}:
        return {FULL: None}
    return {FULL: window}


def smallest_window(config) -> int | None:
    """The narrowest sliding window of a model's layers (None: every layer attends in full)."""
    windows = [w for w in layer_windows(config).values() if w is not None]
    return min(windows) if windows else None


def max_positions(config) -> int | None:
    """The positions a model was built for (``max_position_embeddings``; None where not given)."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return getattr(config, "max_position_embeddings", None)


def window_per_layer(config) -> tuple[int | None, ...]:
    """Each layer's window by layer index (None: full attention), from the same rules as
    ``layer_windows``."""
    windows = layer_windows(config)
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if len(windows) == 1:
        return (next(iter(windows.values())),) * config.num_hidden_layers
    return tuple(windows[t] for t in config.layer_types)


def for_layers(windows: dict[str, int | None], build: Callable[[int | None], object]):
    """One mask per rule: ``build(window)`` for each; a single mask alone, else a mapping by type."""
    if len(windows) == 1:
        return build(next(iter(windows.values())))
    return {name: build(window) for name, window in windows.items()}


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) bool -> (B, 1, Q, K) float: 0 where allowed, dtype min where not."""
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(mask, zero, neg)[:, None, :, :]


def block_mask(mask: torch.Tensor):
    """(B, Q, K) bool -> a FlexAttention BlockMask with the same pattern (CUDA)."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, q_len, k_len = mask.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return mask[b, q_idx, kv_idx]

    return create_block_mask(mask_mod, batch, None, q_len, k_len, device=mask.device)
