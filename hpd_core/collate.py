"""Training examples for fine-tuning: stacking labelled products into prompts, and the collators.

HPD (``hpd_features``): the sequence is the engine's training view (DESIGN.md section 2): prompt +
skeleton with each slot's gold value tokens inserted after its key (``reference.logical_sequence``),
gapped positions, generation index g (0 for prompt/skeleton, k for value token k) and the mask
``masks.training_allowed``. A slot's gold tokens v1..vK are ``render_value(value, terminator)``
tokenized on their own, as the engine splits key and value, up to the token that completes the
value, where the engine stops (stopping.py: a string's closing quote, null's last letter; a
terminator in a token of its own after them is not generated). The final token vK is produced but
never fed, so the inputs are v1..v(K-1) and the labels are
anchor -> v1, v1 -> v2, ..., v(K-1) -> vK; every other token has label ``IGNORE``, and so do the
tokens of a value that is not a target (``Labeled.scored``: fed all the same, so the slots after it
see what the engine would show them). A value longer
than K_max tokens is cut to its first K_max tokens, exactly what the engine would produce before
flagging the slot truncated: those K_max labels are still correct next tokens, so they are kept.

Baseline (``ar_features``): prompt ids exactly as ``AutoregressiveDecoder.prompt_ids`` (prompt +
``{\\n``), then the rest of the gold JSON answer and the end-of-sequence token; ordinary causal-LM
loss on the answer tokens only (positions 0..n-1, generation index 0, so the same mask function
gives the plain causal mask).

``collate`` right-pads a list of features and builds explicit position ids and per-example 4D
additive masks (B, 1, T, T); a padding query sees only itself.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from hpd_core import masks
from hpd_core.layout import build_layout, encode, encode_prompt
from hpd_core.prompts import answer_prefix, render_answer, render_prompt, render_value, special_texts, value_suffix
from hpd_core.reference import logical_sequence
from hpd_core.stopping import DONE, START, advance, token_text
from hpd_core.types import Attribute, Product, Request

IGNORE = -100  # label of tokens that carry no loss (torch cross_entropy's ignore_index)


@dataclass(frozen=True)
class Labeled:
    """One product with its target values, one per attribute of its category (schema order)."""

    category: str
    product: Product
    values: tuple[str | None, ...]
    # per value, whether it is a target (None: every one). A value that is not is still fed as its
    # slot's tokens, so the steps after it see it as the engine would, but carries no loss: a
    # teacher's value the teacher was unsure of (training/data.py).
    scored: tuple[bool, ...] | None = None


@dataclass(frozen=True)
class Example:
    """One training prompt: a request of J products and the target values ``values[j][n]``;
    ``scored[j][n]`` whether that value carries loss (None: every value, as ``Labeled.scored``)."""

    request: Request
    values: tuple[tuple[str | None, ...], ...]
    scored: tuple[tuple[bool, ...], ...] | None = None

    def is_scored(self, slot: int) -> bool:
        """Whether slot ``slot`` (product-major) is a target."""
        if self.scored is None:
            return True
        n_attr = len(self.request.attributes)
        return self.scored[slot // n_attr][slot % n_attr]


@dataclass(frozen=True)
class Features:
    """One example as token sequences of equal length."""

    input_ids: tuple[int, ...]
    position_ids: tuple[int, ...]
    gen: tuple[int, ...]  # generation index (all 0 for the baseline)
    labels: tuple[int, ...]  # the next token to predict at each index, or IGNORE
    truncated_slots: int = 0  # HPD slots whose gold value was cut at K_max

    @property
    def num_labels(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


def stack_examples(
    products: Sequence[Labeled],
    attributes: dict[str, tuple[Attribute, ...]],
    docs_per_prompt: int,
    rng: random.Random,
    max_docs_per_prompt: int | None = None,
) -> list[Example]:
    """Group products by category, shuffle within each, cut into prompts of ``docs_per_prompt``,
    or, with ``max_docs_per_prompt``, of a J drawn uniformly from docs_per_prompt..max per prompt
    (a mix of J teaches the model where a product ends, whatever J extraction uses).

    Categories keep their order of first appearance; the last prompt of a category may be smaller.
    """
    if docs_per_prompt < 1:
        raise ValueError(f"docs_per_prompt must be >= 1, got {docs_per_prompt}")
    top = max_docs_per_prompt or docs_per_prompt
    if top < docs_per_prompt:
        raise ValueError(f"max_docs_per_prompt {top} is below docs_per_prompt {docs_per_prompt}")
    by_category: dict[str, list[Labeled]] = {}
    for item in products:
        by_category.setdefault(item.category, []).append(item)
    examples = []
    for category, items in by_category.items():
        items = list(items)
        rng.shuffle(items)
        attrs = attributes[category]
        start = 0
        while start < len(items):
            size = docs_per_prompt if top == docs_per_prompt else rng.randint(docs_per_prompt, top)
            chunk = items[start : start + size]
            start += size
            for item in chunk:
                if len(item.values) != len(attrs):
                    raise ValueError(
                        f"product {item.product.product_id!r}: {len(item.values)} values for {len(attrs)} attributes"
                    )
            request = Request(category, attrs, tuple(item.product for item in chunk))
            scored = None
            if any(item.scored is not None for item in chunk):
                scored = tuple(item.scored or (True,) * len(attrs) for item in chunk)
            examples.append(Example(request, tuple(item.values for item in chunk), scored))
    return examples


def shuffle_schema(example: Example, rng: random.Random) -> Example:
    """The example asking for a random non-empty subset of its attributes (its size drawn uniformly
    from 1..N) in a random order, each product's values and targets following their attributes:
    a model trained on such prompts must read which attributes a prompt asks for, and in which
    order, instead of learning each category's one list (``TrainConfig.shuffle_attributes``)."""
    attrs = example.request.attributes
    keep = rng.sample(range(len(attrs)), rng.randint(1, len(attrs)))
    request = replace(example.request, attributes=tuple(attrs[n] for n in keep))
    values = tuple(tuple(row[n] for n in keep) for row in example.values)
    scored = None if example.scored is None else tuple(tuple(row[n] for n in keep) for row in example.scored)
    return Example(request, values, scored)


def value_tokens(tokenizer, example: Example) -> list[list[int]]:
    """Per slot (product-major): the gold value's tokens as HPD generates them (not yet cut at K_max)."""
    request = example.request
    n_attr, specials = len(request.attributes), special_texts(tokenizer)
    return [
        until_complete(tokenizer, encode(tokenizer, render_value(example.values[s // n_attr][s % n_attr], value_suffix(request, s), specials)))
        for s in range(request.num_slots)
    ]


def until_complete(tokenizer, tokens: list[int]) -> list[int]:
    """``tokens`` up to the one with which the value is complete (stopping.py), all if none is."""
    state = START
    for i, token in enumerate(tokens):
        state = advance(state, token_text(tokenizer, token))
        if state == DONE:
            return tokens[: i + 1]
    return tokens


def hpd_features(tokenizer, example: Example, k_max: int, skeleton: str = "after-products") -> Features:
    """The training view of one prompt, labels on every value token of a scored value (see module doc)."""
    layout = build_layout(example.request, tokenizer, k_max, skeleton)
    full = value_tokens(tokenizer, example)
    gold = [tokens[:k_max] for tokens in full]  # what the engine produces before cutting
    fed = [tokens[:-1] for tokens in gold]  # the final token of a slot is never fed
    ids, pos, gen, last = logical_sequence(layout, fed)
    labels = [IGNORE] * len(ids)
    for s, tokens in enumerate(gold):
        if not example.is_scored(s):
            continue  # fed, but not a target
        anchor = last[s] - len(fed[s])  # index of slot s's anchor in the logical sequence
        labels[anchor : anchor + len(tokens)] = tokens  # anchor -> v1, v_k -> v_(k+1)
    truncated = sum(len(tokens) > k_max for tokens in full)
    return Features(tuple(ids), tuple(pos), tuple(gen), tuple(labels), truncated)


def ar_features(tokenizer, example: Example) -> Features:
    """The baseline's sequence: prompt + ``{\\n`` (no loss), rest of the answer + eos (loss)."""
    request = example.request
    if example.scored is not None and not all(all(row) for row in example.scored):
        raise ValueError("values that carry no loss are for the HPD view only: the baseline's "
                         "answer is one sequence")
    prefix = answer_prefix()
    prompt = encode_prompt(tokenizer, render_prompt(request, tokenizer) + prefix)
    answer_text = render_answer(request, [list(row) for row in example.values], special_texts(tokenizer))
    if not answer_text.startswith(prefix):
        raise ValueError(f"answer text does not start with the answer prefix {prefix!r}")
    answer = encode(tokenizer, answer_text[len(prefix) :])
    if tokenizer.eos_token_id is not None:
        answer.append(tokenizer.eos_token_id)
    ids = prompt + answer
    # label at index i is the token at i + 1: the last prompt token predicts the first answer token
    labels = [IGNORE] * (len(prompt) - 1) + answer + [IGNORE]
    return Features(tuple(ids), tuple(range(len(ids))), (0,) * len(ids), tuple(labels))


def features(tokenizer, example: Example, decoder: str, k_max: int, skeleton: str = "after-products") -> Features:
    if decoder == "hpd":
        return hpd_features(tokenizer, example, k_max, skeleton)
    if decoder == "ar":
        return ar_features(tokenizer, example)
    raise ValueError(f"decoder must be 'hpd' or 'ar' for fine-tuning, got {decoder!r}")


def collate(
    batch: Sequence[Features],
    pad_id: int,
    dtype: torch.dtype = torch.float32,
    windows: dict[str, int | None] | None = None,
) -> dict:
    """Right-pad to the longest example. Returns input_ids, position_ids, labels (B, T) and the
    additive attention_mask (B, 1, T, T) of the training-view rule in ``dtype``: one per attention
    rule of the model's layers (``windows`` from ``masks.layer_windows``; default: full attention),
    a mapping by layer type when they differ (``masks.for_layers``)."""
    B, T = len(batch), max(len(f.input_ids) for f in batch)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    position_ids = torch.zeros((B, T), dtype=torch.long)
    gen = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), IGNORE, dtype=torch.long)
    valid = torch.zeros((B, T), dtype=torch.bool)
    for b, f in enumerate(batch):
        n = len(f.input_ids)
        input_ids[b, :n] = torch.tensor(f.input_ids)
        position_ids[b, :n] = torch.tensor(f.position_ids)
        gen[b, :n] = torch.tensor(f.gen)
        labels[b, :n] = torch.tensor(f.labels)
        valid[b, :n] = True
    windows = windows or {masks.FULL: None}
    mask = masks.for_layers(  # (B, 1, T, T) per layer rule
        windows, lambda w: masks.additive(masks.training_allowed(position_ids, gen, valid, w), dtype)
    )
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "attention_mask": mask,
        "labels": labels,
    }
