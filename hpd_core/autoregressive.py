"""The baseline: ordinary autoregressive generation of the whole JSON answer, same prompts.

Prompts are the HPD prompts up to where the answer starts, seeded with ``{\\n``; the model writes
keys, punctuation and values one token at a time (batched, left-padded, KV cache). A row stops at
an end token (end of turn, padding), once the answer is structurally complete (``AnswerScanner``:
the J product objects asked for are closed, or the whole object), or after a token limit that fits
the whole answer with every value at K_max tokens. Finished rows leave the batch and free their
cache rows at once, as in a serving engine, so a batch costs what its rows generate, not its
longest row times its size. The text is parsed into the same Result type; invalid JSON gives null
values flagged ``parse_error``. ``reference.AutoregressiveReference`` is the slow oracle.
"""

from __future__ import annotations

import torch

from hpd_core.batching import plan_batches, run_split_on_oom
from hpd_core.config import DecodeConfig
from hpd_core.engine import error_result
from hpd_core.layout import encode, encode_prompt
from hpd_core.prompts import answer_prefix, parse_answer, render_prompt, skeleton_segments
from hpd_core.sampling import make_generator, select
from hpd_core.stopping import token_text, token_texts
from hpd_core.types import Request, Result

ANSWER_SLACK_TOKENS = 8  # room for the closing braces after the last value


class AnswerScanner:
    """Follows the JSON structure of one answer as its text arrives, to tell when it is complete.

    The answer starts inside the outer object (after ``{\\n``). It is complete when the outer
    object closes, or when ``products`` product objects (depth 2) have closed: a model fine-tuned
    on stacked answers would otherwise go on writing products J+1, J+2, ... for a prompt of J.
    """

    def __init__(self, products: int):
        self.products = products
        self.depth = 1
        self.closed = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> bool:
        """Read more answer text; True once the answer is complete."""
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 1 and ch == "}":
                    self.closed += 1
                if self.depth <= 0 or self.closed >= self.products:
                    return True
        return False


def answer_length(tokenizer, products: int, tokens: list[int], special: set[int]) -> tuple[int, bool]:
    """(n, complete): the answer is ``tokens[:n]``; complete if it ended by itself (an end token,
    not counted in n, or the scanner). The character-level rule the batched loop applies token by
    token; the reference and tests use it on whole sequences."""
    scanner = AnswerScanner(products)
    for i, t in enumerate(tokens):
        if t in special:
            return i, True
        if scanner.feed(token_text(tokenizer, t)):
            return i + 1, True
    return len(tokens), False


def make_result(decoder: str, tokenizer, request: Request, prompt_len: int, tokens: list[int], n: int, complete: bool) -> Result:
    """A Result from one row's generated tokens, the answer being ``tokens[:n]`` (``complete``: it
    ended by itself or, with exact lengths, at its fixed length). Every token took a forward pass."""
    text = answer_prefix() + tokenizer.decode(tokens[:n], skip_special_tokens=True)
    return Result(
        request=request,
        values=parse_answer(request, text, complete),
        prompt_tokens=prompt_len,
        generated_tokens=n,
        forward_passes=len(tokens),
        decoder=decoder,
        extra={"text": text},
    )


class AutoregressiveDecoder:
    name = "ar"

    def __init__(self, model, tokenizer, config: DecodeConfig, model_name: str = ""):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        self.device = model.get_output_embeddings().weight.device
        self.special = set(tokenizer.all_special_ids)
        self._texts: list[str] | None = None

    def token_text(self, token: int) -> str:
        if self._texts is None:
            self._texts = token_texts(self.tokenizer)
        return self._texts[token] if token < len(self._texts) else "\ufffd"

    def prompt_ids(self, request: Request) -> list[int]:
        return encode_prompt(self.tokenizer, render_prompt(request, self.tokenizer) + answer_prefix())

    def answer_budget(self, request: Request) -> int:
        """Most new tokens the answer can need: skeleton tokens plus K_max per value."""
        skeleton = sum(len(encode(self.tokenizer, s)) for s in skeleton_segments(request))
        return skeleton + request.num_slots * self.config.max_value_tokens + ANSWER_SLACK_TOKENS

    def decode(self, requests: list[Request], exact_new_tokens: list[int] | None = None) -> list[Result]:
        """``exact_new_tokens`` (benchmarks on random weights): generate exactly this many tokens
        per request, ignoring stop conditions."""
        prompts = [self.prompt_ids(r) for r in requests]
        budgets = exact_new_tokens or [self.answer_budget(r) for r in requests]
        results: list[Result | None] = [None] * len(requests)
        batches = plan_batches(
            [len(p) for p in prompts],
            [max(1, b // self.config.max_value_tokens) for b in budgets],
            self.config.max_value_tokens,
            self.config.batch_token_budget,
            self.config.max_batch_size,
        )
        generator = make_generator(self.config, self.device)

        def run(indices: list[int]) -> list[tuple[int, Result]]:
            out = self.decode_batch(
                [requests[i] for i in indices],
                [prompts[i] for i in indices],
                [budgets[i] for i in indices],
                exact=exact_new_tokens is not None,
                generator=generator,
            )
            return list(zip(indices, out))

        def fail(i: int, reason: str) -> tuple[int, Result]:
            return i, error_result(requests[i], self.name, reason, len(prompts[i]))

        for batch in batches:
            for i, result in run_split_on_oom(batch, run, fail):
                results[i] = result
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def decode_batch(
        self,
        requests: list[Request],
        prompts: list[list[int]],
        budgets: list[int],
        exact: bool = False,
        generator=None,
        forced: list[list[int]] | None = None,
    ) -> list[Result]:
        """Generate for one batch; each row stops by itself (or, ``exact``, after its budget) and
        leaves the batch. ``forced[b]`` (tests): feed these tokens instead of choosing."""
        dev, pad = self.device, self.tokenizer.pad_token_id
        B = len(prompts)
        L = max(len(p) for p in prompts)
        ids = torch.full((B, L), pad, dtype=torch.long)
        attention = torch.zeros((B, L), dtype=torch.long)
        for b, p in enumerate(prompts):  # left padding
            ids[b, L - len(p) :] = torch.tensor(p)
            attention[b, L - len(p) :] = 1
        ids, attention = ids.to(dev), attention.to(dev)
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1]
        next_pos = positions[:, -1] + 1

        live = list(range(B))  # batch row of each cache row
        generated: list[list[int]] = [[] for _ in range(B)]
        ends: list[tuple[int, bool]] = [(0, False)] * B  # (answer length, complete), as answer_length
        scanners = [AnswerScanner(len(r.products)) for r in requests]
        while True:
            tokens = select(logits, self.config, generator)
            if forced is not None:
                tokens = torch.tensor([forced[b][len(generated[b])] for b in live], device=dev)
            keep = []
            for k, (b, t) in enumerate(zip(live, tokens.tolist())):
                generated[b].append(t)
                n = len(generated[b])
                if not exact and t in self.special:
                    ends[b] = (n - 1, True)  # the end token is not part of the answer
                elif not exact and scanners[b].feed(self.token_text(t)):
                    ends[b] = (n, True)
                elif n >= budgets[b] or (forced is not None and n == len(forced[b])):
                    ends[b] = (n, exact)
                else:
                    keep.append(k)
            if not keep:
                break
            if len(keep) < len(live):  # finished rows leave the batch and free their cache rows
                index = torch.tensor(keep, device=dev)
                cache.batch_select_indices(index)
                attention, tokens, next_pos = attention[index], tokens[index], next_pos[index]
                live = [live[k] for k in keep]
            attention = torch.cat([attention, attention.new_ones((len(live), 1))], 1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
            next_pos = next_pos + 1
        return [
            make_result(self.name, self.tokenizer, r, len(p), g, *end)
            for r, p, g, end in zip(requests, prompts, generated, ends)
        ]
