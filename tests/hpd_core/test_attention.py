"""hpd_core.attention.sdpa: grouped-query attention with a mask, the query heads folded onto their
K/V head, against SDPA's own ``enable_gqa`` and against K/V repeated (the obviously correct one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpd_core.attention import sdpa


def draw(rows, heads, kv_heads, queries, entries, dim=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, queries, dim, generator=g, dtype=dtype)
    k = torch.randn(rows, kv_heads, entries, dim, generator=g, dtype=dtype)
    v = torch.randn(rows, kv_heads, entries, dim + 8, generator=g, dtype=dtype)  # Dv != D
    allowed = torch.rand(rows, 1, queries, entries, generator=g) < 0.6
    allowed[..., 0] = True  # every query sees something
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_masked_grouped_query_attention_equals_repeated_keys_and_values(heads, kv_heads):
    q, k, v, mask = draw(3, heads, kv_heads, 7, 11)
    # a non-contiguous query, as the model's projections hand it over
    q = q.transpose(1, 2).contiguous().transpose(1, 2)
    groups = heads // kv_heads
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1), attn_mask=mask, scale=0.3
    )
    out = sdpa(q, k, v, mask, scale=0.3)
    assert out.shape == (3, heads, 7, 24)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    if kv_heads != heads:
        gqa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True)
        torch.testing.assert_close(out, gqa, rtol=1e-5, atol=1e-6)


def test_a_mask_broadcast_over_rows_and_unmasked_causal_attention():
    q, k, v, mask = draw(2, 8, 2, 5, 5)
    one = mask[:1]  # (1, 1, Q, C): the same mask for every row
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=one, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, k, v, one), expected, rtol=1e-5, atol=1e-6)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(sdpa(q, k, v, None, causal=True), causal)
    with pytest.raises(ValueError, match="causal forward takes no mask"):
        sdpa(q, k, v, mask, causal=True)


@pytest.mark.parametrize("decoder", ["hpd", "ar"])
def test_engine_attention_leaves_cudnn_out_unless_asked(models, tokenizer, decoder, monkeypatch):
    """Every SDPA call of the engine's forwards runs with PyTorch's cuDNN backend disabled (it builds a
    plan per new shape on Hopper GPUs), unless ``cudnn_attention``; the tokens are the same, and the
    setting is restored afterwards. On a CPU the flags change no kernel, so this checks the wiring;
    the GPU tests check CUDA against the oracle with the default."""
    import random

    from hpd_core import attention
    from hpd_core.config import DecodeConfig
    from hpd_core.decoders import make_decoder

    from .conftest import random_request

    seen: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    requests = [random_request(random.Random(3), 2, 2)]
    tokens = {}
    for cudnn in (False, True):
        seen.clear()
        config = DecodeConfig(max_value_tokens=4, cudnn_attention=cudnn)
        tokens[cudnn] = [r.extra.get("slot_tokens", r.values) for r in
                         make_decoder(decoder, models["llama"], tokenizer, config).decode(requests)]  # fmt: skip
        assert seen and set(seen) == {cudnn}, (cudnn, set(seen))
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
    assert tokens[False] == tokens[True]


@pytest.mark.parametrize("heads,kv_heads", [(4, 1), (8, 2), (4, 4)])
def test_attention_over_two_ranges_is_the_masked_call(heads, kv_heads):
    """attention.ranged_sdpa: a group's queries over two ranges of entries (everything outside them
    masked), merged by log-sum-exp, equal the masked call over all entries (float32): with queries
    that see entries in both ranges, and queries whose entries all lie in one of them."""
    from hpd_core.attention import ranged_sdpa
    from hpd_core.masks import additive

    q, k, v, _ = draw(1, heads, kv_heads, 6, 40)
    v = v[..., :16].contiguous()  # the CPU flash kernel's head size (Dv == D), as every model here has
    g = torch.Generator().manual_seed(1)
    allowed = torch.zeros(1, 6, 40, dtype=torch.bool)
    allowed[:, :, 3:15] = torch.rand(1, 6, 12, generator=g) < 0.7
    allowed[:, :, 28:37] = torch.rand(1, 6, 9, generator=g) < 0.7
    allowed[0, 0, 28:37] = False  # only the first range
    allowed[0, 1, 3:15] = False  # only the second
    allowed[0, 0, 5] = allowed[0, 1, 30] = True
    allowed[0, 2:, 30] = True
    mask = additive(allowed, torch.float32)
    expected = sdpa(q, k, v, mask, scale=0.3)
    for ranges in (((3, 15), (28, 37)), ((0, 20), (25, 40)), ((3, 37),)):
        out = ranged_sdpa(q, k, v, mask, ranges, scale=0.3)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    wide = torch.cat([v, v], -1)  # another head size: one call over the hull
    torch.testing.assert_close(ranged_sdpa(q, k, wide, mask, ((3, 15), (28, 37)), scale=0.3),
                               sdpa(q, k, wide, mask, scale=0.3), rtol=1e-5, atol=1e-6)
