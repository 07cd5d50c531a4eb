"""Index copies by machine words (hpd_core/words.py) move the same bits as the dtype's own."""

import pytest
import torch

from hpd_core.words import word


@pytest.mark.parametrize(
    "dtype, last, expected",
    [(torch.bfloat16, 128, torch.int64), (torch.float32, 8, torch.int64), (torch.float16, 6, torch.int32),
     (torch.float32, 5, torch.float32), (torch.bfloat16, 3, torch.bfloat16), (torch.float64, 8, torch.float64)],
)  # fmt: skip
def test_the_widest_word_that_divides_the_last_axis(dtype, last, expected):
    assert word(torch.zeros(3, 4, last, dtype=dtype)) == expected


def test_no_wider_word_for_a_strided_last_axis_an_odd_stride_or_mixed_dtypes():
    t = torch.zeros(4, 8, 16, dtype=torch.bfloat16)
    assert word(t.transpose(1, 2)) == torch.bfloat16  # last axis not contiguous
    assert word(t[:, :, 1:9]) == torch.bfloat16  # storage offset 1 element
    assert word(t[:, :, :6]) == torch.int32  # rows of 12 bytes
    assert word(t, t.float()) == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_word_copies_equal_the_dtype_copies_bit_for_bit(dtype):
    """A scatter into a (rows, H, A, D) grid and a gather from a (rows, H_kv, G, A, D) view over
    a transposed layout (how the engine packs queries and unpacks attention outputs), NaN and -0.0
    included, give the same bits through words as through the dtype."""
    torch.manual_seed(0)
    rows, heads, A, D, N = 5, 6, 7, 16, 20
    place = torch.randperm(rows * A)[:N].sort().values
    row, column = place // A, place % A
    source = torch.randn(N, heads, D).to(dtype)
    source[0, 0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    plain, fast = torch.zeros(rows, heads, A, D, dtype=dtype), torch.zeros(rows, heads, A, D, dtype=dtype)
    plain[row, :, column] = source
    w = word(fast, source)
    assert w == torch.int64
    fast.view(w)[row, :, column] = source.view(w)
    assert torch.equal(plain.view(torch.uint8), fast.view(torch.uint8))
    out = torch.randn(rows, 2 * A, 3, D).to(dtype).transpose(1, 2).view(rows, 3, 2, A, D)  # strided, as SDPA's output
    out[0, 0, 0, 0, 0] = float("nan")
    expected = out[row, :, :, column]
    got = out.view(word(out))[row, :, :, column].view(dtype)
    assert torch.equal(expected.view(torch.uint8), got.view(torch.uint8))
