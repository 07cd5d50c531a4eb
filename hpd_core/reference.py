"""The slow, obviously correct oracle for HPD: no KV cache, one request at a time.

At every step it lays out the logically ordered sequence (each slot's key followed by the value
tokens fed so far), runs one full forward with the training-view mask (masks.training_allowed, each layer's own window) and
the full LM head, and reads each active slot's next token at its last token (its anchor at step 1).
Stopping uses the character-level state machine directly (stopping.advance), not the token table.
With span decoding each slot's full logits are masked to the tokens the span rule allows.
Cached HPD (engine.py) must produce the same tokens (fp32).

``AutoregressiveReference`` is the same kind of oracle for the baseline (autoregressive.py): one
request at a time, a full forward over prompt + answer so far at every step, no padding, no cache.
"""

from __future__ import annotations

import torch

from hpd_core import attribute_groups, masks
from hpd_core.autoregressive import AutoregressiveDecoder, answer_length, make_result
from hpd_core.batching import BatchedDecoder
from hpd_core.config import DecodeConfig
from hpd_core.engine import group, with_confidence
from hpd_core.layout import Layout, beyond_window, build_layout, require_token_boundary
from hpd_core.prompts import parse_value
from hpd_core.sampling import make_generator, select
from hpd_core.spans import SpanVocabulary, product_fields
from hpd_core.stopping import DONE, START, advance, token_text
from hpd_core.types import Request, Result


def logical_sequence(layout: Layout, fed: list[list[int]]):
    """Prompt + skeleton with each slot's fed value tokens inserted after its key.

    Returns (ids, positions, generation index, index of each slot's last token), as lists.
    """
    ids: list[int] = []
    pos: list[int] = []
    gen: list[int] = []
    last: list[int] = []
    start = 0
    for s, anchor in enumerate(layout.anchor_index):
        ids += layout.input_ids[start : anchor + 1]
        pos += layout.position_ids[start : anchor + 1]
        gen += [0] * (anchor + 1 - start)
        for k, token in enumerate(fed[s], start=1):
            ids.append(token)
            pos.append(layout.value_position(s, k))
            gen.append(k)
        last.append(len(ids) - 1)
        start = anchor + 1
    return ids, pos, gen, last


class ReferenceDecoder(BatchedDecoder):
    """Same interface as HPDDecoder; decodes one request at a time without a cache."""

    name = "reference"

    def __init__(self, model, tokenizer, config: DecodeConfig, model_name: str = ""):
        super().__init__(model, tokenizer, config, model_name)
        require_token_boundary(tokenizer, config.skeleton)
        self.windows = masks.layer_windows(model.config)
        self.spans = SpanVocabulary(tokenizer, model.config.vocab_size) if config.span_decoding(self.device) else None

    def cost(self, layout: Layout) -> tuple[int, int]:
        return len(layout.input_ids), layout.num_slots

    def prepare(self, requests: list[Request]) -> list[Layout]:
        cfg = self.config
        return [build_layout(r, self.tokenizer, cfg.max_value_tokens, cfg.skeleton) for r in requests]

    def decode(self, requests: list[Request], prepared: list[Layout] | None = None) -> list[Result]:
        layouts = prepared if prepared is not None else self.prepare(requests)
        generator = make_generator(self.config, self.device)
        wide = attribute_groups.split(requests, layouts, self.window, self.prepare)  # as HPD splits them
        return wide.merge(self.decode_in_batches(
            wide.requests, wide.layouts, lambda indices: [self.decode_one(wide.requests[i], generator, wide.layouts[i])
                                                          for i in indices]
        ))

    def step_logits(self, layout: Layout, fed: list[list[int]]) -> torch.Tensor:
        """Logits (slots, V) at every slot's last token, from one full forward."""
        ids, pos, gen, last = logical_sequence(layout, fed)
        ids_t = torch.tensor([ids], device=self.device)
        pos_t = torch.tensor([pos], device=self.device)
        gen_t = torch.tensor([gen], device=self.device)
        valid = torch.ones_like(ids_t, dtype=torch.bool)
        mask = masks.for_layers(
            self.windows, lambda w: masks.additive(masks.training_allowed(pos_t, gen_t, valid, w), self.dtype)
        )
        out = self.model(input_ids=ids_t, position_ids=pos_t, attention_mask=mask, use_cache=False)
        return out.logits[0, last].float()

    @torch.inference_mode()
    def decode_one(self, request: Request, generator=None, layout: Layout | None = None) -> Result:
        K = self.config.max_value_tokens
        layout = layout or build_layout(request, self.tokenizer, K, self.config.skeleton)
        S = layout.num_slots
        generated: list[list[int]] = [[] for _ in range(S)]
        fed: list[list[int]] = [[] for _ in range(S)]
        state = [START] * S
        active = [True] * S
        logprob = [0.0] * S  # confidence: each slot's summed log-probability
        passes = 0
        spans = None
        if self.spans is not None:  # span decoding: the full logits, masked to what the rule allows
            texts = [self.spans.product(product_fields(p)) for p in request.products]
            spans = [texts[s // layout.num_attributes].slot() for s in range(S)]
        while any(active):
            logits = self.step_logits(layout, fed)
            passes += 1
            for s in range(S):
                if not active[s]:
                    continue
                row = logits[s]
                if spans is not None:
                    allowed = torch.tensor(spans[s].allowed(), device=row.device)
                    row = torch.full_like(row, float("-inf")).index_copy(0, allowed, row[allowed])
                token = int(select(row, self.config, generator))
                if self.config.confidence:
                    logprob[s] += float(torch.log_softmax(row, -1)[token])
                if spans is not None:
                    spans[s].advance(token)
                generated[s].append(token)
                text = token_text(self.tokenizer, token)
                state[s] = DONE if token in self.special else advance(state[s], text)
                if state[s] == DONE or len(generated[s]) == K:
                    active[s] = False  # the final token is never fed
                else:
                    fed[s].append(token)
        values = [
            parse_value(self.tokenizer.decode(generated[s], skip_special_tokens=True), finished=state[s] == DONE)
            for s in range(S)
        ]
        if self.config.confidence:
            values = [with_confidence(value, lp) for value, lp in zip(values, logprob)]
        return Result(
            request=request,
            values=group(values, layout.num_attributes),
            prompt_tokens=len(layout.input_ids),
            generated_tokens=sum(len(g) for g in generated),
            forward_passes=passes,
            decoder=self.name,
            extra={"slot_tokens": generated, "beyond_window": beyond_window(layout, self.window)},
        )


class AutoregressiveReference(AutoregressiveDecoder):
    """The baseline's oracle: same prompts, budgets and stop rule, one request at a time, no cache."""

    name = "ar-reference"

    def decode(
        self, requests: list[Request], exact_new_tokens: list[int] | None = None, prepared: list | None = None
    ) -> list[Result]:
        generator = make_generator(self.config, self.device)
        exact = exact_new_tokens is not None
        if exact:
            items = [(self.prompt_ids(r), n) for r, n in zip(requests, exact_new_tokens)]
        else:
            items = prepared if prepared is not None else self.prepare(requests)
        budgets = [budget for _, budget in items]
        return self.decode_in_batches(
            requests, items, lambda indices: [self.decode_one(requests[i], budgets[i], exact, generator) for i in indices]
        )

    @torch.inference_mode()
    def decode_one(self, request: Request, budget: int, exact: bool, generator=None) -> Result:
        prompt = self.prompt_ids(request)
        tokens: list[int] = []
        end = (0, exact)
        answer = None
        if self.spans is not None:  # span decoding: the full logits, masked to every token the rule allows
            answer = self.answer_spans(request)
        while len(tokens) < budget:
            ids = torch.tensor([prompt + tokens], device=self.device)
            logits = self.model(input_ids=ids).logits[0, -1]
            if answer is not None:
                banned = [t for t in range(logits.shape[-1]) if not answer.allows(t)]
                logits = logits.index_fill(0, torch.tensor(banned, dtype=torch.long, device=logits.device), float("-inf"))
            tokens.append(int(select(logits, self.config, generator)))
            if answer is not None:
                answer.feed(self.spans.texts[tokens[-1]])
            end = (len(tokens), exact)
            if not exact:
                end = answer_length(self.tokenizer, len(request.products), tokens, self.special)
                if end[1]:
                    break
        return make_result(self.name, self.tokenizer, request, len(prompt), tokens, *end)
