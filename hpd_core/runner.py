"""One forward pass of the model over explicit query tokens, a ``RowCache`` and the one rule.

Every forward (prefill, HPD value step, baseline token step) is the same call: N query tokens,
given flat in row-major order, each with its cache row, the cache entry it writes, its position
and generation index. The runner lays them out for the model in one of two ways:

- packed (``(1, N)``: the linear layers see the real tokens only, attention unpacks them per row;
  needs the engine's attention function, hpd_core/attention.py): what a CPU wants, where every
  computed token costs, and what every prefill gets (a prefill's shape changes with its prompts
  anyway, and packed it can use the causal path below, with no mask);
- a grid (``grid=(rows, A)``: every row has exactly A queries, some absent; the whole cache is
  read): fixed shapes from step to step, no host synchronisation, what a GPU step captured as a
  CUDA graph (or compiled) wants. Models without SDPA attention use padded rows instead of
  packing.

The mask is ``masks.allowed`` over the entries' positions, generation indices and presence (each
layer's own window, ``masks.for_layers``), built once per forward for all layers (and, for the
engine's grouped-query SDPA, folded once: ``attention.fold_mask``). A forward the
caller marks ``causal`` (a prefill: each row's entries up to its last query are present, in
strictly increasing positions, generation 0) is the rule's special case "an entry is seen iff its
index is at most the query's"; with the engine's packed SDPA and full-attention layers it runs as
SDPA's causal attention, with no mask, in full-attention layers; sliding-window layers read only
the band of entries each block of queries can reach within its window, masked by the rule
(tests/hpd_core/test_session.py: the same as the masked path). Only the hidden states asked for go
through the LM head, and greedy decoding takes the maximum over slices of the vocabulary
(``next_tokens``) without building the whole logits.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch

from hpd_core import masks
from hpd_core.attention import engine_attention, fold_mask, row_runs, uses_sdpa
from hpd_core.compiled import CompiledLayers
from hpd_core.kvcache import RowCache, Write
from hpd_core.reach import CALL_PAIRS, group_reads, row_plan
from hpd_core.sampling import chosen_logprob, select

BAND_BLOCK = 64  # queries per block of a sliding layer's banded causal attention
ROW_MIN_QUERIES = 2  # CPU forwards with this many queries in some row attend row by row
VOCAB_CHUNK = 32768  # LM head rows per slice in greedy decoding (next_tokens)


def body_parameters(model) -> int:
    """The weights each token's forward multiplies by (2 FLOP each): the decoder's parameters less
    its embedding table (the LM head is not part of the decoder). 4-bit weights (bitsandbytes'
    NF4, stored two to a byte) count at their unpacked size."""

    def count(p) -> int:
        shape = getattr(getattr(p, "quant_state", None), "shape", None)
        return math.prod(shape) if shape is not None else p.numel()

    return sum(count(p) for p in model.get_decoder().parameters()) - count(model.get_input_embeddings().weight)


class ModelRunner:
    """The model split into body (transformer + final norm) and LM head, with explicit masks."""

    def __init__(self, model, tokenizer, prefill_tokens: int = 0, cudnn_attention: bool = False,
                 compile_layers: bool = False):  # fmt: skip
        self.model = model
        self.cudnn_attention = cudnn_attention  # SDPA may use cuDNN's kernels (attention.engine_attention)
        self.body = model.get_decoder()
        # the KV cache's keyword: transformers 5.2x names it `cache` and deprecates `past_key_values`
        # (to be removed in 5.40); earlier releases take only `past_key_values`
        self.cache_keyword = "cache" if "cache" in inspect.signature(type(self.body).forward).parameters else "past_key_values"
        self.head = model.get_output_embeddings()
        self.device = self.head.weight.device
        # the layers' MLPs, norms and rotary embeddings compiled within the engine's forwards (hpd_core/compiled.py);
        # on a CPU their element-wise work alone
        self.compiled = CompiledLayers.for_device(self.body, self.device) if compile_layers else None
        self.dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.flex = getattr(self.body.config, "_attn_implementation", "sdpa") == "flex_attention"
        if self.flex and self.device.type != "cuda":
            raise ValueError("attention 'flex_attention' is for CUDA devices: on a CPU, PyTorch 2.13's compiled "
                             "FlexAttention kernel fails to build for the engine's block masks; load the model with 'sdpa'")
        self.engine_sdpa = uses_sdpa(self.body.config)
        heads = self.body.config.num_attention_heads
        self.groups = heads // (getattr(self.body.config, "num_key_value_heads", None) or heads)  # query heads per K/V head
        self.body_parameters = body_parameters(model)  # matrix work per query token: 2 x this
        self.vocab_size = self.head.weight.shape[0]
        self.pad_id = tokenizer.pad_token_id
        self.windows = masks.layer_windows(model.config)
        self.layer_window = masks.window_per_layer(model.config)
        # causal forwards skip the mask (full layers) or read only each query block's band (sliding)
        self.causal_ok = self.engine_sdpa
        # a CPU forward whose rows hold several queries (HPD's steps) attends row by row, each row's
        # real queries, in groups, over only the entries they can reach (attention.engine_sdpa, hpd_core/reach.py)
        self.row_attention = self.engine_sdpa and self.device.type == "cpu"
        self.row_min_queries = ROW_MIN_QUERIES
        self.call_pairs = CALL_PAIRS  # reach.row_plan's price of an SDPA call (very large: one range per row)
        self.band_block = BAND_BLOCK
        self.prefill_tokens = prefill_tokens  # most new tokens per prefill forward (0: no limit), see Session.prefill
        self.vocab_chunk = VOCAB_CHUNK
        self.counts = {"prefix": 0, "prefill": 0, "step": 0}  # forward passes by kind
        self.tokens = {"prefix": 0, "prefill": 0, "step": 0}  # query tokens computed (packed) by kind
        self.listeners: list = []  # called (kind, query tokens, rows taking part) for every forward pass
        self._recorded: list | None = None  # passes made while a step is recorded as a CUDA graph
        self.graphs = {"captured": 0, "failed": 0}  # CUDA graph captures of fixed steps (hpd_core/graphs.py)
        self.sessions = {"fixed": 0, "packed": 0}  # batches (sessions) by step shape (DecodeConfig.step_shape)

    def new_cache(self, rows: int, capacity: int) -> RowCache:
        return RowCache(rows, capacity, self.device)

    def placeholder_mask(self, rows: int, device):
        """What the layers get as their attention masks where the engine's attention builds none
        from them (causal forwards, row-by-row steps): one (rows, 1, 1, 1) zero tensor per layer rule."""
        unused = torch.zeros((rows, 1, 1, 1), dtype=self.dtype, device=device)
        return masks.for_layers(self.windows, lambda window: unused)

    def mask(self, rule, fold: bool = False):
        """The model's attention mask(s) from ``rule(window) -> (B, Q, K) bool``, one per layer rule;
        ``fold``: additive masks folded for grouped-query attention (``attention.fold_mask``)."""

        def convert(allowed: torch.Tensor):
            if self.flex:
                return masks.block_mask(allowed)
            additive = masks.additive(allowed, self.dtype)
            return fold_mask(additive, self.groups) if fold else additive

        return masks.for_layers(self.windows, lambda window: convert(rule(window)))

    def forward(
        self,
        cache: RowCache,
        rows: torch.Tensor,  # (N,) cache row of each query, non-decreasing
        index: torch.Tensor,  # (N,) the entry each query writes
        tokens: torch.Tensor,  # (N,) input ids
        pos: torch.Tensor,  # (N,) positions
        gen: torch.Tensor,  # (N,) generation indices
        end: int,  # entries [0, end) of each row are read (after this forward's writes)
        present: torch.Tensor | None = None,  # (N,) bool; None: all present
        grid: tuple[int, int] | None = None,  # every cache row has exactly A queries (fixed shape)
        kind: str = "step",  # "prefix", "prefill" or "step", for the counters
        causal: bool = False,  # the caller vouches: each query sees exactly the entries [0, its index]
    ) -> torch.Tensor:
        """Hidden states (N, hidden) of the queries, after writing their keys/values in the cache."""
        present = torch.ones_like(rows, dtype=torch.bool) if present is None else present
        cache.mark(rows, index, pos, gen, present)
        if grid is not None:
            b, A = grid
            read_rows, place = None, None
        else:
            read_rows, counts = torch.unique_consecutive(rows, return_counts=True)
            b, A = read_rows.numel(), int(counts.max())
            starts = torch.cumsum(counts, 0) - counts
            group = torch.repeat_interleave(torch.arange(b, device=rows.device), counts)
            column = torch.arange(rows.numel(), device=rows.device) - starts[group]
            place = group * A + column  # (N,) flat in (b, A)
            if b == cache.rows and bool((read_rows == torch.arange(b, device=rows.device)).all()):
                read_rows = None
        packed = self.engine_sdpa and place is not None
        by_row = False  # a CPU step attending row by row (below)
        if packed and causal and self.causal_ok:
            # the queries at their own index in a (b, end) grid: SDPA's causal rule is the rule of
            # full layers; sliding layers read, per block of queries, only the entries its window
            # can reach, through the rule's mask over that band
            mask = self.placeholder_mask(b, rows.device)
            kwargs = {"unpack": (group, index), "causal_width": end}
            if rows.device.type == "cpu":  # each row's run of queries, for attention.causal_matmul (once per forward)
                kwargs["runs"] = row_runs(group, index, b)
            if any(window is not None for window in self.layer_window):
                keys = cache.keys_of(read_rows, end)
                kwargs["layer_windows"] = self.layer_window
                kwargs["bands"] = {window: self._bands(keys, group, index, b, end, window)
                                   for window in set(self.layer_window) if window is not None}  # fmt: skip
        else:
            grid_pos, grid_gen, grid_index = (self._grid(x, b, A, place, fill) for x, fill in
                                              ((pos, 0), (gen, 0), (index, cache.scratch)))  # fmt: skip
            keys = cache.keys_of(read_rows, end)
            own = grid_index.clamp(max=end - 1)  # padding queries (index: scratch) see some entry, no NaN
            by_row = packed and self.row_attention and A >= self.row_min_queries
            rule = lambda window: masks.allowed(*keys, grid_pos, grid_gen, own, window)  # noqa: E731
            if by_row:  # each row's groups of real queries, the entries they read and their masks, per window
                row_counts, plan = counts.tolist(), {}
                for window in set(self.layer_window):
                    allowed = rule(window)
                    plan[window] = group_reads(allowed, row_plan(allowed, row_counts, self.call_pairs), self.dtype, self.groups)
                mask = self.placeholder_mask(b, rows.device)  # the groups carry their own masks
                cache_rows = read_rows.tolist() if read_rows is not None else range(b)  # K/V: every row, not gathered
                kwargs = {"row_queries": list(zip(starts.tolist(), row_counts, cache_rows)), "row_plan": plan,
                          "layer_windows": self.layer_window}  # fmt: skip
            else:
                # grouped-query attention folds the query heads of a K/V head into the query axis
                # (attention.grouped_sdpa): its mask is folded here once, for all layers
                fold = self.engine_sdpa and self.groups > 1
                mask = self.mask(rule, fold)
                kwargs = {"folded": True} if fold else {}
            if packed:
                kwargs["unpack"] = (group, column)
        if packed:
            ids, positions = tokens[None], pos[None]
            write_rows, write_index = rows, index
        else:
            ids, positions = self._grid(tokens, b, A, place, self.pad_id), grid_pos
            write_rows = (read_rows if read_rows is not None else torch.arange(b, device=rows.device))
            write_rows, write_index = write_rows.repeat_interleave(A), grid_index.reshape(-1)
        cache.write = Write(write_rows, write_index, read_rows, end, kind, b, gather=not by_row)
        self.passed(kind, ids.numel(), b)
        context = engine_attention(self.body.config, self.cudnn_attention) if self.engine_sdpa else nullcontext()
        with context, self.compiled.active() if self.compiled is not None else nullcontext():
            out = self.body(
                input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True, **{self.cache_keyword: cache}, **kwargs
            ).last_hidden_state
        cache.write = None
        if packed:
            return out[0]
        return out.reshape(b * A, -1) if place is None else out.reshape(b * A, -1)[place]

    def finite(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden``, checked to hold no NaN or infinity (one host-device synchronisation, so at
        each prompt's start, not every step): a model that overflows in its dtype (Gemma 3 in
        float16 does, at once) would otherwise write noise as values. Raises FloatingPointError."""
        if not bool(torch.isfinite(hidden).all()):
            raise FloatingPointError(self.overflow_reason())
        return hidden

    def overflow_reason(self, when: str = "") -> str:
        """Why a prompt whose hidden states held NaN or infinity (``when``: e.g. " while decoding") failed."""
        return (f"the model's activations overflowed in {str(self.dtype).removeprefix('torch.')}{when}: its hidden "
                "states hold NaN or infinity, so its tokens would be noise; run it in bfloat16 or float32 (--dtype)")  # fmt: skip

    def passed(self, kind: str, tokens: int, rows: int) -> None:
        """Count one forward pass (and tell the listeners, e.g. `hpd bench`'s counters); a step
        replayed from a CUDA graph (hpd_core/graphs.py) is counted here too, as the pass it repeats.
        While a step is being recorded (``recording``) its passes are noted, not counted."""
        if self._recorded is not None:
            self._recorded.append((kind, tokens, rows))
            return
        self.counts[kind] += 1
        self.tokens[kind] += tokens
        for listener in self.listeners:
            listener(kind, tokens, rows)

    @contextmanager
    def recording(self) -> Iterator[list]:
        """Within: forward passes are noted in the list yielded, not counted (a step being recorded
        as a CUDA graph runs nothing; its replays count)."""
        self._recorded = passes = []
        try:
            yield passes
        finally:
            self._recorded = None

    def _bands(self, keys, group: torch.Tensor, index: torch.Tensor, b: int, end: int, window: int) -> list:
        """A causal forward's queries in blocks of ``band_block`` grid columns, for a layer with
        this window: [(first column, end column, first entry read, additive mask (b, 1, columns,
        entries))]. In a causal forward each row's entries up to its last query are in strictly
        increasing positions, so the entries a block's queries may see start where the position
        falls within the window of the block's earliest query; the mask is the rule itself
        (``masks.allowed``) over the block's queries and those entries."""
        pos, gen, present = keys  # (b, end) each, this forward's entries included
        dev = pos.device
        first = torch.full((b,), end, dtype=torch.long, device=dev).scatter_reduce(0, group, index, "amin")
        last = torch.zeros(b, dtype=torch.long, device=dev).scatter_reduce(0, group, index + 1, "amax")
        starts = torch.arange(int(first.min()), end, self.band_block, device=dev)  # (n,)
        stops = (starts + self.band_block).clamp(max=end)
        earliest = torch.maximum(first[None, :], starts[:, None])  # (n, b): a row's first query in a block
        real = (earliest < stops[:, None]) & (earliest < last[None, :])
        at = pos.T.gather(0, earliest.clamp(max=end - 1))  # (n, b) its position
        column = torch.arange(end, device=dev)
        out_of_reach = (pos[None] <= (at - window)[..., None]) & (column[None, None] < earliest[..., None])
        reach = torch.where(real, out_of_reach.sum(-1), end).amin(1)  # (n,) first entry any query sees
        bands = []
        for qs, qe, ks in zip(starts.tolist(), stops.tolist(), reach.tolist()):
            if ks >= end:
                continue  # no query in this block
            allowed = masks.allowed(pos[:, ks:qe], gen[:, ks:qe], present[:, ks:qe], pos[:, qs:qe], gen[:, qs:qe],
                                    qs - ks, window)  # fmt: skip
            bands.append((qs, qe, ks, masks.additive(allowed, self.dtype)))
        return bands

    @staticmethod
    def _grid(values: torch.Tensor, b: int, A: int, place: torch.Tensor | None, fill: int) -> torch.Tensor:
        """(N,) flat values -> (b, A), padding with ``fill`` (identity reshape for a full grid)."""
        if place is None:
            return values.reshape(b, A)
        out = torch.full((b * A,), fill, dtype=values.dtype, device=values.device)
        out[place] = values
        return out.view(b, A)

    def next_tokens(self, hidden: torch.Tensor, config, generator, scores: bool = False):
        """The tokens ``sampling.select`` picks from these hidden states' logits. Greedy decoding
        with a plain linear LM head never builds the (N, V) logits: the head runs over slices of
        the vocabulary and keeps the running maximum (the first on ties, as ``argmax``): the same
        tokens, with far less memory written and read (Gemma's 262k-entry vocabulary). With
        ``scores``, ``(tokens, log-probabilities)``: each token's log-probability under the model's
        distribution (temperature 1; ``sampling.chosen_logprob``), the slices' log-sum-exp kept
        as they go."""
        if not config.greedy or type(self.head) is not torch.nn.Linear:
            logits = self.logits(hidden)
            tokens = select(logits, config, generator)
            return (tokens, chosen_logprob(logits, tokens)) if scores else tokens
        weight, bias = self.head.weight, self.head.bias
        best = index = total = None
        for start in range(0, self.vocab_size, self.vocab_chunk):
            part = slice(start, start + self.vocab_chunk)
            logits = torch.nn.functional.linear(hidden, weight[part], None if bias is None else bias[part])
            if self.softcap:
                logits = torch.tanh(logits.float() / self.softcap) * self.softcap
            value, at = logits.max(-1)
            if scores:  # the slice's log-sum-exp: its maximum less the maximum's log-probability
                # (log_softmax reads 16-bit logits into float32 vectorised: 2.5x faster than logsumexp)
                top = torch.log_softmax(logits, -1, dtype=torch.float32).gather(-1, at.unsqueeze(-1)).squeeze(-1)
                part_total = value.float() - top
                total = part_total if total is None else torch.logaddexp(total, part_total)
            if best is None:
                best, index = value, at
            else:
                better = (value > best) | (value.isnan() & ~best.isnan())  # NaN wins, as in argmax
                best, index = torch.where(better, value, best), torch.where(better, at + start, index)
        return (index, best.float() - total) if scores else index

    def allowed_tokens(self, hidden: torch.Tensor, allowed: list[list[int]], config, generator, scores: bool = False):
        """The tokens ``sampling.select`` picks when query i may only choose among ``allowed[i]``
        (ascending, not empty). Greedy decoding with a plain linear LM head computes the head's rows
        of the tokens some query may take (one matrix product over their union), and each query
        takes the first of its highest as ``argmax`` of the masked logits would (a NaN logit counting as
        the highest, as there); otherwise the full logits are masked. With ``scores``, ``(tokens,
        log-probabilities)``: each token's log-probability among the tokens its query may take
        (``sampling.chosen_logprob`` of the masked logits)."""
        counts = [len(a) for a in allowed]
        dev = hidden.device
        flat = torch.tensor([t for a in allowed for t in a], dtype=torch.long, device=dev)
        query = torch.repeat_interleave(torch.arange(len(allowed), device=dev), torch.tensor(counts, device=dev))
        if not config.greedy or type(self.head) is not torch.nn.Linear:
            logits = self.logits(hidden)
            masked = torch.full_like(logits, float("-inf"))
            masked[query, flat] = logits[query, flat]
            tokens = select(masked, config, generator)
            return (tokens, chosen_logprob(masked, tokens)) if scores else tokens
        union, column = torch.unique(flat, return_inverse=True)  # the head's rows any query needs
        bias = None if self.head.bias is None else self.head.bias[union]
        logits = torch.nn.functional.linear(hidden, self.head.weight[union], bias)[query, column].float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        # NaN counts as the highest, as argmax takes it (a model that overflowed): equal to the
        # masked argmax, and never a query left without a token
        logits = torch.where(logits.isnan(), float("inf"), logits)
        best = torch.full((len(allowed),), float("-inf"), device=dev).scatter_reduce(0, query, logits, "amax")
        at = torch.arange(flat.numel(), device=dev)
        first = torch.full((len(allowed),), flat.numel(), device=dev).scatter_reduce(
            0, query, torch.where(logits == best[query], at, flat.numel()), "amin"
        )
        if not scores:
            return flat[first]
        # log p(best) = -log sum_j exp(logit_j - best) over the query's allowed tokens
        mass = torch.zeros(len(allowed), device=dev).index_add_(0, query, torch.exp(logits - best[query]))
        return flat[first], -mass.log()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
