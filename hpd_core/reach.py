"""Which cache entries a CPU step's queries read: each row's real queries in groups, each group over
at most two ranges of entries (``row_plan``).

On a CPU every (query, entry) pair SDPA computes costs, allowed or not, so a packed step whose rows
hold several queries (HPD's) attends row by row over only what its queries may see. Within a row
that is still mostly masked: in memory a row is its prompt, then the values written step by step,
and a value of the row's j-th product may see the prompt up to its own key (and, in a sliding
layer, only the last window of it) and the values written so far, not the later products' text in
between. So a row's queries are cut into runs of consecutive queries (those of one product, as it
turns out) and each run reads the hull of what its queries may see less its largest gap: two
ranges. The cut is a greedy cost rule over pairs computed, entries gathered and a fixed cost per
SDPA call; entries left out are masked for all of the group's queries, so the result is the masked
call's. Each group then reads its entries in one SDPA call (``group_reads``,
``attention.read_sdpa``): a view of one range, or two ranges gathered into one, with the group's
mask over them built once per forward for all layers of a window.

Measured on the README's 96 titles (the 2-core AMD EPYC, one thread, bf16, `--spans`): a sliding
layer's steps computed 100% of their row ranges' pairs before, 28% with the groups (18.6% are
allowed), and HPD's timed run took 25.01 s against 26.91 s (1.08x, medians of three alternating
runs in one process; docs/benchmarks.md, "The AMD EPYC sandbox (session 36)").
"""

from __future__ import annotations

import torch

from hpd_core.attention import fold_mask
from hpd_core.masks import additive

# one more SDPA call costs about as much as this many (query, entry) pairs (EPYC, Gemma's 4 x 256
# heads: ~15-20 us a call, ~60 ns a pair); in the decode, medians of two runs each: 100 -> 24.62 s,
# 400 -> 23.89 s, 1600 -> 25.25 s (session 36)
CALL_PAIRS = 400
# a group's second range is gathered (``attention.read_sdpa``): each of its entries copied costs about
# this many pairs. With 0.5, HPD's steps on the README's 96 titles took 2.55-2.63 s against 2.84-3.49 s
# for two calls merged by their log-sum-exps (session 43, two processes each); 0 and 0.25 did about
# as well in the attention's own time; with 2 (fewer, larger groups) the steps' sliding layers
# attended about as slowly as before.
GATHER_PAIRS = 0.5

Ranges = tuple[tuple[int, int], ...]  # [first, end) entries, ascending, disjoint
Group = tuple[int, int, Ranges]  # the row's queries [q0, q1) and the entries they read


def row_plan(allowed: torch.Tensor, counts: list[int], call_pairs: int = CALL_PAIRS) -> list[list[Group]]:
    """Per row of ``allowed`` (b, A, C) whose real queries are its first ``counts[row]`` (packed
    columns): groups of consecutive queries and the one or two ranges of entries each group reads,
    covering every entry one of its queries may see. Every real query sees at least its own entry."""
    b, A, C = allowed.shape
    column = torch.arange(C, dtype=torch.int32, device=allowed.device)
    first = torch.where(allowed, column, C).amin(2)  # (b, A)
    last = torch.where(allowed, column, -1).amax(2)
    seen_before = torch.cummax(torch.where(allowed, column, -1), 2).values  # last allowed at or before each entry
    before = torch.cat([torch.full((b, A, 1), -1, dtype=torch.int32, device=allowed.device), seen_before[..., :-1]], 2)
    gap = torch.where(allowed & (before >= 0), column - before - 1, 0)  # masked entries just before an allowed one
    width, resume = gap.max(2)  # each query's largest gap inside its hull, and the entry after it
    plans = []
    for n, *per_query in zip(counts, *(x.tolist() for x in (first, last, width, resume))):  # one host copy each
        starts, ends, gaps, resumes = (values[:n] for values in per_query)
        own = [((a, c - g), (c, z + 1)) if g else ((a, z + 1),) for a, z, g, c in zip(starts, ends, gaps, resumes)]
        plans.append(_groups(own, call_pairs))
    return plans


def _groups(ranges: list[Ranges], call_pairs: int) -> list[Group]:
    """Consecutive queries joined while their joint cover costs no more than apart (greedy): a
    call, the pairs computed and, for two ranges, the entries gathered. A cover's two ranges are
    joined into one where the gap's pairs cost no more than gathering them."""

    def settle(cover: Ranges, n: int) -> Ranges:
        if len(cover) == 2 and n * (cover[1][0] - cover[0][1]) <= GATHER_PAIRS * sum(e - s for s, e in cover):
            return ((cover[0][0], cover[1][1]),)
        return cover

    def cost(cover: Ranges, n: int) -> float:
        entries = sum(end - start for start, end in cover)
        return n * entries + call_pairs + (GATHER_PAIRS * entries if len(cover) == 2 else 0)

    groups = []
    q0, cover = 0, settle(ranges[0], 1)
    for q in range(1, len(ranges)):
        n = q - q0
        joint, alone = settle(cover_of(cover + ranges[q]), n + 1), settle(ranges[q], 1)
        if cost(joint, n + 1) <= cost(cover, n) + cost(alone, 1):
            cover = joint
        else:
            groups.append((q0, q, cover))
            q0, cover = q, alone
    groups.append((q0, len(ranges), cover))
    return groups


def cover_of(ranges: Ranges) -> Ranges:
    """The fewest-entries cover of ``ranges`` by at most two ranges: overlapping ones joined, then
    the smallest gaps closed."""
    joined: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if joined and start <= joined[-1][1]:
            joined[-1] = (joined[-1][0], max(joined[-1][1], end))
        else:
            joined.append((start, end))
    while len(joined) > 2:
        i = min(range(len(joined) - 1), key=lambda i: joined[i + 1][0] - joined[i][1])
        joined[i : i + 2] = [(joined[i][0], joined[i + 1][1])]
    return tuple(joined)


Read = tuple[int, int, "tuple[int, int] | torch.Tensor", torch.Tensor]  # queries [q0, q1), entries, their mask


def group_reads(allowed: torch.Tensor, plans: list[list[Group]], dtype: torch.dtype, groups: int) -> list[list[Read]]:
    """Per row, each group of ``row_plan`` as (q0, q1, entries, mask): the entries a range (start,
    end) or, for two ranges, their indices (gathered by ``attention.read_sdpa``), and the group's
    additive mask over just those entries, (1, 1, G x queries, entries) folded for grouped-query
    attention where G > 1 (``attention.fold_mask``), (1, 1, queries, entries) otherwise. Built once
    per forward, it serves every layer of the window."""
    reads = []
    for i, plan in enumerate(plans):
        row = []
        for q0, q1, ranges in plan:
            if len(ranges) == 1:
                entries = ranges[0]
                seen = allowed[i, q0:q1, entries[0] : entries[1]]
            else:
                entries = torch.cat([torch.arange(start, end, device=allowed.device) for start, end in ranges])
                seen = allowed[i, q0:q1].index_select(1, entries)
            mask = additive(seen[None], dtype)
            row.append((q0, q1, entries, fold_mask(mask, groups) if groups > 1 else mask))
        reads.append(row)
    return reads

