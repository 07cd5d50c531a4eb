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
def test_attention_over_a_groups_entries_is_the_masked_call(heads, kv_heads):
    """attention.read_sdpa over what reach.group_reads gives a group: one range (a view) or two
    (gathered into one call), with the group's mask over just those entries, equals the masked
    call over all entries (float32): with queries that see entries in both ranges, and queries
    whose entries all lie in one of them; also for values of another head size."""
    from hpd_core.attention import read_sdpa
    from hpd_core.masks import additive
    from hpd_core.reach import group_reads

    q, k, v, _ = draw(1, heads, kv_heads, 6, 40)
    g = torch.Generator().manual_seed(1)
    allowed = torch.zeros(1, 6, 40, dtype=torch.bool)
    allowed[:, :, 3:15] = torch.rand(1, 6, 12, generator=g) < 0.7
    allowed[:, :, 28:37] = torch.rand(1, 6, 9, generator=g) < 0.7
    allowed[0, 0, 28:37] = False  # only the first range
    allowed[0, 1, 3:15] = False  # only the second
    allowed[0, 0, 5] = allowed[0, 1, 30] = True
    allowed[0, 2:, 30] = True
    mask = additive(allowed, torch.float32)
    for values in (v[..., :16].contiguous(), v):  # the flash kernel's head size, and another
        expected = sdpa(q, k, values, mask, scale=0.3)
        for ranges in (((3, 15), (28, 37)), ((0, 20), (25, 40)), ((3, 37),)):
            plan = [[(0, 2, ranges), (2, 6, ranges)]]  # two groups of the row's queries
            parts = [read_sdpa(q[:, :, q0:q1], k, values, entries, m, scale=0.3)
                     for q0, q1, entries, m in group_reads(allowed, plan, torch.float32, heads // kv_heads)[0]]  # fmt: skip
            assert isinstance(group_reads(allowed, plan, torch.float32, 1)[0][0][2], torch.Tensor) == (len(ranges) == 2)
            torch.testing.assert_close(torch.cat(parts, 2), expected, rtol=1e-5, atol=1e-6)


def test_compensated_bfloat16_scores_are_as_exact_as_float32_accumulators():
    """``attention.scores``: two bfloat16 products (the second subtracting the first's rounded
    result) come within float32 accumulation of the exact scores; one product alone, rounded to
    bfloat16, is about a thousand times further off."""
    from hpd_core.attention import scores

    torch.manual_seed(0)
    q, k = torch.randn(64, 256).bfloat16(), (2 * torch.randn(300, 256)).bfloat16()
    exact = q.double() @ k.double().T
    error = (scores(q, k.T).double() - exact).abs().max().item()
    rounded = ((q @ k.T).double() - exact).abs().max().item()
    float32 = ((q.float() @ k.float().T).double() - exact).abs().max().item()
    assert scores(q, k.T).dtype == torch.float32
    assert error < 1e-4 * exact.abs().max().item() and error < 100 * float32
    assert rounded > 100 * error


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 3e-2)])
def test_causal_matmul_is_sdpas_causal_attention(dtype, tolerance, monkeypatch):
    """``attention.causal_matmul`` over packed queries (rows with a prefix before their queries, of
    different lengths; blocks of 3) == SDPA's causal call over the grid at the queries' places, in
    float32 and, with bfloat16 rounding, in bfloat16; a band with its mask too."""
    import hpd_core.attention as attention

    torch.manual_seed(3)
    rows, C, heads, kv_heads, D = 2, 11, 4, 2, 8
    runs = [(3, 11, 0), (0, 6, 8)]  # (first column, end column, first packed query)
    query = torch.randn(1, heads, 14, D, dtype=dtype)
    key, value = torch.randn(rows, kv_heads, C, D, dtype=dtype), torch.randn(rows, kv_heads, C, D, dtype=dtype)
    grid = torch.zeros(rows, heads, C, D, dtype=dtype)
    for r, (first, end, p0) in enumerate(runs):
        grid[r, :, first:end] = query[0, :, p0 : p0 + end - first]
    expected = F.scaled_dot_product_attention(grid.double(), key.double(), value.double(), is_causal=True,
                                              scale=0.25, enable_gqa=True)  # fmt: skip
    monkeypatch.setattr(attention, "MATMUL_BLOCK", 3)
    out = attention.causal_matmul(query, key, value, runs, None, 0.25)  # (1, N, H, D)
    near = torch.arange(C)[:, None] - torch.arange(C)[None, :]  # query index - entry index
    band_mask = torch.where((near >= 0) & (near < 4), 0.0, torch.finfo(dtype).min).to(dtype)[None, None].expand(rows, 1, C, C)
    bands = [(qs, min(qs + 5, C), max(0, qs - 3), band_mask[..., qs : qs + 5, max(0, qs - 3) : qs + 5]) for qs in range(0, C, 5)]
    banded = attention.causal_matmul(query, key, value, runs, bands, 0.3)
    windowed = F.scaled_dot_product_attention(grid.double(), key.double(), value.double(),
                                              attn_mask=band_mask.double(), scale=0.3, enable_gqa=True)  # fmt: skip
    for r, (first, end, p0) in enumerate(runs):
        got = out[0, p0 : p0 + end - first].transpose(0, 1).double()
        torch.testing.assert_close(got, expected[r, :, first:end], atol=tolerance, rtol=0)
        got = banded[0, p0 : p0 + end - first].transpose(0, 1).double()
        torch.testing.assert_close(got, windowed[r, :, first:end], atol=tolerance, rtol=0)
