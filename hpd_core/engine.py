"""Hyper-Parallel Decoding: prefill, parallel value steps, stopping, batching (DESIGN.md section 2).

Per batch of prompts (right-padded):
  prefill   one forward over prompt + skeleton with gapped positions; the hidden states at the
            anchors go through the LM head and give token 1 of every slot.
  step t    feed the latest token of every still-active slot (compacted to the front of the row,
            padded), at position anchor + t, appended at the end of the KV cache. The mask follows
            position order (masks.allowed, with each layer's own window), so memory order does not
            matter. The cache keeps every key of every layer, with no sliding-window cropping: the
            mask applies a layer's window.
  stop      a slot ends when its text closes the JSON value (stopping.py; a table lookup per step),
            or is cut at K_max and flagged truncated. Its final token is never fed; its earlier
            tokens stay in the cache for later slots. Rows with no active slot leave the batch.
No Python loop runs over slots inside the step loop; per-slot work happens once, when parsing.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from hpd_core import masks
from hpd_core.batching import plan_batches, run_split_on_oom
from hpd_core.config import DecodeConfig
from hpd_core.layout import Layout, build_layout
from hpd_core.prompts import parse_value
from hpd_core.sampling import make_generator, select
from hpd_core.stopping import DONE, START, transition_table
from hpd_core.types import Request, Result, Value


class ModelRunner:
    """The model split into body (transformer + final norm) and LM head, with explicit masks."""

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer
        self.body = model.get_decoder()
        self.head = model.get_output_embeddings()
        self.device = self.head.weight.device
        self.dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.flex = getattr(model.config, "_attn_implementation", "sdpa") == "flex_attention"
        self.vocab_size = self.head.weight.shape[0]
        self.pad_id = tokenizer.pad_token_id
        self.windows = masks.layer_windows(model.config)

    def mask(self, rule):
        """The model's attention mask(s) from ``rule(window) -> (B, Q, K) bool``, one per layer rule."""
        convert = masks.block_mask if self.flex else (lambda allowed: masks.additive(allowed, self.dtype))
        return masks.for_layers(self.windows, lambda window: convert(rule(window)))

    def hidden(self, input_ids, position_ids, rule, cache=None) -> torch.Tensor:
        out = self.body(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self.mask(rule),
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


class HPDDecoder:
    """Decode requests with HPD. ``decode(requests) -> results`` (same order)."""

    name = "hpd"

    def __init__(self, model, tokenizer, config: DecodeConfig, model_name: str = ""):
        self.runner = ModelRunner(model, tokenizer)
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        self.table = transition_table(tokenizer, self.runner.vocab_size).to(self.runner.device)

    def layouts(self, requests: list[Request]) -> list[Layout]:
        cfg = self.config
        return [build_layout(r, self.tokenizer, cfg.max_value_tokens, cfg.skeleton) for r in requests]

    def batch_plan(self, layouts: list[Layout]) -> list[list[int]]:
        """Indices of ``layouts`` grouped into the batches ``decode`` runs (batching.plan_batches)."""
        return plan_batches(
            [len(lay.input_ids) for lay in layouts],
            [lay.num_slots for lay in layouts],
            self.config.max_value_tokens,
            self.config.batch_token_budget,
            self.config.max_batch_size,
        )

    def decode(self, requests: list[Request]) -> list[Result]:
        layouts = self.layouts(requests)
        results: list[Result | None] = [None] * len(requests)
        batches = self.batch_plan(layouts)
        generator = make_generator(self.config, self.runner.device)

        def run(indices: list[int]) -> list[tuple[int, Result]]:
            out = self.decode_batch([requests[i] for i in indices], [layouts[i] for i in indices], generator)
            return list(zip(indices, out))

        def fail(i: int, reason: str) -> tuple[int, Result]:
            return i, error_result(requests[i], self.name, reason, len(layouts[i].input_ids))

        for batch in batches:
            for i, result in run_split_on_oom(batch, run, fail):
                results[i] = result
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def decode_batch(
        self,
        requests: list[Request],
        layouts: list[Layout],
        generator=None,
        forced: list[list[list[int]]] | None = None,
    ) -> list[Result]:
        """Decode one batch. ``forced[b][s]`` (teacher forcing, for tests and training checks):
        feed these tokens instead of choosing, stop each slot after them, and return the logits
        of every step in ``result.extra["step_logits"]`` (slots, K, V)."""
        run, cfg, dev = self.runner, self.config, self.runner.device
        K = cfg.max_value_tokens
        B = len(layouts)
        L = max(len(lay.input_ids) for lay in layouts)
        S = max(lay.num_slots for lay in layouts)

        input_ids = torch.full((B, L), run.pad_id, dtype=torch.long)
        positions = torch.zeros((B, L), dtype=torch.long)
        valid = torch.zeros((B, L), dtype=torch.bool)
        anchor_idx = torch.zeros((B, S), dtype=torch.long)
        anchor_pos = torch.zeros((B, S), dtype=torch.long)
        slot_valid = torch.zeros((B, S), dtype=torch.bool)
        for b, lay in enumerate(layouts):
            n, s = len(lay.input_ids), lay.num_slots
            input_ids[b, :n] = torch.tensor(lay.input_ids)
            positions[b, :n] = torch.tensor(lay.position_ids)
            valid[b, :n] = True
            anchor_idx[b, :s] = torch.tensor(lay.anchor_index)
            anchor_pos[b, :s] = torch.tensor(lay.anchor_pos)
            slot_valid[b, :s] = True
        input_ids, positions, valid = input_ids.to(dev), positions.to(dev), valid.to(dev)
        anchor_idx, anchor_pos, slot_valid = anchor_idx.to(dev), anchor_pos.to(dev), slot_valid.to(dev)

        # Prefill: all prompt tokens, LM head on anchors only.
        cache = DynamicCache()  # no config: full layers only, nothing cropped (the mask windows)
        gen0 = torch.zeros_like(positions)  # prompt and skeleton: generation index 0
        hidden = run.hidden(
            input_ids, positions, lambda w: masks.allowed(positions, gen0, valid, positions, gen0, 0, w), cache
        )
        choose, limit, recorded = self._policy(forced, slot_valid, generator)
        rows, slots = slot_valid.nonzero(as_tuple=True)
        h_anchor = hidden[rows, anchor_idx[rows, slots]]  # (n, H): LM head on anchors only
        tokens = torch.full((B, S), run.pad_id, dtype=torch.long, device=dev)  # latest token per slot
        tokens[rows, slots] = choose(run.logits(h_anchor), rows, slots, 0)
        out = torch.full((B, S, K), run.pad_id, dtype=torch.long, device=dev)  # generated tokens
        out[:, :, 0] = tokens
        n_gen = slot_valid.long()  # (B, S)
        state = torch.where(slot_valid, self.table[START, tokens], DONE)  # (B, S)
        active = slot_valid & (state != DONE) & (n_gen < limit)
        passes = torch.ones(B, dtype=torch.long, device=dev)

        live = torch.arange(B, device=dev)  # rows of the full tensors still in the cache
        key_pos, key_gen, key_valid = positions, gen0, valid  # (b, C): each cache entry's position / g / presence
        step = 1  # the value token index k being fed
        while True:
            act = active[live]
            alive = act.any(1)
            if not alive.any():
                break
            if not alive.all():  # finished prompts leave the batch and free their cache rows
                keep = alive.nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                live, act, key_pos, key_valid = live[keep], act[keep], key_pos[keep], key_valid[keep]
                key_gen = key_gen[keep]
            A = int(act.sum(1).max())
            order = torch.argsort((~act).to(torch.int8), dim=1, stable=True)[:, :A]  # (b, A) slot ids
            q_valid = act.gather(1, order)
            q_tok = tokens[live].gather(1, order).masked_fill(~q_valid, run.pad_id)
            q_pos = anchor_pos[live].gather(1, order) + step
            q_gen = torch.full_like(q_pos, step)
            offset = key_pos.shape[1]
            key_pos = torch.cat([key_pos, q_pos], 1)
            key_gen = torch.cat([key_gen, q_gen], 1)
            key_valid = torch.cat([key_valid, q_valid], 1)
            hidden = run.hidden(
                q_tok, q_pos, lambda w: masks.allowed(key_pos, key_gen, key_valid, q_pos, q_gen, offset, w), cache
            )

            rows = live[:, None].expand_as(order)[q_valid]  # (n,) the valid queries' rows and slots
            slots = order[q_valid]
            new = choose(run.logits(hidden[q_valid]), rows, slots, step)  # (n,)
            out[rows, slots, step] = new
            n_gen[rows, slots] += 1
            state[rows, slots] = self.table[state[rows, slots], new]
            tokens[rows, slots] = new
            active[rows, slots] = (state[rows, slots] != DONE) & (n_gen[rows, slots] < limit[rows, slots])
            passes[live] += 1
            step += 1

        results = self._results(requests, layouts, out, n_gen, state, passes)
        if recorded is not None:
            for b, result in enumerate(results):
                result.extra["step_logits"] = recorded[b, : layouts[b].num_slots].cpu()
        return results

    def _policy(self, forced, slot_valid, generator):
        """(choose, limit, recorded): how tokens are picked, each slot's token limit (B, S), and
        the tensor that records logits when forcing (else None)."""
        K, dev = self.config.max_value_tokens, slot_valid.device
        if forced is None:
            limit = torch.full(slot_valid.shape, K, dtype=torch.long, device=dev)
            return (lambda logits, rows, slots, k: select(logits, self.config, generator)), limit, None
        B, S = slot_valid.shape
        force = torch.full((B, S, K), self.runner.pad_id, dtype=torch.long, device=dev)
        limit = torch.ones((B, S), dtype=torch.long, device=dev)
        for b, slots_gold in enumerate(forced):
            for s, gold in enumerate(slots_gold):
                if not 1 <= len(gold) <= K:
                    raise ValueError(f"forced value for row {b} slot {s} has {len(gold)} tokens, need 1..{K}")
                force[b, s, : len(gold)] = torch.tensor(gold)
                limit[b, s] = len(gold)
        recorded = torch.zeros((B, S, K, self.runner.vocab_size), device=dev)

        def choose(logits, rows, slots, k):
            recorded[rows, slots, k] = logits
            return force[rows, slots, k]

        return choose, limit, recorded

    def _results(self, requests, layouts, out, n_gen, state, passes) -> list[Result]:
        out, n_gen, state, passes = out.cpu(), n_gen.cpu(), state.cpu(), passes.cpu()
        results = []
        for b, (request, lay) in enumerate(zip(requests, layouts)):
            values = []
            for s in range(lay.num_slots):
                ids = out[b, s, : n_gen[b, s]].tolist()
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                values.append(parse_value(text, finished=bool(state[b, s] == DONE)))
            results.append(
                Result(
                    request=request,
                    values=group(values, lay.num_attributes),
                    prompt_tokens=len(lay.input_ids),
                    generated_tokens=int(n_gen[b, : lay.num_slots].sum()),
                    forward_passes=int(passes[b]),
                    decoder=self.name,
                    extra={"slot_tokens": [out[b, s, : n_gen[b, s]].tolist() for s in range(lay.num_slots)]},
                )
            )
        return results


def group(values: list[Value], num_attributes: int) -> tuple[tuple[Value, ...], ...]:
    """Flat slot list (product-major) -> values[j][n]."""
    return tuple(tuple(values[i : i + num_attributes]) for i in range(0, len(values), num_attributes))


def error_result(request: Request, decoder: str, reason: str, prompt_tokens: int = 0) -> Result:
    none = tuple(tuple(Value(None) for _ in request.attributes) for _ in request.products)
    return Result(request, none, prompt_tokens, 0, 0, decoder, error=reason)
