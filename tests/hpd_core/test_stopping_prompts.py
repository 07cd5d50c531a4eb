"""Stop detection and value parsing: null, escaped quotes, closing quotes glued to the terminator."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpd_core.prompts import parse_answer, parse_value, render_answer, render_value
from hpd_core.stopping import AFTER_STRING, BARE, DONE, START, STRING, advance, token_text, transition_table
from hpd_core.types import Attribute, Product, Request, Value


@pytest.mark.parametrize(
    "pieces, done_at",
    [
        ([' "', "Acme", '",'], 2),  # closing quote shares a token with the comma
        ([' "', "Acme", '"\n'], 2),  # ... or with the newline
        ([' "', "Acme", '"', ","], 3),
        ([" null", ","], 1),
        ([" null", "\n"], 1),
        ([" null,"], 0),
        ([' "', 'say \\"hi\\"', '",'], 2),  # escaped quotes do not close the string
        ([' "', "a\\", '"', 'b",'], 3),  # an escaped quote split across tokens
        ([' "', "a,b\n}", '"', "}"], 3),  # terminators inside the string do not count
        ([" 42", "}"], 1),
        ([' "', "x", '"'], None),  # closed but no terminator yet
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
    assert advance(START, ' "ab"') == AFTER_STRING
    assert advance(START, " nul") == BARE


def test_table_agrees_with_advance(tokenizer):
    table = transition_table(tokenizer, vocab_size=len(tokenizer) + 3)
    assert table.shape == (6, len(tokenizer) + 3)
    special = set(tokenizer.all_special_ids)
    for token_id in range(table.shape[1]):
        for state in range(6):
            expected = DONE if token_id in special else advance(state, token_text(tokenizer, token_id))
            assert table[state, token_id] == expected


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
