"""The engine's attention function: torch SDPA with the explicit mask, grouped-query attention
without repeating K/V, and packed queries.

transformers' own SDPA path repeats K/V for every grouped-query layer as soon as a mask is passed
(``repeat_kv``: a copy of the whole cache per layer and step, and no fused kernel). This function
calls ``scaled_dot_product_attention(..., enable_gqa=True)`` with the mask instead. It also takes
*packed* queries: the linear layers then run on the step's real tokens only, ``(1, N)``, with no
padding, and attention unpacks them to ``(rows, A)`` against each row's cache (``unpack``: the
flat ``row * A + column`` place of each packed token).

A forward whose queries each see exactly the cache entries up to their own index (a prefill: every
entry before it present, in position order; ``causal_width``) needs no mask at all: the queries
are placed at their own index in a (rows, width) grid and SDPA's causal rule is the attention
rule. The CPU kernel then skips the blocks above the diagonal, and nobody builds a dense mask.
Sliding-window layers of such a forward take ``bands`` instead (built by the runner): blocks of
queries, each attending only to the entries its window can reach, through the rule's own mask over
that band, so a long prompt's prefill costs each query about a window of keys, not the whole row.

It is registered under ``ENGINE_ATTENTION`` and switched on only around the engine's own forward
passes (``engine_attention``), so a model shared with other code keeps its configured
implementation. Models whose configured attention is not SDPA (eager for soft-capped logits,
FlexAttention) keep their own function; the engine then passes padded queries.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

ENGINE_ATTENTION = "hpd_sdpa"


def engine_sdpa(
    module,
    query: torch.Tensor,  # (rows, H, A, D) padded, or (1, H, N, D) packed
    key: torch.Tensor,  # (rows, H_kv, C, D): the cache rows this forward reads
    value: torch.Tensor,  # (rows, H_kv, C, Dv)
    attention_mask: torch.Tensor,  # (rows, 1, A, C) additive float
    dropout: float = 0.0,
    scaling: float | None = None,
    unpack: torch.Tensor | None = None,  # (N,) flat place of each packed query in (rows, A)
    causal_width: int | None = None,  # causal forward: the grid is (rows, width), query at its own index
    layer_windows: tuple[int | None, ...] | None = None,  # causal forward: each layer's window
    bands: dict | None = None,  # causal forward: per window, [(first query, end, first entry, mask)]
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Returns the attention output as (rows, A, H, Dv), or (1, N, H, Dv) for packed queries."""
    if kwargs.get("softcap") is not None:
        raise ValueError("the engine's SDPA attention has no logit soft-capping: load the model with attention='eager'")
    heads = query.shape[1]
    if causal_width is not None:
        if unpack is None or causal_width != key.shape[2]:
            raise ValueError("a causal forward takes packed queries over all of its rows' entries")
        rows, queries, attention_mask = key.shape[0], causal_width, None
    else:
        rows, queries = attention_mask.shape[0], attention_mask.shape[2]
    window = layer_windows[module.layer_idx] if causal_width is not None and layer_windows is not None else None
    if unpack is not None:
        flat = query.new_zeros(rows * queries, heads, query.shape[3])
        flat[unpack] = query[0].transpose(0, 1)
        query = flat.view(rows, queries, heads, -1).transpose(1, 2)
    gqa = key.shape[1] != heads
    if window is not None:  # a sliding layer in a causal forward: each query block over its band
        out = query.new_zeros(rows, heads, queries, value.shape[3])
        for qs, qe, ks, band_mask in bands[window]:
            out[:, :, qs:qe] = F.scaled_dot_product_attention(
                query[:, :, qs:qe], key[:, :, ks:qe], value[:, :, ks:qe], attn_mask=band_mask, dropout_p=dropout,
                scale=scaling, enable_gqa=gqa,
            )  # fmt: skip
        out = out.transpose(1, 2)
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
            is_causal=causal_width is not None, enable_gqa=gqa,
        ).transpose(1, 2)  # (rows, A, H, Dv)
    if unpack is not None:
        out = out.reshape(rows * queries, heads, -1)[unpack].unsqueeze(0)
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ENGINE_ATTENTION, engine_sdpa)
    AttentionMaskInterface.register(ENGINE_ATTENTION, sdpa_mask)


_register()


def uses_sdpa(config) -> bool:
    """Whether the model is configured for SDPA, which the engine's function replaces exactly."""
    return getattr(config, "_attn_implementation", None) in ("sdpa", ENGINE_ATTENTION)


@contextmanager
def engine_attention(config):
    """Within the block, the model whose (text) config this is attends with ``engine_sdpa``."""
    previous = config._attn_implementation_internal
    config._attn_implementation_internal = ENGINE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation_internal = previous
