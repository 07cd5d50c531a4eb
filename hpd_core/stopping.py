"""When does a slot's value end? A tiny JSON-value state machine, tabulated per token.

The machine reads the characters a slot generates: optional whitespace, then either a JSON string
(with backslash escapes) or a bare literal (null, a number, ...). A value ends as soon as it is
complete: a string at its closing quote, the literal ``null`` at its last letter, any other bare
literal (a number) at the terminator after it (``,``, newline or ``}``), which is the first place
it is known to be complete. Reaching DONE ends the slot. In HPD the skeleton holds the answer's
structure, so the terminator a value would be followed by in the JSON answer is never asked of
the model: on the README's 96 titles 566 of 1,056 values were ``null`` and their terminators were
567 of the 2,584 tokens the steps fed (session 38). The value read is the same either way
(``prompts.parse_value`` reads a closed string up to its quote and a bare literal up to a
terminator). ``transition_table`` runs every vocabulary token's text through the machine from
every state once, so the decode loop advances all slots with one tensor lookup per step:
``state = table[state, token]``. ``advance`` is the slow reference it is built from.
"""

from __future__ import annotations

import random
import re
import weakref

from hpd_core.prompts import TERMINATORS

START, STRING, ESCAPE, BARE, DONE, N, NU, NUL = range(8)  # N, NU, NUL: a bare literal that began "n", "nu", "nul"
NUM_STATES = 8
WHITESPACE = " \t\r"
_NULL_NEXT = {N: ("u", NU), NU: ("l", NUL), NUL: ("l", DONE)}  # the letter that goes on spelling null


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
            elif ch == "n":
                state = N
            elif ch not in WHITESPACE:
                state = BARE
        elif state == STRING:
            if ch == "\\":
                state = ESCAPE
            elif ch == '"':
                state = DONE  # a closed string is complete
        elif state == ESCAPE:
            state = STRING
        elif ch in TERMINATORS:  # a bare literal (BARE, N, NU, NUL) ends at its terminator
            state = DONE
        elif state != BARE:  # N, NU, NUL: null spelled on, or another literal
            letter, after = _NULL_NEXT[state]
            state = after if ch == letter else BARE
    return state


_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def token_texts(tokenizer) -> tuple[str, ...]:
    """The text of every token id on its own (special tokens kept as their text). Decoded once per
    tokenizer and shared by the stop table, span decoding and the baseline's answer scanner. Each
    call checks the vocabulary's size, which takes a third of a millisecond on Gemma's tokenizer:
    hot paths keep the tuple."""
    texts = _TEXTS.get(tokenizer)
    if texts is None or len(texts) != len(tokenizer):  # a token added since: decode again
        ids = [[i] for i in range(len(tokenizer))]
        texts = _decoded_in_rust(tokenizer, ids)
        if texts is None:
            texts = tuple(tokenizer.batch_decode(ids, skip_special_tokens=False))
        _TEXTS[tokenizer] = texts
    return texts


def _decoded_in_rust(tokenizer, ids: list[list[int]], checks: int = 2000) -> tuple[str, ...] | None:
    """The texts from a fast tokenizer's Rust decoder, in parallel (Gemma's 262k entries: about 1 s
    against 3.5 s through ``batch_decode``, the same texts), or None where that may differ from
    ``batch_decode``: no Rust tokenizer, spaces cleaned up in Python, or a disagreement on the
    special tokens and a seeded sample of ``checks`` others."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    texts = tuple(backend.decode_batch(ids, skip_special_tokens=False))
    n = len(ids)
    sample = sorted(set(i for i in tokenizer.all_special_ids if i < n) | set(random.Random(0).sample(range(n), min(checks, n))))
    slow = tokenizer.batch_decode([ids[i] for i in sample], skip_special_tokens=False)
    return texts if all(texts[i] == text for i, text in zip(sample, slow)) else None


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
    columns = [(DONE,) * NUM_STATES if token_id in special else column(text) for token_id, text in enumerate(texts)]
    return torch.tensor(columns, dtype=torch.long).T.contiguous()


_MARKS = re.compile("[" + re.escape('"\\' + TERMINATORS) + "]")  # the characters that move a value on


def column(text: str) -> tuple[int, ...]:
    """``advance(state, text)`` for every state. Most tokens hold none of the characters that end
    or open anything (a quote, a backslash, a terminator): their column is read off directly, so
    the table of Gemma's 262k tokens takes a fraction of a second, not seconds; the rest run
    through ``advance`` (tests/hpd_core/test_stopping_prompts.py checks every case against it)."""
    if _MARKS.search(text):
        return tuple(advance(state, text) for state in range(NUM_STATES))
    if not text:
        return tuple(range(NUM_STATES))
    # START: whitespace keeps it, an "n" may begin null, anything else begins a bare literal;
    # ESCAPE: the first character is escaped and the string goes on; N, NU, NUL: the first
    # character spells null on or makes it another literal; the others see nothing that moves them
    out = [START if not text.strip(WHITESPACE) else BARE, STRING, STRING, BARE, DONE, BARE, BARE, BARE]
    if text.lstrip(WHITESPACE).startswith("n"):
        out[START] = advance(START, text)
    for state, (letter, _) in _NULL_NEXT.items():
        if text[0] == letter:
            out[state] = advance(state, text)
    return tuple(out)
