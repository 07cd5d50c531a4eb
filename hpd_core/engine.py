"""Hyper-Parallel Decoding: prefill, parallel value steps, stopping, batching (DESIGN.md section 2).

A batch of prompts is decoded as a ``session`` (hpd_core/session.py): a fixed number of cache
rows, each decoding one prompt at a time; a finished prompt's row takes the next waiting one
(continuous batching), and the prompts of one category share the prefill of their instructions
and attribute list.

  prefill   prompt + skeleton with gapped positions; the hidden states at the anchors go through
            the LM head and give token 1 of every slot.
  step k    every still-active slot of a row feeds its token k at position anchor + k, generation
            index k. The mask follows position order (masks.allowed, each layer's own window), so
            where an entry sits in the cache never matters: on a CPU the active slots' tokens are
            packed and appended after the row's own entries (every computed token counts); with
            ``step_shape="fixed"`` (the GPU default for batches below config.PACKED_STEP_FLOPS
            of matrix work a step) every row feeds all its slots every step,
            written at the fixed place  L + (k - 1) x S + s  (L: the session's longest prompt,
            S: its most slots), finished slots absent, so every step has the same shapes and no
            host synchronisation happens between the checks every ``check_every`` steps.
  stop      a slot ends when its text closes the JSON value (stopping.py; a table lookup per step),
            or is cut at K_max and flagged truncated. Its final token is never fed; its earlier
            tokens stay in the cache for later slots. A row with no active slot is finished.
No Python loop runs over slots inside the step loop; per-slot work happens once, when parsing.
The one exception is span decoding (``DecodeConfig.spans``, hpd_core/spans.py): each step, the
host finds the tokens each active slot may take, and the LM head runs over those alone.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from hpd_core import attribute_groups
from hpd_core.batching import BatchedDecoder, error_result, prefill_tokens, session_rows
from hpd_core.config import DecodeConfig
from hpd_core.kvcache import PrefixStore
from hpd_core.layout import (
    Layout, beyond_window, build_layouts, require_token_boundary, shared_prefix_length, shared_prefix_lengths,
)  # fmt: skip
from hpd_core.prompts import parse_value, shared_prefix_text
from hpd_core.runner import ModelRunner, body_parameters
from hpd_core.sampling import make_generator, select
from hpd_core.session import Prompt, Session
from hpd_core.spans import SpanVocabulary, product_fields
from hpd_core.stopping import DONE, START, transition_table
from hpd_core.types import Request, Result, Value


class HPDDecoder(BatchedDecoder):
    """Decode requests with HPD. ``decode(requests) -> results`` (same order)."""

    name = "hpd"

    def __init__(self, model, tokenizer, config: DecodeConfig, model_name: str = ""):
        super().__init__(model, tokenizer, config, model_name)
        require_token_boundary(tokenizer, config.skeleton)
        self.runner = ModelRunner(model, tokenizer, prefill_tokens=prefill_tokens(config.prefill_tokens, self.device),
                                  cudnn_attention=config.cudnn_attention,
                                  compile_layers=config.compiles(self.device, body_parameters(model), model.dtype))
        self.table = transition_table(tokenizer, self.runner.vocab_size).to(self.device)
        self.prefixes = PrefixStore(config.prefix_cache)
        self.spans = SpanVocabulary(tokenizer, self.runner.vocab_size) if config.span_decoding(self.device) else None

    def prepare(self, requests: list[Request]) -> list[Layout]:
        cfg = self.config
        return build_layouts(requests, self.tokenizer, cfg.max_value_tokens, cfg.skeleton)

    layouts = prepare

    def cost(self, layout: Layout) -> tuple[int, int]:
        return len(layout.input_ids), layout.num_slots

    def decode(
        self, requests: list[Request], forced: list[list[list[int]]] | None = None, prepared: list[Layout] | None = None
    ) -> list[Result]:
        """``forced[r][s]``: teacher-force these tokens into slot s of request r, at the cost of
        free decoding (see ``decode_batch``); ``prepared``: ``prepare(requests)``, if done already."""
        layouts = prepared if prepared is not None else self.prepare(requests)
        generator = make_generator(self.config, self.device)
        # a prompt too wide for the sliding window, as prompts over its attribute groups
        wide = attribute_groups.split(requests, layouts, self.window, self.prepare, forced)
        requests, layouts, forced = wide.requests, wide.layouts, wide.forced

        def run(indices: list[int]) -> list[Result]:
            picked = ([requests[i] for i in indices], [layouts[i] for i in indices], generator)
            if forced is None:
                return self.decode_batch(*picked)
            return self.decode_batch(*picked, [forced[i] for i in indices], record_logits=False)

        hook = self.on_prompt_done
        self.on_prompt_done = wide.telling(hook)
        try:
            return wide.merge(self.decode_in_batches(requests, layouts, run))
        finally:
            self.on_prompt_done = hook

    def prompt(self, request: Request, layout: Layout) -> Prompt:
        """What the session prefills: the layout, its shared prefix marked (none if sharing is off)."""
        prefix = 0
        if self.prefixes.capacity:
            text = shared_prefix_text(request, self.tokenizer, self.config.skeleton)
            prefix = shared_prefix_length(self.tokenizer, text, layout.input_ids, min(layout.anchor_index))
        return Prompt(layout.input_ids, layout.position_ids, prefix, layout.anchor_index)

    def prompts(self, requests: list[Request], layouts: list[Layout]) -> list[Prompt]:
        """``prompt`` of each request, each category's shared prefix tokenized once."""
        prefixes = [0] * len(requests)
        if self.prefixes.capacity and requests:
            texts = [shared_prefix_text(r, self.tokenizer, self.config.skeleton) for r in requests]
            ids = [lay.input_ids for lay in layouts]
            prefixes = shared_prefix_lengths(self.tokenizer, texts, ids, [min(lay.anchor_index) for lay in layouts])
        return [Prompt(lay.input_ids, lay.position_ids, n, lay.anchor_index) for lay, n in zip(layouts, prefixes)]

    @torch.inference_mode()
    def decode_batch(
        self,
        requests: list[Request],
        layouts: list[Layout],
        generator=None,
        forced: list[list[list[int]]] | None = None,
        record_logits: bool = True,
    ) -> list[Result]:
        """Decode one batch (one session). ``forced[b][s]`` (teacher forcing): feed these tokens
        instead of the chosen ones (still chosen, as in free decoding) and stop each slot after
        them, not before (the stop rule does not cut a forced value short); with
        ``record_logits`` also return the logits of every step in ``result.extra["step_logits"]``
        (slots, K, V), a test tool."""
        if forced is not None and self.spans is not None:
            raise ValueError("teacher forcing and span decoding do not go together")
        if forced is not None and self.config.confidence:
            raise ValueError("teacher forcing and confidence do not go together")
        if forced is not None:
            for r, (request, slots) in enumerate(zip(requests, forced)):
                if len(slots) != request.num_slots:
                    raise ValueError(f"request {r}: {len(slots)} forced slots for {request.num_slots} slots")
                for s, gold in enumerate(slots):
                    if not 1 <= len(gold) <= self.config.max_value_tokens:
                        raise ValueError(f"forced value for row {r} slot {s} has {len(gold)} tokens, need 1..{self.config.max_value_tokens}")
        session = HPDSession(self, requests, layouts, generator, forced, forced is not None and record_logits)
        session.on_done = self.session_done(requests)
        return session.run(self.parser)


class HPDSession(Session):
    """One HPD batch: slot tables per row, (rows, S) each, S the session's most slots."""

    def __init__(self, decoder: HPDDecoder, requests, layouts, generator, forced, record: bool):
        cfg, dev = decoder.config, decoder.device
        self.decoder, self.requests, self.layouts, self.generator = decoder, requests, layouts, generator
        self.forced = forced
        self.K, self.L = cfg.max_value_tokens, max(len(lay.input_ids) for lay in layouts)
        self.S = S = max(lay.num_slots for lay in layouts)
        rows = session_rows([len(lay.input_ids) for lay in layouts], [lay.num_slots for lay in layouts], self.K,
                            decoder.token_budget, cfg.max_batch_size)  # fmt: skip
        self.fixed = cfg.fixed_steps(dev, step_flops=2.0 * decoder.runner.body_parameters * rows * S)
        self.check_every = cfg.check_every if self.fixed else 1
        prompts = decoder.prompts(requests, layouts)
        super().__init__(decoder.runner, decoder.prefixes, prompts, rows, self.L + (self.K - 1) * S + 1)
        pad, K = decoder.runner.pad_id, self.K
        full = lambda value, *shape, dtype=torch.long: torch.full((rows, *shape), value, dtype=dtype, device=dev)
        self.anchor_pos = full(0, S)
        self.tokens = full(pad, S)  # latest token per slot
        self.out = full(pad, S, K)  # generated tokens
        self.n_gen = full(0, S)
        self.state = full(DONE, S)
        self.active = full(False, S, dtype=torch.bool)
        self.limit = full(K, S)
        self.step_of = full(1)  # (rows,) the value token index k each row feeds next
        self.passes = full(0)
        self.append_at = [0] * rows  # packed steps: where each row's next fed token goes
        self.force = full(pad, S, K) if forced is not None else None
        self.recorded = torch.zeros((rows, S, K, decoder.runner.vocab_size), device=dev) if record else None
        # confidence: each slot's summed log-probability of the tokens it generated
        self.logprob = torch.zeros((rows, S), dtype=torch.float32, device=dev) if cfg.confidence else None
        self.steps_since_check = 0
        # per row: the decode steps' queries whose hidden states held NaN or infinity (``note_finite``)
        self.overflows = full(0)
        self.replay_fixed_steps(cfg, host_step=record or decoder.spans is not None)
        self.span_slots: list[list] = [[] for _ in range(rows)]  # span decoding: each row's SpanSlots

    # -- rows start ------------------------------------------------------------------------
    def start(self, rows: list[int], items: list[int], hidden: list[torch.Tensor]) -> None:
        dev, K, S, pad = self.decoder.device, self.K, self.S, self.decoder.runner.pad_id
        # the rows' slot tables are built on the host and go to the device in one copy each: a
        # copy per row or slot makes the host wait for the device every time (GPU session 42)
        anchor_pos = torch.zeros((len(rows), S), dtype=torch.long)
        limit = torch.full((len(rows), S), K, dtype=torch.long)
        force = torch.full((len(rows), S, K), pad, dtype=torch.long) if self.force is not None else None
        started, slot_row, slot_index, anchors = [], [], [], []  # every started slot, flat
        for i, (row, item) in enumerate(zip(rows, items)):
            lay = self.layouts[item]
            started += [i] * lay.num_slots
            slot_row += [row] * lay.num_slots
            slot_index += range(lay.num_slots)
            anchors += lay.anchor_pos
        anchor_pos[started, slot_index] = torch.tensor(anchors, dtype=torch.long)
        if force is not None:  # the forced values, each padded to K, in one table
            golds = [gold for item in items for gold in self.forced[item]]
            force[started, slot_index] = torch.tensor([list(g) + [pad] * (K - len(g)) for g in golds], dtype=torch.long)
            limit[started, slot_index] = torch.tensor([len(g) for g in golds], dtype=torch.long)
        rows_t = torch.tensor(rows, device=dev)
        self.anchor_pos[rows_t] = anchor_pos.to(dev)
        self.limit[rows_t] = limit.to(dev)
        self.out[rows_t] = pad
        if force is not None:
            self.force[rows_t] = force.to(dev)
        if self.recorded is not None:
            self.recorded[rows_t] = 0
        for row, item in zip(rows, items):
            lay, s = self.layouts[item], self.layouts[item].num_slots
            self.append_at[row] = len(lay.input_ids)
            if self.decoder.spans is not None:
                request = self.requests[item]
                texts = [self.decoder.spans.product(product_fields(p)) for p in request.products]
                self.span_slots[row] = [texts[slot // lay.num_attributes].slot() for slot in range(s)]
        r, s = torch.tensor([slot_row, slot_index], dtype=torch.long, device=dev).unbind(0)
        k = torch.zeros_like(r)
        if self.logprob is not None:
            self.logprob[rows_t] = 0.0
        new = self.choose(self.decoder.runner.finite(torch.cat(hidden)), r, s, k)  # token 1 of every slot
        self.state[rows_t] = DONE
        self.n_gen[rows_t] = 0
        self.active[rows_t] = False
        self.step_of[rows_t] = 1
        self.passes[rows_t] = 1
        self.overflows[rows_t] = 0
        self.tokens[r, s] = new
        self.out[r, s, 0] = new
        self.n_gen[r, s] = 1
        self.state[r, s] = self.decoder.table[START, new]
        self.active[r, s] = self.unfinished(self.state[r, s]) & (self.limit[r, s] > 1)

    def note_finite(self, hidden: torch.Tensor, rows: torch.Tensor, fed: torch.Tensor | None = None) -> None:
        """Count, per row, a step's queries (``fed`` of them; None: all) whose hidden states hold NaN
        or infinity: on the device, no synchronisation. A prompt's prefill is checked once at its
        start (``runner.finite``, which raises); a prompt whose steps overflowed later comes out as
        an error result (``parse``), so a model that overflows writes no noise as values."""
        bad = ~torch.isfinite(hidden).all(-1)
        self.overflows.index_add_(0, rows, (bad if fed is None else bad & fed).long())

    def unfinished(self, state: torch.Tensor) -> torch.Tensor:
        """Which slots' values go on: not complete yet (stopping.py); when teacher forcing, every
        slot until its forced tokens are all fed (its ``limit``)."""
        return state != DONE if self.force is None else torch.ones_like(state, dtype=torch.bool)

    def choose(self, hidden: torch.Tensor, r: torch.Tensor, s: torch.Tensor, k: torch.Tensor, fed=None) -> torch.Tensor:
        """Tokens for the queries (r, s) at value index k from their hidden states (forced if
        forcing); ``fed``: which queries are real (fixed steps), the others' logits are not recorded."""
        runner = self.decoder.runner
        if self.decoder.spans is not None:
            return self.choose_spans(hidden, r, s, fed)
        if self.logprob is not None:  # never with teacher forcing (decode_batch)
            new, logprob = runner.next_tokens(hidden, self.decoder.config, self.generator, scores=True)
            self.add_logprob(r, s, logprob, fed)
        elif self.recorded is None:
            new = runner.next_tokens(hidden, self.decoder.config, self.generator)
        else:
            logits = runner.logits(hidden)
            new = select(logits, self.decoder.config, self.generator)
            if fed is None:
                self.recorded[r, s, k] = logits
            else:
                self.recorded[r[fed], s[fed], k[fed]] = logits[fed]
        if self.force is not None:
            new = self.force[r, s, k]
        return new

    def choose_spans(self, hidden: torch.Tensor, r: torch.Tensor, s: torch.Tensor, fed=None) -> torch.Tensor:
        """Span decoding: each query chooses among the tokens its slot's span rule allows (a host
        round trip per step); queries not fed (fixed steps) get their current token back."""
        rows, slots = r.tolist(), s.tolist()
        real = [True] * len(rows) if fed is None else fed.tolist()
        pad = self.decoder.runner.pad_id
        allowed = [self.span_slots[row][slot].allowed() if ok else [pad] for row, slot, ok in zip(rows, slots, real)]
        if self.logprob is None:
            new = self.decoder.runner.allowed_tokens(hidden, allowed, self.decoder.config, self.generator)
        else:
            new, logprob = self.decoder.runner.allowed_tokens(hidden, allowed, self.decoder.config, self.generator,
                                                              scores=True)  # fmt: skip
            self.add_logprob(r, s, logprob, fed)
        for row, slot, ok, token in zip(rows, slots, real, new.tolist()):
            if ok:
                self.span_slots[row][slot].advance(token)
        return new

    def add_logprob(self, r: torch.Tensor, s: torch.Tensor, logprob: torch.Tensor, fed=None) -> None:
        """Add the chosen tokens' log-probabilities to their slots' sums (queries not ``fed`` add 0;
        each (r, s) once a call): on the device, in place, with ``index_add_`` as ``note_finite``
        (``index_put_`` with ``accumulate`` sorts on CUDA, which a CUDA graph may not capture), so a
        step recorded as a graph keeps doing it."""
        added = logprob if fed is None else torch.where(fed, logprob, 0.0)
        self.logprob.view(-1).index_add_(0, r * self.S + s, added)

    # -- steps -----------------------------------------------------------------------------
    def packed_step(self) -> None:
        """Feed the active slots' tokens only, packed, each row's appended after its entries."""
        r, s = self.active.nonzero(as_tuple=True)  # row-major
        if r.numel() == 0:
            return
        counts = torch.bincount(r, minlength=self.rows)  # (rows,)
        base = torch.tensor(self.append_at, device=r.device)
        column = torch.arange(r.numel(), device=r.device) - (torch.cumsum(counts, 0) - counts)[r]
        k = self.step_of[r]
        self.append_at = (base + counts).tolist()
        hidden = self.runner.forward(
            self.cache, r, base[r] + column, self.tokens[r, s], self.anchor_pos[r, s] + k, k,
            end=max(a for a, c in zip(self.append_at, counts.tolist()) if c),
        )  # fmt: skip
        self.note_finite(hidden, r)
        new = self.choose(hidden, r, s, k)
        self.out[r, s, k] = new
        self.n_gen[r, s] += 1
        self.state[r, s] = self.decoder.table[self.state[r, s], new]
        self.tokens[r, s] = new
        self.active[r, s] = self.unfinished(self.state[r, s]) & (self.n_gen[r, s] < self.limit[r, s])
        busy = counts > 0
        self.passes += busy
        self.step_of += busy

    def fixed_step(self) -> None:
        """Feed every slot of every row (finished ones absent): the same shapes every step, and
        nothing read back to the host."""
        R, S, K, dev = self.rows, self.S, self.K, self.decoder.device
        r = torch.arange(R, device=dev).repeat_interleave(S)
        s = torch.arange(S, device=dev).repeat(R)
        act = self.active.flatten().clone()  # (R*S,) the slots fed this step
        k = self.step_of[r]
        index = torch.where(act, self.L + (k - 1).clamp(0, max(K - 2, 0)) * S + s, self.cache.scratch)
        hidden = self.runner.forward(
            self.cache, r, index, self.tokens.reshape(-1), self.anchor_pos.reshape(-1) + k, k,
            end=self.cache.capacity, present=act, grid=(R, S),
        )  # fmt: skip
        self.note_finite(hidden, r, act)
        kk = k.clamp(max=K - 1)
        new = torch.where(act, self.choose(hidden, r, s, kk, act), self.tokens.reshape(-1))
        out = self.out.view(R * S, K)
        out[torch.arange(R * S, device=dev), kk] = torch.where(act, new, out[torch.arange(R * S, device=dev), kk])
        n_gen = self.n_gen.view(-1)
        n_gen += act
        state = self.state.view(-1)
        state.copy_(torch.where(act, self.decoder.table[state, new], state))
        self.tokens.view(-1).copy_(new)
        self.active.view(-1).copy_(act & self.unfinished(state) & (n_gen < self.limit.view(-1)))
        busy = act.view(R, S).any(1)
        self.passes += busy
        self.step_of += busy

    def after_fixed_step(self) -> None:
        self.steps_since_check += 1

    def done(self) -> list[int]:
        busy = [row for row in range(self.rows) if self.item[row] is not None]
        if not busy:
            return []
        if self.fixed and 0 < self.steps_since_check < self.check_every:
            return []  # between checks: nothing read back
        self.steps_since_check = 0
        finished = (~self.active.any(1)).tolist()  # the one host read per check
        return [row for row in busy if finished[row]]

    # -- results ---------------------------------------------------------------------------
    def outputs(self, rows: list[int], items: list[int]) -> list:
        # one gather and one copy to the host for all the rows (indexing copies, on a CPU too)
        idx, n, S, K = torch.tensor(rows, device=self.decoder.device), len(rows), self.S, self.K
        tables = torch.cat([self.out[idx].view(n, S * K), self.n_gen[idx], self.state[idx], self.passes[idx, None],
                            self.overflows[idx, None]], 1)  # fmt: skip
        tables = tables.cpu()
        recorded = self.recorded[idx].cpu() if self.recorded is not None else None
        logprob = self.logprob[idx].cpu() if self.logprob is not None else None
        result = []
        for i, item in enumerate(items):
            s = self.layouts[item].num_slots
            out, n_gen, state = tables[i, : S * K].view(S, K), tables[i, S * K : S * K + S], tables[i, S * K + S : -2]
            rec = recorded[i, :s] if recorded is not None else None
            lp = logprob[i, :s].tolist() if logprob is not None else None
            result.append((out[:s], n_gen[:s], state[:s], int(tables[i, -2]), rec, int(tables[i, -1]), lp))
        return result

    def parse(self, item: int, outputs) -> Result:
        out, n_gen, state, passes, recorded, overflows, logprob = outputs
        request, lay = self.requests[item], self.layouts[item]
        if overflows:
            reason = self.decoder.runner.overflow_reason(" while decoding")
            return error_result(request, self.decoder.name, reason, len(lay.input_ids))
        slot_tokens = [out[s, : n_gen[s]].tolist() for s in range(lay.num_slots)]
        values = [
            parse_value(self.decoder.tokenizer.decode(ids, skip_special_tokens=True), finished=bool(state[s] == DONE))
            for s, ids in enumerate(slot_tokens)
        ]
        if logprob is not None:
            values = [with_confidence(value, lp) for value, lp in zip(values, logprob)]
        extra = {"slot_tokens": slot_tokens, "beyond_window": beyond_window(lay, self.decoder.window)}
        if recorded is not None:
            extra["step_logits"] = recorded
        return Result(
            request=request,
            values=group(values, lay.num_attributes),
            prompt_tokens=len(lay.input_ids),
            generated_tokens=int(n_gen.sum()),
            forward_passes=passes,
            decoder=self.decoder.name,
            extra=extra,
        )


def with_confidence(value: Value, logprob: float) -> Value:
    """The value with its confidence: the probability whose log its tokens' log-probabilities sum to."""
    return replace(value, confidence=math.exp(logprob))


def group(values: list[Value], num_attributes: int) -> tuple[tuple[Value, ...], ...]:
    """Flat slot list (product-major) -> values[j][n]."""
    return tuple(tuple(values[i : i + num_attributes]) for i in range(0, len(values), num_attributes))
