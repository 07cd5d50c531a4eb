"""The baseline: ordinary autoregressive generation of the whole JSON answer, same prompts.

Prompts are the HPD prompts up to where the answer starts, seeded with ``{\\n``; the model writes
keys, punctuation and values one token at a time (batched, left-padded, KV cache, Hugging Face
``generate``). Generation stops at the end-of-turn token, at the closing ``\\n}`` of the answer, or
after a token limit that fits the whole answer with every value at K_max tokens. The text is parsed
into the same Result type; invalid JSON gives null values flagged ``parse_error``.
"""

from __future__ import annotations

import torch

from hpd_core.batching import plan_batches, run_split_on_oom
from hpd_core.config import DecodeConfig
from hpd_core.engine import error_result
from hpd_core.layout import encode
from hpd_core.prompts import answer_prefix, parse_answer, render_prompt, skeleton_segments
from hpd_core.types import Request, Result

ANSWER_END = "\n}"
ANSWER_SLACK_TOKENS = 8  # room for the closing braces after the last value


class AutoregressiveDecoder:
    name = "ar"

    def __init__(self, model, tokenizer, config: DecodeConfig, model_name: str = ""):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.model_name = model_name
        self.device = model.get_output_embeddings().weight.device

    def prompt_ids(self, request: Request) -> list[int]:
        return encode(self.tokenizer, render_prompt(request, self.tokenizer) + answer_prefix())

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

        def run(indices: list[int]) -> list[tuple[int, Result]]:
            out = self.decode_batch(
                [requests[i] for i in indices],
                [prompts[i] for i in indices],
                [budgets[i] for i in indices],
                exact=exact_new_tokens is not None,
            )
            return list(zip(indices, out))

        def fail(i: int, reason: str) -> tuple[int, Result]:
            return i, error_result(requests[i], self.name, reason, len(prompts[i]))

        for batch in batches:
            for i, result in run_split_on_oom(batch, run, fail):
                results[i] = result
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def decode_batch(self, requests: list[Request], prompts: list[list[int]], budgets: list[int], exact: bool) -> list[Result]:
        """Generate for one batch; each row stops by itself, or (``exact``) after its budget."""
        tok = self.tokenizer
        max_new = max(budgets)
        L = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), L), tok.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), L), dtype=torch.long)
        for b, p in enumerate(prompts):  # left padding
            ids[b, L - len(p) :] = torch.tensor(p)
            attention[b, L - len(p) :] = 1
        kwargs: dict = {"max_new_tokens": max_new, "pad_token_id": tok.pad_token_id}
        if exact:
            kwargs.update(min_new_tokens=max_new, eos_token_id=None)
        else:
            kwargs.update(stop_strings=[ANSWER_END], tokenizer=tok)
        if self.config.greedy:
            kwargs.update(do_sample=False)
        else:
            torch.manual_seed(self.config.seed)
            kwargs.update(do_sample=True, temperature=self.config.temperature, top_p=self.config.top_p, top_k=None)
        out = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=attention.to(self.device), **kwargs
        )
        new = out[:, L:].cpu()
        stop_ids = set(tok.all_special_ids) if not exact else set()
        results = []
        for b, request in enumerate(requests):
            row = new[b].tolist()[: budgets[b]]
            n = len(row)
            for i, t in enumerate(row):  # the answer ends at the first special token (eos / padding)
                if t in stop_ids:
                    n = i
                    break
            text = answer_prefix() + tok.decode(row[:n], skip_special_tokens=True)
            finished = exact or n < len(row) or text.rstrip().endswith("}")
            results.append(
                Result(
                    request=request,
                    values=parse_answer(request, text, finished),
                    prompt_tokens=len(prompts[b]),
                    generated_tokens=n,
                    forward_passes=new.shape[1],
                    decoder=self.name,
                    extra={"text": text},
                )
            )
        return results
