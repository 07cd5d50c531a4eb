"""Which products of a catalog to label first, for `hpd finetune --init-adapter` (`hpd pick`).

A few hundred labelled products of a catalog take the shipped adapter most of the way there
(README, Your own catalog). Which ones: each category gets a share of ``count`` in proportion to
its products, at least ``min_per_category`` (so that no category goes unseen), and within a
category a seeded random sample: the products first in the seed's order, a keyed hash of their ids
(``rank``), so that the sample of a category of any size is the ``limit`` lowest ranks, kept as
they stream past in O(limit) memory (``Lowest``, a bottom-k sample; ``select`` is its slow, obvious
reference, every product sorted). Picking the products the model is least sure of instead was
measured and did not help (docs/quality.md, session 50): how much 45 labelled products give
varies more from one sample to the next (60 to 70 F1 on AE-110k) than between the ways of
choosing them, and at 200 the least sure scored 6 points below a random 200.
"""

from __future__ import annotations

import bisect
import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

RANK_BYTES = 8  # of the keyed BLAKE2b hash that orders a category's products

@dataclass(frozen=True)
class SelectionConfig:
    """How many products to pick, and how."""

    count: int
    min_per_category: int = 2
    seed: int = 0
    # products looked up per product of a category's share, beyond it in the seed's order, to stand
    # in for one that is not in the input as the job read it (`hpd pick`)
    reserves: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"count must be a positive int, got {self.count!r}")
        if not isinstance(self.min_per_category, int) or self.min_per_category < 0:
            raise ValueError(f"min_per_category must be an int >= 0, got {self.min_per_category!r}")
        if not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.reserves, int) or self.reserves < 0:
            raise ValueError(f"reserves must be an int >= 0, got {self.reserves!r}")


def seed_key(seed: int) -> bytes:
    """The key of a seed's order of products: a hash of its decimal digits (any int, one key each)."""
    return hashlib.blake2b(str(seed).encode(), digest_size=16).digest()


def rank(product_id: str, key: bytes) -> tuple[int, str]:
    """A product's place in the order ``key`` draws: a keyed BLAKE2b hash of its id, the same on any
    machine, run or order of reading, uniform over ids; the id breaks the (unlikely) tie of two."""
    digest = hashlib.blake2b(product_id.encode("utf-8", "surrogatepass"), digest_size=RANK_BYTES, key=key).digest()
    return int.from_bytes(digest, "big"), product_id


def quotas(sizes: Mapping[str, int], count: int, minimum: int, seed: int) -> dict[str, int]:
    """Products to pick per category: ``minimum`` each (all of a smaller category), and the rest of
    ``count`` in proportion to the categories' sizes (largest remainders first), never more than a
    category holds; what a category cannot take goes to those with the most left. Categories tied
    on a remainder (or on what they have left) are taken in an order drawn with ``seed``, not by
    name, so each seed may favour another of them. The sum is ``count``, or more where ``minimum``
    per category already exceeds it, or less where the categories hold fewer products."""
    if minimum < 0 or count < 0:
        raise ValueError(f"count and minimum must be >= 0, got {count} and {minimum}")
    order = sorted(sizes)
    random.Random(seed).shuffle(order)  # its own generator, drawn from the seed alone
    rank = {c: i for i, c in enumerate(order)}  # the tie-break: lower first
    picked = {c: min(minimum, n) for c, n in sizes.items()}
    left = max(0, count - sum(picked.values()))
    total = sum(sizes.values()) or 1
    remainder = {c: left * n % total for c, n in sizes.items()}  # of left * n / total, in 1/total: exact, ties are ties
    for c, n in sizes.items():
        picked[c] += left * n // total
    rest = count - sum(picked.values())
    for c in sorted(sizes, key=lambda c: (-remainder[c], rank[c]))[: max(rest, 0)]:
        picked[c] += 1
    picked = {c: min(k, sizes[c]) for c, k in picked.items()}
    spare = count - sum(picked.values())
    while spare > 0 and any(picked[c] < n for c, n in sizes.items()):
        c = max(sizes, key=lambda c: (sizes[c] - picked[c], -rank[c]))
        picked[c] += 1
        spare -= 1
    return picked


def select(products: Sequence[tuple[str, str]], config: SelectionConfig) -> list[str]:
    """The product ids to label, in input order; ``products``: (product_id, category) in input order,
    each id once. The slow, obvious rule, all in memory: each category's quota of its products first
    in the seed's order (every one ranked and sorted). `hpd pick` streams the same with ``Lowest``."""
    by_category: dict[str, list[str]] = {}
    for product_id, category in products:
        by_category.setdefault(category, []).append(product_id)
    wanted = quotas({c: len(ids) for c, ids in by_category.items()}, config.count, config.min_per_category,
                    config.seed)
    key = seed_key(config.seed)
    chosen: set[str] = set()
    for category, ids in by_category.items():
        chosen.update(sorted(ids, key=lambda product_id: rank(product_id, key))[: wanted[category]])
    return [product_id for product_id, _ in products if product_id in chosen]


class Lowest:
    """The ``limit`` products of one category first in the order ``key`` draws (lowest ``rank``),
    from a stream that may name a product more than once and in any order: a bottom-k sample in
    O(limit) memory, the same set as sorting them all (``select``). It also keeps where (a file)
    each kept product was seen: a product is kept from its first sighting on or never, since the
    bar to get in only falls, so that set is complete."""

    def __init__(self, limit: int, key: bytes) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit, self.key = limit, key
        self.kept: list[tuple[int, str]] = []  # (rank, product_id), ascending; at most limit
        self.seen_in: dict[str, set[str]] = {}  # product_id -> where it was seen, for those kept

    def offer(self, product_ids: Iterable[str], where: str) -> None:
        for product_id in product_ids:
            places = self.seen_in.get(product_id)
            if places is not None:
                places.add(where)
                continue
            ranked = rank(product_id, self.key)
            if len(self.kept) == self.limit and (not self.kept or ranked >= self.kept[-1]):
                continue
            bisect.insort(self.kept, ranked)
            self.seen_in[product_id] = {where}
            if len(self.kept) > self.limit:
                del self.seen_in[self.kept.pop()[1]]

    def ranked(self) -> list[str]:
        """The kept products, first in the order first."""
        return [product_id for _, product_id in self.kept]
