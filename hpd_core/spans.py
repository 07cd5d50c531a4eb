"""Values as spans of their product's text: which tokens may come next in a slot.

With span decoding (``DecodeConfig.spans``) a slot's text must read, character by character,

    whitespace*  ( '"' S '"' | 'null' )  whitespace*  terminator  ...

where S is a non-empty piece of one of the product's text fields (title, description, one feature)
exactly as JSON writes it inside a string (``json.dumps(field)[1:-1]``): the value the parser reads
is then a span of the product's own text. Whatever follows the terminator (the rest of that token)
is not read, as in ordinary decoding (stopping.py). The attribute values of the extraction
benchmarks are such spans without exception; a model that would answer "Men's" for a title saying
"Men" answers "Men" (or null) instead, and nothing can come from another product of the prompt.

``walk`` is the slow, obviously correct rule, one character at a time, with one addition: a token
that only opens the string is allowed when some token can follow it (a text whose characters all
come in byte pieces could not start a span). ``SpanSlot.allowed`` gives
the same token set from lookups: the tokens whose text is a prefix of the text that follows each
place the value so far occurs (``SpanVocabulary.by_text``), those that close the string there
(``closers``), and fixed sets for the start, ``null`` and the terminator; tests check it against
``walk`` over whole vocabularies. Tokens whose text is not whole characters on its own (byte pieces
of a character, decoded as U+FFFD) and special tokens are never allowed.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from hpd_core.prompts import (
    NO_SPECIALS,
    OPEN,
    OTHER,
    QUOTE,
    TERMINATORS,
    TEXT,
    JsonCursor,
    closing_quote,
    dangling_escape,
    guard_specials,
    special_texts,
)
from hpd_core.stopping import WHITESPACE, token_texts

START, STRING, NULL, AFTER, DONE = range(5)
NULL_TEXT = "null"
MAX_TOKEN_CHARS = 64  # longer token texts are never candidates inside a string


@dataclass(frozen=True)
class State:
    """Where a slot's text stands. ``content``: the string so far (JSON-escaped, as in the fields'
    texts) or the bare literal so far; ``places``: (field, index) where ``content`` occurs in the
    fields' texts (None: anywhere, before the first character)."""

    mode: int = START
    content: str = ""
    places: tuple[tuple[int, int], ...] | None = None


def product_fields(product) -> tuple:
    """The text fields of a product (types.Product) the rule reads: title, description, features."""
    return (product.title, product.description, *product.features)


def in_text(value: str, product) -> bool:
    """Whether ``value`` occurs, exactly, in one of the product's text fields: what the extraction
    job's text check asks of every value, and what span decoding makes true by construction."""
    return any(value in text for text in product_fields(product) if text)


def field_texts(fields, specials: frozenset[str] = NO_SPECIALS) -> tuple[str, ...]:
    """The fields as they read inside a JSON string in the prompt (what the model writes between
    the quotes), spellings of the tokenizer's ``specials`` broken as the prompt breaks them."""
    return tuple(guard_specials(json.dumps(f, ensure_ascii=False)[1:-1], specials) for f in fields if f)


@functools.lru_cache(maxsize=4096)
def boundaries(text: str) -> frozenset[int]:
    """The places in a field's JSON-escaped text (``field_texts``) where one of the field's own
    characters begins, and its end: a span starts and ends only there, never inside an escape
    (``\\n``, ``\\"``, ``\\u0002``), which would read as another character or none."""
    found, i = set(), 0
    while i < len(text):
        found.add(i)
        i += (6 if text[i + 1 : i + 2] == "u" else 2) if text[i] == "\\" else 1
    found.add(len(text))
    return frozenset(found)



def step(state: State, ch: str, texts: tuple[str, ...]) -> State | None:
    """The state after one more character, or None if the rule forbids it."""
    mode, content = state.mode, state.content
    if mode == DONE:
        return state
    if mode == START:
        if ch in WHITESPACE:
            return state
        if ch == '"':
            return State(STRING)
        return State(NULL, ch) if NULL_TEXT.startswith(ch) else None
    if mode == STRING:
        n = len(content)
        if ch == '"' and not dangling_escape(content):  # the span ends: where one of the field's characters ends
            ends = content and any(i + n in boundaries(texts[f]) for f, i in state.places)
            return State(AFTER) if ends else None
        if state.places is None:  # the span begins: where one of the field's characters begins
            places = tuple((f, i) for f, text in enumerate(texts) for i, c in enumerate(text)
                           if c == ch and i in boundaries(text))  # fmt: skip
        else:
            places = tuple((f, i) for f, i in state.places if texts[f][i + n : i + n + 1] == ch)
        return State(STRING, content + ch, places) if places else None
    if mode == NULL:
        if content != NULL_TEXT:
            return State(NULL, content + ch) if NULL_TEXT.startswith(content + ch) else None
        mode = AFTER  # "null" read: from here as after a string
    if ch in WHITESPACE:
        return State(AFTER)
    return State(DONE) if ch in TERMINATORS else None


def walk(state: State, text: str, texts: tuple[str, ...]) -> State | None:
    """The state after a token's text (None: forbidden). The slow reference of ``SpanSlot``."""
    for ch in text:
        if state is None or state.mode == DONE:
            return state
        state = step(state, ch, texts)
    return state


class SpanVocabulary:
    """A tokenizer's token texts indexed for the span rule (built once per decoder)."""

    def __init__(self, tokenizer, vocab_size: int | None = None) -> None:
        texts = token_texts(tokenizer)
        special = set(tokenizer.all_special_ids)
        self.specials = special_texts(tokenizer)  # spelled in a product's text, the prompt breaks them
        self.texts = list(texts) + ["\ufffd"] * max(0, (vocab_size or 0) - len(texts))
        self.usable = [(i, t) for i, t in enumerate(texts) if usable(t) and i not in special]
        nothing: tuple[str, ...] = ()
        self.by_text: dict[str, list[int]] = {}  # string pieces with no closing quote
        self.closers: dict[str, list[int]] = {}  # piece before the closing quote -> tokens
        self.opening: list[tuple[str, int]] = []  # text after whitespace + '"', for START
        self.start: list[int] = []  # valid from START whatever the text: whitespace, a start of null
        self.bare_opening: list[int] = []  # whitespace + '"': valid if a span can start after it
        self.null_after: dict[str, list[int]] = {prefix: [] for prefix in ("n", "nu", "nul", NULL_TEXT)}
        self.finishers: list[int] = []  # valid right after the closing quote (or null)
        for i, t in self.usable:
            if walk(State(AFTER), t, nothing) is not None:
                self.finishers.append(i)
            for prefix in self.null_after:
                if walk(State(NULL, prefix), t, nothing) is not None:
                    self.null_after[prefix].append(i)
            body = t.lstrip(WHITESPACE)
            if body == '"':
                self.bare_opening.append(i)
            elif walk(State(START), t, nothing) is not None:
                self.start.append(i)
            elif body[0] == '"':
                self.opening.append((body[1:], i))
            cut = _closing(t)
            if cut is None:
                self.by_text.setdefault(t, []).append(i)
            elif walk(State(AFTER), t[cut + 1 :], nothing) is not None:
                self.closers.setdefault(t[:cut], []).append(i)
        # every non-empty beginning of a key of ``by_text`` or ``closers``: a text that is none
        # is the beginning of no token's piece, nor is any longer text it begins
        self.prefixes = {key[:k] for key in (*self.by_text, *self.closers) for k in range(1, len(key) + 1)}

    def product(self, fields) -> SpanText:
        """The rule for the slots of one product (title, description, features)."""
        return SpanText(self, field_texts(fields, self.specials))


def usable(text: str) -> bool:
    """Token texts the rule may allow: whole characters (no U+FFFD piece of one), not too long."""
    return bool(text) and "\ufffd" not in text and len(text) <= MAX_TOKEN_CHARS


def _closing(text: str) -> int | None:
    """Index of the first quote in ``text`` that would close a string (not escaped within ``text``)."""
    end = closing_quote('"' + text)
    return None if end is None else end - 1


class SpanText:
    """One product's texts under the span rule; its slots share the sets that depend on the texts
    alone (the start, and the string just opened)."""

    def __init__(self, vocab: SpanVocabulary, texts: tuple[str, ...]) -> None:
        self.vocab, self.texts = vocab, texts
        self._shared: dict[int, list[int]] = {}

    def slot(self) -> SpanSlot:
        return SpanSlot(self)

    def allowed(self, state: State) -> list[int]:
        """The tokens ``walk`` accepts from ``state``, ascending."""
        if (state.mode == START or (state.mode == STRING and state.places is None)) and state.mode in self._shared:
            return self._shared[state.mode]
        found = self._allowed(state)
        if state.mode == START or (state.mode == STRING and state.places is None):
            self._shared[state.mode] = found
        return found

    def _allowed(self, state: State) -> list[int]:
        v, texts = self.vocab, self.texts
        if state.mode == START:  # a bare quote only if some token can follow it: no dead end
            bare = v.bare_opening if self.allowed(State(STRING)) else []
            return sorted(v.start + bare + [i for rest, i in v.opening if _opening_ok(rest, texts)])
        if state.mode == NULL:
            return v.null_after[state.content]
        if state.mode == AFTER:
            return v.finishers
        if state.mode != STRING:
            return []
        if dangling_escape(state.content):  # the next character is escaped: rare (a backslash in the text)
            return [i for i, t in v.usable if walk(state, t, texts) is not None]
        found: set[int] = set()
        n = len(state.content)
        places = state.places
        if places is None:  # nothing read yet: a span may start where any of the fields' characters does
            places = tuple((f, i) for f, text in enumerate(texts) for i in sorted(boundaries(text)) if i < len(text))
        if n and any(i + n in boundaries(texts[f]) for f, i in places):  # the string closes right away
            found.update(v.closers.get("", ()))  # (the content is not escaped: above)
        for f, i in places:
            after = texts[f][i + n : i + n + MAX_TOKEN_CHARS]
            ends = boundaries(texts[f])
            for k in range(1, len(after) + 1):
                piece = after[:k]
                if piece not in v.prefixes:
                    break
                found.update(v.by_text.get(piece, ()))
                if piece in v.closers and i + n + k in ends and not dangling_escape(state.content + piece):
                    found.update(v.closers[piece])
        return sorted(found)


def _opening_ok(rest: str, texts: tuple[str, ...]) -> bool:
    """Whether '"' + rest (a token's text after its leading whitespace and quote) is valid from START."""
    cut = _closing(rest)
    if cut is None:
        return any(_occurs(rest, text, closed=False) for text in texts)  # rest is not empty: '"' alone is in ``start``
    piece = rest[:cut]
    if not piece or dangling_escape(piece) or not any(_occurs(piece, text, closed=True) for text in texts):
        return False
    return walk(State(AFTER), rest[cut + 1 :], ()) is not None


def _occurs(piece: str, text: str, closed: bool) -> bool:
    """Whether ``piece`` occurs in ``text`` from one of its characters' beginnings (and, ``closed``,
    up to one's end): where a span may begin (and end), as ``step`` reads it."""
    ends, start = boundaries(text), text.find(piece)
    while start >= 0:
        if start in ends and (not closed or start + len(piece) in ends):
            return True
        start = text.find(piece, start + 1)
    return False


class SpanSlot:
    """One slot under the span rule: ``allowed()`` tokens, ``advance(token)``."""

    def __init__(self, text: SpanText) -> None:
        self.text = text
        self.state = State()

    def allowed(self) -> list[int]:
        found = self.text.allowed(self.state)
        if not found:
            raise ValueError(f"no token continues {self.state} under the span rule")
        return found

    def advance(self, token: int) -> None:
        state = walk(self.state, self.text.vocab.texts[token], self.text.texts)
        if state is None:
            raise ValueError(f"token {token} ({self.text.vocab.texts[token]!r}) breaks the span rule")
        self.state = state


class AnswerSpans:
    """The span rule for the baseline's whole JSON answer (``{"1": {"Brand": "...", ...}, ...}``).

    Reads the answer as it is written; a value of product j (the member of product key ``"j"``, at
    depth 2, after its colon) follows the span rule of that product's text. Outside values any
    text may be written; a token that reaches into a value is allowed if its part there is.
    ``copy`` / ``feed`` walk a candidate token; ``value`` is the span slot of the value being
    written (None outside values)."""

    def __init__(self, vocab: SpanVocabulary, products: list, depth: int = 1) -> None:
        self.vocab = vocab
        self.texts = [vocab.product(fields) for fields in products]
        self.cursor = JsonCursor(depth)
        self.key = ""  # the product key being read or last read (depth 1)
        self.product: int | None = None
        self.value: SpanSlot | None = None

    def copy(self) -> AnswerSpans:
        other = object.__new__(AnswerSpans)
        other.__dict__.update(self.__dict__)
        other.cursor = self.cursor.copy()
        if self.value is not None:
            other.value = SpanSlot(self.value.text)
            other.value.state = self.value.state
        return other

    def feed(self, text: str) -> bool:
        """Read a token's text; False if the span rule forbids it (the state is then undefined)."""
        for ch in text:
            if self.value is not None:
                state = step(self.value.state, ch, self.value.text.texts)
                if state is None:
                    return False
                self.value.state = state
                if state.mode != DONE:
                    continue
                self.value = None  # the terminator also counts for the structure below
            kind = self.cursor.read(ch)
            depth = self.cursor.depth
            if kind == TEXT:
                if depth == 1:
                    self.key += ch
            elif kind == QUOTE:
                if self.cursor.in_string and depth == 1:
                    self.key = ""
            elif kind == OPEN:
                if depth == 2:
                    self.product = int(self.key) - 1 if self.key.isdigit() and 0 < int(self.key) <= len(self.texts) else None
            elif kind == OTHER and ch == ":" and depth == 2 and self.product is not None:
                self.value = self.texts[self.product].slot()
        return True

    def allows(self, token: int) -> bool:
        """The rule for one token: inside a value, one of the value's ``allowed()`` tokens (the
        span rule of HPD's slots); then the whole token's text must read (a value it opens
        further on included)."""
        if self.value is not None and token not in self.value.text.allowed(self.value.state):
            return False
        return self.copy().feed(self.vocab.texts[token])
