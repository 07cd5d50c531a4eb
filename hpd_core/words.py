"""Index copies by machine words: a tensor's last axis seen as 8-, 4- or 2-byte integers.

The engine moves keys, values, queries and attention outputs between packed and per-row layouts
with advanced indexing (``x[rows, :, index] = y``, ``out[row, :, :, column]``). PyTorch runs these
as element-wise index kernels that compute the source and destination of every element: with bf16
that is one 2-byte element at a time. The same copy over the tensors' bytes seen as 8-byte words
moves a quarter of the elements (on an H200 at 512 long products, session 34, the gather of packed
attention outputs alone took 460 us a call, 6% of the operators' time). A copy moves bits, so the
result is the same bit for bit whatever the word (tests/hpd_core/test_words.py).
"""

from __future__ import annotations

import torch

WORDS = (torch.int64, torch.int32, torch.int16)


def word(*tensors: torch.Tensor) -> torch.dtype:
    """The widest integer dtype that all these tensors (of one floating dtype) can be viewed as
    (``tensor.view(word)``: their last axes' bytes as words, the same memory), or that dtype itself
    when no wider word fits them all (odd sizes, a last axis that is not contiguous, an 8-byte
    dtype). Index the views, then view the result as the dtype again."""
    dtype = tensors[0].dtype
    if any(t.dtype != dtype or t.dim() == 0 or t.stride(-1) != 1 for t in tensors) or not dtype.is_floating_point:
        return dtype
    for candidate in WORDS:
        ratio = candidate.itemsize // dtype.itemsize
        if ratio > 1 and all(n % ratio == 0 for t in tensors for n in (t.shape[-1], t.storage_offset(), *t.stride()[:-1])):
            return candidate
    return dtype
