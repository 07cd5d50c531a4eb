"""Text that spells a special token (``<eos>``) is read as plain text, never as the control token:
in the prompt, the skeleton, the span rule and the training labels, with the JSON value unchanged."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_core.collate import Example, ar_features, hpd_features, value_tokens
from hpd_core.config import DecodeConfig
from hpd_core.decoders import make_decoder
from hpd_core.layout import build_layout, encode
from hpd_core.prompts import (
    NO_SPECIALS,
    guard_specials,
    parse_value,
    render_answer,
    render_prompt,
    render_value,
    special_texts,
)
from hpd_core.spans import DONE, State, field_texts, walk
from hpd_core.types import Attribute, Product, Request

from .conftest import random_request

EVIL = "red <eos> shoe <pad>x<<eos>> \\<eos> \\\\<eos>"


def evil_request(rng: random.Random, n_products: int = 2) -> Request:
    """A request whose category, attribute names and every product field spell special tokens."""
    base = random_request(rng, n_products, 2)
    products = tuple(
        Product(p.product_id, f"{p.title} {EVIL}", description=f"<eos>{j}", features=("x<pad>", p.title))
        for j, p in enumerate(base.products)
    )
    return Request("Shoes <eos>", (Attribute("Brand<eos>"), Attribute("Size", description="sizes <eos> \\<pad>")), products)


def special_ids(tokenizer) -> set[int]:
    return set(tokenizer.all_special_ids)


def test_special_texts_are_the_tokenizers_control_tokens(tokenizer):
    assert special_texts(tokenizer) == {"<pad>", "<eos>"}
    assert special_texts(tokenizer) is special_texts(tokenizer)  # read once per tokenizer


def test_special_tokens_spelled_as_words_or_whitespace_are_not_broken():
    """Breaking a special token that begins with a letter, digit or whitespace would rewrite
    ordinary words and the JSON's layout; such tokens are left out."""
    from types import SimpleNamespace

    added = {i: SimpleNamespace(content=c, special=True) for i, c in enumerate(("<eos>", "[INST]", "user", "\n\n", "7x"))}
    added[9] = SimpleNamespace(content="<table>", special=False)
    fake = SimpleNamespace(added_tokens_decoder=added, all_special_tokens=["<eos>"])
    assert special_texts(fake) == {"<eos>", "[INST]"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<eos>", "<pad>", "<", ">", "eos", "\\", '"', "\n", "u", "003c", "é", "😀", " ", "a"]), max_size=14))
def test_guard_keeps_the_json_string_and_leaves_no_spelling(pieces):
    specials = frozenset({"<eos>", "<pad>"})
    text = "".join(pieces)
    body = json.dumps(text, ensure_ascii=False)
    guarded = guard_specials(body, specials)
    assert json.loads(guarded) == text  # the same JSON value
    assert "<eos>" not in guarded and "<pad>" not in guarded
    if "<eos>" not in body and "<pad>" not in body:
        assert guarded is body  # text with no spelling is left as it is
    assert guard_specials(guarded, specials) == guarded


def test_guard_breaks_spellings_in_plain_text_too():
    """An attribute description is plain text in the prompt; a backslash before a spelling there
    escapes nothing, and the spelling is still broken."""
    assert guard_specials("sizes \\<eos> and <pad>", frozenset({"<eos>", "<pad>"})) == "sizes \\\\u003ceos> and \\u003cpad>"
    assert guard_specials("anything", NO_SPECIALS) == "anything"


@pytest.mark.parametrize("skeleton", ["after-products", "interleaved"])
def test_a_prompt_spelling_special_tokens_holds_none(tokenizer, skeleton):
    request = evil_request(random.Random(0))
    layout = build_layout(request, tokenizer, 4, skeleton)
    assert not special_ids(tokenizer) & set(layout.input_ids)
    assert "<eos>" not in render_prompt(request, tokenizer, skeleton)
    unguarded = encode(tokenizer, f"x {EVIL}")  # what the product text was read as before
    assert tokenizer.eos_token_id in unguarded


def test_the_baselines_prompt_and_answer_hold_none(models, tokenizer):
    request = evil_request(random.Random(1))
    decoder = make_decoder("ar", models["llama"], tokenizer, DecodeConfig(max_value_tokens=4))
    assert not special_ids(tokenizer) & set(decoder.prompt_ids(request))
    values = [["<eos>", "a <pad> b"], [None, "x"]]
    features = ar_features(tokenizer, Example(request, tuple(map(tuple, values))))
    assert features.input_ids.count(tokenizer.eos_token_id) <= 1  # only the answer's own end
    assert tokenizer.pad_token_id not in features.input_ids
    assert json.loads(render_answer(request, values, special_texts(tokenizer)))["1"]["Brand<eos>"] == "<eos>"


def test_training_labels_read_a_spelled_value_as_text(tokenizer):
    request = evil_request(random.Random(2), n_products=1)
    example = Example(request, (("<eos>", "10 <pad>"),))
    for tokens in value_tokens(tokenizer, example):
        assert not special_ids(tokenizer) & set(tokens)
    features = hpd_features(tokenizer, example, 8, "interleaved")
    assert not special_ids(tokenizer) & set(features.input_ids)


def test_the_span_rule_copies_the_text_as_the_prompt_writes_it(tokenizer):
    specials = special_texts(tokenizer)
    fields = (f"acme {EVIL}", "<eos>12")
    texts = field_texts(fields, specials)
    for value in ("red <eos> shoe", "<eos>12", "<<eos>>", "\\<eos>"):
        written = render_value(value, ",", specials)
        after = walk(State(), written, texts)
        assert after is not None and after.mode == DONE, written
        assert parse_value(written, finished=True).value == value
        assert not special_ids(tokenizer) & set(encode(tokenizer, written))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("spans", ["off", "on"])
def test_hpd_equals_the_oracle_on_text_spelling_special_tokens(models, tokenizer, arch, spans):
    rng = random.Random(3)
    requests = [evil_request(rng, 2), evil_request(rng, 1)]
    config = DecodeConfig(max_value_tokens=6, spans=spans)
    fast = make_decoder("hpd", models[arch], tokenizer, config).decode(requests)
    slow = make_decoder("reference", models[arch], tokenizer, config).decode(requests)
    assert [r.extra["slot_tokens"] for r in fast] == [r.extra["slot_tokens"] for r in slow]
    assert [r.values for r in fast] == [r.values for r in slow]
    if spans == "on":
        for result in fast:
            for product, _, value in result.items():
                fields = [f for f in (product.title, product.description, *product.features) if f]
                assert value.value is None or value.truncated or any(value.value in f for f in fields)
