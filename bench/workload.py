"""Benchmark inputs: engine Requests from a records file, or a synthetic workload with fixed lengths.

Both kinds stack J products of one category per request, in input order.

- Records (``records_workload``): ``records.jsonl`` rows ``{product_id, category, title,
  description?, features?}`` and ``attributes.json`` ``{category: [names]}``, as ``hpd convert``
  writes them. Both decoders decode for real and stop by themselves.
- Synthetic (``synthetic_workload``): products of random words (about ``product_tokens`` tokens
  each), N attributes, and a drawn length L in 1..K per (product, attribute). Randomly initialised
  models never close a value, so lengths are fixed for both decoders alike: HPD is teacher-forced
  with L token ids per slot (``forced``: L-1 word tokens, then the slot's terminator ``,`` or
  newline, so the engine's stop machine ends the slot exactly at its L-th token), and the baseline
  generates exactly the number of tokens the whole JSON answer takes (``exact_new_tokens``): the
  skeleton (keys, braces, indentation, as HPD tokenizes it) after the ``{\\n`` both prompts end
  with, plus the same value tokens, plus the closing braces.

Products and lengths are drawn before stacking, so every J sees the same products and values.
No torch import here.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace

from datafiles.dataset import read_attributes, read_records
from hpd_core.layout import build_layout, encode
from hpd_core.prompts import (
    TERMINATORS,
    answer_prefix,
    guard_specials,
    product_text,
    render_prompt,
    skeleton_segments,
    special_texts,
    value_suffix,
)
from hpd_core.types import Attribute, Product, Request

VALUE_LENGTH_DISTS = ("uniform", "geometric")
SYNTHETIC_CATEGORY = "Synthetic"
ANSWER_CLOSE = "  }\n}"  # what follows the last value's newline in the pretty-printed answer
TITLE_WORDS = 12  # the first words of a synthetic product are its title, the rest its description
MIN_WORD_TOKENS = 8  # a tokenizer must have at least this many single-token words
ATTRIBUTE_NAMES = (
    "Brand", "Color", "Material", "Size", "Gender", "Model name", "Product type", "Pattern",
    "Style", "Capacity", "Weight", "Dimensions", "Power source", "Compatible devices",
    "Number of items", "Age range", "Finish", "Shape", "Theme", "Occasion",
)  # fmt: skip
_WORD = re.compile(r"^ [a-z]{3,12}$")


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic workload: what to draw and how to stack it."""

    num_products: int = 64
    product_tokens: int = 500
    attributes_per_product: int = 16
    value_tokens_max: int = 30
    value_length_dist: str = "uniform"
    value_length_mean: float = 6.0  # geometric only: mean of the (truncated) distribution
    docs_per_prompt: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_products", "product_tokens", "attributes_per_product", "value_tokens_max", "docs_per_prompt"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.value_length_dist not in VALUE_LENGTH_DISTS:
            raise ValueError(f"value_length_dist must be one of {VALUE_LENGTH_DISTS}, got {self.value_length_dist!r}")
        if not self.value_length_mean >= 1:
            raise ValueError(f"value_length_mean must be >= 1, got {self.value_length_mean}")


@dataclass(frozen=True)
class Workload:
    """Requests for both decoders, and (synthetic only) the fixed lengths.

    forced[r][s]: HPD's token ids for slot s of request r (teacher forcing);
    exact_new_tokens[r]: how many tokens the baseline generates for request r.
    """

    kind: str  # "records" | "synthetic"
    requests: tuple[Request, ...]
    forced: tuple[tuple[tuple[int, ...], ...], ...] | None = None
    exact_new_tokens: tuple[int, ...] | None = None
    info: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError("workload has no requests")
        for name in ("forced", "exact_new_tokens"):
            value = getattr(self, name)
            if value is not None and len(value) != len(self.requests):
                raise ValueError(f"{name} must have one entry per request")

    @property
    def fixed_lengths(self) -> bool:
        """True when lengths are forced (synthetic); a matched baseline has only exact_new_tokens."""
        return self.forced is not None

    @property
    def num_products(self) -> int:
        return sum(len(r.products) for r in self.requests)

    def head(self, n: int) -> "Workload":
        """The first n requests (warm-up)."""
        n = max(1, min(n, len(self.requests)))
        return replace(
            self,
            requests=self.requests[:n],
            forced=None if self.forced is None else self.forced[:n],
            exact_new_tokens=None if self.exact_new_tokens is None else self.exact_new_tokens[:n],
        )


def floor_input_tokens(requests, tokenizer) -> float:
    """Per product (mean), the input tokens no sharing removes: the product's own text and its
    attribute keys (its skeleton segments: keys with their JSON punctuation). With the generated
    values, this is the per-product floor the bench compares both decoders against."""
    total = products = 0
    specials = special_texts(tokenizer)  # as the prompt writes the text
    for request in requests:
        segments, N = skeleton_segments(request, specials=specials), len(request.attributes)
        for j in range(len(request.products)):
            total += len(encode(tokenizer, guard_specials(product_text(request, j), specials)))
            total += sum(len(encode(tokenizer, segment)) for segment in segments[j * N : (j + 1) * N])
            products += 1
    return total / products


# --- records ---------------------------------------------------------------------------------


def stack(products: list[tuple[str, Product]], schema: dict[str, list[str]], docs_per_prompt: int) -> list[Request]:
    """(category, product) pairs -> requests of up to J products of one category, in first-seen order."""
    if docs_per_prompt < 1:
        raise ValueError(f"docs_per_prompt must be >= 1, got {docs_per_prompt}")
    by_category: dict[str, list[Product]] = {}
    for category, product in products:
        by_category.setdefault(category, []).append(product)
    requests = []
    for category, items in by_category.items():
        attributes = tuple(Attribute(name) for name in schema[category])
        for i in range(0, len(items), docs_per_prompt):
            requests.append(Request(category, attributes, tuple(items[i : i + docs_per_prompt])))
    return requests


def records_workload(
    records_path: str,
    attributes_path: str,
    docs_per_prompt: int,
    limit: int | None = None,
    per_category: int | None = None,
) -> Workload:
    """Records in file order: the first ``limit``, and of those the first ``per_category`` of each
    category (a small sample that still covers every category)."""
    for name, value in (("limit", limit), ("per_category", per_category)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    schema = read_attributes(attributes_path)
    rows = read_records(records_path, limit)
    if per_category is not None:
        kept, seen = [], {}
        for row in rows:
            seen[row["category"]] = seen.get(row["category"], 0) + 1
            if seen[row["category"]] <= per_category:
                kept.append(row)
        rows = kept
    missing = sorted({r["category"] for r in rows} - set(schema))
    if missing:
        raise ValueError(f"{attributes_path} has no attributes for categories {missing}: add them to the schema")
    products = [
        (r["category"], Product(r["product_id"], r["title"], r.get("description") or None, tuple(r.get("features") or ())))
        for r in rows
    ]
    requests = stack(products, schema, docs_per_prompt)
    info = {
        "records": str(records_path),
        "attributes": str(attributes_path),
        "limit": limit,
        "per_category": per_category,
        "products": len(products),
        "categories": len({c for c, _ in products}),
        "docs_per_prompt": docs_per_prompt,
        "slots": sum(r.num_slots for r in requests),
    }
    return Workload("records", tuple(requests), info=info)


def answer_value_tokens(tokenizer, tokens: list[int]) -> int:
    """The tokens a value takes in the baseline's JSON answer, terminator included, from the tokens
    HPD generated for it: those, plus one for the terminator HPD does not ask for after a complete
    value (a closed string, null: stopping.py) or after a value cut at K_max."""
    return len(tokens) + (not tokenizer.decode(tokens).rstrip(" \t\r").endswith(tuple(TERMINATORS)))


def matched_baseline(workload: Workload, value_lengths: dict[tuple[str, str], int], tokenizer, max_value_tokens: int) -> Workload:
    """The records workload with the baseline's lengths fixed: each request generates exactly the
    tokens of the JSON answer whose values are as long as HPD's (``value_lengths[(product_id,
    attribute)]``, terminator included). Equal output, so the comparison is of decoding cost alone."""
    exact = []
    for request in workload.requests:
        lengths = [value_lengths[(p.product_id, a.name)] for p in request.products for a in request.attributes]
        layout = build_layout(request, tokenizer, max_value_tokens)
        exact.append(answer_tokens(tokenizer, request, len(layout.input_ids), lengths))
    info = {**workload.info, "baseline_lengths": "matched to HPD's values", "answer_tokens_mean_per_product": sum(exact) / workload.num_products}
    return replace(workload, exact_new_tokens=tuple(exact), info=info)


# --- synthetic -------------------------------------------------------------------------------


def word_tokens(tokenizer) -> list[int]:
    """Ids of tokens that are one lower-case word with a leading space (`` cotton``)."""
    special = set(tokenizer.all_special_ids)
    ids = [
        i
        for i, text in enumerate(tokenizer.batch_decode([[i] for i in range(len(tokenizer))]))
        if i not in special and _WORD.match(text)
    ]
    if len(ids) < MIN_WORD_TOKENS:
        raise ValueError(f"tokenizer has only {len(ids)} single-token words; a synthetic workload needs {MIN_WORD_TOKENS}")
    return ids


def single_token(tokenizer, text: str) -> int:
    ids = encode(tokenizer, text)
    if len(ids) != 1:
        raise ValueError(f"tokenizer splits {text!r} into {len(ids)} tokens; the synthetic workload needs it as one")
    return ids[0]


def draw_length(rng: random.Random, spec: SyntheticSpec) -> int:
    """A value length in 1..K (K = value_tokens_max), terminator included."""
    K = spec.value_tokens_max
    if spec.value_length_dist == "uniform":
        return rng.randint(1, K)
    p = 1.0 / spec.value_length_mean  # geometric on 1, 2, ..., truncated to K by redrawing
    while True:
        length = 1
        while rng.random() > p:
            length += 1
        if length <= K:
            return length


def answer_tokens(tokenizer, request: Request, layout_tokens: int, value_lengths: list[int]) -> int:
    """Tokens of the full JSON answer after the baseline's ``{\\n``: skeleton (HPD's layout minus the
    baseline's prompt), the values (terminators included), and the closing braces."""
    prompt = len(encode(tokenizer, render_prompt(request, tokenizer) + answer_prefix()))
    return layout_tokens - prompt + sum(value_lengths) + len(encode(tokenizer, ANSWER_CLOSE))


def synthetic_workload(spec: SyntheticSpec, tokenizer, max_value_tokens: int) -> Workload:
    """Draw products and value lengths (independent of J), stack them, fix lengths for both decoders."""
    if spec.value_tokens_max > max_value_tokens:
        raise ValueError(
            f"value_tokens_max {spec.value_tokens_max} exceeds the decoder's max_value_tokens {max_value_tokens}"
        )
    rng = random.Random(spec.seed)
    words = word_tokens(tokenizer)
    texts = dict(zip(words, tokenizer.batch_decode([[w] for w in words])))
    terminators = {suffix: single_token(tokenizer, suffix) for suffix in (",", "\n")}
    N = spec.attributes_per_product
    names = [ATTRIBUTE_NAMES[n] if n < len(ATTRIBUTE_NAMES) else f"Attribute {n + 1}" for n in range(N)]
    attributes = tuple(Attribute(name) for name in names)

    products, lengths, fillers = [], [], []
    for p in range(spec.num_products):
        text = [texts[w] for w in rng.choices(words, k=spec.product_tokens)]  # one token per word
        title = "".join(text[:TITLE_WORDS]).strip()
        description = "".join(text[TITLE_WORDS:]).strip() or None
        products.append(Product(f"synthetic-{spec.seed}-{p:06d}", title, description))
        row = [draw_length(rng, spec) for _ in range(N)]
        lengths.append(row)
        fillers.append([rng.choices(words, k=length - 1) for length in row])

    requests, forced, exact = [], [], []
    J = spec.docs_per_prompt
    for start in range(0, spec.num_products, J):
        request = Request(SYNTHETIC_CATEGORY, attributes, tuple(products[start : start + J]))
        slots, slot_lengths = [], []
        for j in range(len(request.products)):
            for n in range(N):
                s = j * N + n
                slots.append(tuple(fillers[start + j][n]) + (terminators[value_suffix(request, s)],))
                slot_lengths.append(lengths[start + j][n])
        layout = build_layout(request, tokenizer, max_value_tokens)
        requests.append(request)
        forced.append(tuple(slots))
        exact.append(answer_tokens(tokenizer, request, len(layout.input_ids), slot_lengths))

    all_lengths = [length for row in lengths for length in row]
    info = {
        "spec": {**spec.__dict__},
        "products": spec.num_products,
        "slots": len(all_lengths),
        "value_tokens_mean": sum(all_lengths) / len(all_lengths),
        "answer_tokens_mean_per_product": sum(exact) / spec.num_products,
    }
    return Workload("synthetic", tuple(requests), tuple(forced), tuple(exact), info)
