"""The span rule: ``SpanSlot.allowed`` (lookups) equals ``walk`` (one character at a time) over the
whole vocabulary, and every value the rule lets a slot finish is a span of its product's text."""

import random

import pytest

from hpd_core.prompts import parse_value
from hpd_core.spans import DONE, START, STRING, SpanVocabulary, State, field_texts, walk
from hpd_core.types import Product

from .conftest import WORDS, random_text

TEXTS = [
    ("acme red shoe, size 10 D US",),
    ('say "quoted" back\\slash and café',),  # JSON escapes and a non-ASCII character
    ("nike 500 ml", "pack of 12", "women's cotton"),  # title, description, a feature
    ("jacket\nColor: Red", "Size 10\tBlue C:\\bin", "Model X\x0212"),  # escapes a span must not cut
]


def brute_force(vocab: SpanVocabulary, state: State, texts) -> list[int]:
    """``walk`` over the vocabulary; a token that leaves an empty string open needs a follower."""
    found = []
    for i, t in vocab.usable:
        after = walk(state, t, texts)
        if after is None:
            continue
        if after.mode == STRING and after.places is None and not brute_force(vocab, after, texts):
            continue
        found.append(i)
    return found


def random_walks(vocab: SpanVocabulary, fields, rng: random.Random, walks: int, max_tokens: int = 12):
    """(state, slot) pairs met while choosing random allowed tokens from the start."""
    text = vocab.product(fields)
    for _ in range(walks):
        slot = text.slot()
        for _ in range(max_tokens):
            yield slot.state, slot
            if slot.state.mode == DONE:
                break
            slot.advance(rng.choice(slot.allowed()))


@pytest.mark.parametrize("fields", TEXTS)
def test_allowed_equals_the_character_rule_over_the_vocabulary(tokenizer, fields):
    vocab = SpanVocabulary(tokenizer)
    rng = random.Random(0)
    seen = set()
    for state, slot in random_walks(vocab, fields, rng, walks=60):
        if state.mode == DONE or (state.mode, state.content) in seen:
            continue
        seen.add((state.mode, state.content))
        assert slot.allowed() == brute_force(vocab, state, slot.text.texts), state
    assert {mode for mode, _ in seen} >= {START, STRING}
    assert any(mode == STRING and content for mode, content in seen)


def test_every_finished_value_is_a_span_of_its_products_text(tokenizer):
    vocab = SpanVocabulary(tokenizer)
    rng = random.Random(1)
    finished = 0
    for n in range(40):
        product = Product(f"p{n}", random_text(rng, 6), description=random_text(rng, 3) if n % 3 == 0 else None,
                          features=(random_text(rng, 2),) if n % 4 == 0 else ())
        fields = (product.title, product.description, *product.features)
        text = vocab.product(fields)
        for _ in range(10):
            slot, tokens = text.slot(), []
            while slot.state.mode != DONE and len(tokens) < 40:
                token = rng.choice(slot.allowed())
                slot.advance(token)
                tokens.append(token)
            if slot.state.mode != DONE:
                continue
            finished += 1
            value = parse_value(tokenizer.decode(tokens), finished=True)
            assert not value.parse_error and not value.truncated
            assert value.value is None or any(value.value in f for f in fields if f), (value, fields)
    assert finished > 100


def test_a_span_neither_begins_nor_ends_inside_an_escape():
    """JSON writes a newline as \\n, a tab as \\t, a backslash as \\\\ and a control character as
    \\u0002: a span that began after the backslash or ended before the escape's end would read as
    another character ("nColor", a backspace) or none. Before, the rule allowed both."""
    texts = field_texts(("Waterproof jacket\nColor: Red", "Size 10\tBlue", "Path C:\\bin", "Model X\x0212"))
    for value in ('"nColor: Red",', '"tBlue",', '"\\bin",', '"Model X\\u00",', '"Model X\\u0",'):
        assert walk(State(), " " + value, texts) is None, value
    for value in ('"Color: Red",', '"jacket\\nColor",', '"Blue",', '"C:\\\\bin",', '"Model X\\u000212",', '"bin",'):
        after = walk(State(), " " + value, texts)
        assert after is not None and after.mode == DONE, value
        parsed = parse_value(" " + value, finished=True).value
        assert any(parsed in f for f in ("Waterproof jacket\nColor: Red", "Size 10\tBlue", "Path C:\\bin", "Model X\x0212"))


def test_a_text_no_token_can_start_opens_no_string(tokenizer):
    vocab = SpanVocabulary(tokenizer)
    pieces = [i for i, t in enumerate(vocab.texts) if "\ufffd" in t]
    assert pieces  # the tiny vocabulary splits some characters into byte pieces
    lone = next(ch for ch in "ü€字" if "\ufffd" in tokenizer.decode(tokenizer.encode(ch)[:1]))
    text = vocab.product((lone,))
    allowed = text.slot().allowed()
    assert allowed == brute_force(vocab, State(), text.texts)
    assert all(walk(State(), vocab.texts[i], text.texts).mode != STRING for i in allowed)  # null only


def test_a_token_outside_the_rule_is_refused(tokenizer):
    vocab = SpanVocabulary(tokenizer)
    slot = vocab.product(("red shoe",)).slot()
    opening = tokenizer.encode(' "', add_special_tokens=False)
    for token in opening:
        slot.advance(token)
    with pytest.raises(ValueError, match="breaks the span rule"):
        slot.advance(tokenizer.encode("blue", add_special_tokens=False)[0])


def test_words_of_the_fixture_cover_escapes():
    assert '"quoted"' in WORDS and "back\\slash" in WORDS  # the rule's escape paths are exercised
