"""Prompt text, JSON skeleton rendering and value parsing.

The answer format is pretty-printed JSON (indent 2), products keyed "1".."J" in request order:

    {
      "1": {
        "Brand": "Diesel",
        "Gender": null
      },
      "2": { ...

HPD splits the skeleton into *segments*, one per slot: segment s is the text from the end of value
s-1 up to and including the key of slot s (``"Brand":``). The value of slot s, as generated, is the
JSON value plus its terminator: ``␣"Diesel",`` for all but the last attribute of a product, and
``␣"US"\\n`` for the last one. Product text is embedded as JSON strings (``json.dumps``), so quotes,
newlines and tags in it cannot break out of their place in the prompt.
"""

from __future__ import annotations

import functools
import json
import weakref
from dataclasses import replace

from hpd_core.types import Product, Request, Value

INSTRUCTIONS = """You are an expert at extracting product details.

Consider the following product attributes:

{attributes}

Analyze each input product below (category: {category}) and extract all of the attributes listed above.
Output a JSON dict with a key for each input product ID, and a nested dict with a key for each attribute (use the attribute name) and the extracted value.
Copy each value exactly as it appears in the product text. Write null if the value of an attribute is not in the product information.

{products}"""

PRODUCTS_IN_PROMPT = "Input products:\n\n{products}"
PRODUCTS_IN_ANSWER = (
    "The input products follow in the answer: each product's \"product\" entry, then its attributes."
)
PRODUCT_KEY = "product"  # the key of a product's own text in the interleaved skeleton
SKELETONS = ("interleaved", "after-products")

PLAIN_ANSWER_PREFIX = "\n\nAnswer:\n"  # used when the tokenizer has no chat template
INDENT = "  "
TERMINATORS = ",\n}"  # characters that end a JSON value in the answer
# The version of a product's prompt text, recorded in each job's _job.json: a job is not resumed
# under another (its output would hold values of two prompts). Raise it with every change of what
# a prompt says for the same record. 1: the title first (until 2026-11-29); 2: the title last; 3:
# a prompt wider than the model's sliding window is prompted as attribute groups (2026-11-30,
# hpd_core/attribute_groups.py; the text of every other prompt is as in 2).
PROMPT_FORMAT = 3


def _product_json(request: Request, j: int) -> str:
    return f"{json.dumps(str(j + 1))}: {_product_fields(request, j)}"


def _product_fields(request: Request, j: int) -> str:
    """Product j's fields as a JSON object, the title last: in the interleaved skeleton the product's
    keys follow its text, and a description between the title and the keys lost the title's values
    (a model trained on titles alone: 28 of 66 values kept with 3,000 characters of description
    before the title, 66 with the title after it; scripts/long_text_probe.py, docs/quality.md).
    A product of a title alone is ``{"title": ...}`` either way."""
    product = request.products[j]
    fields: dict[str, object] = {}
    if product.description:
        fields["description"] = product.description
    if product.features:
        fields["features"] = list(product.features)
    fields["title"] = product.title
    return json.dumps(fields, ensure_ascii=False)


def product_text(request: Request, j: int) -> str:
    """Product j's own text as the prompt embeds it (a JSON object of its fields)."""
    return _product_fields(request, j)


def _check_skeleton(skeleton: str) -> None:
    if skeleton not in SKELETONS:
        raise ValueError(f"skeleton must be one of {SKELETONS}, got {skeleton!r}")


def render_instructions(request: Request, skeleton: str = "after-products") -> str:
    """The user message: instructions, attribute list and, unless the skeleton interleaves them
    with the keys, the J products."""
    _check_skeleton(skeleton)
    attributes = "\n".join(
        f"- {json.dumps(a.name, ensure_ascii=False)}" + (f": {a.description}" if a.description else "")
        for a in request.attributes
    )
    if skeleton == "interleaved":
        products = PRODUCTS_IN_ANSWER
    else:
        listing = "\n".join(_product_json(request, j) for j in range(len(request.products)))
        products = PRODUCTS_IN_PROMPT.format(products=listing)
    category = json.dumps(request.category, ensure_ascii=False)
    return INSTRUCTIONS.format(attributes=attributes, category=category, products=products)


NO_SPECIALS: frozenset[str] = frozenset()


_SPECIAL_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def special_texts(tokenizer) -> frozenset[str]:
    """The texts ``tokenizer`` reads as a special (control) token wherever they occur in a text:
    ``<eos>``, ``<end_of_turn>``, ``<|im_end|>``, Gemma's ``<unused12>``. Added tokens that are not
    special (Gemma's ``<table>``) are ordinary text and not included, nor are special tokens that
    begin with a letter, a digit or whitespace: breaking those would rewrite ordinary words and the
    JSON's own layout (no tokenizer in use has one; theirs begin with ``<`` or ``[``). Read once per
    tokenizer (Gemma's 6,384 added tokens take milliseconds, every prompt would pay them)."""
    try:
        return _SPECIAL_TEXTS[tokenizer]
    except (KeyError, TypeError):
        pass
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found = {token.content for token in added.values() if getattr(token, "special", False)}
    found.update(getattr(tokenizer, "all_special_tokens", None) or ())
    texts = frozenset(t for t in found if t and not (t[0].isalnum() or t[0].isspace()))
    try:
        _SPECIAL_TEXTS[tokenizer] = texts
    except TypeError:  # not weak-referenceable: read each time
        pass
    return texts


def guard_specials(text: str, specials: frozenset[str]) -> str:
    """``text`` (JSON, or a piece of a JSON string) with every spelling of a special token broken:
    its first character written as a JSON escape (``<eos>`` -> ``\\u003ceos>``). A JSON reader gets
    the same string back; the tokenizer reads plain text where it would have read a control token,
    so a product whose text spells ``<eos>`` cannot end or steer its prompt. A spelling is broken
    where it starts at one of the text's own characters, never inside a JSON escape (a backslash
    that starts none, in plain text such as an attribute description, is a character of its own).
    Text with no such spelling comes back unchanged (the same object)."""
    if not specials or not any(c in text for c in _first_characters(specials)):
        return text
    by_first, lengths = _special_index(specials)
    out, i, done = [], 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":  # a JSON escape is one character of the text: its pieces start no spelling
            i += _escape_length(text, i)
            continue
        if ch in by_first and any(text[i : i + n] in by_first[ch] for n in lengths[ch]):
            out.append(text[done:i] + (f"\\u{ord(ch):04x}" if ord(ch) < 0x10000 else json.dumps(ch)[1:-1]))
            done = i + 1
        i += 1
    return "".join(out) + text[done:] if out else text


_HEX = frozenset("0123456789abcdefABCDEF")


def _escape_length(text: str, i: int) -> int:
    """How many characters the JSON escape at ``text[i]`` (a backslash) takes; 1 if none starts there."""
    nxt = text[i + 1 : i + 2]
    if nxt and nxt in '"\\/bfnrt':
        return 2
    if nxt == "u" and len(text) >= i + 6 and set(text[i + 2 : i + 6]) <= _HEX:
        return 6
    return 1


@functools.lru_cache(maxsize=16)
def _first_characters(specials: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted({s[0] for s in specials}))


@functools.lru_cache(maxsize=16)
def _special_index(specials: frozenset[str]) -> tuple[dict[str, frozenset[str]], dict[str, tuple[int, ...]]]:
    by_first: dict[str, set[str]] = {}
    for s in specials:
        by_first.setdefault(s[0], set()).add(s)
    return (
        {c: frozenset(group) for c, group in by_first.items()},
        {c: tuple(sorted({len(s) for s in group})) for c, group in by_first.items()},
    )


def render_prompt(request: Request, tokenizer, skeleton: str = "after-products") -> str:
    """Prompt text up to where the answer starts (chat template with the assistant turn open).
    The user message has its spellings of special tokens broken (``guard_specials``): the chat
    template's own special tokens are the only ones the prompt holds."""
    user = guard_specials(render_instructions(request, skeleton), special_texts(tokenizer))
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False
        )
    return user + PLAIN_ANSWER_PREFIX


def _key(name: str) -> str:
    return json.dumps(name, ensure_ascii=False) + ":"


def skeleton_segments(request: Request, skeleton: str = "after-products", specials: frozenset[str] = NO_SPECIALS) -> list[str]:
    """Skeleton text split into one segment per slot (slot order: product-major, then attribute).

    Segment 0 starts the answer; the prompt is prepended by the caller. With ``interleaved``, each
    product object opens with the product's own text (``"product": {...}``) right before its keys,
    so its values sit next to their text in positions; with ``after-products`` the products are in
    the prompt and the skeleton holds keys only. ``specials`` (``special_texts`` of the tokenizer)
    are broken where the keys or a product's text spell them (``guard_specials``).
    """
    _check_skeleton(skeleton)
    segments = []
    for j in range(len(request.products)):
        for n, attribute in enumerate(request.attributes):
            if n == 0:
                opener = "{\n" if j == 0 else f"{INDENT}}},\n"
                own = f"{INDENT * 2}{_key(PRODUCT_KEY)} {_product_fields(request, j)},\n" if skeleton == "interleaved" else ""
                text = f"{opener}{INDENT}{json.dumps(str(j + 1))}: {{\n{own}{INDENT * 2}{_key(attribute.name)}"
            else:
                text = f"\n{INDENT * 2}{_key(attribute.name)}"
            segments.append(guard_specials(text, specials))
    return segments


def first_key_tail(attribute: Attribute, specials: frozenset[str] = NO_SPECIALS) -> str:
    """The interleaved skeleton's text between a product's own fields and the end of its first key,
    ``attribute``'s (see ``skeleton_segments``): how far, in tokens, its text ends before that key."""
    return guard_specials(f",\n{INDENT * 2}{_key(attribute.name)}", specials)


PRODUCT_PROBE = "\ue000"  # a private-use character standing in for a product's text


def shared_prefix_text(request: Request, tokenizer, skeleton: str = "after-products", hpd: bool = True) -> str:
    """The text every prompt of this category and attribute list starts with: the prompt (for HPD
    followed by the skeleton's first segment) up to where the first product's own text begins.
    Prompts that share it share the prefill of its tokens (hpd_core/session.py)."""
    probe = replace(request, products=(Product("", PRODUCT_PROBE),))
    first = skeleton_segments(probe, skeleton, special_texts(tokenizer))[0] if hpd else ""
    text = render_prompt(probe, tokenizer, skeleton) + first
    return text[: text.index(PRODUCT_PROBE)]


def answer_prefix() -> str:
    """What the baseline's answer is seeded with: the opening of the JSON object."""
    return "{\n"


def value_suffix(request: Request, slot: int) -> str:
    """The terminator that follows slot ``slot``'s value in the full answer text."""
    return "\n" if (slot + 1) % len(request.attributes) == 0 else ","


def render_answer(request: Request, values: list[list[str | None]], specials: frozenset[str] = NO_SPECIALS) -> str:
    """The full gold answer text (pretty JSON) for given values, as the baseline should produce it
    (``specials`` broken where keys or values spell them, as in the prompt)."""
    body = {
        str(j + 1): {a.name: values[j][n] for n, a in enumerate(request.attributes)}
        for j in range(len(request.products))
    }
    return guard_specials(json.dumps(body, indent=2, ensure_ascii=False), specials)


def render_value(value: str | None, terminator: str, specials: frozenset[str] = NO_SPECIALS) -> str:
    """A slot's text as HPD generates it: leading space, JSON value, terminator (``specials``
    broken where the value spells them, as in the prompt)."""
    return guard_specials(" " + json.dumps(value, ensure_ascii=False) + terminator, specials)


# ---------------------------------------------------------------------------------------------
# Value parsing


def parse_value(text: str, finished: bool) -> Value:
    """Parse one slot's generated text (value + terminator) into a Value.

    ``finished`` is False when the slot was cut at K_max; the value is then the best partial
    reading and flagged ``truncated``. An end token ends a slot as its terminator would (the engine
    counts it complete): what was written before it is read as it is, and a string it leaves open
    is truncated.
    """
    stripped = text.lstrip()
    truncated = not finished
    if stripped.startswith('"'):
        end = closing_quote(stripped)
        if end is None:  # string never closed
            partial = stripped[1:]
            try:
                whole = partial[:-1] if dangling_escape(partial) else partial  # a cut escape, not "\\\\"
                return Value(_empty_to_none(json.loads('"' + whole + '"')), truncated=True)
            except json.JSONDecodeError:
                return Value(_empty_to_none(partial), truncated=True, parse_error=True)
        try:  # a closed string is a complete value, even if its terminator was cut off
            return Value(_empty_to_none(json.loads(stripped[: end + 1])))
        except json.JSONDecodeError:
            return Value(None, parse_error=True)
    bare = stripped
    for i, ch in enumerate(stripped):
        if ch in TERMINATORS:
            bare = stripped[:i]
            break
    bare = bare.strip()
    if bare == "null":
        return Value(None, truncated=truncated)
    try:
        parsed = json.loads(bare)
    except json.JSONDecodeError:
        return Value(None, truncated=truncated, parse_error=True)
    if isinstance(parsed, (dict, list)):
        return Value(None, truncated=truncated, parse_error=True)
    return Value(bare, truncated=truncated)  # a number or true/false as written: "10.50", not "10.5"


def dangling_escape(text: str) -> bool:
    """Whether ``text`` ends in an escape's lone backslash (an odd run of them): a quote after it
    would be escaped."""
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def closing_quote(text: str) -> int | None:
    """Index of the quote closing the JSON string that starts at text[0], or None."""
    escaped = False
    for i in range(1, len(text)):
        ch = text[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            return i
    return None


def _empty_to_none(value: str | None) -> str | None:
    if value is None:
        return None
    return value if value.strip() else None


def parse_answer(request: Request, text: str, finished: bool) -> tuple[tuple[Value, ...], ...]:
    """Parse the baseline's full JSON answer into per-product, per-attribute values.

    Invalid JSON gives null values flagged ``parse_error`` (never an exception). A missing product
    or attribute key gives a null value. ``finished`` False (ran out of tokens) flags values that
    were not found as truncated.
    """
    n_attr = len(request.attributes)
    obj = _load_json_object(text)
    ok = obj is not None
    rows = []
    for j in range(len(request.products)):
        entry = obj.get(str(j + 1)) if ok else None
        row = []
        for n in range(n_attr):
            name = request.attributes[n].name
            if not ok:
                row.append(Value(None, truncated=not finished, parse_error=True))
            elif not isinstance(entry, dict) or _find_key(entry, name) is None:
                row.append(Value(None, truncated=not finished))
            else:
                raw = entry[_find_key(entry, name)]
                if raw is None or isinstance(raw, str):
                    row.append(Value(_empty_to_none(raw)))
                elif isinstance(raw, bool):
                    row.append(Value(json.dumps(raw)))
                else:
                    row.append(Value(None, parse_error=True))
        rows.append(tuple(row))
    return tuple(rows)


def _find_key(entry: dict, name: str) -> str | None:
    """The key for attribute ``name``: exact, else the one that matches ignoring case."""
    if name in entry:
        return name
    folded = name.casefold()
    return next((k for k in entry if isinstance(k, str) and k.casefold() == folded), None)


TEXT, ESCAPE, QUOTE, OPEN, CLOSE, OTHER = "text", "escape", "quote", "open", "close", "other"


class JsonCursor:
    """Reads JSON text a character at a time: inside a string or not (backslash escapes included)
    and how many brackets are open. ``read`` says what the character was; the readers of answers
    (``_load_json_object``, the baseline's ``AnswerScanner``, span decoding's ``AnswerSpans``) add
    what they need on top."""

    __slots__ = ("depth", "in_string", "escaped")

    def __init__(self, depth: int = 0) -> None:
        self.depth, self.in_string, self.escaped = depth, False, False

    def read(self, ch: str) -> str:
        """TEXT (a string's own character), ESCAPE (a backslash or the character it escapes),
        QUOTE (opening or closing a string), OPEN / CLOSE (a bracket outside strings, depth
        updated) or OTHER (anything else outside strings)."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
                return ESCAPE
            if ch == "\\":
                self.escaped = True
                return ESCAPE
            if ch == '"':
                self.in_string = False
                return QUOTE
            return TEXT
        if ch == '"':
            self.in_string = True
            return QUOTE
        if ch in "{[":
            self.depth += 1
            return OPEN
        if ch in "}]":
            self.depth -= 1
            return CLOSE
        return OTHER

    def copy(self) -> JsonCursor:
        other = JsonCursor(self.depth)
        other.in_string, other.escaped = self.in_string, self.escaped
        return other


# numbers are kept as the model wrote them ("10.50", "1e3"), as strings: values are copied, not computed
_VERBATIM = json.JSONDecoder(parse_float=str, parse_int=str, parse_constant=str)


def _load_json_object(text: str) -> dict | None:
    """The JSON object at the start of ``text``; if it is cut off or broken, the longest prefix
    that ends after a complete member, with its open brackets closed. None if nothing parses.
    Numbers come back as the text that wrote them."""
    text = text.lstrip()
    try:
        obj, _ = _VERBATIM.raw_decode(text)
        return obj if isinstance(obj, dict) else None
    except json.JSONDecodeError:
        pass
    stack: list[str] = []
    cuts: list[tuple[int, str]] = []  # (index of a member-ending comma or closer, closers needed)
    cursor = JsonCursor()
    for i, ch in enumerate(text):
        kind = cursor.read(ch)
        if kind == OPEN:
            stack.append("}" if ch == "{" else "]")
        elif kind == CLOSE:
            if not stack or stack.pop() != ch:
                break
            cuts.append((i + 1, "".join(reversed(stack))))
        elif kind == OTHER and ch == ",":
            cuts.append((i, "".join(reversed(stack))))
    for end, closers in reversed(cuts):
        try:
            obj = _VERBATIM.decode(text[:end] + closers)
        except json.JSONDecodeError:
            continue
        return obj if isinstance(obj, dict) else None
    return None
