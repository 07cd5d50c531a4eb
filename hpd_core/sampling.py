"""Pick the next token from logits: greedy by default, or seeded temperature / top-p sampling."""

from __future__ import annotations

import torch

from hpd_core.config import DecodeConfig


def make_generator(config: DecodeConfig, device) -> torch.Generator | None:
    if config.greedy:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(config.seed)
    return generator


def select(logits: torch.Tensor, config: DecodeConfig, generator: torch.Generator | None) -> torch.Tensor:
    """logits (..., V) -> token ids (...)."""
    if config.greedy:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    if config.top_p < 1.0:
        sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
        keep = sorted_probs.cumsum(dim=-1) - sorted_probs < config.top_p  # always keeps the top token
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter_(-1, sorted_ids, sorted_probs)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def chosen_logprob(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits (..., V), tokens (...) -> each token's log-probability (...) under the logits'
    distribution at temperature 1 (float32): what a value's ``confidence`` is made of, whichever
    temperature picked the tokens. Masked logits (-inf) give the distribution among the rest."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
