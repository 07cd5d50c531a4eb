"""Requests and results: the engine's whole public data model.

Plain frozen dataclasses with no torch import, so Ray stages and the CLI can build requests and read
results without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Attribute:
    """One attribute to extract, e.g. ``Attribute("Brand")`` or with a short description."""

    name: str
    description: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"attribute name must be a non-empty string, got {self.name!r}")
        if self.description is not None and not isinstance(self.description, str):
            raise ValueError(f"attribute {self.name!r}: description must be a string or None")


@dataclass(frozen=True)
class Product:
    """One product record as the engine sees it (already validated by the pipeline)."""

    product_id: str
    title: str
    description: str | None = None
    features: tuple[str, ...] = ()


@dataclass(frozen=True)
class Request:
    """One prompt: 1..J products of one category and the attributes to extract from each."""

    category: str
    attributes: tuple[Attribute, ...]
    products: tuple[Product, ...]

    def __post_init__(self) -> None:
        if not self.attributes:
            raise ValueError(f"request for category {self.category!r} has no attributes")
        if not self.products:
            raise ValueError(f"request for category {self.category!r} has no products")
        names = [a.name for a in self.attributes]
        if len(set(names)) != len(names):
            raise ValueError(f"category {self.category!r}: duplicate attribute names in {names}")

    @property
    def num_slots(self) -> int:
        return len(self.products) * len(self.attributes)


@dataclass(frozen=True)
class Value:
    """The decoded value of one (product, attribute) slot.

    ``value`` is None when the model answered ``null`` or nothing usable. ``truncated`` means the
    value hit the token limit before it closed. ``parse_error`` means the model's text for this slot
    was not valid JSON (the value is then None, or the best partial string when truncated).
    ``confidence`` (``DecodeConfig.confidence``; None when not asked for): the probability the model
    gave this slot's tokens, every one it generated (a ``null`` answer's and the token that closed
    the value included), each under the model's distribution at temperature 1 over the whole
    vocabulary (with span decoding, over the tokens the span rule allowed), whatever temperature
    or top-p picked them. A product of probabilities, so long values score lower.
    """

    value: str | None
    truncated: bool = False
    parse_error: bool = False
    confidence: float | None = None


@dataclass(frozen=True)
class Result:
    """The answer to one request.

    ``values[j][n]`` is the value of attribute n for product j (request order).
    ``error`` is set when the request as a whole could not be decoded (e.g. it does not fit in
    device memory even alone); its values are then all None and the pipeline rejects its products.
    Counters: ``prompt_tokens`` (prefill tokens of this request), ``generated_tokens`` (value tokens
    or answer tokens produced), ``forward_passes`` (model calls this request took part in).
    """

    request: Request
    values: tuple[tuple[Value, ...], ...]
    prompt_tokens: int
    generated_tokens: int
    forward_passes: int
    decoder: str
    error: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def items(self):
        """Yield (product, attribute, value) triples in request order."""
        for product, row in zip(self.request.products, self.values):
            for attribute, value in zip(self.request.attributes, row):
                yield product, attribute, value
