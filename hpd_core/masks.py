"""The attention rule (DESIGN.md section 2), for inference steps and for the training view.

Inference: a query may attend to a key iff the key is present (cached or in the current input, not
padding) and ``pos(key) <= pos(query)``. Memory order is irrelevant. Every query may also attend to
itself, so a padding query is never fully masked (no NaN).

Training view: every token carries a *generation index* g: 0 for prompt and skeleton tokens,
k for value token k (it is fed at step k + 1). A query may attend to a key iff
``pos(key) <= pos(query)`` and ``g(key) <= g(query)``. That is the inference rule seen from the
logically ordered sequence: when value token k is fed, exactly the tokens with g <= k are present.
So a value token sees the prompt, the skeleton up to its own key, its own earlier tokens, and token
k' of an earlier slot only if k' <= k; prompt and skeleton tokens see no value token.
"""

from __future__ import annotations

import torch


def allowed(
    key_pos: torch.Tensor,  # (B, K) positions of all keys (cache + current input)
    key_valid: torch.Tensor,  # (B, K) bool: key present (not padding)
    query_pos: torch.Tensor,  # (B, Q) positions of the current queries
    query_offset: int,  # index of query 0 among the keys (= cache length)
) -> torch.Tensor:
    """Boolean (B, Q, K): may query q attend to key k. The inference rule."""
    mask = key_valid[:, None, :] & (key_pos[:, None, :] <= query_pos[:, :, None])
    q = torch.arange(query_pos.shape[1], device=query_pos.device)
    mask[:, q, q + query_offset] = True  # each query sees itself
    return mask


def training_allowed(
    pos: torch.Tensor,  # (B, T) positions
    gen: torch.Tensor,  # (B, T) generation index: 0 prompt/skeleton, k for value token k
    valid: torch.Tensor,  # (B, T) bool, False for padding
) -> torch.Tensor:
    """Boolean (B, T, T): the training-view rule over a logically ordered sequence."""
    mask = (
        valid[:, None, :]
        & (pos[:, None, :] <= pos[:, :, None])
        & (gen[:, None, :] <= gen[:, :, None])
    )
    t = torch.arange(pos.shape[1], device=pos.device)
    mask[:, t, t] = True
    return mask


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
