"""Stop detection and value parsing: null, escaped quotes, closing quotes glued to the terminator."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_core.prompts import parse_answer, parse_value, render_answer, render_value
from hpd_core.stopping import (BARE, DONE, NUL, NUM_STATES, START, STRING, advance, column, token_text, token_texts,
                               transition_table)
from hpd_core.types import Attribute, Product, Request, Value


@pytest.mark.parametrize(
    "pieces, done_at",
    [
        ([' "', "Acme", '",'], 2),  # closing quote shares a token with the comma
        ([' "', "Acme", '"\n'], 2),  # ... or with the newline
        ([' "', "Acme", '"', ","], 2),  # a closed string is complete: its terminator is not awaited
        ([" null", ","], 0),  # ... nor null's
        ([" null", "\n"], 0),
        ([" null,"], 0),
        ([" nu", "ll", ","], 1),  # null across tokens
        ([" n", "one", ","], 2),  # a bare literal that is not null waits for its terminator
        ([" nu", "t", "\n"], 2),
        ([' "', 'say \\"hi\\"', '",'], 2),  # escaped quotes do not close the string
        ([' "', "a\\", '"', 'b",'], 3),  # an escaped quote split across tokens
        ([' "', "a,b\n}", '"', "}"], 2),  # terminators inside the string do not count
        ([' "', "null", '"'], 2),  # "null" inside a string is a string
        ([" 42", "}"], 1),  # a number may go on until its terminator
        ([" 42"], None),
        ([' "', "x"], None),  # not closed yet
    ],
)
def test_advance_stops_where_the_value_closes(pieces, done_at):
    state = START
    stopped = None
    for i, piece in enumerate(pieces):
        state = advance(state, piece)
        if state == DONE and stopped is None:
            stopped = i
    assert stopped == done_at


def test_states():
    assert advance(START, '  "ab') == STRING
    assert advance(START, ' "ab"') == DONE
    assert advance(START, " nul") == NUL
    assert advance(START, " nul ") == BARE
    assert advance(START, " 4") == BARE


def test_table_agrees_with_advance(tokenizer):
    table = transition_table(tokenizer, vocab_size=len(tokenizer) + 3)
    assert table.shape == (NUM_STATES, len(tokenizer) + 3)
    special = set(tokenizer.all_special_ids)
    for token_id in range(table.shape[1]):
        for state in range(NUM_STATES):
            expected = DONE if token_id in special else advance(state, token_text(tokenizer, token_id))
            assert table[state, token_id] == expected


@settings(max_examples=2000, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list(' \t\r\n",}\\{:ablnu0\u3000\u00a0\ufffd')), max_size=8))
def test_a_tokens_column_is_advance_from_every_state(text):
    """The table's shortcut for tokens without a quote, backslash or terminator equals the machine."""
    assert column(text) == tuple(advance(state, text) for state in range(NUM_STATES))


def test_token_texts_are_each_tokens_decode(tokenizer):
    """The texts (from the Rust decoder where it agrees) are what ``decode`` gives each token alone."""
    texts = token_texts(tokenizer)
    assert len(texts) == len(tokenizer)
    assert list(texts) == [token_text(tokenizer, i) for i in range(len(tokenizer))]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_the_table_of_each_shipped_tokenizer_agrees_with_advance(name):
    """The shipped tokenizers' whole vocabularies (Gemma's 262,144 tokens): the texts equal
    ``batch_decode``'s and the table equals the machine run on every token from every state."""
    from transformers import AutoTokenizer

    from hpd_core.config import ModelConfig
    from hpd_core.models import resolve_model_dir

    tok = AutoTokenizer.from_pretrained(resolve_model_dir(ModelConfig(name=name)))
    texts = token_texts(tok)
    assert list(texts) == tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=False)
    table = transition_table(tok).T.tolist()
    special = set(tok.all_special_ids)
    for token_id, text in enumerate(texts):
        expected = [DONE] * NUM_STATES if token_id in special else [advance(state, text) for state in range(NUM_STATES)]
        assert table[token_id] == expected, (token_id, text)


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.none(), st.text(max_size=20)), terminator=st.sampled_from([",", "\n"]))
def test_rendered_values_parse_back(value, terminator):
    text = render_value(value, terminator)
    assert advance(START, text) == DONE
    expected = value if value is None or value.strip() else None
    assert parse_value(text, finished=True) == Value(expected)


def test_parse_value_cases():
    assert parse_value(' "Acme",', True) == Value("Acme")
    assert parse_value(" null\n", True) == Value(None)
    assert parse_value(' "Ac', False) == Value("Ac", truncated=True)
    assert parse_value(' "Acme"', False) == Value("Acme")  # closed string: complete value
    assert parse_value(" Acme,", True) == Value(None, parse_error=True)
    assert parse_value(" 12,", True) == Value("12")
    assert parse_value(" true,", True) == Value("true")
    assert parse_value(' "C:\\\\', False) == Value("C:\\", truncated=True)  # a whole escaped backslash stays
    assert parse_value(' "C:\\', False) == Value("C:", truncated=True)  # a cut escape goes
    for number in ("10.50", "0.10", "1e3", "1E400", "-0", "NaN"):  # copied as written, not recomputed
        assert parse_value(f" {number},", True) == Value(number)
    assert parse_value(' "",', True) == Value(None)


def _request(j=2, names=("Brand", "Color")):
    return Request("C", tuple(Attribute(n) for n in names), tuple(Product(f"p{i}", "t") for i in range(j)))


def test_parse_answer_roundtrip_and_errors():
    request = _request()
    values = [["Acme", None], ['x"y', "red"]]
    parsed = parse_answer(request, render_answer(request, values), finished=True)
    assert [[v.value for v in row] for row in parsed] == values
    broken = parse_answer(request, "not json at all", finished=True)
    assert all(v.parse_error and v.value is None for row in broken for v in row)


def test_parse_answer_keeps_numbers_as_written():
    request = _request(names=("Size", "Count", "Flag"))
    text = '{"1": {"Size": 10.50, "Count": 12, "Flag": true}, "2": {"Size": 1e3, "Count": -0, "Flag": "x"}}'
    parsed = parse_answer(request, text, finished=True)
    assert [[v.value for v in row] for row in parsed] == [["10.50", "12", "true"], ["1e3", "-0", "x"]]
    cut = parse_answer(request, '{"1": {"Size": 7.250, "Count": 3', finished=False)  # recovered prefix
    assert cut[0][0] == Value("7.250")


def test_parse_answer_recovers_a_cut_off_answer():
    request = _request()
    text = '{\n  "1": {\n    "brand": "Acme",\n    "Color": "red"\n  },\n  "2": {\n    "Brand": "Zed",\n    "Col'
    parsed = parse_answer(request, text, finished=False)
    assert parsed[0] == (Value("Acme"), Value("red"))  # case-insensitive key fallback
    assert parsed[1][0] == Value("Zed")
    assert parsed[1][1] == Value(None, truncated=True)


def test_render_answer_is_json():
    request = _request()
    assert json.loads(render_answer(request, [["a", None], [None, "b"]]))["2"]["Color"] == "b"


def test_a_products_title_comes_last_in_its_text_and_a_title_alone_is_as_it_was():
    """The title goes right before the product's keys: a description between them cost the title's
    values (OA-Mine test with 1,000 characters of boilerplate each: F1 77.23 title last, 65.30 first;
    docs/quality.md). A product of a title alone is the object it always was."""
    from hpd_core.prompts import product_text

    attributes = (Attribute("Brand"),)
    full = Request("Shoes", attributes, (Product("p", "Diesel Sneaker", "A leather upper.", ("Lace-up",)),))
    assert product_text(full, 0) == '{"description": "A leather upper.", "features": ["Lace-up"], "title": "Diesel Sneaker"}'
    alone = Request("Shoes", attributes, (Product("p", 'Men\'s "Ace" Shoe'),))
    assert product_text(alone, 0) == json.dumps({"title": 'Men\'s "Ace" Shoe'}, ensure_ascii=False)


# the text of a fixed request's prompt and skeleton (both skeletons) under each prompt format
# (3: the same text as 2 for a prompt that fits the model's sliding window; a wider one is prompted
# as attribute groups since 2026-11-30, hpd_core/attribute_groups.py)
PROMPT_TEXT_DIGESTS = {2: "fa97c8fa69c04538", 3: "fa97c8fa69c04538"}


def test_a_change_of_the_prompt_text_raises_the_prompt_format():
    """Jobs record ``PROMPT_FORMAT`` so a resume by a version that prompts otherwise is refused
    (jobs/checks.py): a change of what a prompt says must come with a new number. If this fails,
    raise ``hpd_core.prompts.PROMPT_FORMAT`` and add the new digest here."""
    import hashlib

    from hpd_core import prompts

    request = Request("Shoes", (Attribute("Brand", "the maker"), Attribute("Size")),
                      (Product("a", "Nike Air 10", "Running shoe", ("light", "red")), Product("b", 'Adidas "Samba"')))
    text = "\x00".join(prompts.render_instructions(request, s) + "\x01" + "\x01".join(prompts.skeleton_segments(request, s))
                       for s in prompts.SKELETONS)
    assert PROMPT_TEXT_DIGESTS.get(prompts.PROMPT_FORMAT) == hashlib.sha256(text.encode()).hexdigest()[:16]
