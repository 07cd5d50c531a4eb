"""The engine's attention function: torch SDPA with the explicit mask, grouped-query attention
without repeating K/V, and packed queries.

transformers' own SDPA path repeats K/V for every grouped-query layer as soon as a mask is passed
(``repeat_kv``: a copy of the whole cache per layer and step, and no fused kernel). This function
calls ``scaled_dot_product_attention`` with the mask and K/V as they are (``sdpa``: the query heads
that share a K/V head folded into the query axis, since the fused CUDA kernels take no mask with
``enable_gqa``). It also takes *packed* queries: the linear layers then run on the step's real
tokens only, ``(1, N)``, with no padding, and attention unpacks them to ``(rows, A)`` against each
row's cache (``unpack``: the (row, column) of each packed token in that grid).

A forward whose queries each see exactly the cache entries up to their own index (a prefill: every
entry before it present, in position order; ``causal_width``) needs no mask at all: the queries
are placed at their own index in a (rows, width) grid and SDPA's causal rule is the attention
rule. The CPU kernel then skips the blocks above the diagonal, and nobody builds a dense mask.
Sliding-window layers of such a forward take ``bands`` instead (built by the runner): blocks of
queries, each attending only to the entries its window can reach, through the rule's own mask over
that band, so a long prompt's prefill costs each query about a window of keys, not the whole row.
On a CPU in bfloat16 a causal forward attends through matrix products instead (``causal_matmul``:
each row's packed queries in blocks, scores as exact as the flash kernel's, a float32 softmax),
since PyTorch's CPU flash kernel reaches about a third of their speed at these head sizes.
On a CPU, a packed step whose rows hold several queries (HPD's) goes row by row instead
(``row_queries``, ``row_plan``, from the runner): each row's real queries, in groups, each in one
call over one or two ranges of its keys and values that hold every entry one of the group's queries
may see (a view of one range, two gathered; hpd_core/reach.py, ``read_sdpa``), with the group's
mask over them built once per forward, so neither the grid's padding queries nor most entries no
query of a group may see are computed; the entries left out are masked for all of the group's
queries, so the result is the masked call's.

It is registered under ``ENGINE_ATTENTION`` and switched on only around the engine's own forward
passes (``engine_attention``), so a model shared with other code keeps its configured
implementation. Within those passes PyTorch's cuDNN attention backend is left out unless asked for
(``cudnn=True``): on Hopper GPUs with a recent cuDNN, PyTorch puts cuDNN first for every SDPA call,
and cuDNN builds an execution plan for every new (rows, queries, entries) shape, tens to hundreds
of milliseconds each, kept in a cache that never shrinks. The engine's shapes change with every
batch (packed prefills, sliding layers' bands), so a long job would keep building plans; flash,
memory-efficient and math kernels need no plan. Models whose configured attention is not SDPA
(eager for soft-capped logits, FlexAttention) keep their own function; the engine then passes
padded queries.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hpd_core.words import word

ENGINE_ATTENTION = "hpd_sdpa"
CPU_MATMUL = True  # causal forwards in bfloat16 on a CPU attend through ``causal_matmul``
MATMUL_DTYPES = (torch.bfloat16,)  # where it is faster than the CPU flash kernel (tests add float32)
MATMUL_BLOCK = 64  # queries per block of a full layer in ``causal_matmul``
WITHOUT_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # SDPA keeps its own order


def engine_sdpa(
    module,
    query: torch.Tensor,  # (rows, H, A, D) padded, or (1, H, N, D) packed
    key: torch.Tensor,  # (rows, H_kv, C, D): the cache rows this forward reads
    value: torch.Tensor,  # (rows, H_kv, C, Dv)
    attention_mask: torch.Tensor,  # (rows, 1, A, C) additive float
    dropout: float = 0.0,
    scaling: float | None = None,
    unpack: tuple[torch.Tensor, torch.Tensor] | None = None,  # (row, column) of each packed query, (N,) each
    causal_width: int | None = None,  # causal forward: the grid is (rows, width), query at its own index
    layer_windows: tuple[int | None, ...] | None = None,  # causal forward: each layer's window
    bands: dict | None = None,  # causal forward: per window, [(first query, end, first entry, mask)]
    row_queries: list[tuple[int, int, int]] | None = None,  # packed: per row, (first packed query, count, cache row)
    row_plan: dict | None = None,  # with row_queries: per window, per row, each group's queries, entries and mask (reach.group_reads)
    folded: bool = False,  # the mask is already folded for grouped-query attention (``fold_mask``)
    runs: list | None = None,  # causal forward: ``row_runs(*unpack, rows)``, computed once by the runner
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Returns the attention output as (rows, A, H, Dv), or (1, N, H, Dv) for packed queries."""
    if kwargs.get("softcap") is not None:
        raise ValueError("the engine's SDPA attention has no logit soft-capping: load the model with attention='eager'")
    heads = query.shape[1]
    if row_queries is not None and causal_width is None:  # row by row, groups of real queries over what they see
        reads = row_plan[layer_windows[module.layer_idx]]  # reach.group_reads: entries and masks, per row
        parts = [
            read_sdpa(query[:, :, qs + q0 : qs + q1], key[c : c + 1], value[c : c + 1], entries, mask, dropout, scaling)
            for (qs, _, c), row in zip(row_queries, reads)
            for q0, q1, entries, mask in row
        ]  # fmt: skip
        return torch.cat(parts, 2).transpose(1, 2), None
    if causal_width is not None:
        if unpack is None or causal_width != key.shape[2]:
            raise ValueError("a causal forward takes packed queries over all of its rows' entries")
        rows, queries, attention_mask = key.shape[0], causal_width, None
    else:
        rows, queries = attention_mask.shape[0], attention_mask.shape[2] // (heads // key.shape[1] if folded else 1)
    window = layer_windows[module.layer_idx] if causal_width is not None and layer_windows is not None else None
    if causal_width is not None and matmul_applies(query, dropout):
        runs = runs if runs is not None else row_runs(*unpack, rows)
        if runs is not None:  # on a CPU: the packed queries through matrix products, no grid
            return causal_matmul(query, key, value, runs, bands[window] if window is not None else None, scaling), None
    if unpack is not None:  # each packed query into its (row, column) of a (rows, H, A, D) grid
        row, column = unpack
        grid = query.new_zeros(rows, heads, queries, query.shape[3])
        packed = query[0].transpose(0, 1)
        w = word(grid, packed)  # copied in whole words: hpd_core/words.py
        grid.view(w)[row, :, column] = packed.view(w)
        query = grid
    if window is not None:  # a sliding layer in a causal forward: each query block over its band
        out = query.new_zeros(rows, heads, queries, value.shape[3])
        for qs, qe, ks, band_mask in bands[window]:
            out[:, :, qs:qe] = sdpa(query[:, :, qs:qe], key[:, :, ks:qe], value[:, :, ks:qe], band_mask, dropout, scaling)
        out = out.view(rows, key.shape[1], heads // key.shape[1], queries, -1)
    else:
        out = grouped_sdpa(query, key, value, attention_mask, dropout, scaling, causal=causal_width is not None,
                           folded=folded)  # fmt: skip
    if unpack is not None:  # the packed queries' outputs gathered straight from the grouped result
        w = word(out)
        return out.view(w)[row, :, :, column].view(out.dtype).reshape(1, row.numel(), heads, -1), None
    return out.reshape(rows, heads, queries, -1).transpose(1, 2), None  # (rows, A, H, Dv)


def read_sdpa(
    query: torch.Tensor,  # (1, H, Q, D)
    key: torch.Tensor,  # (1, H_kv, C, D)
    value: torch.Tensor,  # (1, H_kv, C, Dv)
    entries: tuple[int, int] | torch.Tensor,  # a range [first, end) of entries, or their indices
    mask: torch.Tensor,  # (1, 1, G x Q, E) additive over those entries, folded where G > 1 (reach.group_reads)
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """``sdpa`` of a group's queries over the entries it reads, as (1, H, Q, Dv): a range is a view
    of the cache, indices are gathered (one call over two ranges, where the two calls merged by
    their log-sum-exps before took 1.15-2.3x as long on the 2-core CPU). Every other entry is one
    the mask hides from all of the group's queries, so the result is the masked call's."""
    if isinstance(entries, torch.Tensor):
        key, value = key.index_select(2, entries), value.index_select(2, entries)
    else:
        key, value = key[:, :, entries[0] : entries[1]], value[:, :, entries[0] : entries[1]]
    folded = query.shape[1] > key.shape[1]
    return grouped_sdpa(query, key, value, mask, dropout, scale, folded=folded).reshape(*query.shape[:3], -1)


def causal_matmul(
    query: torch.Tensor,  # (1, H, N, D) packed
    key: torch.Tensor,  # (rows, H_kv, C, D)
    value: torch.Tensor,  # (rows, H_kv, C, Dv)
    runs: list[tuple[int, int, int]],  # per row: (first column, end column, first packed query), ``row_runs``
    bands: list | None,  # a sliding layer's blocks, [(first column, end column, first entry, mask)]; None: full
    scale: float | None = None,
) -> torch.Tensor:
    """A causal forward's attention, (1, N, H, Dv), as matrix products and a float32 softmax, for
    each row's packed queries (no grid, no padding query computed) in blocks of columns: in a full
    layer blocks of ``MATMUL_BLOCK`` queries, each over the entries up to its last query, the ones
    after each query masked; in a sliding layer the runner's bands, each over its entries with the
    rule's mask. For each K/V head its G query heads are folded into the rows of one product (no
    K/V copy). The scores are as exact as the CPU flash kernel's float32 accumulators (``scores``);
    the probabilities are rounded to the values' dtype before their product with them, as that
    kernel also does."""
    _, heads, packed, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scale = dim**-0.5 if scale is None else scale
    exact = math.frexp(scale)[0] == 0.5  # a power of two scales the queries exactly, before the products
    out = query.new_empty(packed, heads, value.shape[3])
    for r, (first, end, p0) in enumerate(runs):
        blocks = bands if bands is not None else [(qs, min(end, qs + MATMUL_BLOCK), 0, None)
                                                  for qs in range(first, end, MATMUL_BLOCK)]  # fmt: skip
        for qs, qe, ks, mask in blocks:
            lo, hi = max(qs, first), min(qe, end)  # this row's queries in the block
            if lo >= hi:
                continue
            n, at = hi - lo, slice(p0 + lo - first, p0 + hi - first)
            for h in range(kv_heads):
                heads_of = slice(h * groups, (h + 1) * groups)
                q = query[0, heads_of, at]
                q = (q * scale if exact else q).reshape(groups * n, dim)
                s = scores(q, key[r, h, ks:hi].t()).view(groups, n, hi - ks)
                if not exact:
                    s.mul_(scale)
                if mask is None:
                    s[:, :, lo:hi].masked_fill_(_above_diagonal(n, s.device), float("-inf"))
                else:
                    s.add_(mask[r, 0, lo - qs : hi - qs, : hi - ks])
                out[at, heads_of] = (torch.softmax(s, -1).to(value.dtype) @ value[r, h, ks:hi]).transpose(0, 1)
    return out[None]


def matmul_applies(query: torch.Tensor, dropout: float = 0.0) -> bool:
    """Whether ``causal_matmul`` replaces the kernel: a CPU, bfloat16, no dropout, switched on."""
    return CPU_MATMUL and query.device.type == "cpu" and query.dtype in MATMUL_DTYPES and not dropout


def row_runs(row: torch.Tensor, column: torch.Tensor, rows: int) -> list[tuple[int, int, int]] | None:
    """Per cache row, (first column, end column, first packed query) of its packed queries, if each
    row's queries are consecutive columns in consecutive packed places, rows in order (a prefill);
    else None."""
    if row.numel() == 0:
        return None
    new = torch.ones_like(row, dtype=torch.bool)
    new[1:] = row[1:] != row[:-1]
    step = torch.ones_like(row)
    step[1:] = column[1:] - column[:-1]
    starts = new.nonzero().flatten()
    if not bool(((step == 1) | new).all()) or starts.numel() != rows or not bool((row[starts] == torch.arange(rows, device=row.device)).all()):
        return None
    ends = torch.cat([starts[1:], starts.new_tensor([row.numel()])])
    return list(zip(column[starts].tolist(), (column[ends - 1] + 1).tolist(), starts.tolist()))


def scores(query: torch.Tensor, key_t: torch.Tensor) -> torch.Tensor:
    """(M, D) @ (D, C) as float32. A bfloat16 product accumulates in float32 but rounds its result
    to bfloat16 (about 3 significant digits: 0.25 on a score of 78); its rounding error is a second
    product that subtracts the first before rounding (``addmm``, beta = -1), so the sum of the two
    is within about 1e-5 relative of the exact scores, as the CPU flash kernel's float32
    accumulators are. PyTorch has no bfloat16 product with a float32 result on CPUs, and a float32
    product of the converted operands ran at about half the speed of the two (one thread, AVX-512 BF16)."""
    first = query @ key_t
    if query.dtype == torch.float32:
        return first
    return torch.addmm(first, query, key_t, beta=-1).float().add_(first)


def _above_diagonal(n: int, device) -> torch.Tensor:
    """(n, n) bool, True above the diagonal (cached)."""
    if (n, str(device)) not in _ABOVE:
        _ABOVE[n, str(device)] = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
    return _ABOVE[n, str(device)]


_ABOVE: dict = {}


def merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Two attentions over disjoint key sets (outputs (..., Q, D), log-sum-exps (..., Q)) as one."""
    top = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - top)[..., None], torch.exp(l2 - top)[..., None]
    return ((w1 * o1.float() + w2 * o2.float()) / (w1 + w2)).to(o1.dtype)


def sdpa(query: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """``grouped_sdpa``'s result as (rows, H, Q, Dv)."""
    return grouped_sdpa(query, *args, **kwargs).reshape(*query.shape[:3], -1)


def grouped_sdpa(
    query: torch.Tensor,  # (rows, H, Q, D)
    key: torch.Tensor,  # (rows, H_kv, C, D), H a multiple of H_kv
    value: torch.Tensor,  # (rows, H_kv, C, Dv)
    mask: torch.Tensor | None,  # (rows, 1, Q, C) additive, or None; (rows, 1, G x Q, C) if folded
    dropout: float = 0.0,
    scale: float | None = None,
    causal: bool = False,
    folded: bool = False,  # the mask is ``fold_mask``'s already (once per forward, not per layer)
) -> torch.Tensor:
    """``scaled_dot_product_attention`` (rows, H_kv, G, Q, Dv), a view of what the kernel wrote
    (head h = H_kv head h // G, G = H / H_kv), for grouped-query attention, K/V never
    repeated. Without a mask SDPA's ``enable_gqa`` does it. With a mask, SDPA's fused CUDA kernels
    refuse ``enable_gqa`` (memory-efficient and cuDNN want equal head counts, flash takes no mask)
    and PyTorch falls back to its math kernel, which writes every (row, head, query, entry) score;
    so the G query heads that share a K/V head are folded into the query axis instead, (rows, H_kv,
    G x Q, D), with the mask repeated along it: the same arithmetic, and no K/V copy
    (tests/hpd_core/test_attention.py). On the 2-core CPU the outputs came out identical to
    ``enable_gqa``'s, the call alone about 15% faster (8 rows, 32 query / 8 K/V heads, 64 queries,
    1200 entries), and HPD on the default model as fast as before end to end. The folded mask is the
    same for every layer: the runner folds it once per forward (``folded``)."""
    rows, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if folded and (mask is None or groups == 1 or mask.shape[2] != groups * queries):
        raise ValueError("a folded mask is (rows, 1, G x Q, C) for G > 1 query heads per K/V head")
    if mask is None or groups == 1 or mask.shape[1] != 1:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout, scale=scale, is_causal=causal, enable_gqa=groups > 1
        )
        return out.view(rows, kv_heads, groups, queries, -1)
    if causal:
        raise ValueError("a causal forward takes no mask")
    folded_query = query.reshape(rows, kv_heads, groups * queries, dim)  # head h = kv head h // G, as repeat_kv
    folded_mask = mask if folded else fold_mask(mask, groups)
    out = F.scaled_dot_product_attention(folded_query, key, value, attn_mask=folded_mask, dropout_p=dropout, scale=scale)
    return out.view(rows, kv_heads, groups, queries, -1)


def fold_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """An additive (rows, 1, Q, C) mask for ``grouped_sdpa``'s folded queries: (rows, 1, G x Q, C),
    folded query g x Q + q masked as query q (a copy: G x the mask's memory)."""
    rows, _, queries, entries = mask.shape
    return mask.expand(rows, groups, queries, entries).reshape(rows, 1, groups * queries, entries)


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
def engine_attention(config, cudnn: bool = False):
    """Within the block, the model whose (text) config this is attends with ``engine_sdpa``, and
    SDPA picks among flash, memory-efficient and math kernels only, unless ``cudnn`` (the module's
    docstring says why). On a CPU the backends left are the ones it has."""
    previous = config._attn_implementation_internal
    config._attn_implementation_internal = ENGINE_ATTENTION
    try:
        with nullcontext() if cudnn else sdpa_kernel(WITHOUT_CUDNN):
            yield
    finally:
        config._attn_implementation_internal = previous
