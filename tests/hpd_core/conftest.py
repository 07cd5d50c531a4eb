"""Hermetic fixtures for engine tests: a small byte-level BPE tokenizer trained here, and tiny
random decoder-only models (fp32, CPU) of several architectures. Nothing is downloaded."""

from __future__ import annotations

import json
import random

import pytest
import torch

from hpd_core.prompts import render_answer, render_instructions
from hpd_core.types import Attribute, Product, Request

ARCHITECTURES = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3", "qwen3-swa", "mistral-swa"]
# The last three have sliding-window layers with a window far smaller than the test layouts (whose
# positions reach a few hundred): Gemma 3 and Qwen3 mix sliding and full layers, Mistral slides in all.
TINY_WINDOW = 16
WORDS = (
    "acme nike red blue cotton steel 500 ml pack of 12 women's men's size large small oz "
    "shoe sneaker loafer leather black/white \"quoted\" back\\slash ü café 10 D US"
).split()


def random_text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def random_request(rng: random.Random, n_products: int, n_attributes: int, title_words: int = 6) -> Request:
    attributes = tuple(Attribute(f"attr {i} {rng.choice(WORDS)}") for i in range(n_attributes))
    products = tuple(
        Product(f"p{j}", random_text(rng, rng.randint(1, title_words))) for j in range(n_products)
    )
    return Request(category=rng.choice(["Shoes", "Food & Drink"]), attributes=attributes, products=products)


def _corpus() -> list[str]:
    rng = random.Random(0)
    texts = []
    for _ in range(200):
        req = random_request(rng, rng.randint(1, 3), rng.randint(1, 4))
        values = [[rng.choice([None, random_text(rng, 2)]) for _ in req.attributes] for _ in req.products]
        texts.append(render_instructions(req) + "\n\nAnswer:\n" + render_answer(req, values))
    texts.append(json.dumps({"a": "x\"y", "b": None, "c": "\\"}, indent=2))
    return texts


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>")


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


def tiny_config(arch: str, vocab_size: int, **overrides):
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
        tie_word_embeddings=False,
        initializer_range=0.2,  # larger than usual: decisive logits, no near-ties in argmax
    )
    if arch in ("qwen3", "qwen3-swa", "gemma3"):
        common["head_dim"] = 8
    if arch in ("mistral", "qwen2", "qwen3"):
        common["sliding_window"] = None
    if arch == "qwen3-swa":
        common.update(sliding_window=TINY_WINDOW, use_sliding_window=True, max_window_layers=1,
                      layer_types=["full_attention", "sliding_attention"])
    if arch == "mistral-swa":
        common["sliding_window"] = TINY_WINDOW
    if arch == "gemma3":
        common.update(sliding_window=TINY_WINDOW, layer_types=["sliding_attention", "full_attention"],
                      query_pre_attn_scalar=8)
    common.update(overrides)
    model_type = {"gemma3": "gemma3_text", "qwen3-swa": "qwen3", "mistral-swa": "mistral"}.get(arch, arch)
    return AutoConfig.for_model(model_type, **common)


def tiny_model(arch: str, vocab_size: int, seed: int = 0, attention: str = "sdpa", **overrides):
    """A tiny random model; ``overrides`` replace config fields (e.g. ``head_dim``)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab_size, **overrides), attn_implementation=attention)
    return model.float().eval()


FLOAT_TIE = 1e-4  # logits this close are a tie: float32 rounding of another summation order may pick either


def _assert_tie(logits, fast_token: int, slow_token: int, where: str) -> None:
    gap = (logits[slow_token] - logits[fast_token]).item()
    assert abs(gap) <= FLOAT_TIE, f"{where}: {fast_token} chosen against {slow_token}, logits {gap:.3g} apart"


def parts_at_a_tie(model, prompt: list[int], fast: tuple[int, ...], slow: tuple[int, ...]) -> bool:
    """False when two greedy decodings of ``prompt`` are the same tokens. Otherwise they must part
    where the slow one's own logits (no cache, one sequence) hold a tie between the two choices,
    within FLOAT_TIE, and True says so (what follows a tie is not comparable); a real difference
    fails here."""
    if fast == slow:
        return False
    step = next((i for i, (a, b) in enumerate(zip(fast, slow)) if a != b), None)
    assert step is not None, f"same tokens, different lengths: {len(fast)} against {len(slow)}"
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + list(slow[:step])])).logits[0, -1].float()
    _assert_tie(logits, fast[step], slow[step], f"token {step}")
    return True


def slots_part_at_a_tie(reference, request, fast: list[list[int]], slow: list[list[int]]) -> bool:
    """parts_at_a_tie for HPD: ``fast`` and ``slow`` are every slot's tokens (``slot_tokens``),
    ``slow`` from ``reference`` (a ReferenceDecoder). At the first step where a slot differs, the
    oracle's logits for the state before it (each slot fed its tokens so far, a finished slot all
    but its last) must hold a tie between the two choices."""
    if fast == slow:
        return False
    step, slot = min(
        (next((k for k, (a, b) in enumerate(zip(f, s)) if a != b), min(len(f), len(s))), i)
        for i, (f, s) in enumerate(zip(fast, slow))
        if f != s
    )
    assert step < min(len(fast[slot]), len(slow[slot])), f"slot {slot}: same tokens, different lengths"
    layout = reference.prepare([request])[0]
    fed = [list(s[: min(step, len(s) - 1)]) for s in slow]
    with torch.inference_mode():
        logits = reference.step_logits(layout, fed)[slot]
    _assert_tie(logits, fast[slot][step], slow[slot][step], f"slot {slot} token {step}")
    return True


@pytest.fixture(scope="session")
def models(tokenizer):
    """One tiny random model per architecture, built once."""
    return {arch: tiny_model(arch, len(tokenizer)) for arch in ARCHITECTURES}
