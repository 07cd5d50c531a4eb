"""The baseline: ordinary autoregressive generation of the whole JSON answer, same prompts.

Prompts are the HPD prompts up to where the answer starts, seeded with ``{\\n``; the model writes
keys, punctuation and values one token at a time. A row stops at an end token (end of turn,
padding), once the answer is structurally complete (``AnswerScanner``: the J product objects asked
for are closed, or the whole object), or after a token limit that fits the whole answer with every
value at K_max tokens. The text is parsed into the same Result type; invalid JSON gives null values
flagged ``parse_error``. ``reference.AutoregressiveReference`` is the slow oracle.

The baseline gets what the engine gives HPD (hpd_core/session.py): a static KV cache written in
place, a category's shared prompt prefix prefilled once, continuous batching (a finished row takes
the next waiting prompt at once, as in a serving engine, so a batch costs what its rows generate),
and, with ``step_shape="fixed"``, steps of fixed shape whose stop check reads the host only every
``check_every`` steps (a row that ended meanwhile is cut where it ended).
"""

from __future__ import annotations

import torch

from hpd_core.batching import BatchedDecoder, error_result, prefill_tokens, session_rows
from hpd_core.config import DecodeConfig
from hpd_core.kvcache import PrefixStore
from hpd_core.layout import (
    encode, encode_many, encode_prompt, shared_prefix_length, shared_prefix_lengths, start_ids, with_start,
)  # fmt: skip
from hpd_core.prompts import CLOSE, JsonCursor, answer_prefix, parse_answer, render_prompt, shared_prefix_text, skeleton_segments, special_texts
from hpd_core.runner import ModelRunner, body_parameters
from hpd_core.session import Prompt, Session
from hpd_core.sampling import make_generator, select
from hpd_core.spans import AnswerSpans, SpanVocabulary, product_fields
from hpd_core.stopping import token_text, token_texts
from hpd_core.types import Request, Result

ANSWER_SLACK_TOKENS = 8  # room for the closing braces after the last value
NEVER = 2**62  # ARSession.first_bad: no token chosen from overflowed hidden states


class AnswerScanner:
    """Follows the JSON structure of one answer as its text arrives, to tell when it is complete.

    The answer starts inside the outer object (after ``{\\n``). It is complete when the outer
    object closes, or when ``products`` product objects (depth 2) have closed: a model fine-tuned
    on stacked answers would otherwise go on writing products J+1, J+2, ... for a prompt of J.
    """

    def __init__(self, products: int):
        self.products = products
        self.cursor = JsonCursor(depth=1)
        self.closed = 0

    def feed(self, text: str) -> bool:
        """Read more answer text; True once the answer is complete."""
        cursor = self.cursor
        for ch in text:
            if cursor.read(ch) == CLOSE:
                if cursor.depth == 1 and ch == "}":
                    self.closed += 1
                if cursor.depth <= 0 or self.closed >= self.products:
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
    ended by itself or, with exact lengths, at its fixed length). Every token took a forward pass;
    ``extra["tokens"]`` keeps them all (tests compare decoders token for token)."""
    text = answer_prefix() + tokenizer.decode(tokens[:n], skip_special_tokens=True)
    return Result(
        request=request,
        values=parse_answer(request, text, complete),
        prompt_tokens=prompt_len,
        generated_tokens=n,
        forward_passes=len(tokens),
        decoder=decoder,
        extra={"text": text, "tokens": tuple(tokens)},
    )


class AutoregressiveDecoder(BatchedDecoder):
    name = "ar"

    def __init__(self, model, tokenizer, config: DecodeConfig, model_name: str = ""):
        if config.confidence:
            raise ValueError("confidence is HPD's (and its reference's): the baseline gives its values none")
        super().__init__(model, tokenizer, config, model_name)
        self.runner = ModelRunner(model, tokenizer, prefill_tokens=prefill_tokens(config.prefill_tokens, self.device),
                                  cudnn_attention=config.cudnn_attention,
                                  compile_layers=config.compiles(self.device, body_parameters(model), model.dtype))
        self.prefixes = PrefixStore(config.prefix_cache)
        self.spans = SpanVocabulary(tokenizer, self.runner.vocab_size) if config.span_decoding(self.device) else None
        self._texts: tuple[str, ...] | None = None  # token_texts, held here: len(tokenizer) is slow

    def token_text(self, token: int) -> str:
        if self._texts is None:
            self._texts = token_texts(self.tokenizer)
        return self._texts[token] if token < len(self._texts) else "\ufffd"

    def answer_spans(self, request: Request) -> AnswerSpans:
        """Span decoding: the rule for this request's answer, at the start of what the model writes."""
        return AnswerSpans(self.spans, [product_fields(p) for p in request.products])

    def prompt_text(self, request: Request) -> str:
        """The prompt, up to where the model writes: the instructions, the products, ``{\\n``."""
        return render_prompt(request, self.tokenizer) + answer_prefix()

    def prompt_ids(self, request: Request) -> list[int]:
        return encode_prompt(self.tokenizer, self.prompt_text(request))

    def answer_budget(self, request: Request) -> int:
        """Most new tokens the answer can need: skeleton tokens plus K_max per value."""
        segments = skeleton_segments(request, specials=special_texts(self.tokenizer))
        return self.budget_for(request, sum(len(encode(self.tokenizer, s)) for s in segments))

    def budget_for(self, request: Request, skeleton_tokens: int) -> int:
        """``answer_budget`` of a request whose skeleton takes this many tokens."""
        return skeleton_tokens + request.num_slots * self.config.max_value_tokens + ANSWER_SLACK_TOKENS

    def cost(self, item: tuple[list[int], int]) -> tuple[int, int]:
        prompt, budget = item
        return len(prompt), max(1, -(-budget // self.config.max_value_tokens))  # rounded up: rows as ARSession sizes them or fewer

    def prompt(self, request: Request, ids: list[int]) -> Prompt:
        prefix = 0
        if self.prefixes.capacity:
            text = shared_prefix_text(request, self.tokenizer, hpd=False)
            prefix = shared_prefix_length(self.tokenizer, text, ids, len(ids) - 1)
        return Prompt(tuple(ids), tuple(range(len(ids))), prefix, (len(ids) - 1,))

    def prompts(self, requests: list[Request], prompts: list[list[int]]) -> list[Prompt]:
        """``prompt`` of each request, each category's shared prefix tokenized once."""
        prefixes = [0] * len(requests)
        if self.prefixes.capacity and requests:
            texts = [shared_prefix_text(r, self.tokenizer, hpd=False) for r in requests]
            prefixes = shared_prefix_lengths(self.tokenizer, texts, prompts, [len(ids) - 1 for ids in prompts])
        return [Prompt(tuple(ids), tuple(range(len(ids))), n, (len(ids) - 1,)) for ids, n in zip(prompts, prefixes)]

    def prepare(self, requests: list[Request], budgets: list[int] | None = None) -> list[tuple[list[int], int]]:
        """(prompt ids, answer budget) per request, as ``prompt_ids`` and ``answer_budget`` give
        them, every text of every request tokenized in one call (``layout.encode_many``);
        ``budgets``: these budgets instead (exact lengths), the skeletons not tokenized."""
        specials, texts, counts = special_texts(self.tokenizer), [], []
        for request in requests:
            segments = skeleton_segments(request, specials=specials) if budgets is None else []
            texts += [self.prompt_text(request), *segments]
            counts.append(1 + len(segments))
        encoded = encode_many(self.tokenizer, texts)
        start = start_ids(self.tokenizer) if requests else []
        items, at = [], 0
        for i, (request, n) in enumerate(zip(requests, counts)):
            skeleton = sum(len(ids) for ids in encoded[at + 1 : at + n])
            budget = budgets[i] if budgets is not None else self.budget_for(request, skeleton)
            items.append((with_start(encoded[at], start), budget))
            at += n
        return items

    def decode(
        self, requests: list[Request], exact_new_tokens: list[int] | None = None, prepared: list | None = None
    ) -> list[Result]:
        """``exact_new_tokens`` (benchmarks on random weights): generate exactly this many tokens
        per request, ignoring stop conditions. ``prepared``: ``prepare(requests)``, if done already."""
        if exact_new_tokens is not None:
            items = self.prepare(requests, budgets=exact_new_tokens)
        else:
            items = prepared if prepared is not None else self.prepare(requests)
        generator = make_generator(self.config, self.device)

        def run(indices: list[int]) -> list[Result]:
            return self.decode_batch(
                [requests[i] for i in indices],
                [items[i][0] for i in indices],
                [items[i][1] for i in indices],
                exact=exact_new_tokens is not None,
                generator=generator,
            )

        return self.decode_in_batches(requests, items, run)

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
        """Generate for one batch (one session); each row stops by itself (or, ``exact``, after
        its budget). ``forced[b]`` (tests): feed these tokens instead of choosing."""
        if self.spans is not None and (exact or forced is not None):
            raise ValueError("span decoding does not go with exact lengths or teacher forcing")
        session = ARSession(self, requests, prompts, budgets, exact, generator, forced)
        session.on_done = self.session_done(requests)
        return session.run(self.parser)


class ARSession(Session):
    """One baseline batch: one query per busy row per step."""

    def __init__(self, decoder: AutoregressiveDecoder, requests, prompts, budgets, exact, generator, forced):
        cfg, dev = decoder.config, decoder.device
        self.decoder, self.requests, self.budgets = decoder, requests, budgets
        self.exact, self.generator, self.forced = exact, generator, forced
        self.fixed = cfg.fixed_steps(dev)
        self.check_every = cfg.check_every if self.fixed else 1
        self.L, self.T = max(len(p) for p in prompts), max(budgets)
        rows = session_rows([len(p) for p in prompts], [1] * len(prompts), self.T, decoder.token_budget, cfg.max_batch_size)
        specs = decoder.prompts(requests, prompts)
        super().__init__(decoder.runner, decoder.prefixes, specs, rows, self.L + self.T + 1)
        self.generated: list[list[int]] = [[] for _ in requests]
        self.ends: list[tuple[int, bool] | None] = [None] * len(requests)  # (answer length, complete)
        self.scanners = [AnswerScanner(len(r.products)) for r in requests]
        self.last = torch.zeros(rows, dtype=torch.long, device=dev)  # the token each row feeds next
        self.fed = torch.zeros(rows, dtype=torch.long, device=dev)  # tokens each row has fed
        self.length = torch.zeros(rows, dtype=torch.long, device=dev)  # its prompt length
        self.budget = torch.zeros(rows, dtype=torch.long, device=dev)
        self.first_bad = torch.full((rows,), NEVER, dtype=torch.long, device=dev)  # see note_first_bad
        self.answers = None  # span decoding: the span rule of each answer (spans.AnswerSpans)
        if decoder.spans is not None:
            self.answers = [decoder.answer_spans(r) for r in requests]
        # fixed steps: the last check_every steps' tokens (-1: none), newest last, and how many the host has not read
        self.recent = torch.full((rows, self.check_every), -1, dtype=torch.long, device=dev)
        self.unread = 0
        self.replay_fixed_steps(cfg, host_step=forced is not None or self.answers is not None)
        self.append_at = [0] * rows  # packed steps: where each row's next fed token goes

    def start(self, rows: list[int], items: list[int], hidden: list[torch.Tensor]) -> None:
        dev = self.decoder.device
        rows_t = torch.tensor(rows, device=dev)
        self.length[rows_t] = torch.tensor([len(self.prompts[i].ids) for i in items], device=dev)
        self.budget[rows_t] = torch.tensor([self.budgets[i] for i in items], device=dev)
        self.fed[rows_t] = 0
        self.first_bad[rows_t] = NEVER
        self.recent[rows_t] = -1  # fixed steps after the row's last prompt ended: not this prompt's tokens
        for row, item in zip(rows, items):
            self.append_at[row] = len(self.prompts[item].ids)
        tokens = self.choose(self.decoder.runner.finite(torch.cat(hidden)), items, [0] * len(items))
        self.last[rows_t] = tokens
        for item, token in zip(items, tokens.tolist()):
            self.read(item, token)

    def choose(self, hidden: torch.Tensor, items: list[int | None], index: list[int], used=None) -> torch.Tensor:
        """Next tokens from the hidden states; forcing (tests): token ``index[i]`` of ``forced[items[i]]``.
        ``used``: which queries' tokens are kept (fixed steps; None: all)."""
        if self.answers is not None:
            return self.choose_spans(hidden, items, [True] * len(items) if used is None else used)
        tokens = self.runner.next_tokens(hidden, self.decoder.config, self.generator)
        if self.forced is not None:
            pad = self.decoder.tokenizer.pad_token_id
            picked = [self.forced[i][k] if i is not None and k < len(self.forced[i]) else pad for i, k in zip(items, index)]
            tokens = torch.tensor(picked, device=tokens.device)
        return tokens

    def choose_spans(self, hidden: torch.Tensor, items: list[int | None], used: list[bool]) -> torch.Tensor:
        """Span decoding: inside a value, the LM head over the tokens its span rule allows; outside,
        the whole head, and a token that would open a value against the rule is masked out. The
        answers' rules read the chosen tokens at once (a host round trip per step)."""
        cfg, runner, texts = self.decoder.config, self.runner, self.decoder.spans.texts
        tokens = torch.full((hidden.shape[0],), runner.pad_id, dtype=torch.long, device=hidden.device)
        live = [i for i, (item, ok) in enumerate(zip(items, used)) if ok and item is not None and self.ends[item] is None]
        inside = [i for i in live if self.answers[items[i]].value is not None]
        outside = [i for i in live if self.answers[items[i]].value is None]
        if inside:
            allowed = []
            for i in inside:
                answer = self.answers[items[i]]
                allowed.append([t for t in answer.value.allowed() if ":" not in texts[t] or answer.allows(t)])
            tokens[inside] = runner.allowed_tokens(hidden[inside], allowed, cfg, self.generator)
        if outside:
            chosen = runner.next_tokens(hidden[outside], cfg, self.generator).tolist()
            for i, token in zip(outside, chosen):
                answer = self.answers[items[i]]
                if ":" in texts[token] and not answer.allows(token):  # rare: mask what the rule forbids
                    logits = runner.logits(hidden[i : i + 1])[0]
                    banned = [t for t, text in enumerate(texts) if ":" in text and not answer.allows(t)]
                    logits[banned] = float("-inf")
                    token = int(select(logits, cfg, self.generator))
                tokens[i] = token
        for i, token in zip(live, tokens[live].tolist()):
            self.answers[items[i]].feed(texts[token])
        return tokens

    def read(self, item: int, token: int) -> None:
        """The host's reading of a row's next token: the stop rule (as ``answer_length``)."""
        if self.ends[item] is not None:
            return  # fixed steps run on past a row's end until the next check
        generated = self.generated[item]
        generated.append(token)
        n = len(generated)
        if not self.exact and token in self.decoder.special:
            self.ends[item] = (n - 1, True)  # the end token is not part of the answer
        elif not self.exact and self.scanners[item].feed(self.decoder.token_text(token)):
            self.ends[item] = (n, True)
        elif n >= self.budgets[item] or (self.forced is not None and n == len(self.forced[item])):
            self.ends[item] = (n, self.exact)

    def packed_step(self) -> None:
        busy = [row for row in range(self.rows) if self.item[row] is not None and self.ends[self.item[row]] is None]
        if not busy:
            return
        r = torch.tensor(busy, device=self.decoder.device)
        index = torch.tensor([self.append_at[row] for row in busy], device=r.device)
        hidden = self.runner.forward(self.cache, r, index, self.last[r], self.length[r] + self.fed[r],
                                     torch.zeros_like(r), end=int(index.max()) + 1)  # fmt: skip
        for row in busy:
            self.append_at[row] += 1
        self.fed[r] += 1
        self.note_first_bad(hidden, r, self.fed[r])
        items = [self.item[row] for row in busy]
        tokens = self.choose(hidden, items, [len(self.generated[i]) for i in items])
        self.last[r] = tokens
        for item, token in zip(items, tokens.tolist()):
            self.read(item, token)

    def fixed_step(self) -> None:
        """Every row feeds its last token at the fixed place  L + tokens fed; nothing read back."""
        R, dev = self.rows, self.decoder.device
        r = torch.arange(R, device=dev)
        live = self.fed + 1 < self.budget  # a row's budget bounds its tokens (ends are read later)
        index = torch.where(live, self.L + self.fed, self.cache.scratch)
        hidden = self.runner.forward(self.cache, r, index, self.last, self.length + self.fed, torch.zeros_like(r),
                                     end=self.cache.capacity, present=live, grid=(R, 1))  # fmt: skip
        self.fed += live
        self.note_first_bad(hidden, r, self.fed, live)
        index = self.fed.tolist() if self.forced is not None else [0] * R  # forcing is a test tool
        tokens = self.choose(hidden, self.item, index, live.tolist() if self.answers is not None else None)
        self.last.copy_(torch.where(live, tokens, self.last))
        self.recent.copy_(torch.cat([self.recent[:, 1:], torch.where(live, tokens, -1)[:, None]], 1))

    def after_fixed_step(self) -> None:
        self.unread += 1
        if self.unread >= self.check_every:
            self.flush()

    def flush(self) -> None:
        """Read the fixed steps' tokens back (one host transfer) into the stop rule."""
        if not self.unread:
            return
        steps = self.recent[:, self.check_every - self.unread :].tolist()  # (rows, steps)
        self.unread = 0
        for row, tokens in enumerate(steps):
            for token in tokens:
                if self.item[row] is not None and token >= 0:
                    self.read(self.item[row], token)

    def done(self) -> list[int]:
        return [row for row in range(self.rows) if self.item[row] is not None and self.ends[self.item[row]] is not None]

    def outputs(self, rows: list[int], items: list[int]) -> list:
        for row in rows:
            self.budget[row] = 0
        first_bad = self.first_bad[torch.tensor(rows, device=self.decoder.device)].tolist()
        return [(*self.ends[item], first) for item, first in zip(items, first_bad)]

    def note_first_bad(self, hidden: torch.Tensor, rows: torch.Tensor, index: torch.Tensor, fed=None) -> None:
        """Per row, the first answer token (``index``) chosen from hidden states that hold NaN or
        infinity (``fed`` of the rows; None: all). The step's rows are distinct. Fixed steps run on
        past a row's end until the next check, so what counts is whether that token is one the host
        read (``parse``), not whether any step overflowed."""
        bad = ~torch.isfinite(hidden).all(-1)
        bad = bad if fed is None else bad & fed
        self.first_bad[rows] = torch.minimum(self.first_bad[rows], torch.where(bad, index, NEVER))

    def parse(self, item: int, outputs) -> Result:
        n, complete, first_bad = outputs
        if first_bad < len(self.generated[item]):  # a token of its answer (or the one that ended it)
            reason = self.runner.overflow_reason(" while decoding")
            return error_result(self.requests[item], self.decoder.name, reason, len(self.prompts[item].ids))
        return make_result(self.decoder.name, self.decoder.tokenizer, self.requests[item], len(self.prompts[item].ids),
                           self.generated[item], n, complete)  # fmt: skip
