"""When does a slot's value end? A tiny JSON-value state machine, tabulated per token.

The machine reads the characters a slot generates: optional whitespace, then either a JSON string
(with backslash escapes) or a bare literal (null, a number, ...), then a terminator (``,``, newline
or ``}``). Reaching DONE ends the slot. ``transition_table`` runs every vocabulary token's text
through the machine from every state once, so the decode loop advances all slots with one tensor
lookup per step: ``state = table[state, token]``. ``advance`` is the slow reference it is built from.
"""

from __future__ import annotations

import weakref

from hpd_core.prompts import TERMINATORS

START, STRING, ESCAPE, AFTER_STRING, BARE, DONE = range(6)
NUM_STATES = 6
WHITESPACE = " \t\r"


def advance(state: int, text: str) -> int:
    """Run ``text`` through the machine from ``state``; DONE absorbs."""
    for ch in text:
        if state == DONE:
            return DONE
        if state == START:
            if ch == '"':
                state = STRING
            elif ch in TERMINATORS:
                state = DONE  # empty value: ends, parses as null
            elif ch not in WHITESPACE:
                state = BARE
        elif state == STRING:
            if ch == "\\":
                state = ESCAPE
            elif ch == '"':
                state = AFTER_STRING
        elif state == ESCAPE:
            state = STRING
        elif state in (AFTER_STRING, BARE):
            if ch in TERMINATORS:
                state = DONE
    return state


_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_texts(tokenizer) -> tuple[str, ...]:
    """The text of every token id on its own (special tokens kept as their text). Decoded once per
    tokenizer (Gemma's 262k entries take seconds) and shared by the stop table, span decoding and
    the baseline's answer scanner. Each call checks the vocabulary's size, which takes a third of a
    millisecond on Gemma's tokenizer: hot paths keep the tuple."""
    texts = _TEXTS.get(tokenizer)
    if texts is None or len(texts) != len(tokenizer):  # a token added since: decode again
        texts = tuple(tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=False))
        _TEXTS[tokenizer] = texts
    return texts


def token_text(tokenizer, token_id: int) -> str:
    """One token's text, as ``transition_table`` reads it (slow path, one token)."""
    if token_id >= len(tokenizer):
        return "\ufffd"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def transition_table(tokenizer, vocab_size: int | None = None):
    """LongTensor (NUM_STATES, vocab_size): the state after reading token t from state s.

    Special tokens (end of turn, padding, ...) end a value from any state: the model has stopped.
    Ids past the tokenizer's vocabulary (models often pad their embedding matrix) read as one
    ordinary character.
    """
    import torch

    texts = list(token_texts(tokenizer))
    vocab_size = max(vocab_size or 0, len(texts))
    texts += ["\ufffd"] * (vocab_size - len(texts))
    special = set(tokenizer.all_special_ids)
    rows = [
        [DONE if token_id in special else advance(state, text) for token_id, text in enumerate(texts)]
        for state in range(NUM_STATES)
    ]
    return torch.tensor(rows, dtype=torch.long)
