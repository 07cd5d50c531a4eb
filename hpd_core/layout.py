"""Prompt + skeleton -> token ids, gapped position ids and the slot table (DESIGN.md section 2).

Positions count normally over prompt + skeleton, but after every anchor (the last token of a slot's
key) K_max positions are skipped: token k (1-based) of slot s gets position ``anchor_pos[s] + k``.
Each segment is tokenized on its own, so anchors fall exactly on segment ends; segments start right
after a value's terminator, which is a pre-tokenizer boundary for BPE vocabularies
(``check_token_boundary`` verifies the split for a given tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass

from hpd_core.prompts import (
    first_key_tail,
    render_prompt,
    render_value,
    skeleton_segments,
    special_texts,
    value_suffix,
)
from hpd_core.types import Attribute, Product, Request

INTERLEAVED = "interleaved"


@dataclass(frozen=True)
class Layout:
    """One request laid out for HPD. Slot s is (product s // N, attribute s % N)."""

    input_ids: tuple[int, ...]  # prompt + skeleton through the last anchor
    position_ids: tuple[int, ...]  # same length, with a K_max gap after every anchor
    anchor_index: tuple[int, ...]  # per slot: index of its anchor in input_ids
    max_value_tokens: int  # K_max
    num_attributes: int
    # interleaved skeleton: per attribute, the tokens from a product's text to the end of that
    # attribute's key were it the product's first (prompts.first_key_tail); () for after-products
    key_tails: tuple[int, ...] = ()

    @property
    def num_slots(self) -> int:
        return len(self.anchor_index)

    @property
    def anchor_pos(self) -> tuple[int, ...]:
        return tuple(self.position_ids[i] for i in self.anchor_index)

    @property
    def last_position(self) -> int:
        """The position of the last value token the layout leaves room for."""
        return max(self.anchor_pos) + self.max_value_tokens

    def value_position(self, slot: int, k: int) -> int:
        """Position of token k (1-based) of slot ``slot``."""
        if not 1 <= k <= self.max_value_tokens:
            raise ValueError(f"value token index {k} outside 1..{self.max_value_tokens}")
        return self.position_ids[self.anchor_index[slot]] + k


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_many(tokenizer, texts: list[str]) -> list[list[int]]:
    """``encode`` of each text, in one call: a fast tokenizer encodes the whole list in Rust, on
    several threads, without the Python cost of a call per text; the same ids
    (tests/hpd_core/test_layout_masks.py). On the 2-core sandbox it took 2.2-2.4x less time
    for HPD's layouts and the baseline's prompts of 512 synthetic products, titles and 500-token
    products, with either shipped tokenizer (scripts/tokenize_ab.py); a GPU host has more cores."""
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []


def start_ids(tokenizer) -> list[int]:
    """The ids the tokenizer's own encoding puts before any text (Gemma's ``<bos>``; nothing for
    most chat models), read from its behaviour rather than a flag such as ``add_bos_token``."""
    plain = encode(tokenizer, "a")
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):  # tokens after the text (an eos) are not ours
        if full[start : start + len(plain)] == plain:
            return full[:start]
    raise ValueError(f"cannot find the text's own tokens {plain} in the tokenizer's encoding {full}")


def encode_prompt(tokenizer, text: str) -> list[int]:
    """A prompt's ids, starting as the tokenizer's own encoding starts a sequence (``start_ids``),
    unless the text already begins with those tokens (a chat template that writes ``<bos>``)."""
    return with_start(encode(tokenizer, text), start_ids(tokenizer))


def with_start(ids: list[int], start: list[int]) -> list[int]:
    """A prompt's ids (its text's own encoding) started with ``start`` (``start_ids``) unless they
    begin with it already."""
    return ids if ids[: len(start)] == start else start + ids


def shared_prefix_length(tokenizer, prefix_text: str, ids: tuple[int, ...] | list[int], limit: int) -> int:
    """How many leading ``ids`` (a prompt's own tokens) are the tokens of ``prefix_text`` on its
    own (prompts.shared_prefix_text), at most ``limit``: where the prefix text ends inside a token
    of the whole prompt, the tokens that differ are left to the prompt's own prefill, so a prompt
    keeps exactly its own tokens whether or not it shares the prefix."""
    return common_length(encode_prompt(tokenizer, prefix_text), ids, limit)


def shared_prefix_lengths(tokenizer, prefix_texts: list[str], ids: list, limits: list[int]) -> list[int]:
    """``shared_prefix_length`` for each (prefix text, prompt ids, limit), each distinct prefix text
    (one a category) tokenized once, all in one call."""
    distinct = list(dict.fromkeys(prefix_texts))
    start = start_ids(tokenizer) if distinct else []
    encoded = {text: with_start(e, start) for text, e in zip(distinct, encode_many(tokenizer, distinct))}
    return [common_length(encoded[text], i, limit) for text, i, limit in zip(prefix_texts, ids, limits)]


def common_length(prefix: list[int], ids, limit: int) -> int:
    """How many leading ``ids`` (at most ``limit``) equal ``prefix``'s."""
    n = 0
    for a, b in zip(prefix, ids[:limit]):
        if a != b:
            break
        n += 1
    return n


def build_layout(request: Request, tokenizer, max_value_tokens: int, skeleton: str = "after-products") -> Layout:
    """The request's layout, each segment tokenized on its own (the reference ``build_layouts`` is
    checked against)."""
    segments, tails = layout_texts(request, tokenizer, skeleton)
    ids = [encode_prompt(tokenizer, segments[0])] + [encode(tokenizer, segment) for segment in segments[1:]]
    return assemble(request, segments, ids, [encode(tokenizer, tail) for tail in tails], max_value_tokens)


def build_layouts(
    requests: list[Request], tokenizer, max_value_tokens: int, skeleton: str = "after-products"
) -> list[Layout]:
    """``build_layout`` of each request, every text of every request tokenized in one call
    (``encode_many``): the same layouts."""
    texts, parts = [], []
    for request in requests:
        segments, tails = layout_texts(request, tokenizer, skeleton)
        parts.append((segments, len(texts), len(tails)))
        texts += segments + tails
    encoded = encode_many(tokenizer, texts)
    start = start_ids(tokenizer) if requests else []
    layouts = []
    for request, (segments, at, n_tails) in zip(requests, parts):
        ids = encoded[at : at + len(segments)]
        ids[0] = with_start(ids[0], start)
        tails = encoded[at + len(segments) : at + len(segments) + n_tails]
        layouts.append(assemble(request, segments, ids, tails, max_value_tokens))
    return layouts


def layout_texts(request: Request, tokenizer, skeleton: str) -> tuple[list[str], list[str]]:
    """The texts a layout is tokenized from: the segments (prompt and skeleton, each ending at an
    anchor; the first with the prompt before it) and, for the interleaved skeleton, each
    attribute's key tail (``prompts.first_key_tail``)."""
    specials = special_texts(tokenizer)
    segments = skeleton_segments(request, skeleton, specials)
    segments[0] = render_prompt(request, tokenizer, skeleton) + segments[0]
    tails = [first_key_tail(a, specials) for a in request.attributes] if skeleton == INTERLEAVED else []
    return segments, tails


def assemble(
    request: Request, segments: list[str], ids: list[list[int]], tails: list[list[int]], max_value_tokens: int
) -> Layout:
    """A layout from its segments' ids (the first started as a prompt) and its key tails' ids."""
    input_ids: list[int] = []
    position_ids: list[int] = []
    anchor_index: list[int] = []
    offset = 0  # total gap inserted so far
    for segment, segment_ids in zip(segments, ids):
        if not segment_ids:
            raise ValueError(f"segment {segment!r} tokenized to nothing")
        start = len(input_ids)
        input_ids.extend(segment_ids)
        position_ids.extend(range(start + offset, start + offset + len(segment_ids)))
        anchor_index.append(len(input_ids) - 1)
        offset += max_value_tokens
    return Layout(
        input_ids=tuple(input_ids),
        position_ids=tuple(position_ids),
        anchor_index=tuple(anchor_index),
        max_value_tokens=max_value_tokens,
        num_attributes=len(request.attributes),
        key_tails=tuple(len(tail) for tail in tails),
    )


def beyond_window(layout: Layout, window: int | None) -> int:
    """How many slots start their value ``window`` or more positions after their product's text,
    so that a sliding-window layer of that window (it counts positions, docs/sliding-window.md)
    sees none of that text from them. With the interleaved skeleton a product's text ends
    ``key_tails[0]`` tokens before its first key's anchor (the tail tokenized on its own: a token
    merged across the boundary moves it by one); with the after-products one it lies further back
    still, and this counts from the first key (a lower bound). The gap of K_max positions after
    every key makes it grow with the attributes (about 35 positions each at K_max 30: a
    512-position window is passed after about 14)."""
    if window is None:
        return 0
    anchors, n = layout.anchor_pos, layout.num_attributes
    lead = layout.key_tails[0] if layout.key_tails else 0
    return sum(anchors[s] + 1 - anchors[s - s % n] + lead >= window for s in range(layout.num_slots))


def check_token_boundary(
    tokenizer, request: Request, sample_value: str | None = "Acme 500", skeleton: str = "after-products"
) -> bool:
    """True if, for every slot, tokenizing prompt + skeleton through the key and then a value
    gives the key's tokens followed by the value's own tokens: the key/value split falls where the
    tokenizer splits the full JSON text, so the first value token is one the model would produce in
    ordinary generation (BPE vocabularies glue the leading space to the value's opening quote).

    The value/next-key split is not required to match: the terminator token is never fed back.
    """
    text, specials = "", special_texts(tokenizer)
    for s, segment in enumerate(skeleton_segments(request, skeleton, specials)):
        text += segment
        value = render_value(sample_value, value_suffix(request, s), specials)
        key_ids, value_ids = encode(tokenizer, text), encode(tokenizer, value)
        joint = encode(tokenizer, text + value)
        if joint[: len(key_ids)] != key_ids or joint[len(key_ids)] != value_ids[0]:
            return False
        text += value
    return True


BOUNDARY_SAMPLE = Request(
    category="Sample category",
    attributes=(Attribute("Brand"), Attribute("Size"), Attribute("Item Form")),
    products=(Product("1", "Acme Trail Runner, red, size 10"), Product("2", 'Acme "Pro" 500 ml bottle')),
)
BOUNDARY_VALUES = ("Acme 500", "10", None)


def require_token_boundary(tokenizer, skeleton: str = "after-products") -> None:
    """Fail loudly, when a decoder is built, if ``tokenizer`` splits key and value differently
    from the full JSON text (``check_token_boundary`` on a sample request, for string, number-like
    and null values): HPD would then feed the model first tokens it never produces itself."""
    for value in BOUNDARY_VALUES:
        if not check_token_boundary(tokenizer, BOUNDARY_SAMPLE, value, skeleton):
            raise ValueError(
                f"this tokenizer does not split a key from its value (sample value {value!r}) where it splits "
                "the whole JSON answer, so HPD's first value token would not be one the model produces in "
                "ordinary generation; use the autoregressive decoder with this model"
            )
